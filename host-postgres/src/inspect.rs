//! What operators' tools read of a database besides its rows: one outbox row with every column as
//! stored (for a row miniflow cannot read), a workflow's events read one by one (an unreadable
//! event reported apart, not fatal), and how many rows a purge would delete. Each is a read only:
//! a store connected with [`PostgresStore::connect_read_only`] answers them all, in its read-only
//! sessions (DESIGN rule 17).

use std::time::Duration;

use miniflow_core::{purge_cutoff, Error, EventRecord, Seq, Timestamp, WorkflowId};
use postgres::types::Type;
use postgres::Row;

use crate::db::{block, Columns, Exec};
use crate::errors::storage;
use crate::rows::{get, time, Unreadable};
use crate::store::PostgresStore;

/// Every column of the outbox row keyed `(workflow_id, event_seq, idx)`.
const RAW_BY_KEY: &str =
    "SELECT * FROM outbox WHERE workflow_id = $1 AND event_seq = $2 AND idx = $3";
/// A workflow's events as stored, in seq order.
const EVENTS_AS_STORED: &str =
    "SELECT seq, kind, payload, recorded_at FROM events WHERE workflow_id = $1 ORDER BY seq";
/// The rows `purge_done` deletes with cutoff `$1` ([`miniflow_core::OutboxRow::is_purgeable`]):
/// done or cancelled, processed at or before the cutoff (the partial index `outbox_done`).
const COUNT_PURGEABLE: &str = "SELECT count(*) FROM outbox \
     WHERE status IN ('done', 'cancelled') AND processed_at <= $1";

pub use miniflow_core::{EventListing, UnreadableEvent};

impl PostgresStore {
    /// Every column of one outbox row by name, in the table's order, as stored: integers, reals and
    /// booleans as JSON numbers and booleans, everything else as its text, NULL as `null` (a value
    /// that cannot be had as text as a string saying why). For a row that [`Outbox::command`]
    /// cannot read. `command_id` is read from the right (`workflow:seq:index`, the workflow ID as
    /// stored, whatever it holds) and need not be a valid [`miniflow_core::CommandId`]; `None`
    /// when no row has that key.
    ///
    /// [`Outbox::command`]: miniflow_core::Outbox::command
    ///
    /// # Errors
    ///
    /// [`Error::Storage`] when the database cannot be read.
    pub fn raw_command(
        &self,
        command_id: &str,
    ) -> Result<Option<Vec<(String, serde_json::Value)>>, Error> {
        let mut key = command_id.rsplitn(3, ':');
        let (Some(idx), Some(seq), Some(workflow_id)) = (key.next(), key.next(), key.next()) else {
            return Ok(None);
        };
        let (Ok(seq), Ok(idx)) = (seq.parse::<i64>(), idx.parse::<i64>()) else {
            return Ok(None);
        };
        let mut connection = self.shared().connection()?;
        let row = block(
            connection
                .db()
                .query_opt(RAW_BY_KEY, &[&workflow_id, &seq, &idx]),
        )
        .map_err(storage)?;
        Ok(row.map(|row| stored_columns(&row)))
    }

    /// The events of `workflow_id` in seq order, each read on its own: those that read, and apart
    /// from them those that cannot be read, with their stored seq and why (for operators' tools;
    /// [`EventLog::load`] refuses a history with an unreadable event as [`Error::Corrupt`]). Empty
    /// for an unknown or retired workflow.
    ///
    /// [`EventLog::load`]: miniflow_core::EventLog::load
    ///
    /// # Errors
    ///
    /// [`Error::Storage`] when the database cannot be read.
    pub fn events_listing(&self, workflow_id: &WorkflowId) -> Result<EventListing, Error> {
        let mut connection = self.shared().connection()?;
        let rows = block(
            connection
                .db()
                .query(EVENTS_AS_STORED, &[&workflow_id.as_str()]),
        )
        .map_err(storage)?;
        let mut listing = EventListing::default();
        for row in &rows {
            match read_event(workflow_id, row) {
                Ok(event) => listing.events.push(event),
                Err(why) => listing.unreadable.push(UnreadableEvent::new(
                    row.try_get::<_, i64>("seq")
                        .map_or_else(|_| "?".to_owned(), |seq| seq.to_string()),
                    why.to_string(),
                )),
            }
        }
        Ok(listing)
    }

    /// How many done (and cancelled) commands `purge_done` would delete at `now` with
    /// `older_than` (those [`miniflow_core::OutboxRow::is_purgeable`] admits: processed at or
    /// before [`purge_cutoff`], from the store's clock as `purge_done` takes it). Nothing is
    /// changed; a store connected read-only can count: what a dry run of the purge prints.
    ///
    /// # Errors
    ///
    /// [`Error::Storage`] when the database cannot be read.
    pub fn count_purgeable(&self, older_than: Duration, now: Timestamp) -> Result<usize, Error> {
        let mut connection = self.shared().connection()?;
        let mut db = connection.db();
        let now = self.clock(&mut db, now)?.now;
        let Some(cutoff) = purge_cutoff(now, older_than) else {
            return Ok(0);
        };
        // A cutoff past what a bigint holds (the year 292 million) reaches every stored time.
        let cutoff = i64::try_from(cutoff.as_millis()).unwrap_or(i64::MAX);
        let count: i64 = block(db.query_one(COUNT_PURGEABLE, &[&cutoff]))
            .and_then(|row| Columns::try_get(&row, 0))
            .map_err(storage)?;
        Ok(usize::try_from(count).unwrap_or(0))
    }
}

/// Every column of `row` by name, as [`PostgresStore::raw_command`] shows them.
fn stored_columns(row: &Row) -> Vec<(String, serde_json::Value)> {
    let mut columns = Vec::with_capacity(row.len());
    for (i, column) in row.columns().iter().enumerate() {
        let value = match *column.type_() {
            Type::INT8 => row
                .try_get::<_, Option<i64>>(i)
                .map(serde_json::Value::from),
            Type::INT4 => row
                .try_get::<_, Option<i32>>(i)
                .map(serde_json::Value::from),
            Type::INT2 => row
                .try_get::<_, Option<i16>>(i)
                .map(serde_json::Value::from),
            Type::BOOL => row
                .try_get::<_, Option<bool>>(i)
                .map(serde_json::Value::from),
            Type::FLOAT8 => row
                .try_get::<_, Option<f64>>(i)
                .map(serde_json::Value::from),
            _ => row
                .try_get::<_, Option<String>>(i)
                .map(serde_json::Value::from),
        };
        let value = value.unwrap_or_else(|e| format!("(cannot be shown: {e})").into());
        columns.push((column.name().to_owned(), value));
    }
    columns
}

/// One event of `workflow_id` from the columns of [`EVENTS_AS_STORED`].
fn read_event(workflow_id: &WorkflowId, row: &Row) -> Result<EventRecord, Unreadable> {
    let seq: i64 = get(row, "seq")?;
    let payload: &str = get(row, "payload")?;
    Ok(EventRecord {
        workflow_id: workflow_id.clone(),
        seq: u64::try_from(seq)
            .ok()
            .and_then(|s| Seq::new(s).ok())
            .ok_or_else(|| Unreadable {
                column: "seq",
                reason: format!("holds {seq}, out of range"),
            })?,
        kind: get(row, "kind")?,
        payload: serde_json::from_str(payload).map_err(|e| Unreadable {
            column: "payload",
            reason: format!("cannot be read as JSON: {e}"),
        })?,
        recorded_at: time(row, "recorded_at")?,
    })
}
