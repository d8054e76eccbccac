//! What operators' listings show: the rows a store could read, and apart from them the rows it
//! holds but cannot read (edited by hand, damaged, or written by a version that stored them
//! otherwise), as stored. Every store answers its listings with these types.

use crate::model::EventRecord;
use crate::outbox::OutboxRow;

/// The outbox rows of a listing (a store's `pending_listing`, `dead_listing`): those that read, and
/// apart from them those that cannot be read.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct Listing {
    /// The rows that read, in the listing's order.
    pub rows: Vec<OutboxRow>,
    /// The rows among the first `limit` that cannot be read.
    pub unreadable: Vec<UnreadableCommand>,
}

/// A row of the outbox that cannot be read, as stored.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct UnreadableCommand {
    /// Its ID as stored (`workflow_id:event_seq:idx`).
    pub command_id: String,
    /// Its stored status.
    pub status: String,
    /// Why it cannot be read, naming the column.
    pub error: String,
}

impl UnreadableCommand {
    /// A row named `command_id` with status `status` as stored, unreadable for `error`.
    pub fn new(
        command_id: impl Into<String>,
        status: impl Into<String>,
        error: impl Into<String>,
    ) -> Self {
        Self {
            command_id: command_id.into(),
            status: status.into(),
            error: error.into(),
        }
    }
}

/// A workflow's events as a store's `events_listing` reads them: those that read, and apart from
/// them those that cannot be read.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct EventListing {
    /// The events that read, in seq order.
    pub events: Vec<EventRecord>,
    /// The events that cannot be read, in seq order.
    pub unreadable: Vec<UnreadableEvent>,
}

/// An event a store holds but cannot read, as stored.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct UnreadableEvent {
    /// Its seq as stored.
    pub seq: String,
    /// Why it cannot be read, naming the column.
    pub error: String,
}

impl UnreadableEvent {
    /// The event of seq `seq` as stored, unreadable for `error`.
    pub fn new(seq: impl Into<String>, error: impl Into<String>) -> Self {
        Self {
            seq: seq.into(),
            error: error.into(),
        }
    }
}
