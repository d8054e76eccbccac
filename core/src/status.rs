//! [`Status`]: where a command is in its life, as the outbox stores it.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::invalid::InvalidInput;

/// Where a command is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Waiting for delivery (from `available_at`).
    Pending,
    /// Held by a worker under a lease until `available_at`.
    Leased,
    /// Delivered with a verified result, or resolved by hand.
    Done,
    /// Gave up: out of attempts or failed for good. Waits for a person to `retry` or `resolve` it.
    Dead,
    /// Withdrawn by a later decision of its workflow before it was delivered: never delivered.
    Cancelled,
}

impl Status {
    /// The lowercase name used in storage and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pending => "pending",
            Status::Leased => "leased",
            Status::Done => "done",
            Status::Dead => "dead",
            Status::Cancelled => "cancelled",
        }
    }

    /// Pending or leased: the command still has to be delivered.
    pub fn is_unfinished(self) -> bool {
        matches!(self, Status::Pending | Status::Leased)
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Status {
    type Err = InvalidInput;

    fn from_str(s: &str) -> Result<Self, InvalidInput> {
        match s {
            "pending" => Ok(Status::Pending),
            "leased" => Ok(Status::Leased),
            "done" => Ok(Status::Done),
            "dead" => Ok(Status::Dead),
            "cancelled" => Ok(Status::Cancelled),
            other => Err(InvalidInput::new(
                "status",
                other,
                "expected pending, leased, done, dead or cancelled",
            )),
        }
    }
}
