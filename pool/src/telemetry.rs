//! Spans (`tracing`) and metrics (`metrics`) of the dispatcher, and the ones every store records
//! alike (the `send` span of a commit, rows purged, workflows retired): store authors call
//! [`send_span`], [`committed`], [`purged`] and [`retired`] so that every store reports the same.
//!
//! Both facades are silent and cheap until the application installs a subscriber or a recorder:
//! a span that no subscriber wants is a relaxed atomic load, its fields are never computed, and a
//! metric without a recorder goes nowhere. The names are [`miniflow_core::telemetry`]'s.
//!
//! Spans follow the OpenTelemetry messaging conventions (`messaging.system = "miniflow"`, target
//! `miniflow`), and each carries the workflow ID (`miniflow.workflow.id`; a batch lists its
//! workflows, comma-separated):
//!
//! | span | when | fields |
//! |---|---|---|
//! | `send` | a commit writes an event and its commands | `messaging.operation.type = "send"`, `messaging.batch.message_count`, `messaging.destination.name` (when the commands share one kind), `miniflow.event.seq`, `miniflow.traceparent` (the context stored with the commands), `error.type` |
//! | `receive` | a claim leased a batch (idle polls make no span); the parent of the batch's `process` and `settle` spans | `messaging.operation.type = "receive"`, `messaging.batch.message_count`, `messaging.client.id` (the worker) |
//! | `process` | a handler delivers one command | `messaging.operation.type = "process"`, `messaging.message.id` (the command ID), `messaging.destination.name` (the kind), `miniflow.attempt`, `miniflow.traceparent` (the producer's context), `error.type` (`retry`, `permanent`, `panic`, `lease_lost`) |
//! | `settle` | a delivery is settled | `messaging.operation.type = "settle"`, `messaging.operation.name` (`complete`, `fail`, `release`), `messaging.batch.message_count`, `error.type` (`retry`, `dead`, `cancelled`, `lease_lost` or a store error's code) |

use std::collections::BTreeSet;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use metrics::gauge;
use metrics::{counter, histogram};
use miniflow_core::telemetry as names;
use miniflow_core::{Commit, Delivery, Error, OutboxStats, Timestamp, TraceContext};
use tracing::field::Empty;
use tracing::Span;

/// A new trace: a W3C trace context with a random trace ID and span ID, sampled. Start one where
/// work enters the system without a trace of its own (a request without a `traceparent` header)
/// and commit with it ([`miniflow_core::Engine::handle_traced`], [`miniflow_core::Commit::traced`]);
/// each delivery then carries it to the receiver. No tracing system is needed for that: the trace
/// ID alone ties the producer's logs to the receiver's.
///
/// The IDs come from the standard library's randomly keyed SipHash over a process-wide counter:
/// unique enough for tracing, not for secrets.
///
/// ```
/// let trace = miniflow_pool::new_trace_context();
/// assert!(trace.sampled());
/// assert_ne!(trace.trace_id(), miniflow_pool::new_trace_context().trace_id());
/// ```
pub fn new_trace_context() -> TraceContext {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let keys = std::collections::hash_map::RandomState::new();
    let random = || {
        let mut hasher = keys.build_hasher();
        hasher.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
        hasher.finish().to_le_bytes()
    };
    let (a, b, c) = (random(), random(), random());
    let mut trace_id = [0; 16];
    trace_id[..8].copy_from_slice(&a);
    trace_id[8..].copy_from_slice(&b);
    // All zeros is the one invalid value; a 2^-64 chance, made impossible.
    let span_id = if c == [0; 8] { [1; 8] } else { c };
    if trace_id == [0; 16] {
        trace_id[15] = 1;
    }
    TraceContext::new(trace_id, span_id, 0x01).expect("non-zero IDs")
}

/// Describes every metric of [`miniflow_core::telemetry::METRICS`] to the installed recorder: its
/// unit and what it measures (a Prometheus exporter turns them into `# HELP` lines). Call it once,
/// after installing the recorder; without one it does nothing.
pub fn describe_metrics() {
    use miniflow_core::telemetry::MetricKind;
    for metric in names::METRICS {
        let unit = match metric.unit {
            "seconds" => metrics::Unit::Seconds,
            _ => metrics::Unit::Count,
        };
        match metric.kind {
            MetricKind::Counter => metrics::describe_counter!(metric.name, unit, metric.help),
            MetricKind::Gauge => metrics::describe_gauge!(metric.name, unit, metric.help),
            MetricKind::Histogram => metrics::describe_histogram!(metric.name, unit, metric.help),
        }
    }
}

/// The outbox gauges: depth by status and kind ([`names::OUTBOX_DEPTH`]) and the age of the
/// oldest due command by kind ([`names::OUTBOX_LAG`]), set from a store's
/// [`miniflow_core::prelude::Operations::stats`]. It remembers the kinds it reported, so a kind
/// whose commands are all done drops to 0 instead of keeping its last values.
///
/// [`crate::Dispatcher::report_stats`] records them every interval; or call [`OutboxGauges::record`]
/// yourself, e.g. before each scrape:
///
/// ```
/// use miniflow_core::prelude::*;
/// use miniflow_core::{Clock, MemoryStore};
/// use miniflow_pool::{OutboxGauges, SystemClock};
///
/// let store = MemoryStore::new();
/// let mut gauges = OutboxGauges::default();
/// gauges.record(&store.stats(SystemClock.now())?);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Default)]
pub struct OutboxGauges {
    reported: BTreeSet<String>,
}

impl OutboxGauges {
    /// Sets the gauges to `stats`: pending, leased and dead commands by kind, and for each kind how
    /// long its oldest claimable command has been due (0 when none is). Kinds reported before and
    /// absent now are set to 0.
    pub fn record(&mut self, stats: &OutboxStats) {
        let mut now_reported = BTreeSet::new();
        for kind in &stats.kinds {
            let age = kind.oldest_due.map_or(0.0, |since| {
                stats.now.as_millis().saturating_sub(since.as_millis()) as f64 / 1_000.0
            });
            set_kind(&kind.kind, [kind.pending, kind.leased, kind.dead], age);
            now_reported.insert(kind.kind.clone());
        }
        for gone in self.reported.difference(&now_reported) {
            set_kind(gone, [0, 0, 0], 0.0);
        }
        self.reported = now_reported;
    }
}

fn set_kind(kind: &str, [pending, leased, dead]: [u64; 3], age: f64) {
    for (status, count) in [("pending", pending), ("leased", leased), ("dead", dead)] {
        gauge!(names::OUTBOX_DEPTH, "status" => status, "kind" => kind.to_owned())
            .set(count as f64);
    }
    gauge!(names::OUTBOX_LAG, "kind" => kind.to_owned()).set(age);
}

/// The span of a commit (`send`), with what can be said before it is written: a store enters it
/// around the commit's write and passes the outcome to [`committed`].
pub fn send_span(commit: &Commit) -> Span {
    let span = tracing::info_span!(
        target: "miniflow",
        "send",
        otel.name = "send outbox",
        otel.kind = "producer",
        messaging.system = "miniflow",
        messaging.operation.type = "send",
        messaging.operation.name = "commit",
        messaging.batch.message_count = commit.commands().len(),
        messaging.destination.name = Empty,
        miniflow.workflow.id = %commit.workflow_id(),
        miniflow.event.seq = commit.last_seq().get(),
        miniflow.traceparent = Empty,
        error.type = Empty,
    );
    if !span.is_disabled() {
        if let Some(first) = commit.commands().first() {
            if commit.commands().iter().all(|row| row.kind == first.kind) {
                span.record("messaging.destination.name", first.kind.as_str());
            }
        }
        if let Some(context) = commit.trace_context() {
            span.record("miniflow.traceparent", context.traceparent());
        }
    }
    span
}

/// Records how a commit went: a lost race counts as a commit conflict.
pub fn committed(span: &Span, result: &Result<(), Error>) {
    if let Err(error) = result {
        if matches!(error, Error::Conflict { .. }) {
            counter!(names::COMMIT_CONFLICTS).increment(1);
        }
        failed(span, error);
    }
}

/// Records a store error's code as the span's `error.type`.
pub fn failed(span: &Span, error: &Error) {
    span.record("error.type", error.code());
}

/// Counts rows deleted by retention.
pub fn purged(rows: usize) {
    if rows > 0 {
        counter!(names::ROWS_PURGED).increment(rows as u64);
    }
}

/// Counts workflows retired by retention.
pub fn retired(workflows: usize) {
    if workflows > 0 {
        counter!(names::WORKFLOWS_RETIRED).increment(workflows as u64);
    }
}

/// The span of a claimed batch (`receive`), and the metrics of each claimed command: one attempt,
/// its attempt number, and how long it waited since it was due.
pub(crate) fn received(worker: &str, batch: &[Delivery], now: Timestamp) -> Span {
    for delivery in batch {
        let kind = delivery.kind.clone();
        counter!(names::DELIVERY_ATTEMPTS, "kind" => kind.clone()).increment(1);
        histogram!(names::DELIVERY_ATTEMPT, "kind" => kind.clone())
            .record(f64::from(delivery.attempt));
        let waited = now.as_millis().saturating_sub(delivery.due_at.as_millis());
        histogram!(names::CLAIM_DELAY, "kind" => kind).record(waited as f64 / 1_000.0);
    }
    let span = tracing::info_span!(
        target: "miniflow",
        "receive",
        otel.name = "receive outbox",
        otel.kind = "consumer",
        messaging.system = "miniflow",
        messaging.operation.type = "receive",
        messaging.operation.name = "claim",
        messaging.batch.message_count = batch.len(),
        messaging.client.id = worker,
        miniflow.workflow.id = Empty,
    );
    if !span.is_disabled() {
        span.record("miniflow.workflow.id", workflows(batch.iter()));
    }
    span
}

/// The distinct workflows of `deliveries`, in order, comma-separated.
pub(crate) fn workflows<'a>(deliveries: impl Iterator<Item = &'a Delivery>) -> String {
    let mut out: Vec<&str> = Vec::new();
    for delivery in deliveries {
        let workflow = delivery.command_id.workflow_id().as_str();
        if !out.contains(&workflow) {
            out.push(workflow);
        }
    }
    out.join(",")
}

/// The span of one delivery (`process`); the handler runs inside it.
pub(crate) fn process_span(delivery: &Delivery) -> Span {
    let span = tracing::info_span!(
        target: "miniflow",
        "process",
        otel.name = %format_args!("process {}", delivery.kind),
        otel.kind = "consumer",
        messaging.system = "miniflow",
        messaging.operation.type = "process",
        messaging.message.id = %delivery.command_id,
        messaging.destination.name = %delivery.kind,
        miniflow.workflow.id = %delivery.command_id.workflow_id(),
        miniflow.attempt = delivery.attempt,
        miniflow.traceparent = Empty,
        error.type = Empty,
    );
    if !span.is_disabled() {
        if let Some(context) = &delivery.trace_context {
            span.record("miniflow.traceparent", context.traceparent());
        }
    }
    span
}

/// Records how long a handler took and how it went (`done`, `retry`, `permanent`, `panic`).
pub(crate) fn delivered(span: &Span, delivery: &Delivery, outcome: &'static str, took: Duration) {
    histogram!(
        names::DELIVERY_DURATION,
        "kind" => delivery.kind.clone(),
        "outcome" => outcome,
    )
    .record(took.as_secs_f64());
    if outcome == "panic" {
        counter!(names::HANDLER_PANICS, "kind" => delivery.kind.clone()).increment(1);
    }
    if outcome != "done" {
        span.record("error.type", outcome);
    }
}

/// The span of a settlement (`settle`): `complete` (a batch of acks), `fail` or `release`.
pub(crate) fn settle_span<'a>(
    operation: &'static str,
    deliveries: impl Iterator<Item = &'a Delivery> + Clone,
) -> Span {
    let span = tracing::info_span!(
        target: "miniflow",
        "settle",
        otel.name = %format_args!("{operation} outbox"),
        messaging.system = "miniflow",
        messaging.operation.type = "settle",
        messaging.operation.name = operation,
        messaging.batch.message_count = Empty,
        messaging.message.id = Empty,
        miniflow.workflow.id = Empty,
        error.type = Empty,
    );
    if !span.is_disabled() {
        let count = deliveries.clone().count();
        span.record("messaging.batch.message_count", count);
        if count == 1 {
            if let Some(delivery) = deliveries.clone().next() {
                span.record("messaging.message.id", delivery.command_id.to_string());
            }
        }
        span.record("miniflow.workflow.id", workflows(deliveries));
    }
    span
}

/// The counter a settlement adds to, by its name in [`crate::Settlement`].
pub(crate) fn settled(delivery: &Delivery, settlement: &crate::Settlement) {
    use crate::Settlement;
    let name = match settlement {
        Settlement::Completed => names::COMPLETED,
        Settlement::RetryAt { .. } => names::RETRIES,
        Settlement::Dead { .. } => names::DEAD_LETTERS,
        Settlement::LeaseLost => names::LOST_LEASES,
        Settlement::Released => names::RELEASED,
        Settlement::Cancelled { .. } => names::CANCELLED,
    };
    counter!(name, "kind" => delivery.kind.clone()).increment(1);
}

/// `error.type` of a settlement that did not complete, if any.
pub(crate) fn settlement_error(settlement: &crate::Settlement) -> Option<&'static str> {
    use crate::Settlement;
    match settlement {
        Settlement::Completed | Settlement::Released => None,
        Settlement::RetryAt { .. } => Some("retry"),
        Settlement::Dead { .. } => Some("dead"),
        Settlement::LeaseLost => Some("lease_lost"),
        Settlement::Cancelled { .. } => Some("cancelled"),
    }
}

/// Counts a failed store operation of a dispatcher by its code.
pub(crate) fn store_failed(error: &Error) {
    counter!(names::STORE_ERRORS, "code" => error.code()).increment(1);
}

/// Counts timers taken by a firer.
pub(crate) fn timers_due(count: usize) {
    if count > 0 {
        counter!(names::TIMERS_DUE).increment(count as u64);
    }
}

/// Counts a timer whose event was committed.
pub(crate) fn timer_fired() {
    counter!(names::TIMERS_FIRED).increment(1);
}

/// Counts a timer firing that wrote nothing (`rejected` or `panic`).
pub(crate) fn timer_failed(reason: &'static str) {
    counter!(names::TIMER_FAILURES, "reason" => reason).increment(1);
}
