//! Identities: workflow IDs, event sequence numbers and deterministic command IDs.
//!
//! A command ID is `"{workflow_id}:{event_seq}:{index}"` (DESIGN rule 4). It is derived, never random,
//! so a retried decision reproduces the same ID and a receiver can fold duplicates. It is parsed from the
//! right, so a workflow ID may itself contain `:`.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::invalid::InvalidInput;

/// The identity of one workflow instance, e.g. `trip-001`.
///
/// Valid IDs are UTF-8, 1 to [`WorkflowId::MAX_LEN`] bytes, with no control characters (DESIGN rule 1).
/// Construction is the only place that checks, so every `WorkflowId` in the program is valid.
///
/// ```
/// use miniflow_core::WorkflowId;
///
/// let id: WorkflowId = "order:42".parse()?;
/// assert_eq!(id.as_str(), "order:42");
/// assert!(WorkflowId::new("").is_err());
/// assert!(WorkflowId::new("a\nb").is_err());
/// # Ok::<(), miniflow_core::Error>(())
/// ```
///
/// Clones share the text: every event, outbox row, command ID and index entry of a workflow points
/// at one copy of its ID. The first 16 bytes are also kept inline, so that most comparisons (the
/// in-memory store's indexes make many) decide without reading the shared text.
#[derive(Clone)]
pub struct WorkflowId {
    /// The first 16 bytes as two big-endian numbers, padded with zeros: ordered as the text's first 16
    /// bytes, as no valid ID holds a zero byte (a control character). (Not a `u128`, whose alignment
    /// would make every row and index node a costlier allocation.)
    head: [u64; 2],
    text: Arc<str>,
}

impl PartialEq for WorkflowId {
    fn eq(&self, other: &Self) -> bool {
        self.head == other.head && (Arc::ptr_eq(&self.text, &other.text) || self.text == other.text)
    }
}

impl Eq for WorkflowId {}

impl Ord for WorkflowId {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.head
            .cmp(&other.head)
            .then_with(|| self.text.cmp(&other.text))
    }
}

impl PartialOrd for WorkflowId {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl std::hash::Hash for WorkflowId {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.text.hash(state);
    }
}

impl fmt::Debug for WorkflowId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("WorkflowId").field(&&*self.text).finish()
    }
}

impl WorkflowId {
    /// The longest valid workflow ID, in bytes of UTF-8.
    pub const MAX_LEN: usize = 128;

    /// Checks `id` and wraps it.
    ///
    /// # Errors
    ///
    /// [`InvalidInput`] naming the value when it is empty, longer than [`Self::MAX_LEN`] bytes, or
    /// contains a control character or an invisible formatting character (zero-width characters,
    /// bidirectional overrides and isolates, the byte-order mark, the soft hyphen).
    pub fn new(id: impl Into<String>) -> Result<Self, InvalidInput> {
        let id = id.into();
        let reason = if id.is_empty() {
            Some("must not be empty".to_owned())
        } else if id.len() > Self::MAX_LEN {
            Some(format!(
                "is {} bytes of UTF-8, the limit is {}",
                id.len(),
                Self::MAX_LEN
            ))
        } else if let Some(at) = id.chars().position(char::is_control) {
            Some(format!("has a control character at character {at}"))
        } else {
            id.chars().position(is_invisible).map(|at| {
                format!(
                    "has an invisible formatting character (zero-width or bidirectional) at \
                     character {at}: two IDs that print alike must be the same ID"
                )
            })
        };
        match reason {
            Some(reason) => Err(InvalidInput::new("workflow_id", &id, reason)),
            None => {
                let mut bytes = [0; 16];
                let len = id.len().min(16);
                bytes[..len].copy_from_slice(&id.as_bytes()[..len]);
                let [a, b] = [&bytes[..8], &bytes[8..]]
                    .map(|half| u64::from_be_bytes(half.try_into().unwrap_or_default()));
                Ok(Self {
                    head: [a, b],
                    text: Arc::from(id),
                })
            }
        }
    }

    /// The ID as text.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

/// Unicode format characters (category Cf) that change how text prints without printing themselves:
/// two IDs differing only by them would look the same to an operator.
fn is_invisible(c: char) -> bool {
    matches!(
        c,
        '\u{00AD}'
            | '\u{061C}'
            | '\u{180E}'
            | '\u{200B}'..='\u{200F}'
            | '\u{202A}'..='\u{202E}'
            | '\u{2060}'..='\u{2064}'
            | '\u{2066}'..='\u{206F}'
            | '\u{FEFF}'
            | '\u{FFF9}'..='\u{FFFB}'
    )
}

impl fmt::Display for WorkflowId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl FromStr for WorkflowId {
    type Err = InvalidInput;

    fn from_str(s: &str) -> Result<Self, InvalidInput> {
        Self::new(s)
    }
}

impl TryFrom<&str> for WorkflowId {
    type Error = InvalidInput;

    fn try_from(s: &str) -> Result<Self, InvalidInput> {
        Self::new(s)
    }
}

impl TryFrom<String> for WorkflowId {
    type Error = InvalidInput;

    fn try_from(s: String) -> Result<Self, InvalidInput> {
        Self::new(s)
    }
}

impl AsRef<str> for WorkflowId {
    fn as_ref(&self) -> &str {
        &self.text
    }
}

impl Serialize for WorkflowId {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.text)
    }
}

impl<'de> Deserialize<'de> for WorkflowId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Self::new(text).map_err(serde::de::Error::custom)
    }
}

/// The position of an event in its workflow: 1, 2, 3… with no gaps (DESIGN rule 2).
///
/// `Seq::ZERO` means "no event yet": it is the `last_seq` of a new workflow and the `expected_seq` of
/// its first commit. Seqs stop at [`Seq::MAX`] (2^53 − 1) so that every host, JavaScript included,
/// represents them exactly.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Seq(u64);

impl Seq {
    /// Before the first event.
    pub const ZERO: Seq = Seq(0);
    /// The first seq of every workflow.
    pub const ONE: Seq = Seq(1);
    /// The largest seq: 2^53 − 1, the largest integer JavaScript represents exactly.
    pub const MAX: Seq = Seq((1 << 53) - 1);

    /// Wraps a raw seq.
    ///
    /// # Errors
    ///
    /// [`InvalidInput`] when `value` is above [`Seq::MAX`].
    pub fn new(value: u64) -> Result<Self, InvalidInput> {
        if value > Self::MAX.0 {
            return Err(InvalidInput::new(
                "seq",
                value,
                format!("is above the largest seq {}", Self::MAX.0),
            ));
        }
        Ok(Self(value))
    }

    /// The raw number.
    pub const fn get(self) -> u64 {
        self.0
    }

    /// The seq after this one.
    ///
    /// # Errors
    ///
    /// [`InvalidInput`] when this is already [`Seq::MAX`].
    pub fn next(self) -> Result<Self, InvalidInput> {
        Self::new(self.0 + 1)
    }
}

impl fmt::Display for Seq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// The deterministic identity of one command: `"{workflow_id}:{event_seq}:{index}"` (DESIGN rule 4).
///
/// `event_seq` is the seq of the event whose decision produced the command (at least 1) and `index` the
/// command's 0-based position in that decision. Ordering is by `(workflow_id, event_seq, index)` with
/// the numbers compared as numbers, so `w:1:2` comes before `w:1:10` (DESIGN rule 6).
///
/// ```
/// use miniflow_core::{CommandId, Seq, WorkflowId};
///
/// let id: CommandId = "order:42:3:1".parse()?;
/// assert_eq!(id.workflow_id().as_str(), "order:42");
/// assert_eq!(id.event_seq(), Seq::new(3)?);
/// assert_eq!(id.index(), 1);
/// assert_eq!(id.to_string(), "order:42:3:1");
///
/// let first: CommandId = "w:1:2".parse()?;
/// let later: CommandId = "w:1:10".parse()?;
/// assert!(first < later);
/// # Ok::<(), miniflow_core::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CommandId {
    workflow_id: WorkflowId,
    event_seq: Seq,
    index: u32,
}

impl CommandId {
    /// The ID of command number `index` decided by event `event_seq` of `workflow_id`.
    ///
    /// # Errors
    ///
    /// [`InvalidInput`] when `event_seq` is 0: commands are decided by events, which start at 1.
    pub fn new(workflow_id: WorkflowId, event_seq: Seq, index: u32) -> Result<Self, InvalidInput> {
        if event_seq == Seq::ZERO {
            return Err(InvalidInput::new(
                "event_seq",
                0,
                "a command is decided by an event, and event seqs start at 1",
            ));
        }
        Ok(Self {
            workflow_id,
            event_seq,
            index,
        })
    }

    /// The workflow the command belongs to.
    pub fn workflow_id(&self) -> &WorkflowId {
        &self.workflow_id
    }

    /// The seq of the event that decided the command.
    pub fn event_seq(&self) -> Seq {
        self.event_seq
    }

    /// The command's 0-based position in its decision.
    pub fn index(&self) -> u32 {
        self.index
    }
}

impl fmt::Display for CommandId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.workflow_id, self.event_seq, self.index)
    }
}

/// Parses a canonical decimal: ASCII digits only, no sign, no leading zero (so that parsing and
/// printing round-trip and one command has exactly one spelling).
fn parse_canonical_decimal(text: &str) -> Option<u64> {
    let canonical = !text.is_empty()
        && text.bytes().all(|b| b.is_ascii_digit())
        && (text == "0" || !text.starts_with('0'));
    canonical.then(|| text.parse().ok()).flatten()
}

impl FromStr for CommandId {
    type Err = InvalidInput;

    fn from_str(s: &str) -> Result<Self, InvalidInput> {
        let invalid = |reason: &str| InvalidInput::new("command_id", s, reason);
        let mut parts = s.rsplitn(3, ':');
        let (Some(index), Some(seq), Some(workflow_id)) =
            (parts.next(), parts.next(), parts.next())
        else {
            return Err(invalid("expected \"{workflow_id}:{event_seq}:{index}\""));
        };
        let index = parse_canonical_decimal(index)
            .and_then(|i| u32::try_from(i).ok())
            .ok_or_else(|| invalid("index must be a decimal number from 0 to 4294967295"))?;
        let seq = parse_canonical_decimal(seq)
            .and_then(|n| Seq::new(n).ok())
            .filter(|n| *n != Seq::ZERO)
            .ok_or_else(|| invalid("event_seq must be a decimal number from 1 to 2^53 - 1"))?;
        let workflow_id = WorkflowId::new(workflow_id)
            .map_err(|e| invalid(&format!("its workflow id is invalid: {e}")))?;
        Self::new(workflow_id, seq, index)
    }
}

impl TryFrom<&str> for CommandId {
    type Error = InvalidInput;

    fn try_from(s: &str) -> Result<Self, InvalidInput> {
        s.parse()
    }
}

impl Serialize for CommandId {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for CommandId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workflow_id_limit_is_in_bytes_not_characters() {
        assert!(WorkflowId::new("é".repeat(64)).is_ok());
        let err = WorkflowId::new("é".repeat(65)).unwrap_err();
        assert!(err.to_string().contains("130 bytes"), "{err}");
    }

    #[test]
    fn workflow_ids_compare_and_hash_as_their_text() {
        use std::collections::hash_map::DefaultHasher;
        use std::hash::{Hash, Hasher};
        let texts = [
            "a",
            "a:b",
            "ab",
            "b",
            "trip-1",
            "trip-10",
            "trip-9",
            "order-2024-11-05-000123",
            "order-2024-11-05-000124",
            "order-2024-11-05-00012",
            "0123456789abcdef",
            "0123456789abcdeg",
            "0123456789abcdef0",
            "0123456789abcde",
            "é",
            "e\u{301}",
            "成都",
            "\u{10FFFF}",
            "~",
        ];
        let hash = |id: &WorkflowId| {
            let mut hasher = DefaultHasher::new();
            id.hash(&mut hasher);
            hasher.finish()
        };
        for a in texts {
            for b in texts {
                let (x, y) = (WorkflowId::new(a).unwrap(), WorkflowId::new(b).unwrap());
                assert_eq!(x.cmp(&y), a.cmp(b), "{a:?} vs {b:?}");
                assert_eq!(x == y, a == b, "{a:?} vs {b:?}");
                if a == b {
                    assert_eq!(hash(&x), hash(&y));
                }
            }
        }
        assert_eq!(
            format!("{:?}", WorkflowId::new("w").unwrap()),
            r#"WorkflowId("w")"#
        );
    }

    #[test]
    fn command_id_refuses_non_canonical_numbers() {
        for bad in [
            "w:01:0",
            "w:1:00",
            "w:+1:0",
            "w:1: 0",
            "w:1:4294967296",
            "w:9007199254740992:0",
        ] {
            assert!(bad.parse::<CommandId>().is_err(), "{bad} was accepted");
        }
    }

    #[test]
    fn command_id_error_names_the_value() {
        let err = "trip-001:x:0".parse::<CommandId>().unwrap_err();
        assert!(err.to_string().contains("trip-001:x:0"), "{err}");
    }

    #[test]
    fn serde_round_trips_and_validates() {
        let id: CommandId = "a:1:2:0".parse().unwrap();
        let json = serde_json::to_string(&id).unwrap();
        assert_eq!(json, "\"a:1:2:0\"");
        assert_eq!(serde_json::from_str::<CommandId>(&json).unwrap(), id);
        assert!(serde_json::from_str::<WorkflowId>("\"\"").is_err());
    }
}
