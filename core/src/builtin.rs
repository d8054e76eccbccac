//! The events miniflow itself writes into a workflow, with typed payloads.
//!
//! A workflow's `decide` sees them like its own events; [`EventRecord::decode`] reads one as its type:
//!
//! ```
//! use miniflow_core::{json, CommandCompleted, EventRecord, Seq, Timestamp, WorkflowId, COMMAND_COMPLETED};
//!
//! let event = EventRecord {
//!     workflow_id: WorkflowId::new("trip-001")?,
//!     seq: Seq::new(2)?,
//!     kind: COMMAND_COMPLETED.into(),
//!     payload: json!({
//!         "command_id": "trip-001:1:0", "kind": "book_flight",
//!         "result": { "reference": "REF-1" }, "attempts": 1
//!     }),
//!     recorded_at: Timestamp::from_millis(0),
//! };
//! let done = event.decode::<CommandCompleted>().expect("a command_completed event")?;
//! assert_eq!(done.kind, "book_flight");
//! assert_eq!(done.result["reference"], "REF-1");
//! # Ok::<(), miniflow_core::Error>(())
//! ```
//!
//! | kind | payload | when |
//! |---|---|---|
//! | [`TIMER_FIRED`] | [`TimerFired`] | a timer of the workflow fired |
//! | [`COMMAND_COMPLETED`] | [`CommandCompleted`] | a command that asked for its result ([`crate::Command::report_result`]) completed, or a command the workflow had cancelled completed anyway |
//! | [`COMMAND_FAILED`] | [`CommandFailed`] | a command became dead |
//! | [`COMMAND_RESOLVED`] | [`CommandResolved`] | a person resolved a dead command by hand |

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::Error;
use crate::id::CommandId;
use crate::model::EventRecord;

/// The kind of the event a user timer commits when it fires.
pub const TIMER_FIRED: &str = "timer_fired";
/// The kind of the event that carries a command's result back into its workflow.
pub const COMMAND_COMPLETED: &str = "command_completed";
/// The kind of the event committed when a command becomes dead.
pub const COMMAND_FAILED: &str = "command_failed";
/// The kind of the event committed when a dead command is resolved by hand.
pub const COMMAND_RESOLVED: &str = "command_resolved";

/// A payload of an event miniflow writes, with the kind it comes with.
pub trait BuiltInEvent: Serialize + DeserializeOwned {
    /// The event kind.
    const KIND: &'static str;
}

/// The payload of [`TIMER_FIRED`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TimerFired {
    /// The timer's ID (`{workflow_id}:{event_seq}:t{index}`).
    pub timer_id: String,
    /// The name the decision gave it.
    pub name: String,
    /// The payload the decision gave it.
    pub payload: Value,
}

impl BuiltInEvent for TimerFired {
    const KIND: &'static str = TIMER_FIRED;
}

/// The payload of [`COMMAND_COMPLETED`]: a command's result, back in its workflow.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CommandCompleted {
    /// The command.
    pub command_id: CommandId,
    /// Its kind.
    pub kind: String,
    /// What the handler completed it with (`null` when it gave none).
    pub result: Value,
    /// How many deliveries it took.
    pub attempts: u32,
}

impl BuiltInEvent for CommandCompleted {
    const KIND: &'static str = COMMAND_COMPLETED;
}

/// The payload of [`COMMAND_FAILED`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CommandFailed {
    /// The dead command.
    pub command_id: CommandId,
    /// Its kind.
    pub kind: String,
    /// Its last error.
    pub error: Option<String>,
    /// How many deliveries were tried.
    pub attempts: u32,
}

impl BuiltInEvent for CommandFailed {
    const KIND: &'static str = COMMAND_FAILED;
}

/// The payload of [`COMMAND_RESOLVED`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CommandResolved {
    /// The command resolved by hand.
    pub command_id: CommandId,
    /// Its kind.
    pub kind: String,
    /// The person's note.
    pub note: Option<String>,
}

impl BuiltInEvent for CommandResolved {
    const KIND: &'static str = COMMAND_RESOLVED;
}

impl EventRecord {
    /// This event's payload as `T`, when the event is of `T`'s kind: `None` for another kind,
    /// `Some(Err(..))` ([`Error::Corrupt`]) when the payload does not have `T`'s shape.
    pub fn decode<T: BuiltInEvent>(&self) -> Option<Result<T, Error>> {
        (self.kind == T::KIND).then(|| {
            T::deserialize(&self.payload).map_err(|e| {
                Error::Corrupt(format!(
                    "event {} of {} is {} with a malformed payload: {e}",
                    self.seq,
                    self.workflow_id,
                    T::KIND
                ))
            })
        })
    }
}

/// Serializes a built-in payload; they are plain data, so this cannot fail.
pub(crate) fn to_payload<T: BuiltInEvent>(payload: &T) -> Value {
    serde_json::to_value(payload).unwrap_or(Value::Null)
}
