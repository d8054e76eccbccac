//! Handling dead letters: `retry` and `resolve` of one command, and of every dead command of a kind
//! (bulk, after a dry run that lists what it matches). A retry refuses a command whose failure its
//! workflow already received, unless forced.

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;

use miniflow::backend::check_bulk;
use miniflow::prelude::*;
use miniflow::{
    CommandId, OutboxRow, Status, TimerId, TimerRow, TimerStatus, Timestamp, WorkflowId,
    COMMAND_FAILED, MAX_BULK_BATCH,
};

use crate::output::{cell, plural, print_rows, when, Done, JsonList, Stop};
use crate::store::{on_store, open_to_read, open_to_write, Store};

/// The `command_failed` feedback of the command's current death, when it already reached its
/// workflow: the timer `{command_id}:failed{manual_retries + 1}` has fired.
fn failure_already_delivered(store: &Store, id: &CommandId) -> Result<Option<TimerRow>, Stop> {
    let Some(row) = on_store!(store, store => store.command(id))? else {
        return Ok(None);
    };
    if row.status != Status::Dead {
        return Ok(None);
    }
    let feedback = TimerId::failure(id.clone(), row.manual_retries + 1);
    Ok(on_store!(store, store => store.timers(id.workflow_id()))?
        .into_iter()
        .find(|timer| timer.timer_id == feedback && timer.status == TimerStatus::Fired))
}

pub fn retry(out: &mut impl Write, db: &Path, id: &str, force: bool, now: Timestamp) -> Done {
    let id: CommandId = id.parse()?;
    let mut store = open_to_write(db)?;
    if !force {
        if let Some(timer) = failure_already_delivered(&store, &id)? {
            let fired = timer
                .processed_at
                .map(|t| format!(" at {}", when(t)))
                .unwrap_or_default();
            return Err(Stop::Failed(format!(
                "not retrying {id}: its workflow {} already received {COMMAND_FAILED} for it \
                 (feedback {} fired{fired}) and may have compensated; a retry sends the command \
                 again. Add --force to retry anyway",
                id.workflow_id(),
                timer.timer_id,
            )));
        }
    }
    on_store!(&mut store, store => store.retry(&id, now))?;
    writeln!(out, "{id}: back to pending")?;
    Ok(())
}

/// `resolve` of one dead command: closed by hand with `note`.
pub fn resolve(out: &mut impl Write, db: &Path, id: &str, note: &str, now: Timestamp) -> Done {
    let id: CommandId = id.parse()?;
    on_store!(&mut open_to_write(db)?, store => store.resolve(&id, note, now))?;
    writeln!(out, "{id}: resolved by hand")?;
    Ok(())
}

/// The dead commands of `kind` whose `command_failed` feedback already reached their workflow (see
/// [`failure_already_delivered`]), one timer read per workflow.
fn failures_already_delivered(store: &Store, dead: &[OutboxRow]) -> Result<Vec<CommandId>, Stop> {
    let mut timers: HashMap<WorkflowId, Vec<TimerRow>> = HashMap::new();
    let mut delivered = Vec::new();
    for row in dead {
        let workflow = row.command_id.workflow_id();
        if !timers.contains_key(workflow) {
            let read = on_store!(store, store => store.timers(workflow))?;
            timers.insert(workflow.clone(), read);
        }
        let feedback = TimerId::failure(row.command_id.clone(), row.manual_retries + 1);
        let fired = timers[workflow]
            .iter()
            .any(|timer| timer.timer_id == feedback && timer.status == TimerStatus::Fired);
        if fired {
            delivered.push(row.command_id.clone());
        }
    }
    Ok(delivered)
}

/// What a bulk action does to each dead command.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Bulk<'a> {
    Retry { force: bool },
    Resolve { note: &'a str },
}

/// `retry` or `resolve` of every dead command of `kind`, in batches of [`MAX_BULK_BATCH`], each
/// recorded as one by one; `dry_run` opens the store read-only and lists what it would change.
pub fn bulk(
    out: &mut impl Write,
    db: &Path,
    kind: &str,
    action: Bulk<'_>,
    dry_run: bool,
    now: Timestamp,
    json: bool,
) -> Done {
    check_bulk(kind, MAX_BULK_BATCH)?;
    let mut store = if dry_run {
        open_to_read(db)?
    } else {
        open_to_write(db)?
    };
    let dead = on_store!(&store, store => store.dead_letters_of_kind(kind, usize::MAX))?;
    let reported = match action {
        Bulk::Retry { .. } => failures_already_delivered(&store, &dead)?,
        Bulk::Resolve { .. } => Vec::new(),
    };
    let verb = match action {
        Bulk::Retry { .. } => "retry",
        Bulk::Resolve { .. } => "resolve",
    };
    if dry_run {
        if json {
            let mut list = JsonList::new(out);
            for row in &dead {
                list.push(serde_json::to_string(row))?;
            }
            return list.end();
        }
        print_rows(out, &dead, &[], false)?;
        let mut summary = format!(
            "would {verb} {} of kind {}",
            plural(dead.len(), "dead command"),
            cell(kind)
        );
        if !reported.is_empty() {
            summary.push_str(&format!(
                "; {} already reported to {} workflow as {COMMAND_FAILED} (retrying {} needs \
                 --force)",
                reported.len(),
                if reported.len() == 1 { "its" } else { "their" },
                if reported.len() == 1 { "it" } else { "them" },
            ));
        }
        writeln!(out, "{summary}; nothing was changed (dry run)")?;
        return Ok(());
    }
    if let Bulk::Retry { force: false } = action {
        if let Some(first) = reported.first() {
            return Err(Stop::Failed(format!(
                "not retrying the dead commands of kind {kind}: the workflows of {} already \
                 received {COMMAND_FAILED} for them (e.g. {first}) and may have compensated; a \
                 retry sends them again. `--dry-run` lists them; add --force to retry anyway",
                plural(reported.len(), "command"),
            )));
        }
    }
    let mut changed = Vec::new();
    loop {
        let batch = match action {
            Bulk::Retry { .. } => {
                on_store!(&mut store, store => store.retry_dead_of_kind(kind, MAX_BULK_BATCH, now))?
            }
            Bulk::Resolve { note } => on_store!(&mut store, store => {
                store.resolve_dead_of_kind(kind, note, MAX_BULK_BATCH, now)
            })?,
        };
        let full = batch.len() == MAX_BULK_BATCH;
        changed.extend(batch);
        if !full {
            break;
        }
    }
    if json {
        let mut list = JsonList::new(out);
        for id in &changed {
            list.push(serde_json::to_string(&id.to_string()))?;
        }
        return list.end();
    }
    let done = match action {
        Bulk::Retry { .. } => "back to pending",
        Bulk::Resolve { .. } => "resolved by hand",
    };
    for id in &changed {
        writeln!(out, "{}: {done}", cell(&id.to_string()))?;
    }
    writeln!(
        out,
        "{} of kind {} {done}",
        plural(changed.len(), "dead command"),
        cell(kind)
    )?;
    Ok(())
}
