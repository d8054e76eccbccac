//! The native miniflow host: [`SqliteStore`], the embedded default store on one SQLite file; the
//! [`Dispatcher`], a pool of worker threads delivering commands at least once and firing timers;
//! [`SqliteIdempotencyStore`], a receiver's idempotency records; and [`SystemClock`].
//!
//! # Example
//!
//! ```
//! use miniflow_core::prelude::*;
//! use miniflow_core::{Clock, Command, Decision, Engine, Event, EventRecord, Workflow, WorkflowId};
//! use miniflow_native::{SqliteStore, SystemClock};
//! use serde_json::json;
//!
//! struct Trip;
//!
//! impl Workflow for Trip {
//!     type State = ();
//!     fn evolve(&self, _: &mut (), _: &EventRecord) {}
//!     fn decide(&self, _: &(), event: &EventRecord) -> Decision {
//!         Decision::new().command(Command::new("lock_budget", json!({ "trip_id": event.workflow_id })))
//!     }
//! }
//!
//! let dir = tempfile::tempdir()?;
//! let mut store = SqliteStore::open(dir.path().join("flow.db"))?;
//! let trip = WorkflowId::new("trip-001")?;
//! Engine::new(Trip).handle(&mut store, &trip, Event::new("trip_requested", json!({})), SystemClock.now())?;
//!
//! for row in store.pending(100)? {
//!     // deliver row.command_id, row.kind, row.payload …
//!     store.mark_done(&row.command_id, SystemClock.now())?;
//! }
//! assert!(store.pending(100)?.is_empty());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod clock;
mod dispatcher;
mod idempotency;
mod sqlite;
mod telemetry;
#[cfg(feature = "tokio")]
pub mod tokio;
mod writer;

pub use telemetry::{describe_metrics, new_trace_context, OutboxGauges};

pub use clock::SystemClock;
pub use dispatcher::{
    cancellation_requested, Dispatcher, Handler, Outcome, RunningDispatcher, Settlement, Shutdown,
    Stats,
};
pub use idempotency::SqliteIdempotencyStore;
/// The SQLite driver miniflow is built on, re-exported so that the caller's-transaction entry points
/// (`SqliteStore::append_in`, `SqliteIdempotencyStore::finish_in`, …) take a transaction of the same
/// `rusqlite` version.
pub use rusqlite;
pub use sqlite::{
    EventListing, Listing, SqliteOptions, SqliteStore, Synchronous, UnreadableCommand,
    UnreadableEvent, SCHEMA_VERSION,
};
pub use writer::Writer;
