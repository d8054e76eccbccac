//! The one error type of miniflow's stores and engine.

use std::fmt::Display;

use crate::id::{CommandId, Seq, WorkflowId};
use crate::invalid::InvalidInput;
use crate::status::Status;
use crate::time::Shown;

/// A boxed error from a storage driver, kept as the source of [`Error::Storage`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// What went wrong, as a kind the caller can act on. Each variant says how to handle it.
///
/// Every store maps its driver's errors onto these kinds (a SQLite primary-key clash on
/// `(workflow_id, seq)` becomes [`Error::Conflict`], `SQLITE_BUSY` becomes [`Error::Busy`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The caller passed a bad value. Fix the caller; retrying the same input fails the same way.
    /// Nothing was written.
    #[error("invalid {field} {value:?}: {reason}")]
    InvalidInput {
        /// Which input was wrong.
        field: &'static str,
        /// The offending value, as text; one longer than 256 bytes is cut there (at a character
        /// boundary), followed by `…` and its whole length in bytes (`"xxx… (1048576 bytes)"`).
        value: String,
        /// What is wrong with it. It never repeats more of the value than `value` does.
        reason: String,
    },

    /// Optimistic concurrency: the workflow moved on since it was replayed. Nothing was written.
    /// Replay and decide again ([`crate::Engine::handle`] does this for you, a bounded number of times).
    #[error("conflict on workflow {workflow_id}: expected last seq {expected}, found {actual}")]
    Conflict {
        /// The workflow whose commit lost the race.
        workflow_id: WorkflowId,
        /// The last seq the commit was based on.
        expected: Seq,
        /// The workflow's actual last seq.
        actual: Seq,
    },

    /// The workflow refused the event ([`crate::Decision::reject`]). Nothing was written.
    #[error("workflow {workflow_id} rejected the event: {reason}")]
    Rejected {
        /// The workflow.
        workflow_id: WorkflowId,
        /// Why, in the workflow's words.
        reason: String,
    },

    /// No outbox row has this command ID. Usually a caller bug (a typo, or another store).
    #[error("unknown command {command_id}")]
    UnknownCommand {
        /// The ID that was looked up.
        command_id: CommandId,
    },

    /// No idempotency record has this key (it was never reserved, or was purged).
    #[error("unknown idempotency key {key:?}")]
    UnknownKey {
        /// The key that was looked up.
        key: String,
    },

    /// A receiver would forget idempotency keys before the producer stops retrying, so a late retry
    /// would repeat the effect. Fix the configuration: keep records longer, or retry for less long.
    #[error("idempotency retention {} is shorter than the producer's retry horizon plus margin {}: a late retry would repeat its effect", Shown(*.retention), Shown(*.required))]
    RetentionTooShort {
        /// The receiver's retention.
        retention: std::time::Duration,
        /// The longest time the producer may retry, plus the margin for retries by hand.
        required: std::time::Duration,
    },

    /// The caller's lease is no longer the current one: it expired and another worker took the command
    /// over, or the command was settled. Nothing was changed; drop the result (the receiver folds the
    /// new holder's delivery into the same effect).
    #[error("stale lease on {command_id}: token {token} is not the current lease ({current})")]
    StaleLease {
        /// The command the caller thought it held.
        command_id: CommandId,
        /// The token the caller presented.
        token: u64,
        /// What holds the command now, in words.
        current: String,
    },

    /// A receiver's reservation is no longer the caller's: it timed out and another caller took the key
    /// over, or it was finished or abandoned. Nothing was changed; the caller must not report its own
    /// result (the current holder's is the one that counts).
    #[error("stale reservation of idempotency key {key:?}: token {token} is not the current reservation ({current})")]
    StaleReservation {
        /// The key.
        key: String,
        /// The token the caller presented.
        token: u64,
        /// What holds the key now, in words.
        current: String,
    },

    /// The commit was to fire a timer that already fired, was cancelled, or does not exist: another
    /// firer won, or a decision cancelled it. Nothing was written; drop this firing.
    #[error("timer {timer_id} is {status}, not scheduled: it fires once")]
    TimerNotScheduled {
        /// The timer.
        timer_id: String,
        /// `fired`, `cancelled` or `unknown`.
        status: &'static str,
    },

    /// The operation does not apply to a command in this state (e.g. resolving a command that is not
    /// dead). Nothing was changed.
    #[error("cannot {operation} command {command_id}: it is {status}")]
    InvalidState {
        /// The command.
        command_id: CommandId,
        /// Its current status.
        status: Status,
        /// What was attempted.
        operation: &'static str,
    },

    /// The store is temporarily locked by another writer. Nothing was written; retry later.
    #[error("store busy: {0}")]
    Busy(#[source] BoxError),

    /// The store was written by a newer version of miniflow. Nothing was changed; upgrade miniflow.
    #[error("the store has schema version {found}, this miniflow supports up to {supported}: upgrade miniflow to open it")]
    UnsupportedSchema {
        /// The version found in the store.
        found: i64,
        /// The newest version this build knows.
        supported: i64,
    },

    /// The store holds data miniflow cannot read back (edited by hand, or damaged).
    #[error("corrupt store: {0}")]
    Corrupt(String),

    /// The storage driver failed (disk full, I/O error, …). The operation's writes were rolled back.
    #[error("storage error: {0}")]
    Storage(#[source] BoxError),
}

impl From<InvalidInput> for Error {
    fn from(refused: InvalidInput) -> Self {
        let (field, value, reason) = refused.into_parts();
        Error::InvalidInput {
            field,
            value,
            reason,
        }
    }
}

impl Error {
    /// An [`Error::InvalidInput`] naming `field`, its `value` (cut to a bounded length, see
    /// [`Error::InvalidInput`]: a rejected megabyte makes a short message) and the `reason`.
    pub fn invalid(field: &'static str, value: impl Display, reason: impl Into<String>) -> Self {
        InvalidInput::of(field, &value, reason.into()).into()
    }

    /// A stable, machine-readable name of the kind (`"CONFLICT"`, `"STALE_LEASE"`, …), the same on every
    /// host (the JS binding throws errors with this `code`).
    pub fn code(&self) -> &'static str {
        match self {
            Error::InvalidInput { .. } => "INVALID_INPUT",
            Error::Conflict { .. } => "CONFLICT",
            Error::Rejected { .. } => "REJECTED",
            Error::UnknownCommand { .. } | Error::UnknownKey { .. } => "NOT_FOUND",
            Error::RetentionTooShort { .. } => "RETENTION_TOO_SHORT",
            Error::StaleLease { .. } => "STALE_LEASE",
            Error::StaleReservation { .. } => "STALE_RESERVATION",
            Error::InvalidState { .. } => "INVALID_STATE",
            Error::TimerNotScheduled { .. } => "TIMER_NOT_SCHEDULED",
            Error::Busy(_) => "BUSY",
            Error::UnsupportedSchema { .. } => "UNSUPPORTED_SCHEMA",
            Error::Corrupt(_) => "CORRUPT",
            Error::Storage(_) => "STORAGE",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::invalid::SHOWN_BYTES;

    fn megabyte_of(c: char) -> String {
        std::iter::repeat_n(c, (1 << 20) / c.len_utf8()).collect()
    }

    #[test]
    fn a_rejected_value_of_a_megabyte_is_cut_in_the_message_which_still_names_the_field() {
        let big = megabyte_of('x');
        let mut refused = vec![(
            Error::from(WorkflowId::new(big.clone()).unwrap_err()),
            "workflow_id",
            big.len(),
        )];
        #[cfg(feature = "cron")]
        refused.push((
            crate::Schedule::cron("nightly", big.clone())
                .check(crate::Timestamp::from_millis(0))
                .unwrap_err(),
            "schedule.cron",
            big.len(),
        ));
        // Cut at a character boundary: three-byte characters, 256 bytes falling inside one.
        let wide = megabyte_of('€');
        refused.push((
            Error::from(WorkflowId::new(wide.clone()).unwrap_err()),
            "workflow_id",
            wide.len(),
        ));
        for (error, field, len) in refused {
            let message = error.to_string();
            assert!(
                message.len() < 400,
                "{} bytes: {}…",
                message.len(),
                message.chars().take(200).collect::<String>()
            );
            assert!(
                message.starts_with(&format!("invalid {field} ")),
                "{message}"
            );
            assert!(message.contains(&format!("… ({len} bytes)")), "{message}");
            let Error::InvalidInput { value, .. } = &error else {
                panic!("{error:?}")
            };
            assert!(value.len() < 300, "the field keeps {} bytes", value.len());
            let shown = value.split('…').next().unwrap();
            assert!(
                (SHOWN_BYTES - 3..=SHOWN_BYTES).contains(&shown.len()),
                "{shown:?}"
            );
        }
    }

    #[test]
    fn a_short_value_is_shown_whole() {
        let exactly = "y".repeat(SHOWN_BYTES);
        let error = Error::invalid("name", &exactly, "is wrong");
        assert_eq!(
            error.to_string(),
            format!("invalid name {exactly:?}: is wrong")
        );
    }
}
