//! The SQLite host's own metrics: the writer thread's groups. The spans and metrics every store
//! records alike (`send`, rows purged, workflows retired) are the worker pool's
//! ([`miniflow_pool::telemetry`]), and so are the dispatcher's.

use std::time::Duration;

use metrics::histogram;
use miniflow_core::telemetry as names;

pub(crate) use miniflow_pool::telemetry::{committed, purged, retired, send_span};

/// Records a group the writer thread committed: how many requests, and how long it took.
pub(crate) fn writer_committed(requests: usize, took: Duration) {
    histogram!(names::WRITER_GROUP_SIZE).record(requests as f64);
    histogram!(names::WRITER_TRANSACTION).record(took.as_secs_f64());
}
