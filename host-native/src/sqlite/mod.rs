//! [`SqliteStore`]: the miniflow [`Store`] on one SQLite file.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use miniflow_core::backend::{check_bulk, Admission, Changed, HistoryId};
use miniflow_core::backend::{
    Burial, ClaimPage, ClaimStep, ClaimWalk, Offer, TimerClaim, TimerOffer, Unclaimable,
};
use miniflow_core::prelude::*;
use miniflow_core::AppendedAfter;
use miniflow_core::{
    canonical_json, Ack, Cancelled, ClaimRequest, CommandId, Commit, Delivery, Engine, Error,
    Event, EventRecord, Extended, Failure, Handled, Handover, KindChange, KindControl, Lease,
    OutboxRow, OutboxStats, RetryPolicy, Seq, Settled, Status, TimerId, TimerRow, Timestamp,
    TraceContext, Workflow, WorkflowId,
};
use rusqlite::types::{Value as SqlValue, ValueRef};
use rusqlite::{
    params, Connection, ErrorCode, OptionalExtension, Row, Transaction, TransactionBehavior,
};

use crate::connect::{open_connection, read_only_connection, SqliteOptions, SCHEMA_VERSION};
use crate::errors::storage;
use crate::writer::{made_work, Isolation, Writer};

#[macro_use]
mod rows;
mod claim;
mod controls;
mod inspect;
mod retention;
mod timers;
mod writes;

use self::claim::*;
use self::controls::*;
use self::inspect::read_event;
pub use self::inspect::{EventListing, UnreadableEvent};
use self::retention::*;
#[cfg(test)]
pub(crate) use self::rows::ROW_COLUMNS;
use self::rows::*;
pub use self::rows::{Listing, UnreadableCommand};
use self::timers::*;
use self::writes::*;
pub(crate) use self::writes::{in_savepoint, load_events_after};

/// The miniflow [`Store`] on a SQLite file (WAL, `synchronous=FULL`, `BEGIN IMMEDIATE` writes).
///
/// A `SqliteStore` reads on a connection of its own and writes through the process's [`Writer`] of
/// its file: every store of one file in a process shares that one writer thread, which commits what
/// arrives together in one transaction (each caller answered once its write is durable). Open one
/// store per thread; processes coordinate through the file.
///
/// ```
/// use miniflow_core::prelude::*;
/// use miniflow_core::{Command, Commit, Decision, Event, Seq, Timestamp, WorkflowId};
/// use miniflow_native::SqliteStore;
/// use serde_json::json;
///
/// let dir = tempfile::tempdir()?;
/// let mut store = SqliteStore::open(dir.path().join("flow.db"))?;
/// let trip = WorkflowId::new("trip-001")?;
/// let decision = Decision::new().command(Command::new("lock_budget", json!({ "trip_id": "trip-001" })));
/// let event = Event::new("trip_requested", json!({ "city": "成都" }));
/// store.append_with_commands(&Commit::new(trip, Seq::ZERO, event, decision, Timestamp::from_millis(0))?)?;
/// assert_eq!(store.pending(10)?[0].command_id.to_string(), "trip-001:1:0");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct SqliteStore {
    /// Reads; and the writes of a read-only store, which fail.
    conn: Connection,
    path: PathBuf,
    /// Where writes go; `None` for a read-only store.
    writer: Option<Writer>,
    /// The row keys of the commands this store claimed and has not settled: an ack reaches its row
    /// by its key.
    claimed: HashMap<CommandId, i64>,
    /// The last claim came back full: the next one goes straight to claiming, without asking first
    /// whether anything is claimable (there most likely is).
    busy: bool,
    /// The history its events are, for the engine's state cache: one per store, never shared with
    /// another connection (a file can be replaced under its name).
    history: HistoryId,
}

/// The most row keys a store remembers: past it, it forgets them (acks then look rows up by
/// command ID), so that a caller who never settles what it claimed does not grow the map.
const MAX_REMEMBERED: usize = 1 << 16;

pub(crate) fn to_sql_time(field: &'static str, t: Timestamp) -> Result<i64, Error> {
    i64::try_from(t.as_millis())
        .map_err(|_| Error::invalid(field, t, "is past the year 292 million"))
}

fn to_sql_u64(field: &'static str, n: u64) -> Result<i64, Error> {
    i64::try_from(n).map_err(|_| Error::invalid(field, n, "is too large to store"))
}

pub(crate) fn limit(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl SqliteStore {
    /// Opens (or creates) the store at `path` with the durable defaults. `path` is a file name, never
    /// a URI: `file:flow.db` is the file of that name. To look at a store without changing it, use
    /// [`SqliteStore::open_read_only`].
    ///
    /// A store of an older schema is upgraded first. A file written before schema version 7 is also
    /// rebuilt once (`VACUUM`), so that it gives the pages retention frees back to the file system:
    /// that holds the write lock for as long as the copy takes and needs free disk space for it.
    ///
    /// # Errors
    ///
    /// [`Error::UnsupportedSchema`] when the file was written by a newer miniflow (it is left as it is);
    /// [`Error::Storage`] when the file cannot be opened or a pragma does not take effect.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, Error> {
        Self::open_with(path, &SqliteOptions::default())
    }

    /// Opens (or creates) the store at `path` with `options`.
    ///
    /// # Errors
    ///
    /// As [`SqliteStore::open`].
    pub fn open_with(path: impl AsRef<Path>, options: &SqliteOptions) -> Result<Self, Error> {
        let path = path.as_ref().to_path_buf();
        let conn = open_connection(&path, options)?;
        let writer = Writer::open_with(&path, options)?;
        Ok(Self {
            conn,
            path,
            writer: Some(writer),
            claimed: HashMap::new(),
            busy: false,
            history: HistoryId::unique(),
        })
    }

    /// Opens the store at `path` to read it, and changes nothing: the file is opened with
    /// `SQLITE_OPEN_READ_ONLY`, no pragma is set, no migration runs, and a file that is not a miniflow
    /// store is refused before SQLite reads it. Every write through the store fails with
    /// [`Error::Storage`] (SQLite's "attempt to write a readonly database").
    ///
    /// Reading a store in WAL mode (every store [`SqliteStore::open`] wrote) takes SQLite's `-shm`
    /// and `-wal` files beside it: SQLite creates them when they are missing and the directory is
    /// writable, and the next writer that closes the store removes them. The store file itself is never
    /// written. On a read-only file system, a store that was closed cleanly (no `-wal` with content
    /// beside it) is read as an immutable file, without locks.
    ///
    /// A reader that is neither the file's owner nor root never creates those files (they would be
    /// its own, and the owner's next write would fail on them): a store nobody has open is read as
    /// an immutable file, and one whose `-wal` still holds commits (its writer was killed) is
    /// refused, saying why. Such a read takes no locks, so it is meant for a stopped service: a
    /// service that starts meanwhile and checkpoints while it reads may make it fail or read a mix
    /// of old and new rows (the store itself is never harmed); while the service runs, its files
    /// exist and the reader uses them.
    ///
    /// ```
    /// use miniflow_core::prelude::*;
    /// use miniflow_native::SqliteStore;
    ///
    /// let dir = tempfile::tempdir()?;
    /// let path = dir.path().join("flow.db");
    /// drop(SqliteStore::open(&path)?);
    /// let store = SqliteStore::open_read_only(&path)?;
    /// assert!(store.pending(10)?.is_empty());
    /// assert!(SqliteStore::open_read_only(dir.path().join("missing.db")).is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] naming the path when there is no miniflow store at `path`: no file, a
    /// directory, an empty file, a file that is not a SQLite database, a SQLite database without
    /// miniflow's tables, or a store of an older schema version (upgrade it with
    /// [`SqliteStore::migrate`] or `miniflow migrate PATH`); [`Error::UnsupportedSchema`] when a newer
    /// miniflow wrote it; [`Error::Storage`] when it cannot be read.
    pub fn open_read_only(path: impl AsRef<Path>) -> Result<Self, Error> {
        let path = path.as_ref().to_path_buf();
        let (conn, version) = read_only_connection(&path)?;
        if version < SCHEMA_VERSION {
            return Err(Error::invalid(
                "path",
                path.display(),
                format!(
                    "is a miniflow store of schema version {version}, older than version \
                     {SCHEMA_VERSION} that this miniflow reads; upgrade it first with \
                     `miniflow migrate {}` (after that, older versions of miniflow refuse it)",
                    path.display()
                ),
            ));
        }
        Ok(Self {
            conn,
            path,
            writer: None,
            claimed: HashMap::new(),
            busy: false,
            history: HistoryId::unique(),
        })
    }

    /// Upgrades the store at `path` to [`SCHEMA_VERSION`] and returns the schema version it had. A store
    /// that is already current is not written at all. Unlike [`SqliteStore::open`], it never creates a
    /// store and never adds miniflow's tables to another database. Once upgraded, older versions of
    /// miniflow refuse the store with their [`Error::UnsupportedSchema`].
    ///
    /// # Errors
    ///
    /// As [`SqliteStore::open_read_only`] for a file that is not a miniflow store or is newer than this
    /// miniflow; as [`SqliteStore::open`] when the upgrade fails (nothing is changed then).
    pub fn migrate(path: impl AsRef<Path>) -> Result<i64, Error> {
        let path = path.as_ref();
        let (conn, found) = read_only_connection(path)?;
        drop(conn);
        if found < SCHEMA_VERSION {
            open_connection(path, &SqliteOptions::default())?;
        }
        Ok(found)
    }

    /// The file this store lives in.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The same store, naming `history` as the history of its events (see
    /// [`EventLog::history_id`]): for stores that read one file on behalf of one owner, whose
    /// engines' cached states they then share.
    #[cfg(feature = "tokio")]
    pub(crate) fn with_history(mut self, history: HistoryId) -> Self {
        self.history = history;
        self
    }

    /// The connection the store reads on, for diagnostics and tests. Writing through it bypasses
    /// every rule miniflow keeps (and the writer: it waits for SQLite's lock like another process).
    pub fn connection(&self) -> &Connection {
        &self.conn
    }

    /// The writer thread the store writes through (`None` for a read-only store): to write rows of
    /// your own in its transactions ([`Writer::run`]), or to wait for new work.
    pub fn writer(&self) -> Option<&Writer> {
        self.writer.as_ref()
    }

    /// Whether `sql` (an `EXISTS` over a due index) finds anything due at `now`.
    fn any_due(&self, sql: &str, now: Timestamp) -> Result<bool, Error> {
        let now = to_sql_time("now", now)?;
        self.conn
            .prepare_cached(sql)
            .and_then(|mut stmt| stmt.query_row([now], |row| row.get(0)))
            .map_err(storage)
    }

    /// Whether a claim at `now` may find anything: a due command of a kind the operators' controls
    /// do not exclude, asked of each priority in turn. Idle workers poll with it outside any
    /// transaction, so they take the write lock only when there is something to take.
    fn any_claimable(&self, now: Timestamp) -> Result<bool, Error> {
        let admission = admission(&self.conn, now)?;
        let excluded = excluded_kinds(&admission.excluded());
        let now = to_sql_time("now", now)?;
        let mut level = next_priority(&self.conn, i64::MAX)?;
        while let Some(priority) = level {
            let found = match &excluded {
                None => self
                    .conn
                    .prepare_cached(ANY_COMMAND_DUE)
                    .and_then(|mut stmt| stmt.query_row(params![now, priority], |row| row.get(0))),
                Some((first, rest)) => {
                    self.conn
                        .prepare_cached(ANY_COMMAND_CLAIMABLE)
                        .and_then(|mut stmt| {
                            stmt.query_row(params![now, priority, first, rest], |row| row.get(0))
                        })
                }
            };
            if found.map_err(storage)? {
                return Ok(true);
            }
            level = next_priority(&self.conn, priority)?;
        }
        Ok(false)
    }

    /// Runs `work` in one durable write transaction: through the writer (in a savepoint of its own
    /// there), or for a read-only store on its own connection (where it fails).
    fn write<R, W>(&mut self, work: W) -> Result<R, Error>
    where
        R: Send + 'static,
        W: FnOnce(&Transaction<'_>) -> Result<R, Error> + Send + 'static,
    {
        self.write_isolated(work, Isolation::Savepoint)
    }

    /// As [`SqliteStore::write`], for the hot writes (commits, claims, acks, single-row changes,
    /// timers), which check everything that can refuse them before their first write: the writer
    /// runs them without a savepoint ([`Isolation::ChecksFirst`]).
    fn write_checked<R, W>(&mut self, work: W) -> Result<R, Error>
    where
        R: Send + 'static,
        W: FnOnce(&Transaction<'_>) -> Result<R, Error> + Send + 'static,
    {
        self.write_isolated(work, Isolation::ChecksFirst)
    }

    fn write_isolated<R, W>(&mut self, work: W, isolation: Isolation) -> Result<R, Error>
    where
        R: Send + 'static,
        W: FnOnce(&Transaction<'_>) -> Result<R, Error> + Send + 'static,
    {
        if let Some(writer) = &self.writer {
            return writer.run_isolated(work, isolation);
        }
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(storage)?;
        let value = work(&tx)?;
        tx.commit().map_err(storage)?;
        Ok(value)
    }

    /// Writes `commit` inside the caller's own transaction `tx`, so the caller's rows (an `orders`
    /// table, say) commit together with the event and its commands — or not at all. The store never
    /// commits `tx`; on an error nothing of the commit is left in it (a savepoint is rolled back) and
    /// the caller decides whether to roll back the rest.
    ///
    /// The caller guarantees: `tx` is on the same file as the store, opened after the store (so its
    /// schema is current), and began with `BEGIN IMMEDIATE`
    /// (`TransactionBehavior::Immediate`) so that no other writer moves the workflow between the read
    /// and the write; the file keeps the WAL journal the store set, and `tx` is committed with the
    /// durability the caller needs (miniflow's own connections use `synchronous=FULL`).
    ///
    /// ```
    /// use miniflow_native::SqliteStore;
    /// use miniflow_core::prelude::*;
    /// use miniflow_core::{json, Command, Commit, Decision, Event, Seq, Timestamp, WorkflowId};
    /// use rusqlite::{Connection, TransactionBehavior};
    ///
    /// let dir = tempfile::tempdir()?;
    /// let path = dir.path().join("shop.db");
    /// let store = SqliteStore::open(&path)?; // creates or upgrades miniflow's tables
    /// let mut conn = Connection::open(&path)?;
    /// conn.execute_batch("CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY, total INTEGER)")?;
    ///
    /// let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    /// tx.execute("INSERT INTO orders VALUES ('order-7', 1200)", [])?;
    /// let order = WorkflowId::new("order-7")?;
    /// let decision = Decision::new().command(Command::new("charge_card", json!({ "amount": 1200 })));
    /// let commit = Commit::new(order.clone(), Seq::ZERO, Event::new("placed", json!({})), decision, Timestamp::from_millis(0))?;
    /// SqliteStore::append_in(&tx, &commit)?;
    /// tx.commit()?; // the order row, the event and its command, together
    ///
    /// assert_eq!(store.commands(&order)?.len(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`EventLog::append_with_commands`].
    pub fn append_in(tx: &Transaction<'_>, commit: &Commit) -> Result<(), Error> {
        let span = crate::telemetry::send_span(commit);
        let _send = span.enter();
        let json = CommitJson::of(commit);
        let result = in_savepoint(tx, |conn| write_commit(conn, commit, &json));
        crate::telemetry::committed(&span, &result);
        result
    }

    /// [`Engine::handle`] inside the caller's own transaction `tx`: replays the workflow from `tx`,
    /// decides, and writes the commit with [`SqliteStore::append_in`], under the same guarantees.
    /// Under `BEGIN IMMEDIATE` no other writer can move the workflow meanwhile, so there is no
    /// conflict to retry.
    ///
    /// It replays the workflow's whole history and leaves the engine's state cache alone: a state
    /// folded inside your transaction may include events that your rollback takes back, and the cache
    /// keeps only states folded from committed events. The async API's `Tx::handle` (feature
    /// `tokio`) runs in a transaction miniflow commits itself, so it uses the cache.
    ///
    /// # Errors
    ///
    /// As [`Engine::handle`].
    pub fn handle_in<W: Workflow>(
        tx: &Transaction<'_>,
        engine: &Engine<W>,
        workflow_id: &WorkflowId,
        event: Event,
        now: Timestamp,
    ) -> Result<Handled, Error> {
        let events = load_events(tx, workflow_id)?;
        let commit = engine.plan(&events, workflow_id, event, now)?;
        Self::append_in(tx, &commit)?;
        Ok(Handled::of(&commit, 0))
    }

    /// Extends each of `leases` inside the writer's transaction `tx`, as
    /// [`Outbox::extend_all`] does: the async store's heartbeat, awaited on the writer.
    ///
    /// # Errors
    ///
    /// A storage error, which fails the whole write.
    #[cfg(feature = "tokio")]
    pub(crate) fn extend_all_in(
        tx: &Transaction<'_>,
        leases: &[(CommandId, u64)],
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Vec<Result<Extended, Error>>, Error> {
        extend_each(tx, leases, ttl, now)
    }

    /// Remembers the row keys of `claimed`, and returns its deliveries.
    fn remember(&mut self, claimed: Vec<(i64, Delivery)>) -> Vec<Delivery> {
        if self.claimed.len() + claimed.len() > MAX_REMEMBERED {
            self.claimed.clear();
        }
        claimed
            .into_iter()
            .map(|(key, delivery)| {
                self.claimed.insert(delivery.command_id.clone(), key);
                delivery
            })
            .collect()
    }

    /// `acks` with the row keys this store remembers of them, which it forgets.
    fn with_keys(&mut self, acks: Vec<Ack>) -> Vec<(Ack, Option<i64>)> {
        acks.into_iter()
            .map(|ack| {
                let key = self.claimed.remove(&ack.command_id);
                (ack, key)
            })
            .collect()
    }

    /// Applies `change` to one row inside one write transaction; an error rolls it back. The rules
    /// themselves live in [`OutboxRow`]'s methods, shared with every store.
    fn update<T: Send + 'static>(
        &mut self,
        command_id: &CommandId,
        now: Timestamp,
        change: impl FnOnce(&mut OutboxRow) -> Result<T, Error> + Send + 'static,
    ) -> Result<T, Error> {
        let command_id = command_id.clone();
        // The rule is applied to the row read before anything is written.
        self.write_checked(move |tx| {
            let row = select_row(tx, &command_id)?.ok_or(Error::UnknownCommand { command_id })?;
            let changed = row.into_change(now, change)?;
            write_change(tx, &changed)?;
            Ok(changed.value)
        })
    }
}

impl EventLog for SqliteStore {
    fn load(&self, workflow_id: &WorkflowId) -> Result<Vec<EventRecord>, Error> {
        load_events(&self.conn, workflow_id)
    }
    /// Waits [`miniflow_core::backend::conflict_backoff`], with a random jitter: threads and processes
    /// writing one workflow spread out instead of racing again together.
    fn before_retry(&mut self, conflicts: u32) {
        std::thread::sleep(miniflow_core::backend::conflict_backoff(
            conflicts,
            jitter(),
        ));
    }
    fn load_after(&self, workflow_id: &WorkflowId, after: Seq) -> Result<Vec<EventRecord>, Error> {
        load_events_after(&self.conn, workflow_id, after)
    }
    fn history_id(&self) -> Option<HistoryId> {
        Some(self.history)
    }
    fn append_with_commands(&mut self, commit: &Commit) -> Result<(), Error> {
        self.append_checked(commit, None)
    }
    /// The last event is checked in the writer's transaction, with the commit's other checks, so
    /// nothing is read before the write.
    fn append_after(
        &mut self,
        last: &EventRecord,
        commit: &Commit,
    ) -> Result<AppendedAfter, Error> {
        commit.check_follows(last)?;
        self.append_checked(commit, Some(StoredEvent::of(last)?))?;
        Ok(AppendedAfter::Written)
    }
}

impl SqliteStore {
    /// Writes `commit` through the writer, after checking that `last`, if any, is stored as the
    /// workflow's last event. The payloads are written out on the caller's thread, and the commit
    /// goes back to it to be dropped there: the writer thread, which every caller waits for, does
    /// only the SQL.
    fn append_checked(&mut self, commit: &Commit, last: Option<StoredEvent>) -> Result<(), Error> {
        let span = crate::telemetry::send_span(commit);
        let _send = span.enter();
        let (commit, json) = (commit.clone(), CommitJson::of(commit));
        let result = self
            .write_checked(move |tx| {
                if let Some(last) = &last {
                    check_last_event(tx, &commit, last)?;
                }
                write_commit(tx, &commit, &json)?;
                Ok((commit, json))
            })
            .map(drop);
        crate::telemetry::committed(&span, &result);
        result
    }
}

impl Outbox for SqliteStore {
    /// Skips rows that cannot be read (DESIGN rule 13): a claim buries them when they are due.
    fn pending(&self, limit_rows: usize) -> Result<Vec<OutboxRow>, Error> {
        read_readable(
            &self.conn,
            SELECT_PENDING,
            [NO_LIMIT],
            read_outbox_row,
            limit_rows,
        )
    }
    fn command(&self, command_id: &CommandId) -> Result<Option<OutboxRow>, Error> {
        select_row(&self.conn, command_id)
    }
    fn commands(&self, workflow_id: &WorkflowId) -> Result<Vec<OutboxRow>, Error> {
        query_rows(&self.conn, SELECT_WORKFLOW, [workflow_id.as_str()])
    }
    fn mark_done(&mut self, command_id: &CommandId, now: Timestamp) -> Result<(), Error> {
        self.update(command_id, now, move |row| row.mark_done(now))
    }
    fn claim(&mut self, request: &ClaimRequest, now: Timestamp) -> Result<Vec<Delivery>, Error> {
        request.validate()?;
        if !self.busy && !self.any_claimable(now)? {
            return Ok(Vec::new());
        }
        let (limit, request) = (request.limit, request.clone());
        let claimed = self.write_checked(move |tx| claim_in(tx, &request, now))?;
        self.busy = claimed.len() == limit;
        Ok(self.remember(claimed))
    }
    fn extend(
        &mut self,
        command_id: &CommandId,
        token: u64,
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Extended, Error> {
        self.update(command_id, now, move |row| row.extend(token, ttl, now))
    }
    /// Every lease in one transaction, each by the core's rule: a heartbeat costs one write (and
    /// one fsync, shared with whatever else the writer groups with it) however many leases it
    /// extends.
    fn extend_all(
        &mut self,
        leases: &[(CommandId, u64)],
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Vec<Result<Extended, Error>>, Error> {
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        let leases = leases.to_vec();
        self.write_checked(move |tx| extend_each(tx, &leases, ttl, now))
    }
    fn release(&mut self, command_id: &CommandId, token: u64, now: Timestamp) -> Result<(), Error> {
        self.claimed.remove(command_id);
        self.update(command_id, now, move |row| row.release(token, now))
    }
    fn complete(
        &mut self,
        command_id: &CommandId,
        token: u64,
        result: Option<&serde_json::Value>,
        now: Timestamp,
    ) -> Result<(), Error> {
        let key = self.claimed.remove(command_id);
        let (command_id, result) = (command_id.clone(), result.cloned());
        self.write_checked(move |tx| complete_in(tx, key, &command_id, token, result.as_ref(), now))
    }
    /// All acks in one transaction: one fsync for the batch (and for whatever else the writer
    /// groups with it). The results are returned only after the commit, so a reported completion is
    /// durable.
    fn complete_all(
        &mut self,
        acks: Vec<Ack>,
        now: Timestamp,
    ) -> Result<Vec<Result<(), Error>>, Error> {
        let acks = self.with_keys(acks);
        self.write_checked(move |tx| complete_each(tx, &acks, now))
    }
    /// The acks and the next claim in one transaction: one fsync per batch. A claim that fails
    /// fails the whole write: nothing of it commits, and the commands it acknowledged are delivered
    /// again once their leases run out (their receivers fold the repeat).
    fn complete_all_and_claim(
        &mut self,
        acks: Vec<Ack>,
        request: &ClaimRequest,
        now: Timestamp,
    ) -> Result<Handover, Error> {
        if acks.is_empty() {
            return Ok(Handover {
                completed: Vec::new(),
                claimed: self.claim(request, now),
            });
        }
        request.validate()?;
        let (acks, limit, request) = (self.with_keys(acks), request.limit, request.clone());
        let (completed, claimed) = self.write_checked(move |tx| {
            let completed = complete_each(tx, &acks, now)?;
            Ok((completed, claim_in(tx, &request, now)?))
        })?;
        self.busy = claimed.len() == limit;
        Ok(Handover {
            completed,
            claimed: Ok(self.remember(claimed)),
        })
    }
    fn fail(
        &mut self,
        command_id: &CommandId,
        token: u64,
        failure: &Failure,
        policy: &RetryPolicy,
        now: Timestamp,
    ) -> Result<Settled, Error> {
        self.claimed.remove(command_id);
        let (failure, policy) = (failure.clone(), policy.clone());
        self.update(command_id, now, move |row| {
            row.fail(token, &failure, &policy, now)
        })
    }
}

impl Timers for SqliteStore {
    fn claim_timers(
        &mut self,
        limit_rows: usize,
        lease_ttl: Duration,
        now: Timestamp,
    ) -> Result<Vec<TimerRow>, Error> {
        if !self.any_due(ANY_TIMER_DUE, now)? {
            return Ok(Vec::new());
        }
        self.write_checked(move |tx| claim_timers_in(tx, limit_rows, lease_ttl, now))
    }
    fn any_timer_due(&self, now: Timestamp) -> Result<bool, Error> {
        self.any_due(ANY_TIMER_DUE, now)
    }
    fn reject_timer(
        &mut self,
        timer_id: &TimerId,
        reason: &str,
        now: Timestamp,
    ) -> Result<(), Error> {
        let (timer_id, reason) = (timer_id.clone(), reason.to_owned());
        self.write_checked(move |tx| reject_timer_in(tx, &timer_id, &reason, now))
    }
    fn timers(&self, workflow_id: &WorkflowId) -> Result<Vec<TimerRow>, Error> {
        query_timers(&self.conn, SELECT_WORKFLOW_TIMERS, [workflow_id.as_str()])
    }
}

impl Operations for SqliteStore {
    fn purge_done(
        &mut self,
        older_than: Duration,
        now: Timestamp,
        batch: usize,
    ) -> Result<usize, Error> {
        miniflow_core::backend::check_purge_batch(batch)?;
        // Purgeable when processed_at + older_than <= now (see `OutboxRow::is_purgeable`).
        let Some(cutoff) = miniflow_core::purge_cutoff(now, older_than) else {
            return Ok(0);
        };
        let cutoff = to_sql_time("now", cutoff)?;
        let purged = self.write(move |tx| {
            let purged = tx
                .prepare_cached(PURGE_DONE)
                .and_then(|mut stmt| stmt.execute(params![cutoff, limit(batch)]))
                .map_err(storage)?;
            give_back_free_pages(tx)?;
            Ok(purged)
        })?;
        crate::telemetry::purged(purged);
        Ok(purged)
    }
    /// Skips rows that cannot be read (DESIGN rule 13); the operators' tools list those apart.
    fn dead_letters(&self, limit_rows: usize) -> Result<Vec<OutboxRow>, Error> {
        read_readable(
            &self.conn,
            SELECT_DEAD,
            [NO_LIMIT],
            read_outbox_row,
            limit_rows,
        )
    }
    fn retry(&mut self, command_id: &CommandId, now: Timestamp) -> Result<(), Error> {
        self.update(command_id, now, move |row| row.retry(now))
    }
    fn resolve(&mut self, command_id: &CommandId, note: &str, now: Timestamp) -> Result<(), Error> {
        let note = note.to_owned();
        self.update(command_id, now, move |row| row.resolve(&note, now))
    }
    /// Two grouped reads of the partial indexes `outbox_claim` (unfinished rows) and
    /// `outbox_dead_by_kind` (dead rows), and the controls; works on a read-only store.
    fn stats(&self, now: Timestamp) -> Result<OutboxStats, Error> {
        outbox_stats(&self.conn, now)
    }
    fn kind_controls(&self) -> Result<Vec<KindControl>, Error> {
        read_controls(&self.conn, SELECT_CONTROLS)
    }
    fn control_kind(
        &mut self,
        kind: &str,
        change: KindChange,
        by: &str,
        now: Timestamp,
    ) -> Result<KindControl, Error> {
        let (kind, by) = (kind.to_owned(), by.to_owned());
        self.write(move |tx| control_kind_in(tx, &kind, change, &by, now))
    }
    /// Skips rows that cannot be read (DESIGN rule 13).
    fn dead_letters_of_kind(&self, kind: &str, limit_rows: usize) -> Result<Vec<OutboxRow>, Error> {
        miniflow_core::check_kind("kind", kind)?;
        dead_of_kind(&self.conn, kind, limit_rows)
    }
    fn retry_dead_of_kind(
        &mut self,
        kind: &str,
        batch: usize,
        now: Timestamp,
    ) -> Result<Vec<CommandId>, Error> {
        check_bulk(kind, batch)?;
        let kind = kind.to_owned();
        self.write(move |tx| change_dead_of_kind(tx, &kind, batch, now, |row| row.retry(now)))
    }
    fn resolve_dead_of_kind(
        &mut self,
        kind: &str,
        note: &str,
        batch: usize,
        now: Timestamp,
    ) -> Result<Vec<CommandId>, Error> {
        check_bulk(kind, batch)?;
        let (kind, note) = (kind.to_owned(), note.to_owned());
        self.write(move |tx| {
            change_dead_of_kind(tx, &kind, batch, now, |row| row.resolve(&note, now))
        })
    }
}

/// A number from 0.5 to 1.5, drawn anew each call from the standard library's randomly keyed hasher:
/// enough to spread racing writers, not for secrets.
fn jitter() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let bits = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    0.5 + (bits >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A heartbeat's leases are extended in one durable write; one by one they take one each.
    #[test]
    fn extend_all_extends_every_lease_in_one_durable_write() {
        use miniflow_core::{Command, Decision};
        let dir = tempfile::tempdir().unwrap();
        let mut store = SqliteStore::open(dir.path().join("leases.db")).unwrap();
        let now = Timestamp::from_millis(5);
        let decision: Decision = (0..4)
            .map(|n| Command::new(format!("k{n}"), serde_json::json!({})))
            .collect::<Vec<_>>()
            .into();
        let event = Event::new("e", serde_json::json!({}));
        let commit = Commit::new(
            WorkflowId::new("w").unwrap(),
            Seq::ZERO,
            event,
            decision,
            now,
        );
        store.append_with_commands(&commit.unwrap()).unwrap();
        let claimed = store.claim(&ClaimRequest::new("w").limit(4), now).unwrap();
        let leases: Vec<_> = claimed
            .iter()
            .map(|d| (d.command_id.clone(), d.token))
            .collect();
        let writer = store.writer().cloned().unwrap();

        let before = writer.wal_syncs();
        let answers = store
            .extend_all(&leases, Duration::from_secs(60), now)
            .unwrap();
        assert_eq!(writer.wal_syncs() - before, 1, "one write for four leases");
        assert_eq!(answers.len(), 4);
        for (answer, delivery) in answers.iter().zip(&claimed) {
            let extended = answer.as_ref().unwrap();
            assert_eq!(extended.expires_at, now + Duration::from_secs(60));
            let row = store.command(&delivery.command_id).unwrap().unwrap();
            assert_eq!(row.lease.unwrap().expires_at, extended.expires_at);
        }
        let before = writer.wal_syncs();
        for (id, token) in &leases {
            store
                .extend(id, *token, Duration::from_secs(90), now)
                .unwrap();
        }
        assert_eq!(writer.wal_syncs() - before, 4, "one write each");
        assert!(store
            .extend_all(&[], Duration::from_secs(1), now)
            .unwrap()
            .is_empty());
        assert_eq!(writer.wal_syncs() - before, 4, "no write for no lease");
    }

    /// An ack reaches its row by the key the claim remembered, and a key that names another row
    /// completes nothing of that row: the command ID is checked too.
    #[test]
    fn an_ack_by_row_key_completes_its_own_command_only() {
        use miniflow_core::{Command, Decision};
        let dir = tempfile::tempdir().unwrap();
        let mut store = SqliteStore::open(dir.path().join("acks.db")).unwrap();
        let now = Timestamp::from_millis(5);
        let decision = Decision::new()
            .command(Command::new("a", serde_json::json!({})))
            .command(Command::new("b", serde_json::json!({})));
        let event = Event::new("e", serde_json::json!({}));
        let commit = Commit::new(
            WorkflowId::new("w").unwrap(),
            Seq::ZERO,
            event,
            decision,
            now,
        );
        store.append_with_commands(&commit.unwrap()).unwrap();
        let claimed = store.claim(&ClaimRequest::new("w").limit(2), now).unwrap();
        let (a, b) = (&claimed[0], &claimed[1]);
        assert_eq!(store.claimed.len(), 2, "both keys remembered");
        // As if `a`'s row had been purged and its key reused by `b`'s row.
        let b_key = store.claimed[&b.command_id];
        store.claimed.insert(a.command_id.clone(), b_key);

        store.complete(&a.command_id, a.token, None, now).unwrap();
        let status =
            |id: &CommandId, store: &SqliteStore| store.command(id).unwrap().unwrap().status;
        assert_eq!(status(&a.command_id, &store), Status::Done);
        assert_eq!(
            status(&b.command_id, &store),
            Status::Leased,
            "the other row is untouched"
        );
        store
            .complete_all(vec![Ack::new(b.command_id.clone(), b.token)], now)
            .unwrap()
            .remove(0)
            .unwrap();
        assert_eq!(status(&b.command_id, &store), Status::Done);
        assert!(store.claimed.is_empty(), "settled commands are forgotten");
    }

    /// Every query a worker or `pending` runs is answered from an index: none walks the done rows,
    /// and none sorts in a temporary b-tree.
    #[test]
    fn hot_queries_use_their_indexes() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path().join("plan.db")).unwrap();
        for (name, sql, index) in [
            ("pending", SELECT_PENDING, "outbox_unfinished"),
            ("claim", CLAIM_DUE_FIRST, "COVERING INDEX outbox_claim"),
            ("strict claim", CLAIM_STRICT, "COVERING INDEX outbox_claim"),
            (
                "claim leaving kinds out",
                CLAIM_DUE_FIRST_EXCLUDING,
                "COVERING INDEX outbox_claim",
            ),
            (
                "strict claim leaving kinds out",
                CLAIM_STRICT_EXCLUDING,
                "COVERING INDEX outbox_claim",
            ),
            ("next priority", NEXT_PRIORITY, "outbox_claim"),
            (
                "anything claimable",
                ANY_COMMAND_CLAIMABLE,
                "COVERING INDEX outbox_claim",
            ),
            (
                "leases of a kind",
                COUNT_LEASES,
                "COVERING INDEX outbox_counted_leases",
            ),
            ("dead letters", SELECT_DEAD, "outbox_dead"),
            ("one row", SELECT_ONE, "sqlite_autoindex_outbox_1"),
            ("an ack", COMPLETE, "sqlite_autoindex_outbox_1"),
            ("an ack by row key", COMPLETE_BY_KEY, "INTEGER PRIMARY KEY"),
            (
                "a workflow's rows",
                SELECT_WORKFLOW,
                "sqlite_autoindex_outbox_1",
            ),
            ("a commit's checks", LAST_SEQ_AND_RETIRED, "PRIMARY KEY"),
            ("due timers", CLAIM_TIMERS, "timers_due"),
            (
                "anything due",
                ANY_COMMAND_DUE,
                "COVERING INDEX outbox_claim",
            ),
            ("any timer due", ANY_TIMER_DUE, "timers_due"),
            ("one timer", SELECT_TIMER, "PRIMARY KEY"),
            (
                "a workflow's timers",
                SELECT_WORKFLOW_TIMERS,
                "timers_by_workflow",
            ),
            (
                "timers to cancel",
                CANCEL_TIMERS,
                "timers_scheduled_by_name",
            ),
            ("old done rows", PURGE_DONE, "outbox_done"),
            ("finished workflows", RETIRABLE, "PRIMARY KEY"),
            (
                "dead by kind",
                STATS_DEAD,
                "COVERING INDEX outbox_dead_by_kind",
            ),
        ] {
            let plan = query_plan(&store, sql);
            assert!(plan.contains(index), "{name} does not use {index}: {plan}");
            assert!(!plan.contains("TEMP B-TREE"), "{name} sorts: {plan}");
            assert!(
                !plan.contains("SCAN o ") || plan.contains("USING INDEX"),
                "{name} scans the table: {plan}"
            );
        }
    }

    /// Binding new values does not make SQLite prepare a hot statement again: a claim, an ack or a
    /// poll runs its cached statement as it is (a bare `LIMIT ?n` would be planned with its value
    /// and re-prepared on every call).
    #[test]
    fn hot_statements_are_not_prepared_again_when_bound_anew() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path().join("plan.db")).unwrap();
        for sql in [
            CLAIM_DUE_FIRST,
            CLAIM_STRICT,
            CLAIM_DUE_FIRST_EXCLUDING,
            CLAIM_STRICT_EXCLUDING,
            NEXT_PRIORITY,
            ANY_COMMAND_DUE,
            ANY_COMMAND_CLAIMABLE,
            COUNT_LEASES,
            COMPLETE,
            COMPLETE_BY_KEY,
            SELECT_PENDING,
            SELECT_DEAD,
            CLAIM_TIMERS,
            ANY_TIMER_DUE,
            PURGE_DONE,
            SELECT_DEAD_OF_KIND,
            RETIRABLE,
        ] {
            let mut stmt = store.conn.prepare(sql).unwrap();
            let params = stmt.parameter_count();
            for round in 0..3 {
                let args = (1..=params as i64).map(|n| SqlValue::Integer(n * 10 + round));
                let mut rows = stmt.query(rusqlite::params_from_iter(args)).unwrap();
                while rows.next().unwrap().is_some() {}
            }
            let again = stmt.get_status(rusqlite::StatementStatus::RePrepare);
            assert_eq!(again, 0, "prepared again {again} times: {sql}");
        }
    }

    /// The store's own writes run in the writer's group without a savepoint of their own, so each
    /// checks everything that can refuse it before its first write: commits refused for a stale seq
    /// or for a timer no longer scheduled, grouped with commits that are fine, fail alone and write
    /// nothing.
    #[test]
    fn refused_commits_grouped_with_good_ones_fail_alone() {
        use miniflow_core::{json, Command, Decision, Event, TimerId};
        let dir = tempfile::tempdir().unwrap();
        let mut store = SqliteStore::open(dir.path().join("flow.db")).unwrap();
        let commit = |workflow: &str, expected: u64| {
            let id = WorkflowId::new(workflow).unwrap();
            let decision =
                Decision::new().command(Command::new("notify", json!({ "to": workflow })));
            Commit::new(
                id,
                Seq::new(expected).unwrap(),
                Event::new("happened", json!({})),
                decision,
                Timestamp::from_millis(1_000),
            )
            .unwrap()
        };
        store.append_with_commands(&commit("stale", 0)).unwrap();
        let timed = WorkflowId::new("timed").unwrap();
        let unscheduled = TimerId::scheduled(timed, Seq::new(1).unwrap(), 0).unwrap();
        let commits = [
            commit("first", 0),
            commit("stale", 0),
            commit("second", 0),
            commit("timed", 0).firing(unscheduled).unwrap(),
            commit("third", 0),
        ];
        let requests: Vec<(Isolation, crate::writer::testing::Request<()>)> = commits
            .into_iter()
            .map(|commit| {
                let json = CommitJson::of(&commit);
                let work: crate::writer::testing::Request<()> =
                    Box::new(move |tx| write_commit(tx, &commit, &json));
                (Isolation::ChecksFirst, work)
            })
            .collect();
        let answers = crate::writer::testing::grouped(store.writer().unwrap(), requests);
        assert!(answers[0].is_ok(), "{:?}", answers[0]);
        assert!(
            matches!(answers[1], Err(Error::Conflict { .. })),
            "{:?}",
            answers[1]
        );
        assert!(answers[2].is_ok(), "{:?}", answers[2]);
        assert!(
            matches!(answers[3], Err(Error::TimerNotScheduled { .. })),
            "{:?}",
            answers[3]
        );
        assert!(answers[4].is_ok(), "{:?}", answers[4]);
        for (workflow, events) in [
            ("first", 1),
            ("stale", 1),
            ("second", 1),
            ("timed", 0),
            ("third", 1),
        ] {
            let id = WorkflowId::new(workflow).unwrap();
            assert_eq!(store.load(&id).unwrap().len(), events, "{workflow}");
        }
    }

    fn query_plan(store: &SqliteStore, sql: &str) -> String {
        let mut stmt = store
            .conn
            .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
            .unwrap();
        let args = rusqlite::params_from_iter(0..stmt.parameter_count() as i64);
        let plan: Vec<String> = stmt
            .query_map(args, |row| row.get::<_, String>("detail"))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        plan.join(" | ")
    }

    /// Stats read the unfinished rows from a covering partial index (grouping them is their only
    /// sort), the dead ones from theirs and the unfired timers from theirs: never a done row, never
    /// a fired timer, never the table.
    #[test]
    fn stats_read_partial_indexes_only() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path().join("plan.db")).unwrap();
        let plan = query_plan(&store, STATS_UNFINISHED);
        assert!(
            plan.contains("SCAN outbox USING COVERING INDEX outbox_claim"),
            "unfinished rows by kind: {plan}"
        );
        let plan = query_plan(&store, STATS_DEAD);
        assert!(
            plan.contains("SCAN outbox USING COVERING INDEX outbox_dead_by_kind")
                && !plan.contains("TEMP B-TREE"),
            "dead rows by kind: {plan}"
        );
        let plan = query_plan(&store, STATS_TIMERS);
        assert!(
            plan.contains("USING INDEX timers_due")
                || plan.contains("USING INDEX timers_scheduled_by_name"),
            "unfired timers: {plan}"
        );
    }
}
