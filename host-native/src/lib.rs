//! The miniflow store on SQLite, the embedded default: [`SqliteStore`] on one file, its [`Writer`]
//! thread, [`SqliteIdempotencyStore`] for a receiver's records, and the worker pool over the file
//! ([`SqliteDispatcher::sqlite`]; the [`Dispatcher`] itself is `miniflow-pool`'s).
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

mod connect;
mod dispatcher;
mod errors;
mod idempotency;
mod sqlite;
mod telemetry;
#[cfg(feature = "tokio")]
pub mod tokio;
mod writer;

pub use connect::{SqliteOptions, Synchronous, SCHEMA_VERSION};
pub use dispatcher::SqliteDispatcher;
pub use idempotency::SqliteIdempotencyStore;
/// The worker pool, re-exported: `Dispatcher::sqlite` comes from [`SqliteDispatcher`].
pub use miniflow_pool::{
    cancellation_requested, describe_metrics, new_trace_context, Dispatcher, DispatcherSettings,
    Handler, OutboxGauges, Outcome, RunningDispatcher, Settlement, Shutdown, Stats, SystemClock,
};
/// The SQLite driver miniflow is built on, re-exported so that the caller's-transaction entry points
/// (`SqliteStore::append_in`, `SqliteIdempotencyStore::finish_in`, …) take a transaction of the same
/// `rusqlite` version.
pub use rusqlite;
pub use sqlite::{EventListing, Listing, SqliteStore, UnreadableCommand, UnreadableEvent};
pub use writer::Writer;
