//! The operators' side on PostgreSQL: stats and the controls of each kind.

use miniflow_core::{Error, KindControl, OutboxStats, Status, Timestamp};
use postgres::{GenericClient, Row};

use crate::connect::{storage, Clock};
use crate::db::Db;

/// Unfinished rows by kind and status, with how many are claimable at `$1` and since when
/// ([`OutboxStats::add`]): a read of a partial index of the unfinished rows.
pub(crate) const STATS_UNFINISHED: &str = "SELECT kind, status, count(*), \
     count(*) FILTER (WHERE available_at <= $1), min(available_at) FILTER (WHERE available_at <= $1) \
     FROM outbox WHERE processed_at IS NULL GROUP BY kind, status";
/// Dead rows by kind: a read of `outbox_dead_by_kind`.
pub(crate) const STATS_DEAD: &str =
    "SELECT kind, count(*) FROM outbox WHERE status = 'dead' GROUP BY kind";
pub(crate) const SELECT_CONTROLS: &str =
    "SELECT kind, paused, concurrency_limit, changed_by, changed_at FROM kind_controls ORDER BY kind";

fn count(row: &Row, column: usize) -> Result<u64, Error> {
    let n: i64 = row.try_get(column).map_err(storage)?;
    Ok(u64::try_from(n).unwrap_or(0))
}

/// The stats at `clock.now` ([`miniflow_core::Operations::stats`]), times in the caller's clock.
pub(crate) fn outbox_stats(
    db: &mut Db<'_, impl GenericClient>,
    clock: Clock,
) -> Result<OutboxStats, Error> {
    let now = crate::rows::to_sql_time("now", clock.now)?;
    let mut stats = OutboxStats::new(clock.outward(clock.now));
    for row in db.query(STATS_UNFINISHED, &[&now]).map_err(storage)? {
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
    for row in db.query(STATS_DEAD, &[]).map_err(storage)? {
        let kind: String = row.try_get(0).map_err(storage)?;
        stats.add(&kind, Status::Dead, count(&row, 1)?, 0, None);
    }
    Ok(stats.with_controls(read_controls(db, SELECT_CONTROLS, clock)?))
}

/// The controls `sql` selects, their times in the caller's clock.
pub(crate) fn read_controls(
    db: &mut Db<'_, impl GenericClient>,
    sql: &'static str,
    clock: Clock,
) -> Result<Vec<KindControl>, Error> {
    let rows = db.query(sql, &[]).map_err(storage)?;
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
