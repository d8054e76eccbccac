//! Retention: done commands purged, finished workflows retired, and the pages they held given back.

use super::*;

/// Workflows whose history may be retired at `?1` (the cutoff: `now - older_than`), in workflow ID
/// order after `?3`, up to `?2`: the core's rule ([`miniflow_core::is_retirable`]) translated into
/// SQL, to find candidates without reading their rows. The writer checks each with the rule itself.
pub(super) const RETIRABLE: &str = "SELECT e.workflow_id FROM events e WHERE e.workflow_id > ?3 \
     GROUP BY e.workflow_id \
     HAVING MAX(e.recorded_at) <= ?1 \
     AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.workflow_id = e.workflow_id \
         AND (NOT (o.status = 'done' OR o.status = 'cancelled') OR o.processed_at > ?1)) \
     AND NOT EXISTS (SELECT 1 FROM timers t WHERE t.workflow_id = e.workflow_id \
         AND (t.status = 'scheduled' OR t.processed_at > ?1)) \
     ORDER BY e.workflow_id LIMIT ?2 + 0";

/// A workflow's last seq (0 for none), and when retention retired it if it did: what a commit checks
/// before it writes, in one statement.
pub(super) const LAST_SEQ_AND_RETIRED: &str = "SELECT COALESCE(MAX(seq), 0), \
     (SELECT retired_at FROM retired_workflows WHERE workflow_id = ?1) \
     FROM events WHERE workflow_id = ?1";

/// Refuses a first commit to a workflow that retention retired at `retired_at` (see
/// [`miniflow_core::backend::retired`]).
pub(super) fn check_not_retired(
    workflow_id: &WorkflowId,
    retired_at: Option<i64>,
) -> Result<(), Error> {
    match retired_at {
        Some(at) => Err(miniflow_core::backend::retired(
            workflow_id,
            Timestamp::from_millis(u64::try_from(at).unwrap_or_default()),
        )),
        None => Ok(()),
    }
}

/// Retires `workflow_id` inside `tx` if the core's rule says it may be (finished at least
/// `older_than` before `now`): deletes its commands, timers and events and records it as retired.
/// Says whether it did. A workflow with a row that cannot be read is not known to be finished, and
/// stays.
pub(super) fn retire_in(
    tx: &Connection,
    workflow_id: &WorkflowId,
    older_than: Duration,
    now: Timestamp,
) -> Result<bool, Error> {
    let id = workflow_id.as_str();
    let (last_seq, last_event_at): (Option<i64>, Option<i64>) = tx
        .prepare_cached("SELECT MAX(seq), MAX(recorded_at) FROM events WHERE workflow_id = ?1")
        .and_then(|mut stmt| stmt.query_row([id], |row| Ok((row.get(0)?, row.get(1)?))))
        .map_err(storage)?;
    let rows = query_rows(tx, SELECT_WORKFLOW, [id])
        .and_then(|commands| Ok((commands, query_timers(tx, SELECT_WORKFLOW_TIMERS, [id])?)));
    if !miniflow_core::backend::may_retire(last_event_at, rows, older_than, now)? {
        return Ok(false);
    }
    for sql in [
        "DELETE FROM outbox WHERE workflow_id = ?1",
        "DELETE FROM timers WHERE workflow_id = ?1",
        "DELETE FROM events WHERE workflow_id = ?1",
    ] {
        tx.prepare_cached(sql)
            .and_then(|mut stmt| stmt.execute([id]))
            .map_err(storage)?;
    }
    tx.prepare_cached(
        "INSERT INTO retired_workflows (workflow_id, last_seq, retired_at) VALUES (?1, ?2, ?3)",
    )
    .and_then(|mut stmt| stmt.execute(params![id, last_seq.unwrap_or(0), to_sql_time_lossy(now)]))
    .map_err(storage)?;
    Ok(true)
}

/// Gives the pages freed by deletions back to the file system (the file has
/// `auto_vacuum = INCREMENTAL`): they move to the end of the file, which the next checkpoint cuts
/// off.
pub(super) fn give_back_free_pages(tx: &Connection) -> Result<(), Error> {
    // Each step moves one page (and returns a row): step to the end.
    let mut stmt = tx
        .prepare_cached("PRAGMA incremental_vacuum")
        .map_err(storage)?;
    let mut pages = stmt.query([]).map_err(storage)?;
    while pages.next().map_err(storage)?.is_some() {}
    Ok(())
}

impl SqliteStore {
    /// Retention of finished workflows: deletes the whole history — events, commands and timers —
    /// of every workflow finished at least `older_than` before `now`, and returns how many it
    /// retired. The rule is the core's ([`miniflow_core::is_retirable`]): every command done or
    /// cancelled (none pending, leased or dead), no timer scheduled, and nothing recorded or settled
    /// since the cutoff. An unfinished workflow is never touched.
    ///
    /// A retired workflow ID takes no new event ([`miniflow_core::backend::retired`]): a new history would
    /// repeat its old command IDs, which receivers would fold into the old effects. The store keeps
    /// one small row per retired workflow to refuse it.
    ///
    /// It sweeps the workflows once, in ID order: it looks for candidates on the store's own read
    /// connection, then retires them through the writer, up to `batch` workflows per transaction,
    /// each checked again by the rule inside the transaction. So the write lock is held for one
    /// batch at a time, and commits and deliveries go on between batches. The pages freed are
    /// given back to the file system.
    ///
    /// ```
    /// use std::time::Duration;
    /// use miniflow_core::prelude::*;
    /// use miniflow_core::{json, Command, Commit, Decision, Event, Seq, Timestamp, WorkflowId};
    /// use miniflow_native::SqliteStore;
    ///
    /// let dir = tempfile::tempdir()?;
    /// let mut store = SqliteStore::open(dir.path().join("flow.db"))?;
    /// let trip = WorkflowId::new("trip-001")?;
    /// let decision = Decision::new().command(Command::new("lock_budget", json!({})));
    /// let start = Event::new("trip_requested", json!({}));
    /// store.append_with_commands(&Commit::new(trip.clone(), Seq::ZERO, start, decision, Timestamp::from_millis(0))?)?;
    ///
    /// let week = Duration::from_secs(7 * 24 * 3600);
    /// let later = Timestamp::from_millis(30 * 24 * 3600 * 1000);
    /// assert_eq!(store.purge_finished(week, later, 100)?, 0, "its command is still pending");
    /// store.mark_done(&"trip-001:1:0".parse()?, Timestamp::from_millis(1_000))?;
    /// assert_eq!(store.purge_finished(week, later, 100)?, 1);
    /// assert!(store.load(&trip)?.is_empty() && store.commands(&trip)?.is_empty());
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
        if batch == 0 {
            return Err(Error::invalid("batch", batch, "must be at least 1"));
        }
        let Some(cutoff) = miniflow_core::purge_cutoff(now, older_than) else {
            return Ok(0);
        };
        miniflow_core::backend::sweep_retirable(
            self,
            batch,
            |store, after, limit| retirable_after(&store.conn, cutoff, after, limit),
            |store, workflows| {
                let retired = store.write(move |tx| {
                    let mut retired = 0;
                    for workflow_id in &workflows {
                        retired += usize::from(retire_in(tx, workflow_id, older_than, now)?);
                    }
                    give_back_free_pages(tx)?;
                    Ok(retired)
                })?;
                crate::telemetry::retired(retired);
                Ok(retired)
            },
        )
    }

    /// When retention retired `workflow_id` ([`SqliteStore::purge_finished`]), if it did: its
    /// history is gone, and it takes no new event. Read on the store's own connection (a store
    /// opened read-only too).
    ///
    /// # Errors
    ///
    /// The store's errors.
    pub fn retired_at(&self, workflow_id: &WorkflowId) -> Result<Option<Timestamp>, Error> {
        let at: Option<i64> = self
            .conn
            .prepare_cached("SELECT retired_at FROM retired_workflows WHERE workflow_id = ?1")
            .and_then(|mut stmt| {
                stmt.query_row([workflow_id.as_str()], |row| row.get(0))
                    .optional()
            })
            .map_err(storage)?;
        Ok(at.map(|at| Timestamp::from_millis(u64::try_from(at).unwrap_or_default())))
    }

    /// At most how many workflows [`SqliteStore::purge_finished`] would retire at `now`: those
    /// finished at least `older_than` before `now` by the core's rule (it keeps one with a row that
    /// cannot be read), counted on the store's own connection
    /// (a store opened read-only too). Nothing is changed. `purge_finished` checks each again when
    /// it retires it, so a workflow that moves on meanwhile stays.
    ///
    /// # Errors
    ///
    /// The store's errors.
    pub fn count_finished(&self, older_than: Duration, now: Timestamp) -> Result<usize, Error> {
        let Some(cutoff) = miniflow_core::purge_cutoff(now, older_than) else {
            return Ok(0);
        };
        miniflow_core::backend::count_retirable(|after, limit| {
            retirable_after(&self.conn, cutoff, after, limit)
        })
    }
}

/// Up to `limit` workflows that may be retired with `cutoff` (see [`RETIRABLE`]), in workflow ID
/// order after `after`, read on `conn`.
fn retirable_after(
    conn: &Connection,
    cutoff: Timestamp,
    after: &str,
    limit_rows: usize,
) -> Result<Vec<String>, Error> {
    let cutoff = to_sql_time("now", cutoff)?;
    conn.prepare_cached(RETIRABLE)
        .and_then(|mut stmt| {
            stmt.query_map(params![cutoff, limit(limit_rows), after], |row| row.get(0))?
                .collect()
        })
        .map_err(storage)
}
