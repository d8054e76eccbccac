//! The store's operations, once for the synchronous store and the async one: each takes a client
//! ([`Exec`]) and the store's options, runs its statements in its transaction and returns what it
//! did, with whether it made work claimable (for the wake-up hint, which each store raises its own
//! way). [`crate::PostgresStore`] runs them with [`crate::db::block`] on a connection of its pool;
//! the async store awaits them on one of its own.

use miniflow_core::{
    Ack, ClaimRequest, CommandId, Commit, Delivery, Error, Extended, KindChange, KindControl,
    OutboxRow, OutboxStats, TimerId, TimerRow, Timestamp,
};
use std::collections::HashMap;
use std::time::Duration;

use crate::acks::{complete_in, complete_plain_acks};
use crate::claim::{claim_in, claim_timers_in};
use crate::clock::Clock;
use crate::commit::{is_plain, last_seq, write_commit, CommitError, LastEvent};
use crate::db::{in_schema, savepoint, transaction, Columns, Exec, Isolation, Own};
use crate::errors::storage;
use crate::options::PostgresOptions;
use crate::queries::*;
use crate::rows::{
    id_params, query_rows, query_timers, raw_command_id, read_outbox_row, text, to_sql_time,
    write_change,
};

/// A commit on a connection of the store's: a plain commit on the caller's clock is one statement,
/// any other one transaction. Returns whether it made work claimable; a lost race is the core's
/// [`Error::Conflict`], with the workflow's last seq read afresh.
pub(crate) async fn append(
    db: &mut impl Own,
    options: &PostgresOptions,
    commit: &Commit,
    last: Option<&LastEvent>,
) -> Result<bool, Error> {
    let written = if is_plain(commit) && !options.uses_database_clock() {
        write_commit(db, commit, Clock::caller(commit.now()), last).await
    } else {
        transaction!(db, Isolation::ReadCommitted, {
            let clock = Clock::read(options, db, commit.now()).await?;
            write_commit(db, commit, clock, last).await
        })
    };
    match written {
        Ok(work) => Ok(work),
        Err(CommitError::Raced) => {
            let actual = last_seq(db, commit.workflow_id()).await?;
            Err(commit.conflict(actual))
        }
        Err(CommitError::Failed(e)) => Err(e),
    }
}

/// A commit inside the caller's own transaction `db`, in a savepoint: on an error nothing of it
/// stays, and the caller's transaction is not left aborted. Returns the caller's transaction ID
/// when the commit made work and the store hints: the store's hint goes out once that transaction
/// commits ([`crate::notifier::Notifier::raise_after`]), not from inside it, where a `NOTIFY` would
/// make the callers' commits wait for each other.
pub(crate) async fn append_in(
    db: &mut impl Exec,
    options: &PostgresOptions,
    commit: &Commit,
) -> Result<Option<i64>, Error> {
    in_schema!(db, options, { append_in_path(db, options, commit).await })
}

/// The events of `workflow_id` read in the caller's transaction `db` (the history `handle_in`
/// replays), from the store's schema.
pub(crate) async fn load_events_in(
    db: &mut impl Exec,
    options: &PostgresOptions,
    workflow_id: &miniflow_core::WorkflowId,
) -> Result<Vec<miniflow_core::EventRecord>, Error> {
    in_schema!(db, options, {
        crate::rows::load_events(db, workflow_id).await
    })
}

/// [`append_in`] once the store's schema leads the `search_path`.
async fn append_in_path(
    db: &mut impl Exec,
    options: &PostgresOptions,
    commit: &Commit,
) -> Result<Option<i64>, Error> {
    let written: Result<Option<i64>, CommitError> = savepoint!(db, {
        let clock = Clock::read(options, db, commit.now()).await?;
        let work = write_commit(db, commit, clock, None).await?;
        if !(work && options.notifies()) {
            return Ok(None);
        }
        let xid: i64 = db
            .query_one("SELECT pg_current_xact_id()::text::bigint", &[])
            .await
            .and_then(|row| Columns::try_get(&row, 0))
            .map_err(storage)?;
        Ok::<_, CommitError>(Some(xid))
    });
    match written {
        Ok(xid) => Ok(xid),
        Err(CommitError::Raced) => {
            let actual = last_seq(db, commit.workflow_id()).await?;
            Err(commit.conflict(actual))
        }
        Err(CommitError::Failed(e)) => Err(e),
    }
}

/// Applies `change` to one row, read `FOR UPDATE`, inside one transaction; an error rolls it
/// back. The rules themselves live in [`OutboxRow`]'s methods, shared with every store. Returns
/// what `change` returned, the operation's clock and whether it made work claimable.
pub(crate) async fn update<T>(
    db: &mut impl Own,
    options: &PostgresOptions,
    command_id: &CommandId,
    now: Timestamp,
    change: impl FnOnce(&mut OutboxRow, Timestamp) -> Result<T, Error> + Send,
) -> Result<(T, Clock, bool), Error>
where
    T: Send,
{
    transaction!(db, Isolation::ReadCommitted, {
        let clock = Clock::read(options, db, now).await?;
        let (w, s, i) = id_params(command_id);
        let row = query_rows(db, SELECT_ONE_FOR_UPDATE, &[&w, &s, &i])
            .await?
            .pop()
            .ok_or_else(|| Error::UnknownCommand {
                command_id: command_id.clone(),
            })?;
        let before = row.status;
        let changed = row.change(clock.now, |row| change(row, clock.now))?;
        let fed_back = write_change(db, &changed).await?;
        let work = fed_back || changed.row.status != before;
        Ok::<_, Error>((changed.value, clock, work))
    })
}

/// A heartbeat: every lease of `leases` extended by the core's rule ([`OutboxRow::extend`]) in one
/// transaction of two statements (the rows read `FOR UPDATE` at once, the new expiries written at
/// once), whatever their number. One answer per lease, in order, as `extend` one by one would give
/// (a lease named twice is extended twice); expiries in the caller's clock.
pub(crate) async fn extend_all(
    db: &mut impl Own,
    options: &PostgresOptions,
    leases: &[(CommandId, u64)],
    ttl: Duration,
    now: Timestamp,
) -> Result<Vec<Result<Extended, Error>>, Error> {
    if leases.is_empty() {
        return Ok(Vec::new());
    }
    let (answers, clock) = transaction!(db, Isolation::ReadCommitted, {
        let clock = Clock::read(options, db, now).await?;
        let keys = KeyColumns::of(leases.iter().map(|(id, _)| id));
        let read = db
            .query(
                SELECT_MANY_FOR_UPDATE,
                &[&keys.workflows, &keys.seqs, &keys.indexes],
            )
            .await
            .map_err(storage)?;
        // A row that cannot be read fails its own lease's answer, not the others'.
        let mut rows: HashMap<String, Result<OutboxRow, String>> = read
            .iter()
            .map(|row| {
                let id = raw_command_id(row);
                let read = read_outbox_row(row).map_err(|why| format!("command {id}: {why}"));
                (id, read)
            })
            .collect();
        let mut answers = Vec::with_capacity(leases.len());
        let mut extended: Vec<&CommandId> = Vec::new();
        for (id, token) in leases {
            answers.push(match rows.get_mut(&id.to_string()) {
                None => Err(Error::UnknownCommand {
                    command_id: id.clone(),
                }),
                Some(Err(why)) => Err(Error::Corrupt(why.clone())),
                Some(Ok(row)) => row.extend(*token, ttl, clock.now).inspect(|_| {
                    if !extended.contains(&id) {
                        extended.push(id);
                    }
                }),
            });
        }
        if !extended.is_empty() {
            let keys = KeyColumns::of(extended.iter().copied());
            let mut expiries = Vec::with_capacity(extended.len());
            for id in &extended {
                if let Some(Ok(row)) = rows.get(&id.to_string()) {
                    expiries.push(to_sql_time("lease_expires_at", row.available_at)?);
                }
            }
            db.execute(
                EXTEND_MANY,
                &[&keys.workflows, &keys.seqs, &keys.indexes, &expiries],
            )
            .await
            .map_err(storage)?;
        }
        Ok::<_, Error>((answers, clock))
    })?;
    Ok(answers
        .into_iter()
        .map(|answer| {
            answer.map(|extended| Extended {
                expires_at: clock.outward(extended.expires_at),
                ..extended
            })
        })
        .collect())
}

/// Command keys as the three arrays the statements unnest.
struct KeyColumns {
    workflows: Vec<String>,
    seqs: Vec<i64>,
    indexes: Vec<i64>,
}

impl KeyColumns {
    fn of<'a>(ids: impl Iterator<Item = &'a CommandId>) -> Self {
        let mut keys = Self {
            workflows: Vec::new(),
            seqs: Vec::new(),
            indexes: Vec::new(),
        };
        for id in ids {
            let (w, s, i) = id_params(id);
            keys.workflows.push(w.to_owned());
            keys.seqs.push(s);
            keys.indexes.push(i);
        }
        keys
    }
}

/// A claim in one transaction: the deliveries (their lease expiries in the caller's clock) and
/// whether burying unreadable rows fed anything back.
pub(crate) async fn claim(
    db: &mut impl Own,
    options: &PostgresOptions,
    request: &ClaimRequest,
    now: Timestamp,
) -> Result<(Vec<Delivery>, bool), Error> {
    let (mut claimed, fed_back, clock) = transaction!(db, Isolation::ReadCommitted, {
        let clock = Clock::read(options, db, now).await?;
        let (claimed, fed_back) = claim_in(db, request, clock.now).await?;
        Ok::<_, Error>((claimed, fed_back, clock))
    })?;
    for delivery in &mut claimed {
        delivery.lease_expires_at = clock.outward(delivery.lease_expires_at);
    }
    Ok((claimed, fed_back))
}

/// Whether anything is due at the caller's `now` in the table `due_sql` asks about, and the next
/// time something is due after it, in the store's clock: one query, outside any transaction, so
/// idle workers take no lock.
pub(crate) async fn due(
    db: &mut impl Own,
    options: &PostgresOptions,
    due_sql: &'static str,
    now: Timestamp,
) -> Result<(Timestamp, bool, Option<Timestamp>), Error> {
    let caller = if options.uses_database_clock() {
        None
    } else {
        Some(to_sql_time("now", now)?)
    };
    let row = db.query_one(due_sql, &[&caller]).await.map_err(storage)?;
    let read =
        |column| crate::rows::time(&row, column).map_err(|why| Error::Corrupt(why.to_string()));
    let store_now = read("now")?;
    let due: bool = row.try_get("due").map_err(storage)?;
    let next = match row.try_get::<_, Option<i64>>("next").map_err(storage)? {
        Some(_) => Some(read("next")?),
        None => None,
    };
    Ok((store_now, due, next))
}

/// One acknowledgement in its own transaction; whether it made work claimable.
pub(crate) async fn complete(
    db: &mut impl Own,
    options: &PostgresOptions,
    command_id: &CommandId,
    token: u64,
    result: Option<&serde_json::Value>,
    now: Timestamp,
) -> Result<bool, Error> {
    transaction!(db, Isolation::ReadCommitted, {
        let clock = Clock::read(options, db, now).await?;
        complete_in(db, command_id, token, result, clock.now).await
    })
}

/// All `acks` in one transaction: one commit for the batch, the results returned only after it,
/// so a reported completion is durable. Also whether they made work claimable.
pub(crate) async fn complete_all(
    db: &mut impl Own,
    options: &PostgresOptions,
    acks: &[Ack],
    now: Timestamp,
) -> Result<(Vec<Result<(), Error>>, bool), Error> {
    transaction!(db, Isolation::ReadCommitted, {
        let clock = Clock::read(options, db, now).await?;
        let (mut results, mut work) = complete_plain_acks(db, acks, clock.now).await?;
        for (ack, result) in acks.iter().zip(&mut results) {
            if result.is_some() {
                continue;
            }
            // The acks the one statement did not settle, one by one, in order: a refused ack
            // writes nothing before it is refused, so the others stay in the batch; a database
            // error ends the whole batch.
            let completed = complete_in(
                db,
                &ack.command_id,
                ack.token,
                ack.result.as_ref(),
                clock.now,
            )
            .await;
            *result = Some(match completed {
                Ok(made_work) => {
                    work |= made_work;
                    Ok(())
                }
                Err(e @ (Error::Storage(_) | Error::Busy(_))) => return Err(e),
                Err(e) => Err(e),
            });
        }
        let results: Vec<_> = results
            .into_iter()
            .map(|result| result.unwrap_or(Ok(())))
            .collect();
        Ok((results, work))
    })
}

/// A timer claim in one transaction, its times in the caller's clock.
pub(crate) async fn claim_timers(
    db: &mut impl Own,
    options: &PostgresOptions,
    limit: usize,
    lease_ttl: Duration,
    now: Timestamp,
) -> Result<Vec<TimerRow>, Error> {
    let (mut timers, clock) = transaction!(db, Isolation::ReadCommitted, {
        let clock = Clock::read(options, db, now).await?;
        let timers = claim_timers_in(db, limit, lease_ttl, clock.now).await?;
        Ok::<_, Error>((timers, clock))
    })?;
    for timer in &mut timers {
        timer.fire_at = clock.outward(timer.fire_at);
        timer.available_at = clock.outward(timer.available_at);
        timer.created_at = clock.outward(timer.created_at);
    }
    Ok(timers)
}

/// Rejects a scheduled timer by the core's rule ([`TimerRow::reject`]).
pub(crate) async fn reject_timer(
    db: &mut impl Own,
    options: &PostgresOptions,
    timer_id: &TimerId,
    reason: &str,
    now: Timestamp,
) -> Result<(), Error> {
    transaction!(db, Isolation::ReadCommitted, {
        let clock = Clock::read(options, db, now).await?;
        let mut timer = query_timers(db, SELECT_TIMER_FOR_UPDATE, &[&timer_id.to_string()])
            .await?
            .pop()
            .ok_or_else(|| Error::TimerNotScheduled {
                timer_id: timer_id.to_string(),
                status: "unknown",
            })?;
        timer.reject(reason, clock.now)?;
        db.execute(
            "UPDATE timers SET status = $2, processed_at = $3, last_error = $4 \
             WHERE timer_id = $1",
            &[
                &timer_id.to_string(),
                &timer.status.as_str(),
                &to_sql_time("now", clock.now)?,
                &timer.last_error.as_deref().map(text),
            ],
        )
        .await
        .map_err(storage)?;
        Ok::<_, Error>(())
    })
}

/// The outbox's stats from one snapshot (see [`crate::PostgresStore`]'s `stats`).
pub(crate) async fn stats(
    db: &mut impl Own,
    options: &PostgresOptions,
    now: Timestamp,
) -> Result<OutboxStats, Error> {
    transaction!(db, Isolation::Snapshot, {
        let clock = Clock::read(options, db, now).await?;
        crate::controls::outbox_stats(db, clock).await
    })
}

/// Up to `limit` readable rows of `sql` (a keyset query taking the last key as `$1, $2, $3` and a
/// page size as `$4`), skipping rows that cannot be read (DESIGN rule 13).
pub(crate) async fn read_readable(
    db: &mut impl Own,
    sql: &'static str,
    limit: usize,
) -> Result<Vec<OutboxRow>, Error> {
    use crate::rows::{col, read_outbox_row, Column};
    let mut out = Vec::new();
    let mut after = (String::new(), i64::MIN, i64::MIN);
    while out.len() < limit {
        let wanted = limit - out.len();
        let page = db
            .query(sql, &[&after.0, &after.1, &after.2, &sql_limit(wanted)])
            .await
            .map_err(storage)?;
        for row in &page {
            after = (
                col::WORKFLOW_ID.read(row).map_err(storage)?,
                col::EVENT_SEQ.read(row).map_err(storage)?,
                col::IDX.read(row).map_err(storage)?,
            );
            if let Ok(outbox_row) = read_outbox_row(row) {
                out.push(outbox_row);
            }
        }
        if page.len() < wanted {
            break;
        }
    }
    Ok(out)
}

/// A number from 0.5 to 1.5, drawn anew each call from the standard library's randomly keyed hasher:
/// enough to spread racing writers, not for secrets.
pub(crate) fn jitter() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let bits = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    0.5 + (bits >> 11) as f64 / (1u64 << 53) as f64
}

/// Deletes up to `batch` done rows processed at least `older_than` before `now` (by the core's
/// [`miniflow_core::purge_cutoff`]); returns how many.
pub(crate) async fn purge_done(
    db: &mut impl Own,
    options: &PostgresOptions,
    older_than: Duration,
    now: Timestamp,
    batch: usize,
) -> Result<usize, Error> {
    miniflow_core::backend::check_purge_batch(batch)?;
    let clock = Clock::read(options, db, now).await?;
    // Purgeable when processed_at + older_than <= now (see `OutboxRow::is_purgeable`).
    let Some(cutoff) = miniflow_core::purge_cutoff(clock.now, older_than) else {
        return Ok(0);
    };
    let deleted = db
        .execute(
            PURGE_DONE,
            &[&to_sql_time("now", cutoff)?, &sql_limit(batch)],
        )
        .await
        .map_err(storage)?;
    let deleted = usize::try_from(deleted).unwrap_or(usize::MAX);
    crate::telemetry::purged(deleted);
    Ok(deleted)
}

/// Pauses, resumes or limits `kind` in one transaction (the control row read `FOR UPDATE`, so the
/// change waits for a claim counting the kind's leases).
pub(crate) async fn control_kind(
    db: &mut impl Own,
    options: &PostgresOptions,
    kind: &str,
    change: KindChange,
    by: &str,
    now: Timestamp,
) -> Result<KindControl, Error> {
    // Checked before it is sent: a kind the server cannot hold (a NUL) is the caller's mistake.
    miniflow_core::check_kind("kind", kind)?;
    transaction!(db, Isolation::ReadCommitted, {
        let clock = Clock::read(options, db, now).await?;
        crate::controls::control_kind_in(db, kind, change, by, clock).await
    })
}

/// Applies `change` to up to `batch` dead rows of `kind`, read `FOR UPDATE`, each with its
/// feedback, in one transaction; returns their IDs.
pub(crate) async fn change_dead_of_kind(
    db: &mut impl Own,
    options: &PostgresOptions,
    kind: &str,
    batch: usize,
    now: Timestamp,
    change: impl Fn(&mut OutboxRow, Timestamp) -> Result<(), Error> + Send,
) -> Result<Vec<CommandId>, Error> {
    miniflow_core::backend::check_bulk(kind, batch)?;
    transaction!(db, Isolation::ReadCommitted, {
        let clock = Clock::read(options, db, now).await?;
        let rows = crate::controls::dead_of_kind(db, kind, batch, true).await?;
        let mut ids = Vec::with_capacity(rows.len());
        for row in rows {
            let changed = row.change(clock.now, |row| change(row, clock.now))?;
            write_change(db, &changed).await?;
            ids.push(changed.row.command_id);
        }
        Ok::<_, Error>(ids)
    })
}
