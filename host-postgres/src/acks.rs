//! Acknowledgements: the token-guarded fast path for a batch, and the core's rule for the rest.

use std::collections::hash_map::Entry;
use std::collections::HashMap;

use miniflow_core::{canonical_json, Ack, CommandId, Error, Settled, Timestamp};

use crate::clock::Clock;
use crate::db::Own;
use crate::errors::storage;
use crate::queries::*;
use crate::rows::write_change;
use crate::rows::{id_params, query_rows, to_sql_time, token_param};

/// An acknowledgement; returns whether it made work claimable (feedback, a later command of the
/// workflow no longer held back in strict order, or a slot of a kind with a concurrency limit). The
/// fast path is one `UPDATE` guarded by the
/// lease, for a command that feeds nothing back; on a miss, the row is read `FOR UPDATE`: a command
/// that reports its completion is settled by the shared rule ([`OutboxRow::complete`]) with its
/// feedback, and anything else is explained by [`OutboxRow::check_lease`].
pub(crate) async fn complete_in(
    db: &mut impl Own,
    id: &CommandId,
    token: u64,
    result: Option<&serde_json::Value>,
    now: Timestamp,
) -> Result<bool, Error> {
    let (w, s, i) = id_params(id);
    if let Some(result) = result {
        miniflow_core::JsonLimits::default().check("result", result)?;
    }
    let done = db
        .query(
            "UPDATE outbox SET status = 'done', processed_at = $5, result = $6 \
             WHERE workflow_id = $1 AND event_seq = $2 AND idx = $3 \
             AND status = 'leased' AND lease_token = $4 \
             AND NOT report_result AND NOT cancel_requested \
             RETURNING EXISTS (SELECT 1 FROM outbox e WHERE e.workflow_id = $1 \
                 AND e.processed_at IS NULL AND (e.event_seq, e.idx) > ($2, $3)) \
             OR EXISTS (SELECT 1 FROM kind_controls c WHERE c.kind = outbox.kind \
                 AND c.concurrency_limit IS NOT NULL)",
            &[
                &w,
                &s,
                &i,
                &token_param(token),
                &to_sql_time("now", now)?,
                &result.map(canonical_json),
            ],
        )
        .await
        .map_err(storage)?;
    if let Some(row) = done.first() {
        return row.try_get(0).map_err(storage);
    }
    let row = query_rows(db, SELECT_ONE_FOR_UPDATE, &[&w, &s, &i])
        .await?
        .pop()
        .ok_or_else(|| Error::UnknownCommand {
            command_id: id.clone(),
        })?;
    let changed = row.change(now, |row| row.complete(token, result, now))?;
    if !changed.row.reports_completion() {
        return Err(Error::Corrupt(format!(
            "command {id} holds lease {token} but did not complete"
        )));
    }
    write_change(db, &changed).await
}

/// Marks done every command of the batch that is leased under the ack's token and feeds nothing
/// back, and returns the keys it settled, each with whether the batch made work claimable: whether
/// a settled command has a later unfinished one in its workflow (which strict order held back),
/// asked once per workflow, of its first settled command (in the statement's snapshot, taken
/// before the update, so a workflow with two settled commands has one), or freed a slot of a kind
/// with a concurrency limit.
///
/// `status = (SELECT 'leased')`: an InitPlan, which the planner cannot estimate from the column's
/// statistics. With the literal, statistics gathered while nothing was leased make `status =
/// 'leased'` look like one row, and the planner scans the whole table instead of looking each key
/// up in the primary key.
pub(crate) const COMPLETE_PLAIN: &str = "WITH done AS (\
         UPDATE outbox o SET status = 'done', processed_at = $6, result = c.result \
         FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::bigint[], $5::text[]) \
             AS c (workflow_id, event_seq, idx, token, result) \
         WHERE o.workflow_id = c.workflow_id AND o.event_seq = c.event_seq AND o.idx = c.idx \
             AND o.status = (SELECT 'leased') AND o.lease_token = c.token \
             AND NOT o.report_result AND NOT o.cancel_requested \
         RETURNING o.workflow_id, o.event_seq, o.idx, o.kind), \
     first AS (\
         SELECT DISTINCT ON (workflow_id) workflow_id, event_seq, idx, \
             count(*) OVER (PARTITION BY workflow_id) AS settled \
         FROM done ORDER BY workflow_id, event_seq, idx) \
     SELECT d.workflow_id, d.event_seq, d.idx, \
         EXISTS (SELECT 1 FROM first f WHERE f.settled > 1 OR EXISTS (\
             SELECT 1 FROM outbox e WHERE e.workflow_id = f.workflow_id \
             AND e.processed_at IS NULL AND (e.event_seq, e.idx) > (f.event_seq, f.idx))) \
         OR EXISTS (SELECT 1 FROM kind_controls c WHERE c.kind = d.kind \
             AND c.concurrency_limit IS NOT NULL) \
     FROM done d";

/// The answer to one ack of a batch, once it is known.
pub(crate) type AckResult = Option<Result<(), Error>>;

/// The fast path of [`Outbox::complete_all`] in one statement: every ack whose command is leased under
/// its token and feeds nothing back is marked done. Returns, per ack, `Some(Ok(()))` for those it
/// settled (the first of equal acks) and `Some(Err(InvalidInput))` for a result over the JSON limits,
/// `None` for the rest (to settle one by one), and whether a settled command unblocks a later one of
/// its workflow.
pub(crate) async fn complete_plain_acks(
    db: &mut impl Own,
    acks: &[Ack],
    now: Timestamp,
) -> Result<(Vec<AckResult>, bool), Error> {
    let mut results: Vec<AckResult> = Vec::with_capacity(acks.len());
    let (mut workflows, mut seqs, mut indexes, mut tokens, mut values) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    // A command acknowledged twice goes in once: the later acks are settled one by one after it, as
    // they would be in order. The ack of each key that went in, by its key.
    let mut batched: HashMap<(&str, i64, i64), usize> = HashMap::with_capacity(acks.len());
    for (n, ack) in acks.iter().enumerate() {
        if let Some(result) = &ack.result {
            if let Err(e) = miniflow_core::JsonLimits::default().check("result", result) {
                results.push(Some(Err(e)));
                continue;
            }
        }
        results.push(None);
        let (w, s, i) = id_params(&ack.command_id);
        match batched.entry((w, s, i)) {
            Entry::Occupied(_) => continue,
            Entry::Vacant(first) => {
                first.insert(n);
            }
        }
        workflows.push(w);
        seqs.push(s);
        indexes.push(i);
        tokens.push(token_param(ack.token));
        values.push(ack.result.as_ref().map(canonical_json));
    }
    if workflows.is_empty() {
        return Ok((results, false));
    }
    let settled = db
        .query(
            COMPLETE_PLAIN,
            &[
                &workflows,
                &seqs,
                &indexes,
                &tokens,
                &values,
                &to_sql_time("now", now)?,
            ],
        )
        .await
        .map_err(storage)?;
    let mut work = false;
    for row in &settled {
        let key: (&str, i64, i64) = (
            row.try_get(0).map_err(storage)?,
            row.try_get(1).map_err(storage)?,
            row.try_get(2).map_err(storage)?,
        );
        work |= row.try_get::<_, bool>(3).map_err(storage)?;
        if let Some(&n) = batched.get(&key) {
            results[n] = Some(Ok(()));
        }
    }
    Ok((results, work))
}

/// `settled` with its retry time in the caller's clock.
pub(crate) fn settled_outward(settled: Settled, clock: &Clock) -> Settled {
    match settled {
        Settled::RetryAt { at, backoff } => Settled::RetryAt {
            at: clock.outward(at),
            backoff,
        },
        other => other,
    }
}
