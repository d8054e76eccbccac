//! The miniflow worker pool: a [`Dispatcher`] of worker threads — or, with the feature `tokio`, an
//! [`tokio::AsyncDispatcher`] of tasks — that delivers outbox commands at least once from any miniflow
//! store, with leases, heartbeats, retries with backoff, dead letters, and the firing of due timers
//! and failure feedback into their workflows.
//!
//! It knows no database: a store crate (`miniflow-native` for SQLite, `miniflow-postgres`) gives
//! it stores to open and, where it can, a [`Wakeup`] that tells idle workers a commit made work, so
//! that they need not sleep through their poll interval. Its spans and metrics are
//! [`miniflow_core::telemetry`]'s names, recorded through the `tracing` and `metrics` facades.
//!
//! # Example
//!
//! Any [`miniflow_core::Store`] will do; here, the core's in-memory store (each worker opens a copy
//! of it, so one worker shows the loop; a database store shares its rows between workers):
//!
//! ```
//! use miniflow_core::prelude::*;
//! use miniflow_core::{json, Command, Commit, Decision, Delivery, Event, MemoryStore, Seq, Timestamp, WorkflowId};
//! use miniflow_pool::{Dispatcher, Outcome};
//!
//! let mut store = MemoryStore::new();
//! let decision = Decision::new().command(Command::new("lock_budget", json!({ "amount": 1200 })));
//! let event = Event::new("trip_requested", json!({}));
//! store.append_with_commands(&Commit::new(WorkflowId::new("trip-001")?, Seq::ZERO, event, decision, Timestamp::EPOCH)?)?;
//!
//! let stats = Dispatcher::new(move || Ok(store.clone()), |delivery: &Delivery| {
//!     // call the receiver with `Idempotency-Key: {delivery.command_id}` …
//!     Outcome::Done
//! })
//! .run_until_idle()?;
//! assert_eq!(stats.completed, 1);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod clock;
mod dispatcher;
pub mod telemetry;
#[cfg(feature = "tokio")]
pub mod tokio;

pub use clock::SystemClock;
pub use dispatcher::{
    cancellation_requested, Dispatcher, DispatcherSettings, Handler, Outcome, RunningDispatcher,
    Settlement, Shutdown, Stats, Wakeup,
};
pub use telemetry::{describe_metrics, new_trace_context, OutboxGauges};
