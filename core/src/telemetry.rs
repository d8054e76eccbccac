//! The names of what miniflow's hosts report: metrics (through the `metrics` facade) and spans
//! (through `tracing`, after the OpenTelemetry messaging conventions).
//!
//! The core records nothing itself (it has no I/O and no dependency on either facade); it only
//! names, once, what every host records, so that dashboards work the same over SQLite and
//! PostgreSQL. Times are in seconds, as Prometheus expects. Every label's values are bounded: `kind`
//! is a command kind (what workflows decide), `status` an outbox status, `outcome` one of a fixed
//! few; no metric is labelled with a workflow or command ID.

/// Commands in the outbox by state: a gauge, labels `status` (`pending`, `leased`, `dead`) and
/// `kind`. Done and cancelled rows are not counted (they only grow until purged).
pub const OUTBOX_DEPTH: &str = "miniflow_outbox_depth";

/// How long the longest-waiting due command has been due (the delivery lag): a gauge in seconds,
/// label `kind`; 0 when nothing of the kind is due.
pub const OUTBOX_LAG: &str = "miniflow_outbox_oldest_due_age_seconds";

/// How long a command waited from its due time (its creation, its retry time, or the expiry of the
/// lease taken over) until a claim leased it: a histogram in seconds, label `kind`.
pub const CLAIM_DELAY: &str = "miniflow_claim_delay_seconds";

/// How long a handler took to deliver one command: a histogram in seconds, labels `kind` and
/// `outcome` (`done`, `retry`, `permanent`, `panic`).
pub const DELIVERY_DURATION: &str = "miniflow_delivery_duration_seconds";

/// Deliveries started: one per command a claim leased (each is one attempt), a counter, label
/// `kind`.
pub const DELIVERY_ATTEMPTS: &str = "miniflow_delivery_attempts_total";

/// The attempt number of each delivery started (1 for a first delivery): a histogram, label `kind`.
pub const DELIVERY_ATTEMPT: &str = "miniflow_delivery_attempt";

/// Deliveries whose completion was durably recorded: a counter, label `kind`.
pub const COMPLETED: &str = "miniflow_completed_total";

/// Failed deliveries sent back to pending for a later attempt: a counter, label `kind`.
pub const RETRIES: &str = "miniflow_retries_total";

/// Commands that became dead (out of attempts, or failed for good), waiting for a person: a
/// counter, label `kind`.
pub const DEAD_LETTERS: &str = "miniflow_dead_letters_total";

/// Results dropped because the lease was lost before they were written (a stale ack: the lease
/// expired and another worker took the command over): a counter, label `kind`.
pub const LOST_LEASES: &str = "miniflow_lost_leases_total";

/// Claimed commands given back undelivered (shutdown, or a worker stopping on an error): a counter,
/// label `kind`.
pub const RELEASED: &str = "miniflow_released_total";

/// Commands that failed after their workflow cancelled them, and so ended cancelled: a counter,
/// label `kind`.
pub const CANCELLED: &str = "miniflow_cancelled_total";

/// Handler calls that panicked (each also a retryable failure): a counter, label `kind`.
pub const HANDLER_PANICS: &str = "miniflow_handler_panics_total";

/// Commits that lost a race: the workflow's last seq had moved on (the engine replays, decides and
/// tries again, a bounded number of times): a counter, no label.
pub const COMMIT_CONFLICTS: &str = "miniflow_commit_conflicts_total";

/// Due timers taken by a firer (feedback timers included): a counter, no label.
pub const TIMERS_DUE: &str = "miniflow_timers_due_total";

/// Timers whose event was committed into their workflow: a counter, no label.
pub const TIMERS_FIRED: &str = "miniflow_timers_fired_total";

/// Timer firings that wrote nothing because the workflow rejected the event or panicked: a
/// counter, label `reason` (`rejected`, `panic`).
pub const TIMER_FAILURES: &str = "miniflow_timer_failures_total";

/// Store operations of a dispatcher that failed (each passed to its error hook): a counter, label
/// `code` (the error's [`crate::Error::code`], e.g. `BUSY`, `STORAGE`).
pub const STORE_ERRORS: &str = "miniflow_store_errors_total";

/// Done and cancelled outbox rows deleted by retention (`purge_done`): a counter, no label.
pub const ROWS_PURGED: &str = "miniflow_rows_purged_total";

/// Every metric name above, in the order the README lists them.
pub const METRICS: &[&str] = &[
    OUTBOX_DEPTH,
    OUTBOX_LAG,
    CLAIM_DELAY,
    DELIVERY_DURATION,
    DELIVERY_ATTEMPTS,
    DELIVERY_ATTEMPT,
    COMPLETED,
    RETRIES,
    DEAD_LETTERS,
    LOST_LEASES,
    RELEASED,
    CANCELLED,
    HANDLER_PANICS,
    COMMIT_CONFLICTS,
    TIMERS_DUE,
    TIMERS_FIRED,
    TIMER_FAILURES,
    STORE_ERRORS,
    ROWS_PURGED,
];

/// The `tracing` target of every span miniflow's hosts open.
pub const TARGET: &str = "miniflow";
