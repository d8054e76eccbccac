//! `miniflow`: look into a miniflow SQLite store and handle what waits for a person.
//!
//! ```text
//! miniflow pending flow.db            # unfinished commands, in delivery order
//! miniflow dead flow.db               # dead letters with their last error
//! miniflow show flow.db trip-001:1:0  # one command, every column
//! miniflow events flow.db trip-001    # a workflow's event log
//! miniflow retry flow.db trip-001:1:2
//! miniflow resolve flow.db trip-001:1:2 --note "refunded by phone"
//! miniflow purge-done flow.db --older-than 30d
//! ```
//!
//! Add `--json` for one JSON value per line instead of a table.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use miniflow::{Clock, CommandId, OutboxRow, SqliteStore, Store, SystemClock, WorkflowId};

#[derive(Parser)]
#[command(
    name = "miniflow",
    version,
    about = "Inspect a miniflow SQLite store and handle its dead letters"
)]
struct Cli {
    /// Print JSON, one value per line, instead of a table.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Action,
}

#[derive(Subcommand)]
enum Action {
    /// Unfinished (pending or leased) commands, in delivery order.
    Pending {
        /// The store's SQLite file.
        db: PathBuf,
        /// How many at most.
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// Dead commands: out of attempts, or failed for good. They wait for `retry` or `resolve`.
    Dead {
        /// The store's SQLite file.
        db: PathBuf,
        /// How many at most.
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// One command with every column.
    Show {
        /// The store's SQLite file.
        db: PathBuf,
        /// The command ID, `workflow:seq:index`.
        command_id: String,
    },
    /// A workflow's events, in seq order.
    Events {
        /// The store's SQLite file.
        db: PathBuf,
        /// The workflow ID.
        workflow_id: String,
    },
    /// Puts a dead command back to pending, with a fresh set of attempts.
    Retry {
        /// The store's SQLite file.
        db: PathBuf,
        /// The command ID, `workflow:seq:index`.
        command_id: String,
    },
    /// Closes a dead command by hand; its workflow receives a `command_resolved` event.
    Resolve {
        /// The store's SQLite file.
        db: PathBuf,
        /// The command ID, `workflow:seq:index`.
        command_id: String,
        /// What was done about it, kept with the command.
        #[arg(long)]
        note: String,
    },
    /// Deletes done commands processed longer ago than `--older-than` (never pending, leased or dead ones).
    PurgeDone {
        /// The store's SQLite file.
        db: PathBuf,
        /// The retention period, e.g. `30d`, `12h`.
        #[arg(long, value_parser = humantime::parse_duration)]
        older_than: std::time::Duration,
    },
}

fn open(db: &PathBuf) -> Result<SqliteStore, String> {
    if !db.exists() {
        return Err(format!("no store at {}", db.display()));
    }
    SqliteStore::open(db).map_err(|e| format!("cannot open {}: {e}", db.display()))
}

fn table(rows: &[OutboxRow], json: bool) -> Result<(), String> {
    if json {
        for row in rows {
            println!("{}", serde_json::to_string(row).map_err(|e| e.to_string())?);
        }
        return Ok(());
    }
    println!(
        "{:<40} {:<16} {:<8} {:>8}  last error",
        "command", "kind", "status", "attempts"
    );
    for row in rows {
        let error = row.last_error.as_deref().unwrap_or("-");
        println!(
            "{:<40} {:<16} {:<8} {:>8}  {error}",
            row.command_id.to_string(),
            row.kind,
            row.status.to_string(),
            row.attempts
        );
    }
    println!(
        "({} command{})",
        rows.len(),
        if rows.len() == 1 { "" } else { "s" }
    );
    Ok(())
}

fn command_id(text: &str) -> Result<CommandId, String> {
    text.parse().map_err(|e: miniflow::Error| e.to_string())
}

fn run(cli: Cli) -> Result<(), String> {
    let now = SystemClock.now();
    let fail = |e: miniflow::Error| e.to_string();
    match cli.command {
        Action::Pending { db, limit } => table(&open(&db)?.pending(limit).map_err(fail)?, cli.json),
        Action::Dead { db, limit } => {
            table(&open(&db)?.dead_letters(limit).map_err(fail)?, cli.json)
        }
        Action::Show { db, command_id: id } => {
            let id = command_id(&id)?;
            let row = open(&db)?
                .command(&id)
                .map_err(fail)?
                .ok_or_else(|| format!("unknown command {id}"))?;
            let text = if cli.json {
                serde_json::to_string(&row)
            } else {
                serde_json::to_string_pretty(&row)
            };
            println!("{}", text.map_err(|e| e.to_string())?);
            Ok(())
        }
        Action::Events { db, workflow_id } => {
            let id = WorkflowId::new(workflow_id).map_err(fail)?;
            for event in open(&db)?.load(&id).map_err(fail)? {
                if cli.json {
                    println!(
                        "{}",
                        serde_json::to_string(&event).map_err(|e| e.to_string())?
                    );
                } else {
                    println!(
                        "{:>4} {:<24} {}",
                        event.seq,
                        event.kind,
                        miniflow::canonical_json(&event.payload)
                    );
                }
            }
            Ok(())
        }
        Action::Retry { db, command_id: id } => {
            let id = command_id(&id)?;
            open(&db)?.retry(&id, now).map_err(fail)?;
            println!("{id}: back to pending");
            Ok(())
        }
        Action::Resolve {
            db,
            command_id: id,
            note,
        } => {
            let id = command_id(&id)?;
            open(&db)?.resolve(&id, &note, now).map_err(fail)?;
            println!("{id}: resolved by hand");
            Ok(())
        }
        Action::PurgeDone { db, older_than } => {
            let mut store = open(&db)?;
            let mut purged = 0;
            loop {
                let batch = store.purge_done(older_than, now, 1_000).map_err(fail)?;
                purged += batch;
                if batch < 1_000 {
                    break;
                }
            }
            println!(
                "purged {purged} done command{}",
                if purged == 1 { "" } else { "s" }
            );
            Ok(())
        }
    }
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("miniflow: {message}");
            ExitCode::FAILURE
        }
    }
}
