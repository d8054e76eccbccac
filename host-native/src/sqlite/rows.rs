//! Reading rows: the outbox columns and queries, readers, and rows that cannot be read.

use super::*;

/// The columns of an [`OutboxRow`], in the order [`read_outbox_row`] reads them by name.
macro_rules! row_columns {
    () => {
        "workflow_id, event_seq, idx, kind, payload, status, attempts, last_error, available_at, \
         lease_owner, lease_expires_at, lease_token, created_at, processed_at, manual_retries, \
         resolution, report_result, result, cancel_requested, traceparent, tracestate, priority, \
         id"
    };
}

/// The columns of a whole outbox row, for tests outside this module.
#[cfg(test)]
pub(crate) const ROW_COLUMNS: &str = row_columns!();

/// A `SELECT` of whole outbox rows followed by `$rest`.
macro_rules! select_rows {
    ($rest:literal) => {
        concat!("SELECT ", row_columns!(), " FROM outbox o ", $rest)
    };
}

/// `LIMIT -1`: no limit, for queries whose reader stops by itself.
///
/// Every bound limit in this host's SQL is written `LIMIT ?n + 0`: SQLite plans with the value of a
/// bare `LIMIT ?n` and so re-prepares the statement each time it is bound again (every call), which
/// cost a claim more than its own query. An expression is evaluated when the statement runs.
pub(super) const NO_LIMIT: i64 = -1;
pub(super) const SELECT_ONE: &str =
    select_rows!("WHERE workflow_id = ?1 AND event_seq = ?2 AND idx = ?3");
pub(super) const SELECT_PENDING: &str =
    select_rows!("WHERE processed_at IS NULL ORDER BY workflow_id, event_seq, idx LIMIT ?1 + 0");
pub(super) const SELECT_UNFINISHED_OF_WORKFLOW: &str =
    select_rows!("WHERE workflow_id = ?1 AND processed_at IS NULL ORDER BY event_seq, idx");
pub(super) const SELECT_WORKFLOW: &str =
    select_rows!("WHERE workflow_id = ?1 ORDER BY event_seq, idx");
pub(super) const SELECT_DEAD: &str =
    select_rows!("WHERE status = 'dead' ORDER BY workflow_id, event_seq, idx LIMIT ?1 + 0");
/// A claim page: the keys of up to `?2` candidates in claim order ([`OutboxRow::claim_order`]),
/// read from the covering index `outbox_claim` (one priority, `?7`, at a time; after the key
/// `(?3, ?4, ?5, ?6)` of the last candidate the claim looked at), then their rows by integer key.
/// Reading the keys first keeps the walk past excluded kinds in the index, without a row read per
/// step. The page comes in no promised order: [`claim_in`] sorts it by its keys.
macro_rules! claim_page {
    ($filter:expr, $strict:expr) => {
        concat!(
            "SELECT ",
            row_columns!(),
            " FROM (SELECT id FROM outbox c \
             WHERE processed_at IS NULL AND priority = ?7 AND available_at <= ?1 \
             AND (available_at, workflow_id, event_seq, idx) > (?3, ?4, ?5, ?6) ",
            $filter,
            $strict,
            "ORDER BY available_at, workflow_id, event_seq, idx LIMIT ?2 + 0) k \
             JOIN outbox o USING (id)"
        )
    };
}
/// Leaves out the kinds the operators' controls exclude: `?8`, and those of the JSON array `?9`
/// (one kind is the common case, and a plain comparison is cheaper than a lookup per row).
macro_rules! excluding {
    () => {
        "AND kind <> ?8 AND kind NOT IN (SELECT value FROM json_each(?9)) "
    };
}
macro_rules! strict {
    () => {
        "AND NOT EXISTS (SELECT 1 FROM outbox e WHERE e.workflow_id = c.workflow_id \
         AND e.processed_at IS NULL AND (e.event_seq, e.idx) < (c.event_seq, c.idx)) "
    };
}
/// A claim page when no control excludes a kind (the common case: no filter at all).
pub(super) const CLAIM_DUE_FIRST: &str = claim_page!("", "");
pub(super) const CLAIM_STRICT: &str = claim_page!("", strict!());
/// A claim page leaving out excluded kinds.
pub(super) const CLAIM_DUE_FIRST_EXCLUDING: &str = claim_page!(excluding!(), "");
pub(super) const CLAIM_STRICT_EXCLUDING: &str = claim_page!(excluding!(), strict!());
/// The highest priority of an unfinished command below `?1`: the next priority a claim reads.
pub(super) const NEXT_PRIORITY: &str = "SELECT priority FROM outbox \
     WHERE processed_at IS NULL AND priority < ?1 ORDER BY priority DESC LIMIT 1";
/// Whether a command of priority `?2` is due at `?1`: a range of `outbox_claim`.
pub(super) const ANY_COMMAND_DUE: &str = "SELECT EXISTS (SELECT 1 FROM outbox \
     WHERE processed_at IS NULL AND priority = ?2 AND available_at <= ?1)";
/// As [`ANY_COMMAND_DUE`], leaving out the kinds the controls exclude (`?3`, and those of the JSON
/// array `?4`).
pub(super) const ANY_COMMAND_CLAIMABLE: &str = "SELECT EXISTS (SELECT 1 FROM outbox \
     WHERE processed_at IS NULL AND priority = ?2 AND available_at <= ?1 \
     AND kind <> ?3 AND kind NOT IN (SELECT value FROM json_each(?4)))";

/// A stored value that cannot be read back (a damaged or hand-edited file, or a value an older version
/// wrote that this one cannot parse): its column, and why.
#[derive(Debug)]
pub(super) struct Unreadable {
    pub(super) column: String,
    pub(super) reason: String,
}

impl std::fmt::Display for Unreadable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "column {} {}", self.column, self.reason)
    }
}

impl std::error::Error for Unreadable {}

pub(super) fn column_name(row: &Row<'_>, column: usize) -> String {
    row.as_ref()
        .column_name(column)
        .map_or_else(|_| format!("#{column}"), str::to_owned)
}

/// The read error for a value in `column` of `row` that cannot be read, and why.
pub(super) fn unreadable(
    row: &Row<'_>,
    column: usize,
    reason: impl std::fmt::Display,
) -> rusqlite::Error {
    rusqlite::Error::ToSqlConversionFailure(Box::new(Unreadable {
        column: column_name(row, column),
        reason: reason.to_string(),
    }))
}

/// Whether the error of reading `row` is a stored value that cannot be read (and which), or a driver
/// failure (returned as it is).
pub(super) fn unreadable_value(
    row: &Row<'_>,
    e: rusqlite::Error,
) -> Result<Unreadable, rusqlite::Error> {
    let at = |column: usize, reason: String| Unreadable {
        column: column_name(row, column),
        reason,
    };
    match e {
        rusqlite::Error::ToSqlConversionFailure(inner) => inner
            .downcast::<Unreadable>()
            .map(|why| *why)
            .map_err(rusqlite::Error::ToSqlConversionFailure),
        rusqlite::Error::FromSqlConversionFailure(column, _, why) => {
            Ok(at(column, format!("cannot be read: {why}")))
        }
        rusqlite::Error::InvalidColumnType(column, _, found) => {
            Ok(at(column, format!("holds a value of type {found}")))
        }
        rusqlite::Error::IntegralValueOutOfRange(column, value) => {
            Ok(at(column, format!("holds {value}, out of range")))
        }
        rusqlite::Error::Utf8Error(column, why) => Ok(at(column, format!("is not UTF-8: {why}"))),
        other => Err(other),
    }
}

/// A row a query found but cannot read whole: which row (e.g. `command w:1:0`), and why.
#[derive(Debug)]
pub(super) struct UnreadableRow {
    pub(super) row: String,
    pub(super) why: Unreadable,
}

impl UnreadableRow {
    pub(super) fn into_error(self) -> Error {
        Error::Corrupt(format!("{}: {}", self.row, self.why))
    }
}

/// Steps through the rows `sql` selects: `visit` gets each one read by `read`, or, for a row holding a
/// value that cannot be read, the [`UnreadableRow`] that `name` names; it says whether to go on.
pub(super) fn each_row<T>(
    conn: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
    read: impl Fn(&Row<'_>) -> rusqlite::Result<T>,
    name: impl Fn(&Row<'_>) -> String,
    mut visit: impl FnMut(Result<T, UnreadableRow>) -> Result<bool, Error>,
) -> Result<(), Error> {
    let mut stmt = conn.prepare_cached(sql).map_err(storage)?;
    let mut rows = stmt.query(params).map_err(storage)?;
    while let Some(row) = rows.next().map_err(storage)? {
        let item = match read(row) {
            Ok(value) => Ok(value),
            Err(e) => Err(UnreadableRow {
                row: name(row),
                why: unreadable_value(row, e).map_err(storage)?,
            }),
        };
        if !visit(item)? {
            break;
        }
    }
    Ok(())
}

/// Every row `sql` selects; one that cannot be read is [`Error::Corrupt`] naming it and its column.
pub(super) fn read_all<T>(
    conn: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
    read: impl Fn(&Row<'_>) -> rusqlite::Result<T>,
    name: impl Fn(&Row<'_>) -> String,
) -> Result<Vec<T>, Error> {
    let mut out = Vec::new();
    each_row(conn, sql, params, read, name, |item| {
        out.push(item.map_err(UnreadableRow::into_error)?);
        Ok(true)
    })?;
    Ok(out)
}

/// Up to `limit` rows of `sql` that can be read, skipping those that cannot: one damaged row must not
/// hide every other (DESIGN rule 13). `sql` takes no limit of its own (`LIMIT -1`).
pub(super) fn read_readable<T>(
    conn: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
    read: impl Fn(&Row<'_>) -> rusqlite::Result<T>,
    limit: usize,
) -> Result<Vec<T>, Error> {
    let skip = |_: &Row<'_>| None;
    Ok(read_listing(conn, sql, params, read, skip, limit)?.0)
}

/// Up to `limit` rows of `sql`, the ones that read and the ones that do not. `name` names an
/// unreadable row to report it (counted in `limit`), or returns `None` to skip it (not counted).
pub(super) fn read_listing<T>(
    conn: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
    read: impl Fn(&Row<'_>) -> rusqlite::Result<T>,
    name: impl Fn(&Row<'_>) -> Option<UnreadableCommand>,
    limit: usize,
) -> Result<(Vec<T>, Vec<UnreadableCommand>), Error> {
    let (mut rows, mut unreadable) = (Vec::new(), Vec::new());
    if limit == 0 {
        return Ok((rows, unreadable));
    }
    let mut stmt = conn.prepare_cached(sql).map_err(storage)?;
    let mut cursor = stmt.query(params).map_err(storage)?;
    while let Some(row) = cursor.next().map_err(storage)? {
        match read(row) {
            Ok(value) => rows.push(value),
            Err(e) => {
                let why = unreadable_value(row, e).map_err(storage)?;
                if let Some(named) = name(row) {
                    unreadable.push(UnreadableCommand::new(
                        named.command_id,
                        named.status,
                        why.to_string(),
                    ));
                }
            }
        }
        if rows.len() + unreadable.len() >= limit {
            break;
        }
    }
    Ok((rows, unreadable))
}

pub use miniflow_core::{Listing, UnreadableCommand};

/// The raw ID and status of an outbox row, whatever the rest of it holds.
pub(super) fn name_unreadable(row: &Row<'_>) -> Option<UnreadableCommand> {
    let raw = |column: usize| match row.get_ref(column) {
        Ok(ValueRef::Text(t)) => String::from_utf8_lossy(t).into_owned(),
        Ok(ValueRef::Integer(i)) => i.to_string(),
        Ok(other) => format!("{other:?}"),
        Err(e) => format!("({e})"),
    };
    Some(UnreadableCommand::new(
        format!(
            "{}:{}:{}",
            raw(col::WORKFLOW_ID),
            raw(col::EVENT_SEQ),
            raw(col::IDX)
        ),
        raw(col::STATUS),
        String::new(),
    ))
}

impl SqliteStore {
    /// As [`Outbox::pending`], with the unreadable rows among the first `limit` reported apart instead
    /// of skipped (for operators' tools).
    ///
    /// # Errors
    ///
    /// [`Error::Storage`] when the file cannot be read at all.
    pub fn pending_listing(&self, limit: usize) -> Result<Listing, Error> {
        self.listing(SELECT_PENDING, limit)
    }

    /// As [`Operations::dead_letters`], with the unreadable rows among the first `limit` reported apart.
    ///
    /// # Errors
    ///
    /// [`Error::Storage`] when the file cannot be read at all.
    pub fn dead_listing(&self, limit: usize) -> Result<Listing, Error> {
        self.listing(SELECT_DEAD, limit)
    }

    pub(super) fn listing(&self, sql: &str, limit: usize) -> Result<Listing, Error> {
        let (rows, unreadable) = read_listing(
            &self.conn,
            sql,
            [NO_LIMIT],
            read_outbox_row,
            name_unreadable,
            limit,
        )?;
        let mut listing = Listing::default();
        (listing.rows, listing.unreadable) = (rows, unreadable);
        Ok(listing)
    }
}

/// Column positions of [`row_columns!`].
pub(super) mod col {
    pub const WORKFLOW_ID: usize = 0;
    pub const EVENT_SEQ: usize = 1;
    pub const IDX: usize = 2;
    pub const KIND: usize = 3;
    pub const PAYLOAD: usize = 4;
    pub const STATUS: usize = 5;
    pub const ATTEMPTS: usize = 6;
    pub const LAST_ERROR: usize = 7;
    pub const AVAILABLE_AT: usize = 8;
    pub const LEASE_OWNER: usize = 9;
    pub const LEASE_EXPIRES_AT: usize = 10;
    pub const LEASE_TOKEN: usize = 11;
    pub const CREATED_AT: usize = 12;
    pub const PROCESSED_AT: usize = 13;
    pub const MANUAL_RETRIES: usize = 14;
    pub const RESOLUTION: usize = 15;
    pub const REPORT_RESULT: usize = 16;
    pub const RESULT: usize = 17;
    pub const CANCEL_REQUESTED: usize = 18;
    pub const TRACEPARENT: usize = 19;
    pub const TRACESTATE: usize = 20;
    pub const PRIORITY: usize = 21;
    /// The row's integer key (schema version 7).
    pub const ID: usize = 22;
}

pub(super) fn read_text<'r>(row: &'r Row<'_>, column: usize) -> rusqlite::Result<&'r str> {
    row.get_ref(column)?
        .as_str()
        .map_err(|e| unreadable(row, column, format!("is not text: {e}")))
}

pub(super) fn read_time(row: &Row<'_>, column: usize) -> rusqlite::Result<Timestamp> {
    let millis: i64 = row.get(column)?;
    u64::try_from(millis)
        .map(Timestamp::from_millis)
        .map_err(|_| unreadable(row, column, format!("holds the negative time {millis}")))
}

pub(super) fn read_optional_time(
    row: &Row<'_>,
    column: usize,
) -> rusqlite::Result<Option<Timestamp>> {
    match row.get::<_, Option<i64>>(column)? {
        Some(_) => read_time(row, column).map(Some),
        None => Ok(None),
    }
}

pub(super) fn read_json(row: &Row<'_>, column: usize) -> rusqlite::Result<serde_json::Value> {
    serde_json::from_str(read_text(row, column)?)
        .map_err(|e| unreadable(row, column, format!("cannot be read as JSON: {e}")))
}

pub(super) fn read_command_id(row: &Row<'_>) -> rusqlite::Result<CommandId> {
    let workflow_id = WorkflowId::new(read_text(row, col::WORKFLOW_ID)?)
        .map_err(|e| unreadable(row, col::WORKFLOW_ID, e))?;
    let seq = u64::try_from(row.get::<_, i64>(col::EVENT_SEQ)?).unwrap_or(u64::MAX);
    let seq = Seq::new(seq).map_err(|e| unreadable(row, col::EVENT_SEQ, e))?;
    let index = u32::try_from(row.get::<_, i64>(col::IDX)?).unwrap_or(u32::MAX);
    CommandId::new(workflow_id, seq, index).map_err(|e| unreadable(row, col::IDX, e))
}

/// What `column` holds, whatever it is: for messages about a row that cannot be read.
pub(super) fn raw_text(row: &Row<'_>, column: usize) -> String {
    match row.get_ref(column) {
        Ok(ValueRef::Text(text)) => String::from_utf8_lossy(text).into_owned(),
        Ok(ValueRef::Integer(n)) => n.to_string(),
        Ok(other) => format!("{other:?}"),
        Err(_) => "?".to_owned(),
    }
}

/// The command ID an outbox row's key columns spell, whatever they hold.
pub(super) fn raw_command_id(row: &Row<'_>) -> String {
    format!(
        "command {}:{}:{}",
        raw_text(row, col::WORKFLOW_ID),
        raw_text(row, col::EVENT_SEQ),
        raw_text(row, col::IDX)
    )
}

pub(super) fn read_outbox_row(row: &Row<'_>) -> rusqlite::Result<OutboxRow> {
    let lease = match row.get::<_, Option<String>>(col::LEASE_OWNER)? {
        Some(owner) => Some(Lease {
            owner,
            expires_at: read_time(row, col::LEASE_EXPIRES_AT)?,
            token: row.get::<_, i64>(col::LEASE_TOKEN)? as u64,
        }),
        None => None,
    };
    Ok(OutboxRow {
        command_id: read_command_id(row)?,
        kind: row.get(col::KIND)?,
        payload: read_json(row, col::PAYLOAD)?,
        priority: row.get(col::PRIORITY)?,
        status: read_text(row, col::STATUS)?
            .parse()
            .map_err(|e| unreadable(row, col::STATUS, e))?,
        attempts: row.get(col::ATTEMPTS)?,
        last_error: row.get(col::LAST_ERROR)?,
        available_at: read_time(row, col::AVAILABLE_AT)?,
        lease,
        created_at: read_time(row, col::CREATED_AT)?,
        processed_at: read_optional_time(row, col::PROCESSED_AT)?,
        manual_retries: row.get(col::MANUAL_RETRIES)?,
        resolution: row.get(col::RESOLUTION)?,
        report_result: row.get(col::REPORT_RESULT)?,
        result: match row.get_ref(col::RESULT)? {
            ValueRef::Null => None,
            _ => Some(read_json(row, col::RESULT)?),
        },
        cancel_requested: row.get(col::CANCEL_REQUESTED)?,
        trace_context: read_trace_context(row),
    })
}

/// The stored trace context; one that does not parse (or is not text) is ignored: a trace is not
/// worth a delivery.
pub(super) fn read_trace_context(row: &Row<'_>) -> Option<TraceContext> {
    let text = |column| match row.get_ref(column) {
        Ok(ValueRef::Text(t)) => std::str::from_utf8(t).ok(),
        _ => None,
    };
    TraceContext::parse(text(col::TRACEPARENT)?, text(col::TRACESTATE)).ok()
}

/// Every outbox row `sql` selects; one that cannot be read is [`Error::Corrupt`] naming the command and
/// the column.
pub(super) fn query_rows(
    conn: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
) -> Result<Vec<OutboxRow>, Error> {
    read_all(conn, sql, params, read_outbox_row, raw_command_id)
}

pub(super) fn id_params(id: &CommandId) -> (&str, i64, i64) {
    (
        id.workflow_id().as_str(),
        id.event_seq().get() as i64,
        i64::from(id.index()),
    )
}

pub(super) fn select_row(conn: &Connection, id: &CommandId) -> Result<Option<OutboxRow>, Error> {
    let (w, s, i) = id_params(id);
    Ok(query_rows(conn, SELECT_ONE, params![w, s, i])?.pop())
}
