//! [`AsyncDispatcher`]: deliveries as tasks on the caller's tokio runtime, settled with the
//! synchronous dispatcher's own bookkeeping.
//!
//! One task claims (and acknowledges what finished, in the same write) as many commands as there
//! are free delivery slots, and runs each delivery as a task of its own; a heartbeat task extends
//! the leases of long deliveries. Each store step — a claim with the acks before it, a failure, the
//! heartbeat's extensions, a claim of timers and their firing — is an async method of the
//! [`AsyncSource`], awaited; each answer goes to the [`Books`] the synchronous [`Worker`] keeps
//! too: what an outcome means, how a settlement is counted, traced and reported, which settings
//! are in bounds, how long to back off after a store error and when `run_until_idle` gives up are
//! stated there once.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use ::tokio::sync::Notify;
use ::tokio::task::JoinSet;
use tracing::Instrument;

use super::*;
use crate::telemetry;

/// What an [`AsyncDispatcher`] needs of a store: each step it takes, as an async method; the
/// store's clock; and what wakes it when a commit made work. A store crate implements it for its
/// async handle (`miniflow_native::tokio::AsyncStore` on SQLite), so the dispatcher's code and books
/// are the same whatever store is underneath.
///
/// # For store authors
///
/// Each step is one operation of the synchronous store traits ([`miniflow_core::Outbox`],
/// [`miniflow_core::Timers`]) with the same meaning and the same answers: do what that operation
/// documents, in one atomic write, changing rows by the core's rules ([`miniflow_core::OutboxRow`]'s
/// methods) rather than a copy of them. `now` is the reading of [`AsyncSource::clock`] the
/// dispatcher took for the step; a store that keeps leases by a clock of its own (a database's)
/// uses that one instead, as its synchronous store does, and answers in the caller's clock.
///
/// A step must not block the runtime: await an async driver or a writer thread, or run a
/// synchronous store on `tokio::task::spawn_blocking`. The delivery loop takes one step at a time,
/// and the heartbeat's [`AsyncSource::extend_all`] runs beside it, so steps of one source overlap
/// (and with the application's own calls on its clones): each gets a connection, a writer's
/// turn or a lock of its own.
///
/// A step that fails returns the store's error: the dispatcher counts it, passes it to `on_error`
/// and backs off ([`Stats::store_errors`]). A step that panics is reported the same way, as an
/// [`Error::Storage`] saying so, except [`AsyncSource::fire`], whose panic is the workflow's
/// ([`Stats::timer_panics`]).
///
/// ## A dropped future
///
/// The dispatcher awaits every step it starts; a step's future is dropped unfinished only with
/// the dispatcher (its runtime shut down, a `run_until_idle` future abandoned by its caller). The
/// step must then have written all of its write or nothing of it, and leave the store usable (a
/// connection left inside a transaction is rolled back or discarded, never handed to the next
/// step as it is). Either outcome is safe, because the dispatcher reported nothing of it: what each
/// step may leave behind is said on the step.
///
/// # Example
///
/// A stand-in over the core's in-memory store, each step the synchronous method under a lock (a
/// real store awaits its driver, or runs its synchronous store on a blocking thread):
///
/// ```
/// use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
/// use std::time::Duration;
/// use miniflow_core::prelude::*;
/// use miniflow_core::{
///     Ack, ClaimRequest, Clock, CommandId, Engine, Error, Extended, Failure, Handled, Handover,
///     ManualClock, MemoryStore, RetryPolicy, Settled, TimerRow, Timestamp, Workflow,
/// };
/// use miniflow_pool::tokio::AsyncSource;
/// use miniflow_pool::Wakeup;
///
/// #[derive(Clone)]
/// struct Shared(Arc<Mutex<MemoryStore>>, Arc<ManualClock>);
///
/// impl Shared {
///     fn store(&self) -> MutexGuard<'_, MemoryStore> {
///         self.0.lock().unwrap_or_else(PoisonError::into_inner)
///     }
/// }
///
/// impl AsyncSource for Shared {
///     async fn complete_all_and_claim(
///         &self,
///         acks: Vec<Ack>,
///         request: &ClaimRequest,
///         now: Timestamp,
///     ) -> Result<Handover, Error> {
///         self.store().complete_all_and_claim(acks, request, now)
///     }
///     async fn complete_all(&self, acks: Vec<Ack>, now: Timestamp) -> Result<Vec<Result<(), Error>>, Error> {
///         self.store().complete_all(acks, now)
///     }
///     async fn fail(
///         &self,
///         id: &CommandId,
///         token: u64,
///         failure: &Failure,
///         policy: &RetryPolicy,
///         now: Timestamp,
///     ) -> Result<Settled, Error> {
///         self.store().fail(id, token, failure, policy, now)
///     }
///     async fn extend_all(
///         &self,
///         leases: &[(CommandId, u64)],
///         ttl: Duration,
///         now: Timestamp,
///     ) -> Result<Vec<Result<Extended, Error>>, Error> {
///         self.store().extend_all(leases, ttl, now)
///     }
///     async fn release(&self, id: &CommandId, token: u64, now: Timestamp) -> Result<(), Error> {
///         self.store().release(id, token, now)
///     }
///     async fn claim_timers(&self, limit: usize, ttl: Duration, now: Timestamp) -> Result<Vec<TimerRow>, Error> {
///         self.store().claim_timers(limit, ttl, now)
///     }
///     async fn fire<W>(&self, engine: &Arc<Engine<W>>, timer: &TimerRow, now: Timestamp) -> Result<Option<Handled>, Error>
///     where
///         W: Workflow + Send + Sync + 'static,
///         W::State: Send,
///     {
///         engine.fire(&mut *self.store(), timer, now)
///     }
///     async fn any_timer_due(&self, now: Timestamp) -> Result<bool, Error> {
///         self.store().any_timer_due(now)
///     }
///     fn clock(&self) -> Arc<dyn Clock + Send + Sync> {
///         self.1.clone()
///     }
///     fn wakeup(&self) -> Option<Arc<dyn Wakeup>> {
///         None // idle dispatchers poll
///     }
/// }
/// # let shared = Shared(Arc::default(), Arc::new(ManualClock::default()));
/// # let claimed = tokio::runtime::Builder::new_current_thread().build()?.block_on(
/// #     shared.complete_all_and_claim(Vec::new(), &ClaimRequest::new("w"), Timestamp::EPOCH))?;
/// # assert!(claimed.claimed?.is_empty());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait AsyncSource: Clone + Send + Sync + 'static {
    /// Acknowledges `acks` and claims the next batch by `request`, as
    /// [`miniflow_core::Outbox::complete_all_and_claim`] does: one answer per ack, in order, and
    /// the claimed deliveries or the claim's error (the acks' answers stand either way); in one
    /// durable transaction where the store can; with no acks, only the claim.
    ///
    /// Dropped: the acks and the leases committed or not. Commands claimed by a dropped step are
    /// delivered by nobody until their leases run out, then again with the same command ID; acks
    /// not written are delivered again the same way (their receivers fold the repeat).
    fn complete_all_and_claim(
        &self,
        acks: Vec<Ack>,
        request: &ClaimRequest,
        now: Timestamp,
    ) -> impl Future<Output = Result<Handover, Error>> + Send;

    /// Completes `acks` in one durable write, one answer per ack, in order, as
    /// [`miniflow_core::Outbox::complete_all`] does: the acks of the deliveries that finished as
    /// the dispatcher stops.
    ///
    /// Dropped: as the acks of [`AsyncSource::complete_all_and_claim`].
    fn complete_all(
        &self,
        acks: Vec<Ack>,
        now: Timestamp,
    ) -> impl Future<Output = Result<Vec<Result<(), Error>>, Error>> + Send;

    /// Settles a failed delivery under `token` by `policy`, as [`miniflow_core::Outbox::fail`]
    /// does: pending again after its backoff, dead (with its `command_failed` feedback in the same
    /// transaction) or cancelled; [`Error::StaleLease`] when the lease was taken over.
    ///
    /// Dropped unwritten: the command stays leased until its lease runs out, then is delivered
    /// again, this attempt counted.
    fn fail(
        &self,
        command_id: &CommandId,
        token: u64,
        failure: &Failure,
        policy: &RetryPolicy,
        now: Timestamp,
    ) -> impl Future<Output = Result<Settled, Error>> + Send;

    /// The heartbeat: extends each of `leases` (`(command_id, token)`) to `now + ttl`, never
    /// shortening one, as [`miniflow_core::Outbox::extend_all`] does, in one write where the store
    /// can. One answer per lease, in order: the new expiry and whether the workflow cancelled the
    /// command, or that lease's refusal ([`Error::StaleLease`] for a lost lease); the outer error
    /// only when the write failed as a whole.
    ///
    /// Dropped unwritten: the leases may run out under live deliveries, whose results are then
    /// dropped as a lost lease's, and the commands delivered again.
    fn extend_all(
        &self,
        leases: &[(CommandId, u64)],
        ttl: Duration,
        now: Timestamp,
    ) -> impl Future<Output = Result<Vec<Result<Extended, Error>>, Error>> + Send;

    /// Gives back a claimed command whose delivery was not started, as
    /// [`miniflow_core::Outbox::release`] does: what the dispatcher does with a batch whose claim
    /// ended after it was told to stop.
    ///
    /// Dropped unwritten: the command waits for its lease to run out.
    fn release(
        &self,
        command_id: &CommandId,
        token: u64,
        now: Timestamp,
    ) -> impl Future<Output = Result<(), Error>> + Send;

    /// Takes up to `limit` due timers for `lease_ttl`, as [`miniflow_core::Timers::claim_timers`]
    /// does. The dispatcher calls it only when it fires timers ([`AsyncDispatcher::workflow`]).
    ///
    /// Dropped: timers it took wait until their take runs out, then are taken again.
    fn claim_timers(
        &self,
        limit: usize,
        lease_ttl: Duration,
        now: Timestamp,
    ) -> impl Future<Output = Result<Vec<TimerRow>, Error>> + Send;

    /// Fires `timer` (from [`AsyncSource::claim_timers`]) into its workflow through `engine`, as
    /// [`Engine::fire`] does: replays the workflow, decides, and commits the event with its
    /// commands and timers; `None` when the timer is no longer scheduled. A timer whose event the
    /// workflow rejects is ended `rejected` with the reason, in the store, and answered
    /// [`Error::Rejected`]. The source decides how: [`Engine::fire`] itself on a synchronous
    /// store on a blocking thread, or the engine's commit written by an async driver. A panic of the
    /// workflow's code may come out of the future: the dispatcher counts it in
    /// [`Stats::timer_panics`].
    ///
    /// Dropped: the event is committed once or not at all; an unfired timer is fired once its take
    /// runs out.
    fn fire<W>(
        &self,
        engine: &Arc<Engine<W>>,
        timer: &TimerRow,
        now: Timestamp,
    ) -> impl Future<Output = Result<Option<Handled>, Error>> + Send
    where
        W: Workflow + Send + Sync + 'static,
        W::State: Send;

    /// Whether a timer is due at `now`, as [`miniflow_core::Timers::any_timer_due`] answers: a
    /// read, which a dispatcher that fires no timers takes once to say that they wait. A store that
    /// cannot tell cheaply answers `Ok(false)`.
    fn any_timer_due(&self, now: Timestamp) -> impl Future<Output = Result<bool, Error>> + Send;

    /// The clock the dispatcher takes `now` from.
    fn clock(&self) -> Arc<dyn Clock + Send + Sync>;

    /// What tells the dispatcher that a commit made work, if anything does; without it, an idle
    /// dispatcher polls.
    fn wakeup(&self) -> Option<Arc<dyn Wakeup>>;
}

/// The most deliveries an async dispatcher runs at once.
const MAX_CONCURRENCY: usize = 10_000;
/// How often the thread that watches the writer for new work looks at the stop flag.
const WAKEUP_CHECK: Duration = Duration::from_millis(20);

type BoxedOutcome = Pin<Box<dyn Future<Output = Outcome> + Send>>;
type AsyncHandler = dyn Fn(Delivery) -> BoxedOutcome + Send + Sync;

::tokio::task_local! {
    /// The delivery the current task's handler is running, for [`cancellation_requested`].
    static DELIVERY: (Arc<HeldLeases>, CommandId);
}

/// Whether the workflow of the command this async handler is delivering has cancelled it, for
/// handlers run by an [`AsyncDispatcher`] (it answers inside the handler's own task; `false`
/// anywhere else). [`crate::cancellation_requested`] answers the same in them, and in the
/// synchronous dispatcher's handlers too.
pub fn cancellation_requested() -> bool {
    requested_in_this_task().unwrap_or(false)
}

/// [`cancellation_requested`] inside the task of an async handler; `None` outside one.
pub(crate) fn requested_in_this_task() -> Option<bool> {
    DELIVERY
        .try_with(|(held, id)| held.is_cancel_requested(id))
        .ok()
}

/// Delivers outbox commands to an async handler on the caller's tokio runtime: at most
/// [`AsyncDispatcher::concurrency`] deliveries at a time, each a task of its own, at least once,
/// with the command ID as the idempotency key.
///
/// It works as the synchronous [`Dispatcher`] does, with the same settings, bounds and reports
/// ([`Outcome`], [`Settlement`], [`Stats`], [`Dispatcher::on_error`]'s rules): one claimer takes as
/// many commands as there are free slots, acknowledging the deliveries that finished in the same
/// write; a heartbeat extends the leases of long deliveries (every quarter lease TTL) and notices a
/// lost lease, whose result is then dropped; with [`AsyncDispatcher::workflow`], due timers and
/// failure feedback fire through [`Engine::fire`]. A commit of this process that makes work
/// claimable wakes it at once.
///
/// Over any [`AsyncSource`] — on SQLite, `miniflow_native::tokio::AsyncStore`; here, a stand-in on
/// the core's in-memory store:
///
/// ```
/// use std::time::Duration;
/// use miniflow_core::prelude::*;
/// use miniflow_core::{json, Command, Commit, Decision, Delivery, Event, MemoryStore, Seq, Timestamp, WorkflowId};
/// use miniflow_pool::tokio::AsyncDispatcher;
/// use miniflow_pool::Outcome;
/// # use std::sync::{Arc, Mutex, PoisonError};
/// # use miniflow_core::*;
/// # #[derive(Clone)]
/// # struct Shared(Arc<Mutex<MemoryStore>>);
/// # impl Shared {
/// #     fn store(&self) -> std::sync::MutexGuard<'_, MemoryStore> { self.0.lock().unwrap_or_else(PoisonError::into_inner) }
/// # }
/// # impl miniflow_pool::tokio::AsyncSource for Shared {
/// #     async fn complete_all_and_claim(&self, acks: Vec<Ack>, request: &ClaimRequest, now: Timestamp) -> Result<Handover, Error> { self.store().complete_all_and_claim(acks, request, now) }
/// #     async fn complete_all(&self, acks: Vec<Ack>, now: Timestamp) -> Result<Vec<Result<(), Error>>, Error> { self.store().complete_all(acks, now) }
/// #     async fn fail(&self, id: &CommandId, token: u64, failure: &Failure, policy: &RetryPolicy, now: Timestamp) -> Result<Settled, Error> { self.store().fail(id, token, failure, policy, now) }
/// #     async fn extend_all(&self, leases: &[(CommandId, u64)], ttl: Duration, now: Timestamp) -> Result<Vec<Result<Extended, Error>>, Error> { self.store().extend_all(leases, ttl, now) }
/// #     async fn release(&self, id: &CommandId, token: u64, now: Timestamp) -> Result<(), Error> { self.store().release(id, token, now) }
/// #     async fn claim_timers(&self, limit: usize, ttl: Duration, now: Timestamp) -> Result<Vec<TimerRow>, Error> { self.store().claim_timers(limit, ttl, now) }
/// #     async fn fire<W: Workflow + Send + Sync + 'static>(&self, engine: &Arc<Engine<W>>, timer: &TimerRow, now: Timestamp) -> Result<Option<Handled>, Error> where W::State: Send { engine.fire(&mut *self.store(), timer, now) }
/// #     async fn any_timer_due(&self, now: Timestamp) -> Result<bool, Error> { self.store().any_timer_due(now) }
/// #     fn clock(&self) -> Arc<dyn Clock + Send + Sync> { Arc::new(ManualClock::default()) }
/// #     fn wakeup(&self) -> Option<Arc<dyn miniflow_pool::Wakeup>> { None }
/// # }
///
/// async fn lock_budget(delivery: Delivery) -> Outcome {
///     // call the budget service with `Idempotency-Key: {delivery.command_id}` …
///     Outcome::done_with(json!({ "locked": delivery.payload["amount"] }))
/// }
///
/// # tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(async {
/// let mut store = MemoryStore::new();
/// let decision = Decision::new().command(Command::new("lock_budget", json!({ "amount": 1200 })));
/// let event = Event::new("trip_requested", json!({}));
/// store.append_with_commands(&Commit::new(WorkflowId::new("trip-001")?, Seq::ZERO, event, decision, Timestamp::EPOCH)?)?;
/// let shared = Shared(Arc::new(Mutex::new(store)));
///
/// let stats = AsyncDispatcher::new(shared.clone(), lock_budget)
///     .concurrency(16)
///     .lease_ttl(Duration::from_secs(30))
///     .run_until_idle()
///     .await?;
/// assert_eq!(stats.completed, 1);
/// assert!(shared.store().pending(10)?.is_empty());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct AsyncDispatcher<S: AsyncSource> {
    store: S,
    handler: Arc<AsyncHandler>,
    firer: Option<Arc<dyn AsyncFirer<S>>>,
    settings: DispatcherSettings,
    concurrency: usize,
}

impl<S: AsyncSource> AsyncDispatcher<S> {
    /// A dispatcher over `store` delivering to `handler` (an `async fn(Delivery) -> Outcome`, or a
    /// closure returning such a future), with the synchronous dispatcher's defaults: batches of at
    /// most 64, 30 s leases, [`RetryPolicy::default`], [`ClaimOrder::DueFirst`], a 50 ms poll when
    /// idle; one delivery at a time until [`AsyncDispatcher::concurrency`] says otherwise. A handler
    /// that panics counts as a retryable failure. Settings out of bounds are refused by
    /// [`AsyncDispatcher::start`] and [`AsyncDispatcher::run_until_idle`], naming the setting.
    pub fn new<F, Fut>(store: S, handler: F) -> Self
    where
        F: Fn(Delivery) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Outcome> + Send + 'static,
    {
        Self {
            store,
            handler: Arc::new(move |delivery| Box::pin(handler(delivery)) as BoxedOutcome),
            firer: None,
            settings: DispatcherSettings::new(),
            concurrency: 1,
        }
    }

    dispatcher_settings!();

    /// Applies `change` to the settings shared with the synchronous dispatcher.
    fn configure(mut self, change: impl FnOnce(DispatcherSettings) -> DispatcherSettings) -> Self {
        self.settings = change(self.settings);
        self
    }

    /// Runs up to `deliveries` handler calls at once: 1 to 10,000.
    #[must_use]
    pub fn concurrency(mut self, deliveries: usize) -> Self {
        self.concurrency = deliveries;
        self
    }

    /// As [`Dispatcher::workflow`]: also fires due timers and failure feedback through `engine`
    /// ([`AsyncSource::fire`]: [`Engine::fire`], as the store runs it).
    #[must_use]
    pub fn workflow<W>(mut self, engine: Arc<Engine<W>>) -> Self
    where
        W: Workflow + Send + Sync + 'static,
        W::State: Send,
    {
        self.firer = Some(Arc::new(EngineFirer(engine)));
        self
    }

    /// Refuses settings out of bounds, naming the setting and its value.
    fn validate(&self) -> Result<(), Error> {
        within("concurrency", self.concurrency, 1..=MAX_CONCURRENCY)?;
        self.settings.validate(self.settings.name.clone())
    }

    /// Delivers until nothing is claimable, in-flight deliveries finished and acknowledged, and no
    /// due timer is left; returns what it did. As [`Dispatcher::run_until_idle`], it stops on the
    /// first store error that waiting does not cure (or the 8th `Busy`/`Conflict` in a row) and
    /// returns it, after the deliveries in flight finished.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] naming the setting out of bounds; the store error it stopped on.
    pub async fn run_until_idle(&self) -> Result<Stats, Error> {
        self.validate()?;
        let control = Arc::new(Control::default());
        let wakeups = watch_for_work(self.store.wakeup(), control.clone());
        let held = Arc::new(HeldLeases::default());
        let heartbeat = self.heartbeat(&held, &control);
        let finished = self.deliveries(held, control.clone(), true).run().await;
        control.stop();
        control.stop_heartbeat();
        let heartbeat_errors = heartbeat.await.unwrap_or(0);
        drop(wakeups);
        let mut stats = finished.tally.stats;
        stats.store_errors += heartbeat_errors;
        finished.tally.fatal.map_or(Ok(stats), Err)
    }

    /// Starts delivering in the background, on the current tokio runtime, until
    /// [`RunningAsyncDispatcher::shutdown`]. It rides out store errors: each is reported to
    /// [`AsyncDispatcher::on_error`] and counted, and it backs off (up to 5 s between tries) until the
    /// store answers again.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] naming the setting out of bounds, or when called outside a tokio
    /// runtime. Nothing is started then.
    pub fn start(self) -> Result<RunningAsyncDispatcher, Error> {
        self.validate()?;
        if ::tokio::runtime::Handle::try_current().is_err() {
            return Err(Error::invalid(
                "runtime",
                "none",
                "AsyncDispatcher::start runs on a tokio runtime: call it from inside one",
            ));
        }
        let control = Arc::new(Control::default());
        let wakeups = watch_for_work(self.store.wakeup(), control.clone());
        let held = Arc::new(HeldLeases::default());
        let heartbeat = self.heartbeat(&held, &control);
        let deliveries = self.deliveries(held, control.clone(), false);
        Ok(RunningAsyncDispatcher {
            control,
            deliveries: Some(::tokio::spawn(deliveries.run())),
            heartbeat: Some(heartbeat),
            _wakeups: wakeups,
        })
    }

    /// The delivery loop, keeping its books with the synchronous worker's [`Books`].
    fn deliveries(
        &self,
        held: Arc<HeldLeases>,
        control: Arc<Control>,
        until_idle: bool,
    ) -> Deliveries<S> {
        let books = Books {
            name: self.settings.name.clone(),
            settings: self.settings.clone(),
            clock: self.store.clock(),
            stop: control.stop.clone(),
            held,
            until_idle,
            fires_timers: self.firer.is_some(),
            notices: Arc::default(),
        };
        Deliveries {
            request: self.settings.claim_request(self.settings.name.clone()),
            timers: self
                .firer
                .clone()
                .map(|firer| (firer, TimerRounds::default())),
            source: self.store.clone(),
            handler: self.handler.clone(),
            books,
            control,
            concurrency: self.concurrency,
            in_flight: JoinSet::new(),
            tally: Tally::default(),
            done: Vec::new(),
            received: tracing::Span::none(),
        }
    }

    /// Every quarter lease TTL, extends the held leases past half their TTL in one
    /// [`AsyncSource::extend_all`] (as the synchronous heartbeat does); resolves with the number of
    /// store errors it met.
    fn heartbeat(
        &self,
        held: &Arc<HeldLeases>,
        control: &Arc<Control>,
    ) -> ::tokio::task::JoinHandle<u64> {
        let (source, held, control) = (self.store.clone(), held.clone(), control.clone());
        let (ttl, on_error) = (self.settings.lease_ttl, self.settings.on_error.clone());
        ::tokio::spawn(async move {
            let mut errors = 0;
            while control.heartbeat_pause(ttl / 4).await {
                let now = source.clock().now();
                let due = held.due_for_extension(now, ttl);
                if due.is_empty() {
                    continue;
                }
                let answers = step("extend_all", source.extend_all(&due, ttl, now)).await;
                for error in held.extended_all(&due, answers) {
                    errors += 1;
                    if let Some(hook) = &on_error {
                        hook(&error);
                    }
                }
            }
            errors
        })
    }
}

/// Fires timers into workflows through an [`AsyncSource`]: an [`Engine`] with its workflow type
/// erased.
trait AsyncFirer<S>: Send + Sync {
    fn fire<'a>(
        &'a self,
        source: &'a S,
        timer: &'a TimerRow,
        now: Timestamp,
    ) -> Pin<Box<dyn Future<Output = Result<Option<Handled>, Error>> + Send + 'a>>;
}

/// An engine that fires timers, with its workflow type erased.
struct EngineFirer<W: Workflow>(Arc<Engine<W>>);

impl<S: AsyncSource, W> AsyncFirer<S> for EngineFirer<W>
where
    W: Workflow + Send + Sync + 'static,
    W::State: Send,
{
    fn fire<'a>(
        &'a self,
        source: &'a S,
        timer: &'a TimerRow,
        now: Timestamp,
    ) -> Pin<Box<dyn Future<Output = Result<Option<Handled>, Error>> + Send + 'a>> {
        Box::pin(source.fire(&self.0, timer, now))
    }
}

/// Awaits a store step of the source, `what`, turning a panic inside it into the store error
/// that reports it.
async fn step<T>(what: &str, work: impl Future<Output = Result<T, Error>>) -> Result<T, Error> {
    match CatchUnwind(std::pin::pin!(work)).await {
        Ok(answer) => answer,
        Err(panic) => Err(Error::Storage(
            format!("the store's {what} panicked: {}", panic_message(&*panic)).into(),
        )),
    }
}

/// How the tasks of one dispatcher are told to stop, and woken.
#[derive(Default)]
struct Control {
    stop: Arc<AtomicBool>,
    /// New work was committed in this process, or the dispatcher is stopping.
    work: Notify,
    /// The dispatcher is stopping.
    stopping: Notify,
    /// Until when in-flight deliveries may finish once stopping (none: as long as they take).
    deadline: Mutex<Option<::tokio::time::Instant>>,
    /// The heartbeat is to stop: set once the deliveries in flight finished or were cut off, so
    /// their leases are kept while they finish.
    heartbeat_off: AtomicBool,
    heartbeat_stopping: Notify,
}

impl Control {
    fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.work.notify_one();
        self.stopping.notify_waiters();
    }

    fn stop_heartbeat(&self) {
        self.heartbeat_off.store(true, Ordering::SeqCst);
        self.heartbeat_stopping.notify_waiters();
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// Waits `pause` unless stopping; says whether to go on.
    async fn pause(&self, pause: Duration) -> bool {
        pause_unless(&self.stop, &self.stopping, pause).await
    }

    /// Waits `pause` unless the heartbeat is to stop; says whether to go on.
    async fn heartbeat_pause(&self, pause: Duration) -> bool {
        pause_unless(&self.heartbeat_off, &self.heartbeat_stopping, pause).await
    }

    fn deadline(&self) -> Option<::tokio::time::Instant> {
        *self.deadline.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Waits `pause` unless `flag` is set (`notify` tells when it is); says whether to go on.
async fn pause_unless(flag: &AtomicBool, notify: &Notify, pause: Duration) -> bool {
    let stopping = notify.notified();
    ::tokio::pin!(stopping);
    stopping.as_mut().enable();
    if flag.load(Ordering::SeqCst) {
        return false;
    }
    ::tokio::select! {
        () = stopping => false,
        () = ::tokio::time::sleep(pause) => !flag.load(Ordering::SeqCst),
    }
}

/// A thread that waits on the writer for commits that made work claimable and wakes the claimer;
/// it ends when the dispatcher stops (its handle is only kept so it is not mistaken for a leak).
fn watch_for_work(
    wakeup: Option<Arc<dyn Wakeup>>,
    control: Arc<Control>,
) -> Option<JoinHandle<()>> {
    let wakeup = wakeup?;
    std::thread::Builder::new()
        .name("miniflow-async-wakeups".to_owned())
        .spawn(move || {
            let mut mark = wakeup.mark();
            while !control.stopped() {
                wakeup.wait(mark, WAKEUP_CHECK, &control.stop);
                let now = wakeup.mark();
                if now != mark {
                    mark = now;
                    control.work.notify_one();
                }
            }
        })
        .ok()
}

/// When the loop last fired timers, and whether that round found any.
#[derive(Default)]
struct TimerRounds {
    /// The writer's work mark at the last round, and when it ran.
    mark: u64,
    last: Option<Instant>,
    fired: usize,
}

/// What the delivery loop did.
struct Finished {
    tally: Tally,
    /// Deliveries still running when the shutdown deadline came.
    unfinished: usize,
}

/// A delivery whose handler returned (or panicked), with its `process` span and when it started.
type Joined = (
    Delivery,
    tracing::Span,
    Instant,
    std::thread::Result<Outcome>,
);

struct Deliveries<S: AsyncSource> {
    source: S,
    handler: Arc<AsyncHandler>,
    books: Books,
    control: Arc<Control>,
    request: ClaimRequest,
    /// What fires timers and when it last did (none without a workflow).
    timers: Option<(Arc<dyn AsyncFirer<S>>, TimerRounds)>,
    concurrency: usize,
    in_flight: JoinSet<Joined>,
    tally: Tally,
    done: Vec<Done>,
    /// The span of the last claimed batch, the parent of its deliveries and their acks.
    received: tracing::Span,
}

impl<S: AsyncSource> Deliveries<S> {
    async fn run(mut self) -> Finished {
        while !self.books.halted(&self.tally) {
            let fired = self.fire_timers().await;
            if self.books.halted(&self.tally) {
                break;
            }
            while let Some(joined) = self.in_flight.try_join_next() {
                self.finished(joined).await;
            }
            let room = self.concurrency - self.in_flight.len();
            if room > 0 {
                let acked = !self.done.is_empty();
                let Some(batch) = self.settle_and_claim(room).await else {
                    self.back_off().await;
                    continue;
                };
                let claimed = !batch.is_empty();
                self.start_all(batch).await;
                // Acks and firings may have made work (feedback timers, new commands): look again.
                if claimed || fired > 0 || acked {
                    continue;
                }
                if self.in_flight.is_empty() {
                    self.notice_unfired_timers().await;
                    if self.books.until_idle {
                        break;
                    }
                    self.idle().await;
                    continue;
                }
            }
            self.wait_for_a_delivery(room > 0).await;
        }
        self.drain().await
    }

    /// Fires due timers when work was committed since the last round, the last round fired
    /// something, or a poll interval passed; returns how many events it committed.
    async fn fire_timers(&mut self) -> usize {
        let Some((firer, rounds)) = &mut self.timers else {
            return 0;
        };
        let mark = self.source.wakeup().map_or(0, |wakeup| wakeup.mark());
        let poll = self.books.settings.poll_interval;
        let due = rounds.fired > 0
            || mark != rounds.mark
            || rounds.last.is_none_or(|t| t.elapsed() >= poll);
        if !due {
            return 0;
        }
        (rounds.mark, rounds.last) = (mark, Some(Instant::now()));
        let firer = firer.clone();
        let books = &self.books;
        let (limit, ttl) = (books.settings.batch_size, books.settings.lease_ttl);
        let now = books.clock.now();
        let taken = step("claim_timers", self.source.claim_timers(limit, ttl, now)).await;
        let mut fired = 0;
        for timer in &books.timers_taken(taken, &mut self.tally) {
            if books.halted(&self.tally) {
                break; // the rest are taken back when their take runs out
            }
            let firing = CatchUnwind(firer.fire(&self.source, timer, books.clock.now())).await;
            if books.timer_fired(timer, firing, &mut self.tally) {
                fired += 1;
            }
        }
        if let Some((_, rounds)) = &mut self.timers {
            rounds.fired = fired;
        }
        fired
    }

    /// Acknowledges what finished and claims up to `room` commands, in one write
    /// ([`AsyncSource::complete_all_and_claim`]); `None` when the store failed.
    async fn settle_and_claim(&mut self, room: usize) -> Option<Vec<Delivery>> {
        let request = self.request.clone().limit(room.min(self.request.limit));
        let settle = settle_span_of(&self.received, &self.done);
        let acks = take_acks(&mut self.done);
        let now = self.books.clock.now();
        let claim = self.source.complete_all_and_claim(acks, &request, now);
        let handover = step("complete_all_and_claim", claim)
            .instrument(settle.clone())
            .await;
        let (done, tally) = (&mut self.done, &mut self.tally);
        self.books.handed_over(&settle, done, handover, tally)
    }

    /// Runs each delivery as a task of its own, in its `process` span, its lease held for the
    /// heartbeat. A batch whose claim ended after the dispatcher was told to stop is given back
    /// undelivered instead, as the synchronous worker gives back the rest of its batch.
    async fn start_all(&mut self, batch: Vec<Delivery>) {
        if batch.is_empty() {
            return;
        }
        self.received = self.books.claimed(&batch, &mut self.tally);
        if self.books.halted(&self.tally) {
            return self.release(batch).await;
        }
        for delivery in batch {
            let process = self
                .received
                .in_scope(|| telemetry::process_span(&delivery));
            let current = (self.books.held.clone(), delivery.command_id.clone());
            let handling = DELIVERY
                .scope(current, (self.handler)(delivery.clone()))
                .instrument(process.clone());
            self.in_flight.spawn(async move {
                let started = Instant::now();
                let outcome = CatchUnwind(Box::pin(handling)).await;
                (delivery, process, started, outcome)
            });
        }
    }

    /// Gives back the undelivered `batch` ([`AsyncSource::release`]).
    async fn release(&mut self, batch: Vec<Delivery>) {
        let settle = self
            .received
            .in_scope(|| telemetry::settle_span("release", batch.iter()));
        for delivery in &batch {
            let (id, token, now) = (&delivery.command_id, delivery.token, self.books.clock.now());
            let result = step("release", self.source.release(id, token, now))
                .instrument(settle.clone())
                .await;
            let _settle = settle.enter();
            self.books.released(delivery, result, &mut self.tally);
        }
    }

    /// Settles a delivery whose handler returned ([`Books::judge`]): an ack waits for the next
    /// claim; a failure is settled now ([`AsyncSource::fail`]).
    async fn finished(&mut self, joined: Result<Joined, ::tokio::task::JoinError>) {
        let Ok((delivery, process, started, outcome)) = joined else {
            return; // aborted at the shutdown deadline: its lease runs out
        };
        telemetry::delivered(
            &process,
            &delivery,
            outcome_name(&outcome),
            started.elapsed(),
        );
        match self
            .books
            .judge(&process, &delivery, outcome, &mut self.tally)
        {
            Some(Verdict::Done(result)) => self.done.push((delivery, result)),
            Some(Verdict::Failed(failure)) => self.fail(&process, &delivery, failure).await,
            None => {}
        }
    }

    /// Settles a failed delivery, in a span inside its `process` span.
    async fn fail(&mut self, process: &tracing::Span, delivery: &Delivery, failure: Failure) {
        let settle = process.in_scope(|| telemetry::settle_span("fail", std::iter::once(delivery)));
        let books = &self.books;
        let (id, token, policy) = (&delivery.command_id, delivery.token, &books.settings.policy);
        let failing = self
            .source
            .fail(id, token, &failure, policy, books.clock.now());
        let result = step("fail", failing).instrument(settle.clone()).await;
        let _settle = settle.enter();
        books.failed(&settle, delivery, failure, result, &mut self.tally);
    }

    /// Once per dispatcher that fires no timers, when it first finds nothing to do: looks whether
    /// timers are due ([`Books::take_look_for_unfired_timers`]).
    async fn notice_unfired_timers(&self) {
        if self.books.take_look_for_unfired_timers() {
            let now = self.books.clock.now();
            let due = step("any_timer_due", self.source.any_timer_due(now)).await;
            self.books.looked_for_unfired_timers(due);
        }
    }

    /// Nothing claimable and nothing in flight: waits for work committed in this process, the poll
    /// interval (for other processes' commits), or the stop.
    async fn idle(&self) {
        let poll = self.books.settings.poll_interval;
        ::tokio::select! {
            () = self.control.work.notified() => {}
            () = ::tokio::time::sleep(poll) => {}
        }
    }

    /// Waits for a delivery to finish, for new work when there is room for it, for the poll
    /// interval, or for the stop.
    async fn wait_for_a_delivery(&mut self, room: bool) {
        let poll = self.books.settings.poll_interval;
        ::tokio::select! {
            joined = self.in_flight.join_next() => {
                if let Some(joined) = joined {
                    self.finished(joined).await;
                }
            }
            () = self.control.work.notified(), if room => {}
            () = ::tokio::time::sleep(poll) => {}
        }
    }

    /// Pauses after a failed store operation, longer with each failure in a row.
    async fn back_off(&self) {
        if let Some(pause) = self.books.error_pause(&self.tally) {
            self.control.pause(pause).await;
        }
    }

    /// Stopping: lets the deliveries in flight finish (until the shutdown deadline, if any; the
    /// rest are cut off and their leases run out), acknowledges them, and returns the books.
    async fn drain(mut self) -> Finished {
        loop {
            while let Some(joined) = self.in_flight.try_join_next() {
                self.finished(joined).await;
            }
            if self.in_flight.is_empty() {
                break;
            }
            let deadline = self.control.deadline();
            let joined = match deadline {
                Some(deadline) => ::tokio::select! {
                    joined = self.in_flight.join_next() => joined,
                    () = ::tokio::time::sleep_until(deadline) => break,
                },
                None => self.in_flight.join_next().await,
            };
            if let Some(joined) = joined {
                self.finished(joined).await;
            }
        }
        let unfinished = self.in_flight.len();
        self.in_flight.abort_all();
        self.flush().await;
        Finished {
            tally: self.tally,
            unfinished,
        }
    }

    /// Completes the acks in waiting in one durable write ([`AsyncSource::complete_all`]), then
    /// reports them.
    async fn flush(&mut self) {
        if self.done.is_empty() {
            return;
        }
        let settle = settle_span_of(&self.received, &self.done);
        let acks = take_acks(&mut self.done);
        let now = self.books.clock.now();
        let results = step("complete_all", self.source.complete_all(acks, now))
            .instrument(settle.clone())
            .await;
        let (done, tally) = (&mut self.done, &mut self.tally);
        self.books.settled(&settle, done, results, tally);
    }
}

/// A future, with a panic inside it caught as the synchronous dispatcher catches a handler's.
struct CatchUnwind<F>(F);

impl<F: Future + Unpin> Future for CatchUnwind<F> {
    type Output = std::thread::Result<F::Output>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let inner = Pin::new(&mut self.0);
        match catch_unwind(AssertUnwindSafe(|| inner.poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(outcome)) => Poll::Ready(Ok(outcome)),
            Err(panic) => Poll::Ready(Err(panic)),
        }
    }
}

/// An [`AsyncDispatcher`] delivering in the background. Dropping it stops it: keep it for as long as
/// it is to deliver.
#[must_use = "dropping a RunningAsyncDispatcher stops it at once: keep it, and call `shutdown`"]
pub struct RunningAsyncDispatcher {
    control: Arc<Control>,
    deliveries: Option<::tokio::task::JoinHandle<Finished>>,
    heartbeat: Option<::tokio::task::JoinHandle<u64>>,
    _wakeups: Option<JoinHandle<()>>,
}

impl RunningAsyncDispatcher {
    /// Stops claiming, lets the deliveries in flight finish until `deadline` (the heartbeat keeps
    /// their leases meanwhile) and acknowledges them, then returns what the dispatcher did. Deliveries still running at the deadline are cut off
    /// (their futures dropped) and counted in [`Shutdown::unfinished_workers`]; their leases run out
    /// and another dispatcher delivers them again, with the same command ID. Nothing is lost.
    pub async fn shutdown(mut self, deadline: Duration) -> Shutdown {
        *self
            .control
            .deadline
            .lock()
            .unwrap_or_else(PoisonError::into_inner) =
            Some(::tokio::time::Instant::now() + deadline);
        self.control.stop();
        let mut shutdown = Shutdown {
            stats: Stats::default(),
            unfinished_workers: 0,
            errors: Vec::new(),
        };
        if let Some(deliveries) = self.deliveries.take() {
            match deliveries.await {
                Ok(finished) => {
                    shutdown.stats = finished.tally.stats;
                    shutdown.unfinished_workers = finished.unfinished;
                    shutdown.errors.extend(finished.tally.fatal);
                }
                Err(e) => shutdown.errors.push(Error::Storage(
                    format!("the delivery task failed: {e}").into(),
                )),
            }
        }
        self.control.stop_heartbeat();
        if let Some(heartbeat) = self.heartbeat.take() {
            shutdown.stats.store_errors += heartbeat.await.unwrap_or(0);
        }
        shutdown
    }
}

impl Drop for RunningAsyncDispatcher {
    fn drop(&mut self) {
        self.control.stop();
        self.control.stop_heartbeat();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::MutexGuard;

    use miniflow_core::prelude::*;
    use miniflow_core::{
        json, Command, Commit, Decision, Event, MemoryStore, Seq, Status, WorkflowId,
    };

    use super::*;

    /// A source over one in-memory store, which can be told to pause after a claim that took
    /// something, or to panic in its claims; it counts the leases of each `extend_all`.
    #[derive(Clone, Default)]
    struct Source {
        store: Arc<Mutex<MemoryStore>>,
        pause_after_claim: Option<Duration>,
        claimed_some: Arc<AtomicBool>,
        claims_panic: bool,
        extend_alls: Arc<Mutex<Vec<usize>>>,
    }

    impl Source {
        /// With `n` commands due.
        fn with_commands(n: usize) -> Self {
            let mut store = MemoryStore::new();
            let commands: Vec<Command> = (0..n).map(|_| Command::new("k", json!({}))).collect();
            let event = Event::new("e", json!({}));
            let id = WorkflowId::new("w").unwrap();
            let commit = Commit::new(
                id,
                Seq::ZERO,
                event,
                Decision::from(commands),
                Timestamp::EPOCH,
            );
            store.append_with_commands(&commit.unwrap()).unwrap();
            Self {
                store: Arc::new(Mutex::new(store)),
                ..Self::default()
            }
        }

        fn store(&self) -> MutexGuard<'_, MemoryStore> {
            self.store.lock().unwrap_or_else(PoisonError::into_inner)
        }
    }

    impl AsyncSource for Source {
        async fn complete_all_and_claim(
            &self,
            acks: Vec<Ack>,
            request: &ClaimRequest,
            now: Timestamp,
        ) -> Result<Handover, Error> {
            assert!(!self.claims_panic, "the claim broke");
            let handover = self.store().complete_all_and_claim(acks, request, now)?;
            if handover
                .claimed
                .as_ref()
                .is_ok_and(|batch| !batch.is_empty())
            {
                self.claimed_some.store(true, Ordering::SeqCst);
                if let Some(pause) = self.pause_after_claim {
                    ::tokio::time::sleep(pause).await;
                }
            }
            Ok(handover)
        }
        async fn complete_all(
            &self,
            acks: Vec<Ack>,
            now: Timestamp,
        ) -> Result<Vec<Result<(), Error>>, Error> {
            self.store().complete_all(acks, now)
        }
        async fn fail(
            &self,
            id: &CommandId,
            token: u64,
            failure: &Failure,
            policy: &RetryPolicy,
            now: Timestamp,
        ) -> Result<Settled, Error> {
            self.store().fail(id, token, failure, policy, now)
        }
        async fn extend_all(
            &self,
            leases: &[(CommandId, u64)],
            ttl: Duration,
            now: Timestamp,
        ) -> Result<Vec<Result<Extended, Error>>, Error> {
            self.extend_alls.lock().unwrap().push(leases.len());
            self.store().extend_all(leases, ttl, now)
        }
        async fn release(&self, id: &CommandId, token: u64, now: Timestamp) -> Result<(), Error> {
            self.store().release(id, token, now)
        }
        async fn claim_timers(
            &self,
            limit: usize,
            ttl: Duration,
            now: Timestamp,
        ) -> Result<Vec<TimerRow>, Error> {
            self.store().claim_timers(limit, ttl, now)
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
            engine.fire(&mut *self.store(), timer, now)
        }
        async fn any_timer_due(&self, now: Timestamp) -> Result<bool, Error> {
            self.store().any_timer_due(now)
        }
        fn clock(&self) -> Arc<dyn Clock + Send + Sync> {
            Arc::new(SystemClock)
        }
        fn wakeup(&self) -> Option<Arc<dyn Wakeup>> {
            None
        }
    }

    fn runtime() -> ::tokio::runtime::Runtime {
        ::tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    }

    /// A batch whose claim ends after the dispatcher was told to stop is given back, undelivered
    /// and its attempts not counted, as the synchronous worker gives back the rest of its batch.
    #[test]
    fn a_batch_claimed_as_the_dispatcher_stops_is_given_back_undelivered() {
        runtime().block_on(async {
            let source = Source {
                pause_after_claim: Some(Duration::from_millis(200)),
                ..Source::with_commands(3)
            };
            let delivered = Arc::new(AtomicU64::new(0));
            let handler = {
                let delivered = delivered.clone();
                move |_: Delivery| {
                    delivered.fetch_add(1, Ordering::SeqCst);
                    async { Outcome::Done }
                }
            };
            let running = AsyncDispatcher::new(source.clone(), handler)
                .concurrency(3)
                .start()
                .unwrap();
            while !source.claimed_some.load(Ordering::SeqCst) {
                ::tokio::time::sleep(Duration::from_millis(1)).await;
            }
            let shutdown = running.shutdown(Duration::from_secs(5)).await;
            assert!(shutdown.errors.is_empty(), "{:?}", shutdown.errors);
            let stats = shutdown.stats;
            assert_eq!(
                (stats.claimed, stats.released, stats.completed),
                (3, 3, 0),
                "{stats:?}"
            );
            assert_eq!(delivered.load(Ordering::SeqCst), 0);
            for row in source.store().pending(10).unwrap() {
                assert_eq!((row.status, row.attempts), (Status::Pending, 0), "{row:?}");
            }
        });
    }

    /// The heartbeat extends all the leases in flight in one `extend_all` a tick.
    #[test]
    fn the_heartbeat_extends_the_leases_in_flight_in_one_call() {
        runtime().block_on(async {
            let source = Source::with_commands(3);
            let stats = AsyncDispatcher::new(source.clone(), |_: Delivery| async {
                ::tokio::time::sleep(Duration::from_millis(500)).await;
                Outcome::Done
            })
            .concurrency(3)
            .lease_ttl(Duration::from_millis(200))
            .run_until_idle()
            .await
            .unwrap();
            assert_eq!((stats.completed, stats.lost_leases), (3, 0), "{stats:?}");
            let calls = source.extend_alls.lock().unwrap().clone();
            assert!(calls.contains(&3), "three leases in one call: {calls:?}");
        });
    }

    /// One value of settings configures either dispatcher: both use its observer and bounds (the
    /// async one its name in the leases), both refuse a setting out of bounds naming it, and a
    /// builder method after `settings` changes that one setting.
    #[test]
    fn one_settings_value_configures_both_dispatchers() {
        let settled = Arc::new(AtomicU64::new(0));
        let count = settled.clone();
        let settings = DispatcherSettings::new()
            .name("shared")
            .on_settled(move |_, _| {
                count.fetch_add(1, Ordering::SeqCst);
            });
        let owners = |source: &Source| -> Vec<String> {
            let rows = source
                .store()
                .commands(&WorkflowId::new("w").unwrap())
                .unwrap();
            rows.iter()
                .map(|row| {
                    row.lease
                        .as_ref()
                        .map_or("none".into(), |l| l.owner.clone())
                })
                .collect()
        };

        let sync = Source::with_commands(2);
        let store = sync.store.clone();
        let stats = Dispatcher::new(
            move || Ok(store.lock().unwrap().clone()),
            |_: &Delivery| Outcome::Done,
        )
        .settings(settings.clone())
        .run_until_idle()
        .unwrap();
        assert_eq!(stats.completed, 2);
        let refused = Dispatcher::new(|| Ok(MemoryStore::new()), |_: &Delivery| Outcome::Done)
            .settings(settings.clone().lease_ttl(Duration::from_millis(1)))
            .run_until_idle();
        assert!(matches!(
            refused,
            Err(Error::InvalidInput {
                field: "lease_ttl",
                ..
            })
        ));

        runtime().block_on(async {
            let source = Source::with_commands(2);
            let dispatcher = || {
                AsyncDispatcher::new(source.clone(), |_: Delivery| async { Outcome::Done })
                    .settings(settings.clone().batch_size(0))
            };
            let refused = dispatcher().run_until_idle().await;
            assert!(matches!(
                refused,
                Err(Error::InvalidInput {
                    field: "batch_size",
                    ..
                })
            ));
            let stats = dispatcher().batch_size(1).run_until_idle().await.unwrap();
            assert_eq!(stats.completed, 2);
            assert_eq!(owners(&source), ["shared", "shared"]);
        });
        assert_eq!(
            settled.load(Ordering::SeqCst),
            4,
            "one observer for both dispatchers"
        );
    }

    /// A store step that panics is a store error, counted, reported and returned by
    /// `run_until_idle`, naming the step.
    #[test]
    fn a_store_step_that_panics_is_reported_as_a_store_error() {
        runtime().block_on(async {
            let source = Source {
                claims_panic: true,
                ..Source::with_commands(1)
            };
            let reported = Arc::new(Mutex::new(Vec::new()));
            let log = reported.clone();
            let error = AsyncDispatcher::new(source, |_: Delivery| async { Outcome::Done })
                .on_error(move |e| log.lock().unwrap().push(e.to_string()))
                .run_until_idle()
                .await
                .unwrap_err();
            let error = error.to_string();
            assert!(
                error.contains("complete_all_and_claim panicked")
                    && error.contains("the claim broke"),
                "{error}"
            );
            assert_eq!(*reported.lock().unwrap(), [error]);
        });
    }
}
