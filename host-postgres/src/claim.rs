//! Claims: the core's claim walk ([`ClaimWalk`]) and timer claim ([`TimerClaim`]) driven with this
//! store's statements, in the claim's transaction, rows another claim holds skipped (`FOR UPDATE
//! SKIP LOCKED`).

use miniflow_core::backend::{
    Burial, ClaimStep, ClaimWalk, Offer, TimerClaim, TimerOffer, Unclaimable,
};
use miniflow_core::{ClaimRequest, Delivery, Error, OutboxRow, TimerRow, Timestamp};
use postgres::Row;

use crate::db::Own;
use crate::errors::storage;
use crate::queries::{sql_limit, CLAIM_DUE_FIRST, CLAIM_STRICT, CLAIM_TIMERS, NEXT_PRIORITY};
use crate::rows::write_change;
use crate::rows::{
    col, id_params, insert_timer, raw_command_id, read_outbox_row, read_timer, salvage, text,
    timer_exists, to_sql_time, token_param, Column,
};

/// A claim candidate's key in claim order: `(available_at, workflow_id, event_seq, idx)`.
type ClaimKey = (i64, String, i64, i64);

/// A command a claim looked at: its key, and its row, or what the claim needs to bury a row that
/// cannot be read.
struct Candidate {
    key: ClaimKey,
    row: Result<OutboxRow, Unclaimable>,
}

impl Candidate {
    fn read(row: &Row) -> Result<Self, Error> {
        let key = (
            col::AVAILABLE_AT.read(row).map_err(storage)?,
            col::WORKFLOW_ID.read(row).map_err(storage)?,
            col::EVENT_SEQ.read(row).map_err(storage)?,
            col::IDX.read(row).map_err(storage)?,
        );
        let row = read_outbox_row(row).map_err(|why| Unclaimable {
            name: raw_command_id(row),
            why: why.to_string(),
            salvaged: salvage(row),
        });
        Ok(Self { key, row })
    }
}

/// Leases up to `request.limit` commands inside `tx`: the core's claim walk driven with this
/// store's queries, a page of candidates at a time (`FOR UPDATE SKIP LOCKED`, the kinds the
/// operators' controls leave out excluded), one priority at a time; each page's leases written in
/// one statement. Returns the deliveries and whether the claim scheduled feedback.
pub(crate) async fn claim_in(
    db: &mut impl Own,
    request: &ClaimRequest,
    now: Timestamp,
) -> Result<(Vec<Delivery>, bool), Error> {
    let now_sql = to_sql_time("now", now)?;
    let admission = crate::controls::admission(db, now).await?;
    let mut walk: ClaimWalk<'_, ClaimKey, (String, i64, i64)> =
        ClaimWalk::new(request, admission, now);
    let mut deliveries = Vec::new();
    let mut fed_back = false;
    loop {
        let page = match walk.next_step() {
            ClaimStep::Done => return Ok((deliveries, fed_back)),
            ClaimStep::FindPriority { below } => {
                let level = next_priority(db, below).await?;
                walk.at_priority(level);
                continue;
            }
            ClaimStep::ReadPage(page) => {
                let sql = if page.strict {
                    CLAIM_STRICT
                } else {
                    CLAIM_DUE_FIRST
                };
                let first = (i64::MIN, String::new(), i64::MIN, i64::MIN);
                let after = page.after.unwrap_or(&first);
                let priority = i32::try_from(page.priority).unwrap_or(i32::MIN);
                let excluded = page.excluded();
                let params: [&(dyn postgres::types::ToSql + Sync); 8] = [
                    &now_sql,
                    &sql_limit(page.limit),
                    &after.0,
                    &after.1,
                    &after.2,
                    &after.3,
                    &priority,
                    &excluded,
                ];
                db.query(sql, &params)
                    .await
                    .map_err(storage)?
                    .iter()
                    .map(Candidate::read)
                    .collect::<Result<Vec<_>, _>>()?
            }
        };
        let (rows, leased_before) = (page.len(), deliveries.len());
        for Candidate { key, row } in page {
            let id = (key.1.clone(), key.2, key.3);
            let workflow = key.1.clone();
            match (walk.offer(key, &id, &workflow, row.as_ref().ok()), row) {
                (Offer::Skip, _) => {}
                (Offer::Claim, Ok(row)) => {
                    let mut changed = walk.claim_owned(row)?;
                    match changed.value.take() {
                        Some(delivery) => deliveries.push(delivery),
                        None => fed_back |= write_change(db, &changed).await?,
                    }
                }
                (_, Err(unclaimable)) => {
                    fed_back |= bury_unreadable(db, &id, walk.bury(unclaimable)?).await?;
                }
                (Offer::Bury, Ok(_)) => unreachable!("the walk buries only what did not read"),
            }
        }
        write_leases(db, request, &deliveries[leased_before..]).await?;
        walk.page_read(rows);
    }
}

/// The highest priority of an unfinished command below `below`, if any.
async fn next_priority(db: &mut impl Own, below: i64) -> Result<Option<i64>, Error> {
    db.query_opt(NEXT_PRIORITY, &[&below])
        .await
        .map_err(storage)?
        .map(|row| row.try_get::<_, i32>(0).map(i64::from).map_err(storage))
        .transpose()
}

/// Writes the columns a claim changed in the leased rows of `deliveries`, in one statement: the hot
/// path of [`Outbox::claim`].
async fn write_leases(
    db: &mut impl Own,
    request: &ClaimRequest,
    deliveries: &[Delivery],
) -> Result<(), Error> {
    let Some(first) = deliveries.first() else {
        return Ok(());
    };
    let mut workflows = Vec::with_capacity(deliveries.len());
    let (mut seqs, mut indexes, mut attempts, mut tokens) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for delivery in deliveries {
        let (w, s, i) = id_params(&delivery.command_id);
        workflows.push(w);
        seqs.push(s);
        indexes.push(i);
        attempts.push(i64::from(delivery.attempt));
        tokens.push(token_param(delivery.token));
    }
    // One claim gives every lease the same owner and expiry.
    let expires_at = to_sql_time("lease_expires_at", first.lease_expires_at)?;
    db.execute(
        "UPDATE outbox o SET status = 'leased', attempts = c.attempts, available_at = $6, \
         lease_owner = $7, lease_expires_at = $6, lease_token = c.token \
         FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::bigint[], $5::bigint[]) \
             AS c (workflow_id, event_seq, idx, attempts, token) \
         WHERE o.workflow_id = c.workflow_id AND o.event_seq = c.event_seq AND o.idx = c.idx",
        &[
            &workflows,
            &seqs,
            &indexes,
            &attempts,
            &tokens,
            &expires_at,
            &request.worker,
        ],
    )
    .await
    .map_err(storage)?;
    Ok(())
}

/// Writes a burial the claim walk decided ([`ClaimWalk::bury`]) inside the claim's transaction:
/// only the columns that change; the feedback unless a timer of its ID exists (a count of manual
/// retries that could not be read may name a failure already reported). Says whether it scheduled
/// feedback.
async fn bury_unreadable(
    db: &mut impl Own,
    (workflow_id, event_seq, idx): &(String, i64, i64),
    burial: Burial,
) -> Result<bool, Error> {
    db.execute(
        "UPDATE outbox SET status = $4, last_error = $5, processed_at = $6 \
         WHERE workflow_id = $1 AND event_seq = $2 AND idx = $3",
        &[
            workflow_id,
            event_seq,
            idx,
            &burial.status.as_str(),
            &text(&burial.last_error),
            &to_sql_time("now", burial.processed_at)?,
        ],
    )
    .await
    .map_err(storage)?;
    match burial.feedback {
        Some(timer) if !timer_exists(db, &timer.timer_id).await? => {
            insert_timer(db, &timer).await.map(|()| true)
        }
        _ => Ok(false),
    }
}

/// Takes up to `limit` due timers inside `tx` (see [`miniflow_core::prelude::Timers::claim_timers`]):
/// the core's [`TimerClaim`] driven with this store's query. A timer that cannot be read stops no
/// other (DESIGN rule 13): it ends `rejected` as the claim says, where operators see it, and is not
/// taken again.
pub(crate) async fn claim_timers_in(
    db: &mut impl Own,
    limit: usize,
    lease_ttl: std::time::Duration,
    now: Timestamp,
) -> Result<Vec<TimerRow>, Error> {
    let now_sql = to_sql_time("now", now)?;
    let mut claim = TimerClaim::new(limit, lease_ttl, now);
    let mut timers = Vec::new();
    while let Some(wanted) = claim.wanted() {
        let rows = db
            .query(CLAIM_TIMERS, &[&now_sql, &sql_limit(wanted)])
            .await
            .map_err(storage)?;
        for row in &rows {
            let timer_id: String = row.try_get("timer_id").map_err(storage)?;
            let timer = read_timer(row).map_err(|why| why.to_string());
            match claim.offer(&timer_id, timer) {
                TimerOffer::Take(timer) => {
                    db.execute(
                        "UPDATE timers SET available_at = $2 WHERE timer_id = $1",
                        &[&timer_id, &to_sql_time("available_at", timer.available_at)?],
                    )
                    .await
                    .map_err(storage)?;
                    timers.push(timer);
                }
                TimerOffer::Reject {
                    last_error,
                    processed_at,
                } => {
                    db.execute(
                        "UPDATE timers SET status = 'rejected', processed_at = $2, last_error = $3 \
                         WHERE timer_id = $1 AND processed_at IS NULL",
                        &[&timer_id, &to_sql_time("now", processed_at)?, &text(&last_error)],
                    ).await
                    .map_err(storage)?;
                }
                _ => {}
            }
        }
        claim.page_read(rows.len());
    }
    Ok(timers)
}
