//! Claims: going through the candidates in claim order, burying what cannot be read.

use super::*;

/// A command a claim looked at: its key in claim order, its row's integer key, and its row, or what
/// the claim needs to bury a row that cannot be read.
pub(super) struct Candidate {
    /// `(available_at, workflow_id, event_seq, idx)` as stored.
    pub(super) key: [SqlValue; 4],
    pub(super) id: i64,
    pub(super) row: Result<OutboxRow, Unclaimable>,
}

impl Candidate {
    pub(super) fn read(row: &Row<'_>) -> rusqlite::Result<Self> {
        let key = [
            col::AVAILABLE_AT,
            col::WORKFLOW_ID,
            col::EVENT_SEQ,
            col::IDX,
        ]
        .map(|column| row.get::<_, SqlValue>(column).unwrap_or(SqlValue::Null));
        let id = row.get(col::ID)?;
        let row = match read_outbox_row(row) {
            Ok(outbox_row) => Ok(outbox_row),
            Err(e) => Err(Unclaimable {
                name: format!(
                    "{}:{}:{}",
                    raw_text(row, col::WORKFLOW_ID),
                    raw_text(row, col::EVENT_SEQ),
                    raw_text(row, col::IDX)
                ),
                why: unreadable_value(row, e)?.to_string(),
                salvaged: salvage(row),
            }),
        };
        Ok(Self { key, id, row })
    }

    /// The workflow as stored, to recognise a workflow seen before.
    pub(super) fn workflow(&self) -> std::borrow::Cow<'_, str> {
        match &self.key[1] {
            SqlValue::Text(text) => std::borrow::Cow::Borrowed(text),
            other => std::borrow::Cow::Owned(format!("{other:?}")),
        }
    }
}

/// What can be read of an outbox row that cannot be read whole, for its failure feedback: the columns
/// that read, a null payload, and empty values for the others; `None` when its key columns do not
/// spell a command ID (then there is no workflow to tell).
pub(super) fn salvage(row: &Row<'_>) -> Option<OutboxRow> {
    Some(OutboxRow {
        command_id: read_command_id(row).ok()?,
        kind: row.get(col::KIND).unwrap_or_default(),
        payload: serde_json::Value::Null,
        priority: row.get(col::PRIORITY).unwrap_or_default(),
        status: read_text(row, col::STATUS)
            .ok()
            .and_then(|status| status.parse().ok())
            .unwrap_or(Status::Pending),
        attempts: row.get(col::ATTEMPTS).unwrap_or_default(),
        last_error: None,
        available_at: read_time(row, col::AVAILABLE_AT).unwrap_or_default(),
        lease: None,
        created_at: read_time(row, col::CREATED_AT).unwrap_or_default(),
        processed_at: None,
        manual_retries: row.get(col::MANUAL_RETRIES).unwrap_or_default(),
        resolution: None,
        report_result: row.get(col::REPORT_RESULT).unwrap_or_default(),
        result: None,
        cancel_requested: row.get(col::CANCEL_REQUESTED).unwrap_or_default(),
        trace_context: read_trace_context(row),
    })
}

/// Leases up to `request.limit` commands inside `tx`: the core's claim walk ([`ClaimWalk`]) driven
/// with this store's queries, one page of candidates at a time, one priority at a time. Kinds the
/// operators' controls leave out are left out of each page ([`excluded`]); a row that cannot be
/// read is buried as the walk says (DESIGN rule 13, [`bury_unreadable`]).
///
/// Each delivery comes with its row's integer key, for the ack.
pub(super) fn claim_in(
    tx: &Connection,
    request: &ClaimRequest,
    now: Timestamp,
) -> Result<Vec<(i64, Delivery)>, Error> {
    let now_sql = to_sql_time("now", now)?;
    let mut walk: ClaimWalk<'_, [SqlValue; 4], i64> =
        ClaimWalk::new(request, admission(tx, now)?, now);
    let mut deliveries = Vec::new();
    loop {
        let page = match walk.next_step() {
            ClaimStep::Done => return Ok(deliveries),
            ClaimStep::FindPriority { below } => {
                let level = next_priority(tx, below)?;
                walk.at_priority(level);
                continue;
            }
            ClaimStep::ReadPage(page) => read_page(tx, &now_sql, &page)?,
        };
        let rows = page.len();
        for candidate in page {
            let workflow = candidate.workflow().into_owned();
            let offer = walk.offer(
                candidate.key,
                &candidate.id,
                &workflow,
                candidate.row.as_ref().ok(),
            );
            match (offer, candidate.row) {
                (Offer::Skip, _) => {}
                (Offer::Claim, Ok(row)) => {
                    let mut changed = walk.claim_owned(row)?;
                    match changed.value.take() {
                        Some(delivery) => {
                            let counted = walk.is_limited(&delivery.kind);
                            write_lease(tx, candidate.id, &changed.row, counted)?;
                            deliveries.push((candidate.id, delivery));
                        }
                        None => write_change(tx, &changed)?,
                    }
                }
                (_, Err(unclaimable)) => {
                    bury_unreadable(tx, candidate.id, walk.bury(unclaimable)?)?
                }
                (Offer::Bury, Ok(_)) => unreachable!("the walk buries only what did not read"),
            }
        }
        walk.page_read(rows);
    }
}

/// The candidates of `page`, in claim order.
fn read_page(
    tx: &Connection,
    now_sql: &i64,
    page: &ClaimPage<'_, [SqlValue; 4]>,
) -> Result<Vec<Candidate>, Error> {
    let first = [
        SqlValue::Integer(i64::MIN),
        SqlValue::Text(String::new()),
        SqlValue::Integer(i64::MIN),
        SqlValue::Integer(i64::MIN),
    ];
    let [a, w, s, i] = page.after.unwrap_or(&first);
    let wanted_sql = limit(page.limit);
    let mut args: Vec<&dyn rusqlite::ToSql> =
        vec![now_sql, &wanted_sql, a, w, s, i, &page.priority];
    let excluded = excluded_kinds(&page.excluded());
    let sql = match (&excluded, page.strict) {
        (None, false) => CLAIM_DUE_FIRST,
        (None, true) => CLAIM_STRICT,
        (Some(_), false) => CLAIM_DUE_FIRST_EXCLUDING,
        (Some(_), true) => CLAIM_STRICT_EXCLUDING,
    };
    if let Some((first, rest)) = &excluded {
        args.push(first);
        args.push(rest);
    }
    let mut candidates = Vec::with_capacity(page.limit);
    each_row(
        tx,
        sql,
        args.as_slice(),
        Candidate::read,
        |_| String::new(),
        |candidate| {
            candidates.push(candidate.map_err(UnreadableRow::into_error)?);
            Ok(true)
        },
    )?;
    candidates.sort_by(|a, b| claim_key_order(&a.key, &b.key));
    Ok(candidates)
}

/// The order of two candidates' keys `(available_at, workflow_id, event_seq, idx)` as SQLite sorts
/// them: column by column, NULL before numbers before text before blobs.
fn claim_key_order(a: &[SqlValue; 4], b: &[SqlValue; 4]) -> std::cmp::Ordering {
    fn rank(value: &SqlValue) -> u8 {
        match value {
            SqlValue::Null => 0,
            SqlValue::Integer(_) | SqlValue::Real(_) => 1,
            SqlValue::Text(_) => 2,
            SqlValue::Blob(_) => 3,
        }
    }
    let column = |a: &SqlValue, b: &SqlValue| match (a, b) {
        (SqlValue::Integer(a), SqlValue::Integer(b)) => a.cmp(b),
        (SqlValue::Real(a), SqlValue::Real(b)) => a.total_cmp(b),
        (SqlValue::Integer(a), SqlValue::Real(b)) => (*a as f64).total_cmp(b),
        (SqlValue::Real(a), SqlValue::Integer(b)) => a.total_cmp(&(*b as f64)),
        (SqlValue::Text(a), SqlValue::Text(b)) => a.as_bytes().cmp(b.as_bytes()),
        (SqlValue::Blob(a), SqlValue::Blob(b)) => a.cmp(b),
        (a, b) => rank(a).cmp(&rank(b)),
    };
    a.iter()
        .zip(b)
        .map(|(a, b)| column(a, b))
        .find(|order| order.is_ne())
        .unwrap_or(std::cmp::Ordering::Equal)
}

/// The highest priority of an unfinished command below `below`, if any.
pub(super) fn next_priority(tx: &Connection, below: i64) -> Result<Option<i64>, Error> {
    let mut stmt = tx.prepare_cached(NEXT_PRIORITY).map_err(storage)?;
    let mut rows = stmt.query([below]).map_err(storage)?;
    match rows.next().map_err(storage)? {
        Some(row) => row.get(0).map(Some).map_err(storage),
        None => Ok(None),
    }
}

/// Writes a burial the claim walk decided ([`ClaimWalk::bury`]), inside the claim's transaction:
/// only the columns that change; the feedback unless a timer of its ID exists (a count of manual
/// retries that could not be read may name a failure already reported).
pub(super) fn bury_unreadable(tx: &Connection, id: i64, burial: Burial) -> Result<(), Error> {
    let processed_at = to_sql_time("now", burial.processed_at)?;
    tx.prepare_cached(
        "UPDATE outbox SET status = ?2, last_error = ?3, processed_at = ?4 WHERE id = ?1",
    )
    .and_then(|mut stmt| {
        stmt.execute(params![
            id,
            burial.status.as_str(),
            burial.last_error,
            processed_at
        ])
    })
    .map_err(storage)?;
    match burial.feedback {
        Some(timer) if !timer_exists(tx, &timer.timer_id)? => insert_timer(tx, &timer),
        _ => Ok(()),
    }
}

pub(super) fn timer_exists(conn: &Connection, timer_id: &TimerId) -> Result<bool, Error> {
    conn.prepare_cached("SELECT EXISTS (SELECT 1 FROM timers WHERE timer_id = ?1)")
        .and_then(|mut stmt| stmt.query_row([timer_id.to_string()], |row| row.get(0)))
        .map_err(storage)
}
