//! The operators' controls: `stats` (depth, lag, the timers to fire and the controls in force), and `pause`, `resume`
//! and `limit` of a kind, each recorded with who changed it and when.

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use miniflow::prelude::*;
use miniflow::{KindChange, Timestamp};

use crate::output::{cell, json_line, plural, when, Done};
use crate::store::{on_store, open_to_read, open_to_write};

/// What a control says, in words: `paused`, `limit 2`, `paused, limit 2`, or `-`.
fn control_words(paused: bool, limit: Option<u32>) -> String {
    let mut words = Vec::new();
    if paused {
        words.push("paused".to_owned());
    }
    if let Some(limit) = limit {
        words.push(format!("limit {limit}"));
    }
    if words.is_empty() {
        "-".to_owned()
    } else {
        words.join(", ")
    }
}

/// `stats`: the outbox at `now`, as a table or one JSON object.
pub fn stats(out: &mut impl Write, db: &Path, now: Timestamp, json: bool) -> Done {
    let store = open_to_read(db)?;
    let stats = on_store!(&store, store => store.stats(now))?;
    if json {
        let mut value = serde_json::to_value(&stats).map_err(|e| e.to_string())?;
        value["lag_ms"] = u64::try_from(stats.lag().as_millis())
            .unwrap_or(u64::MAX)
            .into();
        value["totals"] = serde_json::json!({
            "pending": stats.pending(),
            "due": stats.due(),
            "leased": stats.leased(),
            "dead": stats.dead(),
            "oldest_due": stats.oldest_due(),
            "idle": stats.is_idle(),
        });
        return json_line(out, serde_json::to_string(&value));
    }
    let lag = humantime::format_duration(Duration::from_millis(
        u64::try_from(stats.lag().as_millis()).unwrap_or(u64::MAX),
    ));
    match stats.oldest_due() {
        Some(since) => writeln!(
            out,
            "at {}: lag {lag} (the oldest due command has waited since {})",
            when(stats.now),
            when(since)
        )?,
        None => writeln!(out, "at {}: lag 0s (nothing due)", when(stats.now))?,
    }
    writeln!(out)?;
    writeln!(
        out,
        "{:<24} {:>8} {:>8} {:>8} {:>8}  {:<24}  control",
        "kind", "pending", "due", "leased", "dead", "oldest due"
    )?;
    for kind in &stats.kinds {
        writeln!(
            out,
            "{:<24} {:>8} {:>8} {:>8} {:>8}  {:<24}  {}",
            cell(&kind.kind),
            kind.pending,
            kind.due,
            kind.leased,
            kind.dead,
            kind.oldest_due.map_or_else(|| "-".to_owned(), when),
            control_words(kind.paused, kind.concurrency_limit),
        )?;
    }
    writeln!(
        out,
        "{:<24} {:>8} {:>8} {:>8} {:>8}",
        "(total)",
        stats.pending(),
        stats.due(),
        stats.leased(),
        stats.dead()
    )?;
    let timers = &stats.timers;
    writeln!(
        out,
        "\ntimers: {} not fired ({} of them feedback), {} due, next {}",
        timers.scheduled,
        timers.feedback,
        timers.due,
        timers.next_at.map_or_else(|| "-".to_owned(), when),
    )?;
    if stats.is_idle() {
        writeln!(out, "idle: nothing to deliver or fire")?;
    }
    if !stats.controls.is_empty() {
        writeln!(out)?;
        writeln!(out, "controls:")?;
        for control in &stats.controls {
            writeln!(
                out,
                "{:<24} {:<20} by {} at {}",
                cell(&control.kind),
                control_words(control.paused, control.concurrency_limit),
                cell(&control.changed_by),
                when(control.changed_at)
            )?;
        }
    }
    Ok(())
}

/// Pauses, resumes or limits a kind, and says what its controls are now.
pub fn control(
    out: &mut impl Write,
    db: &Path,
    kind: &str,
    change: KindChange,
    by: String,
    now: Timestamp,
    json: bool,
) -> Done {
    let mut store = open_to_write(db)?;
    let control = on_store!(&mut store, store => store.control_kind(kind, change, &by, now))?;
    if json {
        return json_line(out, serde_json::to_string(&control));
    }
    let by = format!(
        "by {} at {}",
        cell(&control.changed_by),
        when(control.changed_at)
    );
    let what = match change {
        KindChange::Pause => format!("paused {by}; claims skip it until it is resumed"),
        KindChange::Resume => format!("resumed {by}; claims take it again"),
        KindChange::Limit(n) => format!(
            "limited to {} leased at once {by}",
            plural(n as usize, "command")
        ),
        KindChange::RemoveLimit => format!("limit removed {by}"),
    };
    let still = match change {
        KindChange::Pause | KindChange::Resume => control
            .concurrency_limit
            .map(|n| format!(" (still limited to {n})")),
        KindChange::Limit(_) | KindChange::RemoveLimit => {
            control.paused.then(|| " (still paused)".to_owned())
        }
    };
    writeln!(
        out,
        "{}: {what}{}",
        cell(&control.kind),
        still.unwrap_or_default()
    )?;
    Ok(())
}
