//! Limits on every JSON value miniflow stores: payloads of events, commands and timers, and receivers'
//! results (DESIGN rule 13).
//!
//! Every write path checks them (a commit, a receiver's `finish`, a snapshot, the JS bindings), so
//! every value a store holds reads back: the deepest value a write accepts, wrapped in the few levels
//! miniflow adds (a `timer_fired` event around its timer's payload, a snapshot around its rows), stays
//! well inside what the JSON readers accept (128 levels). The checks walk the value without recursion,
//! so no input of any depth overflows the stack.
//!
//! Error texts a store keeps (a command's `last_error`, a rejected timer's) are cut to
//! [`MAX_ERROR_LEN`] bytes instead: a handler's error is recorded whatever its length.

use std::io;

use serde_json::Value;

use crate::error::Error;

/// The nesting and size limits of stored JSON values.
///
/// ```
/// use miniflow_core::{json, JsonLimits};
///
/// let limits = JsonLimits::default();
/// assert_eq!((limits.max_depth, limits.max_bytes), (64, 1 << 20));
/// let mut deep = json!(1);
/// for _ in 0..65 {
///     deep = json!([deep]);
/// }
/// let err = limits.check("event.payload", &deep).unwrap_err();
/// assert!(err.to_string().contains("event.payload"));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JsonLimits {
    /// The deepest nesting of arrays and objects: a scalar has depth 0, `[1]` depth 1. Default 64, at
    /// most [`JsonLimits::MAX_DEPTH`].
    pub max_depth: usize,
    /// The longest canonical JSON text, in bytes. Default 1 MiB, at most [`JsonLimits::MAX_BYTES`].
    pub max_bytes: usize,
}

impl Default for JsonLimits {
    /// 64 levels, 1 MiB.
    fn default() -> Self {
        Self {
            max_depth: 64,
            max_bytes: 1 << 20,
        }
    }
}

impl JsonLimits {
    /// The highest `max_depth` a configuration may set: deep enough for any sane payload, and far
    /// enough under the readers' 128 levels for the levels miniflow wraps around a payload.
    pub const MAX_DEPTH: usize = 100;
    /// The highest `max_bytes` a configuration may set (64 MiB).
    pub const MAX_BYTES: usize = 64 << 20;

    /// Room kept under [`Self::max_bytes`] for what miniflow wraps around a value it feeds back in
    /// an event of its own: the other fields of `command_completed` around a result, of
    /// `command_resolved` around a note (a command ID, a kind, a count: well under 1 KiB).
    pub const FEEDBACK_ROOM: usize = 1024;

    /// The limits of a value miniflow feeds back into a workflow inside an event of its own: a
    /// command's result (`command_completed`) and a resolution's note (`command_resolved`). The
    /// default limits, one level and [`Self::FEEDBACK_ROOM`] bytes less, so that the event that
    /// carries the value is itself within the limits, and fires.
    ///
    /// ```
    /// use miniflow_core::{json, JsonLimits};
    ///
    /// let result = json!("x".repeat(JsonLimits::default().max_bytes - 100));
    /// assert!(JsonLimits::default().check("result", &result).is_ok());
    /// assert!(JsonLimits::fed_back().check("result", &result).is_err(), "no room for its event");
    /// ```
    pub fn fed_back() -> Self {
        let limits = Self::default();
        Self {
            max_depth: limits.max_depth - 1,
            max_bytes: limits.max_bytes - Self::FEEDBACK_ROOM,
        }
    }

    /// Checks the limits themselves.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a zero limit or one above [`Self::MAX_DEPTH`] / [`Self::MAX_BYTES`].
    pub fn validate(&self) -> Result<(), Error> {
        if self.max_depth == 0 || self.max_depth > Self::MAX_DEPTH {
            return Err(Error::invalid(
                "max_depth",
                self.max_depth,
                format!("must be 1 to {}", Self::MAX_DEPTH),
            ));
        }
        if self.max_bytes == 0 || self.max_bytes > Self::MAX_BYTES {
            return Err(Error::invalid(
                "max_bytes",
                self.max_bytes,
                format!("must be 1 to {}", Self::MAX_BYTES),
            ));
        }
        Ok(())
    }

    /// Checks `value`, named `path` in the error (e.g. `commands[1].payload`).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] naming `path` when the value nests deeper than `max_depth` or its
    /// canonical text is longer than `max_bytes`.
    pub fn check(&self, path: &str, value: &Value) -> Result<(), Error> {
        let depth = depth(value, self.max_depth);
        if depth > self.max_depth {
            return Err(Error::invalid(
                "json value",
                path,
                format!(
                    "nests deeper than {} levels of arrays and objects",
                    self.max_depth
                ),
            ));
        }
        // Bounded recursion from here on: the depth is known to be small.
        let mut counter = Counter {
            bytes: 0,
            max: self.max_bytes,
        };
        if serde_json::to_writer(&mut counter, value).is_err() || counter.bytes > self.max_bytes {
            return Err(Error::invalid(
                "json value",
                path,
                format!("is longer than {} bytes as JSON", self.max_bytes),
            ));
        }
        Ok(())
    }
}

/// Checks `value` against the default limits.
pub(crate) fn check_json(path: &str, value: &Value) -> Result<(), Error> {
    JsonLimits::default().check(path, value)
}

/// The nesting depth of `value`, counting no further than `stop + 1`; without recursion.
fn depth(value: &Value, stop: usize) -> usize {
    let mut deepest = 0;
    let mut stack: Vec<(&Value, usize)> = vec![(value, 0)];
    while let Some((value, level)) = stack.pop() {
        let children: Box<dyn Iterator<Item = &Value>> = match value {
            Value::Array(items) => Box::new(items.iter()),
            Value::Object(map) => Box::new(map.values()),
            _ => continue,
        };
        let level = level + 1;
        deepest = deepest.max(level);
        if deepest > stop {
            return deepest;
        }
        stack.extend(children.map(|child| (child, level)));
    }
    deepest
}

/// Drops `value` without recursion: `serde_json`'s own drop recurses once per level, so a value
/// refused for its depth is taken apart level by level instead.
pub(crate) fn drop_deep(value: Value) {
    let mut stack = vec![value];
    while let Some(mut value) = stack.pop() {
        match &mut value {
            Value::Array(items) => stack.append(items),
            // Taken whole, not entry by entry: removing from the map would bring the B-tree's
            // rebalancing code into the WebAssembly module for this one use.
            Value::Object(map) => stack.extend(std::mem::take(map).into_iter().map(|(_, v)| v)),
            _ => {}
        }
    }
}

/// Counts bytes written, failing once past `max`.
struct Counter {
    bytes: usize,
    max: usize,
}

impl io::Write for Counter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.bytes += buf.len();
        if self.bytes > self.max {
            return Err(io::Error::other("over the size limit"));
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The longest error text kept as a row's `last_error` (and fed back in `command_failed`), in bytes;
/// longer texts are cut at a character boundary and marked with `…`.
pub const MAX_ERROR_LEN: usize = 4096;

/// `error`, cut to [`MAX_ERROR_LEN`] bytes.
pub(crate) fn bounded_error(error: &str) -> String {
    if error.len() <= MAX_ERROR_LEN {
        return error.to_owned();
    }
    let mut end = MAX_ERROR_LEN - '…'.len_utf8();
    while !error.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &error[..end])
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn nested(levels: usize) -> Value {
        // Built by hand: `json!` would serialize (recursively) a value passed to it.
        let mut value = Value::String("leaf".into());
        for i in 0..levels {
            value = if i % 2 == 0 {
                Value::Array(vec![value])
            } else {
                Value::Object([("k".to_owned(), value)].into_iter().collect())
            };
        }
        value
    }

    #[test]
    fn depth_counts_arrays_and_objects() {
        assert_eq!(depth(&json!(1), 10), 0);
        assert_eq!(depth(&json!([]), 10), 1);
        assert_eq!(depth(&json!({ "a": [1, { "b": 2 }] }), 10), 3);
        assert_eq!(depth(&nested(64), 100), 64);
    }

    #[test]
    fn the_limits_accept_up_to_and_refuse_past_them_naming_the_path() {
        let limits = JsonLimits::default();
        assert!(limits.check("p", &nested(64)).is_ok());
        let err = limits
            .check("commands[1].payload", &nested(65))
            .unwrap_err();
        assert_eq!(err.code(), "INVALID_INPUT");
        assert!(err.to_string().contains("commands[1].payload"), "{err}");
        let big = json!("x".repeat(1 << 20));
        let err = limits.check("event.payload", &big).unwrap_err();
        assert!(err.to_string().contains("1048576 bytes"), "{err}");
        assert!(limits
            .check("event.payload", &json!("x".repeat(1000)))
            .is_ok());
    }

    #[test]
    fn no_depth_overflows_the_stack() {
        let deep = nested(200_000);
        let err = JsonLimits::default()
            .check("event.payload", &deep)
            .unwrap_err();
        assert!(err.to_string().contains("64 levels"), "{err}");
        drop_deep(deep);
    }

    #[test]
    fn no_depth_overflows_the_stack_on_the_write_paths() {
        use crate::{Command, Commit, Decision, Digest, Engine, Event, MemoryStore, Seq};
        use crate::{EventRecord, Timer, Timestamp, Workflow, WorkflowId};

        struct Echo;
        impl Workflow for Echo {
            type State = ();
            fn evolve(&self, _: &mut (), _: &EventRecord) {}
            fn decide(&self, _: &(), _: &EventRecord) -> Decision {
                Decision::new().command(Command::new("deep", nested(200_000)))
            }
        }
        let w = WorkflowId::new("w").unwrap();
        let now = Timestamp::from_millis(0);
        let commit = |event: Event, decision: Decision| {
            Commit::new(w.clone(), Seq::ZERO, event, decision, now).unwrap_err()
        };
        commit(Event::new("e", nested(200_000)), Decision::none());
        commit(
            Event::new("e", json!({})),
            Decision::new().command(Command::new("c", nested(200_000))),
        );
        commit(
            Event::new("e", json!({})),
            Decision::new().timer(Timer::after(
                "t",
                std::time::Duration::ZERO,
                nested(200_000),
            )),
        );
        let mut store = MemoryStore::new();
        let engine = Engine::new(Echo);
        let err = engine
            .handle(&mut store, &w, Event::new("e", nested(200_000)), now)
            .unwrap_err();
        assert!(err.to_string().contains("event.payload"), "{err}");
        let err = engine
            .handle(&mut store, &w, Event::new("e", json!({})), now)
            .unwrap_err();
        assert!(err.to_string().contains("commands[0].payload"), "{err}");
        let deep = nested(200_000);
        assert_eq!(Digest::of(&deep), Digest::of(&deep));
        let request = Value::Object([("trip".to_owned(), deep)].into_iter().collect());
        assert_eq!(
            Digest::of_intent(&request, &["trip"]),
            Digest::of(&request),
            "an intent of every field is the whole request"
        );
        drop_deep(request);
    }

    #[test]
    fn limits_themselves_are_bounded() {
        assert!(JsonLimits::default().validate().is_ok());
        for bad in [
            JsonLimits {
                max_depth: 0,
                ..JsonLimits::default()
            },
            JsonLimits {
                max_depth: 101,
                ..JsonLimits::default()
            },
            JsonLimits {
                max_bytes: 0,
                ..JsonLimits::default()
            },
        ] {
            assert_eq!(bad.validate().unwrap_err().code(), "INVALID_INPUT");
        }
    }
}
