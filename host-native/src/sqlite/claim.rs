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

/// A candidate that cannot be read: why, and what could be read of it (see [`salvage`]).
pub(super) struct Unclaimable {
    pub(super) why: UnreadableRow,
    pub(super) salvaged: Option<OutboxRow>,
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
                why: UnreadableRow {
                    row: raw_command_id(row),
                    why: unreadable_value(row, e)?,
                },
                salvaged: salvage(row),
            }),
        };
        Ok(Self { key, id, row })
    }

    /// The workflow as stored, to recognise a workflow seen before.
    pub(super) fn workflow(&self) -> String {
        match &self.key[1] {
            SqlValue::Text(text) => text.clone(),
            other => format!("{other:?}"),
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

/// Leases up to `request.limit` commands inside `tx`, going through the commands claimable at `now` in
/// claim order as they stood when the claim began, like every store (see [`OutboxRow::claim`] and
/// [`OutboxRow::claim_order`]), one priority at a time, and taking only what the operators' controls
/// admit ([`Admission`]): kinds that are paused or out of slots are left out of each page, and a kind
/// that runs out of slots within a page is skipped for the rest of it.
///
/// Two kinds of candidate are buried on the way and do not count towards the limit: a lease that ran
/// out on its last allowed attempt, and a row that cannot be read (DESIGN rule 13, see
/// [`bury_unreadable`]). So the claim reads on, a page of what it still needs at a time, after the last
/// candidate it looked at, then at the next lower priority.
///
/// Each delivery comes with its row's integer key, for the ack.
pub(super) fn claim_in(
    tx: &Connection,
    request: &ClaimRequest,
    now: Timestamp,
) -> Result<Vec<(i64, Delivery)>, Error> {
    let strict = request.order == ClaimOrder::StrictPerWorkflow;
    let now_sql = to_sql_time("now", now)?;
    let mut admission = admission(tx, now)?;
    const FIRST: [SqlValue; 4] = [
        SqlValue::Integer(i64::MIN),
        SqlValue::Text(String::new()),
        SqlValue::Integer(i64::MIN),
        SqlValue::Integer(i64::MIN),
    ];
    let mut after = FIRST;
    let mut priority = next_priority(tx, i64::MAX)?;
    // What this claim already looked at. A lease shorter than a millisecond leaves a claimed command
    // due, and in strict order a burial lets the next command of its workflow qualify: neither was a
    // candidate when the claim began, so neither is taken now.
    let mut seen: HashSet<i64> = HashSet::new();
    let mut seen_workflows: HashSet<String> = HashSet::new();
    let mut deliveries = Vec::new();
    while let Some(level) = priority.filter(|_| deliveries.len() < request.limit) {
        let wanted = request.limit - deliveries.len();
        let mut page = Vec::with_capacity(wanted);
        let [a, w, s, i] = &after;
        let wanted_sql = limit(wanted);
        let mut args: Vec<&dyn rusqlite::ToSql> = vec![&now_sql, &wanted_sql, a, w, s, i, &level];
        let excluded = excluded(&admission);
        let sql = match (&excluded, strict) {
            (None, false) => CLAIM_DUE_FIRST,
            (None, true) => CLAIM_STRICT,
            (Some(_), false) => CLAIM_DUE_FIRST_EXCLUDING,
            (Some(_), true) => CLAIM_STRICT_EXCLUDING,
        };
        if let Some((first, rest)) = &excluded {
            args.push(first);
            args.push(rest);
        }
        each_row(
            tx,
            sql,
            args.as_slice(),
            Candidate::read,
            |_| String::new(),
            |candidate| {
                page.push(candidate.map_err(UnreadableRow::into_error)?);
                Ok(true)
            },
        )?;
        let full_page = page.len() == wanted;
        page.sort_by(|a, b| claim_key_order(&a.key, &b.key));
        for candidate in page {
            let first_look = match request.order {
                ClaimOrder::DueFirst => seen.insert(candidate.id),
                ClaimOrder::StrictPerWorkflow => seen_workflows.insert(candidate.workflow()),
            };
            after = candidate.key;
            if !first_look {
                continue;
            }
            match candidate.row {
                // Its kind ran out of slots earlier in this page.
                Ok(row) if !admission.admits(&row) => {}
                Ok(mut row) => {
                    // The payload goes to the delivery as it was read, not copied: the claim's
                    // rule does not look at it, and a row's change never writes it.
                    let payload = std::mem::take(&mut row.payload);
                    let mut changed = row.into_change(now, |row| Ok(row.claim(request, now)))?;
                    match changed.value.take() {
                        Some(mut delivery) => {
                            delivery.payload = payload;
                            let counted =
                                admission.limited_kinds().any(|kind| kind == delivery.kind);
                            write_lease(tx, candidate.id, &changed.row, counted)?;
                            admission.took(&delivery.kind);
                            deliveries.push((candidate.id, delivery));
                        }
                        None => write_change(tx, &changed)?,
                    }
                }
                Err(unclaimable) => bury_unreadable(tx, candidate.id, unclaimable, now)?,
            }
        }
        if !full_page {
            priority = next_priority(tx, level)?;
            after = FIRST;
        }
    }
    Ok(deliveries)
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

/// Buries a claim candidate that cannot be read, inside the claim's transaction, so that it stops no
/// other delivery (DESIGN rule 13): dead, `last_error` naming the column and the reason, processed at
/// `now`, and its `command_failed` feedback scheduled like any dead command's, built from the columns
/// that could be read. Its other columns stay as they are, for whoever repairs it.
pub(super) fn bury_unreadable(
    tx: &Connection,
    id: i64,
    unclaimable: Unclaimable,
    now: Timestamp,
) -> Result<(), Error> {
    let reason = format!(
        "the stored command could not be read: {}",
        unclaimable.why.why
    );
    let processed_at = to_sql_time("now", now)?;
    // The row as the core buries it (`OutboxRow::bury`); only the columns that change are written.
    // A row whose key columns do not read has no workflow to tell, and no row to apply the rule to.
    let (status, last_error, feedback) = match unclaimable.salvaged {
        Some(row) => {
            let changed = row.change(now, |row| {
                row.bury(reason, now);
                Ok(())
            })?;
            (changed.row.status, changed.row.last_error, changed.feedback)
        }
        None => (Status::Dead, Some(reason), None),
    };
    tx.prepare_cached(
        "UPDATE outbox SET status = ?2, last_error = ?3, processed_at = ?4 WHERE id = ?1",
    )
    .and_then(|mut stmt| stmt.execute(params![id, status.as_str(), last_error, processed_at]))
    .map_err(storage)?;
    match feedback {
        // A count of manual retries that could not be read may name a failure already reported.
        Some(timer) if !timer_exists(tx, &timer.timer_id)? => insert_timer(tx, &timer),
        _ => Ok(()),
    }
}

pub(super) fn timer_exists(conn: &Connection, timer_id: &TimerId) -> Result<bool, Error> {
    conn.prepare_cached("SELECT EXISTS (SELECT 1 FROM timers WHERE timer_id = ?1)")
        .and_then(|mut stmt| stmt.query_row([timer_id.to_string()], |row| row.get(0)))
        .map_err(storage)
}
