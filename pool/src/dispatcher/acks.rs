//! Acks that wait while a handler runs: a worker parks its kept acks before each handler call, and
//! the dispatcher's ack thread (the [`Flusher`]) writes those that have waited `ack_delay` while the
//! handler is still running. So a long handler does not hold back the acks of the deliveries before it in its batch
//! (nor the results they feed back into their workflows); the worker reports what the flusher wrote
//! once its handler returns.

use std::sync::Condvar;

use super::*;

/// Acks the flusher wrote for a worker, with how the store answered, for the worker to report.
pub(super) struct Written {
    pub(super) settle: tracing::Span,
    pub(super) done: Vec<Done>,
    pub(super) results: Result<Vec<Result<(), Error>>, Error>,
}

#[derive(Default)]
struct Slot {
    /// The acks parked while the worker's handler runs.
    done: Vec<Done>,
    /// Since when the parked acks have waited (the worker's last write of acks).
    since: Option<Instant>,
    /// The `receive` span of the batch the parked acks belong to.
    received: Option<tracing::Span>,
    /// The flusher is writing acks it took from this slot.
    writing: bool,
    written: Vec<Written>,
}

/// One worker's parking place, shared with the flusher.
#[derive(Default)]
pub(super) struct Parked {
    slot: Mutex<Slot>,
    /// Signalled when the flusher's write for this slot is over.
    written: Condvar,
}

impl Parked {
    fn lock(&self) -> std::sync::MutexGuard<'_, Slot> {
        self.slot.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Parks `done` (kept since `since`, of the batch `received`) for the length of a handler call.
    pub(super) fn park(&self, done: &mut Vec<Done>, since: Instant, received: &tracing::Span) {
        let mut slot = self.lock();
        slot.done = std::mem::take(done);
        slot.since = Some(since);
        slot.received = Some(received.clone());
    }

    /// Takes back what the flusher did not write, in front of `done` (once a write of the flusher
    /// for this slot is over), and returns what it wrote.
    pub(super) fn unpark(&self, done: &mut Vec<Done>) -> Vec<Written> {
        let mut slot = self.lock();
        while slot.writing {
            slot = self
                .written
                .wait(slot)
                .unwrap_or_else(PoisonError::into_inner);
        }
        let mut kept = std::mem::take(&mut slot.done);
        kept.append(done);
        *done = kept;
        slot.since = None;
        slot.received = None;
        std::mem::take(&mut slot.written)
    }

    /// The parked acks if they have waited `delay` at `now`, marked as being written.
    fn take_due(&self, now: Instant, delay: Duration) -> Option<(Vec<Done>, tracing::Span)> {
        let mut slot = self.lock();
        let due = slot
            .since
            .is_some_and(|since| now.saturating_duration_since(since) >= delay);
        if !due || slot.done.is_empty() || slot.writing {
            return None;
        }
        slot.writing = true;
        let received = slot.received.clone().unwrap_or_else(tracing::Span::none);
        Some((std::mem::take(&mut slot.done), received))
    }

    /// Gives back acks the flusher took but could not write.
    fn put_back(&self, mut done: Vec<Done>) {
        let mut slot = self.lock();
        done.append(&mut slot.done);
        slot.done = done;
        slot.writing = false;
        drop(slot);
        self.written.notify_all();
    }

    /// Hands the outcome of a write to the worker.
    fn wrote(&self, written: Written) {
        let mut slot = self.lock();
        slot.written.push(written);
        slot.writing = false;
        slot.since = Some(Instant::now());
        drop(slot);
        self.written.notify_all();
    }
}

/// The workers' parking places and how many workers are delivering a batch, shared with the
/// flusher, which sleeps while none is.
#[derive(Default)]
pub(super) struct AckBoard {
    pub(super) parked: Vec<Arc<Parked>>,
    delivering: Mutex<usize>,
    started: Condvar,
}

impl AckBoard {
    pub(super) fn new(workers: usize) -> Self {
        Self {
            parked: (0..workers).map(|_| Arc::default()).collect(),
            ..Self::default()
        }
    }

    /// A worker begins delivering a batch; the flusher wakes for the first.
    pub(super) fn begin_batch(&self) {
        let mut delivering = self
            .delivering
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        *delivering += 1;
        if *delivering == 1 {
            self.started.notify_all();
        }
    }

    /// A worker is done delivering a batch.
    pub(super) fn end_batch(&self) {
        let mut delivering = self
            .delivering
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        *delivering = delivering.saturating_sub(1);
    }

    /// Waits until a worker delivers a batch (or `stop`, checked every 100 ms); says whether one is.
    fn wait_for_batches(&self, stop: &AtomicBool) -> bool {
        let mut delivering = self
            .delivering
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        while *delivering == 0 {
            if stop.load(Ordering::SeqCst) {
                return false;
            }
            delivering = self
                .started
                .wait_timeout(delivering, Duration::from_millis(100))
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        !stop.load(Ordering::SeqCst)
    }
}

/// The dispatcher's ack thread: while workers deliver, every `ack_delay` it writes the parked
/// acks that have waited that long, on a store of its own. It opens its store before it takes any
/// acks, so a slow or failing open never holds a worker back; a failure to open, and a panic of the
/// store, are reported like the heartbeat's errors, and the acks it took are given back to their
/// worker, which writes them itself.
pub(super) struct Flusher<S> {
    pub(super) open: Arc<Opener<S>>,
    pub(super) board: Arc<AckBoard>,
    pub(super) held: Arc<HeldLeases>,
    pub(super) on_error: Option<Arc<ErrorHook>>,
    pub(super) errors: Arc<AtomicU64>,
    pub(super) clock: Arc<dyn Clock + Send + Sync>,
    pub(super) delay: Duration,
    pub(super) stop: Arc<AtomicBool>,
}

impl<S: Store> Flusher<S> {
    pub(super) fn run(self) {
        let tick = self.delay.max(Duration::from_millis(1));
        let mut store: Option<S> = None;
        let mut failures_in_a_row = 0;
        while self.board.wait_for_batches(&self.stop) {
            sleep_unless(&self.stop, tick);
            let Some(opened) = store.as_mut() else {
                match catch_unwind(AssertUnwindSafe(|| (self.open)())) {
                    Ok(Ok(opened)) => {
                        store = Some(opened);
                        failures_in_a_row = 0;
                    }
                    Ok(Err(error)) => self.failed(&error, &mut failures_in_a_row, tick),
                    Err(panic) => {
                        self.panicked("opening its store", &*panic, &mut failures_in_a_row, tick)
                    }
                }
                continue;
            };
            let now = Instant::now();
            for parked in &self.board.parked {
                let Some((mut done, received)) = parked.take_due(now, self.delay) else {
                    continue;
                };
                let settle = received
                    .in_scope(|| telemetry::settle_span("complete", done.iter().map(|(d, _)| d)));
                let acks = take_acks(&mut done);
                // A copy goes to the store: a panic inside it must not lose the results, which go
                // back to the worker with its acks.
                let written = catch_unwind(AssertUnwindSafe(|| {
                    let _settle = settle.enter();
                    opened.complete_all(acks.clone(), self.clock.now())
                }));
                match written {
                    Ok(results) => {
                        for (delivery, _) in &done {
                            // The heartbeat no longer extends them; the worker reports them.
                            self.held.drop_lease(&delivery.command_id);
                        }
                        parked.wrote(Written {
                            settle,
                            done,
                            results,
                        });
                    }
                    Err(panic) => {
                        for ((_, result), ack) in done.iter_mut().zip(acks) {
                            *result = ack.result;
                        }
                        parked.put_back(done);
                        self.panicked("writing acks", &*panic, &mut failures_in_a_row, tick);
                        store = None; // a store that panicked is not used again
                        break;
                    }
                }
            }
        }
    }

    /// A store operation of the ack thread failed: counted with the heartbeat's errors, reported,
    /// and backed off from.
    fn failed(&self, error: &Error, failures_in_a_row: &mut u32, tick: Duration) {
        self.errors.fetch_add(1, Ordering::SeqCst);
        telemetry::store_failed(error);
        if let Some(hook) = &self.on_error {
            hook(error);
        }
        *failures_in_a_row += 1;
        sleep_unless(&self.stop, error_backoff(tick, *failures_in_a_row));
    }

    fn panicked(
        &self,
        doing: &str,
        panic: &(dyn Any + Send),
        failures_in_a_row: &mut u32,
        tick: Duration,
    ) {
        let error = Error::Storage(
            format!(
                "the ack thread panicked {doing}: {}; its worker writes the acks itself",
                panic_message(panic)
            )
            .into(),
        );
        self.failed(&error, failures_in_a_row, tick);
    }
}

/// What a shutdown reports the ack thread's writes to, for workers it leaves inside a handler.
pub(super) struct AckReports {
    pub(super) board: Arc<AckBoard>,
    pub(super) observer: Option<Arc<Observer>>,
    pub(super) on_error: Option<Arc<ErrorHook>>,
}

impl AckReports {
    /// Reports what the ack thread wrote for workers still inside a handler at a shutdown's
    /// deadline (each parked slot's outcomes, taken so their worker does not report them again),
    /// into `stats`.
    pub(super) fn report_left(&self, stats: &mut Stats) {
        let (observer, on_error) = (self.observer.as_deref(), self.on_error.as_deref());
        report_left(&self.board, observer, on_error, stats);
    }
}

fn report_left(
    board: &AckBoard,
    observer: Option<&Observer>,
    on_error: Option<&ErrorHook>,
    stats: &mut Stats,
) {
    for parked in &board.parked {
        let written = std::mem::take(&mut parked.lock().written);
        for written in written {
            let _settle = written.settle.enter();
            let results = match written.results {
                Ok(results) => results,
                Err(error) => {
                    stats.store_errors += 1;
                    telemetry::store_failed(&error);
                    if let Some(hook) = on_error {
                        hook(&error);
                    }
                    continue;
                }
            };
            for ((delivery, _), result) in written.done.iter().zip(results) {
                match settlement_of(result) {
                    Ok(settlement) => record(stats, observer, delivery, settlement),
                    Err(error) => {
                        stats.store_errors += 1;
                        telemetry::store_failed(&error);
                        if let Some(hook) = on_error {
                            hook(&error);
                        }
                    }
                }
            }
        }
    }
}
