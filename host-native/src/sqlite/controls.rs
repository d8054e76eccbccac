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
/// The unfired timers: how many, how many carry feedback, how many are due at `?1`, the first due
/// time ([`miniflow_core::TimerStats::add`]): a read of the unfired timers alone (a partial index).
pub(super) const STATS_TIMERS: &str = "SELECT count(*), \
     sum(name IN ('command_completed', 'command_failed', 'command_resolved')), \
     sum(available_at <= ?1), min(available_at) FROM timers WHERE processed_at IS NULL";
pub(super) const SELECT_CONTROLS: &str =
    "SELECT kind, paused, concurrency_limit, changed_by, changed_at FROM kind_controls ORDER BY kind";
pub(super) const SELECT_ACTIVE_CONTROLS: &str =
    "SELECT kind, paused, concurrency_limit, changed_by, changed_at FROM kind_controls \
     WHERE paused = 1 OR concurrency_limit IS NOT NULL ORDER BY kind";
/// The unexpired leases of limited kind `?1` at `?2` ([`OutboxRow::holds_lease`]): a range of
/// `outbox_counted_leases`, which holds the leases of kinds with a concurrency limit (a claim marks
/// them `lease_counted`, see [`write_lease`], and so does setting a limit, see [`control_kind_in`]).
pub(super) const COUNT_LEASES: &str = "SELECT count(*) FROM outbox \
     WHERE status = 'leased' AND lease_counted = 1 AND kind = ?1 AND available_at > ?2";
/// Marks the leases of kind `?1` as counted against its concurrency limit, which it just got.
const COUNT_LEASES_OF_KIND: &str = "UPDATE outbox SET lease_counted = 1 \
     WHERE processed_at IS NULL AND status = 'leased' AND kind = ?1 AND lease_counted = 0";

/// What the operators' controls let a claim at `now` take ([`Admission`]), as `conn` sees them.
pub(super) fn admission(conn: &Connection, now: Timestamp) -> Result<Admission, Error> {
    let controls = read_controls(conn, SELECT_ACTIVE_CONTROLS)?;
    let mut admission = Admission::new(&controls);
    if admission.is_open() {
        return Ok(admission);
    }
    let now_sql = to_sql_time("now", now)?;
    let limited: Vec<String> = admission.limited_kinds().map(str::to_owned).collect();
    for kind in limited {
        let leases: i64 = conn
            .prepare_cached(COUNT_LEASES)
            .and_then(|mut stmt| stmt.query_row(params![kind, now_sql], |row| row.get(0)))
            .map_err(storage)?;
        admission.leased(&kind, u64::try_from(leases).unwrap_or(0));
    }
    Ok(admission)
}

/// The kinds `admission` excludes as the claim queries take them: the first, and the others as a
/// JSON array; `None` when it excludes none.
pub(super) fn excluded_kinds(excluded: &[&str]) -> Option<(String, String)> {
    let (first, rest) = excluded.split_first()?;
    let rest = serde_json::to_string(rest).unwrap_or_else(|_| "[]".to_owned());
    Some(((*first).to_owned(), rest))
}

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
    let mut stmt = conn.prepare_cached(STATS_TIMERS).map_err(storage)?;
    let mut rows = stmt.query([now_sql]).map_err(storage)?;
    if let Some(row) = rows.next().map_err(storage)? {
        let next = row
            .get::<_, Option<i64>>(3)
            .ok()
            .flatten()
            .map(|at| Timestamp::from_millis(u64::try_from(at).unwrap_or(0)));
        stats
            .timers
            .add(count(row, 0), count(row, 1), count(row, 2), next);
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

const SELECT_CONTROL: &str =
    "SELECT kind, paused, concurrency_limit, changed_by, changed_at FROM kind_controls WHERE kind = ?1";
const UPSERT_CONTROL: &str =
    "INSERT INTO kind_controls (kind, paused, concurrency_limit, changed_by, changed_at) \
     VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (kind) DO UPDATE SET paused = excluded.paused, \
     concurrency_limit = excluded.concurrency_limit, changed_by = excluded.changed_by, \
     changed_at = excluded.changed_at";
/// Keyset pages of the dead rows of kind `?1`, in command ID order: a range of `outbox_dead_by_kind`.
pub(super) const SELECT_DEAD_OF_KIND: &str = select_rows!(
    "WHERE status = 'dead' AND kind = ?1 AND (workflow_id, event_seq, idx) > (?2, ?3, ?4) \
     ORDER BY workflow_id, event_seq, idx LIMIT ?5 + 0"
);

/// Changes the controls of `kind` inside `tx` ([`Operations::control_kind`]).
pub(super) fn control_kind_in(
    tx: &Transaction<'_>,
    kind: &str,
    change: KindChange,
    by: &str,
    now: Timestamp,
) -> Result<KindControl, Error> {
    let current = read_all(tx, SELECT_CONTROL, [kind], read_control, |_| {
        format!("the controls of kind {kind}")
    })?
    .pop();
    let control = KindControl::change(current.as_ref(), kind, change, by, now)?;
    tx.prepare_cached(UPSERT_CONTROL)
        .and_then(|mut stmt| {
            stmt.execute(params![
                control.kind,
                control.paused,
                control.concurrency_limit,
                control.changed_by,
                to_sql_time_lossy(control.changed_at),
            ])
        })
        .map_err(storage)?;
    if control.concurrency_limit.is_some() {
        // The leases taken while the kind had no limit count from now on.
        tx.prepare_cached(COUNT_LEASES_OF_KIND)
            .and_then(|mut stmt| stmt.execute([kind]))
            .map_err(storage)?;
    }
    Ok(control)
}

/// Up to `limit` readable dead rows of `kind` as `conn` sees them, in command ID order; rows that
/// cannot be read are skipped (DESIGN rule 13), so a bulk action goes on past them.
pub(super) fn dead_of_kind(
    conn: &Connection,
    kind: &str,
    limit_rows: usize,
) -> Result<Vec<OutboxRow>, Error> {
    let mut out = Vec::new();
    let mut after = [
        SqlValue::Text(String::new()),
        SqlValue::Integer(i64::MIN),
        SqlValue::Integer(i64::MIN),
    ];
    while out.len() < limit_rows {
        let wanted = limit_rows - out.len();
        let mut page = Vec::with_capacity(wanted.min(256));
        let [w, s, i] = &after;
        each_row(
            conn,
            SELECT_DEAD_OF_KIND,
            params![kind, w, s, i, limit(wanted)],
            |row| {
                let key = [col::WORKFLOW_ID, col::EVENT_SEQ, col::IDX]
                    .map(|column| row.get::<_, SqlValue>(column).unwrap_or(SqlValue::Null));
                Ok((key, read_outbox_row(row).ok()))
            },
            raw_command_id,
            |item| {
                page.push(item.map_err(UnreadableRow::into_error)?);
                Ok(true)
            },
        )?;
        let full_page = page.len() == wanted;
        for (key, row) in page {
            after = key;
            out.extend(row);
        }
        if !full_page {
            break;
        }
    }
    Ok(out)
}

/// Applies `change` to up to `batch` dead rows of `kind` inside `tx`, each with its feedback;
/// returns their IDs. The caller has checked `kind` and `batch` ([`check_bulk`]).
pub(super) fn change_dead_of_kind(
    tx: &Transaction<'_>,
    kind: &str,
    batch: usize,
    now: Timestamp,
    change: impl Fn(&mut OutboxRow) -> Result<(), Error>,
) -> Result<Vec<CommandId>, Error> {
    let rows = dead_of_kind(tx, kind, batch)?;
    let mut ids = Vec::with_capacity(rows.len());
    for row in rows {
        let changed = row.change(now, &change)?;
        write_change(tx, &changed)?;
        ids.push(changed.row.command_id);
    }
    Ok(ids)
}
