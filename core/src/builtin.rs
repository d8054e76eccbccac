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
//! | [`SCHEDULE_FIRED`] | [`ScheduleFired`] | an occurrence of a recurring schedule of the workflow came (see [`crate::Schedule`]) |
//! | [`COMMAND_COMPLETED`] | [`CommandCompleted`] | a command that asked for its result ([`crate::Command::report_result`]) completed, or a command the workflow had cancelled completed anyway |
//! | [`COMMAND_FAILED`] | [`CommandFailed`] | a command became dead |
//! | [`COMMAND_RESOLVED`] | [`CommandResolved`] | a person resolved a dead command by hand |

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::Error;
use crate::id::CommandId;
use crate::model::EventRecord;
use crate::schedule::{Missed, Recurrence};
use crate::time::Timestamp;

/// The kind of the event a user timer commits when it fires.
pub const TIMER_FIRED: &str = "timer_fired";
/// The kind of the event an occurrence of a recurring schedule commits.
pub const SCHEDULE_FIRED: &str = "schedule_fired";
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

/// The payload of [`SCHEDULE_FIRED`]: one occurrence of a recurring schedule ([`crate::Schedule`]),
/// standing also for the earlier occurrences its missed-occurrence policy folded into it.
///
/// ```json
/// { "timer_id": "meter-7:1:s0@1700000060000", "name": "reading", "payload": { "unit": "kWh" },
///   "scheduled_at": 1700000060000, "missed": 0, "next_at": 1700000120000,
///   "recurrence": { "every_ms": 60000 }, "on_missed": "fire_once" }
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScheduleFired {
    /// The ID of the timer that fired: `{workflow_id}:{event_seq}:s{index}@{at}`, the occurrence at
    /// `at` of the `index`-th schedule started by event `event_seq`. After missed occurrences `at` is
    /// the first of them, and [`ScheduleFired::scheduled_at`] the one this event stands for.
    pub timer_id: String,
    /// The schedule's name.
    pub name: String,
    /// The payload the schedule was started with.
    pub payload: Value,
    /// The occurrence this event stands for (milliseconds since the Unix epoch). The event's
    /// `recorded_at` says when it actually fired; a workflow that ignores stale occurrences compares
    /// the two.
    pub scheduled_at: Timestamp,
    /// How many earlier occurrences went by without an event of their own (the host was down, or
    /// firing fell behind) and are folded into this one by the [`Missed`] policy; 0 when none was
    /// missed. Counted up to [`ScheduleFired::MAX_MISSED`].
    pub missed: u64,
    /// The next occurrence, armed in the same commit as this event (unless this event's decision
    /// stops or restarts the schedule); `None` when the schedule has no later occurrence, and ends.
    pub next_at: Option<Timestamp>,
    /// When the schedule recurs.
    pub recurrence: Recurrence,
    /// What happens to occurrences missed while no firer ran.
    pub on_missed: Missed,
}

impl ScheduleFired {
    /// The most missed occurrences [`ScheduleFired::missed`] counts: after a longer outage it says
    /// this many (counting a cron expression's matches one by one takes time).
    pub const MAX_MISSED: u64 = 100_000;
}

impl BuiltInEvent for ScheduleFired {
    const KIND: &'static str = SCHEDULE_FIRED;
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
