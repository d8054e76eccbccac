//! The read commands: `pending`, `dead`, `show` and `events`. Each opens the store read-only, and
//! prints what reads apart from what does not (a row that cannot be read is reported, not fatal).

use std::io::{self, Write};
use std::path::Path;

use miniflow::prelude::*;
use miniflow::{CommandId, Error, EventRecord, OutboxRow, Timestamp, WorkflowId};

use crate::output::{
    cell, json_line, plural, pretty_json, print_rows, print_unreadable_table, text_of,
    unreadable_found, when, Done, JsonList, Stop, Unreadable,
};
use crate::store::{on_store, open_to_read, Store};

/// Which outbox rows a listing selects.
#[derive(Clone, Copy)]
pub enum Listing {
    Pending,
    Dead,
}

/// What a listing found: the rows that read, the ones that do not, and whether `--limit` cut it.
struct Listed {
    rows: Vec<OutboxRow>,
    unreadable: Vec<Unreadable>,
    cut: bool,
}

/// `pending` or `dead`: the first `limit` rows of `listing`.
pub fn list(out: &mut impl Write, db: &Path, listing: Listing, limit: usize, json: bool) -> Done {
    let listed = list_up_to(&open_to_read(db)?, listing, limit)?;
    print_listing(out, &listed, limit, json)
}

/// The first `limit` rows of `listing` (see [`read_listing`]), and whether there are more.
fn list_up_to(store: &Store, listing: Listing, limit: usize) -> Result<Listed, Stop> {
    let (rows, unreadable) = read_listing(store, listing, limit.saturating_add(1))?;
    if rows.len() + unreadable.len() <= limit {
        return Ok(Listed {
            rows,
            unreadable,
            cut: false,
        });
    }
    // Which of the two lists holds the last one is not known: list again, to the limit.
    let (rows, unreadable) = read_listing(store, listing, limit)?;
    Ok(Listed {
        rows,
        unreadable,
        cut: true,
    })
}

/// Prints a listing, and on stderr a hint when `--limit` cut it short.
fn print_listing(out: &mut impl Write, listed: &Listed, limit: usize, json: bool) -> Done {
    let printed = print_rows(out, &listed.rows, &listed.unreadable, json);
    if listed.cut {
        // The hint goes to stderr, so `--json` output stays one JSON value.
        let _ = writeln!(
            io::stderr(),
            "miniflow: showing the first {}; there are more (raise --limit to see them)",
            plural(limit, "command")
        );
    }
    printed
}

/// The rows of `listing`, and apart from them the ones among them that cannot be read: an unreadable
/// row does not hide the others.
fn read_listing(
    store: &Store,
    listing: Listing,
    limit: usize,
) -> Result<(Vec<OutboxRow>, Vec<Unreadable>), Stop> {
    Ok(on_store!(store, store => {
        let listed = match listing {
            Listing::Pending => store.pending_listing(limit)?,
            Listing::Dead => store.dead_listing(limit)?,
        };
        let unreadable = listed.unreadable.into_iter().map(|row| Unreadable {
            command_id: row.command_id,
            status: row.status,
            error: row.error,
        });
        (listed.rows, unreadable.collect())
    }))
}

/// `show`: one command with every column; `raw`: as stored, also for a row that cannot be read.
pub fn show(out: &mut impl Write, db: &Path, id: &str, raw: bool, json: bool) -> Done {
    let store = open_to_read(db)?;
    if raw {
        show_raw(out, &store, id, json)
    } else {
        show_row(out, &store, id, json)
    }
}

fn show_raw(out: &mut impl Write, store: &Store, id: &str, json: bool) -> Done {
    let columns = on_store!(store, store => store.raw_command(id))?
        .ok_or_else(|| format!("unknown command {id}"))?;
    if json {
        let object: serde_json::Map<String, serde_json::Value> = columns.into_iter().collect();
        return json_line(out, serde_json::to_string(&object));
    }
    for (name, value) in columns {
        writeln!(out, "{name:<16} {}", cell(&text_of(&value)))?;
    }
    Ok(())
}

/// A row for a person: pretty JSON with its times in RFC 3339 (UTC) instead of milliseconds.
fn readable_row(row: &OutboxRow) -> Result<String, Stop> {
    let mut value = serde_json::to_value(row).map_err(|e| e.to_string())?;
    let rfc3339 = |t: &mut serde_json::Value| {
        if let Some(millis) = t.as_u64() {
            *t = when(Timestamp::from_millis(millis)).into();
        }
    };
    for field in ["available_at", "created_at", "processed_at"] {
        if let Some(t) = value.get_mut(field) {
            rfc3339(t);
        }
    }
    if let Some(t) = value.pointer_mut("/lease/expires_at") {
        rfc3339(t);
    }
    pretty_json(serde_json::to_string_pretty(&value))
}

fn show_row(out: &mut impl Write, store: &Store, id: &str, json: bool) -> Done {
    let command_id: CommandId = id.parse()?;
    match on_store!(store, store => store.command(&command_id)) {
        Ok(Some(row)) if json => json_line(out, serde_json::to_string(&row)),
        Ok(Some(row)) => {
            writeln!(out, "{}", readable_row(&row)?)?;
            Ok(())
        }
        Ok(None) => Err(Stop::Failed(format!("unknown command {command_id}"))),
        Err(Error::Corrupt(what)) => {
            let status = on_store!(store, store => store.raw_command(id))?
                .and_then(|columns| columns.into_iter().find(|(name, _)| name == "status"))
                .map_or_else(|| "?".to_owned(), |(_, value)| text_of(&value));
            let row = Unreadable {
                command_id: command_id.to_string(),
                status,
                error: Error::Corrupt(what).to_string(),
            };
            if json {
                json_line(out, serde_json::to_string(&row.to_json()))?;
            } else {
                print_unreadable_table(out, std::slice::from_ref(&row))?;
            }
            unreadable_found(&[row])
        }
        Err(e) => Err(e.into()),
    }
}

/// An event the store holds but cannot read: its stored seq, and why.
struct UnreadableEvent {
    seq: String,
    error: String,
}

/// `events`: a workflow's events, each read on its own; when one cannot be read, the others are
/// still printed and the unreadable ones are listed after them.
pub fn events(out: &mut impl Write, db: &Path, workflow_id: &str, json: bool) -> Done {
    let workflow_id = WorkflowId::new(workflow_id)?;
    let store = open_to_read(db)?;
    let (records, unreadable): (Vec<EventRecord>, Vec<UnreadableEvent>) = on_store!(&store, store => {
        let listing = store.events_listing(&workflow_id)?;
        let unreadable = listing.unreadable.into_iter().map(|event| UnreadableEvent {
            seq: event.seq,
            error: event.error,
        });
        (listing.events, unreadable.collect())
    });
    if json {
        let mut list = JsonList::new(out);
        for event in &records {
            list.push(serde_json::to_string(event))?;
        }
        for event in &unreadable {
            let report =
                serde_json::json!({ "unreadable": { "seq": event.seq, "error": event.error } });
            list.push(serde_json::to_string(&report))?;
        }
        list.end()?;
    } else {
        for event in &records {
            writeln!(
                out,
                "{:>4} {:<24} {}",
                event.seq,
                cell(&event.kind),
                cell(&miniflow::canonical_json(&event.payload))
            )?;
        }
        for event in &unreadable {
            writeln!(
                out,
                "{:>4} unreadable: {}",
                cell(&event.seq),
                cell(&event.error)
            )?;
        }
    }
    if records.is_empty() && unreadable.is_empty() {
        // A retired workflow has no events left: say so, where an unknown one says nothing.
        if let Some(at) = on_store!(&store, store => store.retired_at(&workflow_id))? {
            eprintln!(
                "{workflow_id} was retired by retention at {}: its history is deleted, and it \
                 takes no new event",
                when(at)
            );
        }
    }
    if unreadable.is_empty() {
        return Ok(());
    }
    Err(Stop::Failed(format!(
        "{} of {workflow_id} could not be read (listed as unreadable)",
        plural(unreadable.len(), "event")
    )))
}
