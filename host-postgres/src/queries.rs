//! The SQL text of the store's statements, and the hot ones with the index each must use.

use crate::rows::{select_rows, select_timers};

/// A row count as an SQL `LIMIT`.
pub(crate) fn sql_limit(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

pub(crate) const SELECT_ONE: &str =
    select_rows!("WHERE workflow_id = $1 AND event_seq = $2 AND idx = $3");
pub(crate) const SELECT_ONE_FOR_UPDATE: &str =
    select_rows!("WHERE workflow_id = $1 AND event_seq = $2 AND idx = $3 FOR UPDATE");
/// The rows of many commands (`$1`, `$2`, `$3`: their keys as arrays), locked for a heartbeat.
pub(crate) const SELECT_MANY_FOR_UPDATE: &str = select_rows!(
    "WHERE (workflow_id, event_seq, idx) IN \
         (SELECT * FROM unnest($1::text[], $2::bigint[], $3::bigint[])) \
     ORDER BY workflow_id, event_seq, idx FOR UPDATE"
);
/// A heartbeat's new lease expiries (`$4`), one statement for all its leases: the columns
/// [`miniflow_core::OutboxRow::extend`] changes.
pub(crate) const EXTEND_MANY: &str = "UPDATE outbox o SET available_at = u.expires_at, \
         lease_expires_at = u.expires_at \
     FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::bigint[]) \
         AS u (workflow_id, event_seq, idx, expires_at) \
     WHERE (o.workflow_id, o.event_seq, o.idx) = (u.workflow_id, u.event_seq, u.idx)";
/// Keyset pages of the unfinished rows, in command ID order.
pub(crate) const SELECT_PENDING: &str = select_rows!(
    "WHERE processed_at IS NULL AND (workflow_id, event_seq, idx) > ($1, $2, $3) \
     ORDER BY workflow_id, event_seq, idx LIMIT $4"
);
pub(crate) const SELECT_DEAD: &str = select_rows!(
    "WHERE status = 'dead' AND (workflow_id, event_seq, idx) > ($1, $2, $3) \
     ORDER BY workflow_id, event_seq, idx LIMIT $4"
);
pub(crate) const SELECT_UNFINISHED_OF_WORKFLOW_FOR_UPDATE: &str = select_rows!(
    "WHERE workflow_id = $1 AND processed_at IS NULL ORDER BY event_seq, idx FOR UPDATE"
);
pub(crate) const SELECT_WORKFLOW: &str =
    select_rows!("WHERE workflow_id = $1 ORDER BY event_seq, idx");
/// A claim reads its candidates in pages, in claim order ([`OutboxRow::claim_order`]): one priority
/// (`$7`) at a time, each page after the key `($3, $4, $5, $6)` of the last candidate it looked at,
/// leaving out the kinds the operators' controls exclude (`$8`) and skipping rows another claim holds
/// (see [`claim_in`]).
pub(crate) const CLAIM_DUE_FIRST: &str = select_rows!(
    "WHERE processed_at IS NULL AND priority = $7 AND available_at <= $1 \
     AND (available_at, workflow_id, event_seq, idx) > ($3, $4, $5, $6) \
     AND kind <> ALL($8::text[]) \
     ORDER BY available_at, workflow_id, event_seq, idx LIMIT $2 FOR UPDATE OF o SKIP LOCKED"
);
pub(crate) const CLAIM_STRICT: &str = select_rows!(
    "WHERE processed_at IS NULL AND priority = $7 AND available_at <= $1 \
     AND (available_at, workflow_id, event_seq, idx) > ($3, $4, $5, $6) \
     AND kind <> ALL($8::text[]) \
     AND NOT EXISTS (SELECT 1 FROM outbox e WHERE e.workflow_id = o.workflow_id \
         AND e.processed_at IS NULL AND (e.event_seq, e.idx) < (o.event_seq, o.idx)) \
     ORDER BY available_at, workflow_id, event_seq, idx LIMIT $2 FOR UPDATE OF o SKIP LOCKED"
);
/// The highest priority of an unfinished command below `$1`: the next priority a claim reads.
pub(crate) const NEXT_PRIORITY: &str = "SELECT priority FROM outbox \
     WHERE processed_at IS NULL AND priority < $1::bigint ORDER BY priority DESC LIMIT 1";
/// The store's `now` (`$1`, or the database's clock when `$1` is null), whether a command is due, and
/// when the next one is due after it: three reads of the first entries of `outbox_due`. (`now` comes
/// from a CTE because `clock_timestamp()` is volatile: compared row by row, it could bound no index.)
pub(crate) const COMMANDS_DUE: &str = "WITH clock AS (SELECT COALESCE($1::bigint, \
         floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint) AS now), \
     first AS (SELECT min(available_at) AS at FROM outbox WHERE processed_at IS NULL) \
     SELECT clock.now, COALESCE(first.at <= clock.now, FALSE) AS due, \
         (SELECT min(available_at) FROM outbox \
          WHERE processed_at IS NULL AND available_at > clock.now) AS next \
     FROM clock, first";
/// As [`COMMANDS_DUE`], for the timers (`timers_due`).
pub(crate) const TIMERS_DUE: &str = "WITH clock AS (SELECT COALESCE($1::bigint, \
         floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint) AS now), \
     first AS (SELECT min(available_at) AS at FROM timers WHERE processed_at IS NULL) \
     SELECT clock.now, COALESCE(first.at <= clock.now, FALSE) AS due, \
         (SELECT min(available_at) FROM timers \
          WHERE processed_at IS NULL AND available_at > clock.now) AS next \
     FROM clock, first";
pub(crate) const CLAIM_TIMERS: &str = select_timers!(
    "WHERE processed_at IS NULL AND available_at <= $1 ORDER BY available_at, timer_id LIMIT $2 \
     FOR UPDATE SKIP LOCKED"
);
pub(crate) const SELECT_TIMER_FOR_UPDATE: &str = select_timers!("WHERE timer_id = $1 FOR UPDATE");
pub(crate) const SELECT_WORKFLOW_TIMERS: &str =
    select_timers!("WHERE workflow_id = $1 ORDER BY timer_id");

/// The oldest done rows first; rows another purge is deleting are left to it.
pub(crate) const PURGE_DONE: &str = "DELETE FROM outbox WHERE (workflow_id, event_seq, idx) IN \
     (SELECT workflow_id, event_seq, idx FROM outbox \
      WHERE status IN ('done', 'cancelled') AND processed_at <= $1 \
      ORDER BY processed_at, workflow_id, event_seq, idx LIMIT $2 FOR UPDATE SKIP LOCKED)";

/// The queries workers, `pending`, retention and stats run, each with sample arguments (SQL literals)
/// and the index that must answer it (or indexes, separated by `|`): for the test that reads their
/// plans on a database full of done rows.
#[doc(hidden)]
pub fn hot_queries() -> Vec<(&'static str, &'static str, &'static str, &'static str)> {
    const NOW: &str = "1800000000000";
    const AFTER_NOTHING: &str = "1800000000000, 10, -9000000000000000000, '', \
         -9000000000000000000, -9000000000000000000, 0, '{paused}'";
    vec![
        (
            "pending",
            SELECT_PENDING,
            "'', -1, -1, 100",
            "outbox_unfinished",
        ),
        (
            "dead letters",
            SELECT_DEAD,
            "'', -1, -1, 100",
            "outbox_dead",
        ),
        ("one row", SELECT_ONE, "'w', 1, 0", "outbox_pkey"),
        ("a workflow's rows", SELECT_WORKFLOW, "'w'", "outbox_pkey"),
        ("anything due", COMMANDS_DUE, NOW, "outbox_due"),
        // One priority's due rows in due order: from `outbox_claim`, or from `outbox_due` filtered
        // by priority when the statistics say most rows have this priority; both walk only
        // unfinished rows and sort nothing.
        (
            "claim",
            CLAIM_DUE_FIRST,
            AFTER_NOTHING,
            "outbox_claim|outbox_due",
        ),
        (
            "strict claim",
            CLAIM_STRICT,
            AFTER_NOTHING,
            "outbox_claim|outbox_due",
        ),
        (
            "next priority",
            NEXT_PRIORITY,
            "9000000000000000000",
            "outbox_claim",
        ),
        (
            "leases of limited kinds",
            crate::controls::COUNT_LEASES,
            "'{k}', 1800000000000",
            "outbox_leased",
        ),
        (
            "dead of a kind",
            crate::controls::SELECT_DEAD_OF_KIND,
            "'k', '', -1, -1, 100",
            "outbox_dead_by_kind",
        ),
        ("any timer due", TIMERS_DUE, NOW, "timers_due"),
        (
            "due timers",
            CLAIM_TIMERS,
            "1800000000000, 10",
            "timers_due",
        ),
        (
            "a workflow's timers",
            SELECT_WORKFLOW_TIMERS,
            "'w'",
            "timers_pkey",
        ),
        (
            "old done rows",
            PURGE_DONE,
            "1800000000000, 100",
            "outbox_done",
        ),
        (
            "stats of unfinished rows",
            crate::controls::STATS_UNFINISHED,
            NOW,
            "outbox_unfinished|outbox_claim",
        ),
        (
            "stats of dead rows",
            crate::controls::STATS_DEAD,
            "",
            "outbox_dead_by_kind",
        ),
        (
            "stats of unfired timers",
            crate::controls::STATS_TIMERS,
            NOW,
            "timers_due|timers_scheduled_by_name",
        ),
    ]
}
