//! The operators' side: stats and the controls of each kind.

use super::*;

/// Unfinished rows by kind and status, with how many are claimable at `?1` and since when
/// ([`OutboxStats::add`]): an index-only read of `outbox_claim`.
pub(super) const STATS_UNFINISHED: &str = "SELECT kind, status, count(*), \
     sum(available_at <= ?1), min(CASE WHEN available_at <= ?1 THEN available_at END) \
     FROM outbox WHERE processed_at IS NULL GROUP BY kind, status";
/// Dead rows by kind: an index-only read of `outbox_dead_by_kind`.
pub(super) const STATS_DEAD: &str =
    "SELECT kind, count(*) FROM outbox WHERE status = 'dead' GROUP BY kind";
pub(super) const SELECT_CONTROLS: &str =
    "SELECT kind, paused, concurrency_limit, changed_by, changed_at FROM kind_controls ORDER BY kind";

/// A stored text as it reads, whatever it holds: stats count a damaged row rather than fail on it.
fn lossy_text(row: &Row<'_>, column: usize) -> String {
    match row.get_ref(column) {
        Ok(ValueRef::Text(text)) => String::from_utf8_lossy(text).into_owned(),
        Ok(other) => format!("{other:?}"),
        Err(e) => format!("({e})"),
    }
}

fn count(row: &Row<'_>, column: usize) -> u64 {
    row.get::<_, Option<i64>>(column)
        .ok()
        .flatten()
        .map_or(0, |n| u64::try_from(n).unwrap_or(0))
}

/// The stats at `now` ([`Operations::stats`]).
pub(super) fn outbox_stats(conn: &Connection, now: Timestamp) -> Result<OutboxStats, Error> {
    let mut stats = OutboxStats::new(now);
    let now_sql = to_sql_time("now", now)?;
    let mut stmt = conn.prepare_cached(STATS_UNFINISHED).map_err(storage)?;
    let mut rows = stmt.query([now_sql]).map_err(storage)?;
    while let Some(row) = rows.next().map_err(storage)? {
        // The schema admits only `pending` and `leased` here (`processed_at IS NULL`).
        let status = match lossy_text(row, 1).parse() {
            Ok(status) => status,
            Err(_) => Status::Pending,
        };
        let oldest = row
            .get::<_, Option<i64>>(4)
            .ok()
            .flatten()
            .map(|at| Timestamp::from_millis(u64::try_from(at).unwrap_or(0)));
        stats.add(
            &lossy_text(row, 0),
            status,
            count(row, 2),
            count(row, 3),
            oldest,
        );
    }
    let mut stmt = conn.prepare_cached(STATS_DEAD).map_err(storage)?;
    let mut rows = stmt.query([]).map_err(storage)?;
    while let Some(row) = rows.next().map_err(storage)? {
        stats.add(&lossy_text(row, 0), Status::Dead, count(row, 1), 0, None);
    }
    Ok(stats.with_controls(read_controls(conn, SELECT_CONTROLS)?))
}

fn read_control(row: &Row<'_>) -> rusqlite::Result<KindControl> {
    Ok(KindControl {
        kind: row.get(0)?,
        paused: row.get(1)?,
        concurrency_limit: row.get(2)?,
        changed_by: row.get(3)?,
        changed_at: read_time(row, 4)?,
    })
}

/// The controls `sql` selects; one that cannot be read is [`Error::Corrupt`] naming its kind.
pub(super) fn read_controls(conn: &Connection, sql: &str) -> Result<Vec<KindControl>, Error> {
    read_all(conn, sql, [], read_control, |row| {
        format!("the controls of kind {}", lossy_text(row, 0))
    })
}
