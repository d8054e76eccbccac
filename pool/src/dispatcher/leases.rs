//! The leases a dispatcher holds: the heartbeat that extends them, what it learns (a lost lease, a cancellation), and the backoff from store errors.

use super::*;

/// The leases the workers hold right now, shared with the heartbeat.
#[derive(Default)]
pub(super) struct HeldLeases(Mutex<HashMap<CommandId, Held>>);

#[derive(Debug, Clone, Copy)]
pub(super) struct Held {
    pub(super) token: u64,
    pub(super) expires_at: Timestamp,
    pub(super) lost: bool,
    /// The heartbeat learnt that the workflow cancelled the command.
    pub(super) cancel_requested: bool,
}

impl HeldLeases {
    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<CommandId, Held>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn hold(&self, batch: &[Delivery]) {
        let mut held = self.lock();
        for d in batch {
            held.insert(
                d.command_id.clone(),
                Held {
                    token: d.token,
                    expires_at: d.lease_expires_at,
                    lost: false,
                    cancel_requested: false,
                },
            );
        }
    }

    /// Stops tracking `id`; says whether its lease was lost meanwhile.
    pub(super) fn drop_lease(&self, id: &CommandId) -> bool {
        self.lock().remove(id).is_some_and(|h| h.lost)
    }

    pub(super) fn is_lost(&self, id: &CommandId) -> bool {
        self.lock().get(id).is_some_and(|h| h.lost)
    }

    pub(super) fn is_cancel_requested(&self, id: &CommandId) -> bool {
        self.lock().get(id).is_some_and(|h| h.cancel_requested)
    }

    /// The leases past half their TTL at `now`: the ones a heartbeat extends.
    pub(super) fn due_for_extension(&self, now: Timestamp, ttl: Duration) -> Vec<(CommandId, u64)> {
        self.lock()
            .iter()
            .filter(|(_, h)| !h.lost && h.expires_at < now + ttl / 2)
            .map(|(id, h)| (id.clone(), h.token))
            .collect()
    }

    /// Records what extending the lease `token` of `id` gave: a new expiry and whether the workflow
    /// cancelled the command, or a lost lease. Returns the error to report when the store failed (the
    /// lease is still held until it expires: try again next tick).
    pub(super) fn extended(
        &self,
        id: &CommandId,
        token: u64,
        result: Result<Extended, Error>,
    ) -> Option<Error> {
        if let Err(error) = &result {
            if !matches!(error, Error::StaleLease { .. }) {
                return result.err();
            }
        }
        let mut held = self.lock();
        let h = held.get_mut(id).filter(|h| h.token == token)?;
        match result {
            Ok(extended) => {
                h.expires_at = extended.expires_at;
                h.cancel_requested = extended.cancel_requested;
            }
            Err(_) => h.lost = true, // stale: another worker took it over
        }
        None
    }

    /// Records what a heartbeat's one call to extend the leases `due` gave
    /// ([`miniflow_core::Outbox::extend_all`]): each answer as [`HeldLeases::extended`] records it.
    /// Returns the errors to report: the call's when the store failed as a whole, each lease's that
    /// the store failed on, and one for each lease the store gave no answer for (they stay held
    /// until they expire: the next tick tries again).
    pub(super) fn extended_all(
        &self,
        due: &[(CommandId, u64)],
        answers: Result<Vec<Result<Extended, Error>>, Error>,
    ) -> Vec<Error> {
        let mut answers = match answers {
            Ok(answers) => answers.into_iter(),
            Err(error) => return vec![error],
        };
        due.iter()
            .filter_map(|(id, token)| match answers.next() {
                Some(answer) => self.extended(id, *token, answer),
                None => Some(Error::Storage(
                    format!("extend_all gave no answer for the lease of {id}").into(),
                )),
            })
            .collect()
    }
}

thread_local! {
    /// The delivery the current worker thread's handler is running, for [`cancellation_requested`].
    static CURRENT: std::cell::RefCell<Option<(Arc<HeldLeases>, CommandId)>> =
        const { std::cell::RefCell::new(None) };
}

/// Marks the delivery a handler is running on this thread, until dropped.
pub(super) struct CurrentDelivery;

impl CurrentDelivery {
    pub(super) fn enter(held: &Arc<HeldLeases>, id: &CommandId) -> Self {
        CURRENT.with(|current| *current.borrow_mut() = Some((held.clone(), id.clone())));
        CurrentDelivery
    }
}

impl Drop for CurrentDelivery {
    fn drop(&mut self) {
        CURRENT.with(|current| current.borrow_mut().take());
    }
}

/// Whether the workflow of the command this handler is delivering has cancelled it
/// ([`miniflow_core::Decision::cancel_command`]). The dispatcher's heartbeat learns it when it
/// extends the lease; a long handler may check it and stop. Whatever the handler then reports is
/// still recorded — a completion is fed back to the workflow as `command_completed`, a retryable
/// failure leaves the command `cancelled` (on its last attempt too), a permanent failure makes it
/// dead like any other — and the command is not delivered again. It answers in the handlers of
/// both dispatchers, the synchronous one and the [`crate::tokio::AsyncDispatcher`] (inside the
/// handler's own task); outside a handler it is `false`.
///
/// ```no_run
/// use miniflow_core::Delivery;
/// use miniflow_pool::{cancellation_requested, Outcome};
///
/// fn render_video(delivery: &Delivery) -> Outcome {
///     for _frame in 0..10_000 {
///         if cancellation_requested() {
///             return Outcome::retry("cancelled by its workflow");
///         }
///         // … render one frame …
///     }
///     Outcome::Done
/// }
/// ```
pub fn cancellation_requested() -> bool {
    #[cfg(feature = "tokio")]
    if let Some(requested) = super::asynchronous::requested_in_this_task() {
        return requested;
    }
    CURRENT.with(|current| {
        current
            .borrow()
            .as_ref()
            .is_some_and(|(held, id)| held.is_cancel_requested(id))
    })
}

pub(super) struct Heartbeat<S> {
    pub(super) open: Arc<Opener<S>>,
    pub(super) on_error: Option<Arc<ErrorHook>>,
    pub(super) errors: Arc<AtomicU64>,
    pub(super) clock: Arc<dyn Clock + Send + Sync>,
    pub(super) lease_ttl: Duration,
    pub(super) held: Arc<HeldLeases>,
    pub(super) stop: Arc<AtomicBool>,
}

impl<S: Store> Heartbeat<S> {
    /// Every quarter TTL, extends the leases that are past half their TTL, all in one store call; a
    /// stale one is marked lost.
    pub(super) fn run(self) {
        let tick = self.lease_ttl / 4;
        let Some(mut store) = self.open_store(tick) else {
            return;
        };
        while !self.stop.load(Ordering::SeqCst) {
            sleep_unless(&self.stop, tick);
            let now = self.clock.now();
            let due = self.held.due_for_extension(now, self.lease_ttl);
            if due.is_empty() {
                continue;
            }
            let answers = store.extend_all(&due, self.lease_ttl, now);
            for error in self.held.extended_all(&due, answers) {
                self.failed(&error);
            }
        }
    }

    /// Opens the heartbeat's store, reporting each failure and backing off, until it opens or the
    /// dispatcher stops.
    pub(super) fn open_store(&self, tick: Duration) -> Option<S> {
        let mut failures_in_a_row = 0;
        while !self.stop.load(Ordering::SeqCst) {
            match (self.open)() {
                Ok(store) => return Some(store),
                Err(error) => self.failed(&error),
            }
            failures_in_a_row += 1;
            sleep_unless(&self.stop, error_backoff(tick, failures_in_a_row));
        }
        None
    }

    pub(super) fn failed(&self, error: &Error) {
        self.errors.fetch_add(1, Ordering::SeqCst);
        if let Some(hook) = &self.on_error {
            hook(error);
        }
    }
}

/// Sleeps `total`, waking early when `stop` is set.
pub(super) fn sleep_unless(stop: &AtomicBool, total: Duration) {
    let until = Instant::now() + total;
    while !stop.load(Ordering::SeqCst) {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        std::thread::sleep(left.min(Duration::from_millis(5)));
    }
}

/// The pause after the `failures_in_a_row`-th failed store operation in a row (from 1): `base`,
/// doubling per failure, capped at [`MAX_ERROR_BACKOFF`] (or `base`, if longer).
pub(super) fn error_backoff(base: Duration, failures_in_a_row: u32) -> Duration {
    let doublings = failures_in_a_row.saturating_sub(1).min(20);
    base.saturating_mul(1 << doublings)
        .min(base.max(MAX_ERROR_BACKOFF))
}

/// Whether waiting may cure a store error: a lock held by another writer, or a lost race. Anything
/// else (a failing disk, a corrupt row, a refused request, a newer schema) stays as it is.
pub(super) fn is_transient(error: &Error) -> bool {
    matches!(error, Error::Busy(_) | Error::Conflict { .. })
}

/// Sets the outbox gauges from the store's stats every interval, until the dispatcher stops.
pub(super) struct StatsReporter<S> {
    pub(super) open: Arc<Opener<S>>,
    pub(super) on_error: Option<Arc<ErrorHook>>,
    pub(super) errors: Arc<AtomicU64>,
    pub(super) clock: Arc<dyn Clock + Send + Sync>,
    pub(super) interval: Duration,
    pub(super) stop: Arc<AtomicBool>,
}

impl<S: Store> StatsReporter<S> {
    pub(super) fn run(self) {
        let mut gauges = crate::OutboxGauges::default();
        let mut store = None;
        while !self.stop.load(Ordering::SeqCst) {
            if store.is_none() {
                match (self.open)() {
                    Ok(opened) => store = Some(opened),
                    Err(error) => self.failed(&error),
                }
            }
            if let Some(opened) = &store {
                match opened.stats(self.clock.now()) {
                    Ok(stats) => gauges.record(&stats),
                    Err(error) => self.failed(&error),
                }
            }
            sleep_unless(&self.stop, self.interval);
        }
        // Once more as the dispatcher stops, so the gauges show what it left behind (with a store
        // opened now if the dispatcher stopped before this thread had opened one).
        if store.is_none() {
            match (self.open)() {
                Ok(opened) => store = Some(opened),
                Err(error) => self.failed(&error),
            }
        }
        if let Some(opened) = &store {
            match opened.stats(self.clock.now()) {
                Ok(stats) => gauges.record(&stats),
                Err(error) => self.failed(&error),
            }
        }
    }

    fn failed(&self, error: &Error) {
        self.errors.fetch_add(1, Ordering::SeqCst);
        telemetry::store_failed(error);
        if let Some(hook) = &self.on_error {
            hook(error);
        }
    }
}
