//! Reading and writing miniflow's rows: the columns of each table, each stored value read back with
//! the column it came from named when it cannot be (DESIGN rule 13).

use miniflow_core::backend::Changed;
use miniflow_core::{
    canonical_json, CommandId, Error, EventRecord, Lease, OutboxRow, Seq, Status, TimerId,
    TimerRow, Timestamp, TraceContext, WorkflowId,
};
use postgres::types::FromSql;

pub(crate) use crate::db::Params;
use crate::db::{Columns, Exec};
use crate::errors::{storage, DbError};

/// The columns of an [`OutboxRow`], as [`read_outbox_row`] reads them.
macro_rules! row_columns {
    () => {
        "workflow_id, event_seq, idx, kind, payload, status, attempts, last_error, available_at, \
         lease_owner, lease_expires_at, lease_token, created_at, processed_at, manual_retries, \
         resolution, report_result, result, cancel_requested, traceparent, tracestate, priority"
    };
}

/// A `SELECT` of whole outbox rows (table alias `o`) followed by `$rest`.
macro_rules! select_rows {
    ($rest:literal) => {
        concat!(
            "SELECT ",
            $crate::rows::row_columns!(),
            " FROM outbox o ",
            $rest
        )
    };
}

/// A `SELECT` of whole timer rows followed by `$rest`.
macro_rules! select_timers {
    ($rest:literal) => {
        concat!(
            "SELECT timer_id, name, event_kind, event_payload, fire_at, available_at, status, \
             created_at, processed_at, last_error FROM timers ",
            $rest
        )
    };
}

pub(crate) use {row_columns, select_rows, select_timers};

/// A column a stored value is read from: by name, or (the outbox's, read on every claim) by its
/// position in [`row_columns!`], which skips looking the name up in each row.
pub(crate) trait Column: Copy {
    fn name(self) -> &'static str;
    fn read<'a, T: FromSql<'a>, R: Columns>(self, row: &'a R) -> Result<T, DbError>;
}

impl Column for &'static str {
    fn name(self) -> &'static str {
        self
    }
    fn read<'a, T: FromSql<'a>, R: Columns>(self, row: &'a R) -> Result<T, DbError> {
        row.try_get(self)
    }
}

/// An outbox column: its position in [`row_columns!`], and its name.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Col(usize, &'static str);

impl Column for Col {
    fn name(self) -> &'static str {
        self.1
    }
    fn read<'a, T: FromSql<'a>, R: Columns>(self, row: &'a R) -> Result<T, DbError> {
        debug_assert_eq!(
            row.column_name(self.0),
            Some(self.1),
            "outbox rows are selected with row_columns!()"
        );
        row.try_get(self.0)
    }
}

/// The columns of [`row_columns!`], in order.
pub(crate) mod col {
    use super::Col;
    pub(crate) const WORKFLOW_ID: Col = Col(0, "workflow_id");
    pub(crate) const EVENT_SEQ: Col = Col(1, "event_seq");
    pub(crate) const IDX: Col = Col(2, "idx");
    pub(crate) const KIND: Col = Col(3, "kind");
    pub(crate) const PAYLOAD: Col = Col(4, "payload");
    pub(crate) const STATUS: Col = Col(5, "status");
    pub(crate) const ATTEMPTS: Col = Col(6, "attempts");
    pub(crate) const LAST_ERROR: Col = Col(7, "last_error");
    pub(crate) const AVAILABLE_AT: Col = Col(8, "available_at");
    pub(crate) const LEASE_OWNER: Col = Col(9, "lease_owner");
    pub(crate) const LEASE_EXPIRES_AT: Col = Col(10, "lease_expires_at");
    pub(crate) const LEASE_TOKEN: Col = Col(11, "lease_token");
    pub(crate) const CREATED_AT: Col = Col(12, "created_at");
    pub(crate) const PROCESSED_AT: Col = Col(13, "processed_at");
    pub(crate) const MANUAL_RETRIES: Col = Col(14, "manual_retries");
    pub(crate) const RESOLUTION: Col = Col(15, "resolution");
    pub(crate) const REPORT_RESULT: Col = Col(16, "report_result");
    pub(crate) const RESULT: Col = Col(17, "result");
    pub(crate) const CANCEL_REQUESTED: Col = Col(18, "cancel_requested");
    pub(crate) const TRACEPARENT: Col = Col(19, "traceparent");
    pub(crate) const TRACESTATE: Col = Col(20, "tracestate");
    pub(crate) const PRIORITY: Col = Col(21, "priority");
}

/// A stored value that cannot be read back (a row edited by hand, or one an older version wrote that
/// this one cannot parse): its column, and why.
#[derive(Debug)]
pub(crate) struct Unreadable {
    pub(crate) column: &'static str,
    pub(crate) reason: String,
}

impl std::fmt::Display for Unreadable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "column {} {}", self.column, self.reason)
    }
}

fn unreadable(column: &'static str, reason: impl std::fmt::Display) -> Unreadable {
    Unreadable {
        column,
        reason: reason.to_string(),
    }
}

pub(crate) fn get<'a, T: FromSql<'a>>(
    row: &'a impl Columns,
    column: impl Column,
) -> Result<T, Unreadable> {
    column
        .read(row)
        .map_err(|e| unreadable(column.name(), format!("cannot be read: {e}")))
}

pub(crate) fn time(row: &impl Columns, column: impl Column) -> Result<Timestamp, Unreadable> {
    let millis: i64 = get(row, column)?;
    u64::try_from(millis)
        .map(Timestamp::from_millis)
        .map_err(|_| unreadable(column.name(), format!("holds the negative time {millis}")))
}

fn optional_time(row: &impl Columns, column: impl Column) -> Result<Option<Timestamp>, Unreadable> {
    match get::<Option<i64>>(row, column)? {
        Some(_) => time(row, column).map(Some),
        None => Ok(None),
    }
}

fn json(row: &impl Columns, column: impl Column) -> Result<serde_json::Value, Unreadable> {
    let text: &str = get(row, column)?;
    serde_json::from_str(text)
        .map_err(|e| unreadable(column.name(), format!("cannot be read as JSON: {e}")))
}

fn optional_json(
    row: &impl Columns,
    column: impl Column,
) -> Result<Option<serde_json::Value>, Unreadable> {
    match get::<Option<&str>>(row, column)? {
        Some(_) => json(row, column).map(Some),
        None => Ok(None),
    }
}

fn count(row: &impl Columns, column: impl Column) -> Result<u32, Unreadable> {
    let n: i64 = get(row, column)?;
    u32::try_from(n).map_err(|_| unreadable(column.name(), format!("holds {n}, out of range")))
}

pub(crate) fn command_id(row: &impl Columns) -> Result<CommandId, Unreadable> {
    let workflow_id = WorkflowId::new(get::<String>(row, col::WORKFLOW_ID)?)
        .map_err(|e| unreadable("workflow_id", e))?;
    let seq: i64 = get(row, col::EVENT_SEQ)?;
    let seq = u64::try_from(seq)
        .ok()
        .and_then(|s| Seq::new(s).ok())
        .ok_or_else(|| unreadable("event_seq", format!("holds {seq}, out of range")))?;
    let idx: i64 = get(row, col::IDX)?;
    let index =
        u32::try_from(idx).map_err(|_| unreadable("idx", format!("holds {idx}, out of range")))?;
    CommandId::new(workflow_id, seq, index).map_err(|e| unreadable("idx", e))
}

/// The command ID an outbox row's key columns spell, whatever they hold.
pub(crate) fn raw_command_id(row: &impl Columns) -> String {
    let workflow_id: String = col::WORKFLOW_ID.read(row).unwrap_or_else(|_| "?".into());
    let seq: i64 = col::EVENT_SEQ.read(row).unwrap_or_default();
    let idx: i64 = col::IDX.read(row).unwrap_or_default();
    format!("{workflow_id}:{seq}:{idx}")
}

pub(crate) fn read_outbox_row(row: &impl Columns) -> Result<OutboxRow, Unreadable> {
    let lease = match get::<Option<String>>(row, col::LEASE_OWNER)? {
        Some(owner) => Some(Lease {
            owner,
            expires_at: time(row, col::LEASE_EXPIRES_AT)?,
            token: u64::try_from(get::<i64>(row, col::LEASE_TOKEN)?)
                .map_err(|_| unreadable("lease_token", "holds a negative token"))?,
        }),
        None => None,
    };
    Ok(OutboxRow {
        command_id: command_id(row)?,
        kind: get(row, col::KIND)?,
        payload: json(row, col::PAYLOAD)?,
        priority: get(row, col::PRIORITY)?,
        status: get::<&str>(row, col::STATUS)?
            .parse()
            .map_err(|e| unreadable("status", e))?,
        attempts: count(row, col::ATTEMPTS)?,
        last_error: get(row, col::LAST_ERROR)?,
        available_at: time(row, col::AVAILABLE_AT)?,
        lease,
        created_at: time(row, col::CREATED_AT)?,
        processed_at: optional_time(row, col::PROCESSED_AT)?,
        manual_retries: count(row, col::MANUAL_RETRIES)?,
        resolution: get(row, col::RESOLUTION)?,
        report_result: get(row, col::REPORT_RESULT)?,
        result: optional_json(row, col::RESULT)?,
        cancel_requested: get(row, col::CANCEL_REQUESTED)?,
        trace_context: trace_context(row),
    })
}

/// The stored trace context; one that does not parse is ignored: a trace is not worth a delivery.
fn trace_context(row: &impl Columns) -> Option<TraceContext> {
    let traceparent: &str = get::<Option<&str>>(row, col::TRACEPARENT).ok()??;
    let tracestate: Option<&str> = get(row, col::TRACESTATE).ok()?;
    TraceContext::parse(traceparent, tracestate).ok()
}

/// What can be read of an outbox row that cannot be read whole, for its failure feedback: the columns
/// that read, a null payload, and empty values for the others; `None` when its key columns do not
/// spell a command ID (then there is no workflow to tell).
pub(crate) fn salvage(row: &impl Columns) -> Option<OutboxRow> {
    Some(OutboxRow {
        command_id: command_id(row).ok()?,
        kind: get(row, col::KIND).unwrap_or_default(),
        payload: serde_json::Value::Null,
        priority: get(row, col::PRIORITY).unwrap_or_default(),
        status: get::<&str>(row, col::STATUS)
            .ok()
            .and_then(|status| status.parse().ok())
            .unwrap_or(Status::Pending),
        attempts: count(row, col::ATTEMPTS).unwrap_or_default(),
        last_error: None,
        available_at: time(row, col::AVAILABLE_AT).unwrap_or_default(),
        lease: None,
        created_at: time(row, col::CREATED_AT).unwrap_or_default(),
        processed_at: None,
        manual_retries: count(row, col::MANUAL_RETRIES).unwrap_or_default(),
        resolution: None,
        report_result: get(row, col::REPORT_RESULT).unwrap_or_default(),
        result: None,
        cancel_requested: get(row, col::CANCEL_REQUESTED).unwrap_or_default(),
        trace_context: trace_context(row),
    })
}

pub(crate) fn read_timer(row: &impl Columns) -> Result<TimerRow, Unreadable> {
    Ok(TimerRow {
        timer_id: get::<&str>(row, "timer_id")?
            .parse()
            .map_err(|e| unreadable("timer_id", e))?,
        name: get(row, "name")?,
        event_kind: get(row, "event_kind")?,
        event_payload: json(row, "event_payload")?,
        fire_at: time(row, "fire_at")?,
        available_at: time(row, "available_at")?,
        status: get::<&str>(row, "status")?
            .parse()
            .map_err(|e| unreadable("status", e))?,
        created_at: time(row, "created_at")?,
        processed_at: optional_time(row, "processed_at")?,
        last_error: get(row, "last_error")?,
    })
}

/// Every outbox row `sql` selects; one that cannot be read is [`Error::Corrupt`] naming the command
/// and the column.
pub(crate) async fn query_rows(
    db: &mut impl Exec,
    sql: &'static str,
    params: &Params<'_>,
) -> Result<Vec<OutboxRow>, Error> {
    db.query(sql, params)
        .await
        .map_err(storage)?
        .iter()
        .map(|row| {
            read_outbox_row(row)
                .map_err(|why| Error::Corrupt(format!("command {}: {why}", raw_command_id(row))))
        })
        .collect()
}

/// Every timer `sql` selects; one that cannot be read is [`Error::Corrupt`] naming it and the column.
pub(crate) async fn query_timers(
    db: &mut impl Exec,
    sql: &'static str,
    params: &Params<'_>,
) -> Result<Vec<TimerRow>, Error> {
    db.query(sql, params)
        .await
        .map_err(storage)?
        .iter()
        .map(|row| {
            read_timer(row).map_err(|why| {
                let id: String = row.try_get("timer_id").unwrap_or_else(|_| "?".into());
                Error::Corrupt(format!("timer {id}: {why}"))
            })
        })
        .collect()
}

/// The events of `workflow_id` in seq order, as `client` sees them.
pub(crate) async fn load_events(
    db: &mut impl Exec,
    workflow_id: &WorkflowId,
) -> Result<Vec<EventRecord>, Error> {
    load_events_after(db, workflow_id, Seq::ZERO).await
}

/// The events of `workflow_id` after seq `after`, in seq order.
pub(crate) async fn load_events_after(
    db: &mut impl Exec,
    workflow_id: &WorkflowId,
    after: Seq,
) -> Result<Vec<EventRecord>, Error> {
    // A seq is below 2^53, so it fits a bigint.
    let after = i64::try_from(after.get()).unwrap_or(i64::MAX);
    let rows = db
        .query(
            "SELECT seq, kind, payload, recorded_at FROM events \
             WHERE workflow_id = $1 AND seq > $2 ORDER BY seq",
            &[&workflow_id.as_str(), &after],
        )
        .await
        .map_err(storage)?;
    rows.iter()
        .map(|row| {
            let read = || -> Result<EventRecord, Unreadable> {
                let seq: i64 = get(row, "seq")?;
                Ok(EventRecord {
                    workflow_id: workflow_id.clone(),
                    seq: u64::try_from(seq)
                        .ok()
                        .and_then(|s| Seq::new(s).ok())
                        .ok_or_else(|| unreadable("seq", format!("holds {seq}, out of range")))?,
                    kind: get(row, "kind")?,
                    payload: json(row, "payload")?,
                    recorded_at: time(row, "recorded_at")?,
                })
            };
            read().map_err(|why| {
                let seq: i64 = row.try_get("seq").unwrap_or_default();
                Error::Corrupt(format!("event {workflow_id}#{seq}: {why}"))
            })
        })
        .collect()
}

pub(crate) fn to_sql_time(field: &'static str, t: Timestamp) -> Result<i64, Error> {
    i64::try_from(t.as_millis())
        .map_err(|_| Error::invalid(field, t, "is past the year 292 million"))
}

fn to_sql_u64(field: &'static str, n: u64) -> Result<i64, Error> {
    i64::try_from(n).map_err(|_| Error::invalid(field, n, "is too large to store"))
}

/// A token as an SQL parameter; a token too large to store matches no lease.
pub(crate) fn token_param(token: u64) -> i64 {
    i64::try_from(token).unwrap_or(-1)
}

/// Free text (an error, a note) as PostgreSQL stores it: its `TEXT` holds no NUL character, so each
/// one becomes U+FFFD.
pub(crate) fn text(value: &str) -> std::borrow::Cow<'_, str> {
    if value.contains('\0') {
        std::borrow::Cow::Owned(value.replace('\0', "\u{FFFD}"))
    } else {
        std::borrow::Cow::Borrowed(value)
    }
}

pub(crate) fn id_params(id: &CommandId) -> (&str, i64, i64) {
    (
        id.workflow_id().as_str(),
        i64::try_from(id.event_seq().get()).unwrap_or(i64::MAX),
        i64::from(id.index()),
    )
}

/// Writes back every column an [`OutboxRow`] method may change.
pub(crate) async fn write_row(db: &mut impl Exec, row: &OutboxRow) -> Result<(), Error> {
    let (w, s, i) = id_params(&row.command_id);
    let lease = row.lease.as_ref();
    let lease_expires_at = lease
        .map(|l| to_sql_time("lease_expires_at", l.expires_at))
        .transpose()?;
    let processed_at = row
        .processed_at
        .map(|t| to_sql_time("processed_at", t))
        .transpose()?;
    let available_at = to_sql_time("available_at", row.available_at)?;
    let token = to_sql_u64("lease_token", row.token())?;
    let last_error = row.last_error.as_deref().map(text);
    let resolution = row.resolution.as_deref().map(text);
    db.execute(
        "UPDATE outbox SET status = $4, attempts = $5, last_error = $6, available_at = $7, \
             lease_owner = $8, lease_expires_at = $9, lease_token = $10, processed_at = $11, \
             manual_retries = $12, resolution = $13, result = $14, cancel_requested = $15 \
             WHERE workflow_id = $1 AND event_seq = $2 AND idx = $3",
        &[
            &w,
            &s,
            &i,
            &row.status.as_str(),
            &i64::from(row.attempts),
            &last_error.as_deref(),
            &available_at,
            &lease.map(|l| l.owner.as_str()),
            &lease_expires_at,
            &token,
            &processed_at,
            &i64::from(row.manual_retries),
            &resolution.as_deref(),
            &row.result.as_ref().map(canonical_json),
            &row.cancel_requested,
        ],
    )
    .await
    .map_err(storage)?;
    Ok(())
}

pub(crate) async fn insert_timer(db: &mut impl Exec, timer: &TimerRow) -> Result<(), Error> {
    let processed_at = timer
        .processed_at
        .map(|t| to_sql_time("processed_at", t))
        .transpose()?;
    db.execute(
        "INSERT INTO timers (workflow_id, timer_id, name, event_kind, event_payload, fire_at, \
             available_at, status, created_at, processed_at, last_error) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
        &[
            &timer.timer_id.workflow_id().as_str(),
            &timer.timer_id.to_string(),
            &timer.name,
            &timer.event_kind,
            &canonical_json(&timer.event_payload),
            &to_sql_time("fire_at", timer.fire_at)?,
            &to_sql_time("available_at", timer.available_at)?,
            &timer.status.as_str(),
            &to_sql_time("now", timer.created_at)?,
            &processed_at,
            &timer.last_error.as_deref().map(text),
        ],
    )
    .await
    .map_err(storage)?;
    Ok(())
}

pub(crate) async fn timer_exists(db: &mut impl Exec, timer_id: &TimerId) -> Result<bool, Error> {
    db.query_one(
        "SELECT EXISTS (SELECT 1 FROM timers WHERE timer_id = $1)",
        &[&timer_id.to_string()],
    )
    .await
    .and_then(|row| Columns::try_get(&row, 0))
    .map_err(storage)
}

/// Writes a row change the core computed ([`OutboxRow::change`]), the feedback it schedules and the
/// feedback it withdraws, in the caller's transaction; says whether there was feedback.
pub(crate) async fn write_change<T>(
    db: &mut impl Exec,
    changed: &Changed<T>,
) -> Result<bool, Error> {
    write_row(db, &changed.row).await?;
    if let Some(timer_id) = &changed.withdrawn {
        db.execute(
            "UPDATE timers SET status = 'cancelled', processed_at = $2 \
             WHERE timer_id = $1 AND processed_at IS NULL",
            &[&timer_id.to_string(), &to_sql_time("now", changed.at)?],
        )
        .await
        .map_err(storage)?;
    }
    match &changed.feedback {
        Some(timer) => insert_timer(db, timer).await.map(|()| true),
        None => Ok(false),
    }
}
