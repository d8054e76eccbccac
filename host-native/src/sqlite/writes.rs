//! Writing rows and commits: the row writes, acknowledgements, the commit itself, savepoints.

use super::*;

/// Writes back every column an [`OutboxRow`] method may change.
pub(super) fn write_row(conn: &Connection, row: &OutboxRow) -> Result<(), Error> {
    if row.status == Status::Pending {
        made_work(); // a retry, a release, a failure to try again
    }
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
    let mut stmt = conn
        .prepare_cached(
            "UPDATE outbox SET status = ?4, attempts = ?5, last_error = ?6, available_at = ?7, \
             lease_owner = ?8, lease_expires_at = ?9, lease_token = ?10, processed_at = ?11, \
             manual_retries = ?12, resolution = ?13, result = ?14, cancel_requested = ?15 \
             WHERE workflow_id = ?1 AND event_seq = ?2 AND idx = ?3",
        )
        .map_err(storage)?;
    stmt.execute(params![
        w,
        s,
        i,
        row.status.as_str(),
        row.attempts,
        row.last_error,
        available_at,
        lease.map(|l| l.owner.as_str()),
        lease_expires_at,
        token,
        processed_at,
        row.manual_retries,
        row.resolution,
        row.result.as_ref().map(canonical_json),
        row.cancel_requested,
    ])
    .map_err(storage)?;
    Ok(())
}

/// Writes the columns a claim changes, to the row with the integer key `id`: the hot path of
/// [`Outbox::claim`]. `counted`: the kind has a concurrency limit, so the lease is marked to be
/// counted against it (only marked leases are indexed for that count).
pub(super) fn write_lease(
    conn: &Connection,
    id: i64,
    row: &OutboxRow,
    counted: bool,
) -> Result<(), Error> {
    let lease = row.lease.as_ref().ok_or_else(|| {
        Error::Corrupt(format!("claimed command {} has no lease", row.command_id))
    })?;
    let expires_at = to_sql_time("lease_expires_at", lease.expires_at)?;
    conn.prepare_cached(
        "UPDATE outbox SET status = 'leased', attempts = ?2, available_at = ?3, lease_owner = ?4, \
         lease_expires_at = ?3, lease_token = ?5, lease_counted = ?6 WHERE id = ?1",
    )
    .and_then(|mut stmt| {
        stmt.execute(params![
            id,
            row.attempts,
            expires_at,
            lease.owner,
            token_param(lease.token),
            counted
        ])
    })
    .map_err(storage)?;
    Ok(())
}

/// A token as an SQL parameter; a token too large to store matches no lease.
pub(super) fn token_param(token: u64) -> i64 {
    i64::try_from(token).unwrap_or(-1)
}

/// The fast path of an ack: the row is the command's, leased under the token, and feeds nothing back.
pub(super) const COMPLETE: &str =
    "UPDATE outbox SET status = 'done', processed_at = ?5, result = ?6 \
     WHERE workflow_id = ?1 AND event_seq = ?2 AND idx = ?3 \
     AND status = 'leased' AND lease_token = ?4 \
     AND report_result = 0 AND cancel_requested = 0";
/// As [`COMPLETE`], reaching the row by its integer key `?7`.
pub(super) const COMPLETE_BY_KEY: &str =
    "UPDATE outbox SET status = 'done', processed_at = ?5, result = ?6 \
     WHERE id = ?7 AND workflow_id = ?1 AND event_seq = ?2 AND idx = ?3 \
     AND status = 'leased' AND lease_token = ?4 \
     AND report_result = 0 AND cancel_requested = 0";

/// Completes each of `acks` inside `tx`: one result per ack. A storage error ends it, and the
/// caller's transaction with it.
pub(super) fn complete_each(
    tx: &Connection,
    acks: &[(Ack, Option<i64>)],
    now: Timestamp,
) -> Result<Vec<Result<(), Error>>, Error> {
    let mut results = Vec::with_capacity(acks.len());
    for (ack, key) in acks {
        let completed = complete_in(
            tx,
            *key,
            &ack.command_id,
            ack.token,
            ack.result.as_ref(),
            now,
        );
        results.push(match completed {
            Err(e @ (Error::Storage(_) | Error::Busy(_))) => return Err(e),
            other => other,
        });
    }
    Ok(results)
}

/// Extends each of `leases` inside `tx` by the core's rule ([`OutboxRow::extend`]): one answer per
/// lease, in order. A lease the rule refuses (lost, or of an unknown command) is answered and
/// written nothing; a storage error ends it, and the caller's transaction with it.
pub(super) fn extend_each(
    tx: &Connection,
    leases: &[(CommandId, u64)],
    ttl: Duration,
    now: Timestamp,
) -> Result<Vec<Result<Extended, Error>>, Error> {
    let mut answers = Vec::with_capacity(leases.len());
    for (id, token) in leases {
        let changed = select_row(tx, id).and_then(|row| {
            let row = row.ok_or_else(|| Error::UnknownCommand {
                command_id: id.clone(),
            })?;
            row.into_change(now, |row| row.extend(*token, ttl, now))
        });
        answers.push(match changed {
            Ok(changed) => {
                write_change(tx, &changed)?;
                Ok(changed.value)
            }
            Err(e @ (Error::Storage(_) | Error::Busy(_))) => return Err(e),
            Err(refused) => Err(refused),
        });
    }
    Ok(answers)
}

/// An acknowledgement. The fast path is one `UPDATE` guarded by the lease, for a command that feeds
/// nothing back; on a miss, the row is read: a command that reports its completion is settled by the
/// shared rule ([`OutboxRow::complete`]) with its feedback, and anything else is explained by
/// [`OutboxRow::check_lease`].
///
/// `key`, the row's integer key if the caller knows it (from its claim), spares the lookup of the
/// command ID; the command ID is checked all the same.
pub(super) fn complete_in(
    conn: &Connection,
    key: Option<i64>,
    id: &CommandId,
    token: u64,
    result: Option<&serde_json::Value>,
    now: Timestamp,
) -> Result<(), Error> {
    let (w, s, i) = id_params(id);
    if let Some(result) = result {
        miniflow_core::JsonLimits::default().check("result", result)?;
    }
    let now_sql = to_sql_time("now", now)?;
    let (token_sql, result_json) = (token_param(token), result.map(canonical_json));
    let by_key = |key| {
        conn.prepare_cached(COMPLETE_BY_KEY).and_then(|mut stmt| {
            stmt.execute(params![w, s, i, token_sql, now_sql, result_json, key])
        })
    };
    let by_id = || {
        conn.prepare_cached(COMPLETE)
            .and_then(|mut stmt| stmt.execute(params![w, s, i, token_sql, now_sql, result_json]))
    };
    // A key that no longer names the command's row (it was purged, its key reused) is passed over.
    let changed = match key.map(by_key).transpose().map_err(storage)? {
        Some(1) => 1,
        _ => by_id().map_err(storage)?,
    };
    if changed == 1 {
        return Ok(());
    }
    let row = select_row(conn, id)?.ok_or_else(|| Error::UnknownCommand {
        command_id: id.clone(),
    })?;
    let changed = row.into_change(now, |row| row.complete(token, result, now))?;
    if !changed.row.reports_completion() {
        return Err(Error::Corrupt(format!(
            "command {id} holds lease {token} but did not complete"
        )));
    }
    write_change(conn, &changed)
}

/// The events of `workflow_id` in seq order, as `conn` sees them.
pub(super) fn load_events(
    conn: &Connection,
    workflow_id: &WorkflowId,
) -> Result<Vec<EventRecord>, Error> {
    load_events_after(conn, workflow_id, Seq::ZERO)
}

/// The events of `workflow_id` after seq `after`, in seq order.
pub(crate) fn load_events_after(
    conn: &Connection,
    workflow_id: &WorkflowId,
    after: Seq,
) -> Result<Vec<EventRecord>, Error> {
    // A seq is below 2^53, so it fits an INTEGER.
    let after = i64::try_from(after.get()).unwrap_or(i64::MAX);
    let read = |row: &Row<'_>| read_event(workflow_id, row);
    let name = |row: &Row<'_>| format!("event {workflow_id}#{}", raw_text(row, 0));
    read_all(
        conn,
        "SELECT seq, kind, payload, recorded_at FROM events \
         WHERE workflow_id = ?1 AND seq > ?2 ORDER BY seq",
        params![workflow_id.as_str(), after],
        read,
        name,
    )
}

/// Runs `write` inside a savepoint of the caller's transaction: on an error the savepoint is rolled
/// back, so nothing of the write stays, and the caller's own writes are left as they were.
pub(crate) fn in_savepoint<T>(
    conn: &Connection,
    write: impl FnOnce(&Connection) -> Result<T, Error>,
) -> Result<T, Error> {
    let run = |sql: &str| {
        conn.prepare_cached(sql)
            .and_then(|mut stmt| stmt.execute([]))
            .map_err(storage)
    };
    run("SAVEPOINT miniflow_write")?;
    match write(conn) {
        Ok(out) => {
            run("RELEASE miniflow_write")?;
            Ok(out)
        }
        Err(e) => {
            // Rolling back can only fail if the connection is gone; the error that matters is `e`.
            let _ = run("ROLLBACK TO miniflow_write").and_then(|_| run("RELEASE miniflow_write"));
            Err(e)
        }
    }
}

/// The payloads of a commit's events and commands as the store keeps them (canonical JSON), written
/// out before the commit goes to the writer, so that the writer thread spends no time on them.
pub(super) struct CommitJson {
    events: Vec<String>,
    commands: Vec<String>,
}

impl CommitJson {
    pub(super) fn of(commit: &Commit) -> Self {
        Self {
            events: commit
                .events()
                .iter()
                .map(|event| canonical_json(&event.payload))
                .collect(),
            commands: commit
                .commands()
                .iter()
                .map(|row| canonical_json(&row.payload))
                .collect(),
        }
    }
}

/// An event as stored, to be found again as a workflow's last (see [`EventLog::append_after`]).
pub(super) struct StoredEvent {
    seq: i64,
    kind: String,
    payload: String,
    recorded_at: i64,
}

impl StoredEvent {
    /// `event` as it would be stored; written out on the caller's thread.
    pub(super) fn of(event: &EventRecord) -> Result<Self, Error> {
        Ok(Self {
            seq: i64::try_from(event.seq.get()).unwrap_or(i64::MAX),
            kind: event.kind.clone(),
            payload: canonical_json(&event.payload),
            recorded_at: to_sql_time("recorded_at", event.recorded_at)?,
        })
    }
}

/// Refuses `commit` with [`Error::Conflict`] unless the event `last` is stored at its seq, equal in
/// every column. Only reads: with [`write_commit`]'s own check that `last`'s seq is the workflow's
/// last, the commit is written only while `last` is the workflow's last event.
pub(super) fn check_last_event(
    tx: &Connection,
    commit: &Commit,
    last: &StoredEvent,
) -> Result<(), Error> {
    let workflow_id = commit.workflow_id().as_str();
    let stored: Option<(String, String, i64)> = tx
        .prepare_cached(
            "SELECT kind, payload, recorded_at FROM events WHERE workflow_id = ?1 AND seq = ?2",
        )
        .and_then(|mut stmt| {
            stmt.query_row(params![workflow_id, last.seq], |row| {
                Ok((row.get(0)?, row.get(1)?, row.get(2)?))
            })
            .optional()
        })
        .map_err(storage)?;
    let equal = stored.is_some_and(|(kind, payload, recorded_at)| {
        kind == last.kind && payload == last.payload && recorded_at == last.recorded_at
    });
    if equal {
        return Ok(());
    }
    let actual: i64 = tx
        .prepare_cached(LAST_SEQ_AND_RETIRED)
        .and_then(|mut stmt| stmt.query_row([workflow_id], |row| row.get(0)))
        .map_err(storage)?;
    Err(commit.conflict(Seq::new(u64::try_from(actual).unwrap_or(0))?))
}

/// Writes `commit`, whose payloads are `json`, on `tx`, which the caller has opened and will commit
/// or roll back (see [`EventLog::append_with_commands`] for what is written, and
/// [`SqliteStore::append_in`]).
///
/// Everything that can refuse the commit (a conflict, a retired workflow, a timer no longer
/// scheduled, a row that cannot be read) is checked before its first write, so that a refused commit
/// has written nothing: the writer runs it without a savepoint of its own.
pub(super) fn write_commit(
    tx: &Connection,
    commit: &Commit,
    json: &CommitJson,
) -> Result<(), Error> {
    let workflow_id = commit.workflow_id().as_str();
    let (actual, retired_at): (i64, Option<i64>) = tx
        .prepare_cached(LAST_SEQ_AND_RETIRED)
        .and_then(|mut stmt| stmt.query_row([workflow_id], |row| Ok((row.get(0)?, row.get(1)?))))
        .map_err(storage)?;
    let actual = Seq::new(actual as u64)?;
    if actual != commit.expected_seq() {
        return Err(commit.conflict(actual));
    }
    if actual == Seq::ZERO {
        check_not_retired(commit.workflow_id(), retired_at)?;
    }
    let fired = commit
        .fires()
        .map(|timer_id| fire_timer(tx, timer_id, commit.now()))
        .transpose()?;
    let cancelled = commands_to_cancel(tx, commit)?;
    // Only writes from here on.
    {
        let mut insert_event = tx
            .prepare_cached(
                "INSERT INTO events (workflow_id, seq, kind, payload, recorded_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5)",
            )
            .map_err(storage)?;
        for (event, payload) in commit.events().iter().zip(&json.events) {
            insert_event
                .execute(params![
                    workflow_id,
                    event.seq.get() as i64,
                    event.kind,
                    payload,
                    to_sql_time("now", event.recorded_at)?,
                ])
                .map_err(|e| match e.sqlite_error_code() {
                    Some(ErrorCode::ConstraintViolation) => commit.conflict(actual),
                    _ => storage(e),
                })?;
        }
        let mut insert_command = tx
            .prepare_cached(
                "INSERT INTO outbox (workflow_id, event_seq, idx, kind, payload, status, \
                 available_at, created_at, report_result, traceparent, tracestate, priority) \
                 VALUES (?1, ?2, ?3, ?4, ?5, 'pending', ?6, ?6, ?7, ?8, ?9, ?10)",
            )
            .map_err(storage)?;
        if let Some(timer) = &fired {
            write_fired_timer(tx, timer)?;
        }
        for row in &cancelled {
            write_row(tx, row)?;
        }
        // One trace context for the whole commit, formatted once.
        let traceparent = commit.trace_context().map(TraceContext::traceparent);
        let tracestate = commit.trace_context().and_then(TraceContext::tracestate);
        for (row, payload) in commit.commands().iter().zip(&json.commands) {
            insert_command
                .execute(params![
                    workflow_id,
                    row.command_id.event_seq().get() as i64,
                    i64::from(row.command_id.index()),
                    row.kind,
                    payload,
                    to_sql_time("now", row.created_at)?,
                    row.report_result,
                    traceparent,
                    tracestate,
                    row.priority,
                ])
                .map_err(storage)?;
        }
        cancel_timers(tx, commit)?;
        for timer in commit.timers() {
            insert_timer(tx, timer)?;
        }
    }
    if !commit.commands().is_empty() {
        made_work();
    }
    Ok(())
}

/// The unfinished commands of `commit`'s workflow that it cancels, changed by the shared rule
/// ([`OutboxRow::cancel`]), for the commit to write.
pub(super) fn commands_to_cancel(
    conn: &Connection,
    commit: &Commit,
) -> Result<Vec<OutboxRow>, Error> {
    if commit.cancel_commands().is_empty() {
        return Ok(Vec::new());
    }
    let rows = query_rows(
        conn,
        SELECT_UNFINISHED_OF_WORKFLOW,
        [commit.workflow_id().as_str()],
    )?;
    Ok(rows
        .into_iter()
        .filter(|row| commit.cancels(row))
        .filter_map(|mut row| (row.cancel(commit.now()) != Cancelled::Unchanged).then_some(row))
        .collect())
}
