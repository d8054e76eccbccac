//! [`Dispatcher`]: a pool of worker threads that deliver outbox commands at least once.
//!
//! Each worker claims a batch of due commands under a lease (one transaction), calls the handler for
//! each, and settles them: completions are grouped into one durable transaction, failures go back with
//! a backoff or become dead (DESIGN rules 7–9). A heartbeat thread extends the leases of long deliveries
//! and notices a lost lease, whose result is then not written.
//!
//! Failures surface (DESIGN rule 19): a configuration out of bounds is refused when the dispatcher
//! starts; a failed store operation is counted, passed to [`Dispatcher::on_error`], and backed off
//! from (exponentially, capped) instead of retried in a tight loop; [`Dispatcher::run_until_idle`]
//! returns it. A workflow that panics or rejects while a timer fires is counted and reported too.

use std::any::Any;
use std::collections::HashMap;
use std::fmt::Debug;
use std::ops::RangeInclusive;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use miniflow_core::{
    Ack, ClaimOrder, ClaimRequest, Clock, CommandId, Delivery, Engine, Error, Extended, Failure,
    Handled, Handover, JsonLimits, RetryPolicy, Settled, Store, TimerRow, Timestamp, Workflow,
};

use serde_json::Value;

use crate::{telemetry, SystemClock};

#[macro_use]
mod settings;
mod acks;
#[cfg(feature = "tokio")]
pub(crate) mod asynchronous;
mod idle;
mod leases;
mod worker;

use self::acks::*;
pub use self::idle::Wakeup;
pub use self::leases::cancellation_requested;
use self::leases::*;
pub use self::settings::DispatcherSettings;
use self::worker::*;

/// What a handler reports about one delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The receiver returned a verifiable result: the command is done.
    Done,
    /// Done, with the receiver's result (e.g. a booking reference): kept on the command, and carried
    /// back into the workflow as a `command_completed` event when the command asked for it
    /// ([`miniflow_core::Command::report_result`]).
    DoneWith(Value),
    /// It failed, or the result is unknown (a timeout): deliver again later, with the same command ID.
    Retry(String),
    /// It failed for good (the receiver refused it): the command becomes dead at once.
    Permanent(String),
}

impl Outcome {
    /// Done, with the receiver's `result`.
    pub fn done_with(result: Value) -> Self {
        Outcome::DoneWith(result)
    }

    /// A failure worth retrying, e.g. a timeout or a 503.
    pub fn retry(error: impl std::fmt::Display) -> Self {
        Outcome::Retry(error.to_string())
    }

    /// A failure that retrying cannot fix, e.g. a 422.
    pub fn permanent(error: impl std::fmt::Display) -> Self {
        Outcome::Permanent(error.to_string())
    }

    /// What settling this outcome takes: an ack (with the result), or a failure.
    fn verdict(self) -> Verdict {
        match self {
            Outcome::Done => Verdict::Done(None),
            Outcome::DoneWith(result) => Verdict::Done(Some(result)),
            Outcome::Retry(error) => Verdict::Failed(Failure::retryable(error)),
            Outcome::Permanent(error) => Verdict::Failed(Failure::permanent(error)),
        }
    }
}

/// How an [`Outcome`] is settled.
enum Verdict {
    /// Acknowledged, with the handler's result if any.
    Done(Option<Value>),
    /// Failed: retried later or dead, by the retry policy.
    Failed(Failure),
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
    /// Given back undelivered when the worker stopped: at shutdown, or when
    /// [`Dispatcher::run_until_idle`] stops on a store error.
    Released,
    /// Its workflow cancelled it while it was delivered, and it failed: it is not tried again.
    Cancelled {
        /// The handler's error.
        error: String,
    },
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
            Settlement::Cancelled { error } => write!(f, "failed ({error}) after its cancellation"),
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
    /// Commands that failed after their workflow cancelled them, and so became cancelled.
    pub cancelled: u64,
    /// Handler calls that panicked (counted as retryable failures too).
    pub panics: u64,
    /// Timers (and failure feedback) whose event this dispatcher committed.
    pub timers_fired: u64,
    /// Store operations that failed, including the heartbeat's, the ack thread's and the gauges'.
    /// Each was passed to [`Dispatcher::on_error`]; the thread that failed backed off.
    pub store_errors: u64,
    /// Timer firings whose event the workflow rejected ([`Error::Rejected`]); each was passed to
    /// [`Dispatcher::on_error`]. The timer stays scheduled and is offered again when its take
    /// (`lease_ttl`) runs out.
    pub timers_rejected: u64,
    /// Timer firings during which the workflow's `evolve` or `decide` panicked; each was passed to
    /// [`Dispatcher::on_error`] as an [`Error::Rejected`]. Nothing was written; the timer stays
    /// scheduled and is offered again when its take (`lease_ttl`) runs out.
    pub timer_panics: u64,
}

impl std::ops::AddAssign for Stats {
    fn add_assign(&mut self, o: Stats) {
        self.claimed += o.claimed;
        self.completed += o.completed;
        self.retried += o.retried;
        self.dead += o.dead;
        self.lost_leases += o.lost_leases;
        self.released += o.released;
        self.cancelled += o.cancelled;
        self.panics += o.panics;
        self.timers_fired += o.timers_fired;
        self.store_errors += o.store_errors;
        self.timers_rejected += o.timers_rejected;
        self.timer_panics += o.timer_panics;
    }
}

type Opener<S> = dyn Fn() -> Result<S, Error> + Send + Sync;
type Observer = dyn Fn(&Delivery, &Settlement) + Send + Sync;
type ErrorHook = dyn Fn(&Error) + Send + Sync;

/// The most worker threads a dispatcher runs.
const MAX_WORKERS: usize = 256;
/// The shortest lease a dispatcher takes: its heartbeat ticks every quarter TTL, in whole milliseconds.
const MIN_LEASE_TTL: Duration = Duration::from_millis(4);
/// The bounds of the idle poll interval: 0 would spin, more than a minute leaves due work waiting.
const POLL_INTERVAL: RangeInclusive<Duration> = Duration::from_millis(1)..=Duration::from_secs(60);
/// The bounds of the interval of the outbox gauges: more often would read the outbox for little, less
/// often leaves dashboards stale.
const STATS_INTERVAL: RangeInclusive<Duration> =
    Duration::from_millis(10)..=Duration::from_secs(3600);
/// The longest a completion may wait for its acknowledgement.
const MAX_ACK_DELAY: Duration = Duration::from_secs(60);
/// Repeated store errors back off from the poll interval, doubling, up to this (or the poll interval,
/// if longer).
const MAX_ERROR_BACKOFF: Duration = Duration::from_secs(5);
/// How many transient store errors ([`Error::Busy`], [`Error::Conflict`]) in a row a worker of
/// `run_until_idle` sits out before it gives up and returns the last one.
const TRANSIENT_ERRORS_TOLERATED: u32 = 8;

/// Fires timers into workflows: an [`Engine`] with its workflow type erased.
trait Firer<S>: Send + Sync {
    fn fire(
        &self,
        store: &mut S,
        timer: &TimerRow,
        now: Timestamp,
    ) -> Result<Option<Handled>, Error>;
}

impl<S: Store, W> Firer<S> for Engine<W>
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
        Engine::fire(self, store, timer, now)
    }
}

/// A pool of workers delivering outbox commands from a store: `Dispatcher::sqlite(path, handler)`
/// and `Dispatcher::postgres(&store, handler)` (from the store crates, in `miniflow::prelude`) build
/// one over a database shared by every worker; [`Dispatcher::new`] over any store.
///
/// ```
/// use std::time::Duration;
/// use miniflow_core::prelude::*;
/// use miniflow_core::{json, Command, Commit, Decision, Delivery, Event, MemoryStore, Seq, Timestamp, WorkflowId};
/// use miniflow_pool::{Dispatcher, Outcome};
///
/// let mut store = MemoryStore::new();
/// let decision = Decision::new().command(Command::new("lock_budget", json!({ "amount": 1200 })));
/// let event = Event::new("trip_requested", json!({}));
/// store.append_with_commands(&Commit::new(WorkflowId::new("trip-001")?, Seq::ZERO, event, decision, Timestamp::EPOCH)?)?;
///
/// let dispatcher = Dispatcher::new(move || Ok(store.clone()), |delivery: &Delivery| {
///     // call the receiver with delivery.command_id as the idempotency key
///     Outcome::Done
/// })
/// .lease_ttl(Duration::from_secs(30));
/// let stats = dispatcher.run_until_idle()?;
/// assert_eq!(stats.completed, 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Dispatcher<S> {
    open: Arc<Opener<S>>,
    handler: Arc<dyn Handler>,
    firer: Option<Arc<dyn Firer<S>>>,
    clock: Arc<dyn Clock + Send + Sync>,
    idle: Option<Arc<dyn Wakeup>>,
    config: Config,
}

/// The synchronous dispatcher's settings: those it shares with the async dispatcher, and its own.
#[derive(Debug, Clone)]
struct Config {
    settings: DispatcherSettings,
    workers: usize,
    ack_delay: Duration,
    stats_interval: Option<Duration>,
}

impl Config {
    /// Refuses settings out of bounds, naming the setting and its value.
    fn validate(&self) -> Result<(), Error> {
        within("workers", self.workers, 1..=MAX_WORKERS)?;
        within("ack_delay", self.ack_delay, Duration::ZERO..=MAX_ACK_DELAY)?;
        if let Some(interval) = self.stats_interval {
            within("report_stats", interval, STATS_INTERVAL)?;
        }
        let longest = format!("{}-{}", self.settings.name, self.workers - 1);
        self.settings.validate(longest)
    }
}

/// [`Error::InvalidInput`] naming `field` unless `value` lies in `bounds`.
fn within<T: PartialOrd + Debug>(
    field: &'static str,
    value: T,
    bounds: RangeInclusive<T>,
) -> Result<(), Error> {
    if bounds.contains(&value) {
        return Ok(());
    }
    Err(Error::invalid(
        field,
        format!("{value:?}"),
        format!("must be {:?} to {:?}", bounds.start(), bounds.end()),
    ))
}

impl<S: Store + 'static> Dispatcher<S> {
    /// A dispatcher whose workers each call `open` for a store of their own, with the defaults: 1
    /// worker, batches of 64, 30 s leases, [`RetryPolicy::default`], [`ClaimOrder::DueFirst`], polling
    /// every 50 ms when idle, acks grouped for 10 ms ([`Dispatcher::ack_delay`]), the system clock.
    ///
    /// The builder methods keep what they are given; [`Dispatcher::start`] and
    /// [`Dispatcher::run_until_idle`] refuse a setting out of the bounds each method documents with
    /// [`Error::InvalidInput`] naming the setting and its value, before any thread starts.
    pub fn new(
        open: impl Fn() -> Result<S, Error> + Send + Sync + 'static,
        handler: impl Handler,
    ) -> Self {
        Self {
            open: Arc::new(open),
            handler: Arc::new(handler),
            firer: None,
            clock: Arc::new(SystemClock),
            idle: None,
            config: Config {
                settings: DispatcherSettings::new(),
                workers: 1,
                ack_delay: Duration::from_millis(10),
                stats_interval: None,
            },
        }
    }

    dispatcher_settings!();

    /// Applies `change` to the settings shared with the async dispatcher.
    fn configure(mut self, change: impl FnOnce(DispatcherSettings) -> DispatcherSettings) -> Self {
        self.config.settings = change(self.config.settings);
        self
    }

    /// Also fires due timers and failure feedback (`command_failed`, `command_resolved`) into their
    /// workflows through `engine`: replay → decide → commit, each timer exactly once (DESIGN rules
    /// 11–12). Without it, timers wait for a dispatcher that has one, and the dispatcher says so
    /// once through [`Dispatcher::on_error`] (an [`Error::InvalidInput`] naming `workflow`): when a
    /// command that reports its result completes, or, the first time it finds nothing to claim,
    /// when a timer is due (a read). The workers share `engine` and its
    /// state cache, so the workflow's state must be `Send`.
    #[must_use]
    pub fn workflow<W>(mut self, engine: Engine<W>) -> Self
    where
        W: Workflow + Send + Sync + 'static,
        W::State: Send,
    {
        self.firer = Some(Arc::new(engine));
        self
    }

    /// Wakes idle workers through `wakeup` as soon as it says a commit made work, instead of letting
    /// them sleep through their poll interval: what a store crate's constructor (`Dispatcher::sqlite`,
    /// `Dispatcher::postgres`) sets. Polling stays the fallback.
    #[must_use]
    pub fn woken_by(mut self, wakeup: impl Wakeup + 'static) -> Self {
        self.idle = Some(Arc::new(wakeup));
        self
    }

    /// Runs `workers` worker threads: 1 to 256.
    #[must_use]
    pub fn workers(mut self, workers: usize) -> Self {
        self.config.workers = workers;
        self
    }

    /// How long a worker keeps the acks of completed deliveries to write them together: 0 (each on
    /// its own) to 60 s. Larger values group more acks per transaction; a completion is only
    /// reported once durable.
    ///
    /// A worker runs the handlers of its batch one after another. When a handler returns, the
    /// worker writes the acks it has kept if they have waited this long; the rest go with its next
    /// claim. While a handler runs long, the dispatcher's ack thread (`{name}-acks`, on a store of
    /// its own) writes the acks kept before it after about this long (at most twice it), so a slow
    /// delivery does not hold back the completions before it in its batch, nor the results they
    /// feed back into their workflows; the worker reports them (`on_settled`, [`Stats`]) when the
    /// handler returns. 0 writes each ack as its handler returns, with no ack thread.
    #[must_use]
    pub fn ack_delay(mut self, delay: Duration) -> Self {
        self.config.ack_delay = delay;
        self
    }

    /// Also sets the outbox gauges ([`crate::OutboxGauges`]: depth by status and kind, the age of
    /// the oldest due command) from the store's stats every `interval` (10 ms to 1 h), on a thread
    /// of their own with a store of their own. A failed read is reported like any store error. Off
    /// by default: without a metrics recorder there is nobody to read them.
    #[must_use]
    pub fn report_stats(mut self, interval: Duration) -> Self {
        self.config.stats_interval = Some(interval);
        self
    }

    /// Takes `now` from `clock` (a [`miniflow_core::ManualClock`] in tests).
    #[must_use]
    pub fn clock(mut self, clock: Arc<dyn Clock + Send + Sync>) -> Self {
        self.clock = clock;
        self
    }

    /// Runs the workers until none finds a claimable command, then returns what they did. Commands
    /// waiting for a later retry time stay pending, and so do timers whose firing panicked or was
    /// rejected (counted in the stats) until their take runs out.
    ///
    /// # Errors
    ///
    /// - [`Error::InvalidInput`] naming the setting when the configuration is out of bounds; nothing
    ///   is started.
    /// - The first store error a worker stopped on: at once for any kind but [`Error::Busy`] and
    ///   [`Error::Conflict`] (a full or failing disk, a corrupt row, a refused request: waiting does
    ///   not fix them), or the 8th `Busy`/`Conflict` in a row, after backing off between them. The
    ///   other workers then stop as at shutdown: each finishes the delivery in hand and gives back
    ///   the rest of its batch.
    pub fn run_until_idle(&self) -> Result<Stats, Error> {
        let running = self.spawn(true)?;
        running.join_all()
    }

    /// Starts the workers in the background until [`RunningDispatcher::shutdown`]. They ride out store
    /// errors: each is reported to [`Dispatcher::on_error`] and counted, and the worker backs off
    /// (up to 5 s between tries) until the store answers again.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] naming the setting when the configuration is out of bounds; the
    /// store's error when the first store cannot be opened. Nothing is started then.
    pub fn start(self) -> Result<RunningDispatcher, Error> {
        self.spawn(false)
    }

    fn spawn(&self, until_idle: bool) -> Result<RunningDispatcher, Error> {
        self.config.validate()?;
        let settings = &self.config.settings;
        // Open one store up front so a wrong path fails here, not in every thread.
        drop((self.open)()?);
        let mut running = RunningDispatcher {
            stop: Arc::new(AtomicBool::new(false)),
            helpers_stop: Arc::new(AtomicBool::new(false)),
            workers: Vec::with_capacity(self.config.workers),
            heartbeat: None,
            flusher: None,
            acks: None,
            stats: None,
            heartbeat_errors: Arc::new(AtomicU64::new(0)),
        };
        let held = Arc::new(HeldLeases::default());
        let notices = Arc::new(Notices::default());
        // With an ack delay, a flusher writes the acks a worker keeps once they have waited it.
        let board = (!self.config.ack_delay.is_zero())
            .then(|| Arc::new(AckBoard::new(self.config.workers)));
        // On an error the threads already started stop: dropping `running` sets `stop`.
        for n in 0..self.config.workers {
            let worker = Worker {
                books: Books {
                    name: format!("{}-{n}", settings.name),
                    settings: settings.clone(),
                    clock: self.clock.clone(),
                    stop: running.stop.clone(),
                    held: held.clone(),
                    until_idle,
                    fires_timers: self.firer.is_some(),
                    notices: notices.clone(),
                },
                open: self.open.clone(),
                handler: self.handler.clone(),
                firer: self.firer.clone(),
                idle: self.idle.clone(),
                ack_delay: self.config.ack_delay,
                acks: board
                    .as_ref()
                    .map(|board| (board.parked[n].clone(), board.clone())),
            };
            let name = worker.books.name.clone();
            running
                .workers
                .push(spawn_named(name, move || worker.run())?);
        }
        let held_by_flusher = held.clone();
        let heartbeat = Heartbeat {
            open: self.open.clone(),
            on_error: settings.on_error.clone(),
            errors: running.heartbeat_errors.clone(),
            clock: self.clock.clone(),
            lease_ttl: settings.lease_ttl,
            held,
            stop: running.helpers_stop.clone(),
        };
        running.heartbeat = Some(spawn_named(
            format!("{}-heartbeat", settings.name),
            move || heartbeat.run(),
        )?);
        if let Some(board) = &board {
            running.acks = Some(AckReports {
                board: board.clone(),
                observer: settings.observer.clone(),
                on_error: settings.on_error.clone(),
            });
            let flusher = Flusher {
                open: self.open.clone(),
                board: board.clone(),
                held: held_by_flusher,
                on_error: settings.on_error.clone(),
                errors: running.heartbeat_errors.clone(),
                clock: self.clock.clone(),
                delay: self.config.ack_delay,
                stop: running.helpers_stop.clone(),
            };
            running.flusher = Some(spawn_named(format!("{}-acks", settings.name), move || {
                flusher.run()
            })?);
        }
        if let Some(interval) = self.config.stats_interval {
            let reporter = StatsReporter {
                open: self.open.clone(),
                on_error: settings.on_error.clone(),
                errors: running.heartbeat_errors.clone(),
                clock: self.clock.clone(),
                interval,
                stop: running.helpers_stop.clone(),
            };
            running.stats = Some(spawn_named(
                format!("{}-stats", settings.name),
                move || reporter.run(),
            )?);
        }
        Ok(running)
    }
}

/// Starts a thread called `name` running `run`.
fn spawn_named<T: Send + 'static>(
    name: String,
    run: impl FnOnce() -> T + Send + 'static,
) -> Result<JoinHandle<T>, Error> {
    std::thread::Builder::new()
        .name(name)
        .spawn(run)
        .map_err(|e| Error::Storage(Box::new(e)))
}

/// Dispatcher workers running in the background. Dropping it tells them to stop, without waiting
/// for them ([`RunningDispatcher::shutdown`] waits): keep it for as long as they are to run.
#[must_use = "dropping a RunningDispatcher stops its workers at once: keep it, and call `shutdown`"]
pub struct RunningDispatcher {
    /// Tells the workers to stop claiming.
    stop: Arc<AtomicBool>,
    /// Tells the heartbeat, the ack thread and the gauges to stop: only once the workers have
    /// stopped, so the leases of the deliveries a shutdown lets finish are kept, and the last gauges
    /// show what they left.
    helpers_stop: Arc<AtomicBool>,
    workers: Vec<JoinHandle<Result<Stats, Error>>>,
    heartbeat: Option<JoinHandle<()>>,
    /// The thread that writes the acks workers keep while a handler runs long ([`Flusher`]).
    flusher: Option<JoinHandle<()>>,
    /// What the ack thread wrote is reported from (with the observer and error hook) for workers a
    /// shutdown leaves inside a handler.
    acks: Option<AckReports>,
    /// The thread of the outbox gauges ([`Dispatcher::report_stats`]).
    stats: Option<JoinHandle<()>>,
    /// Store errors of the heartbeat, the ack thread and the gauges, added to the workers'
    /// [`Stats::store_errors`].
    heartbeat_errors: Arc<AtomicU64>,
}

/// How a shutdown went.
#[derive(Debug)]
pub struct Shutdown {
    /// What the workers that stopped in time did, and the completions the ack thread wrote for
    /// workers still inside a handler.
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
        // The workers that did not stop in time are left to their leases, which then run out.
        self.helpers_stop.store(true, Ordering::SeqCst);
        // The acks the ack thread wrote for them are durable: reported here, once it has stopped.
        if let Some(flusher) = self.flusher.take() {
            let _ = flusher.join();
        }
        if let Some(acks) = &self.acks {
            acks.report_left(&mut shutdown.stats);
        }
        if shutdown.unfinished_workers == 0 {
            self.join_helpers();
        }
        shutdown.stats.store_errors += self.heartbeat_errors.load(Ordering::SeqCst);
        shutdown
    }

    /// Waits for the heartbeat, the ack thread and the gauges' thread, once told to stop.
    fn join_helpers(&mut self) {
        for thread in [
            self.heartbeat.take(),
            self.flusher.take(),
            self.stats.take(),
        ]
        .into_iter()
        .flatten()
        {
            let _ = thread.join();
        }
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
        self.helpers_stop.store(true, Ordering::SeqCst);
        self.join_helpers();
        stats.store_errors += self.heartbeat_errors.load(Ordering::SeqCst);
        first_error.map_or(Ok(stats), Err)
    }
}

impl Drop for RunningDispatcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.helpers_stop.store(true, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_errors_back_off_from_the_poll_interval_doubling_up_to_a_cap() {
        let ms = Duration::from_millis;
        let pauses: Vec<Duration> = (1..=6).map(|n| error_backoff(ms(50), n)).collect();
        assert_eq!(
            pauses,
            [ms(50), ms(100), ms(200), ms(400), ms(800), ms(1600)]
        );
        assert_eq!(error_backoff(ms(50), 8), ms(5_000));
        assert_eq!(error_backoff(ms(50), u32::MAX), ms(5_000));
        assert_eq!(error_backoff(ms(1), 1), ms(1));
        let slow = Duration::from_secs(60);
        assert_eq!(error_backoff(slow, 1), slow, "never shorter than the poll");
        assert_eq!(error_backoff(slow, 30), slow);
    }

    #[test]
    fn a_heartbeats_answers_are_recorded_lease_by_lease() {
        let id = |n: u32| -> CommandId { format!("w:1:{n}").parse().unwrap() };
        let at = Timestamp::from_millis;
        let delivery = |n: u32| Delivery {
            command_id: id(n),
            kind: "k".into(),
            payload: Value::Null,
            attempt: 1,
            token: 7,
            lease_expires_at: at(100),
            due_at: at(0),
            trace_context: None,
            reports_result: false,
        };
        let held = HeldLeases::default();
        held.hold(&(0..5).map(delivery).collect::<Vec<_>>());
        let due: Vec<_> = (0..5).map(|n| (id(n), 7)).collect();
        let stale = Error::StaleLease {
            command_id: id(1),
            token: 7,
            current: "leased by w2 with token 8".into(),
        };
        let answers = vec![
            Ok(Extended {
                expires_at: at(500),
                cancel_requested: false,
            }),
            Err(stale),
            Ok(Extended {
                expires_at: at(500),
                cancel_requested: true,
            }),
            Err(Error::Busy("locked".into())),
        ];
        let errors = held.extended_all(&due, Ok(answers));
        let reported: Vec<_> = errors.iter().map(|e| e.to_string()).collect();
        assert_eq!(reported.len(), 2, "{reported:?}");
        assert!(reported[0].contains("locked"), "{reported:?}");
        assert!(reported[1].contains("no answer") && reported[1].contains("w:1:4"));
        let leases = held.lock().clone();
        assert_eq!(leases[&id(0)].expires_at, at(500));
        assert!(!leases[&id(0)].lost && !leases[&id(0)].cancel_requested);
        assert!(leases[&id(1)].lost, "a stale answer is a lost lease");
        assert!(leases[&id(2)].cancel_requested);
        for n in [3, 4] {
            let lease = leases[&id(n)];
            assert_eq!(
                (lease.expires_at, lease.lost),
                (at(100), false),
                "w:1:{n} held as it was"
            );
        }
        let failed = held.extended_all(&due, Err(Error::Storage("disk I/O error".into())));
        assert_eq!(failed.len(), 1, "a failed call is one error");
    }

    #[test]
    fn only_busy_and_conflict_are_worth_waiting_for() {
        assert!(is_transient(&Error::Busy("locked".into())));
        assert!(!is_transient(&Error::Storage("disk full".into())));
        assert!(!is_transient(&Error::Corrupt("bad row".into())));
        assert!(!is_transient(&Error::invalid("lease_ttl", 0, "zero")));
    }
}
