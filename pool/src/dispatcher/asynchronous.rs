//! [`AsyncDispatcher`]: deliveries as tasks on the caller's tokio runtime, settled with the
//! synchronous dispatcher's own bookkeeping.
//!
//! One task claims (and acknowledges what finished, in the same write) as many commands as there
//! are free delivery slots, and runs each delivery as a task of its own; a heartbeat task extends
//! the leases of long deliveries. The store work itself — claims with their acks, failures, due
//! timers fired through [`Engine::fire`] — is the synchronous [`Worker`]'s own methods on a
//! [`SqliteStore`] of the dispatcher's, run on a blocking thread: what an outcome means, how a
//! settlement is counted, traced and reported, which settings are in bounds, how long to back off
//! after a store error and when `run_until_idle` gives up are stated there once.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use ::tokio::sync::Notify;
use ::tokio::task::JoinSet;
use tracing::Instrument;

use miniflow_core::prelude::Outbox;

use super::*;
use crate::telemetry;

/// What an [`AsyncDispatcher`] needs of a store: synchronous stores to run its steps on (a claim
/// with the acks before it, a failure, the firing of due timers, heartbeats) on tokio's blocking
/// threads, the store's clock, and what wakes it when a commit made work. A store crate implements
/// it for its async handle (`miniflow_native::tokio::AsyncStore`, and the like for PostgreSQL), so
/// the dispatcher's code is the same whatever store is underneath.
///
/// ```
/// use std::sync::Arc;
/// use miniflow_core::{Clock, Error, ManualClock, MemoryStore};
/// use miniflow_pool::tokio::AsyncSource;
/// use miniflow_pool::Wakeup;
///
/// /// Each step on a copy of one in-memory store: enough to show the shape.
/// #[derive(Clone)]
/// struct Copies(MemoryStore, Arc<ManualClock>);
///
/// impl AsyncSource for Copies {
///     type Store = MemoryStore;
///     fn take_store(&self) -> Result<MemoryStore, Error> {
///         Ok(self.0.clone())
///     }
///     fn put_store(&self, _store: MemoryStore) {}
///     fn clock(&self) -> Arc<dyn Clock + Send + Sync> {
///         self.1.clone()
///     }
///     fn wakeup(&self) -> Option<Arc<dyn Wakeup>> {
///         None // idle dispatchers poll
///     }
/// }
/// # let _ = Copies(MemoryStore::new(), Arc::new(ManualClock::default())).take_store();
/// ```
pub trait AsyncSource: Clone + Send + Sync + 'static {
    /// The synchronous store the dispatcher's steps run on, one step at a time.
    type Store: Store + Send + 'static;
    /// A store for the next steps: from a pool of the source's, or newly opened. Called on a
    /// blocking thread.
    ///
    /// # Errors
    ///
    /// The store's error when it cannot be opened; the dispatcher reports it and backs off.
    fn take_store(&self) -> Result<Self::Store, Error>;
    /// Gives back a store [`AsyncSource::take_store`] gave, for later steps.
    fn put_store(&self, store: Self::Store);
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
/// # use std::sync::Arc;
/// # use miniflow_core::{Clock, Error, ManualClock};
/// # #[derive(Clone)]
/// # struct Copies(MemoryStore);
/// # impl miniflow_pool::tokio::AsyncSource for Copies {
/// #     type Store = MemoryStore;
/// #     fn take_store(&self) -> Result<MemoryStore, Error> { Ok(self.0.clone()) }
/// #     fn put_store(&self, _: MemoryStore) {}
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
///
/// let stats = AsyncDispatcher::new(Copies(store), lock_budget)
///     .concurrency(16)
///     .lease_ttl(Duration::from_secs(30))
///     .run_until_idle()
///     .await?;
/// assert_eq!(stats.completed, 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct AsyncDispatcher<S: AsyncSource> {
    store: S,
    handler: Arc<AsyncHandler>,
    firer: Option<Arc<dyn Firer<S::Store>>>,
    observer: Option<Arc<Observer>>,
    on_error: Option<Arc<ErrorHook>>,
    config: Config,
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
            observer: None,
            on_error: None,
            config: Config {
                name: format!("worker-{}", std::process::id()),
                workers: 1,
                batch_size: 64,
                lease_ttl: Duration::from_secs(30),
                policy: RetryPolicy::default(),
                order: ClaimOrder::DueFirst,
                poll_interval: Duration::from_millis(50),
                ack_delay: Duration::ZERO,
                stats_interval: None,
            },
            concurrency: 1,
        }
    }

    /// Runs up to `deliveries` handler calls at once: 1 to 10,000.
    #[must_use]
    pub fn concurrency(mut self, deliveries: usize) -> Self {
        self.concurrency = deliveries;
        self
    }

    /// As [`Dispatcher::workflow`]: also fires due timers and failure feedback through `engine`
    /// ([`Engine::fire`], on a blocking thread).
    #[must_use]
    pub fn workflow<W>(mut self, engine: Arc<Engine<W>>) -> Self
    where
        W: Workflow + Send + Sync + 'static,
        W::State: Send,
    {
        self.firer = Some(Arc::new(EngineFirer(engine)));
        self
    }

    /// As [`Dispatcher::batch_size`]: claims up to `size` commands per write (1 to 1,000), never
    /// more than there are free slots.
    #[must_use]
    pub fn batch_size(mut self, size: usize) -> Self {
        self.config.batch_size = size;
        self
    }

    /// As [`Dispatcher::lease_ttl`] (4 ms to 24 h).
    #[must_use]
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.config.lease_ttl = ttl;
        self
    }

    /// As [`Dispatcher::retry_policy`].
    #[must_use]
    pub fn retry_policy(mut self, policy: RetryPolicy) -> Self {
        self.config.policy = policy;
        self
    }

    /// As [`Dispatcher::order`].
    #[must_use]
    pub fn order(mut self, order: ClaimOrder) -> Self {
        self.config.order = order;
        self
    }

    /// As [`Dispatcher::poll_interval`] (1 ms to 60 s): how often an idle dispatcher looks for work
    /// committed by other processes, and the first pause after a failed store operation.
    #[must_use]
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.config.poll_interval = interval;
        self
    }

    /// Names the dispatcher in its leases (as [`Dispatcher::name`]).
    #[must_use]
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.config.name = name.into();
        self
    }

    /// As [`Dispatcher::on_settled`].
    #[must_use]
    pub fn on_settled(
        mut self,
        observer: impl Fn(&Delivery, &Settlement) + Send + Sync + 'static,
    ) -> Self {
        self.observer = Some(Arc::new(observer));
        self
    }

    /// As [`Dispatcher::on_error`]: every failed store operation (counted in
    /// [`Stats::store_errors`], then backed off from), rejected timer and panicking workflow.
    #[must_use]
    pub fn on_error(mut self, hook: impl Fn(&Error) + Send + Sync + 'static) -> Self {
        self.on_error = Some(Arc::new(hook));
        self
    }

    /// Refuses settings out of bounds, naming the setting and its value.
    fn validate(&self) -> Result<(), Error> {
        within("concurrency", self.concurrency, 1..=MAX_CONCURRENCY)?;
        self.config.validate()
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

    /// The delivery loop, keeping its books with a synchronous [`Worker`].
    fn deliveries(
        &self,
        held: Arc<HeldLeases>,
        control: Arc<Control>,
        until_idle: bool,
    ) -> Deliveries<S> {
        let store = self.store.clone();
        let opener = self.store.clone();
        let never: Arc<dyn Handler> =
            Arc::new(|_: &Delivery| Outcome::retry("async deliveries run on the runtime"));
        let books = Arc::new(Worker {
            name: self.config.name.clone(),
            open: Arc::new(move || opener.take_store()),
            handler: never,
            firer: self.firer.clone(),
            observer: self.observer.clone(),
            on_error: self.on_error.clone(),
            clock: self.store.clock(),
            config: self.config.clone(),
            stop: control.stop.clone(),
            held,
            idle: None,
            until_idle,
            // Each ack is written as its handler returns.
            acks: None,
            notices: Arc::default(),
        });
        Deliveries {
            request: self.config.claim_request(self.config.name.clone()),
            timers: self.firer.as_ref().map(|_| TimerRounds::default()),
            async_store: store,
            store: Mutex::new(None),
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

    /// Every quarter lease TTL, extends the held leases past half their TTL (as the synchronous
    /// heartbeat does); resolves with the number of store errors it met.
    fn heartbeat(
        &self,
        held: &Arc<HeldLeases>,
        control: &Arc<Control>,
    ) -> ::tokio::task::JoinHandle<u64> {
        let (store, held, control) = (self.store.clone(), held.clone(), control.clone());
        let (ttl, on_error) = (self.config.lease_ttl, self.on_error.clone());
        ::tokio::spawn(async move {
            let mut errors = 0;
            while control.heartbeat_pause(ttl / 4).await {
                let now = store.clock().now();
                let due = held.due_for_extension(now, ttl);
                if due.is_empty() {
                    continue;
                }
                let (source, held_now) = (store.clone(), held.clone());
                // The extensions run on a blocking thread, on a store of the source's.
                let failed = ::tokio::task::spawn_blocking(move || {
                    extend_all(&source, &held_now, due, ttl, now)
                })
                .await
                .unwrap_or_else(|e| {
                    vec![Error::Storage(
                        format!("the heartbeat's store call failed: {e}").into(),
                    )]
                });
                for error in failed {
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

/// An engine that fires timers, with its workflow type erased.
struct EngineFirer<W: Workflow>(Arc<Engine<W>>);

impl<S: Store, W> Firer<S> for EngineFirer<W>
where
    W: Workflow + Send + Sync,
    W::State: Send,
{
    fn fire(
        &self,
        store: &mut S,
        timer: &TimerRow,
        now: Timestamp,
    ) -> Result<Option<Handled>, Error> {
        self.0.fire(store, timer, now)
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

/// Extends the leases `due` on a store of `source`'s in one call (as the synchronous heartbeat
/// does); returns the errors it met.
fn extend_all<S: AsyncSource>(
    source: &S,
    held: &HeldLeases,
    due: Vec<(CommandId, u64)>,
    ttl: Duration,
    now: Timestamp,
) -> Vec<Error> {
    let mut store = match source.take_store() {
        Ok(store) => store,
        Err(error) => return vec![error],
    };
    let answers = store.extend_all(&due, ttl, now);
    let failed = held.extended_all(&due, answers);
    source.put_store(store);
    failed
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
    async_store: S,
    /// The dispatcher's own store, for the [`Worker`]'s methods on a blocking thread (it remembers
    /// the row keys of what it claimed, so acks reach their rows directly). Behind a lock only so
    /// the loop may be shared between threads while it waits; `None` while a blocking call has it.
    store: Mutex<Option<S::Store>>,
    handler: Arc<AsyncHandler>,
    books: Arc<Worker<S::Store>>,
    control: Arc<Control>,
    request: ClaimRequest,
    timers: Option<TimerRounds>,
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
                self.start_all(batch);
                // Acks and firings may have made work (feedback timers, new commands): look again.
                if claimed || fired > 0 || acked {
                    continue;
                }
                if self.in_flight.is_empty() {
                    if self.books.looks_for_unfired_timers() {
                        self.on_store(|books, store, _, _| books.notice_unfired_timers(store))
                            .await;
                    }
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

    /// Runs `work` with the [`Worker`], the dispatcher's store (opened at first use), its acks in
    /// waiting and its tally, on a blocking thread; `None` when the store could not be opened before
    /// the dispatcher halted.
    async fn on_store<R: Send + 'static>(
        &mut self,
        work: impl FnOnce(&Worker<S::Store>, &mut S::Store, &mut Vec<Done>, &mut Tally) -> R
            + Send
            + 'static,
    ) -> Option<R> {
        let store = self
            .store
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let books = self.books.clone();
        let (mut done, mut tally) = (
            std::mem::take(&mut self.done),
            std::mem::take(&mut self.tally),
        );
        let joined = ::tokio::task::spawn_blocking(move || {
            let mut store = store.or_else(|| books.open_store(&mut tally));
            let result = store
                .as_mut()
                .map(|store| work(&books, store, &mut done, &mut tally));
            (store, done, tally, result)
        })
        .await;
        match joined {
            Ok((store, done, tally, result)) => {
                *self.store.get_mut().unwrap_or_else(PoisonError::into_inner) = store;
                (self.done, self.tally) = (done, tally);
                result
            }
            Err(failed) => {
                // The Worker's methods guard the workflow's and handler's code: this is a defect of
                // ours. What was in waiting is lost to this loop; its leases run out.
                self.books.store_failed(
                    Error::Storage(
                        format!("a store call of the dispatcher failed: {failed}").into(),
                    ),
                    &mut self.tally,
                );
                None
            }
        }
    }

    /// Fires due timers ([`Worker::fire_due_timers`]) when work was committed since the last round,
    /// the last round fired something, or a poll interval passed; returns how many events it
    /// committed.
    async fn fire_timers(&mut self) -> usize {
        let Some(rounds) = &mut self.timers else {
            return 0;
        };
        let mark = self.async_store.wakeup().map_or(0, |wakeup| wakeup.mark());
        let poll = self.books.config.poll_interval;
        let due = rounds.fired > 0
            || mark != rounds.mark
            || rounds.last.is_none_or(|t| t.elapsed() >= poll);
        if !due {
            return 0;
        }
        (rounds.mark, rounds.last) = (mark, Some(Instant::now()));
        let fired = self
            .on_store(|books, store, _, tally| books.fire_due_timers(store, tally))
            .await
            .unwrap_or(0);
        if let Some(rounds) = &mut self.timers {
            rounds.fired = fired;
        }
        fired
    }

    /// Acknowledges what finished and claims up to `room` commands, in one write
    /// ([`Worker::settle_and_claim`]).
    async fn settle_and_claim(&mut self, room: usize) -> Option<Vec<Delivery>> {
        let request = self.request.clone().limit(room.min(self.request.limit));
        let received = self.received.clone();
        self.on_store(move |books, store, done, tally| {
            books.settle_and_claim(store, &received, done, &request, tally)
        })
        .await
        .flatten()
    }

    /// Runs each delivery as a task of its own, in its `process` span, its lease held for the
    /// heartbeat.
    fn start_all(&mut self, batch: Vec<Delivery>) {
        if batch.is_empty() {
            return;
        }
        self.tally.stats.claimed += batch.len() as u64;
        self.books.held.hold(&batch);
        let now = self.books.clock.now();
        self.received = telemetry::received(&self.books.name, &batch, now);
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

    /// Settles a delivery whose handler returned ([`Worker::judge`]): an ack waits for the next
    /// claim; a failure is settled now ([`Worker::fail`]).
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
            Some(Verdict::Failed(failure)) => {
                self.on_store(move |books, store, _, tally| {
                    books.fail(store, &delivery, failure, tally)
                })
                .await;
            }
            None => {}
        }
    }

    /// Nothing claimable and nothing in flight: waits for work committed in this process, the poll
    /// interval (for other processes' commits), or the stop.
    async fn idle(&self) {
        let poll = self.books.config.poll_interval;
        ::tokio::select! {
            () = self.control.work.notified() => {}
            () = ::tokio::time::sleep(poll) => {}
        }
    }

    /// Waits for a delivery to finish, for new work when there is room for it, for the poll
    /// interval, or for the stop.
    async fn wait_for_a_delivery(&mut self, room: bool) {
        let poll = self.books.config.poll_interval;
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
        if !self.books.halted(&self.tally) {
            let pause = error_backoff(
                self.books.config.poll_interval,
                self.tally.failures_in_a_row,
            );
            self.control.pause(pause).await;
        }
    }

    /// Stopping: lets the deliveries in flight finish (until the shutdown deadline, if any; the
    /// rest are cut off and their leases run out), acknowledges them ([`Worker::flush`]), and
    /// returns the books.
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
        if !self.done.is_empty() {
            let received = self.received.clone();
            self.on_store(move |books, store, done, tally| {
                let _batch = received.enter();
                books.flush(store, done, tally)
            })
            .await;
        }
        if let Some(store) = self
            .store
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            self.async_store.put_store(store);
        }
        Finished {
            tally: self.tally,
            unfinished,
        }
    }
}

/// A handler's future, with a panic caught as the synchronous dispatcher catches a handler's.
struct CatchUnwind(BoxedOutcome);

impl Future for CatchUnwind {
    type Output = std::thread::Result<Outcome>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let inner = self.0.as_mut();
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
