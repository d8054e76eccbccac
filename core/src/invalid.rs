//! [`InvalidInput`]: a value miniflow refuses, which input it was, and why — what the checks of the
//! plainest values (IDs, seqs, statuses) return, below the one [`Error`](crate::Error) of the stores
//! and the engine, which it becomes through `?`.

use std::fmt::Display;

/// How many bytes of a rejected value an [`InvalidInput`] repeats, at most: a value just past any of
/// miniflow's limits on IDs and keys (128 and 255 bytes) is still shown whole.
pub(crate) const SHOWN_BYTES: usize = 256;

/// A value the caller passed that miniflow refuses. Fix the caller; the same input fails the same way.
///
/// The checks of IDs, seqs and statuses return it ([`WorkflowId::new`](crate::WorkflowId::new),
/// parsing a [`CommandId`](crate::CommandId), …); `?` turns it into
/// [`Error::InvalidInput`](crate::Error::InvalidInput) with the same fields and message.
///
/// ```
/// use miniflow_core::{Error, WorkflowId};
///
/// let refused = WorkflowId::new("").unwrap_err();
/// assert_eq!(refused.field(), "workflow_id");
/// assert_eq!(refused.to_string(), r#"invalid workflow_id "": must not be empty"#);
/// let error = Error::from(refused);
/// assert!(matches!(error, Error::InvalidInput { field: "workflow_id", .. }));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {field} {value:?}: {reason}")]
pub struct InvalidInput {
    field: &'static str,
    value: String,
    reason: String,
}

impl InvalidInput {
    /// `field` refused: its `value`, cut to a bounded length (a rejected megabyte makes a short
    /// message), and the `reason`.
    pub fn new(field: &'static str, value: impl Display, reason: impl Into<String>) -> Self {
        Self::of(field, &value, reason.into())
    }

    /// [`InvalidInput::new`] past its conversions: one body for every type of value (the checks
    /// refuse many, and a body each would weigh on the WebAssembly build).
    pub(crate) fn of(field: &'static str, value: &dyn Display, reason: String) -> Self {
        Self {
            field,
            value: cut(value.to_string(), SHOWN_BYTES),
            reason,
        }
    }

    /// Which input was wrong.
    pub fn field(&self) -> &'static str {
        self.field
    }

    /// The offending value, as text; one longer than 256 bytes is cut there (at a character
    /// boundary), followed by `…` and its whole length in bytes (`"xxx… (1048576 bytes)"`).
    pub fn value(&self) -> &str {
        &self.value
    }

    /// What is wrong with it. It never repeats more of the value than [`Self::value`] does.
    pub fn reason(&self) -> &str {
        &self.reason
    }

    /// The field, the value and the reason, to build [`Error::InvalidInput`](crate::Error::InvalidInput).
    pub(crate) fn into_parts(self) -> (&'static str, String, String) {
        (self.field, self.value, self.reason)
    }
}

/// `text` cut after its first `bytes` bytes (at a character boundary: fewer when a character
/// straddles it), followed by `…` and its whole length in bytes; shorter text as it is.
fn cut(text: String, bytes: usize) -> String {
    if text.len() <= bytes {
        return text;
    }
    let end = text.floor_char_boundary(bytes);
    format!("{}… ({} bytes)", &text[..end], text.len())
}
