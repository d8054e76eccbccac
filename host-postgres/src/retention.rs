//! Retention of finished workflows: their whole history deleted, their IDs kept as retired.
//!
//! The rule is the core's ([`miniflow_core::is_retirable`]); this module finds candidates in SQL and
//! retires each in a transaction that holds it against commits:
//!
//! - a commit holds its workflow's last event (`FOR KEY SHARE`, see the store's `INSERT_COMMIT`)
//!   until it ends;
//! - retirement locks that last event (`FOR UPDATE SKIP LOCKED`): a workflow whose last event a
//!   commit holds is skipped (it is moving on), and one whose last event changed since is skipped
//!   too, so the event it checks is the last one, and no commit can follow it until the workflow's
//!   events are gone and it is recorded as retired;
//! - a commit that waited for the lock finds its last event deleted and writes nothing; the next
//!   read of the workflow tells it that the workflow is retired;
//! - a transaction that retires workflows also counts them in the `retirements` row, which it locks
//!   first (`SKIP LOCKED`: it skips the batch while a first commit of a `REPEATABLE READ` or
//!   `SERIALIZABLE` transaction holds the row); such a first commit reads the row `FOR SHARE`, so
//!   one whose snapshot predates a retirement fails instead of starting a retired ID again.

use std::time::Duration;

use miniflow_core::{Error, Timestamp, WorkflowId};

use crate::db::{begin, block, end, Exec, Isolation, Own};
use crate::errors::storage;
use crate::queries::{sql_limit, SELECT_WORKFLOW, SELECT_WORKFLOW_TIMERS};
use crate::rows::{query_rows, query_timers, to_sql_time};
use crate::store::PostgresStore;

/// Workflows whose history may be retired at `$1` (the cutoff: `now - older_than`), in workflow ID
/// order after `$3`, up to `$2`: the core's rule translated into SQL, to find candidates without
/// reading their rows. Each is checked again by the rule itself when it is retired.
const RETIRABLE: &str = "SELECT e.workflow_id FROM events e WHERE e.workflow_id > $3 \
     GROUP BY e.workflow_id \
     HAVING MAX(e.recorded_at) <= $1 \
     AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.workflow_id = e.workflow_id \
         AND (o.status NOT IN ('done', 'cancelled') OR o.processed_at > $1)) \
     AND NOT EXISTS (SELECT 1 FROM timers t WHERE t.workflow_id = e.workflow_id \
         AND (t.status = 'scheduled' OR t.processed_at > $1)) \
     ORDER BY e.workflow_id LIMIT $2";

/// A workflow's last event, locked against commits unless one holds it.
const LOCK_LAST_EVENT: &str = "SELECT seq FROM events WHERE workflow_id = $1 \
     ORDER BY seq DESC LIMIT 1 FOR UPDATE SKIP LOCKED";

/// Up to `limit` workflow IDs that may be retired with `cutoff`, after `after`.
async fn retirable_after(
    db: &mut impl Own,
    cutoff: Timestamp,
    after: &str,
    limit: usize,
) -> Result<Vec<String>, Error> {
    let cutoff = to_sql_time("now", cutoff)?;
    db.query(RETIRABLE, &[&cutoff, &sql_limit(limit), &after])
        .await
        .map_err(storage)?
        .iter()
        .map(|row| row.try_get(0).map_err(storage))
        .collect()
}

/// Retires `workflow_id` inside `db`'s transaction if the core's rule says it may be (finished at
/// least `older_than` before `now`, the store's clock) and no commit holds it: deletes its commands,
/// timers and events and records it as retired. Says whether it did. A workflow with a row that
/// cannot be read is not known to be finished, and stays.
async fn retire_in(
    db: &mut impl Own,
    workflow_id: &WorkflowId,
    older_than: Duration,
    now: Timestamp,
) -> Result<bool, Error> {
    let id = workflow_id.as_str();
    let Some(locked) = db
        .query_opt(LOCK_LAST_EVENT, &[&id])
        .await
        .map_err(storage)?
    else {
        return Ok(false); // a commit holds it, or it has no event
    };
    let locked: i64 = locked.try_get(0).map_err(storage)?;
    // A statement of its own, which sees every commit that ended before the lock was taken.
    let last = db
        .query_one(
            "SELECT MAX(seq), MAX(recorded_at) FROM events WHERE workflow_id = $1",
            &[&id],
        )
        .await
        .map_err(storage)?;
    let (last_seq, last_event_at): (Option<i64>, Option<i64>) = (
        last.try_get(0).map_err(storage)?,
        last.try_get(1).map_err(storage)?,
    );
    if last_seq != Some(locked) {
        return Ok(false); // it moved on: the event locked is not its last
    }
    let rows = match query_rows(db, SELECT_WORKFLOW, &[&id]).await {
        Ok(commands) => query_timers(db, SELECT_WORKFLOW_TIMERS, &[&id])
            .await
            .map(|timers| (commands, timers)),
        Err(e) => Err(e),
    };
    if !miniflow_core::backend::may_retire(last_event_at, rows, older_than, now)? {
        return Ok(false);
    }
    for sql in [
        "DELETE FROM outbox WHERE workflow_id = $1",
        "DELETE FROM timers WHERE workflow_id = $1",
        "DELETE FROM events WHERE workflow_id = $1",
    ] {
        db.execute(sql, &[&id]).await.map_err(storage)?;
    }
    db.execute(
        "INSERT INTO retired_workflows (workflow_id, last_seq, retired_at) VALUES ($1, $2, $3)",
        &[&id, &locked, &to_sql_time("now", now)?],
    )
    .await
    .map_err(storage)?;
    Ok(true)
}

/// Retires those of `workflows` still finished, in the caller's transaction, counting them in
/// `retirements`; none while a first commit holds that row (a later run retires them).
async fn retire_all(
    db: &mut impl Own,
    workflows: &[WorkflowId],
    older_than: Duration,
    now: Timestamp,
) -> Result<usize, Error> {
    let counted = db
        .query_opt(
            "SELECT 1 FROM retirements WHERE id = 1 FOR NO KEY UPDATE SKIP LOCKED",
            &[],
        )
        .await
        .map_err(storage)?;
    if counted.is_none() {
        return Ok(0);
    }
    let mut retired: usize = 0;
    for workflow_id in workflows {
        retired += usize::from(retire_in(db, workflow_id, older_than, now).await?);
    }
    if retired > 0 {
        db.execute(
            "UPDATE retirements SET retired = retired + $1 WHERE id = 1",
            &[&i64::try_from(retired).unwrap_or(i64::MAX)],
        )
        .await
        .map_err(storage)?;
    }
    Ok(retired)
}

impl PostgresStore {
    /// Retention of finished workflows: deletes the whole history — events, commands and timers —
    /// of every workflow finished at least `older_than` before `now`, and returns how many it
    /// retired. The rule is the core's ([`miniflow_core::is_retirable`]): every command done or
    /// cancelled (none pending, leased or dead), no timer scheduled, and nothing recorded or settled
    /// since the cutoff. An unfinished workflow is never touched.
    ///
    /// A retired workflow ID takes no new event ([`miniflow_core::backend::retired`]): a new history would
    /// repeat its old command IDs, which receivers would fold into the old effects. The store keeps
    /// one small row per retired workflow (`retired_workflows`) to refuse it.
    ///
    /// It sweeps the workflows once, in ID order, and retires up to `batch` of them per transaction,
    /// each checked again by the rule inside it. It never waits for a commit: a workflow whose last
    /// event a commit (or a transaction of yours that committed into it) holds is skipped, and
    /// retired by a later run once it is finished; so is a batch while another retention commits
    /// one, or while a first commit of a caller's `REPEATABLE READ` or `SERIALIZABLE` transaction
    /// holds the `retirements` row. Run it from one process at a time, or from several: a workflow
    /// is retired once.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use miniflow_core::Timestamp;
    /// use miniflow_postgres::PostgresStore;
    ///
    /// let mut store = PostgresStore::connect("postgresql://app@db.internal/shop")?;
    /// let ninety_days = Duration::from_secs(90 * 24 * 3600);
    /// let now = Timestamp::from_millis(1_767_225_600_000);
    /// println!("{} to retire", store.count_finished(ninety_days, now)?);
    /// let retired = store.purge_finished(ninety_days, now, 500)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a `batch` of 0; the store's errors (the workflows retired before
    /// the error stay retired).
    pub fn purge_finished(
        &mut self,
        older_than: Duration,
        now: Timestamp,
        batch: usize,
    ) -> Result<usize, Error> {
        miniflow_core::backend::check_purge_batch(batch)?;
        let mut connection = self.shared().connection()?;
        let clock = self.clock(&mut connection.db(), now)?.now;
        let Some(cutoff) = miniflow_core::purge_cutoff(clock, older_than) else {
            return Ok(0);
        };
        miniflow_core::backend::sweep_retirable(
            &mut connection,
            batch,
            |connection, after, limit| {
                block(retirable_after(&mut connection.db(), cutoff, after, limit))
            },
            |connection, workflows| {
                let db = &mut connection.db();
                let retired = block(async {
                    begin(db, Isolation::ReadCommitted).await?;
                    let out = retire_all(db, &workflows, older_than, clock).await;
                    end(db, out).await
                })?;
                crate::telemetry::retired(retired);
                Ok(retired)
            },
        )
    }

    /// When retention retired `workflow_id` ([`PostgresStore::purge_finished`]), if it did (in the
    /// store's clock): its history is gone, and it takes no new event.
    ///
    /// # Errors
    ///
    /// The store's errors.
    pub fn retired_at(&self, workflow_id: &WorkflowId) -> Result<Option<Timestamp>, Error> {
        let mut connection = self.shared().connection()?;
        let at: Option<i64> = block(connection.db().query_opt(
            "SELECT retired_at FROM retired_workflows WHERE workflow_id = $1",
            &[&workflow_id.as_str()],
        ))
        .map_err(storage)?
        .map(|row| row.try_get(0))
        .transpose()
        .map_err(storage)?;
        Ok(at.map(|at| Timestamp::from_millis(u64::try_from(at).unwrap_or_default())))
    }

    /// At most how many workflows [`PostgresStore::purge_finished`] would retire at `now`: those
    /// finished at least `older_than` before `now` by the core's rule (it keeps one with a row that
    /// cannot be read, and skips one a commit holds). Nothing is changed; a store connected
    /// read-only can count. `purge_finished` checks each again when it retires it, so a workflow
    /// that moves on meanwhile stays.
    ///
    /// # Errors
    ///
    /// The store's errors.
    pub fn count_finished(&self, older_than: Duration, now: Timestamp) -> Result<usize, Error> {
        let mut connection = self.shared().connection()?;
        let mut db = connection.db();
        let clock = self.clock(&mut db, now)?.now;
        let Some(cutoff) = miniflow_core::purge_cutoff(clock, older_than) else {
            return Ok(0);
        };
        miniflow_core::backend::count_retirable(|after, limit| {
            block(retirable_after(&mut db, cutoff, after, limit))
        })
    }
}
