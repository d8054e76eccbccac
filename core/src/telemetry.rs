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

/// Workflows whose whole history retention deleted (`purge_finished`), their IDs kept as retired: a
/// counter, no label.
pub const WORKFLOWS_RETIRED: &str = "miniflow_workflows_retired_total";

/// The requests the SQLite host's writer thread ran in one transaction (group commit; a group
/// rolled back counts too): a histogram, no label. Small groups under load mean each commit pays for
/// a transaction of its own. A process has one writer per file; all of them record into this one
/// series.
pub const WRITER_GROUP_SIZE: &str = "miniflow_writer_group_size";

/// How long the SQLite host's writer thread took over one group, from its `BEGIN` to its `COMMIT`
/// (the sync of the WAL comes after, off the writer): a histogram in seconds, no label. The rate of
/// its sum is the fraction of time the writer was busy (with several files, their writers' total);
/// near 1 for one file, every write to it waits for its writer.
pub const WRITER_TRANSACTION: &str = "miniflow_writer_transaction_seconds";

/// What kind of value a metric is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    /// Only goes up (Prometheus `counter`).
    Counter,
    /// Goes up and down (Prometheus `gauge`).
    Gauge,
    /// A distribution of observations (Prometheus `histogram`).
    Histogram,
}

/// One metric: its name, kind, unit, labels and what it measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Metric {
    /// The name, e.g. [`RETRIES`].
    pub name: &'static str,
    /// Counter, gauge or histogram.
    pub kind: MetricKind,
    /// `seconds` or `commands` (a count), …
    pub unit: &'static str,
    /// The labels it carries.
    pub labels: &'static [&'static str],
    /// What it measures, in one sentence.
    pub help: &'static str,
}

const fn metric(
    name: &'static str,
    kind: MetricKind,
    unit: &'static str,
    labels: &'static [&'static str],
    help: &'static str,
) -> Metric {
    Metric {
        name,
        kind,
        unit,
        labels,
        help,
    }
}

use MetricKind::{Counter, Gauge, Histogram};

/// Every metric miniflow's hosts record, in the order the README lists them.
pub const METRICS: &[Metric] = &[
    metric(
        OUTBOX_DEPTH,
        Gauge,
        "commands",
        &["status", "kind"],
        "Commands in the outbox by status (pending, leased, dead) and kind.",
    ),
    metric(
        OUTBOX_LAG,
        Gauge,
        "seconds",
        &["kind"],
        "How long the longest-waiting due command has been due.",
    ),
    metric(
        CLAIM_DELAY,
        Histogram,
        "seconds",
        &["kind"],
        "Time from a command's due time to the claim that leased it.",
    ),
    metric(
        DELIVERY_DURATION,
        Histogram,
        "seconds",
        &["kind", "outcome"],
        "Time a handler took to deliver one command, by outcome (done, retry, permanent, panic).",
    ),
    metric(
        DELIVERY_ATTEMPTS,
        Counter,
        "deliveries",
        &["kind"],
        "Deliveries started: commands leased by claims, one attempt each.",
    ),
    metric(
        DELIVERY_ATTEMPT,
        Histogram,
        "attempt",
        &["kind"],
        "The attempt number of each delivery started (1 for a first delivery).",
    ),
    metric(
        COMPLETED,
        Counter,
        "commands",
        &["kind"],
        "Deliveries whose completion was durably recorded.",
    ),
    metric(
        RETRIES,
        Counter,
        "commands",
        &["kind"],
        "Failed deliveries sent back to pending for a later attempt.",
    ),
    metric(
        DEAD_LETTERS,
        Counter,
        "commands",
        &["kind"],
        "Commands that became dead: out of attempts or failed for good.",
    ),
    metric(
        LOST_LEASES,
        Counter,
        "commands",
        &["kind"],
        "Results dropped because the lease was lost before they were written (stale acks).",
    ),
    metric(
        RELEASED,
        Counter,
        "commands",
        &["kind"],
        "Claimed commands given back undelivered.",
    ),
    metric(
        CANCELLED,
        Counter,
        "commands",
        &["kind"],
        "Commands that failed after their workflow cancelled them.",
    ),
    metric(
        HANDLER_PANICS,
        Counter,
        "deliveries",
        &["kind"],
        "Handler calls that panicked.",
    ),
    metric(
        COMMIT_CONFLICTS,
        Counter,
        "commits",
        &[],
        "Commits that lost a race to another commit of the same workflow.",
    ),
    metric(
        TIMERS_DUE,
        Counter,
        "timers",
        &[],
        "Due timers taken by a firer.",
    ),
    metric(
        TIMERS_FIRED,
        Counter,
        "timers",
        &[],
        "Timers whose event was committed into their workflow.",
    ),
    metric(
        TIMER_FAILURES,
        Counter,
        "timers",
        &["reason"],
        "Timer firings that wrote nothing: the workflow rejected the event or panicked.",
    ),
    metric(
        STORE_ERRORS,
        Counter,
        "errors",
        &["code"],
        "Store operations of a dispatcher that failed, by error code.",
    ),
    metric(
        ROWS_PURGED,
        Counter,
        "rows",
        &[],
        "Done and cancelled outbox rows deleted by retention.",
    ),
    metric(
        WORKFLOWS_RETIRED,
        Counter,
        "workflows",
        &[],
        "Finished workflows whose whole history retention deleted.",
    ),
    metric(
        WRITER_GROUP_SIZE,
        Histogram,
        "requests",
        &[],
        "Requests per transaction of the SQLite writer thread (group commit); a rolled-back group counts too.",
    ),
    metric(
        WRITER_TRANSACTION,
        Histogram,
        "seconds",
        &[],
        "Time the SQLite writer thread took over one group; the rate of its sum is how busy it is.",
    ),
];

/// The `tracing` target of every span miniflow's hosts open.
pub const TARGET: &str = "miniflow";
