//! [`Writer`]: the one thread of a process that writes a SQLite file.
//!
//! SQLite lets one connection write at a time, and a connection that waits for the lock sleeps in its
//! busy handler (1 to 100 ms between tries), so writers on many connections of one process mostly
//! wait. Instead every write of a process to a file goes to one thread, which owns the only writing
//! connection and:
//!
//! - **commits in groups**: it takes every request that arrived while it was busy and runs them in
//!   one `BEGIN IMMEDIATE` transaction, so one `fsync` makes a whole group durable; each caller is
//!   answered only after the COMMIT of its group is durable (or failed). With the durable default
//!   the fsync is made by the reply thread, off the writer's path (see `durable`);
//! - **isolates requests**: a request of the public API runs in its own `SAVEPOINT`, so one that
//!   fails (a [`Error::Conflict`], an [`Error::InvalidInput`]) rolls back only itself and its caller
//!   alone gets the error; the store's hot writes check what can refuse them before they write and
//!   run without one (`Isolation`); a failed COMMIT fails every request of the group;
//! - **serves first come, first served**: requests queue in arrival order, so producers' commits and
//!   a dispatcher's claims and acks all progress under load.
//!
//! Several processes on one file still work: their writers contend through SQLite's lock, as
//! connections always did. Reads do not go through the writer: each [`crate::SqliteStore`] reads on
//! a connection of its own.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::mpsc::{self, Sender, SyncSender};
use std::sync::{Arc, Condvar, Mutex, OnceLock, PoisonError, Weak};
use std::thread::{JoinHandle, ThreadId};
use std::time::{Duration, Instant};

use miniflow_core::Error;
use rusqlite::Transaction;

use crate::connect::{open_connection, SqliteOptions, Synchronous};
use crate::errors::storage;

mod beside;
mod durable;
mod group;

/// The process's writer thread for one SQLite file: what [`crate::SqliteStore`] writes through, and
/// the entry point for writes of your own inside its transactions.
///
/// [`Writer::open`] returns the writer already running for that file and those options in this
/// process, or starts one: two stores opened on one file share it, so their writes are grouped
/// together. The thread stops, and its connection closes, when the last handle is dropped (after it
/// has committed what was queued). A handle is cheap to clone.
///
/// ```
/// use miniflow_native::Writer;
///
/// let dir = tempfile::tempdir()?;
/// let writer = Writer::open(dir.path().join("flow.db"))?;
/// let again = Writer::open(dir.path().join("flow.db"))?;
/// assert!(writer.same_thread_as(&again));
///
/// // A write of your own, in the writer's transaction, durable when `run` returns.
/// writer.run(|tx| {
///     tx.execute_batch("CREATE TABLE IF NOT EXISTS notes (text TEXT)")
///         .map_err(|e| miniflow_core::Error::Storage(Box::new(e)))
/// })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct Writer {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer")
            .field("path", &self.shared.key.path)
            .finish_non_exhaustive()
    }
}

/// What every handle of one writer shares. Dropping the last one stops the thread.
struct Shared {
    key: Key,
    queue: Option<Sender<Box<dyn Job>>>,
    work: Arc<WorkSignal>,
    /// How many times the reply thread synced the WAL (read by the tests).
    #[cfg_attr(not(test), allow(dead_code))]
    syncs: Arc<AtomicU64>,
    /// The writer thread, then the thread that answers its requests.
    threads: Vec<JoinHandle<()>>,
    thread_ids: [ThreadId; 2],
}

/// Which writer a store uses: one per file (by its canonical path) and options, so that a store
/// asking for `synchronous=NORMAL` never makes another's commits less durable.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    path: PathBuf,
    synchronous: Synchronous,
    busy_timeout: Duration,
}

/// The writers running in this process.
static WRITERS: Mutex<Option<HashMap<Key, Weak<Shared>>>> = Mutex::new(None);

fn running(key: &Key) -> Option<Arc<Shared>> {
    let writers = WRITERS.lock().unwrap_or_else(PoisonError::into_inner);
    writers.as_ref()?.get(key)?.upgrade()
}

/// Starts the threads of a writer on `conn`: the writer, and the reply thread, which syncs the WAL
/// file at `wal` before it answers, if given (see `durable`), and checks that the `-wal` and `-shm`
/// are still those `conn` opened (see `beside`).
fn start(conn: rusqlite::Connection, key: Key, wal: Option<PathBuf>) -> Result<Shared, Error> {
    let failed = Arc::new(OnceLock::new());
    let beside = beside::Beside::of(&key.path);
    let stopped = failed.clone();
    let syncs = Arc::new(AtomicU64::new(0));
    let durability = match wal {
        Some(path) => durable::Durability::SyncWal {
            path,
            file: None,
            failed: failed.clone(),
            syncs: syncs.clone(),
        },
        None => durable::Durability::AtCommit,
    };
    let (queue, jobs) = mpsc::channel::<Box<dyn Job>>();
    let (answers, answered) = mpsc::channel::<group::Answered>();
    let work = Arc::new(WorkSignal::default());
    let signal = work.clone();
    let spawn = |name: &str, run: Box<dyn FnOnce() + Send>| {
        std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(run)
            .map_err(|e| Error::Storage(Box::new(e)))
    };
    let replies = spawn(
        "miniflow-replies",
        Box::new(move || group::reply(answered, durability, beside, &stopped)),
    )?;
    let writer = spawn(
        "miniflow-writer",
        Box::new(move || group::run(conn, jobs, answers, &signal, &failed)),
    )?;
    Ok(Shared {
        key,
        queue: Some(queue),
        work,
        syncs,
        thread_ids: [writer.thread().id(), replies.thread().id()],
        threads: vec![writer, replies],
    })
}

impl Writer {
    /// The writer of the SQLite file at `path`, with the durable defaults: the one already running
    /// in this process, or a new one (which creates and migrates the file like
    /// [`crate::SqliteStore::open`]).
    ///
    /// # Errors
    ///
    /// As [`crate::SqliteStore::open`].
    pub fn open(path: impl AsRef<Path>) -> Result<Self, Error> {
        Self::open_with(path, &SqliteOptions::default())
    }

    /// The writer of the file at `path` with `options`. Stores opened with other options get a
    /// writer of their own; writers of one file contend through SQLite's lock, as processes do.
    ///
    /// # Errors
    ///
    /// As [`crate::SqliteStore::open_with`].
    pub fn open_with(path: impl AsRef<Path>, options: &SqliteOptions) -> Result<Self, Error> {
        let path = path.as_ref();
        let key = |path: PathBuf| Key {
            path,
            synchronous: options.synchronous,
            busy_timeout: options.busy_timeout,
        };
        if let Ok(canonical) = std::fs::canonicalize(path) {
            if let Some(shared) = running(&key(canonical)) {
                return Ok(Self { shared });
            }
        }
        // Creates the file if need be, so that it has a canonical path.
        let conn = open_connection(path, options)?;
        let canonical = std::fs::canonicalize(path).map_err(|e| {
            Error::Storage(format!("cannot resolve the path {}: {e}", path.display()).into())
        })?;
        let wal = match options.synchronous {
            // Durable all the same, the sync made by the reply thread (see `durable`).
            Synchronous::Full => {
                conn.execute_batch("PRAGMA synchronous = NORMAL")
                    .map_err(storage)?;
                let mut wal = canonical.clone().into_os_string();
                wal.push("-wal");
                Some(PathBuf::from(wal))
            }
            Synchronous::Normal => None,
        };
        let key = key(canonical);
        let mut writers = WRITERS.lock().unwrap_or_else(PoisonError::into_inner);
        let writers = writers.get_or_insert_with(HashMap::new);
        if let Some(shared) = writers.get(&key).and_then(Weak::upgrade) {
            return Ok(Self { shared }); // another thread started it meanwhile
        }
        writers.retain(|_, writer| writer.strong_count() > 0);
        let shared = Arc::new(start(conn, key.clone(), wal)?);
        writers.insert(key, Arc::downgrade(&shared));
        Ok(Self { shared })
    }

    /// The file it writes (its canonical path).
    pub fn path(&self) -> &Path {
        &self.shared.key.path
    }

    /// How many times this writer synced its WAL before answering (never, with
    /// [`Synchronous::Normal`], whose COMMITs are answered as they are).
    #[cfg(test)]
    pub(crate) fn wal_syncs(&self) -> u64 {
        self.shared.syncs.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether `other` is a handle of the same writer thread.
    pub fn same_thread_as(&self, other: &Writer) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }

    /// Queues `work` for the writer thread and returns at once: the low-level submission every other
    /// write is built on.
    ///
    /// The writer runs `work` on its thread, inside the transaction of the group it belongs to and
    /// inside a savepoint of its own, then calls `reply` on its reply thread (which answers the
    /// requests in the order they arrived, while the writer goes on with the next group):
    ///
    /// - with `work`'s value once the group's COMMIT is durable;
    /// - with `work`'s error if it failed (or panicked): its savepoint was rolled back, nothing of it
    ///   was written, and the rest of the group is not affected;
    /// - with the COMMIT's error (an [`Error::Storage`] or [`Error::Busy`]) if the group could not be
    ///   committed: then nothing of the group was written.
    ///
    /// If the writer has stopped (its thread is gone), `reply` is called at once, on the caller's
    /// thread, with an [`Error::Storage`].
    ///
    /// `work` holds the write lock of the file while it runs, and every other request waits for it:
    /// keep it to a few statements, and never wait in it for anything else (a network call, a lock,
    /// a reply of this writer). It must neither commit nor roll back the transaction it is given.
    /// `reply` runs on the reply thread, which answers every other request too: hand the value over
    /// (a channel, a oneshot, a waker) and return.
    ///
    /// ```
    /// use std::sync::mpsc;
    /// use miniflow_native::Writer;
    ///
    /// let dir = tempfile::tempdir()?;
    /// let writer = Writer::open(dir.path().join("flow.db"))?;
    /// let (tx, rx) = mpsc::channel();
    /// writer.submit(
    ///     |tx| tx.query_row("SELECT count(*) FROM events", [], |row| row.get::<_, i64>(0))
    ///         .map_err(|e| miniflow_core::Error::Storage(Box::new(e))),
    ///     move |answer| tx.send(answer).unwrap(),
    /// );
    /// assert_eq!(rx.recv()??, 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn submit<R, W, C>(&self, work: W, reply: C)
    where
        R: Send + 'static,
        W: FnOnce(&Transaction<'_>) -> Result<R, Error> + Send + 'static,
        C: FnOnce(Result<R, Error>) + Send + 'static,
    {
        self.submit_isolated(work, reply, Isolation::Savepoint);
    }

    /// [`Writer::submit`], with the request isolated from the others of its group as `isolation`
    /// says.
    pub(crate) fn submit_isolated<R, W, C>(&self, work: W, reply: C, isolation: Isolation)
    where
        R: Send + 'static,
        W: FnOnce(&Transaction<'_>) -> Result<R, Error> + Send + 'static,
        C: FnOnce(Result<R, Error>) + Send + 'static,
    {
        let job: Box<dyn Job> = Box::new(Request {
            work: Some(work),
            outcome: None,
            reply,
            isolation,
        });
        let Some(queue) = &self.shared.queue else {
            return job.finish(Err(&stopped()));
        };
        if let Err(mpsc::SendError(job)) = queue.send(job) {
            job.finish(Err(&stopped()));
        }
    }

    /// Runs `work` in the writer's transaction (see [`Writer::submit`]) and returns its value once
    /// it is durable. This is how a caller writes rows of its own together with a workflow's event
    /// and commands, through the writer:
    ///
    /// ```
    /// use std::sync::Arc;
    /// use miniflow_core::{json, Command, Decision, Engine, Event, EventRecord, Timestamp, Workflow, WorkflowId};
    /// use miniflow_native::{SqliteStore, Writer};
    ///
    /// struct Shop;
    /// impl Workflow for Shop {
    ///     type State = ();
    ///     fn evolve(&self, _: &mut (), _: &EventRecord) {}
    ///     fn decide(&self, _: &(), event: &EventRecord) -> Decision {
    ///         Decision::new().command(Command::new("charge_card", event.payload.clone()))
    ///     }
    /// }
    ///
    /// let dir = tempfile::tempdir()?;
    /// let writer = Writer::open(dir.path().join("shop.db"))?;
    /// let storage = |e: rusqlite::Error| miniflow_core::Error::Storage(Box::new(e));
    /// writer.run(move |tx| tx.execute_batch("CREATE TABLE orders (id TEXT PRIMARY KEY)").map_err(storage))?;
    ///
    /// let engine = Arc::new(Engine::new(Shop));
    /// let handled = writer.run(move |tx| {
    ///     tx.execute("INSERT INTO orders VALUES ('order-7')", []).map_err(storage)?;
    ///     let order = WorkflowId::new("order-7")?;
    ///     let placed = Event::new("placed", json!({ "amount": 1200 }));
    ///     SqliteStore::handle_in(tx, &engine, &order, placed, Timestamp::from_millis(0))
    /// })?; // the order row, the event and its command: durable together
    /// assert_eq!(handled.command_ids[0].to_string(), "order-7:1:0");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// `work`'s error, or the group's (see [`Writer::submit`]); [`Error::InvalidInput`] when called
    /// from inside a request of this writer or a reply (it would wait for itself).
    pub fn run<R, W>(&self, work: W) -> Result<R, Error>
    where
        R: Send + 'static,
        W: FnOnce(&Transaction<'_>) -> Result<R, Error> + Send + 'static,
    {
        self.run_isolated(work, Isolation::Savepoint)
    }

    /// [`Writer::run`], with the request isolated from the others of its group as `isolation`
    /// says.
    pub(crate) fn run_isolated<R, W>(&self, work: W, isolation: Isolation) -> Result<R, Error>
    where
        R: Send + 'static,
        W: FnOnce(&Transaction<'_>) -> Result<R, Error> + Send + 'static,
    {
        if self
            .shared
            .thread_ids
            .contains(&std::thread::current().id())
        {
            return Err(Error::invalid(
                "work",
                "Writer::run",
                "called from inside a request or a reply of the same writer, it would wait for \
                 itself: write on the transaction the request was given instead",
            ));
        }
        let (answer, answered) = mpsc::sync_channel(1);
        self.submit_isolated(work, move |result| send(&answer, result), isolation);
        answered.recv().unwrap_or_else(|_| Err(stopped()))
    }

    /// A count of the commits of this writer that made commands or timers claimable (new commands,
    /// retries, feedback). Pass it to [`Writer::wait_for_work`] to wait for the next such commit.
    pub fn work_mark(&self) -> u64 {
        self.shared.work.mark()
    }

    /// Waits until a commit after `mark` (from [`Writer::work_mark`]) made commands or timers
    /// claimable, or `timeout` passes; returns the new mark. Idle workers wait with it instead of
    /// sleeping through their poll interval, so a command committed in this process is claimed at
    /// once. Commits of other processes are not seen: poll for them too.
    pub fn wait_for_work(&self, mark: u64, timeout: Duration) -> u64 {
        self.shared.work.wait(mark, timeout)
    }
}

fn send<R>(answer: &SyncSender<Result<R, Error>>, result: Result<R, Error>) {
    // The caller waits for the answer; if it is gone, nobody needs it.
    let _ = answer.send(result);
}

impl Drop for Shared {
    fn drop(&mut self) {
        // The thread commits what is queued, sees the queue closed, closes its connection and ends.
        self.queue.take();
        if self.thread_ids.contains(&std::thread::current().id()) {
            return; // the last handle was dropped inside a request or a reply: the threads end alone
        }
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

fn stopped() -> Error {
    Error::Storage("the writer thread of this file has stopped".into())
}

/// How the writer keeps a request that fails from spoiling the others of its group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Isolation {
    /// The request runs in a savepoint of its own: whatever it wrote before it failed is rolled
    /// back, and only its caller gets the error. Every request of the public API runs so.
    Savepoint,
    /// The request runs without a savepoint, which spares the copy of every page it touches into
    /// the statement journal: for miniflow's own writes, which check what can fail (a conflict, a
    /// bad input, a retired workflow) before their first write. One that fails having written
    /// nothing fails alone. One that fails after it wrote (a storage error, a damaged row) rolls
    /// back its whole group, and every request that ran in it gets an error; nothing of it is
    /// committed.
    ChecksFirst,
}

/// A request queued for the writer, with its type erased.
trait Job: Send {
    /// How it is isolated from the others of its group.
    fn isolation(&self) -> Isolation;
    /// Runs the request inside `tx` (and the savepoint the writer opened for it); says whether it
    /// succeeded.
    fn run(&mut self, tx: &Transaction<'_>) -> bool;
    /// Turns a request that succeeded into a failure: its savepoint could not be released.
    fn fail(&mut self, error: Error);
    /// Answers the caller: with its own error if it failed, else with its value once `committed`, or
    /// with the commit's error.
    fn finish(self: Box<Self>, committed: Result<(), &Error>);
}

struct Request<R, W, C> {
    work: Option<W>,
    outcome: Option<Result<R, Error>>,
    reply: C,
    isolation: Isolation,
}

impl<R, W, C> Job for Request<R, W, C>
where
    R: Send + 'static,
    W: FnOnce(&Transaction<'_>) -> Result<R, Error> + Send + 'static,
    C: FnOnce(Result<R, Error>) + Send + 'static,
{
    fn isolation(&self) -> Isolation {
        self.isolation
    }

    fn run(&mut self, tx: &Transaction<'_>) -> bool {
        let Some(work) = self.work.take() else {
            return false;
        };
        let outcome = catch_unwind(AssertUnwindSafe(|| work(tx))).unwrap_or_else(|panic| {
            Err(Error::Storage(
                format!(
                    "a request panicked inside the writer: {}",
                    panic_message(&*panic)
                )
                .into(),
            ))
        });
        let ok = outcome.is_ok();
        self.outcome = Some(outcome);
        ok
    }

    fn fail(&mut self, error: Error) {
        self.outcome = Some(Err(error));
    }

    fn finish(self: Box<Self>, committed: Result<(), &Error>) {
        let Request { outcome, reply, .. } = *self;
        let answer = match (outcome, committed) {
            (Some(Err(own)), _) => Err(own),
            (Some(Ok(value)), Ok(())) => Ok(value),
            (_, Err(group)) => Err(copy_error(group)),
            (None, Ok(())) => Err(stopped()),
        };
        // A reply that panics must not take the writer down with it.
        let _ = catch_unwind(AssertUnwindSafe(|| reply(answer)));
    }
}

/// The group's error for one more of its callers: the same kind and message.
fn copy_error(error: &Error) -> Error {
    match error {
        Error::Busy(source) => Error::Busy(source.to_string().into()),
        Error::Storage(source) => Error::Storage(source.to_string().into()),
        other => Error::Storage(other.to_string().into()),
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic".to_owned())
}

/// Counts the commits that made work claimable, for idle workers to wait on.
#[derive(Default)]
struct WorkSignal {
    mark: Mutex<u64>,
    changed: Condvar,
}

impl WorkSignal {
    fn mark(&self) -> u64 {
        *self.mark.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn bump(&self) {
        *self.mark.lock().unwrap_or_else(PoisonError::into_inner) += 1;
        self.changed.notify_all();
    }

    fn wait(&self, seen: u64, timeout: Duration) -> u64 {
        let until = Instant::now() + timeout;
        let mut mark = self.mark.lock().unwrap_or_else(PoisonError::into_inner);
        while *mark == seen {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            mark = self
                .changed
                .wait_timeout(mark, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        *mark
    }
}

thread_local! {
    /// Set by a write that makes commands or timers claimable, on the thread that writes it.
    static MADE_WORK: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Notes that the current write makes commands or timers claimable: idle workers waiting on the
/// writer are woken once it commits.
pub(crate) fn made_work() {
    MADE_WORK.with(|flag| flag.set(true));
}

/// Whether a write on this thread made work since the last call.
fn take_made_work() -> bool {
    MADE_WORK.with(|flag| flag.replace(false))
}

/// Helpers for the crate's tests of what the writer groups.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;

    /// A request for [`grouped`].
    pub(crate) type Request<R> = Box<dyn FnOnce(&Transaction<'_>) -> Result<R, Error> + Send>;

    /// Runs `requests` as one group, in order: a first request holds the writer until all of them
    /// are queued behind it, so that the writer takes them into one transaction. Returns their
    /// answers in order.
    pub(crate) fn grouped<R: Send + 'static>(
        writer: &Writer,
        requests: Vec<(Isolation, Request<R>)>,
    ) -> Vec<Result<R, Error>> {
        let (release, held) = mpsc::channel::<()>();
        let (entered, inside) = mpsc::channel::<()>();
        writer.submit(
            move |_| {
                let _ = entered.send(());
                let _ = held.recv();
                Ok(())
            },
            |_| {},
        );
        inside.recv().unwrap();
        let answers: Vec<_> = requests
            .into_iter()
            .map(|(isolation, work)| {
                let (answer, answered) = mpsc::sync_channel(1);
                writer.submit_isolated(work, move |r| send(&answer, r), isolation);
                answered
            })
            .collect();
        release.send(()).unwrap();
        answers.into_iter().map(|a| a.recv().unwrap()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    fn count(writer: &Writer, table: &str) -> i64 {
        let sql = format!("SELECT count(*) FROM {table}");
        writer
            .run(move |tx| tx.query_row(&sql, [], |row| row.get(0)).map_err(storage))
            .unwrap()
    }

    fn insert(tx: &Transaction<'_>) -> Result<usize, Error> {
        tx.execute("INSERT INTO notes VALUES ('x')", [])
            .map_err(storage)
    }

    /// With the durable default, the COMMIT does not wait for the disk; the reply thread syncs the
    /// WAL before the caller is answered.
    #[test]
    fn a_durable_write_is_answered_after_a_sync_of_the_wal() {
        let dir = tempfile::tempdir().unwrap();
        let writer = Writer::open(dir.path().join("flow.db")).unwrap();
        writer
            .run(|tx| {
                tx.execute_batch("CREATE TABLE notes (text TEXT)")
                    .map_err(storage)
            })
            .unwrap();
        for n in 1..=3 {
            let before = writer.wal_syncs();
            writer.run(insert).unwrap();
            assert!(
                writer.wal_syncs() > before,
                "write {n} was answered before the WAL was synced"
            );
        }
        let relaxed = Writer::open_with(
            dir.path().join("relaxed.db"),
            &SqliteOptions {
                synchronous: Synchronous::Normal,
                ..SqliteOptions::default()
            },
        )
        .unwrap();
        relaxed
            .run(|tx| {
                tx.execute_batch("CREATE TABLE notes (text TEXT)")
                    .map_err(storage)
            })
            .unwrap();
        relaxed.run(insert).unwrap();
        assert_eq!(relaxed.wal_syncs(), 0, "NORMAL answers at its COMMIT");
    }

    /// A failed sync fails the writes it was to make durable, and every write after it, which the
    /// writer no longer even runs.
    #[test]
    fn a_failed_sync_fails_its_writes_and_stops_the_writer_for_good() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("flow.db");
        let conn = open_connection(&path, &SqliteOptions::default()).unwrap();
        conn.execute_batch("CREATE TABLE notes (text TEXT); PRAGMA synchronous = NORMAL")
            .unwrap();
        let key = Key {
            path: path.clone(),
            synchronous: Synchronous::Full,
            busy_timeout: Duration::from_secs(1),
        };
        // A directory stands for a WAL that cannot be synced.
        let writer = Writer {
            shared: Arc::new(start(conn, key, Some(dir.path().to_owned())).unwrap()),
        };
        let first = writer.run(insert).unwrap_err();
        assert!(
            first
                .to_string()
                .contains("could not sync the write-ahead log"),
            "{first}"
        );
        let ran = Arc::new(AtomicBool::new(false));
        let second = {
            let ran = ran.clone();
            writer.run(move |tx| {
                ran.store(true, Ordering::SeqCst);
                insert(tx)
            })
        };
        assert_eq!(
            second.unwrap_err().to_string(),
            first.to_string(),
            "every later write gets the same error"
        );
        assert!(!ran.load(Ordering::SeqCst), "a stopped writer runs nothing");
        assert_eq!(writer.wal_syncs(), 0);
        drop(writer);
        let fresh = Writer::open(&path).unwrap();
        assert_eq!(
            count(&fresh, "notes"),
            1,
            "the write that ran is committed, though its caller was told it may not be durable"
        );
    }

    fn notes(path: &Path) -> Writer {
        let writer = Writer::open(path).unwrap();
        writer
            .run(|tx| {
                tx.execute_batch("CREATE TABLE IF NOT EXISTS notes (text TEXT)")
                    .map_err(storage)
            })
            .unwrap();
        writer
    }

    type Work = testing::Request<usize>;

    fn failing(write_first: bool) -> Work {
        Box::new(move |tx| {
            if write_first {
                insert(tx)?;
            }
            Err(Error::Corrupt("failed on purpose".into()))
        })
    }

    /// A request without a savepoint that fails before it writes fails alone; one that fails after
    /// it wrote takes its whole group down with it, and nothing of the group is written.
    #[test]
    fn a_request_without_a_savepoint_fails_alone_only_if_it_wrote_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let writer = notes(&dir.path().join("flow.db"));
        let answers = testing::grouped(
            &writer,
            vec![
                (Isolation::ChecksFirst, Box::new(insert)),
                (Isolation::ChecksFirst, failing(false)),
                (Isolation::Savepoint, Box::new(insert)),
            ],
        );
        assert!(answers[0].is_ok() && answers[2].is_ok(), "{answers:?}");
        assert!(matches!(answers[1], Err(Error::Corrupt(_))));
        assert_eq!(count(&writer, "notes"), 2);

        let answers = testing::grouped(
            &writer,
            vec![
                (Isolation::Savepoint, Box::new(insert)),
                (Isolation::ChecksFirst, Box::new(insert)),
                (Isolation::ChecksFirst, failing(true)),
            ],
        );
        assert!(
            matches!(answers[2], Err(Error::Corrupt(_))),
            "its own error"
        );
        for answer in &answers[..2] {
            let e = answer.as_ref().unwrap_err().to_string();
            assert!(e.contains("the whole group was rolled back"), "{e}");
        }
        assert_eq!(
            count(&writer, "notes"),
            2,
            "nothing of the group was written"
        );
        // The requests queued behind it go on in a new transaction.
        writer.run_isolated(insert, Isolation::ChecksFirst).unwrap();
        assert_eq!(count(&writer, "notes"), 3);
    }
}
