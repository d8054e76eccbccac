//! Timer queries and writes, and writing a row change with its feedback.

use super::*;

pub(super) const TIMER_COLUMNS: &str =
    "timer_id, name, event_kind, event_payload, fire_at, available_at, \
     status, created_at, processed_at, last_error";

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

pub(super) const CLAIM_TIMERS: &str = select_timers!(
    "WHERE processed_at IS NULL AND available_at <= ?1 ORDER BY available_at, timer_id LIMIT ?2 + 0"
);
pub(super) const SELECT_WORKFLOW_TIMERS: &str =
    select_timers!("WHERE workflow_id = ?1 ORDER BY timer_id");
pub(super) const ANY_TIMER_DUE: &str =
    "SELECT EXISTS (SELECT 1 FROM timers WHERE processed_at IS NULL AND available_at <= ?1)";
pub(super) const SELECT_TIMER: &str = select_timers!("WHERE timer_id = ?1");
pub(super) const CANCEL_TIMERS: &str = "UPDATE timers SET status = 'cancelled', processed_at = ?3 \
     WHERE workflow_id = ?1 AND name = ?2 AND processed_at IS NULL";
/// The oldest done rows first (see [`OutboxRow::purge_order`]: the order of `outbox_done`).
pub(super) const PURGE_DONE: &str = "DELETE FROM outbox WHERE id IN \
     (SELECT id FROM outbox \
      WHERE (status = 'done' OR status = 'cancelled') AND processed_at <= ?1 \
      ORDER BY processed_at, workflow_id, event_seq, idx LIMIT ?2 + 0)";

pub(super) fn read_timer(row: &Row<'_>) -> rusqlite::Result<TimerRow> {
    let parse_status = |text: &str| text.parse().map_err(|e| unreadable(row, 6, e));
    Ok(TimerRow {
        timer_id: read_text(row, 0)?
            .parse()
            .map_err(|e| unreadable(row, 0, e))?,
        name: row.get(1)?,
        event_kind: row.get(2)?,
        event_payload: read_json(row, 3)?,
        fire_at: read_time(row, 4)?,
        available_at: read_time(row, 5)?,
        status: parse_status(read_text(row, 6)?)?,
        created_at: read_time(row, 7)?,
        processed_at: read_optional_time(row, 8)?,
        last_error: row.get(9)?,
    })
}

/// Every timer `sql` selects; one that cannot be read is [`Error::Corrupt`] naming it and the column.
pub(super) fn query_timers(
    conn: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
) -> Result<Vec<TimerRow>, Error> {
    read_all(conn, sql, params, read_timer, |row| {
        format!("timer {}", raw_text(row, 0))
    })
}

/// Times come from `Timestamp`s already checked on the way in; clamp rather than fail.
pub(super) fn to_sql_time_lossy(t: Timestamp) -> i64 {
    i64::try_from(t.as_millis()).unwrap_or(i64::MAX)
}

pub(super) fn insert_timer(conn: &Connection, timer: &TimerRow) -> Result<(), Error> {
    made_work();
    let sql = format!(
        "INSERT INTO timers (workflow_id, {TIMER_COLUMNS}) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)"
    );
    let processed_at = timer
        .processed_at
        .map(|t| to_sql_time("processed_at", t))
        .transpose()?;
    let fire_at = to_sql_time("fire_at", timer.fire_at)?;
    let available_at = to_sql_time("available_at", timer.available_at)?;
    let created_at = to_sql_time("now", timer.created_at)?;
    conn.prepare_cached(&sql)
        .and_then(|mut stmt| {
            stmt.execute(params![
                timer.timer_id.workflow_id().as_str(),
                timer.timer_id.to_string(),
                timer.name,
                timer.event_kind,
                canonical_json(&timer.event_payload),
                fire_at,
                available_at,
                timer.status.as_str(),
                created_at,
                processed_at,
                timer.last_error,
            ])
        })
        .map_err(storage)?;
    Ok(())
}

/// The timer a commit fires, read and marked fired by the shared rule ([`TimerRow::fire`]); writes
/// nothing (see [`write_fired_timer`]), so that a commit it refuses has written nothing.
pub(super) fn fire_timer(
    conn: &Connection,
    timer_id: &TimerId,
    now: Timestamp,
) -> Result<TimerRow, Error> {
    let mut timer = query_timers(conn, SELECT_TIMER, [timer_id.to_string()])?
        .pop()
        .ok_or_else(|| Error::TimerNotScheduled {
            timer_id: timer_id.to_string(),
            status: "unknown",
        })?;
    timer.fire(now)?;
    Ok(timer)
}

/// Writes a timer [`fire_timer`] fired.
pub(super) fn write_fired_timer(conn: &Connection, timer: &TimerRow) -> Result<(), Error> {
    let processed_at = timer.processed_at.map(to_sql_time_lossy);
    conn.prepare_cached(
        "UPDATE timers SET status = 'fired', processed_at = ?2 WHERE timer_id = ?1",
    )
    .and_then(|mut stmt| stmt.execute(params![timer.timer_id.to_string(), processed_at]))
    .map_err(storage)?;
    Ok(())
}

pub(super) fn cancel_timers(conn: &Connection, commit: &Commit) -> Result<(), Error> {
    let now = to_sql_time("now", commit.now())?;
    for name in commit.cancel_timers() {
        conn.prepare_cached(CANCEL_TIMERS)
            .and_then(|mut stmt| stmt.execute(params![commit.workflow_id().as_str(), name, now]))
            .map_err(storage)?;
    }
    Ok(())
}

/// Cancels the timer `?1` at `?2` if it is still scheduled ([`TimerRow::cancel`]).
pub(super) const CANCEL_TIMER: &str = "UPDATE timers SET status = 'cancelled', processed_at = ?2 \
     WHERE timer_id = ?1 AND processed_at IS NULL";

/// Writes a row change the core computed, the feedback it schedules and the feedback it withdraws,
/// in the caller's transaction.
pub(super) fn write_change<T>(conn: &Connection, changed: &Changed<T>) -> Result<(), Error> {
    write_row(conn, &changed.row)?;
    if let Some(timer) = &changed.feedback {
        insert_timer(conn, timer)?;
    }
    if let Some(timer_id) = &changed.withdrawn {
        let at = to_sql_time("now", changed.at)?;
        conn.prepare_cached(CANCEL_TIMER)
            .and_then(|mut stmt| stmt.execute(params![timer_id.to_string(), at]))
            .map_err(storage)?;
    }
    Ok(())
}

/// Takes up to `limit_rows` due timers for `lease_ttl` (see [`Timers::claim_timers`]), inside the
/// caller's transaction: the core's [`TimerClaim`] driven with this store's query. A timer that
/// cannot be read stops no other (DESIGN rule 13): it ends `rejected` as the claim says, where
/// operators see it, and is not taken again.
pub(super) fn claim_timers_in(
    tx: &Connection,
    limit_rows: usize,
    lease_ttl: Duration,
    now: Timestamp,
) -> Result<Vec<TimerRow>, Error> {
    let mut claim = TimerClaim::new(limit_rows, lease_ttl, now);
    let mut timers = Vec::new();
    while let Some(wanted) = claim.wanted() {
        let mut page = Vec::new();
        each_row(
            tx,
            CLAIM_TIMERS,
            params![to_sql_time("now", now)?, limit(wanted)],
            read_timer,
            |row| raw_text(row, 0),
            |timer| {
                page.push(timer);
                Ok(true)
            },
        )?;
        let rows = page.len();
        for timer in page {
            let (timer_id, timer) = match timer {
                Ok(timer) => (timer.timer_id.to_string(), Ok(timer)),
                Err(bad) => (bad.row, Err(bad.why.to_string())),
            };
            match claim.offer(&timer_id, timer) {
                TimerOffer::Take(timer) => {
                    tx.prepare_cached("UPDATE timers SET available_at = ?2 WHERE timer_id = ?1")
                        .and_then(|mut stmt| {
                            stmt.execute(params![timer_id, to_sql_time_lossy(timer.available_at)])
                        })
                        .map_err(storage)?;
                    timers.push(timer);
                }
                TimerOffer::Reject {
                    last_error,
                    processed_at,
                } => {
                    tx.prepare_cached(
                        "UPDATE timers SET status = 'rejected', processed_at = ?2, last_error = ?3 \
                         WHERE timer_id = ?1 AND processed_at IS NULL",
                    )
                    .and_then(|mut stmt| {
                        stmt.execute(params![timer_id, to_sql_time_lossy(processed_at), last_error])
                    })
                    .map_err(storage)?;
                }
                _ => {}
            }
        }
        claim.page_read(rows);
    }
    Ok(timers)
}

/// Ends a scheduled timer `rejected` (see [`Timers::reject_timer`]), inside the caller's
/// transaction.
pub(super) fn reject_timer_in(
    tx: &Connection,
    timer_id: &TimerId,
    reason: &str,
    now: Timestamp,
) -> Result<(), Error> {
    let mut timer = query_timers(tx, SELECT_TIMER, [timer_id.to_string()])?
        .pop()
        .ok_or_else(|| Error::TimerNotScheduled {
            timer_id: timer_id.to_string(),
            status: "unknown",
        })?;
    timer.reject(reason, now)?;
    tx.prepare_cached(
        "UPDATE timers SET status = ?2, processed_at = ?3, last_error = ?4 WHERE timer_id = ?1",
    )
    .and_then(|mut stmt| {
        stmt.execute(params![
            timer_id.to_string(),
            timer.status.as_str(),
            to_sql_time_lossy(now),
            timer.last_error
        ])
    })
    .map_err(storage)?;
    Ok(())
}
