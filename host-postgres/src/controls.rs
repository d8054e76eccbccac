//! The operators' side on PostgreSQL: stats and the controls of each kind.

use miniflow_core::backend::Admission;
use miniflow_core::{Error, KindChange, KindControl, OutboxRow, OutboxStats, Status, Timestamp};
use postgres::Row;

use crate::clock::Clock;
use crate::db::Own;
use crate::errors::storage;
use crate::rows::{col, read_outbox_row, Column};

/// Unfinished rows by kind and status, with how many are claimable at `$1` and since when
/// ([`OutboxStats::add`]): a read of a partial index of the unfinished rows.
pub(crate) const STATS_UNFINISHED: &str = "SELECT kind, status, count(*), \
     count(*) FILTER (WHERE available_at <= $1), min(available_at) FILTER (WHERE available_at <= $1) \
     FROM outbox WHERE processed_at IS NULL GROUP BY kind, status";
/// Dead rows by kind: a read of `outbox_dead_by_kind`.
pub(crate) const STATS_DEAD: &str =
    "SELECT kind, count(*) FROM outbox WHERE status = 'dead' GROUP BY kind";
/// The unfired timers: how many, how many carry feedback, how many are due at `$1`, the first
/// due time ([`miniflow_core::TimerStats::add`]): a read of the unfired timers alone (a partial index).
pub(crate) const STATS_TIMERS: &str = "SELECT count(*), \
     count(*) FILTER (WHERE name IN ('command_completed', 'command_failed', 'command_resolved')), \
     count(*) FILTER (WHERE available_at <= $1), min(available_at) \
     FROM timers WHERE processed_at IS NULL";
pub(crate) const SELECT_CONTROLS: &str =
    "SELECT kind, paused, concurrency_limit, changed_by, changed_at FROM kind_controls ORDER BY kind";

fn count(row: &Row, column: usize) -> Result<u64, Error> {
    let n: i64 = row.try_get(column).map_err(storage)?;
    Ok(u64::try_from(n).unwrap_or(0))
}

/// The stats at `clock.now` ([`miniflow_core::Operations::stats`]), times in the caller's clock.
pub(crate) async fn outbox_stats(db: &mut impl Own, clock: Clock) -> Result<OutboxStats, Error> {
    let now = crate::rows::to_sql_time("now", clock.now)?;
    let mut stats = OutboxStats::new(clock.outward(clock.now));
    for row in db.query(STATS_UNFINISHED, &[&now]).await.map_err(storage)? {
        let kind: String = row.try_get(0).map_err(storage)?;
        // The schema admits only `pending` and `leased` here (`processed_at IS NULL`).
        let status: &str = row.try_get(1).map_err(storage)?;
        let status = status.parse().unwrap_or(Status::Pending);
        let oldest = row
            .try_get::<_, Option<i64>>(4)
            .map_err(storage)?
            .map(|at| clock.outward(Timestamp::from_millis(u64::try_from(at).unwrap_or(0))));
        stats.add(&kind, status, count(&row, 2)?, count(&row, 3)?, oldest);
    }
    for row in db.query(STATS_DEAD, &[]).await.map_err(storage)? {
        let kind: String = row.try_get(0).map_err(storage)?;
        stats.add(&kind, Status::Dead, count(&row, 1)?, 0, None);
    }
    let row = db.query_one(STATS_TIMERS, &[&now]).await.map_err(storage)?;
    let next = row
        .try_get::<_, Option<i64>>(3)
        .map_err(storage)?
        .map(|at| clock.outward(Timestamp::from_millis(u64::try_from(at).unwrap_or(0))));
    stats
        .timers
        .add(count(&row, 0)?, count(&row, 1)?, count(&row, 2)?, next);
    Ok(stats.with_controls(read_controls(db, SELECT_CONTROLS, clock).await?))
}

/// The controls `sql` selects, their times in the caller's clock.
pub(crate) async fn read_controls(
    db: &mut impl Own,
    sql: &'static str,
    clock: Clock,
) -> Result<Vec<KindControl>, Error> {
    let rows = db.query(sql, &[]).await.map_err(storage)?;
    rows.iter().map(|row| read_control(row, clock)).collect()
}

pub(crate) fn read_control(row: &Row, clock: Clock) -> Result<KindControl, Error> {
    let limit: Option<i32> = row.try_get(2).map_err(storage)?;
    let changed_at: i64 = row.try_get(4).map_err(storage)?;
    Ok(KindControl {
        kind: row.try_get(0).map_err(storage)?,
        paused: row.try_get(1).map_err(storage)?,
        concurrency_limit: limit.map(|n| u32::try_from(n).unwrap_or(0)),
        changed_by: row.try_get(3).map_err(storage)?,
        changed_at: clock.outward(Timestamp::from_millis(
            u64::try_from(changed_at).unwrap_or(0),
        )),
    })
}

const SELECT_ACTIVE_CONTROLS: &str =
    "SELECT kind, paused, concurrency_limit, changed_by, changed_at FROM kind_controls \
     WHERE paused OR concurrency_limit IS NOT NULL ORDER BY kind";
/// Locks the control rows of the limited kinds `$1` that no other claim holds: the claim that holds
/// a kind's row counts its leases and takes its slots; the others leave the kind alone meanwhile.
const LOCK_LIMITED: &str = "SELECT kind FROM kind_controls \
     WHERE kind = ANY($1::text[]) AND concurrency_limit IS NOT NULL AND NOT paused \
     FOR UPDATE SKIP LOCKED";
/// The unexpired leases of the kinds `$1` at `$2` ([`miniflow_core::OutboxRow::holds_lease`]):
/// ranges of `outbox_leased`.
pub(crate) const COUNT_LEASES: &str = "SELECT kind, count(*) FROM outbox \
     WHERE status = 'leased' AND kind = ANY($1::text[]) AND available_at > $2 GROUP BY kind";
const SELECT_CONTROL_FOR_UPDATE: &str = "SELECT kind, paused, concurrency_limit, changed_by, \
     changed_at FROM kind_controls WHERE kind = $1 FOR UPDATE";
const UPSERT_CONTROL: &str =
    "INSERT INTO kind_controls (kind, paused, concurrency_limit, changed_by, changed_at) \
     VALUES ($1, $2, $3, $4, $5) ON CONFLICT (kind) DO UPDATE SET paused = excluded.paused, \
     concurrency_limit = excluded.concurrency_limit, changed_by = excluded.changed_by, \
     changed_at = excluded.changed_at";
/// Keyset pages of the dead rows of kind `$1`, in command ID order: a range of
/// `outbox_dead_by_kind`. `$6` adds `FOR UPDATE` for a bulk action.
pub(crate) const SELECT_DEAD_OF_KIND: &str = crate::rows::select_rows!(
    "WHERE status = 'dead' AND kind = $1 AND (workflow_id, event_seq, idx) > ($2, $3, $4) \
     ORDER BY workflow_id, event_seq, idx LIMIT $5"
);
const SELECT_DEAD_OF_KIND_FOR_UPDATE: &str = crate::rows::select_rows!(
    "WHERE status = 'dead' AND kind = $1 AND (workflow_id, event_seq, idx) > ($2, $3, $4) \
     ORDER BY workflow_id, event_seq, idx LIMIT $5 FOR UPDATE"
);

/// What the operators' controls let a claim at `now` (the store's clock) take, inside the claim's
/// transaction: paused kinds are refused; each limited kind whose control row this claim can lock
/// (`FOR UPDATE SKIP LOCKED`) has its limit less its unexpired leases, counted after the lock, so
/// that claims in several processes never lease more than the limit between them; a limited kind
/// another claim holds is left alone by this one.
pub(crate) async fn admission(db: &mut impl Own, now: Timestamp) -> Result<Admission, Error> {
    let controls = read_controls(db, SELECT_ACTIVE_CONTROLS, Clock::caller(now)).await?;
    let mut admission = Admission::new(&controls);
    let limited: Vec<String> = admission.limited_kinds().map(str::to_owned).collect();
    if limited.is_empty() {
        return Ok(admission);
    }
    let locked: Vec<String> = db
        .query(LOCK_LIMITED, &[&limited])
        .await
        .map_err(storage)?
        .iter()
        .map(|row| row.try_get(0))
        .collect::<Result<_, _>>()
        .map_err(storage)?;
    for kind in limited.iter().filter(|kind| !locked.contains(kind)) {
        admission.withhold(kind);
    }
    if locked.is_empty() {
        return Ok(admission);
    }
    // A statement of its own, after the lock: its snapshot sees every lease a claim that held the
    // lock before committed.
    let now_sql = crate::rows::to_sql_time("now", now)?;
    for row in db
        .query(COUNT_LEASES, &[&locked, &now_sql])
        .await
        .map_err(storage)?
    {
        let kind: &str = row.try_get(0).map_err(storage)?;
        admission.leased(kind, count(&row, 1)?);
    }
    Ok(admission)
}

/// Changes the controls of `kind` inside a transaction ([`miniflow_core::Operations::control_kind`]),
/// at `clock.now`; returns them in the caller's clock.
pub(crate) async fn control_kind_in(
    db: &mut impl Own,
    kind: &str,
    change: KindChange,
    by: &str,
    clock: Clock,
) -> Result<KindControl, Error> {
    let current = match db
        .query_opt(SELECT_CONTROL_FOR_UPDATE, &[&kind])
        .await
        .map_err(storage)?
    {
        Some(row) => Some(read_control(&row, Clock::caller(clock.now))?),
        None => None,
    };
    let control = KindControl::change(current.as_ref(), kind, change, by, clock.now)?;
    let limit = control
        .concurrency_limit
        .map(|n| i32::try_from(n).unwrap_or(i32::MAX));
    db.execute(
        UPSERT_CONTROL,
        &[
            &control.kind,
            &control.paused,
            &limit,
            &crate::rows::text(&control.changed_by),
            &crate::rows::to_sql_time("now", control.changed_at)?,
        ],
    )
    .await
    .map_err(storage)?;
    Ok(KindControl {
        changed_at: clock.outward(control.changed_at),
        ..control
    })
}

/// Up to `limit` readable dead rows of `kind`, in command ID order (`FOR UPDATE` when `lock`); rows
/// that cannot be read are skipped (DESIGN rule 13), so a bulk action goes on past them.
pub(crate) async fn dead_of_kind(
    db: &mut impl Own,
    kind: &str,
    limit: usize,
    lock: bool,
) -> Result<Vec<OutboxRow>, Error> {
    let sql = if lock {
        SELECT_DEAD_OF_KIND_FOR_UPDATE
    } else {
        SELECT_DEAD_OF_KIND
    };
    let mut out = Vec::new();
    let mut after = (String::new(), i64::MIN, i64::MIN);
    while out.len() < limit {
        let wanted = limit - out.len();
        let page_size = i64::try_from(wanted).unwrap_or(i64::MAX);
        let page = db
            .query(sql, &[&kind, &after.0, &after.1, &after.2, &page_size])
            .await
            .map_err(storage)?;
        for row in &page {
            after = (
                col::WORKFLOW_ID.read(row).map_err(storage)?,
                col::EVENT_SEQ.read(row).map_err(storage)?,
                col::IDX.read(row).map_err(storage)?,
            );
            if let Ok(row) = read_outbox_row(row) {
                out.push(row);
            }
        }
        if page.len() < wanted {
            break;
        }
    }
    Ok(out)
}
