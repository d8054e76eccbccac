//! The PostgreSQL store's spans and metrics: the worker pool's, which every store records alike
//! ([`miniflow_pool::telemetry`]: the commit's `send` span, commit conflicts, rows purged,
//! workflows retired).

use miniflow_core::{Commit, Error};

use miniflow_pool::telemetry::{committed, send_span};
pub(crate) use miniflow_pool::telemetry::{purged, retired};

/// Runs `write` inside the commit's `send` span, and records how it went.
pub(crate) fn sending(
    commit: &Commit,
    write: impl FnOnce() -> Result<(), Error>,
) -> Result<(), Error> {
    let span = send_span(commit);
    let _send = span.enter();
    let result = write();
    committed(&span, &result);
    result
}

/// [`sending`] for an async write: the span is entered around each poll of `write`.
#[cfg(feature = "tokio")]
pub(crate) async fn sending_async(
    commit: &Commit,
    write: impl std::future::Future<Output = Result<(), Error>>,
) -> Result<(), Error> {
    use tracing::Instrument;
    let span = send_span(commit);
    let result = write.instrument(span.clone()).await;
    committed(&span, &result);
    result
}
