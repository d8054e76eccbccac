//! [`AsyncStore`]: a SQLite store for async code, its writes run by the file's writer thread.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use ::tokio::sync::oneshot;
use miniflow_core::backend::HistoryId;
use miniflow_core::prelude::*;
use miniflow_core::{
    Ack, ClaimRequest, Clock, CommandId, Delivery, Engine, Error, Event, Extended, Failure,
    Handled, Handover, RetryPolicy, Settled, TimerRow, Timestamp, Workflow, WorkflowId,
};
use rusqlite::Transaction;
use serde_json::Value;

use super::transaction::Undo;
use super::Tx;
use crate::{SqliteOptions, SqliteStore, SystemClock, Writer};

/// A miniflow store on a SQLite file for async code on tokio: a handle that is `Send + Sync +
/// Clone`, whose writes are run by the file's [`Writer`] thread and awaited, never blocking the
/// runtime.
///
/// Every write goes to the writer and resolves once the group it was committed in is durable.
/// [`AsyncStore::handle`] and [`AsyncStore::transaction`] are requests of their own to the writer
/// (see [`Writer::submit`]), answered through a oneshot: `handle` replays, decides and commits
/// inside the writer's transaction, so it never loses a race; `transaction` runs a closure of yours
/// there, so your own rows commit together with events and commands. The outbox calls (claims, acks,
/// failures, extensions, timers) are [`SqliteStore`]'s own, run on tokio's blocking pool with a
/// store of the file: the same rules, the same writes through the same writer.
///
/// Time comes from the store's clock ([`SystemClock`] unless [`AsyncStore::with_clock`] says
/// otherwise), read when a call is made.
///
/// Dropping a call's future does not withdraw its request: a write already queued commits (and a
/// handled event stays handled), like a synchronous call whose caller went away.
///
/// ```
/// use std::sync::Arc;
/// use miniflow_core::{json, ClaimRequest, Command, Decision, Engine, Event, EventRecord, Workflow, WorkflowId};
/// use miniflow_native::tokio::AsyncStore;
///
/// struct Trip;
/// impl Workflow for Trip {
///     type State = ();
///     fn evolve(&self, _: &mut (), _: &EventRecord) {}
///     fn decide(&self, _: &(), event: &EventRecord) -> Decision {
///         Decision::new().command(Command::new("lock_budget", json!({ "trip_id": event.workflow_id })))
///     }
/// }
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
/// let dir = tempfile::tempdir()?;
/// let store = AsyncStore::open(dir.path().join("flow.db")).await?;
/// let engine = Arc::new(Engine::new(Trip));
/// let trip = WorkflowId::new("trip-001")?;
/// let handled = store.handle(&engine, &trip, Event::new("trip_requested", json!({}))).await?;
/// assert_eq!(handled.command_ids[0].to_string(), "trip-001:1:0");
///
/// let claimed = store.claim(ClaimRequest::new("worker-1").limit(10)).await?;
/// store.complete(&claimed[0].command_id, claimed[0].token, None).await?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct AsyncStore {
    shared: Arc<Shared>,
    clock: Arc<dyn Clock + Send + Sync>,
}

impl std::fmt::Debug for AsyncStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncStore")
            .field("path", &self.shared.path)
            .finish_non_exhaustive()
    }
}

/// What every clone of one store shares.
struct Shared {
    path: PathBuf,
    options: SqliteOptions,
    writer: Writer,
    /// The history of this store's events, for the engine's state cache: the writer's reads and
    /// the blocking stores' reads are of one file, and states are kept only from committed events.
    history: HistoryId,
    /// Synchronous stores on the file, for work that runs on a blocking thread: reads on
    /// connections of their own, writes through the same writer.
    stores: Mutex<Vec<SqliteStore>>,
}

impl AsyncStore {
    /// Opens (or creates) the store at `path` with the durable defaults, on a blocking thread, and
    /// starts (or joins) the file's writer thread.
    ///
    /// # Errors
    ///
    /// As [`SqliteStore::open`].
    pub async fn open(path: impl AsRef<Path>) -> Result<Self, Error> {
        Self::open_with(path, &SqliteOptions::default()).await
    }

    /// Opens (or creates) the store at `path` with `options`.
    ///
    /// # Errors
    ///
    /// As [`SqliteStore::open_with`].
    pub async fn open_with(path: impl AsRef<Path>, options: &SqliteOptions) -> Result<Self, Error> {
        let (path, options) = (path.as_ref().to_path_buf(), options.clone());
        blocking(move || {
            let history = HistoryId::unique();
            let store = SqliteStore::open_with(&path, &options)?.with_history(history);
            let writer = store.writer().cloned().ok_or_else(|| {
                Error::Storage(format!("{} has no writer", path.display()).into())
            })?;
            Ok(Self {
                shared: Arc::new(Shared {
                    path,
                    options,
                    writer,
                    history,
                    stores: Mutex::new(vec![store]),
                }),
                clock: Arc::new(SystemClock),
            })
        })
        .await
    }

    /// Takes `now` from `clock` (a [`miniflow_core::ManualClock`] in tests) for this handle and the
    /// clones made from it afterwards.
    #[must_use]
    pub fn with_clock(mut self, clock: Arc<dyn Clock + Send + Sync>) -> Self {
        self.clock = clock;
        self
    }

    /// The file the store lives in.
    pub fn path(&self) -> &Path {
        &self.shared.path
    }

    /// The writer thread the store's writes go to.
    pub fn writer(&self) -> &Writer {
        &self.shared.writer
    }

    pub(crate) fn clock(&self) -> &Arc<dyn Clock + Send + Sync> {
        &self.clock
    }

    /// Runs `work` in the writer's transaction and resolves once its fate is known: `answer` turns
    /// the outcome (its value once durable, or the error) into the answer, on the writer thread
    /// (keep it short).
    pub(crate) async fn submit<T, R>(
        &self,
        work: impl FnOnce(&Transaction<'_>) -> Result<T, Error> + Send + 'static,
        answer: impl FnOnce(Result<T, Error>) -> Result<R, Error> + Send + 'static,
    ) -> Result<R, Error>
    where
        T: Send + 'static,
        R: Send + 'static,
    {
        let (reply, answered) = oneshot::channel();
        self.shared.writer.submit(work, move |result| {
            // The caller may have gone away; the write stands either way.
            let _ = reply.send(answer(result));
        });
        answered.await.unwrap_or_else(|_| Err(stopped()))
    }

    /// Runs `work` in the writer's transaction; resolves with its value once it is durable.
    pub(crate) async fn write<T: Send + 'static>(
        &self,
        work: impl FnOnce(&Transaction<'_>) -> Result<T, Error> + Send + 'static,
    ) -> Result<T, Error> {
        self.submit(work, |result| result).await
    }

    /// Records `event` in `workflow_id` with the commands `engine`'s workflow decides for it (as
    /// [`Engine::handle`]), in the writer's transaction: the workflow is folded there from the
    /// engine's cached state (or from its first event), so no other writer moves it meanwhile and
    /// there is no conflict to retry. The folded state goes back to the engine's cache at once, so
    /// the next call on the workflow in the same group folds on from it; if the group fails, the
    /// engine forgets it.
    ///
    /// The workflow's `evolve` and `decide` run on the writer thread while it holds the file's write
    /// lock: they must be quick (they are pure functions anyway). A panic in them fails this call
    /// alone, with an [`Error::Storage`] that says so.
    ///
    /// # Errors
    ///
    /// As [`Engine::handle`]: [`Error::InvalidInput`], [`Error::Rejected`], the store's errors. In
    /// every case nothing of this event was written.
    pub async fn handle<W>(
        &self,
        engine: &Arc<Engine<W>>,
        workflow_id: &WorkflowId,
        event: Event,
    ) -> Result<Handled, Error>
    where
        W: Workflow + Send + Sync + 'static,
        W::State: Send,
    {
        let now = self.clock.now();
        let (engine, failed) = (engine.clone(), engine.clone());
        let history = self.shared.history;
        let (workflow_id, forget) = (workflow_id.clone(), workflow_id.clone());
        self.submit(
            move |tx| super::transaction::handle_in(tx, &engine, history, &workflow_id, event, now),
            move |result| {
                if result.is_err() {
                    failed.forget(history, &forget);
                }
                result
            },
        )
        .await
    }

    /// Starts `workflow_id` with `event` as its first event (as [`Engine::start`]): decided from the
    /// workflow's initial state on the caller's task, without reading the file, and refused by the
    /// writer with [`Error::Conflict`] if the workflow already has events.
    ///
    /// # Errors
    ///
    /// As [`Engine::start`]. In every case nothing of this event was written.
    pub async fn start<W>(
        &self,
        engine: &Engine<W>,
        workflow_id: &WorkflowId,
        event: Event,
    ) -> Result<Handled, Error>
    where
        W: Workflow,
    {
        let commit = engine.plan(&[], workflow_id, event, self.clock.now())?;
        let handled = Handled::of(&commit, 0);
        self.write(move |tx| SqliteStore::append_in(tx, &commit))
            .await?;
        Ok(handled)
    }

    /// Fires a due `timer` (from [`AsyncStore::claim_timers`]) into its workflow through `engine`:
    /// [`Engine::fire`] itself, on a blocking thread, with a [`SqliteStore`] of this file (reading on
    /// its own connection, committing through the same writer). `None` when the timer is no longer
    /// scheduled.
    ///
    /// # Errors
    ///
    /// As [`Engine::fire`]. A panic in the workflow's code is resumed in the caller's task.
    pub async fn fire<W>(
        &self,
        engine: &Arc<Engine<W>>,
        timer: TimerRow,
    ) -> Result<Option<Handled>, Error>
    where
        W: Workflow + Send + Sync + 'static,
        W::State: Send,
    {
        let (engine, now) = (engine.clone(), self.clock.now());
        self.with_store(move |store| engine.fire(store, &timer, now))
            .await
    }

    /// Runs `work` in the writer's transaction, and resolves with its value once that transaction
    /// is durable: your own rows, events and commands ([`Tx::handle`], [`Tx::append`]) and
    /// idempotency records ([`super::AsyncIdempotencyStore::begin_in`]) commit together, or — when
    /// `work` returns an error or panics — none of them does, and the error is returned.
    ///
    /// `work` runs on the writer thread while it holds the file's write lock, and every other write
    /// of the process waits for it: run a few statements and return. Never await, block or call
    /// another service in it.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use miniflow_core::{json, Command, Decision, Engine, Event, EventRecord, Workflow, WorkflowId};
    /// use miniflow_native::tokio::AsyncStore;
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
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
    /// let dir = tempfile::tempdir()?;
    /// let store = AsyncStore::open(dir.path().join("shop.db")).await?;
    /// store.transaction(|tx| tx.execute("CREATE TABLE orders (id TEXT PRIMARY KEY, total INTEGER)", [])).await?;
    ///
    /// let engine = Arc::new(Engine::new(Shop));
    /// let handled = store.transaction(move |tx| {
    ///     tx.execute("INSERT INTO orders VALUES ('order-7', 1200)", [])?;
    ///     let order = WorkflowId::new("order-7")?;
    ///     tx.handle(&engine, &order, Event::new("placed", json!({ "amount": 1200 })))
    /// }).await?; // the order row, the event and its command: durable together
    /// assert_eq!(handled.command_ids[0].to_string(), "order-7:1:0");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// `work`'s error (nothing of it was written), or the group's when the commit failed.
    pub async fn transaction<R>(
        &self,
        work: impl FnOnce(&mut Tx<'_>) -> Result<R, Error> + Send + 'static,
    ) -> Result<R, Error>
    where
        R: Send + 'static,
    {
        let (now, history) = (self.clock.now(), self.shared.history);
        let undo = Arc::new(Mutex::new(Undo::default()));
        let on_failure = undo.clone();
        self.submit(
            move |tx| work(&mut Tx::new(tx, now, history, &undo)),
            move |result| {
                if result.is_err() {
                    std::mem::take(&mut *on_failure.lock().unwrap_or_else(PoisonError::into_inner))
                        .run();
                }
                result
            },
        )
        .await
    }

    /// Runs `work` on a blocking thread with a [`SqliteStore`] of this file: for reads (`pending`,
    /// `commands`, `load`, listings) and for operators' actions (`retry`, `resolve`, `purge_done`).
    /// The store reads on a connection of its own and writes through the same writer.
    ///
    /// # Errors
    ///
    /// `work`'s errors, or the store's when a new one cannot be opened. A panic in `work` is resumed
    /// in the caller's task.
    pub async fn with_store<R: Send + 'static>(
        &self,
        work: impl FnOnce(&mut SqliteStore) -> Result<R, Error> + Send + 'static,
    ) -> Result<R, Error> {
        let shared = self.shared.clone();
        blocking(move || {
            let mut store = shared.take_store()?;
            let result = work(&mut store);
            shared.put_store(store);
            result
        })
        .await
    }

    /// Leases up to `request.limit` claimable commands (see [`miniflow_core::Outbox::claim`]):
    /// [`SqliteStore`]'s claim, on a blocking thread. It looks for a due command on a connection of
    /// its own first and takes the write lock only when there is one, so idle pollers do not keep
    /// the file's writers waiting.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a request out of bounds; the store's errors.
    pub async fn claim(&self, request: ClaimRequest) -> Result<Vec<Delivery>, Error> {
        let now = self.clock.now();
        self.with_store(move |store| store.claim(&request, now))
            .await
    }

    /// Acknowledges `acks` and claims the next batch in one transaction (see
    /// [`miniflow_core::Outbox::complete_all_and_claim`]).
    ///
    /// # Errors
    ///
    /// As [`miniflow_core::Outbox::complete_all_and_claim`].
    pub async fn complete_all_and_claim(
        &self,
        acks: Vec<Ack>,
        request: ClaimRequest,
    ) -> Result<Handover, Error> {
        let now = self.clock.now();
        self.with_store(move |store| store.complete_all_and_claim(acks, &request, now))
            .await
    }

    /// Completes many deliveries in one durable write; one result per ack, in order (see
    /// [`miniflow_core::Outbox::complete_all`]).
    ///
    /// # Errors
    ///
    /// The store's errors for the whole write.
    pub async fn complete_all(&self, acks: Vec<Ack>) -> Result<Vec<Result<(), Error>>, Error> {
        let now = self.clock.now();
        self.with_store(move |store| store.complete_all(acks, now))
            .await
    }

    /// Marks the delivery under `token` done, with the handler's `result` (see
    /// [`miniflow_core::Outbox::complete`]).
    ///
    /// # Errors
    ///
    /// [`Error::StaleLease`] when another worker took the command over; [`Error::InvalidInput`] for a
    /// result over the JSON limits; the store's errors.
    pub async fn complete(
        &self,
        command_id: &CommandId,
        token: u64,
        result: Option<Value>,
    ) -> Result<(), Error> {
        let (command_id, now) = (command_id.clone(), self.clock.now());
        self.with_store(move |store| store.complete(&command_id, token, result.as_ref(), now))
            .await
    }

    /// Settles a failed delivery under `token` by `policy` (see [`miniflow_core::Outbox::fail`]).
    ///
    /// # Errors
    ///
    /// [`Error::StaleLease`], [`Error::UnknownCommand`], the store's errors.
    pub async fn fail(
        &self,
        command_id: &CommandId,
        token: u64,
        failure: Failure,
        policy: RetryPolicy,
    ) -> Result<Settled, Error> {
        let (command_id, now) = (command_id.clone(), self.clock.now());
        self.with_store(move |store| store.fail(&command_id, token, &failure, &policy, now))
            .await
    }

    /// Extends the lease of `token` to `now + ttl` (see [`miniflow_core::Outbox::extend`]).
    ///
    /// # Errors
    ///
    /// [`Error::StaleLease`] when `token` is not the current lease; the store's errors.
    pub async fn extend(
        &self,
        command_id: &CommandId,
        token: u64,
        ttl: Duration,
    ) -> Result<Extended, Error> {
        let (command_id, now) = (command_id.clone(), self.clock.now());
        self.with_store(move |store| store.extend(&command_id, token, ttl, now))
            .await
    }

    /// Gives back a claimed command whose delivery was not started (see
    /// [`miniflow_core::Outbox::release`]).
    ///
    /// # Errors
    ///
    /// [`Error::StaleLease`] when `token` is not the current lease; the store's errors.
    pub async fn release(&self, command_id: &CommandId, token: u64) -> Result<(), Error> {
        let (command_id, now) = (command_id.clone(), self.clock.now());
        self.with_store(move |store| store.release(&command_id, token, now))
            .await
    }

    /// Takes up to `limit` due timers for `lease_ttl` (see
    /// [`miniflow_core::Timers::claim_timers`]), as [`SqliteStore`] does (on a blocking thread,
    /// taking the write lock only when a timer is due); fire each with [`AsyncStore::fire`].
    ///
    /// # Errors
    ///
    /// The store's errors.
    pub async fn claim_timers(
        &self,
        limit: usize,
        lease_ttl: Duration,
    ) -> Result<Vec<TimerRow>, Error> {
        let now = self.clock.now();
        self.with_store(move |store| store.claim_timers(limit, lease_ttl, now))
            .await
    }
}

impl Shared {
    fn take_store(&self) -> Result<SqliteStore, Error> {
        let pooled = self
            .stores
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        match pooled {
            Some(store) => Ok(store),
            None => {
                Ok(SqliteStore::open_with(&self.path, &self.options)?.with_history(self.history))
            }
        }
    }

    fn put_store(&self, store: SqliteStore) {
        self.stores
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(store);
    }
}

/// Runs `work` on tokio's blocking pool; a panic in it is resumed in the caller's task.
pub(crate) async fn blocking<R: Send + 'static>(
    work: impl FnOnce() -> Result<R, Error> + Send + 'static,
) -> Result<R, Error> {
    match ::tokio::task::spawn_blocking(work).await {
        Ok(result) => result,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => Err(Error::Storage(
            format!("the blocking task was cancelled: {e}").into(),
        )),
    }
}

pub(crate) fn stopped() -> Error {
    Error::Storage("the writer thread of this file has stopped".into())
}

/// The worker pool's view of the store: [`crate::tokio::AsyncDispatcher`]'s steps are
/// [`SqliteStore`]'s own operations on the file's pooled stores, on tokio's blocking threads (a
/// claim first looks for due work on a connection of its own, so an idle poll takes no write
/// lock), except the heartbeat's extensions, which are awaited on the writer without a blocking
/// thread. Every write goes through the file's writer, and the writer wakes the
/// dispatcher. `now` is the dispatcher's, read from this handle's clock.
///
/// A step whose future is dropped still runs to its end on its blocking thread or the writer: its
/// write commits or fails whole, as a synchronous call whose caller went away.
impl miniflow_pool::tokio::AsyncSource for AsyncStore {
    fn complete_all_and_claim(
        &self,
        acks: Vec<Ack>,
        request: &ClaimRequest,
        now: Timestamp,
    ) -> impl Future<Output = Result<Handover, Error>> + Send {
        let request = request.clone();
        self.with_store(move |store| store.complete_all_and_claim(acks, &request, now))
    }

    fn complete_all(
        &self,
        acks: Vec<Ack>,
        now: Timestamp,
    ) -> impl Future<Output = Result<Vec<Result<(), Error>>, Error>> + Send {
        self.with_store(move |store| store.complete_all(acks, now))
    }

    fn fail(
        &self,
        command_id: &CommandId,
        token: u64,
        failure: &Failure,
        policy: &RetryPolicy,
        now: Timestamp,
    ) -> impl Future<Output = Result<Settled, Error>> + Send {
        let (id, failure, policy) = (command_id.clone(), failure.clone(), policy.clone());
        self.with_store(move |store| store.fail(&id, token, &failure, &policy, now))
    }

    fn extend_all(
        &self,
        leases: &[(CommandId, u64)],
        ttl: Duration,
        now: Timestamp,
    ) -> impl Future<Output = Result<Vec<Result<Extended, Error>>, Error>> + Send {
        let leases = leases.to_vec();
        self.write(move |tx| SqliteStore::extend_all_in(tx, &leases, ttl, now))
    }

    fn release(
        &self,
        command_id: &CommandId,
        token: u64,
        now: Timestamp,
    ) -> impl Future<Output = Result<(), Error>> + Send {
        let id = command_id.clone();
        self.with_store(move |store| store.release(&id, token, now))
    }

    fn claim_timers(
        &self,
        limit: usize,
        lease_ttl: Duration,
        now: Timestamp,
    ) -> impl Future<Output = Result<Vec<TimerRow>, Error>> + Send {
        self.with_store(move |store| store.claim_timers(limit, lease_ttl, now))
    }

    /// [`Engine::fire`] itself, as [`AsyncStore::fire`] runs it: a panic of the workflow's code is
    /// resumed in the dispatcher's task, which counts it.
    fn fire<W>(
        &self,
        engine: &Arc<Engine<W>>,
        timer: &TimerRow,
        now: Timestamp,
    ) -> impl Future<Output = Result<Option<Handled>, Error>> + Send
    where
        W: Workflow + Send + Sync + 'static,
        W::State: Send,
    {
        let (engine, timer) = (engine.clone(), timer.clone());
        self.with_store(move |store| engine.fire(store, &timer, now))
    }

    fn any_timer_due(&self, now: Timestamp) -> impl Future<Output = Result<bool, Error>> + Send {
        self.with_store(move |store| store.any_timer_due(now))
    }

    fn clock(&self) -> Arc<dyn Clock + Send + Sync> {
        self.clock.clone()
    }

    fn wakeup(&self) -> Option<Arc<dyn miniflow_pool::Wakeup>> {
        Some(Arc::new(self.shared.writer.clone()))
    }
}
