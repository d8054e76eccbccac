//! The events miniflow itself writes into a workflow, with typed payloads.
//!
//! A workflow's `decide` sees them like its own events; [`EventRecord::decode`](crate::EventRecord::decode)
//! reads one as its type:
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

use crate::id::CommandId;
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

/// The kinds of the events miniflow writes itself. [`crate::Engine::handle`] and
/// [`crate::Engine::start`] refuse them in a caller's event: a workflow that reads one decodes its
/// payload as miniflow wrote it ([`EventRecord::decode`](crate::EventRecord::decode)), which a look-alike would not match.
pub const BUILT_IN_KINDS: [&str; 5] = [
    TIMER_FIRED,
    SCHEDULE_FIRED,
    COMMAND_COMPLETED,
    COMMAND_FAILED,
    COMMAND_RESOLVED,
];

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
    /// missed. Exact for an interval schedule, however long the outage (computed, not counted).
    /// A cron schedule's matches are counted one by one, up to [`ScheduleFired::MAX_MISSED`]:
    /// past that, `missed` is that many and [`ScheduleFired::missed_at_least`] is `true`.
    pub missed: u64,
    /// `true` when [`ScheduleFired::missed`] is a lower bound: a cron schedule missed more than
    /// [`ScheduleFired::MAX_MISSED`] matches, and counting stopped there. In JSON the field is
    /// present only then (`"missed_at_least": true`); an event without it has an exact `missed`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub missed_at_least: bool,
    /// The next occurrence, armed in the same commit as this event (unless this event's decision
    /// stops or restarts the schedule); `None` when the schedule has no later occurrence, and ends.
    pub next_at: Option<Timestamp>,
    /// When the schedule recurs.
    pub recurrence: Recurrence,
    /// What happens to occurrences missed while no firer ran.
    pub on_missed: Missed,
}

impl ScheduleFired {
    /// The most missed matches of a cron schedule [`ScheduleFired::missed`] counts (one by one,
    /// so a firing's cost stays bounded): after a longer outage it says this many, with
    /// [`ScheduleFired::missed_at_least`] set. An interval schedule's count has no such bound.
    pub const MAX_MISSED: u64 = crate::schedule::MAX_MISSED;
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

/// A built-in event's payload as JSON, written field by field: the value `serde_json::to_value` gives
/// (a test compares the two), without a JSON-value serializer in the WebAssembly module.
pub(crate) trait Payload {
    /// The payload's JSON.
    fn payload(&self) -> Value;
}

/// The payload written into an event of a built-in kind.
pub(crate) fn to_payload<T: BuiltInEvent + Payload>(payload: &T) -> Value {
    payload.payload()
}

/// A JSON object of `fields`, inserted one by one (collecting would sort them first).
fn object<const N: usize>(fields: [(&str, Value); N]) -> Value {
    let mut map = serde_json::Map::new();
    for (name, value) in fields {
        map.insert(name.to_owned(), value);
    }
    Value::Object(map)
}

fn text(value: &Option<String>) -> Value {
    value.clone().map_or(Value::Null, Value::String)
}

impl Payload for TimerFired {
    fn payload(&self) -> Value {
        object([
            ("timer_id", Value::String(self.timer_id.clone())),
            ("name", Value::String(self.name.clone())),
            ("payload", self.payload.clone()),
        ])
    }
}

impl Payload for ScheduleFired {
    fn payload(&self) -> Value {
        let recurrence = match &self.recurrence {
            Recurrence::Every(interval) => {
                object([("every_ms", crate::time::millis(*interval).into())])
            }
            Recurrence::Cron(expression) => object([("cron", Value::String(expression.clone()))]),
        };
        let on_missed = match self.on_missed {
            Missed::FireOnce => Value::String("fire_once".into()),
            Missed::FireAll { max } => object([("fire_all", object([("max", max.into())]))]),
        };
        let mut payload = object([
            ("timer_id", Value::String(self.timer_id.clone())),
            ("name", Value::String(self.name.clone())),
            ("payload", self.payload.clone()),
            ("scheduled_at", self.scheduled_at.as_millis().into()),
            ("missed", self.missed.into()),
            (
                "next_at",
                self.next_at.map_or(Value::Null, |at| at.as_millis().into()),
            ),
            ("recurrence", recurrence),
            ("on_missed", on_missed),
        ]);
        if self.missed_at_least {
            if let Value::Object(fields) = &mut payload {
                fields.insert("missed_at_least".to_owned(), Value::Bool(true));
            }
        }
        payload
    }
}

impl Payload for CommandCompleted {
    fn payload(&self) -> Value {
        object([
            ("command_id", Value::String(self.command_id.to_string())),
            ("kind", Value::String(self.kind.clone())),
            ("result", self.result.clone()),
            ("attempts", self.attempts.into()),
        ])
    }
}

impl Payload for CommandFailed {
    fn payload(&self) -> Value {
        object([
            ("command_id", Value::String(self.command_id.to_string())),
            ("kind", Value::String(self.kind.clone())),
            ("error", text(&self.error)),
            ("attempts", self.attempts.into()),
        ])
    }
}

impl Payload for CommandResolved {
    fn payload(&self) -> Value {
        object([
            ("command_id", Value::String(self.command_id.to_string())),
            ("kind", Value::String(self.kind.clone())),
            ("note", text(&self.note)),
        ])
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;

    use super::*;

    fn same<T: BuiltInEvent + Payload>(payload: &T) {
        assert_eq!(to_payload(payload), serde_json::to_value(payload).unwrap());
    }

    #[test]
    fn payloads_written_by_hand_are_what_serde_writes() {
        let id: CommandId = "trip-001:3:1".parse().unwrap();
        let values = [
            Value::Null,
            json!({ "b": [1, 2.5, "x"], "a": { "deep": null } }),
            json!("text"),
        ];
        for value in &values {
            same(&TimerFired {
                timer_id: "trip-001:2:0".into(),
                name: "reminder".into(),
                payload: value.clone(),
            });
            for (next_at, recurrence, on_missed) in [
                (
                    None,
                    Recurrence::Every(Duration::from_millis(60_000)),
                    Missed::FireOnce,
                ),
                (
                    Some(Timestamp::from_millis(u64::MAX)),
                    Recurrence::Cron("0 9 * * MON-FRI".into()),
                    Missed::FireAll { max: 1_000 },
                ),
            ] {
                for missed_at_least in [false, true] {
                    same(&ScheduleFired {
                        timer_id: "trip-001:s:tick".into(),
                        name: "tick".into(),
                        payload: value.clone(),
                        scheduled_at: Timestamp::from_millis(1_700_000_000_000),
                        missed: ScheduleFired::MAX_MISSED,
                        missed_at_least,
                        next_at,
                        recurrence: recurrence.clone(),
                        on_missed,
                    });
                }
            }
            same(&CommandCompleted {
                command_id: id.clone(),
                kind: "book_flight".into(),
                result: value.clone(),
                attempts: u32::MAX,
            });
        }
        for text in [
            None,
            Some(String::new()),
            Some("supplier said \"no\"\n".into()),
        ] {
            same(&CommandFailed {
                command_id: id.clone(),
                kind: "book_flight".into(),
                error: text.clone(),
                attempts: 0,
            });
            same(&CommandResolved {
                command_id: id.clone(),
                kind: "book_flight".into(),
                note: text,
            });
        }
    }
}
