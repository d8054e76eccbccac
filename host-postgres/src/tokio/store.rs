//! [`AsyncPostgresStore`]: the store on PostgreSQL for tokio services, on tokio-postgres.

use std::future::Future;
use std::ops::{Deref, DerefMut};
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use deadpool::managed;
use miniflow_core::backend::{AsyncEventLog, HistoryId};
use miniflow_core::{
    Ack, AppendedAfter, ClaimRequest, Clock, CommandId, Commit, Delivery, Engine, Error, Event,
    EventRecord, Extended, Failure, Handled, Handover, KindChange, KindControl, OutboxRow,
    OutboxStats, RetryPolicy, Seq, Settled, TimerId, TimerRow, Timestamp, Workflow, WorkflowId,
};
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::{Config, NoTls, Socket};

use super::caller::CallerTransaction;
use super::listen::listen_until_stopped;
use super::pool::{connect, pool_error, AsyncConnection, Manager};
use crate::acks::settled_outward;
use crate::commit::LastEvent;
use crate::connect::{redact_password, startup_options, Connecting};
use crate::db::Exec;
use crate::db::Statements;
use crate::errors::DriverError;
use crate::migrations::{prepare, Track};
use crate::notifier::{Watch, COALESCE, NOTIFY_CHANNEL, SEND_HINT, XACT_STATUS};
use crate::ops;
use crate::options::PostgresOptions;
use crate::queries::*;
use crate::rows::{id_params, load_events, load_events_after, query_rows, query_timers};
use crate::telemetry::sending_async;
use crate::wakeup::{State, Wakeups};

/// The miniflow store on PostgreSQL for tokio services: the [`crate::PostgresStore`]'s operations
/// (the same statements and rules, written once) on tokio-postgres connections from a pool of its
/// own, awaited instead of blocking a thread. Its methods have the names and shapes of the SQLite
/// host's `AsyncStore`, so a service moves from one to the other by how it opens the store.
///
/// A handle is cheap to clone; the clones share the pool. Every method takes `now` from the store's
/// clock ([`AsyncPostgresStore::with_clock`], the system clock by default), or the database's
/// with [`PostgresOptions::database_clock`].
///
/// **A dropped call** (its future dropped before it finished, as a timeout, a `select!` or a client
/// that went away does) leaves nothing half done: each operation is one transaction, and a
/// connection dropped while one is open is closed at once, not given back, which rolls it back and
/// releases its row locks. A statement already sent still runs: whether a dropped commit committed
/// is unknown to the caller (as with any database), and each method says how calling again finds
/// out. The caller's-transaction methods (`*_in`) are the exception: a dropped one may leave rows
/// in the caller's transaction, which must then be rolled back.
///
/// ```no_run
/// use std::sync::Arc;
/// use miniflow_core::{json, Command, Decision, Engine, Event, EventRecord, Workflow, WorkflowId};
/// use miniflow_postgres::tokio::AsyncPostgresStore;
///
/// struct Orders;
/// impl Workflow for Orders {
///     type State = ();
///     fn evolve(&self, _: &mut (), _: &EventRecord) {}
///     fn decide(&self, _: &(), event: &EventRecord) -> Decision {
///         Decision::new().command(Command::new("charge_card", event.payload.clone()))
///     }
/// }
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let store = AsyncPostgresStore::connect("postgresql://app@db.internal/shop").await?;
/// let engine = Arc::new(Engine::new(Orders));
/// let order = WorkflowId::new("order-7")?;
/// store.start(&engine, &order, Event::new("placed", json!({ "amount": 1200 }))).await?;
///
/// // The caller's own transaction: the order row and miniflow's rows commit together.
/// let mut client = store.client().await?;
/// let tx = client.transaction().await?;
/// tx.execute("INSERT INTO orders VALUES ('order-8', 900)", &[]).await?;
/// let next = WorkflowId::new("order-8")?;
/// store.start_in(&tx, &engine, &next, Event::new("placed", json!({ "amount": 900 }))).await?;
/// tx.commit().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct AsyncPostgresStore {
    shared: Arc<Shared>,
    clock: Arc<dyn Clock + Send + Sync>,
}

impl std::fmt::Debug for AsyncPostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncPostgresStore")
            .field("options", &self.shared.options)
            .finish_non_exhaustive()
    }
}

/// A connection checked out of the pool, whatever TLS connector it was built with.
type Checkout<'a> = Pin<Box<dyn Future<Output = Result<Box<dyn Held>, Error>> + Send + 'a>>;

/// A checked-out connection; it goes back to the pool when dropped.
pub(crate) trait Held: DerefMut<Target = AsyncConnection> + Send + Sync {}
impl<T: DerefMut<Target = AsyncConnection> + Send + Sync> Held for T {}

/// Where an async store's connections come from.
trait Connections: Send + Sync {
    fn get(&self) -> Checkout<'_>;
}

impl<T> Connections for managed::Pool<Manager<T>>
where
    T: MakeTlsConnect<Socket> + Clone + Send + Sync + 'static,
    T::Stream: Send + Sync + 'static,
    T::TlsConnect: Send + Sync,
    <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
{
    fn get(&self) -> Checkout<'_> {
        Box::pin(async move {
            let connection = managed::Pool::get(self).await.map_err(pool_error)?;
            Ok(Box::new(Checked(Some(connection))) as Box<dyn Held>)
        })
    }
}

/// A connection of the pool that is closed at once, not given back, when it is dropped inside a
/// transaction of the store's (the operation's future was dropped at an await point, or
/// panicked): the server rolls the transaction back and releases its row locks now, instead of
/// when the pool would next hand the connection out, which an idle service may never do.
struct Checked<T: MakeTlsConnect<Socket> + Clone + Send + Sync + 'static>(
    Option<managed::Object<Manager<T>>>,
)
where
    T::Stream: Send + Sync + 'static,
    T::TlsConnect: Send + Sync,
    <T::TlsConnect as TlsConnect<Socket>>::Future: Send;

impl<T> Deref for Checked<T>
where
    T: MakeTlsConnect<Socket> + Clone + Send + Sync + 'static,
    T::Stream: Send + Sync + 'static,
    T::TlsConnect: Send + Sync,
    <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
{
    type Target = AsyncConnection;
    fn deref(&self) -> &AsyncConnection {
        self.0.as_ref().expect("a connection until dropped")
    }
}

impl<T> DerefMut for Checked<T>
where
    T: MakeTlsConnect<Socket> + Clone + Send + Sync + 'static,
    T::Stream: Send + Sync + 'static,
    T::TlsConnect: Send + Sync,
    <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
{
    fn deref_mut(&mut self) -> &mut AsyncConnection {
        self.0.as_mut().expect("a connection until dropped")
    }
}

impl<T> Drop for Checked<T>
where
    T: MakeTlsConnect<Socket> + Clone + Send + Sync + 'static,
    T::Stream: Send + Sync + 'static,
    T::TlsConnect: Send + Sync,
    <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
{
    fn drop(&mut self) {
        if let Some(connection) = self.0.take() {
            if connection.in_transaction() {
                // Out of the pool (its slot freed for a new connection), then closed.
                drop(managed::Object::take(connection));
            }
        }
    }
}

/// What the clones of one store share.
struct Shared {
    connections: Arc<dyn Connections>,
    options: PostgresOptions,
    history: HistoryId,
    /// Wakes the task that sends the hint (`NOTIFY`): at once (`None`), or once the caller's
    /// transaction commits (`Some(xid)`). The task ends when the last clone goes.
    hint: mpsc::UnboundedSender<Option<i64>>,
    /// The listener that wakes the store's dispatchers, started by the first one.
    wakeups: OnceLock<Wakeups>,
    /// Starts a listener counting into the state given, on a connection of its own.
    listen: Box<dyn Fn(Arc<State>) + Send + Sync>,
}

/// A connection of the store's pool, for the caller's own statements and transactions
/// ([`AsyncPostgresStore::client`]); it goes back to the pool when dropped.
pub struct PooledAsyncClient(Box<dyn Held>);

impl Deref for PooledAsyncClient {
    type Target = tokio_postgres::Client;
    fn deref(&self) -> &tokio_postgres::Client {
        self.0.client()
    }
}

impl DerefMut for PooledAsyncClient {
    fn deref_mut(&mut self) -> &mut tokio_postgres::Client {
        self.0.client_mut()
    }
}

impl std::fmt::Debug for PooledAsyncClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PooledAsyncClient").finish_non_exhaustive()
    }
}

impl AsyncPostgresStore {
    /// Connects to the database at `url` (`postgresql://user:password@host:port/database`, or
    /// `host=… user=… dbname=…`; several hosts with `target_session_attrs=read-write` follow a
    /// failover) without TLS, with the default [`PostgresOptions`], and brings its schema up to date.
    ///
    /// # Errors
    ///
    /// As [`crate::PostgresStore::connect`].
    pub async fn connect(url: &str) -> Result<Self, Error> {
        Self::connect_with(url, &PostgresOptions::default()).await
    }

    /// As [`AsyncPostgresStore::connect`], with `options`.
    ///
    /// # Errors
    ///
    /// As [`crate::PostgresStore::connect_with`].
    pub async fn connect_with(url: &str, options: &PostgresOptions) -> Result<Self, Error> {
        Self::connect_for(url, options, Track::Outbox).await
    }

    /// As [`AsyncPostgresStore::connect_with`], on a database holding `track`'s tables.
    pub(crate) async fn connect_for(
        url: &str,
        options: &PostgresOptions,
        track: Track,
    ) -> Result<Self, Error> {
        let config: Config = url.parse().map_err(|e: tokio_postgres::Error| {
            Error::invalid(
                "url",
                redact_password(url),
                format!("is not a PostgreSQL URL: {}", DriverError(e)),
            )
        })?;
        Self::open(config, NoTls, options, track, ("url", redact_password(url))).await
    }

    /// Connects with a parsed `config` through the TLS connector `tls`.
    ///
    /// # Errors
    ///
    /// As [`AsyncPostgresStore::connect_with`].
    pub async fn connect_tls<T>(
        config: Config,
        tls: T,
        options: &PostgresOptions,
    ) -> Result<Self, Error>
    where
        T: MakeTlsConnect<Socket> + Clone + Send + Sync + 'static,
        T::Stream: Send + Sync + 'static,
        T::TlsConnect: Send + Sync,
        <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
    {
        let database = config.get_dbname().unwrap_or("(the user's)").to_owned();
        Self::open(config, tls, options, Track::Outbox, ("database", database)).await
    }

    async fn open<T>(
        mut config: Config,
        tls: T,
        options: &PostgresOptions,
        track: Track,
        target: (&'static str, String),
    ) -> Result<Self, Error>
    where
        T: MakeTlsConnect<Socket> + Clone + Send + Sync + 'static,
        T::Stream: Send + Sync + 'static,
        T::TlsConnect: Send + Sync,
        <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
    {
        options.validate()?;
        config.options(startup_options(config.get_options(), options));
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(options.connect_timeout);
        }
        if config.get_application_name().is_none() {
            config.application_name("miniflow");
        }
        // The checks on a connection of their own: a server that cannot be reached fails the
        // connect at once with what went wrong, where the pool would retry until its timeout.
        let client = connect(&config, tls.clone()).await.map_err(|e| {
            Error::Storage(Box::new(Connecting {
                target: format!("{} {}", target.0, target.1),
                source: Box::new(DriverError(e)),
            }))
        })?;
        let mut checking = AsyncConnection::new(client, Statements::default());
        let db = &mut checking.db();
        prepare(db, options, track, target).await?;
        drop(checking);
        let pool = managed::Pool::builder(Manager {
            config,
            tls: tls.clone(),
        })
        .max_size(usize::try_from(options.pool_size).unwrap_or(usize::MAX))
        .wait_timeout(Some(options.connect_timeout))
        .create_timeout(Some(options.connect_timeout))
        .runtime(deadpool::Runtime::Tokio1)
        .build()
        .map_err(|e| Error::Storage(format!("cannot build the connection pool: {e}").into()))?;
        let connections: Arc<dyn Connections> = Arc::new(pool.clone());
        let listening = pool.manager().config.clone();
        let listen = Box::new(move |state: Arc<State>| {
            tokio::spawn(listen_until_stopped(listening.clone(), tls.clone(), state));
        });
        let (hint, hints) = mpsc::unbounded_channel();
        if options.notifies() && !options.read_only {
            tokio::spawn(send_hints(connections.clone(), hints));
        }
        Ok(Self {
            shared: Arc::new(Shared {
                connections,
                options: options.clone(),
                history: HistoryId::unique(),
                hint,
                wakeups: OnceLock::new(),
                listen,
            }),
            clock: Arc::new(miniflow_pool::SystemClock),
        })
    }

    /// This store taking `now` from `clock` (tests, simulations).
    #[must_use]
    pub fn with_clock(mut self, clock: Arc<dyn Clock + Send + Sync>) -> Self {
        self.clock = clock;
        self
    }

    /// The clock the store takes `now` from.
    pub fn clock(&self) -> &Arc<dyn Clock + Send + Sync> {
        &self.clock
    }

    /// The options the store was connected with.
    pub fn options(&self) -> &PostgresOptions {
        &self.shared.options
    }

    /// A connection from the store's pool, for the caller's own statements and transactions
    /// ([`AsyncPostgresStore::append_in`]). Writing miniflow's tables through it bypasses every
    /// rule miniflow keeps.
    ///
    /// # Errors
    ///
    /// [`Error::Storage`] when no connection can be had within the connect timeout.
    pub async fn client(&self) -> Result<PooledAsyncClient, Error> {
        Ok(PooledAsyncClient(self.connection().await?))
    }

    /// A connection of the pool, for the operations.
    pub(crate) async fn connection(&self) -> Result<Box<dyn Held>, Error> {
        self.shared.connections.get().await
    }

    /// Raises the wake-up hint when an operation that committed made work claimable.
    fn hint(&self, work: bool) {
        if work {
            // The task coalesces the hints raised while it sends one.
            let _ = self.shared.hint.send(None);
        }
    }

    /// Records `event` in `workflow_id` with the commands `engine`'s workflow decides for it (as
    /// [`Engine::handle`]: replay, decide, one commit, a lost race tried again after a short wait).
    ///
    /// A dropped call is written whole or not at all, possibly just after the drop. Calling again
    /// records the event again if the first got through: give such events an identity of your own
    /// where a repeat matters, or use [`AsyncPostgresStore::start`].
    ///
    /// # Errors
    ///
    /// As [`Engine::handle`]. In every case nothing of this event was written.
    pub async fn handle<W>(
        &self,
        engine: &Engine<W>,
        workflow_id: &WorkflowId,
        event: Event,
    ) -> Result<Handled, Error>
    where
        W: Workflow + Sync,
        W::State: Send,
    {
        let now = self.clock.now();
        engine
            .handle_on(&mut Log(self), workflow_id, event, None, now)
            .await
    }

    /// Starts `workflow_id` with `event` as its first event (as [`Engine::start`]): nothing is read
    /// before the commit, and a workflow that has events already is an [`Error::Conflict`].
    ///
    /// A dropped call is written whole or not at all, possibly just after the drop. Calling again
    /// finds out: [`Error::Conflict`] once the first got through.
    ///
    /// # Errors
    ///
    /// As [`Engine::start`].
    pub async fn start<W>(
        &self,
        engine: &Engine<W>,
        workflow_id: &WorkflowId,
        event: Event,
    ) -> Result<Handled, Error>
    where
        W: Workflow + Sync,
        W::State: Send,
    {
        let now = self.clock.now();
        engine
            .start_on(&mut Log(self), workflow_id, event, None, now)
            .await
    }

    /// Fires a due `timer` from [`AsyncPostgresStore::claim_timers`] (as [`Engine::fire`]); `None`
    /// when it is no longer scheduled.
    ///
    /// A dropped call is written whole or not at all, possibly just after the drop. Firing again
    /// answers `None` once the first got through.
    ///
    /// # Errors
    ///
    /// As [`Engine::fire`].
    pub async fn fire<W>(
        &self,
        engine: &Engine<W>,
        timer: &TimerRow,
    ) -> Result<Option<Handled>, Error>
    where
        W: Workflow + Sync,
        W::State: Send,
    {
        let now = self.clock.now();
        engine.fire_on(&mut Log(self), timer, now).await
    }

    /// Writes `commit` (as [`miniflow_core::EventLog::append_with_commands`]).
    ///
    /// A dropped call is written whole or not at all, possibly just after the drop. Calling again
    /// answers [`Error::Conflict`] once the first got through.
    ///
    /// # Errors
    ///
    /// As [`miniflow_core::EventLog::append_with_commands`].
    pub async fn append(&self, commit: &Commit) -> Result<(), Error> {
        sending_async(commit, self.append_checked(commit, None)).await
    }

    async fn append_checked(&self, commit: &Commit, last: Option<&LastEvent>) -> Result<(), Error> {
        let mut connection = self.connection().await?;
        let work = ops::append(&mut connection.db(), &self.shared.options, commit, last).await?;
        self.hint(work);
        Ok(())
    }

    /// Writes `commit` inside the caller's own transaction `tx`, so that the caller's rows commit
    /// together with the event and its commands, or not at all (as
    /// [`crate::PostgresStore::append_in`]). The store never commits `tx` and never retries in it;
    /// on an error nothing of the commit stays in it (a savepoint is rolled back) and `tx` is not
    /// left aborted, so the caller may go on or roll back. A lost race is [`Error::Conflict`]. The
    /// wake-up hint is part of `tx`: dispatchers hear it when the caller commits.
    ///
    /// A dropped call may leave its savepoint and some of its rows in `tx`: roll `tx` back (drop
    /// it), never commit it after a dropped call.
    ///
    /// # Errors
    ///
    /// As [`crate::PostgresStore::append_in`].
    pub async fn append_in(
        &self,
        tx: impl Into<CallerTransaction<'_>>,
        commit: &Commit,
    ) -> Result<(), Error> {
        self.append_caller(&mut tx.into(), commit).await
    }

    async fn append_caller(
        &self,
        tx: &mut CallerTransaction<'_>,
        commit: &Commit,
    ) -> Result<(), Error> {
        sending_async(commit, async {
            let xid = ops::append_in(tx, &self.shared.options, commit).await?;
            if let Some(xid) = xid {
                let _ = self.shared.hint.send(Some(xid));
            }
            Ok(())
        })
        .await
    }

    /// [`AsyncPostgresStore::handle`] inside the caller's own transaction `tx`: replays the workflow
    /// from `tx`, decides, and writes the commit with [`AsyncPostgresStore::append_in`]. A concurrent
    /// commit of the same workflow is [`Error::Conflict`]; roll back and try again.
    ///
    /// A dropped call may leave some of its rows in `tx`: roll `tx` back, never commit it after a
    /// dropped call.
    ///
    /// # Errors
    ///
    /// As [`Engine::handle`].
    pub async fn handle_in<W: Workflow>(
        &self,
        tx: impl Into<CallerTransaction<'_>>,
        engine: &Engine<W>,
        workflow_id: &WorkflowId,
        event: Event,
    ) -> Result<Handled, Error> {
        let mut tx = tx.into();
        let events = ops::load_events_in(&mut tx, &self.shared.options, workflow_id).await?;
        let commit = engine.plan(&events, workflow_id, event, self.clock.now())?;
        self.append_caller(&mut tx, &commit).await?;
        Ok(Handled::of(&commit, 0))
    }

    /// [`AsyncPostgresStore::start`] inside the caller's own transaction `tx`: nothing is read
    /// before the commit, which checks that the workflow is new ([`Error::Conflict`] if not).
    ///
    /// A dropped call may leave some of its rows in `tx`: roll `tx` back, never commit it after a
    /// dropped call.
    ///
    /// # Errors
    ///
    /// As [`Engine::start`].
    pub async fn start_in<W: Workflow>(
        &self,
        tx: impl Into<CallerTransaction<'_>>,
        engine: &Engine<W>,
        workflow_id: &WorkflowId,
        event: Event,
    ) -> Result<Handled, Error> {
        let commit = engine.plan(&[], workflow_id, event, self.clock.now())?;
        self.append_caller(&mut tx.into(), &commit).await?;
        Ok(Handled::of(&commit, 0))
    }

    /// The events of `workflow_id` in seq order.
    ///
    /// # Errors
    ///
    /// [`Error::Storage`] when the database cannot be read; [`Error::Corrupt`] for an event that
    /// cannot be read.
    pub async fn load(&self, workflow_id: &WorkflowId) -> Result<Vec<EventRecord>, Error> {
        load_events(&mut self.connection().await?.db(), workflow_id).await
    }

    /// Claims up to `request.limit` due commands (as [`miniflow_core::Outbox::claim`]).
    ///
    /// A dropped call may have taken leases that nobody holds: they run out after the lease's time
    /// to live and the commands are claimed again, with the same IDs.
    ///
    /// # Errors
    ///
    /// As [`miniflow_core::Outbox::claim`].
    pub async fn claim(&self, request: ClaimRequest) -> Result<Vec<Delivery>, Error> {
        self.claim_at(&request, self.clock.now()).await
    }

    async fn claim_at(
        &self,
        request: &ClaimRequest,
        now: Timestamp,
    ) -> Result<Vec<Delivery>, Error> {
        request.validate()?;
        let mut connection = self.connection().await?;
        let (claimed, fed_back) =
            ops::claim(&mut connection.db(), &self.shared.options, request, now).await?;
        self.hint(fed_back);
        Ok(claimed)
    }

    /// The acks, then a claim (as [`miniflow_core::Outbox::complete_all_and_claim`]).
    ///
    /// A dropped call's acks are written whole or not at all; its claim may have taken leases that
    /// nobody holds, which run out.
    ///
    /// # Errors
    ///
    /// When the acks cannot be written; the claim's error is in the [`Handover`].
    pub async fn complete_all_and_claim(
        &self,
        acks: Vec<Ack>,
        request: ClaimRequest,
    ) -> Result<Handover, Error> {
        self.complete_all_and_claim_at(acks, &request, self.clock.now())
            .await
    }

    async fn complete_all_and_claim_at(
        &self,
        acks: Vec<Ack>,
        request: &ClaimRequest,
        now: Timestamp,
    ) -> Result<Handover, Error> {
        let completed = if acks.is_empty() {
            Vec::new()
        } else {
            self.complete_all_at(acks, now).await?
        };
        Ok(Handover {
            completed,
            claimed: self.claim_at(request, now).await,
        })
    }

    /// All `acks` in one transaction (as [`miniflow_core::Outbox::complete_all`]).
    ///
    /// A dropped call is written whole or not at all, possibly just after the drop. Acking again
    /// answers [`Error::StaleLease`] for each ack that got through.
    ///
    /// # Errors
    ///
    /// As [`miniflow_core::Outbox::complete_all`].
    pub async fn complete_all(&self, acks: Vec<Ack>) -> Result<Vec<Result<(), Error>>, Error> {
        self.complete_all_at(acks, self.clock.now()).await
    }

    async fn complete_all_at(
        &self,
        acks: Vec<Ack>,
        now: Timestamp,
    ) -> Result<Vec<Result<(), Error>>, Error> {
        let mut connection = self.connection().await?;
        let (results, work) =
            ops::complete_all(&mut connection.db(), &self.shared.options, &acks, now).await?;
        self.hint(work);
        Ok(results)
    }

    /// Completes a delivery (as [`miniflow_core::Outbox::complete`]).
    ///
    /// A dropped call is written whole or not at all, possibly just after the drop. The ack and its
    /// feedback commit together; acking again answers [`Error::StaleLease`] once the first got
    /// through.
    ///
    /// # Errors
    ///
    /// As [`miniflow_core::Outbox::complete`].
    pub async fn complete(
        &self,
        command_id: &CommandId,
        token: u64,
        result: Option<Value>,
    ) -> Result<(), Error> {
        let now = self.clock.now();
        let mut connection = self.connection().await?;
        let work = ops::complete(
            &mut connection.db(),
            &self.shared.options,
            command_id,
            token,
            result.as_ref(),
            now,
        )
        .await?;
        self.hint(work);
        Ok(())
    }

    /// Records a failed delivery (as [`miniflow_core::Outbox::fail`]).
    ///
    /// A dropped call is written whole or not at all, possibly just after the drop. The failure is
    /// counted once; failing again answers [`Error::StaleLease`] once the first got through.
    ///
    /// # Errors
    ///
    /// As [`miniflow_core::Outbox::fail`].
    pub async fn fail(
        &self,
        command_id: &CommandId,
        token: u64,
        failure: Failure,
        policy: RetryPolicy,
    ) -> Result<Settled, Error> {
        let (settled, clock) = self
            .update(command_id, self.clock.now(), move |row, now| {
                row.fail(token, &failure, &policy, now)
            })
            .await?;
        Ok(settled_outward(settled, &clock))
    }

    /// Extends a lease (as [`miniflow_core::Outbox::extend`]).
    ///
    /// A dropped call leaves the lease as it was or extended.
    ///
    /// # Errors
    ///
    /// As [`miniflow_core::Outbox::extend`].
    pub async fn extend(
        &self,
        command_id: &CommandId,
        token: u64,
        ttl: Duration,
    ) -> Result<Extended, Error> {
        let (extended, clock) = self
            .update(command_id, self.clock.now(), move |row, now| {
                row.extend(token, ttl, now)
            })
            .await?;
        Ok(Extended {
            expires_at: clock.outward(extended.expires_at),
            ..extended
        })
    }

    /// Extends many leases in one transaction of two statements (as
    /// [`miniflow_core::Outbox::extend_all`]): a worker's heartbeat.
    ///
    /// A dropped call leaves every lease as it was or every one extended.
    ///
    /// # Errors
    ///
    /// As [`miniflow_core::Outbox::extend_all`].
    pub async fn extend_all(
        &self,
        leases: &[(CommandId, u64)],
        ttl: Duration,
    ) -> Result<Vec<Result<Extended, Error>>, Error> {
        self.extend_all_at(leases, ttl, self.clock.now()).await
    }

    async fn extend_all_at(
        &self,
        leases: &[(CommandId, u64)],
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Vec<Result<Extended, Error>>, Error> {
        let mut connection = self.connection().await?;
        ops::extend_all(&mut connection.db(), &self.shared.options, leases, ttl, now).await
    }

    /// The listener that wakes the store's dispatchers: one per store, started at first use on
    /// the current tokio runtime, on a connection of its own.
    pub fn wakeups(&self) -> Wakeups {
        self.shared
            .wakeups
            .get_or_init(|| {
                let (wakeups, state) = Wakeups::unstarted();
                (self.shared.listen)(state);
                wakeups
            })
            .clone()
    }

    /// Gives a lease back (as [`miniflow_core::Outbox::release`]).
    ///
    /// A dropped call leaves the lease held or released; a lease held by nobody runs out.
    ///
    /// # Errors
    ///
    /// As [`miniflow_core::Outbox::release`].
    pub async fn release(&self, command_id: &CommandId, token: u64) -> Result<(), Error> {
        self.update(command_id, self.clock.now(), move |row, now| {
            row.release(token, now)
        })
        .await
        .map(|_| ())
    }

    async fn update<T: Send>(
        &self,
        command_id: &CommandId,
        now: Timestamp,
        change: impl FnOnce(&mut OutboxRow, Timestamp) -> Result<T, Error> + Send,
    ) -> Result<(T, crate::clock::Clock), Error> {
        let mut connection = self.connection().await?;
        let (value, clock, work) = ops::update(
            &mut connection.db(),
            &self.shared.options,
            command_id,
            now,
            change,
        )
        .await?;
        self.hint(work);
        Ok((value, clock))
    }

    /// Claims up to `limit` due timers (as [`miniflow_core::Timers::claim_timers`]).
    ///
    /// A dropped call may have taken timers that nobody fires: their leases run out and they are
    /// taken again.
    ///
    /// # Errors
    ///
    /// As [`miniflow_core::Timers::claim_timers`].
    pub async fn claim_timers(
        &self,
        limit: usize,
        lease_ttl: Duration,
    ) -> Result<Vec<TimerRow>, Error> {
        self.claim_timers_at(limit, lease_ttl, self.clock.now())
            .await
    }

    async fn claim_timers_at(
        &self,
        limit: usize,
        lease_ttl: Duration,
        now: Timestamp,
    ) -> Result<Vec<TimerRow>, Error> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let mut connection = self.connection().await?;
        ops::claim_timers(
            &mut connection.db(),
            &self.shared.options,
            limit,
            lease_ttl,
            now,
        )
        .await
    }

    /// Whether a timer (or feedback) is due now (as [`miniflow_core::Timers::any_timer_due`]).
    ///
    /// # Errors
    ///
    /// [`Error::Storage`] when the database cannot be read.
    pub async fn any_timer_due(&self) -> Result<bool, Error> {
        self.any_timer_due_at(self.clock.now()).await
    }

    async fn any_timer_due_at(&self, now: Timestamp) -> Result<bool, Error> {
        let mut connection = self.connection().await?;
        Ok(
            ops::due(&mut connection.db(), &self.shared.options, TIMERS_DUE, now)
                .await?
                .1,
        )
    }

    /// Rejects a scheduled timer (as [`miniflow_core::Timers::reject_timer`]).
    ///
    /// A dropped call is written whole or not at all, possibly just after the drop.
    ///
    /// # Errors
    ///
    /// As [`miniflow_core::Timers::reject_timer`].
    pub async fn reject_timer(&self, timer_id: &TimerId, reason: &str) -> Result<(), Error> {
        self.reject_timer_at(timer_id, reason, self.clock.now())
            .await
    }

    async fn reject_timer_at(
        &self,
        timer_id: &TimerId,
        reason: &str,
        now: Timestamp,
    ) -> Result<(), Error> {
        let mut connection = self.connection().await?;
        ops::reject_timer(
            &mut connection.db(),
            &self.shared.options,
            timer_id,
            reason,
            now,
        )
        .await
    }

    /// The outbox's stats (as [`miniflow_core::Operations::stats`]).
    ///
    /// # Errors
    ///
    /// [`Error::Storage`] when the database cannot be read.
    pub async fn stats(&self) -> Result<OutboxStats, Error> {
        let now = self.clock.now();
        let mut connection = self.connection().await?;
        ops::stats(&mut connection.db(), &self.shared.options, now).await
    }

    /// A command's row (as [`miniflow_core::Outbox::command`]).
    ///
    /// # Errors
    ///
    /// [`Error::Storage`] when the database cannot be read.
    pub async fn command(&self, command_id: &CommandId) -> Result<Option<OutboxRow>, Error> {
        let (w, s, i) = id_params(command_id);
        let mut connection = self.connection().await?;
        Ok(query_rows(&mut connection.db(), SELECT_ONE, &[&w, &s, &i])
            .await?
            .pop())
    }

    /// A workflow's commands (as [`miniflow_core::Outbox::commands`]).
    ///
    /// # Errors
    ///
    /// [`Error::Storage`] when the database cannot be read.
    pub async fn commands(&self, workflow_id: &WorkflowId) -> Result<Vec<OutboxRow>, Error> {
        let mut connection = self.connection().await?;
        query_rows(
            &mut connection.db(),
            SELECT_WORKFLOW,
            &[&workflow_id.as_str()],
        )
        .await
    }

    /// A workflow's timers (as [`miniflow_core::Timers::timers`]).
    ///
    /// # Errors
    ///
    /// [`Error::Storage`] when the database cannot be read.
    pub async fn timers(&self, workflow_id: &WorkflowId) -> Result<Vec<TimerRow>, Error> {
        let mut connection = self.connection().await?;
        query_timers(
            &mut connection.db(),
            SELECT_WORKFLOW_TIMERS,
            &[&workflow_id.as_str()],
        )
        .await
    }

    /// Up to `limit` pending commands (as [`miniflow_core::Outbox::pending`]).
    ///
    /// # Errors
    ///
    /// [`Error::Storage`] when the database cannot be read.
    pub async fn pending(&self, limit: usize) -> Result<Vec<OutboxRow>, Error> {
        let mut connection = self.connection().await?;
        ops::read_readable(&mut connection.db(), SELECT_PENDING, limit).await
    }

    /// Up to `limit` dead letters (as [`miniflow_core::Operations::dead_letters`]).
    ///
    /// # Errors
    ///
    /// [`Error::Storage`] when the database cannot be read.
    pub async fn dead_letters(&self, limit: usize) -> Result<Vec<OutboxRow>, Error> {
        let mut connection = self.connection().await?;
        ops::read_readable(&mut connection.db(), SELECT_DEAD, limit).await
    }

    /// The events of `workflow_id` after `after`, in seq order (as
    /// [`miniflow_core::EventLog::load_after`]).
    ///
    /// # Errors
    ///
    /// As [`AsyncPostgresStore::load`].
    pub async fn load_after(
        &self,
        workflow_id: &WorkflowId,
        after: Seq,
    ) -> Result<Vec<EventRecord>, Error> {
        load_events_after(&mut self.connection().await?.db(), workflow_id, after).await
    }

    /// Marks a command done without a delivery (as [`miniflow_core::Outbox::mark_done`]).
    ///
    /// A dropped call is written whole or not at all, possibly just after the drop.
    ///
    /// # Errors
    ///
    /// As [`miniflow_core::Outbox::mark_done`].
    pub async fn mark_done(&self, command_id: &CommandId) -> Result<(), Error> {
        self.update(command_id, self.clock.now(), |row, now| row.mark_done(now))
            .await
            .map(|_| ())
    }

    /// Sends a dead letter back to pending (as [`miniflow_core::Operations::retry`]).
    ///
    /// A dropped call is written whole or not at all, possibly just after the drop.
    ///
    /// # Errors
    ///
    /// As [`miniflow_core::Operations::retry`].
    pub async fn retry(&self, command_id: &CommandId) -> Result<(), Error> {
        self.update(command_id, self.clock.now(), |row, now| row.retry(now))
            .await
            .map(|_| ())
    }

    /// Settles a dead letter by hand with `note` (as [`miniflow_core::Operations::resolve`]).
    ///
    /// A dropped call is written whole or not at all, possibly just after the drop.
    ///
    /// # Errors
    ///
    /// As [`miniflow_core::Operations::resolve`].
    pub async fn resolve(&self, command_id: &CommandId, note: &str) -> Result<(), Error> {
        self.update(command_id, self.clock.now(), |row, now| {
            row.resolve(note, now)
        })
        .await
        .map(|_| ())
    }

    /// Deletes up to `batch` done commands processed at least `older_than` ago (as
    /// [`miniflow_core::Operations::purge_done`]); returns how many.
    ///
    /// A dropped call is written whole or not at all, possibly just after the drop.
    ///
    /// # Errors
    ///
    /// As [`miniflow_core::Operations::purge_done`].
    pub async fn purge_done(&self, older_than: Duration, batch: usize) -> Result<usize, Error> {
        let now = self.clock.now();
        let mut connection = self.connection().await?;
        ops::purge_done(
            &mut connection.db(),
            &self.shared.options,
            older_than,
            now,
            batch,
        )
        .await
    }

    /// The kinds paused or limited (as [`miniflow_core::Operations::kind_controls`]).
    ///
    /// # Errors
    ///
    /// [`Error::Storage`] when the database cannot be read.
    pub async fn kind_controls(&self) -> Result<Vec<KindControl>, Error> {
        let mut connection = self.connection().await?;
        crate::controls::read_controls(
            &mut connection.db(),
            crate::controls::SELECT_CONTROLS,
            crate::clock::Clock::caller(Timestamp::EPOCH),
        )
        .await
    }

    /// Pauses, resumes or limits `kind`, recorded as done `by` (as
    /// [`miniflow_core::Operations::control_kind`]).
    ///
    /// A dropped call is written whole or not at all, possibly just after the drop.
    ///
    /// # Errors
    ///
    /// As [`miniflow_core::Operations::control_kind`].
    pub async fn control_kind(
        &self,
        kind: &str,
        change: KindChange,
        by: &str,
    ) -> Result<KindControl, Error> {
        let now = self.clock.now();
        let mut connection = self.connection().await?;
        let control = ops::control_kind(
            &mut connection.db(),
            &self.shared.options,
            kind,
            change,
            by,
            now,
        )
        .await?;
        self.hint(true);
        Ok(control)
    }

    /// Up to `limit` dead letters of `kind` (as
    /// [`miniflow_core::Operations::dead_letters_of_kind`]).
    ///
    /// # Errors
    ///
    /// As [`miniflow_core::Operations::dead_letters_of_kind`].
    pub async fn dead_letters_of_kind(
        &self,
        kind: &str,
        limit: usize,
    ) -> Result<Vec<OutboxRow>, Error> {
        miniflow_core::check_kind("kind", kind)?;
        let mut connection = self.connection().await?;
        crate::controls::dead_of_kind(&mut connection.db(), kind, limit, false).await
    }

    /// Sends up to `batch` dead letters of `kind` back to pending in one transaction (as
    /// [`miniflow_core::Operations::retry_dead_of_kind`]); returns their IDs.
    ///
    /// A dropped call is written whole or not at all, possibly just after the drop.
    ///
    /// # Errors
    ///
    /// As [`miniflow_core::Operations::retry_dead_of_kind`].
    pub async fn retry_dead_of_kind(
        &self,
        kind: &str,
        batch: usize,
    ) -> Result<Vec<CommandId>, Error> {
        self.change_dead_of_kind(kind, batch, |row, now| row.retry(now))
            .await
    }

    /// Settles up to `batch` dead letters of `kind` with `note` in one transaction (as
    /// [`miniflow_core::Operations::resolve_dead_of_kind`]); returns their IDs.
    ///
    /// A dropped call is written whole or not at all, possibly just after the drop.
    ///
    /// # Errors
    ///
    /// As [`miniflow_core::Operations::resolve_dead_of_kind`].
    pub async fn resolve_dead_of_kind(
        &self,
        kind: &str,
        note: &str,
        batch: usize,
    ) -> Result<Vec<CommandId>, Error> {
        self.change_dead_of_kind(kind, batch, |row, now| row.resolve(note, now))
            .await
    }

    async fn change_dead_of_kind(
        &self,
        kind: &str,
        batch: usize,
        change: impl Fn(&mut OutboxRow, Timestamp) -> Result<(), Error> + Send,
    ) -> Result<Vec<CommandId>, Error> {
        let now = self.clock.now();
        let mut connection = self.connection().await?;
        let ids = ops::change_dead_of_kind(
            &mut connection.db(),
            &self.shared.options,
            kind,
            batch,
            now,
            change,
        )
        .await?;
        self.hint(!ids.is_empty());
        Ok(ids)
    }

    pub(crate) fn history(&self) -> HistoryId {
        self.shared.history
    }
}

/// The store as the engine's loop reads and commits on it.
struct Log<'a>(&'a AsyncPostgresStore);

impl AsyncEventLog for Log<'_> {
    fn history_id(&self) -> Option<HistoryId> {
        Some(self.0.history())
    }

    async fn load_after(
        &mut self,
        workflow_id: &WorkflowId,
        after: Seq,
    ) -> Result<Vec<EventRecord>, Error> {
        let mut connection = self.0.connection().await?;
        load_events_after(&mut connection.db(), workflow_id, after).await
    }

    async fn append_with_commands(&mut self, commit: &Commit) -> Result<(), Error> {
        self.0.append(commit).await
    }

    /// As the synchronous store's: on the caller's clock the last event is checked in the commit's
    /// own statement.
    async fn append_after(
        &mut self,
        last: &EventRecord,
        commit: &Commit,
    ) -> Result<AppendedAfter, Error> {
        if self.0.shared.options.uses_database_clock() {
            return Ok(AppendedAfter::Unchecked);
        }
        commit.check_follows(last)?;
        let last = LastEvent::of(last)?;
        sending_async(commit, self.0.append_checked(commit, Some(&last))).await?;
        Ok(AppendedAfter::Written)
    }

    async fn before_retry(&mut self, conflicts: u32) {
        let wait = miniflow_core::backend::conflict_backoff(conflicts, ops::jitter());
        tokio::time::sleep(wait).await;
    }

    async fn reject_timer(
        &mut self,
        timer_id: &TimerId,
        reason: &str,
        now: Timestamp,
    ) -> Result<(), Error> {
        self.0.reject_timer_at(timer_id, reason, now).await
    }
}

/// Sends the wake-up hint (`NOTIFY`) after the commits that made work, on a connection of the pool,
/// at most one per [`COALESCE`], and after the callers' transactions it watches commit (see
/// [`Watch`]); ends when the store's last clone goes.
async fn send_hints(
    connections: Arc<dyn Connections>,
    mut hints: mpsc::UnboundedReceiver<Option<i64>>,
) {
    let mut watch = Watch::default();
    loop {
        let first = if watch.xids().is_some() {
            match tokio::time::timeout(watch.pause(), hints.recv()).await {
                Ok(None) => return,
                Ok(Some(hint)) => Some(hint),
                Err(_) => None,
            }
        } else {
            match hints.recv().await {
                Some(hint) => Some(hint),
                None => return,
            }
        };
        tokio::time::sleep(COALESCE).await;
        // Hints raised meanwhile go out with this one.
        let mut now = false;
        for hint in first
            .into_iter()
            .chain(std::iter::from_fn(|| hints.try_recv().ok()))
        {
            match hint {
                None => now = true,
                Some(xid) => watch.add(xid),
            }
        }
        let Ok(mut connection) = connections.get().await else {
            continue;
        };
        let db = &mut connection.db();
        if let Some(xids) = watch.xids() {
            let xids = xids.to_vec();
            if let Ok(rows) = db.query(XACT_STATUS, &[&xids]).await {
                let answers: Vec<(i64, Option<String>)> = rows
                    .iter()
                    .filter_map(|row| Some((row.try_get(0).ok()?, row.try_get(1).ok()?)))
                    .collect();
                now |= watch.settle(&answers);
            }
        }
        if now {
            let _ = db.execute(SEND_HINT, &[&NOTIFY_CHANNEL]).await;
        }
    }
}

/// The async dispatcher's steps on the store: each one of its operations, awaited.
impl miniflow_pool::tokio::AsyncSource for AsyncPostgresStore {
    async fn complete_all_and_claim(
        &self,
        acks: Vec<Ack>,
        request: &ClaimRequest,
        now: Timestamp,
    ) -> Result<Handover, Error> {
        self.complete_all_and_claim_at(acks, request, now).await
    }

    async fn complete_all(
        &self,
        acks: Vec<Ack>,
        now: Timestamp,
    ) -> Result<Vec<Result<(), Error>>, Error> {
        self.complete_all_at(acks, now).await
    }

    async fn fail(
        &self,
        command_id: &CommandId,
        token: u64,
        failure: &Failure,
        policy: &RetryPolicy,
        now: Timestamp,
    ) -> Result<Settled, Error> {
        let (settled, clock) = self
            .update(command_id, now, |row, now| {
                row.fail(token, failure, policy, now)
            })
            .await?;
        Ok(settled_outward(settled, &clock))
    }

    async fn extend_all(
        &self,
        leases: &[(CommandId, u64)],
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Vec<Result<Extended, Error>>, Error> {
        self.extend_all_at(leases, ttl, now).await
    }

    async fn release(
        &self,
        command_id: &CommandId,
        token: u64,
        now: Timestamp,
    ) -> Result<(), Error> {
        self.update(command_id, now, |row, now| row.release(token, now))
            .await
            .map(|_| ())
    }

    async fn claim_timers(
        &self,
        limit: usize,
        lease_ttl: Duration,
        now: Timestamp,
    ) -> Result<Vec<TimerRow>, Error> {
        self.claim_timers_at(limit, lease_ttl, now).await
    }

    async fn fire<W>(
        &self,
        engine: &Arc<Engine<W>>,
        timer: &TimerRow,
        now: Timestamp,
    ) -> Result<Option<Handled>, Error>
    where
        W: Workflow + Send + Sync + 'static,
        W::State: Send,
    {
        engine.fire_on(&mut Log(self), timer, now).await
    }

    async fn any_timer_due(&self, now: Timestamp) -> Result<bool, Error> {
        self.any_timer_due_at(now).await
    }

    fn clock(&self) -> Arc<dyn Clock + Send + Sync> {
        self.clock.clone()
    }

    fn wakeup(&self) -> Option<Arc<dyn miniflow_pool::Wakeup>> {
        if !self.shared.options.notifies() {
            return None;
        }
        Some(Arc::new(self.wakeups()))
    }
}
