//! [`DispatcherSettings`]: what both dispatchers are told and the bounds they hold it to, stated
//! once; the builders of both forward their setters of the same names here.

use super::*;

/// The settings the synchronous [`Dispatcher`] and the async dispatcher
/// (`miniflow_pool::tokio::AsyncDispatcher`, feature `tokio`) share: the claims they make, the
/// retry policy, the idle poll, the name in their leases, and who hears of each settlement and
/// error. Each builder has a method of every setter's name that sets it here, and a `settings`
/// method that takes a whole value, so one value can configure several dispatchers.
///
/// The setters keep what they are given; a dispatcher refuses a setting out of the bounds its
/// setter documents when it starts (`start`, `run_until_idle`), with [`Error::InvalidInput`]
/// naming the setting and its value, before anything runs.
///
/// ```
/// use std::time::Duration;
/// use miniflow_core::{Delivery, MemoryStore, RetryPolicy};
/// use miniflow_pool::{Dispatcher, DispatcherSettings, Outcome};
///
/// let settings = DispatcherSettings::new()
///     .batch_size(16)
///     .lease_ttl(Duration::from_secs(10))
///     .retry_policy(RetryPolicy::default().max_attempts(5));
/// let store = MemoryStore::new();
/// let stats = Dispatcher::new(move || Ok(store.clone()), |_: &Delivery| Outcome::Done)
///     .settings(settings.clone())
///     .workers(2)
///     .run_until_idle()?;
/// assert_eq!(stats.claimed, 0);
///
/// let refused = Dispatcher::new(|| Ok(MemoryStore::new()), |_: &Delivery| Outcome::Done)
///     .settings(settings.batch_size(0))
///     .run_until_idle();
/// assert!(refused.unwrap_err().to_string().contains("batch_size"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct DispatcherSettings {
    pub(super) name: String,
    pub(super) batch_size: usize,
    pub(super) lease_ttl: Duration,
    pub(super) policy: RetryPolicy,
    pub(super) order: ClaimOrder,
    pub(super) poll_interval: Duration,
    pub(super) observer: Option<Arc<Observer>>,
    pub(super) on_error: Option<Arc<ErrorHook>>,
}

impl Default for DispatcherSettings {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for DispatcherSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DispatcherSettings")
            .field("name", &self.name)
            .field("batch_size", &self.batch_size)
            .field("lease_ttl", &self.lease_ttl)
            .field("retry_policy", &self.policy)
            .field("order", &self.order)
            .field("poll_interval", &self.poll_interval)
            .field("on_settled", &self.observer.is_some())
            .field("on_error", &self.on_error.is_some())
            .finish()
    }
}

impl DispatcherSettings {
    /// The defaults: workers named `worker-{process ID}`, batches of 64, 30 s leases,
    /// [`RetryPolicy::default`], [`ClaimOrder::DueFirst`], a 50 ms poll when idle, nobody told of
    /// settlements or errors.
    pub fn new() -> Self {
        Self {
            name: format!("worker-{}", std::process::id()),
            batch_size: 64,
            lease_ttl: Duration::from_secs(30),
            policy: RetryPolicy::default(),
            order: ClaimOrder::DueFirst,
            poll_interval: Duration::from_millis(50),
            observer: None,
            on_error: None,
        }
    }

    /// Claims up to `size` commands per write: 1 to [`ClaimRequest::MAX_LIMIT`] (1,000). The async
    /// dispatcher never claims more than it has free delivery slots.
    #[must_use]
    pub fn batch_size(mut self, size: usize) -> Self {
        self.batch_size = size;
        self
    }

    /// Leases each claimed command (and takes each due timer) for `ttl`: 4 ms to
    /// [`ClaimRequest::MAX_LEASE_TTL`] (24 h). The heartbeat extends the leases of the deliveries
    /// in progress every quarter TTL, so the TTL need not cover the slowest delivery; it is how long
    /// the commands of a crashed worker wait before another worker takes them over.
    #[must_use]
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.lease_ttl = ttl;
        self
    }

    /// Retries failures by `policy`, which must pass [`RetryPolicy::validate`] (delays up to 30 days,
    /// a finite multiplier of at least 1, a jitter from 0 to 1).
    #[must_use]
    pub fn retry_policy(mut self, policy: RetryPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Claims in `order`; [`ClaimOrder::StrictPerWorkflow`] delivers a workflow's commands one by one.
    #[must_use]
    pub fn order(mut self, order: ClaimOrder) -> Self {
        self.order = order;
        self
    }

    /// How long an idle dispatcher waits before it looks for due commands again (those committed
    /// by other processes, which do not wake it): 1 ms to 60 s. It is also the first pause after a
    /// failed store operation (see [`DispatcherSettings::on_error`]).
    #[must_use]
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval;
        self
    }

    /// Names the dispatcher in its leases: the synchronous dispatcher's workers are `{name}-{n}`,
    /// the async dispatcher is `name`. Each name must pass [`ClaimRequest::validate`] (1 to 128
    /// bytes, no control characters).
    #[must_use]
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
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

    /// Calls `hook` with each error the dispatcher or its heartbeat meets:
    ///
    /// - a failed store operation (opening a store, claiming, settling, extending a lease, firing a
    ///   timer), also counted in [`Stats::store_errors`];
    /// - a timer whose event its workflow rejected ([`Error::Rejected`], [`Stats::timers_rejected`]);
    /// - a timer during whose firing the workflow panicked, reported as an [`Error::Rejected`] whose
    ///   reason says so ([`Stats::timer_panics`]).
    /// - once per dispatcher, as an [`Error::InvalidInput`]: a handler's result for a command that
    ///   did not ask for one (field `result`: kept on the command, its workflow not told), and
    ///   feedback or timers due while this dispatcher fires none (field `workflow`, see
    ///   [`Dispatcher::workflow`]).
    ///
    /// After a failed store operation the dispatcher pauses before it tries again: the poll
    /// interval, doubling with each failure in a row, up to 5 s (or the poll interval, if longer).
    /// It runs in the middle of the dispatcher's loop (a worker thread, or the async dispatcher's
    /// task): keep it cheap (log, count, send on a channel) and do not panic in it.
    #[must_use]
    pub fn on_error(mut self, hook: impl Fn(&Error) + Send + Sync + 'static) -> Self {
        self.on_error = Some(Arc::new(hook));
        self
    }

    /// The claim of the worker named `worker`.
    pub(super) fn claim_request(&self, worker: String) -> ClaimRequest {
        ClaimRequest::new(worker)
            .limit(self.batch_size)
            .lease_ttl(self.lease_ttl)
            .order(self.order)
            .retry_policy(&self.policy)
    }

    /// Refuses settings out of bounds, naming the setting and its value; `longest_worker` is the
    /// longest name the dispatcher gives a worker in its leases.
    pub(super) fn validate(&self, longest_worker: String) -> Result<(), Error> {
        within("batch_size", self.batch_size, 1..=ClaimRequest::MAX_LIMIT)?;
        within(
            "lease_ttl",
            self.lease_ttl,
            MIN_LEASE_TTL..=ClaimRequest::MAX_LEASE_TTL,
        )?;
        within("poll_interval", self.poll_interval, POLL_INTERVAL)?;
        // Every bound a store checks on a claim, the worker's name among them.
        self.claim_request(longest_worker).validate()?;
        self.policy.validate()
    }
}

/// The builder methods both dispatchers forward to their [`DispatcherSettings`]: stated once, and
/// expanded in each builder's `impl`, whose `configure` applies a change to its settings.
macro_rules! dispatcher_settings {
    () => {
        /// Takes all of `settings` at once, replacing those set before (the builder's other
        /// methods, [`DispatcherSettings`]'s setters, go on changing them).
        #[must_use]
        pub fn settings(self, settings: DispatcherSettings) -> Self {
            self.configure(|_| settings)
        }

        /// Claims up to `size` commands per write: see [`DispatcherSettings::batch_size`].
        #[must_use]
        pub fn batch_size(self, size: usize) -> Self {
            self.configure(|settings| settings.batch_size(size))
        }

        /// Leases each claimed command for `ttl`: see [`DispatcherSettings::lease_ttl`].
        #[must_use]
        pub fn lease_ttl(self, ttl: Duration) -> Self {
            self.configure(|settings| settings.lease_ttl(ttl))
        }

        /// Retries failures by `policy`: see [`DispatcherSettings::retry_policy`].
        #[must_use]
        pub fn retry_policy(self, policy: RetryPolicy) -> Self {
            self.configure(|settings| settings.retry_policy(policy))
        }

        /// Claims in `order`: see [`DispatcherSettings::order`].
        #[must_use]
        pub fn order(self, order: ClaimOrder) -> Self {
            self.configure(|settings| settings.order(order))
        }

        /// Polls every `interval` when idle: see [`DispatcherSettings::poll_interval`].
        #[must_use]
        pub fn poll_interval(self, interval: Duration) -> Self {
            self.configure(|settings| settings.poll_interval(interval))
        }

        /// Names the dispatcher in its leases: see [`DispatcherSettings::name`].
        #[must_use]
        pub fn name(self, name: impl Into<String>) -> Self {
            self.configure(|settings| settings.name(name))
        }

        /// Calls `observer` after each delivery is settled: see [`DispatcherSettings::on_settled`].
        #[must_use]
        pub fn on_settled(
            self,
            observer: impl Fn(&Delivery, &Settlement) + Send + Sync + 'static,
        ) -> Self {
            self.configure(|settings| settings.on_settled(observer))
        }

        /// Calls `hook` with each error met: see [`DispatcherSettings::on_error`].
        #[must_use]
        pub fn on_error(self, hook: impl Fn(&Error) + Send + Sync + 'static) -> Self {
            self.configure(|settings| settings.on_error(hook))
        }
    };
}
