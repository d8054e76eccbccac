//! [`Dispatcher`]: a pool of worker threads that deliver outbox commands at least once.
//!
//! Each worker claims a batch of due commands under a lease (one transaction), calls the handler for
//! each, and settles them: completions are grouped into one durable transaction, failures go back with
//! a backoff or become dead (DESIGN rules 7–9). A heartbeat thread extends the leases of long deliveries
//! and notices a lost lease, whose result is then not written.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use miniflow_core::{
    Ack, ClaimOrder, ClaimRequest, Clock, CommandId, Delivery, Engine, Error, Failure, Handled,
    RetryPolicy, Settled, Store, TimerRow, Timestamp, Workflow,
};

use crate::{SqliteStore, SystemClock};

/// What a handler reports about one delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The receiver returned a verifiable result: the command is done.
    Done,
    /// It failed, or the result is unknown (a timeout): deliver again later, with the same command ID.
    Retry(String),
    /// It failed for good (the receiver refused it): the command becomes dead at once.
    Permanent(String),
}

impl Outcome {
    /// A failure worth retrying, e.g. a timeout or a 503.
    pub fn retry(error: impl std::fmt::Display) -> Self {
        Outcome::Retry(error.to_string())
    }

    /// A failure that retrying cannot fix, e.g. a 422.
    pub fn permanent(error: impl std::fmt::Display) -> Self {
        Outcome::Permanent(error.to_string())
    }
}

/// Delivers one command to the outside world. Plain functions and closures are handlers.
///
/// Send the command ID as the idempotency key: a command may be delivered more than once. A handler
/// that panics counts as a retryable failure; the worker goes on.
pub trait Handler: Send + Sync + 'static {
    /// Delivers `delivery` and says how it went.
    fn handle(&self, delivery: &Delivery) -> Outcome;
}

impl<F> Handler for F
where
    F: Fn(&Delivery) -> Outcome + Send + Sync + 'static,
{
    fn handle(&self, delivery: &Delivery) -> Outcome {
        self(delivery)
    }
}

/// How one delivery was settled, as reported to an observer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settlement {
    /// Done, durably.
    Completed,
    /// Failed; pending again from `at`.
    RetryAt {
        /// When it is due again.
        at: Timestamp,
        /// The backoff applied.
        backoff: Duration,
        /// The handler's error.
        error: String,
    },
    /// Dead: out of attempts or failed for good.
    Dead {
        /// The handler's error.
        error: String,
    },
    /// The lease was lost (expired and taken over) before the result was written; the result was
    /// dropped and the new holder's delivery counts.
    LeaseLost,
    /// Given back undelivered during shutdown.
    Released,
}

impl std::fmt::Display for Settlement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Settlement::Completed => f.write_str("done"),
            Settlement::RetryAt { backoff, error, .. } => {
                write!(
                    f,
                    "failed ({error}), retry in {:.3}s",
                    backoff.as_secs_f64()
                )
            }
            Settlement::Dead { error } => write!(f, "failed for good ({error}): dead"),
            Settlement::LeaseLost => f.write_str("lease lost: result dropped"),
            Settlement::Released => f.write_str("released undelivered"),
        }
    }
}

/// Counts of what a dispatcher did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Commands claimed (deliveries started or released).
    pub claimed: u64,
    /// Commands completed.
    pub completed: u64,
    /// Failures sent back for a retry.
    pub retried: u64,
    /// Commands that became dead.
    pub dead: u64,
    /// Results dropped because the lease was lost.
    pub lost_leases: u64,
    /// Claimed commands given back during shutdown.
    pub released: u64,
    /// Handler calls that panicked (counted as retryable failures too).
    pub panics: u64,
    /// Timers (and failure feedback) whose event this dispatcher committed.
    pub timers_fired: u64,
    /// Store operations that failed (the worker backs off and goes on).
    pub store_errors: u64,
}

impl std::ops::AddAssign for Stats {
    fn add_assign(&mut self, o: Stats) {
        self.claimed += o.claimed;
        self.completed += o.completed;
        self.retried += o.retried;
        self.dead += o.dead;
        self.lost_leases += o.lost_leases;
        self.released += o.released;
        self.panics += o.panics;
        self.timers_fired += o.timers_fired;
        self.store_errors += o.store_errors;
    }
}

type Opener<S> = dyn Fn() -> Result<S, Error> + Send + Sync;
type Observer = dyn Fn(&Delivery, &Settlement) + Send + Sync;

/// Fires timers into workflows: an [`Engine`] with its workflow type erased.
trait Firer<S>: Send + Sync {
    fn fire(
        &self,
        store: &mut S,
        timer: &TimerRow,
        now: Timestamp,
    ) -> Result<Option<Handled>, Error>;
}

impl<S: Store, W: Workflow + Send + Sync> Firer<S> for Engine<W> {
    fn fire(
        &self,
        store: &mut S,
        timer: &TimerRow,
        now: Timestamp,
    ) -> Result<Option<Handled>, Error> {
        Engine::fire(self, store, timer, now)
    }
}

/// A pool of workers delivering outbox commands from a store.
///
/// ```
/// use std::time::Duration;
/// use miniflow_core::{json, Command, Commit, Decision, Event, Seq, Store, Timestamp, WorkflowId};
/// use miniflow_native::{Dispatcher, Outcome, SqliteStore};
///
/// let dir = tempfile::tempdir()?;
/// let path = dir.path().join("flow.db");
/// let mut store = SqliteStore::open(&path)?;
/// let decision = Decision::new().command(Command::new("lock_budget", json!({ "amount": 1200 })));
/// let event = Event::new("trip_requested", json!({}));
/// store.append_with_commands(&Commit::new(WorkflowId::new("trip-001")?, Seq::ZERO, event, decision, Timestamp::EPOCH)?)?;
///
/// let dispatcher = Dispatcher::sqlite(&path, |delivery: &miniflow_core::Delivery| {
///     // call the receiver with delivery.command_id as the idempotency key
///     Outcome::Done
/// })
/// .workers(2)
/// .lease_ttl(Duration::from_secs(30));
/// let stats = dispatcher.run_until_idle()?;
/// assert_eq!(stats.completed, 1);
/// assert!(store.pending(10)?.is_empty());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Dispatcher<S> {
    open: Arc<Opener<S>>,
    handler: Arc<dyn Handler>,
    firer: Option<Arc<dyn Firer<S>>>,
    observer: Option<Arc<Observer>>,
    clock: Arc<dyn Clock + Send + Sync>,
    config: Config,
}

#[derive(Debug, Clone)]
struct Config {
    name: String,
    workers: usize,
    batch_size: usize,
    lease_ttl: Duration,
    policy: RetryPolicy,
    order: ClaimOrder,
    poll_interval: Duration,
    ack_delay: Duration,
}

impl Dispatcher<SqliteStore> {
    /// A dispatcher over the SQLite file at `path`: every worker opens its own connection.
    pub fn sqlite(path: impl Into<PathBuf>, handler: impl Handler) -> Self {
        let path = path.into();
        Self::new(move || SqliteStore::open(&path), handler)
    }
}

impl<S: Store + 'static> Dispatcher<S> {
    /// A dispatcher whose workers each call `open` for a store of their own, with the defaults: 1
    /// worker, batches of 64, 30 s leases, [`RetryPolicy::default`], [`ClaimOrder::DueFirst`], polling
    /// every 50 ms when idle, the system clock.
    pub fn new(
        open: impl Fn() -> Result<S, Error> + Send + Sync + 'static,
        handler: impl Handler,
    ) -> Self {
        Self {
            open: Arc::new(open),
            handler: Arc::new(handler),
            firer: None,
            observer: None,
            clock: Arc::new(SystemClock),
            config: Config {
                name: format!("worker-{}", std::process::id()),
                workers: 1,
                batch_size: 64,
                lease_ttl: Duration::from_secs(30),
                policy: RetryPolicy::default(),
                order: ClaimOrder::DueFirst,
                poll_interval: Duration::from_millis(50),
                ack_delay: Duration::from_millis(10),
            },
        }
    }

    /// Also fires due timers and failure feedback (`command_failed`, `command_resolved`) into their
    /// workflows through `engine`: replay → decide → commit, each timer exactly once (DESIGN rules
    /// 11–12). Without it, timers wait for a dispatcher that has one.
    #[must_use]
    pub fn workflow<W: Workflow + Send + Sync + 'static>(mut self, engine: Engine<W>) -> Self {
        self.firer = Some(Arc::new(engine));
        self
    }

    /// Runs `workers` worker threads (at least 1).
    #[must_use]
    pub fn workers(mut self, workers: usize) -> Self {
        self.config.workers = workers.max(1);
        self
    }

    /// Claims up to `size` commands per transaction (at least 1).
    #[must_use]
    pub fn batch_size(mut self, size: usize) -> Self {
        self.config.batch_size = size.max(1);
        self
    }

    /// Leases each claimed command for `ttl`; the heartbeat extends it while the delivery runs.
    #[must_use]
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.config.lease_ttl = ttl.max(Duration::from_millis(4));
        self
    }

    /// Retries failures by `policy`.
    #[must_use]
    pub fn retry_policy(mut self, policy: RetryPolicy) -> Self {
        self.config.policy = policy;
        self
    }

    /// Claims in `order`; [`ClaimOrder::StrictPerWorkflow`] delivers a workflow's commands one by one.
    #[must_use]
    pub fn order(mut self, order: ClaimOrder) -> Self {
        self.config.order = order;
        self
    }

    /// How long an idle worker waits before it looks for due commands again.
    #[must_use]
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.config.poll_interval = interval;
        self
    }

    /// The longest a completed delivery waits to be acknowledged together with the next ones. Larger
    /// values group more acks per transaction; a completion is only reported once durable.
    #[must_use]
    pub fn ack_delay(mut self, delay: Duration) -> Self {
        self.config.ack_delay = delay;
        self
    }

    /// Names the workers `{name}-{n}` in their leases.
    #[must_use]
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.config.name = name.into();
        self
    }

    /// Takes `now` from `clock` (a [`miniflow_core::ManualClock`] in tests).
    #[must_use]
    pub fn clock(mut self, clock: Arc<dyn Clock + Send + Sync>) -> Self {
        self.clock = clock;
        self
    }

    /// Calls `observer` after each delivery is settled (durably, for completions).
    #[must_use]
    pub fn on_settled(
        mut self,
        observer: impl Fn(&Delivery, &Settlement) + Send + Sync + 'static,
    ) -> Self {
        self.observer = Some(Arc::new(observer));
        self
    }

    /// Runs the workers until none finds a claimable command, then returns what they did. Commands
    /// waiting for a later retry time stay pending.
    ///
    /// # Errors
    ///
    /// The first error of a worker that could not open its store.
    pub fn run_until_idle(&self) -> Result<Stats, Error> {
        let running = self.spawn(true)?;
        running.join_all()
    }

    /// Starts the workers in the background until [`RunningDispatcher::shutdown`].
    ///
    /// # Errors
    ///
    /// When the first store cannot be opened.
    pub fn start(self) -> Result<RunningDispatcher, Error> {
        self.spawn(false)
    }

    fn spawn(&self, until_idle: bool) -> Result<RunningDispatcher, Error> {
        // Open one store up front so a wrong path fails here, not in every thread.
        drop((self.open)()?);
        let stop = Arc::new(AtomicBool::new(false));
        let held = Arc::new(HeldLeases::default());
        let workers = (0..self.config.workers)
            .map(|n| {
                let worker = Worker {
                    name: format!("{}-{n}", self.config.name),
                    open: self.open.clone(),
                    handler: self.handler.clone(),
                    firer: self.firer.clone(),
                    observer: self.observer.clone(),
                    clock: self.clock.clone(),
                    config: self.config.clone(),
                    stop: stop.clone(),
                    held: held.clone(),
                    until_idle,
                };
                std::thread::Builder::new()
                    .name(worker.name.clone())
                    .spawn(move || worker.run())
                    .map_err(|e| Error::Storage(Box::new(e)))
            })
            .collect::<Result<Vec<_>, Error>>()?;
        let heartbeat = {
            let heartbeat = Heartbeat {
                open: self.open.clone(),
                clock: self.clock.clone(),
                lease_ttl: self.config.lease_ttl,
                held,
                stop: stop.clone(),
            };
            std::thread::Builder::new()
                .name(format!("{}-heartbeat", self.config.name))
                .spawn(move || heartbeat.run())
                .map_err(|e| Error::Storage(Box::new(e)))?
        };
        Ok(RunningDispatcher {
            stop,
            workers,
            heartbeat: Some(heartbeat),
        })
    }
}

/// Dispatcher workers running in the background.
pub struct RunningDispatcher {
    stop: Arc<AtomicBool>,
    workers: Vec<JoinHandle<Result<Stats, Error>>>,
    heartbeat: Option<JoinHandle<()>>,
}

/// How a shutdown went.
#[derive(Debug)]
pub struct Shutdown {
    /// What the workers that stopped in time did.
    pub stats: Stats,
    /// Workers still inside a delivery at the deadline. Their leases expire and other workers take the
    /// commands over; nothing is lost.
    pub unfinished_workers: usize,
    /// Errors of workers that stopped on one.
    pub errors: Vec<Error>,
}

impl RunningDispatcher {
    /// Stops claiming, lets each worker finish the delivery it is in and give back the rest of its
    /// batch, and waits up to `deadline` for them.
    pub fn shutdown(mut self, deadline: Duration) -> Shutdown {
        self.stop.store(true, Ordering::SeqCst);
        let until = Instant::now() + deadline;
        while Instant::now() < until && self.workers.iter().any(|w| !w.is_finished()) {
            std::thread::sleep(Duration::from_millis(2));
        }
        let mut shutdown = Shutdown {
            stats: Stats::default(),
            unfinished_workers: 0,
            errors: Vec::new(),
        };
        for worker in std::mem::take(&mut self.workers) {
            if !worker.is_finished() {
                shutdown.unfinished_workers += 1;
                continue;
            }
            match worker.join() {
                Ok(Ok(stats)) => shutdown.stats += stats,
                Ok(Err(e)) => shutdown.errors.push(e),
                Err(_) => shutdown
                    .errors
                    .push(Error::Storage("a worker thread panicked".into())),
            }
        }
        if shutdown.unfinished_workers == 0 {
            if let Some(heartbeat) = self.heartbeat.take() {
                let _ = heartbeat.join();
            }
        }
        shutdown
    }

    fn join_all(mut self) -> Result<Stats, Error> {
        let mut stats = Stats::default();
        let mut first_error = None;
        for worker in std::mem::take(&mut self.workers) {
            match worker.join() {
                Ok(Ok(s)) => stats += s,
                Ok(Err(e)) => first_error = first_error.or(Some(e)),
                Err(_) => {
                    first_error =
                        first_error.or(Some(Error::Storage("a worker thread panicked".into())))
                }
            }
        }
        self.stop.store(true, Ordering::SeqCst);
        if let Some(heartbeat) = self.heartbeat.take() {
            let _ = heartbeat.join();
        }
        first_error.map_or(Ok(stats), Err)
    }
}

impl Drop for RunningDispatcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// The leases the workers hold right now, shared with the heartbeat.
#[derive(Default)]
struct HeldLeases(Mutex<HashMap<CommandId, Held>>);

#[derive(Debug, Clone, Copy)]
struct Held {
    token: u64,
    expires_at: Timestamp,
    lost: bool,
}

impl HeldLeases {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<CommandId, Held>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn hold(&self, batch: &[Delivery]) {
        let mut held = self.lock();
        for d in batch {
            held.insert(
                d.command_id.clone(),
                Held {
                    token: d.token,
                    expires_at: d.lease_expires_at,
                    lost: false,
                },
            );
        }
    }

    /// Stops tracking `id`; says whether its lease was lost meanwhile.
    fn drop_lease(&self, id: &CommandId) -> bool {
        self.lock().remove(id).is_some_and(|h| h.lost)
    }

    fn is_lost(&self, id: &CommandId) -> bool {
        self.lock().get(id).is_some_and(|h| h.lost)
    }
}

struct Heartbeat<S> {
    open: Arc<Opener<S>>,
    clock: Arc<dyn Clock + Send + Sync>,
    lease_ttl: Duration,
    held: Arc<HeldLeases>,
    stop: Arc<AtomicBool>,
}

impl<S: Store> Heartbeat<S> {
    /// Every quarter TTL, extends the leases that are past half their TTL; a stale one is marked lost.
    fn run(self) {
        let Ok(mut store) = (self.open)() else { return };
        let tick = self.lease_ttl / 4;
        while !self.stop.load(Ordering::SeqCst) {
            sleep_unless(&self.stop, tick);
            let now = self.clock.now();
            let due: Vec<(CommandId, u64)> = self
                .held
                .lock()
                .iter()
                .filter(|(_, h)| !h.lost && h.expires_at < now + self.lease_ttl / 2)
                .map(|(id, h)| (id.clone(), h.token))
                .collect();
            for (id, token) in due {
                let result = store.extend(&id, token, self.lease_ttl, now);
                let mut held = self.held.lock();
                let Some(h) = held.get_mut(&id).filter(|h| h.token == token) else {
                    continue;
                };
                match result {
                    Ok(expires_at) => h.expires_at = expires_at,
                    Err(Error::StaleLease { .. }) => h.lost = true,
                    Err(_) => {} // try again next tick; the lease is still ours until it expires
                }
            }
        }
    }
}

/// Sleeps `total`, waking early when `stop` is set.
fn sleep_unless(stop: &AtomicBool, total: Duration) {
    let until = Instant::now() + total;
    while !stop.load(Ordering::SeqCst) {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        std::thread::sleep(left.min(Duration::from_millis(5)));
    }
}

struct Worker<S> {
    name: String,
    open: Arc<Opener<S>>,
    handler: Arc<dyn Handler>,
    firer: Option<Arc<dyn Firer<S>>>,
    observer: Option<Arc<Observer>>,
    clock: Arc<dyn Clock + Send + Sync>,
    config: Config,
    stop: Arc<AtomicBool>,
    held: Arc<HeldLeases>,
    until_idle: bool,
}

impl<S: Store> Worker<S> {
    fn run(self) -> Result<Stats, Error> {
        let mut store = (self.open)()?;
        let mut stats = Stats::default();
        let request = ClaimRequest::new(self.name.clone())
            .limit(self.config.batch_size)
            .lease_ttl(self.config.lease_ttl)
            .order(self.config.order)
            .retry_policy(&self.config.policy);
        while !self.stop.load(Ordering::SeqCst) {
            let fired = self.fire_due_timers(&mut store, &mut stats);
            let batch = match store.claim(&request, self.clock.now()) {
                Ok(batch) => batch,
                Err(_) => {
                    stats.store_errors += 1;
                    sleep_unless(&self.stop, self.config.poll_interval);
                    continue;
                }
            };
            if batch.is_empty() && fired > 0 {
                continue; // the fired events may have decided new commands or timers
            }
            if batch.is_empty() {
                if self.until_idle {
                    break;
                }
                sleep_unless(&self.stop, self.config.poll_interval);
                continue;
            }
            stats.claimed += batch.len() as u64;
            self.held.hold(&batch);
            self.deliver(&mut store, &batch, &mut stats);
        }
        Ok(stats)
    }

    /// Fires the due timers this worker can take; returns how many it took.
    fn fire_due_timers(&self, store: &mut S, stats: &mut Stats) -> usize {
        let Some(firer) = &self.firer else { return 0 };
        let timers = match store.claim_timers(
            self.config.batch_size,
            self.config.lease_ttl,
            self.clock.now(),
        ) {
            Ok(timers) => timers,
            Err(_) => {
                stats.store_errors += 1;
                return 0;
            }
        };
        for timer in &timers {
            if self.stop.load(Ordering::SeqCst) {
                break; // the rest are taken back when their take runs out
            }
            match firer.fire(store, timer, self.clock.now()) {
                Ok(Some(_)) => stats.timers_fired += 1,
                Ok(None) => {} // fired by another worker, or cancelled
                Err(_) => stats.store_errors += 1,
            }
        }
        timers.len()
    }

    /// Delivers a claimed batch: completions are grouped into one transaction per `ack_delay`.
    fn deliver(&self, store: &mut S, batch: &[Delivery], stats: &mut Stats) {
        let mut acks: Vec<&Delivery> = Vec::new();
        let mut since_flush = Instant::now();
        for (n, delivery) in batch.iter().enumerate() {
            if self.stop.load(Ordering::SeqCst) {
                self.flush(store, &mut acks, stats);
                self.release(store, &batch[n..], stats);
                return;
            }
            let outcome = catch_unwind(AssertUnwindSafe(|| self.handler.handle(delivery)))
                .unwrap_or_else(|panic| {
                    stats.panics += 1;
                    Outcome::Retry(format!("handler panicked: {}", panic_message(&*panic)))
                });
            if self.held.is_lost(&delivery.command_id) {
                self.held.drop_lease(&delivery.command_id);
                self.report(delivery, Settlement::LeaseLost, stats);
                continue;
            }
            match outcome {
                Outcome::Done => acks.push(delivery),
                Outcome::Retry(error) => {
                    self.fail(store, delivery, Failure::retryable(error), stats)
                }
                Outcome::Permanent(error) => {
                    self.fail(store, delivery, Failure::permanent(error), stats)
                }
            }
            if since_flush.elapsed() >= self.config.ack_delay {
                self.flush(store, &mut acks, stats);
                since_flush = Instant::now();
            }
        }
        self.flush(store, &mut acks, stats);
    }

    /// Completes `acks` in one durable transaction, then reports them.
    fn flush(&self, store: &mut S, acks: &mut Vec<&Delivery>, stats: &mut Stats) {
        if acks.is_empty() {
            return;
        }
        let batch: Vec<Ack> = acks
            .iter()
            .map(|d| (d.command_id.clone(), d.token))
            .collect();
        let results = store.complete_all(&batch, self.clock.now());
        for (n, delivery) in acks.drain(..).enumerate() {
            self.held.drop_lease(&delivery.command_id);
            let settlement = match results.as_ref().map(|r| &r[n]) {
                Ok(Ok(())) => Settlement::Completed,
                Ok(Err(Error::StaleLease { .. })) => Settlement::LeaseLost,
                // The ack did not land: the lease expires and the command is delivered again.
                Ok(Err(_)) | Err(_) => {
                    stats.store_errors += 1;
                    continue;
                }
            };
            self.report(delivery, settlement, stats);
        }
    }

    fn fail(&self, store: &mut S, delivery: &Delivery, failure: Failure, stats: &mut Stats) {
        let result = store.fail(
            &delivery.command_id,
            delivery.token,
            &failure,
            &self.config.policy,
            self.clock.now(),
        );
        self.held.drop_lease(&delivery.command_id);
        let settlement = match result {
            Ok(Settled::RetryAt { at, backoff }) => Settlement::RetryAt {
                at,
                backoff,
                error: failure.error,
            },
            Ok(Settled::Dead) => Settlement::Dead {
                error: failure.error,
            },
            Err(Error::StaleLease { .. }) => Settlement::LeaseLost,
            Err(_) => {
                stats.store_errors += 1;
                return;
            }
        };
        self.report(delivery, settlement, stats);
    }

    fn release(&self, store: &mut S, rest: &[Delivery], stats: &mut Stats) {
        for delivery in rest {
            self.held.drop_lease(&delivery.command_id);
            match store.release(&delivery.command_id, delivery.token, self.clock.now()) {
                Ok(()) => self.report(delivery, Settlement::Released, stats),
                Err(Error::StaleLease { .. }) => {}
                Err(_) => stats.store_errors += 1,
            }
        }
    }

    fn report(&self, delivery: &Delivery, settlement: Settlement, stats: &mut Stats) {
        match &settlement {
            Settlement::Completed => stats.completed += 1,
            Settlement::RetryAt { .. } => stats.retried += 1,
            Settlement::Dead { .. } => stats.dead += 1,
            Settlement::LeaseLost => stats.lost_leases += 1,
            Settlement::Released => stats.released += 1,
        }
        if let Some(observer) = &self.observer {
            observer(delivery, &settlement);
        }
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic".to_owned())
}
