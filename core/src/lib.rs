//! The sans-IO core of miniflow: durable workflows that never lose a command and never repeat an effect.
//!
//! A workflow records what happened as events and decides commands for the outside world. The core
//! plans every write — the event at the next seq, one outbox row per command with a deterministic ID
//! (`workflow:event_seq:index`), the next retry time of a failed delivery — and a [`Store`] writes each
//! plan atomically. The core has no I/O, no clock and no threads; time is an input, so it runs the same
//! on a server, in tests with a manual clock, and in the browser (`wasm32-unknown-unknown`).
//!
//! | piece | what it is |
//! |---|---|
//! | [`Workflow`], [`Engine`] | `evolve` folds events into state, `decide` turns an event into commands; the engine does replay → decide → commit |
//! | [`Store`], [`Commit`] | the storage contract and the one atomic write |
//! | [`OutboxRow`], [`ClaimRequest`], [`RetryPolicy`] | leases with fencing tokens, retries with backoff, dead letters |
//! | [`Timer`], [`TimerId`], [`TimerRow`], [`backend::feedback`] | durable timers, and `command_failed` feedback for compensation |
//! | [`Schedule`], [`Missed`], [`ScheduleFired`] | recurring schedules (every N, cron): a timer that re-arms itself, once per occurrence |
//! | [`TraceContext`] | the W3C trace context stored with each command, so a trace runs through the outbox |
//! | [`MemoryStore`] | an in-memory store |
//! | [`IdempotencyStore`], [`Digest`], [`check_retention`] | the receiver's side: fold repeated deliveries into one effect |
//! | `conformance` (feature) | the tests every store must pass |
//!
//! # Example
//!
//! The trip workflow of the design article: a requested trip locks a budget. A worker claims the
//! command, delivers it with its ID as the idempotency key, and completes it.
//!
//! ```
//! use std::time::Duration;
//! use miniflow_core::prelude::*;
//! use miniflow_core::{
//!     ClaimRequest, Command, Decision, Engine, Event, EventRecord, MemoryStore, Timestamp,
//!     Workflow, WorkflowId,
//! };
//! use serde_json::json;
//!
//! struct Trip;
//!
//! impl Workflow for Trip {
//!     type State = u32; // events seen
//!
//!     fn evolve(&self, seen: &mut u32, _event: &EventRecord) {
//!         *seen += 1;
//!     }
//!
//!     fn decide(&self, _seen: &u32, event: &EventRecord) -> Decision {
//!         match event.kind.as_str() {
//!             "trip_requested" => Decision::new().command(Command::new(
//!                 "lock_budget",
//!                 json!({ "trip_id": event.workflow_id }),
//!             )),
//!             _ => Decision::none(),
//!         }
//!     }
//! }
//!
//! let engine = Engine::new(Trip);
//! let mut store = MemoryStore::new();
//! let trip = WorkflowId::new("trip-001")?;
//! let now = Timestamp::from_millis(1_700_000_000_000);
//!
//! engine.handle(&mut store, &trip, Event::new("trip_requested", json!({ "city": "成都" })), now)?;
//!
//! let request = ClaimRequest::new("worker-1").limit(10).lease_ttl(Duration::from_secs(30));
//! let claimed = store.claim(&request, now)?;
//! assert_eq!(claimed[0].command_id.to_string(), "trip-001:1:0");
//! // … deliver `claimed[0]` with its command ID as the idempotency key, then:
//! store.complete(&claimed[0].command_id, claimed[0].token, None, now)?;
//! assert!(store.pending(10)?.is_empty());
//! assert_eq!(engine.replay(&store, &trip)?.last_seq.get(), 1);
//! # Ok::<(), miniflow_core::Error>(())
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod builtin;
mod cache;
mod claim;
mod commit;
mod control;
mod engine;
mod error;
mod id;
mod idempotency;
mod invalid;
mod limits;
mod listing;
mod memory;
mod model;
mod occurrence;
mod outbox;
mod retention;
mod retry;
mod schedule;
mod stats;
mod status;
mod store;
pub mod telemetry;
mod time;
mod timer;
mod trace;

#[cfg(feature = "conformance")]
pub mod conformance;

pub use builtin::{
    BuiltInEvent, CommandCompleted, CommandFailed, CommandResolved, ScheduleFired, TimerFired,
    BUILT_IN_KINDS, COMMAND_COMPLETED, COMMAND_FAILED, COMMAND_RESOLVED, SCHEDULE_FIRED,
    TIMER_FIRED,
};
pub use cache::StateCacheStats;
pub use control::{KindChange, KindControl, MAX_BULK_BATCH};
pub use engine::{replay, Engine, Handled, Planned, ReplayResult, Workflow};
pub use error::{BoxError, Error};
pub use id::{CommandId, Seq, WorkflowId};
pub use idempotency::{
    check_retention, Begin, Digest, IdempotencyKey, IdempotencyPolicy, IdempotencyStore,
    MemoryIdempotencyStore,
};
pub use invalid::InvalidInput;
pub use limits::{JsonLimits, MAX_ERROR_LEN};
pub use listing::{EventListing, Listing, UnreadableCommand, UnreadableEvent};
pub use memory::MemoryStore;
pub use model::{
    canonical_json, check_kind, CancelCommand, Command, Decision, Event, EventRecord, MAX_KIND_LEN,
};
pub use outbox::{
    Cancelled, ClaimOrder, ClaimRequest, Delivery, Extended, Failure, Lease, OutboxRow, Settled,
};
pub use retention::{finished_at, is_retirable, purge_cutoff};
pub use retry::RetryPolicy;
pub use schedule::{Missed, Recurrence, Schedule};
pub use stats::{KindStats, OutboxStats, TimerStats};
pub use status::Status;
pub use store::{
    Ack, AppendedAfter, Commit, EventLog, Handover, Operations, Outbox, Store, Timers,
};
pub use time::{Clock, ManualClock, Timestamp};
pub use timer::{FireAt, Timer, TimerId, TimerRow, TimerSource, TimerStatus};
pub use trace::{TraceContext, MAX_TRACESTATE_LEN};

/// What authors of a store need and users do not: the claim walk and the timer claim a store
/// drives with its queries, the admission rule of the operators' controls, row changes and the
/// feedback they schedule, the retention walk, the receiver's records, and the checks a store runs
/// on its arguments. The API for users is at the crate root; this module is for the store crates
/// (and a store of your own, with the conformance suite) and may change in a minor version.
pub mod backend {
    pub use crate::claim::{
        Burial, ClaimPage, ClaimStep, ClaimWalk, Offer, TimerClaim, TimerOffer, Unclaimable,
    };
    pub use crate::control::{check_bulk, check_purge_batch, Admission};
    pub use crate::engine::AsyncEventLog;
    pub use crate::idempotency::{IdempotencyRecord, RecordState};
    pub use crate::outbox::{feedback, withdrawn_feedback, Changed};
    pub use crate::retention::{
        command_is_settled, count_retirable, last_recorded_at, may_retire, retired,
        sweep_retirable, timer_is_settled,
    };
    pub use crate::store::{conflict_backoff, HistoryId};
}

/// The store traits, to call their methods: `use miniflow_core::prelude::*`.
pub mod prelude {
    pub use crate::store::{EventLog, Operations, Outbox, Store, Timers};
}

/// Re-exported so users name JSON payloads without adding `serde_json` themselves.
pub use serde_json::{json, Value};
