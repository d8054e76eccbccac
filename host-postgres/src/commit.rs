//! The commit: a workflow's event(s) and commands, its timers, schedules and cancellations, in
//! one statement when it can.

use miniflow_core::{
    canonical_json, Cancelled, Commit, Error, EventRecord, Seq, TimerId, Timestamp, TraceContext,
    WorkflowId,
};

use crate::clock::Clock;
use crate::db::{Columns, Exec};
use crate::errors::{is_unique_violation, storage};
use crate::queries::*;
use crate::rows::{insert_timer, query_rows, query_timers, to_sql_time, write_row};

/// Why a commit did not apply.
pub(crate) enum CommitError {
    /// Another commit wrote the workflow's next event first (a unique violation on the event's key).
    Raced,
    Failed(Error),
}

impl From<Error> for CommitError {
    fn from(e: Error) -> Self {
        CommitError::Failed(e)
    }
}

/// A workflow's last seq, read afresh after a commit lost its race; [`retired`]'s error if
/// retention retired the workflow.
pub(crate) async fn last_seq(db: &mut impl Exec, workflow_id: &WorkflowId) -> Result<Seq, Error> {
    let row = db
        .query_one(
            "SELECT COALESCE(MAX(seq), 0), \
                 (SELECT retired_at FROM retired_workflows WHERE workflow_id = $1) \
             FROM events WHERE workflow_id = $1",
            &[&workflow_id.as_str()],
        )
        .await
        .map_err(storage)?;
    let actual: i64 = row.try_get(0).map_err(storage)?;
    if let Some(at) = row.try_get::<_, Option<i64>>(1).map_err(storage)? {
        return Err(retired(workflow_id, at));
    }
    Ok(Seq::new(u64::try_from(actual).unwrap_or(0))?)
}

/// The error for a commit to a workflow retention retired at `at` (stored milliseconds).
pub(crate) fn retired(workflow_id: &WorkflowId, at: i64) -> Error {
    miniflow_core::backend::retired(
        workflow_id,
        Timestamp::from_millis(u64::try_from(at).unwrap_or_default()),
    )
}

/// A commit's events, and with them its commands, in one statement: nothing is inserted unless the
/// workflow's last seq (`$2`) is the one the commit expects and retention has not retired it, and
/// the statement returns that last seq, how many events it inserted and when the workflow was
/// retired, if it was. Commands go in only together with the events.
///
/// The commit holds its workflow's last event (`FOR KEY SHARE`) until it ends, so retention, which
/// deletes that event, cannot retire the workflow under it: retention skips a workflow whose last
/// event is held ([`crate::retention`]), and a commit whose last event retention deleted meanwhile
/// inserts nothing (it is then told the workflow is retired). A first commit in a `REPEATABLE READ`
/// or `SERIALIZABLE` transaction (a caller's own: the store's sessions run `READ COMMITTED`), whose
/// snapshot may predate a retirement of its ID, reads the `retirements` row `FOR SHARE`: a
/// retention committed since makes it fail (a serialization error, [`Error::Busy`]).
pub(crate) const INSERT_COMMIT: &str = "WITH last AS (\
         SELECT COALESCE(MAX(seq), 0) AS seq, \
             ($16::text IS NULL OR EXISTS (SELECT 1 FROM events f WHERE f.workflow_id = $1 \
                 AND f.seq = $2 AND f.kind = $16 AND f.payload = $17 AND f.recorded_at = $18)) \
                 AS follows, \
             (SELECT retired_at FROM retired_workflows WHERE workflow_id = $1) AS retired_at \
         FROM events WHERE workflow_id = $1), \
     held AS (\
         SELECT 1 FROM events WHERE workflow_id = $1 AND seq = $2 FOR KEY SHARE), \
     fenced AS (\
         SELECT 1 FROM retirements WHERE $2 = 0 \
             AND current_setting('transaction_isolation') IN ('repeatable read', 'serializable') \
         FOR SHARE), \
     e AS (\
         INSERT INTO events (workflow_id, seq, kind, payload, recorded_at) \
         SELECT $1, n.seq, n.kind, n.payload, n.recorded_at \
         FROM unnest($3::bigint[], $4::text[], $5::text[], $6::bigint[]) \
             AS n (seq, kind, payload, recorded_at), last \
         WHERE last.seq = $2 AND last.follows AND last.retired_at IS NULL \
             AND ($2 = 0 OR EXISTS (SELECT 1 FROM held)) \
             AND ($2 <> 0 \
                 OR current_setting('transaction_isolation') NOT IN ('repeatable read', 'serializable') \
                 OR EXISTS (SELECT 1 FROM fenced)) \
         RETURNING seq), \
     c AS (\
         INSERT INTO outbox (workflow_id, event_seq, idx, kind, payload, status, available_at, \
             created_at, report_result, priority, traceparent, tracestate) \
         SELECT $1, c.event_seq, c.idx, c.kind, c.payload, 'pending', c.created_at, c.created_at, \
             c.report_result, c.priority, $14::text, $15::text \
         FROM unnest($7::bigint[], $8::bigint[], $9::text[], $10::text[], $11::bigint[], \
             $12::boolean[], $13::integer[]) \
             AS c (event_seq, idx, kind, payload, created_at, report_result, priority) \
         WHERE EXISTS (SELECT 1 FROM e)) \
     SELECT last.seq, (SELECT count(*) FROM e), last.retired_at FROM last";

/// A commit's commands alone (see [`insert_commands`]).
pub(crate) const INSERT_COMMANDS: &str =
    "INSERT INTO outbox (workflow_id, event_seq, idx, kind, payload, \
         status, available_at, created_at, report_result, priority, traceparent, tracestate) \
     SELECT $1, c.event_seq, c.idx, c.kind, c.payload, 'pending', c.created_at, c.created_at, \
         c.report_result, c.priority, $9::text, $10::text \
     FROM unnest($2::bigint[], $3::bigint[], $4::text[], $5::text[], $6::bigint[], \
         $7::boolean[], $8::integer[]) \
         AS c (event_seq, idx, kind, payload, created_at, report_result, priority)";

/// The columns of a commit's commands, one array each, as [`INSERT_COMMIT`] and [`INSERT_COMMANDS`]
/// take them.
#[derive(Default)]
pub(crate) struct CommandColumns {
    seqs: Vec<i64>,
    indexes: Vec<i64>,
    kinds: Vec<String>,
    payloads: Vec<String>,
    created: Vec<i64>,
    report: Vec<bool>,
    priorities: Vec<i32>,
    /// The commit's trace context, the same for each of its commands.
    traceparent: Option<String>,
    tracestate: Option<String>,
}

impl CommandColumns {
    pub(crate) fn of(commit: &Commit, clock: Clock) -> Result<Self, Error> {
        let rows = commit.commands();
        let mut columns = Self {
            seqs: Vec::with_capacity(rows.len()),
            indexes: Vec::with_capacity(rows.len()),
            kinds: Vec::with_capacity(rows.len()),
            payloads: Vec::with_capacity(rows.len()),
            created: Vec::with_capacity(rows.len()),
            report: Vec::with_capacity(rows.len()),
            priorities: Vec::with_capacity(rows.len()),
            traceparent: commit.trace_context().map(TraceContext::traceparent),
            tracestate: commit
                .trace_context()
                .and_then(TraceContext::tracestate)
                .map(str::to_owned),
        };
        for row in rows {
            columns
                .seqs
                .push(i64::try_from(row.command_id.event_seq().get()).unwrap_or(i64::MAX));
            columns.indexes.push(i64::from(row.command_id.index()));
            columns.kinds.push(row.kind.clone());
            columns.payloads.push(canonical_json(&row.payload));
            columns
                .created
                .push(to_sql_time("now", clock.inward(row.created_at))?);
            columns.report.push(row.report_result);
            columns.priorities.push(row.priority);
        }
        Ok(columns)
    }
}

/// Whether `commit` is written by [`INSERT_COMMIT`] alone: no timer to fire, schedule or cancel, no
/// command to cancel. With the caller's clock, such a commit needs no transaction of its own around
/// the one statement: one round trip.
pub(crate) fn is_plain(commit: &Commit) -> bool {
    commit.fires().is_none()
        && commit.cancel_commands().is_empty()
        && commit.cancel_timers().is_empty()
        && commit.timers().is_empty()
}

/// The event a commit follows, as stored (see [`EventLog::append_after`]): [`INSERT_COMMIT`] writes
/// the commit only while it is stored at the commit's expected seq, equal in every column.
pub(crate) struct LastEvent {
    kind: String,
    payload: String,
    recorded_at: i64,
}

impl LastEvent {
    /// `last` as a store on the caller's clock stores it.
    pub(crate) fn of(last: &EventRecord) -> Result<Self, Error> {
        Ok(Self {
            kind: last.kind.clone(),
            payload: canonical_json(&last.payload),
            recorded_at: to_sql_time("recorded_at", last.recorded_at)?,
        })
    }
}

/// Inserts `commit`'s events, and its commands unless `commands` is false, in one statement (see
/// [`INSERT_COMMIT`]): a workflow whose last seq is not the one expected is a conflict, and a commit
/// that raced another one of the same workflow (a unique violation on a key it writes) is
/// [`CommitError::Raced`].
pub(crate) async fn insert_events(
    db: &mut impl Exec,
    commit: &Commit,
    clock: Clock,
    commands: bool,
    last: Option<&LastEvent>,
) -> Result<(), CommitError> {
    let events = commit.events();
    let mut seqs = Vec::with_capacity(events.len());
    let mut kinds = Vec::with_capacity(events.len());
    let mut payloads = Vec::with_capacity(events.len());
    let mut recorded = Vec::with_capacity(events.len());
    for event in events {
        seqs.push(i64::try_from(event.seq.get()).unwrap_or(i64::MAX));
        kinds.push(event.kind.as_str());
        payloads.push(canonical_json(&event.payload));
        recorded.push(to_sql_time("now", clock.inward(event.recorded_at))?);
    }
    let columns = if commands {
        CommandColumns::of(commit, clock)?
    } else {
        CommandColumns::default()
    };
    let expected = i64::try_from(commit.expected_seq().get()).unwrap_or(i64::MAX);
    let row = db
        .query_one(
            INSERT_COMMIT,
            &[
                &commit.workflow_id().as_str(),
                &expected,
                &seqs,
                &kinds,
                &payloads,
                &recorded,
                &columns.seqs,
                &columns.indexes,
                &columns.kinds,
                &columns.payloads,
                &columns.created,
                &columns.report,
                &columns.priorities,
                &columns.traceparent,
                &columns.tracestate,
                &last.map(|last| last.kind.as_str()),
                &last.map(|last| last.payload.as_str()),
                &last.map(|last| last.recorded_at),
            ],
        )
        .await;
    let row = match row {
        Err(e)
            if is_unique_violation(&e, "events_pkey") || is_unique_violation(&e, "outbox_pkey") =>
        {
            return Err(CommitError::Raced)
        }
        other => other.map_err(storage)?,
    };
    let actual: i64 = row.try_get(0).map_err(storage)?;
    let inserted: i64 = row.try_get(1).map_err(storage)?;
    let retired_at: Option<i64> = row.try_get(2).map_err(storage)?;
    if let Some(at) = retired_at {
        return Err(CommitError::Failed(retired(commit.workflow_id(), at)));
    }
    if actual == expected && inserted == 0 && !seqs.is_empty() {
        // Its last event was deleted under it: retention retired the workflow meanwhile (or the
        // last event did not match `last`: a conflict, which the fresh read tells).
        return Err(CommitError::Raced);
    }
    if actual != expected || inserted != seqs.len() as i64 {
        let actual = Seq::new(u64::try_from(actual).unwrap_or(0)).map_err(Error::from)?;
        return Err(commit.conflict(actual).into());
    }
    Ok(())
}

/// Inserts `commit`'s commands in one statement.
pub(crate) async fn insert_commands(
    db: &mut impl Exec,
    commit: &Commit,
    clock: Clock,
) -> Result<(), Error> {
    if commit.commands().is_empty() {
        return Ok(());
    }
    let columns = CommandColumns::of(commit, clock)?;
    db.execute(
        INSERT_COMMANDS,
        &[
            &commit.workflow_id().as_str(),
            &columns.seqs,
            &columns.indexes,
            &columns.kinds,
            &columns.payloads,
            &columns.created,
            &columns.report,
            &columns.priorities,
            &columns.traceparent,
            &columns.tracestate,
        ],
    )
    .await
    .map_err(storage)?;
    Ok(())
}

/// Writes `commit` on `db` (see [`EventLog::append_with_commands`] for what is written), its times in
/// the store's clock; returns whether it made work claimable (commands or timers). All but a
/// [plain](is_plain) commit need `db` to be a transaction.
pub(crate) async fn write_commit(
    db: &mut impl Exec,
    commit: &Commit,
    clock: Clock,
    last: Option<&LastEvent>,
) -> Result<bool, CommitError> {
    // Commands a commit cancels are withdrawn before its own are written (the cancellation may
    // name their kind): then the commands go in after the cancellation, not with the events.
    let cancels = !commit.cancel_commands().is_empty();
    insert_events(db, commit, clock, !cancels, last).await?;
    if let Some(timer_id) = commit.fires() {
        fire_timer(db, timer_id, clock.now).await?;
    }
    if cancels {
        cancel_commands(db, commit, clock.now).await?;
        insert_commands(db, commit, clock).await?;
    }
    if !commit.cancel_timers().is_empty() {
        db.execute(
            "UPDATE timers SET status = 'cancelled', processed_at = $3 \
             WHERE workflow_id = $1 AND name = ANY($2::text[]) AND processed_at IS NULL",
            &[
                &commit.workflow_id().as_str(),
                &commit.cancel_timers(),
                &to_sql_time("now", clock.now)?,
            ],
        )
        .await
        .map_err(storage)?;
    }
    for timer in commit.timers() {
        let mut timer = timer.clone();
        timer.fire_at = clock.inward(timer.fire_at);
        timer.available_at = clock.inward(timer.available_at);
        timer.created_at = clock.inward(timer.created_at);
        insert_timer(db, &timer).await?;
    }
    Ok(!commit.commands().is_empty() || !commit.timers().is_empty())
}

/// Withdraws the unfinished commands of `commit`'s workflow that it cancels, by the shared rule
/// ([`OutboxRow::cancel`]).
pub(crate) async fn cancel_commands(
    db: &mut impl Exec,
    commit: &Commit,
    now: Timestamp,
) -> Result<(), Error> {
    if commit.cancel_commands().is_empty() {
        return Ok(());
    }
    let rows = query_rows(
        db,
        SELECT_UNFINISHED_OF_WORKFLOW_FOR_UPDATE,
        &[&commit.workflow_id().as_str()],
    )
    .await?;
    for mut row in rows.into_iter().filter(|row| commit.cancels(row)) {
        if row.cancel(now) != Cancelled::Unchanged {
            write_row(db, &row).await?;
        }
    }
    Ok(())
}

/// Marks the timer a commit fires as fired, by the shared rule ([`TimerRow::fire`]).
pub(crate) async fn fire_timer(
    db: &mut impl Exec,
    timer_id: &TimerId,
    now: Timestamp,
) -> Result<(), Error> {
    let mut timer = query_timers(db, SELECT_TIMER_FOR_UPDATE, &[&timer_id.to_string()])
        .await?
        .pop()
        .ok_or_else(|| Error::TimerNotScheduled {
            timer_id: timer_id.to_string(),
            status: "unknown",
        })?;
    timer.fire(now)?;
    db.execute(
        "UPDATE timers SET status = 'fired', processed_at = $2 WHERE timer_id = $1",
        &[&timer_id.to_string(), &to_sql_time("now", now)?],
    )
    .await
    .map_err(storage)?;
    Ok(())
}
