//! The PostgreSQL store's spans and metrics: the commit's `send` span, commit conflicts and rows
//! purged, under the names of [`miniflow_core::telemetry`] and with the fields of the native
//! host's `send` span (the dispatcher's spans are the dispatcher's, whatever its store).

use metrics::counter;
use miniflow_core::telemetry as names;
use miniflow_core::{Commit, Error};
use tracing::field::Empty;
use tracing::Span;

/// The span of a commit (`send`), after the OpenTelemetry messaging conventions.
pub(crate) fn send_span(commit: &Commit) -> Span {
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

/// Writes `commit` with `write` inside its `send` span; a lost race counts as a commit conflict.
pub(crate) fn sending(
    commit: &Commit,
    write: impl FnOnce() -> Result<(), Error>,
) -> Result<(), Error> {
    let span = send_span(commit);
    let _send = span.enter();
    let result = write();
    if let Err(error) = &result {
        if matches!(error, Error::Conflict { .. }) {
            counter!(names::COMMIT_CONFLICTS).increment(1);
        }
        span.record("error.type", error.code());
    }
    result
}

/// Counts rows deleted by retention.
pub(crate) fn purged(rows: usize) {
    if rows > 0 {
        counter!(names::ROWS_PURGED).increment(rows as u64);
    }
}

/// Counts workflows retired by retention.
pub(crate) fn retired(workflows: usize) {
    if workflows > 0 {
        counter!(names::WORKFLOWS_RETIRED).increment(workflows as u64);
    }
}
