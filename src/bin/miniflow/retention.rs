//! Retention: `purge-done` (old done commands) and `purge-finished` (the whole history of workflows
//! finished long enough ago), each with a dry run that counts on a store opened read-only.

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use miniflow::prelude::*;
use miniflow::{purge_cutoff, Timestamp};

use crate::output::{json_line, plural, when, Done};
use crate::store::{on_store, open_to_read, open_to_write};

/// How many rows a purge takes at a time.
const BATCH: usize = 1_000;

/// What a purge at `now` keeping `older_than` takes, in words: "more than 30days ago (at or
/// before 2025-01-01T00:00:00.000Z)", from the one cutoff ([`purge_cutoff`]) the stores compare
/// with.
fn older_than_words(older_than: Duration, now: Timestamp) -> String {
    let period = humantime::format_duration(older_than);
    match purge_cutoff(now, older_than) {
        Some(cutoff) => format!("more than {period} ago (at or before {})", when(cutoff)),
        None => format!("more than {period} ago (none can be: that is before 1970)"),
    }
}

/// What a purge did (or, in a dry run, would do), as `--json` prints it: one object.
fn purge_json(
    out: &mut impl Write,
    what: &str,
    count: usize,
    older_than: Duration,
    dry_run: bool,
) -> Done {
    let older_than_ms = u64::try_from(older_than.as_millis()).unwrap_or(u64::MAX);
    let mut object = serde_json::Map::new();
    object.insert(what.to_owned(), count.into());
    object.insert("older_than_ms".to_owned(), older_than_ms.into());
    object.insert("dry_run".to_owned(), dry_run.into());
    json_line(out, serde_json::to_string(&object))
}

/// `purge-done`: deletes the done (and cancelled) commands processed at least `older_than` before
/// `now`, in batches; a dry run counts them on a store opened read-only.
pub fn purge_done(
    out: &mut impl Write,
    db: &Path,
    older_than: Duration,
    dry_run: bool,
    now: Timestamp,
    json: bool,
) -> Done {
    if dry_run {
        let store = open_to_read(db)?;
        let count = on_store!(&store, store => store.count_purgeable(older_than, now))?;
        if json {
            return purge_json(out, "commands", count, older_than, true);
        }
        writeln!(
            out,
            "would purge {} processed {}; nothing was changed (dry run)",
            plural(count, "done command"),
            older_than_words(older_than, now)
        )?;
        return Ok(());
    }
    let mut store = open_to_write(db)?;
    let mut purged = 0;
    loop {
        let batch = on_store!(&mut store, store => store.purge_done(older_than, now, BATCH))?;
        purged += batch;
        if batch < BATCH {
            break;
        }
    }
    if json {
        return purge_json(out, "commands", purged, older_than, false);
    }
    writeln!(
        out,
        "purged {} processed {}",
        plural(purged, "done command"),
        older_than_words(older_than, now)
    )?;
    Ok(())
}

/// `purge-finished`: retires the workflows finished at least `older_than` before `now` (their
/// events, commands and timers deleted); a dry run counts them on a store opened read-only.
pub fn purge_finished(
    out: &mut impl Write,
    db: &Path,
    older_than: Duration,
    dry_run: bool,
    now: Timestamp,
    json: bool,
) -> Done {
    if dry_run {
        let store = open_to_read(db)?;
        let count = on_store!(&store, store => store.count_finished(older_than, now))?;
        if json {
            return purge_json(out, "workflows", count, older_than, true);
        }
        writeln!(
            out,
            "would retire {} finished {} (their events, commands and timers); nothing was \
             changed (dry run)",
            plural(count, "workflow"),
            older_than_words(older_than, now)
        )?;
        return Ok(());
    }
    let mut store = open_to_write(db)?;
    let retired = on_store!(&mut store, store => store.purge_finished(older_than, now, BATCH))?;
    if json {
        return purge_json(out, "workflows", retired, older_than, false);
    }
    writeln!(
        out,
        "retired {} finished {} (their events, commands and timers)",
        plural(retired, "workflow"),
        older_than_words(older_than, now)
    )?;
    Ok(())
}
