//! A worker thread: claim a batch, fire due timers, deliver, settle, report.

use super::*;

/// What one worker knows and how it keeps its books, whichever dispatcher runs it: the synchronous
/// [`Worker`] calls a store, the async dispatcher an [`super::asynchronous::AsyncSource`], and both
/// hand each answer to these methods. What an outcome means, how a settlement is counted, traced
/// and reported, the notices, the backoff after a store error and when a worker of
/// `run_until_idle` gives up are stated here once; nothing here calls a store.
pub(super) struct Books {
    /// The worker's name in its leases.
    pub(super) name: String,
    pub(super) settings: DispatcherSettings,
    pub(super) clock: Arc<dyn Clock + Send + Sync>,
    pub(super) stop: Arc<AtomicBool>,
    pub(super) held: Arc<HeldLeases>,
    pub(super) until_idle: bool,
    /// Whether the dispatcher fires timers (built with a workflow).
    pub(super) fires_timers: bool,
    /// What the dispatcher has told `on_error` once already.
    pub(super) notices: Arc<Notices>,
}

/// A worker thread of the synchronous dispatcher: its books, and the store calls it makes.
pub(super) struct Worker<S> {
    pub(super) books: Books,
    pub(super) open: Arc<Opener<S>>,
    pub(super) handler: Arc<dyn Handler>,
    pub(super) firer: Option<Arc<dyn Firer<S>>>,
    pub(super) idle: Option<Arc<dyn Wakeup>>,
    /// How long the worker keeps acks to write them together ([`Dispatcher::ack_delay`]).
    pub(super) ack_delay: Duration,
    /// Where the worker parks its kept acks while a handler runs, and the board of the flusher that
    /// writes them if they wait too long (none with an `ack_delay` of 0).
    pub(super) acks: Option<(Arc<Parked>, Arc<AckBoard>)>,
}

/// Mistakes of configuration that lose nothing but leave work waiting, each reported once per
/// dispatcher through `on_error` (as [`Error::InvalidInput`]): never silently.
#[derive(Debug, Default)]
pub(super) struct Notices {
    /// A result came back for a command that did not ask for one.
    result_not_asked: AtomicBool,
    /// Feedback for a workflow was scheduled, and this dispatcher fires none.
    feedback_unfired: AtomicBool,
    /// The one look for due timers of a dispatcher that fires none was taken.
    timers_looked_at: AtomicBool,
}

impl Notices {
    /// Whether `notice` is to be reported now: the first time only.
    fn first(notice: &AtomicBool) -> bool {
        // A load first: once reported, a notice costs a delivery no read-modify-write.
        !notice.load(Ordering::Relaxed) && !notice.swap(true, Ordering::SeqCst)
    }
}

/// A completed delivery waiting for its ack, with the handler's result.
pub(super) type Done = (Delivery, Option<Value>);

/// What one worker did, and how its store operations are going.
#[derive(Default)]
pub(super) struct Tally {
    pub(super) stats: Stats,
    /// Store operations that failed in a row, since the last one that succeeded.
    pub(super) failures_in_a_row: u32,
    /// The store error a worker of `run_until_idle` stops on.
    pub(super) fatal: Option<Error>,
}

impl Tally {
    pub(super) fn store_answered(&mut self) {
        self.failures_in_a_row = 0;
    }
}

impl<S: Store> Worker<S> {
    pub(super) fn run(self) -> Result<Stats, Error> {
        let mut tally = Tally::default();
        if let Some(mut store) = self.open_store(&mut tally) {
            self.work(&mut store, &mut tally);
        }
        match tally.fatal {
            Some(error) => Err(error),
            None => Ok(tally.stats),
        }
    }

    /// Opens the worker's store, backing off after each failure, until it opens or the worker halts.
    pub(super) fn open_store(&self, tally: &mut Tally) -> Option<S> {
        while !self.books.halted(tally) {
            match (self.open)() {
                Ok(store) => {
                    tally.store_answered();
                    return Some(store);
                }
                Err(error) => self.books.store_failed(error, tally),
            }
            self.back_off(tally);
        }
        None
    }

    /// Claims and delivers until halted. The acks of a batch's last deliveries go with the claim of
    /// the next batch, in one write.
    pub(super) fn work(&self, store: &mut S, tally: &mut Tally) {
        let books = &self.books;
        let request = books.settings.claim_request(books.name.clone());
        let mut done: Vec<Done> = Vec::new();
        // The `receive` span of the batch `done` belongs to: its acks are settled inside it.
        let mut received = tracing::Span::none();
        while !books.halted(tally) {
            let fired = self.fire_due_timers(store, tally);
            if books.halted(tally) {
                break;
            }
            let mark = self.idle.as_ref().map(|idle| idle.mark());
            let acked = !done.is_empty();
            let claimed = self.settle_and_claim(store, &received, &mut done, &request, tally);
            let Some(batch) = claimed else {
                self.back_off(tally);
                continue;
            };
            if batch.is_empty() && (fired > 0 || acked) {
                // The fired events may have decided new commands or timers, and the acks may have
                // scheduled feedback (`command_completed`) that is due now: look again before idling.
                continue;
            }
            if batch.is_empty() {
                self.notice_unfired_timers(store);
                if books.until_idle {
                    break;
                }
                match (&self.idle, mark) {
                    (Some(idle), Some(mark)) => {
                        idle.wait(mark, books.settings.poll_interval, &books.stop)
                    }
                    _ => sleep_unless(&books.stop, books.settings.poll_interval),
                }
                continue;
            }
            received = books.claimed(&batch, tally);
            let _batch = received.enter();
            self.deliver(store, batch, &mut done, tally);
        }
        let _batch = received.enter();
        self.flush(store, &mut done, tally);
    }

    /// Acknowledges `done` and claims the next batch in one write
    /// ([`miniflow_core::Outbox::complete_all_and_claim`]); `None` when the store failed.
    pub(super) fn settle_and_claim(
        &self,
        store: &mut S,
        received: &tracing::Span,
        done: &mut Vec<Done>,
        request: &ClaimRequest,
        tally: &mut Tally,
    ) -> Option<Vec<Delivery>> {
        let settle = settle_span_of(received, done);
        let acks = take_acks(done);
        let handover = {
            let _settle = settle.enter();
            store.complete_all_and_claim(acks, request, self.books.clock.now())
        };
        self.books.handed_over(&settle, done, handover, tally)
    }

    /// Pauses after a failed store operation, longer with each failure in a row.
    pub(super) fn back_off(&self, tally: &Tally) {
        if let Some(pause) = self.books.error_pause(tally) {
            sleep_unless(&self.books.stop, pause);
        }
    }

    /// Fires the due timers this worker can take; returns how many events it committed.
    pub(super) fn fire_due_timers(&self, store: &mut S, tally: &mut Tally) -> usize {
        let Some(firer) = &self.firer else { return 0 };
        let books = &self.books;
        let (limit, ttl) = (books.settings.batch_size, books.settings.lease_ttl);
        let taken = store.claim_timers(limit, ttl, books.clock.now());
        let mut fired = 0;
        for timer in &books.timers_taken(taken, tally) {
            if books.halted(tally) {
                break; // the rest are taken back when their take runs out
            }
            let now = books.clock.now();
            // A panic in `evolve` or `decide` comes before the commit: nothing was written.
            let firing = catch_unwind(AssertUnwindSafe(|| firer.fire(store, timer, now)));
            if books.timer_fired(timer, firing, tally) {
                fired += 1;
            }
        }
        fired
    }

    /// Delivers a claimed batch: completions are grouped into one transaction per `ack_delay`; the
    /// last ones are left in `done`, for the next claim to acknowledge. While a handler runs, the
    /// acks kept before it are parked, so the flusher writes them once they have waited `ack_delay`
    /// (see [`super::acks`]).
    pub(super) fn deliver(
        &self,
        store: &mut S,
        batch: Vec<Delivery>,
        done: &mut Vec<Done>,
        tally: &mut Tally,
    ) {
        if let Some((_, board)) = &self.acks {
            board.begin_batch();
        }
        let mut since_flush = Instant::now();
        let mut batch = batch.into_iter();
        while let Some(delivery) = batch.next() {
            if self.books.halted(tally) {
                self.flush(store, done, tally);
                let rest: Vec<Delivery> = std::iter::once(delivery).chain(batch).collect();
                self.release(store, &rest, tally);
                break;
            }
            let parked = match &self.acks {
                Some((parked, _)) if !done.is_empty() => {
                    parked.park(done, since_flush, &tracing::Span::current());
                    Some(parked)
                }
                _ => None,
            };
            self.deliver_one(store, delivery, done, tally);
            if let Some(parked) = parked {
                for mut written in parked.unpark(done) {
                    let books = &self.books;
                    books.settled(&written.settle, &mut written.done, written.results, tally);
                    since_flush = Instant::now();
                }
            }
            if since_flush.elapsed() >= self.ack_delay {
                self.flush(store, done, tally);
                since_flush = Instant::now();
            }
        }
        if let Some((_, board)) = &self.acks {
            board.end_batch();
        }
    }

    /// Runs the handler on one delivery inside its `process` span, then queues its ack or settles
    /// its failure.
    fn deliver_one(
        &self,
        store: &mut S,
        delivery: Delivery,
        done: &mut Vec<Done>,
        tally: &mut Tally,
    ) {
        let process = telemetry::process_span(&delivery);
        let _process = process.enter();
        let started = Instant::now();
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            let _current = CurrentDelivery::enter(&self.books.held, &delivery.command_id);
            self.handler.handle(&delivery)
        }));
        telemetry::delivered(
            &process,
            &delivery,
            outcome_name(&outcome),
            started.elapsed(),
        );
        match self.books.judge(&process, &delivery, outcome, tally) {
            Some(Verdict::Done(result)) => done.push((delivery, result)),
            Some(Verdict::Failed(failure)) => self.fail(store, &delivery, failure, tally),
            None => {}
        }
    }

    /// Once per dispatcher that fires no timers, when it first finds nothing to claim: looks
    /// whether timers are due ([`Books::take_look_for_unfired_timers`]).
    pub(super) fn notice_unfired_timers(&self, store: &mut S) {
        if self.books.take_look_for_unfired_timers() {
            let due = store.any_timer_due(self.books.clock.now());
            self.books.looked_for_unfired_timers(due);
        }
    }

    /// Completes `done` in one durable transaction, then reports them.
    pub(super) fn flush(&self, store: &mut S, done: &mut Vec<Done>, tally: &mut Tally) {
        if done.is_empty() {
            return;
        }
        let settle = telemetry::settle_span("complete", done.iter().map(|(d, _)| d));
        let acks = take_acks(done);
        let results = {
            let _settle = settle.enter();
            store.complete_all(acks, self.books.clock.now())
        };
        self.books.settled(&settle, done, results, tally);
    }

    pub(super) fn fail(
        &self,
        store: &mut S,
        delivery: &Delivery,
        failure: Failure,
        tally: &mut Tally,
    ) {
        let settle = telemetry::settle_span("fail", std::iter::once(delivery));
        let _settle = settle.enter();
        let books = &self.books;
        let (id, token, policy) = (&delivery.command_id, delivery.token, &books.settings.policy);
        let result = store.fail(id, token, &failure, policy, books.clock.now());
        books.failed(&settle, delivery, failure, result, tally);
    }

    pub(super) fn release(&self, store: &mut S, rest: &[Delivery], tally: &mut Tally) {
        if rest.is_empty() {
            return;
        }
        let settle = telemetry::settle_span("release", rest.iter());
        let _settle = settle.enter();
        for delivery in rest {
            let now = self.books.clock.now();
            let result = store.release(&delivery.command_id, delivery.token, now);
            self.books.released(delivery, result, tally);
        }
    }
}

impl Books {
    /// Whether the worker is to stop: at shutdown, or on a store error it gives up on.
    pub(super) fn halted(&self, tally: &Tally) -> bool {
        tally.fatal.is_some() || self.stop.load(Ordering::SeqCst)
    }

    /// How long to pause after a failed store operation (the poll interval, doubling with each
    /// failure in a row, capped); `None` when halted.
    pub(super) fn error_pause(&self, tally: &Tally) -> Option<Duration> {
        (!self.halted(tally))
            .then(|| error_backoff(self.settings.poll_interval, tally.failures_in_a_row))
    }

    /// A store operation failed: counts and reports it, and decides whether the worker stops on it
    /// (`run_until_idle` only; the other workers then stop too).
    pub(super) fn store_failed(&self, error: Error, tally: &mut Tally) {
        tally.stats.store_errors += 1;
        telemetry::store_failed(&error);
        tally.failures_in_a_row += 1;
        self.report_error(&error);
        let give_up =
            !is_transient(&error) || tally.failures_in_a_row >= TRANSIENT_ERRORS_TOLERATED;
        if self.until_idle && give_up && tally.fatal.is_none() {
            tally.fatal = Some(error);
            self.stop.store(true, Ordering::SeqCst);
        }
    }

    pub(super) fn report_error(&self, error: &Error) {
        if let Some(hook) = &self.settings.on_error {
            hook(error);
        }
    }

    /// Counts a claimed `batch` and holds its leases for the heartbeat; returns its `receive` span,
    /// the parent of its deliveries and their acks.
    pub(super) fn claimed(&self, batch: &[Delivery], tally: &mut Tally) -> tracing::Span {
        tally.stats.claimed += batch.len() as u64;
        self.held.hold(batch);
        telemetry::received(&self.name, batch, self.clock.now())
    }

    /// Reports the acks of `done` (in `settle`, their span) and returns the claimed batch as
    /// `handover` says; `None` when the store failed (reported).
    pub(super) fn handed_over(
        &self,
        settle: &tracing::Span,
        done: &mut Vec<Done>,
        handover: Result<Handover, Error>,
        tally: &mut Tally,
    ) -> Option<Vec<Delivery>> {
        match handover {
            Ok(handover) => {
                self.settled(settle, done, Ok(handover.completed), tally);
                match handover.claimed {
                    Ok(batch) => {
                        tally.store_answered();
                        Some(batch)
                    }
                    Err(error) => {
                        self.store_failed(error, tally);
                        None
                    }
                }
            }
            Err(error) if done.is_empty() => {
                self.store_failed(error, tally);
                None
            }
            Err(error) => {
                self.settled(settle, done, Err(error), tally);
                None
            }
        }
    }

    /// The due timers a claim of timers took, as `taken` says; none when the store failed
    /// (reported).
    pub(super) fn timers_taken(
        &self,
        taken: Result<Vec<TimerRow>, Error>,
        tally: &mut Tally,
    ) -> Vec<TimerRow> {
        match taken {
            Ok(timers) => {
                tally.store_answered();
                telemetry::timers_due(timers.len());
                timers
            }
            Err(error) => {
                self.store_failed(error, tally);
                Vec::new()
            }
        }
    }

    /// Counts and reports how firing `timer` went (`firing`: the engine's answer, or the panic of
    /// the workflow's code); says whether its event was committed.
    pub(super) fn timer_fired(
        &self,
        timer: &TimerRow,
        firing: std::thread::Result<Result<Option<Handled>, Error>>,
        tally: &mut Tally,
    ) -> bool {
        match firing {
            Ok(Ok(Some(_))) => {
                tally.store_answered();
                tally.stats.timers_fired += 1;
                telemetry::timer_fired();
                true
            }
            Ok(Ok(None)) => {
                tally.store_answered(); // fired by another worker, or cancelled
                false
            }
            Ok(Err(Error::Rejected { reason, .. })) => {
                self.timer_rejected(timer, &reason, tally);
                false
            }
            Ok(Err(error)) => {
                self.store_failed(error, tally);
                false
            }
            Err(panic) => {
                self.timer_panicked(timer, &*panic, tally);
                false
            }
        }
    }

    /// The one place a timer whose event its workflow rejected is handled: counted and reported.
    /// [`Engine::fire`] has already ended the timer `rejected` with the reason, in the store, so it is
    /// not offered again and operators see why (`Store::timers`).
    fn timer_rejected(&self, timer: &TimerRow, reason: &str, tally: &mut Tally) {
        tally.stats.timers_rejected += 1;
        telemetry::timer_failed("rejected");
        self.report_error(&Error::Rejected {
            workflow_id: timer.timer_id.workflow_id().clone(),
            reason: format!("timer {}: {reason}", timer.timer_id),
        });
    }

    /// A timer during whose firing the workflow panicked: nothing was written, the timer stays
    /// scheduled and is offered again when its take runs out. Counted, and reported as a rejection.
    fn timer_panicked(&self, timer: &TimerRow, panic: &(dyn Any + Send), tally: &mut Tally) {
        tally.stats.timer_panics += 1;
        telemetry::timer_failed("panic");
        self.report_error(&Error::Rejected {
            workflow_id: timer.timer_id.workflow_id().clone(),
            reason: format!(
                "the workflow panicked firing timer {}: {}",
                timer.timer_id,
                panic_message(panic)
            ),
        });
    }

    /// How to settle a delivery whose handler returned `outcome` (a panic is a retryable failure,
    /// counted); `None` when its lease was lost meanwhile (reported, and recorded in `process`, its
    /// span: the result is dropped).
    pub(super) fn judge(
        &self,
        process: &tracing::Span,
        delivery: &Delivery,
        outcome: std::thread::Result<Outcome>,
        tally: &mut Tally,
    ) -> Option<Verdict> {
        let outcome = outcome.unwrap_or_else(|panic| {
            tally.stats.panics += 1;
            Outcome::Retry(format!("handler panicked: {}", panic_message(&*panic)))
        });
        if self.held.is_lost(&delivery.command_id) {
            self.held.drop_lease(&delivery.command_id);
            process.record("error.type", "lease_lost");
            self.report(delivery, Settlement::LeaseLost, tally);
            return None;
        }
        let verdict = outcome.verdict();
        self.notice(delivery, &verdict);
        Some(match verdict {
            Verdict::Done(Some(result)) => Verdict::Done(self.kept(process, delivery, result)),
            verdict => verdict,
        })
    }

    /// Reports, once per dispatcher, a verdict whose consequence would otherwise go unnoticed: a
    /// result for a command that did not ask for one (kept on the command, never fed back), and a
    /// result this dispatcher cannot feed back because it fires no timers (built without
    /// [`Dispatcher::workflow`]).
    fn notice(&self, delivery: &Delivery, verdict: &Verdict) {
        let Verdict::Done(result) = verdict else {
            return;
        };
        if result.is_some() && !delivery.reports_result {
            if Notices::first(&self.notices.result_not_asked) {
                self.report_error(&Error::invalid(
                    "result",
                    &delivery.command_id,
                    format!(
                        "a handler returned a result for a command of kind {:?} that did not ask \
                         for one (Command::report_result): the result is kept on the command, and \
                         its workflow is not told (reported once per dispatcher)",
                        delivery.kind
                    ),
                ));
            }
        } else if !self.fires_timers && Notices::first(&self.notices.feedback_unfired) {
            self.report_error(&self.fires_none(&format!(
                "the result of {} is fed back to its workflow as a command_completed event",
                delivery.command_id
            )));
        }
    }

    /// The notice of a dispatcher built without a workflow, for `what` waiting on it.
    fn fires_none(&self, what: &str) -> Error {
        Error::invalid(
            "workflow",
            "none",
            format!(
                "{what}, but this dispatcher fires no timers (built without .workflow(engine)): it \
                 waits for a dispatcher that fires them (reported once per dispatcher)"
            ),
        )
    }

    /// Whether to look now, once per dispatcher that fires no timers, when it first finds nothing
    /// to claim, whether timers or feedback are due (a read,
    /// [`miniflow_core::prelude::Timers::any_timer_due`]); the look is taken when it says so.
    pub(super) fn take_look_for_unfired_timers(&self) -> bool {
        !self.fires_timers && Notices::first(&self.notices.timers_looked_at)
    }

    /// Reports, once per dispatcher, that timers are due to fire and wait for another dispatcher,
    /// as the look for them found (`due`; a failed look says nothing).
    pub(super) fn looked_for_unfired_timers(&self, due: Result<bool, Error>) {
        if due.unwrap_or(false) && Notices::first(&self.notices.feedback_unfired) {
            self.report_error(&self.fires_none("timers are due to fire into their workflows"));
        }
    }

    /// The handler's `result` for `delivery`, if a store keeps it ([`JsonLimits::fed_back`]). One
    /// past the limits is dropped and reported: the handler did its work, so the command is
    /// completed without the result, rather than delivered again (its effect repeated) or failed
    /// (its effect compensated).
    fn kept(&self, process: &tracing::Span, delivery: &Delivery, result: Value) -> Option<Value> {
        let Err(refused) = JsonLimits::fed_back().check("result", &result) else {
            return Some(result);
        };
        process.record("error.type", "result_refused");
        self.report_error(&Error::invalid(
            "result",
            &delivery.command_id,
            format!(
                "the handler's result is not kept, and the command is completed without it: \
                 {refused}"
            ),
        ));
        None
    }

    /// Reports the acks of `done` as `results` says (in `settle`, their span), and stops tracking
    /// their leases. An ack that did not land is a store error: its lease expires and the command is
    /// delivered again.
    pub(super) fn settled(
        &self,
        settle: &tracing::Span,
        done: &mut Vec<Done>,
        results: Result<Vec<Result<(), Error>>, Error>,
        tally: &mut Tally,
    ) {
        if done.is_empty() {
            return;
        }
        let _settle = settle.enter();
        let mut results = match results {
            Ok(results) => {
                tally.store_answered();
                results.into_iter()
            }
            Err(error) => {
                for (delivery, _) in done.drain(..) {
                    self.held.drop_lease(&delivery.command_id);
                }
                telemetry::failed(settle, &error);
                self.store_failed(error, tally);
                return;
            }
        };
        for (delivery, _) in done.drain(..) {
            let delivery = &delivery;
            self.held.drop_lease(&delivery.command_id);
            match results.next().map(settlement_of) {
                Some(Ok(settlement)) => {
                    if settlement == Settlement::LeaseLost {
                        settle.record("error.type", "lease_lost");
                    }
                    self.report(delivery, settlement, tally)
                }
                Some(Err(error)) => self.store_failed(error, tally),
                None => self.store_failed(
                    Error::Storage(
                        format!("complete_all gave no result for {}", delivery.command_id).into(),
                    ),
                    tally,
                ),
            }
        }
    }

    /// Reports how the store settled a failed delivery (in `settle`, its span, which the caller
    /// has entered).
    pub(super) fn failed(
        &self,
        settle: &tracing::Span,
        delivery: &Delivery,
        failure: Failure,
        result: Result<Settled, Error>,
        tally: &mut Tally,
    ) {
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
            Ok(Settled::Cancelled) => Settlement::Cancelled {
                error: failure.error,
            },
            Err(Error::StaleLease { .. }) => Settlement::LeaseLost,
            Err(error) => {
                telemetry::failed(settle, &error);
                return self.store_failed(error, tally);
            }
        };
        if let Some(error_type) = telemetry::settlement_error(&settlement) {
            settle.record("error.type", error_type);
        }
        tally.store_answered();
        self.report(delivery, settlement, tally);
    }

    /// Reports how the store took back an undelivered command.
    pub(super) fn released(
        &self,
        delivery: &Delivery,
        result: Result<(), Error>,
        tally: &mut Tally,
    ) {
        self.held.drop_lease(&delivery.command_id);
        match result {
            Ok(()) => self.report(delivery, Settlement::Released, tally),
            Err(Error::StaleLease { .. }) => {}
            Err(error) => self.store_failed(error, tally),
        }
    }

    pub(super) fn report(&self, delivery: &Delivery, settlement: Settlement, tally: &mut Tally) {
        record(
            &mut tally.stats,
            self.settings.observer.as_deref(),
            delivery,
            settlement,
        );
    }
}

/// The span the acks of `done` are settled in, inside `received` (the `receive` span of their
/// batch); none without acks.
pub(super) fn settle_span_of(received: &tracing::Span, done: &[Done]) -> tracing::Span {
    if done.is_empty() {
        return tracing::Span::none();
    }
    received.in_scope(|| telemetry::settle_span("complete", done.iter().map(|(d, _)| d)))
}

/// Counts a settled delivery in `stats`, records its metrics and tells `observer`.
pub(super) fn record(
    stats: &mut Stats,
    observer: Option<&Observer>,
    delivery: &Delivery,
    settlement: Settlement,
) {
    match &settlement {
        Settlement::Completed => stats.completed += 1,
        Settlement::RetryAt { .. } => stats.retried += 1,
        Settlement::Dead { .. } => stats.dead += 1,
        Settlement::LeaseLost => stats.lost_leases += 1,
        Settlement::Released => stats.released += 1,
        Settlement::Cancelled { .. } => stats.cancelled += 1,
    }
    telemetry::settled(delivery, &settlement);
    if let Some(observer) = observer {
        observer(delivery, &settlement);
    }
}

/// How the store's answer to one ack settles its delivery: completed, or its lease lost (a stale
/// token); any other error is the store's.
pub(super) fn settlement_of(result: Result<(), Error>) -> Result<Settlement, Error> {
    match result {
        Ok(()) => Ok(Settlement::Completed),
        Err(Error::StaleLease { .. }) => Ok(Settlement::LeaseLost),
        Err(error) => Err(error),
    }
}

/// What a handler's call came to, as the delivery metrics name it.
pub(super) fn outcome_name(outcome: &std::thread::Result<Outcome>) -> &'static str {
    match outcome {
        Err(_) => "panic",
        Ok(Outcome::Done | Outcome::DoneWith(_)) => "done",
        Ok(Outcome::Retry(_)) => "retry",
        Ok(Outcome::Permanent(_)) => "permanent",
    }
}

/// The acks of `done`, in order, taking the handlers' results.
pub(super) fn take_acks(done: &mut [Done]) -> Vec<Ack> {
    done.iter_mut()
        .map(|(delivery, result)| Ack {
            command_id: delivery.command_id.clone(),
            token: delivery.token,
            result: result.take(),
        })
        .collect()
}

pub(super) fn panic_message(panic: &(dyn Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic".to_owned())
}
