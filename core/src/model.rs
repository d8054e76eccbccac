//! The values a workflow reads and writes: events, commands, and the rows a commit writes.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::builtin::BuiltInEvent;
use crate::error::Error;
use crate::id::{CommandId, Seq, WorkflowId};
use crate::schedule::Schedule;
use crate::time::Timestamp;
use crate::timer::Timer;

/// The longest event or command kind, in bytes.
pub const MAX_KIND_LEN: usize = 128;

/// Checks an event or command kind, named `field` in the error: 1 to [`MAX_KIND_LEN`] bytes, no
/// control characters. A store checks a kind it is given this way before it sends it anywhere.
///
/// # Errors
///
/// [`Error::InvalidInput`] naming `field` and the kind.
pub fn check_kind(field: &'static str, kind: &str) -> Result<(), Error> {
    if kind.is_empty() {
        return Err(Error::invalid(field, kind, "must not be empty"));
    }
    if kind.len() > MAX_KIND_LEN {
        return Err(Error::invalid(
            field,
            kind,
            format!("is {} bytes, the limit is {MAX_KIND_LEN}", kind.len()),
        ));
    }
    if kind.chars().any(char::is_control) {
        return Err(Error::invalid(field, kind, "has a control character"));
    }
    Ok(())
}

/// Something that happened to a workflow, before it is recorded: a kind and a JSON payload.
///
/// ```
/// use miniflow_core::Event;
/// use serde_json::json;
///
/// let event = Event::new("trip_requested", json!({ "city": "成都" }));
/// assert_eq!(event.kind, "trip_requested");
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// What happened, e.g. `trip_requested`.
    pub kind: String,
    /// The facts of it.
    pub payload: Value,
}

impl Event {
    /// An event of `kind` with `payload`.
    pub fn new(kind: impl Into<String>, payload: Value) -> Self {
        Self {
            kind: kind.into(),
            payload,
        }
    }
}

/// An event as recorded: its workflow, its seq and when it was committed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventRecord {
    /// The workflow it belongs to.
    pub workflow_id: WorkflowId,
    /// Its position, from 1 with no gaps.
    pub seq: Seq,
    /// What happened.
    pub kind: String,
    /// The facts of it.
    pub payload: Value,
    /// The `now` of the commit that recorded it.
    pub recorded_at: Timestamp,
}

impl EventRecord {
    /// The event without its record metadata.
    pub fn event(&self) -> Event {
        Event::new(self.kind.clone(), self.payload.clone())
    }

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

/// A request to the outside world, decided by a workflow: a kind and a JSON payload.
///
/// Its ID is not chosen here: a commit derives it from the deciding event (DESIGN rule 4).
///
/// ```
/// use miniflow_core::{json, Command};
///
/// let book = Command::new("book_flight", json!({ "flight": "CA1405" })).report_result().priority(10);
/// assert!(book.report_result);
/// assert_eq!(book.priority, 10);
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Command {
    /// What to do, e.g. `lock_budget`.
    pub kind: String,
    /// With which parameters.
    pub payload: Value,
    /// Whether its result comes back into the workflow as a `command_completed` event.
    #[serde(default)]
    pub report_result: bool,
    /// Claims take commands of a higher priority first (default 0; see [`Command::priority`]).
    #[serde(default)]
    pub priority: i32,
}

impl Command {
    /// A command of `kind` with `payload`.
    pub fn new(kind: impl Into<String>, payload: Value) -> Self {
        Self {
            kind: kind.into(),
            payload,
            report_result: false,
            priority: 0,
        }
    }

    /// Sets the command's priority (default 0, negative values allowed): claims hand out claimable
    /// commands of a higher priority first, then the longest-due, then by command ID (see
    /// [`crate::OutboxRow::claim_order`]). In strict per-workflow order a command still waits for
    /// the earlier commands of its workflow, whatever their priority.
    #[must_use]
    pub fn priority(mut self, priority: i32) -> Self {
        self.priority = priority;
        self
    }

    /// Asks for the command's result: when a handler completes it (with a result or without), one
    /// [`crate::COMMAND_COMPLETED`] event ([`crate::CommandCompleted`]) carries it into the workflow,
    /// scheduled in the same transaction as the acknowledgement, exactly once. Without it, an
    /// acknowledgement stays one write.
    #[must_use]
    pub fn report_result(mut self) -> Self {
        self.report_result = true;
        self
    }
}

/// Which earlier commands of its workflow a decision withdraws.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CancelCommand {
    /// This command (it must belong to the deciding workflow).
    Id(CommandId),
    /// Every unfinished command of this kind in the workflow.
    Kind(String),
}

/// What a workflow decided in answer to one event.
///
/// ```
/// use miniflow_core::{Command, Decision};
/// use serde_json::json;
///
/// let decision = Decision::new()
///     .command(Command::new("lock_budget", json!({ "trip_id": "trip-001" })))
///     .command(Command::new("book_flight", json!({ "to": "成都" })));
/// assert_eq!(decision.commands.len(), 2);
/// assert!(Decision::none().commands.is_empty());
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct Decision {
    /// The commands, in order: the first gets index 0 in its command ID.
    pub commands: Vec<Command>,
    /// Timers to schedule, in order: the first gets ID `{workflow_id}:{event_seq}:t0`.
    pub timers: Vec<Timer>,
    /// Recurring schedules to start, in order: the first occurrence of the first gets ID
    /// `{workflow_id}:{event_seq}:s0@{at}`.
    pub schedules: Vec<Schedule>,
    /// Names of this workflow's scheduled timers and schedules to cancel (before the new ones are
    /// scheduled, so a decision can reschedule a name).
    pub cancel_timers: Vec<String>,
    /// Earlier commands of this workflow to withdraw (before this decision's commands are written).
    pub cancel_commands: Vec<CancelCommand>,
    /// Set by [`Decision::reject`]: the event is refused and nothing is written.
    pub rejection: Option<String>,
}

impl Decision {
    /// A decision with no commands yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Record the event and do nothing else.
    pub fn none() -> Self {
        Self::default()
    }

    /// Adds a command after the ones already decided.
    #[must_use]
    pub fn command(mut self, command: Command) -> Self {
        self.commands.push(command);
        self
    }

    /// Refuses the event: [`crate::Engine::handle`] writes nothing and returns [`crate::Error::Rejected`]
    /// with `reason` (e.g. "the trip is already cancelled").
    pub fn reject(reason: impl Into<String>) -> Self {
        Self {
            rejection: Some(reason.into()),
            ..Self::default()
        }
    }

    /// Schedules a durable timer in the same commit.
    #[must_use]
    pub fn timer(mut self, timer: Timer) -> Self {
        self.timers.push(timer);
        self
    }

    /// Cancels this workflow's scheduled timers called `name`.
    #[must_use]
    pub fn cancel_timer(mut self, name: impl Into<String>) -> Self {
        self.cancel_timers.push(name.into());
        self
    }

    /// Starts a recurring schedule in the same commit: its first occurrence is armed with this
    /// event, and each occurrence arms the next (see [`Schedule`]). A schedule already running under
    /// the same name in this workflow is replaced: its armed occurrence is cancelled in this commit.
    #[must_use]
    pub fn schedule(mut self, schedule: Schedule) -> Self {
        self.schedules.push(schedule);
        self
    }

    /// Stops this workflow's schedule called `name`, in the same commit: its armed occurrence is
    /// cancelled and never fires. In the decision on one of its own occurrences, that occurrence's
    /// event is recorded and the next is not armed. Schedules share their names with timers, so this
    /// is [`Decision::cancel_timer`] under the name a reader looks for.
    #[must_use]
    pub fn cancel_schedule(self, name: impl Into<String>) -> Self {
        self.cancel_timer(name)
    }

    /// Withdraws an earlier command of this workflow, in the same commit: not yet delivered, it
    /// becomes `cancelled` and is never delivered; being delivered, it is marked (its holder learns
    /// it at its next heartbeat), not delivered again, and its real outcome still comes back
    /// (`command_completed` or `command_failed`). A finished command is left alone.
    #[must_use]
    pub fn cancel_command(mut self, command_id: CommandId) -> Self {
        self.cancel_commands.push(CancelCommand::Id(command_id));
        self
    }

    /// Withdraws every unfinished command of `kind` in this workflow, as
    /// [`Decision::cancel_command`] does one.
    #[must_use]
    pub fn cancel_commands_of_kind(mut self, kind: impl Into<String>) -> Self {
        self.cancel_commands.push(CancelCommand::Kind(kind.into()));
        self
    }
}

impl From<Vec<Command>> for Decision {
    fn from(commands: Vec<Command>) -> Self {
        Self {
            commands,
            ..Self::default()
        }
    }
}

/// Canonical JSON text: object keys sorted by their UTF-8 bytes, no insignificant whitespace.
///
/// The same value always gives the same text, whatever map type `serde_json` was built with, so stored
/// payloads compare and hash byte for byte.
///
/// ```
/// use miniflow_core::canonical_json;
/// use serde_json::json;
///
/// assert_eq!(canonical_json(&json!({ "b": 1, "a": [true, null] })), r#"{"a":[true,null],"b":1}"#);
/// ```
pub fn canonical_json(value: &Value) -> String {
    let mut out = Vec::with_capacity(128);
    write_canonical(value, &mut out);
    // Only `serde_json`'s writer and ASCII punctuation wrote to it.
    String::from_utf8(out).unwrap_or_default()
}

/// One step of the canonical writer: a value to write, or punctuation to emit after its children.
enum Step<'a> {
    Value(&'a Value),
    Key(&'a str),
    Text(u8),
}

/// Writes `value` canonically with an explicit stack, so that no depth overflows the call stack.
/// Scalars and keys go straight into `out` through `serde_json`'s writer, without a string each.
fn write_canonical<'a>(value: &'a Value, out: &mut Vec<u8>) {
    let mut steps = Vec::with_capacity(16);
    steps.push(Step::Value(value));
    let mut entries: Vec<(&String, &Value)> = Vec::new();
    while let Some(step) = steps.pop() {
        match step {
            Step::Text(text) => out.push(text),
            Step::Key(key) => {
                write_json_bytes(key, out);
                out.push(b':');
            }
            Step::Value(Value::Object(map)) => {
                out.push(b'{');
                steps.push(Step::Text(b'}'));
                // A map without `preserve_order` iterates in byte order already: its entries go on
                // the stack as they come (last first). Any other order is sorted first.
                let sorted = map
                    .keys()
                    .zip(map.keys().skip(1))
                    .all(|(a, b)| a.as_bytes() < b.as_bytes());
                let mut push = |n: usize, key: &'a String, item: &'a Value| {
                    if n > 0 {
                        steps.push(Step::Text(b','));
                    }
                    steps.extend([Step::Value(item), Step::Key(key)]);
                };
                if sorted {
                    for (n, (key, item)) in map.iter().rev().enumerate() {
                        push(n, key, item);
                    }
                } else {
                    // Sorted by insertion: no sort routine in the WebAssembly module for this case.
                    entries.clear();
                    for (key, item) in map {
                        let at = entries.partition_point(|(k, _)| k.as_bytes() < key.as_bytes());
                        entries.insert(at, (key, item));
                    }
                    for (n, (key, item)) in entries.drain(..).rev().enumerate() {
                        push(n, key, item);
                    }
                }
            }
            Step::Value(Value::Array(items)) => {
                out.push(b'[');
                steps.push(Step::Text(b']'));
                for (n, item) in items.iter().rev().enumerate() {
                    if n > 0 {
                        steps.push(Step::Text(b','));
                    }
                    steps.push(Step::Value(item));
                }
            }
            Step::Value(scalar) => write_json_bytes(scalar, out),
        }
    }
}

/// Appends `value` as compact JSON text to `out`.
fn write_json_bytes<T: serde::Serialize + ?Sized>(value: &T, out: &mut Vec<u8>) {
    // Writing a string or a JSON scalar into memory cannot fail.
    let _ = serde_json::to_writer(&mut *out, value);
}

/// Appends `value` as compact JSON text: with `serde_json::to_string`, as every other JSON text of the
/// crate is written, rather than with `Display` (whose writer, and the pretty one it carries, would
/// be two more copies of the serializer in the WebAssembly module).
pub(crate) fn write_json<T: serde::Serialize + ?Sized>(value: &T, out: &mut String) {
    // Writing a string or a JSON value cannot fail.
    out.push_str(&serde_json::to_string(value).unwrap_or_default());
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Canonical JSON as its definition says it, written the plain way: keys sorted by their bytes,
    /// every scalar as `serde_json` writes it.
    fn reference(value: &Value) -> String {
        match value {
            Value::Object(map) => {
                let mut entries: Vec<_> = map.iter().collect();
                entries.sort_by(|(a, _), (b, _)| a.as_bytes().cmp(b.as_bytes()));
                let items: Vec<String> = entries
                    .iter()
                    .map(|(k, v)| format!("{}:{}", serde_json::to_string(k).unwrap(), reference(v)))
                    .collect();
                format!("{{{}}}", items.join(","))
            }
            Value::Array(items) => {
                let items: Vec<String> = items.iter().map(reference).collect();
                format!("[{}]", items.join(","))
            }
            scalar => serde_json::to_string(scalar).unwrap(),
        }
    }

    fn random_value(rng: &mut fastrand::Rng, depth: u32) -> Value {
        let text = |rng: &mut fastrand::Rng| -> String {
            let alphabet = ['a', 'b', 'Z', '"', '\\', '\n', 'é', '成', '\u{1}', '😀'];
            (0..rng.usize(0..6))
                .map(|_| alphabet[rng.usize(..alphabet.len())])
                .collect()
        };
        match rng.u8(..if depth == 0 { 5 } else { 7 }) {
            0 => Value::Null,
            1 => Value::Bool(rng.bool()),
            2 => json!(rng.i64(..)),
            3 => json!(rng.f64() * 1e6 - 5e5),
            4 => Value::String(text(rng)),
            5 => Value::Array(
                (0..rng.usize(0..4))
                    .map(|_| random_value(rng, depth - 1))
                    .collect(),
            ),
            _ => Value::Object(
                (0..rng.usize(0..5))
                    .map(|_| (text(rng), random_value(rng, depth - 1)))
                    .collect(),
            ),
        }
    }

    #[test]
    fn canonical_json_matches_its_definition_on_random_values() {
        let mut rng = fastrand::Rng::with_seed(7);
        for _ in 0..5_000 {
            let value = random_value(&mut rng, 4);
            assert_eq!(canonical_json(&value), reference(&value), "{value:?}");
        }
    }

    #[test]
    fn canonical_json_of_a_deep_value_does_not_overflow_the_stack() {
        let mut value = json!(1);
        for _ in 0..200_000 {
            value = Value::Array(vec![value]);
        }
        let text = canonical_json(&value);
        crate::limits::drop_deep(value); // before any assertion, which would drop it recursively
        assert!(text == format!("{}1{}", "[".repeat(200_000), "]".repeat(200_000)));
    }
}
