//! `miniflow`: look into a miniflow store and handle what waits for a person.
//!
//! ```text
//! miniflow pending flow.db            # unfinished commands, in delivery order
//! miniflow dead flow.db               # dead letters with their last error
//! miniflow show flow.db trip-001:1:0  # one command, every column (--raw: as stored)
//! miniflow events flow.db trip-001    # a workflow's event log
//! miniflow stats flow.db              # depth by kind and status, the lag, paused and limited kinds
//! miniflow retry flow.db trip-001:1:2
//! miniflow retry flow.db --kind book_hotel --all-dead [--dry-run] [--force]
//! miniflow resolve flow.db trip-001:1:2 --note "refunded by phone"
//! miniflow resolve flow.db --kind book_hotel --all-dead --note "refunded" [--dry-run]
//! miniflow pause flow.db book_hotel   # claims skip the kind until `resume`
//! miniflow resume flow.db book_hotel
//! miniflow limit flow.db book_hotel 2 # at most 2 leased at once; `limit … none` removes it
//! miniflow purge-done flow.db --older-than 30d [--dry-run]
//! miniflow purge-finished flow.db --older-than 90d [--dry-run]  # whole histories of finished workflows
//! miniflow migrate flow.db            # upgrade a store written by an older miniflow
//! miniflow dead postgresql://operator@db.internal/flow   # the same on PostgreSQL
//! ```
//!
//! Add `--json` for JSON instead of a table: a list is one JSON array (`[]` when empty), one element
//! per line; a single value (`show`, `stats`, a control) is one JSON object. Times in tables and in
//! `show` are RFC 3339 (UTC); JSON keeps milliseconds since the Unix epoch. A listing cut short by
//! `--limit` says so on stderr.
//!
//! `--now` sets the time the tool acts at (RFC 3339, e.g. `2025-01-01T12:00:00Z` or with an offset,
//! or milliseconds since the Unix epoch, from 1970 to the end of the year 9999), for stores driven
//! by a clock of their own (tests, simulations); by default it is the system clock. A time a store
//! holds past the year 9999 is shown as its number of milliseconds.
//!
//! The store is a SQLite file, or a PostgreSQL database named by a `postgres://` or
//! `postgresql://` URL (a file whose name starts so is written `./postgres://…`). Without a password
//! in the URL, `PGPASSWORD` is used when set, so that the password need not be on the command line.
//! Connections are without TLS. Any other connection string (`mysql://…`, libpq's `host=… dbname=…`)
//! is refused rather than taken for a file name; no message shows a password.
//!
//! The read commands open the store read-only and change nothing (no pragma, no migration, no new
//! store; on PostgreSQL, read-only sessions: `default_transaction_read_only`). The write commands
//! refuse a path or database that holds no miniflow store of this version instead of creating or
//! upgrading one; `migrate` is the only command that upgrades (on PostgreSQL it also creates
//! miniflow's schema in a database without one, as a store connecting for the first time would).
//!
//! The code: `args` (the command line), `output` (what is printed, and how the tool stops),
//! `store` (opening the store), and one module per group of commands — `inspect` (`pending`,
//! `dead`, `show`, `events`), `controls` (`stats`, `pause`, `resume`, `limit`), `repair` (`retry`,
//! `resolve`, bulk), `retention` (the purges) and `migrate`. A command module uses `args`,
//! `output` and `store`, and none of them uses a command module; no SQL is written here: what the
//! tool reads, the stores offer.
//!
//! Exit status: 0 on success (also when the reader of the output goes away, as with `| head`), 1 on
//! an error, and 1 after printing everything readable when some rows could not be read.

mod args;
mod controls;
mod inspect;
mod migrate;
mod output;
mod repair;
mod retention;
mod store;

use std::io::{self, BufWriter, Write};
use std::process::ExitCode;

use clap::error::ErrorKind;
use clap::Parser;
use miniflow::{Clock, KindChange, SystemClock};

use crate::args::{operator, Action, Cli};
use crate::inspect::Listing;
use crate::output::{redact, Done, Stop};
use crate::repair::Bulk;

/// Runs the command `cli` names, printing on `out`.
fn run(cli: Cli, out: &mut impl Write) -> Done {
    if let Some(note) = cli.now.as_ref().and_then(|now| now.note.as_deref()) {
        eprintln!("miniflow: {note}");
    }
    let now = cli.now.map_or_else(|| SystemClock.now(), |now| now.at);
    let json = cli.json;
    let no_target = || {
        Err(Stop::Failed(
            "name the command to act on (workflow:seq:index), or every dead command of a kind \
             with --kind KIND --all-dead"
                .to_owned(),
        ))
    };
    match cli.command {
        Action::Pending { db, limit } => inspect::list(out, &db, Listing::Pending, limit, json),
        Action::Dead { db, limit } => inspect::list(out, &db, Listing::Dead, limit, json),
        Action::Show {
            db,
            command_id,
            raw,
        } => inspect::show(out, &db, &command_id, raw, json),
        Action::Events { db, workflow_id } => inspect::events(out, &db, &workflow_id, json),
        Action::Stats { db } => controls::stats(out, &db, now, json),
        Action::Pause { db, kind, by } => {
            let by = operator(by);
            controls::control(out, &db, &kind, KindChange::Pause, by, now, json)
        }
        Action::Resume { db, kind, by } => {
            let by = operator(by);
            controls::control(out, &db, &kind, KindChange::Resume, by, now, json)
        }
        Action::Limit {
            db,
            kind,
            limit,
            by,
        } => {
            let change = limit.0.map_or(KindChange::RemoveLimit, KindChange::Limit);
            controls::control(out, &db, &kind, change, operator(by), now, json)
        }
        Action::Retry {
            db,
            command_id,
            kind,
            force,
            dry_run,
            ..
        } => match (command_id, kind) {
            (_, Some(kind)) => {
                let action = Bulk::Retry { force };
                repair::bulk(out, &db, &kind, action, dry_run, now, json)
            }
            (Some(command_id), None) => repair::retry(out, &db, &command_id, force, now),
            (None, None) => no_target(),
        },
        Action::Resolve {
            db,
            command_id,
            kind,
            note,
            dry_run,
            ..
        } => match (command_id, kind) {
            (_, Some(kind)) => {
                let action = Bulk::Resolve { note: &note };
                repair::bulk(out, &db, &kind, action, dry_run, now, json)
            }
            (Some(command_id), None) => repair::resolve(out, &db, &command_id, &note, now),
            (None, None) => no_target(),
        },
        Action::PurgeDone {
            db,
            older_than,
            dry_run,
        } => retention::purge_done(out, &db, older_than, dry_run, now, json),
        Action::PurgeFinished {
            db,
            older_than,
            dry_run,
        } => retention::purge_finished(out, &db, older_than, dry_run, now, json),
        Action::Migrate { db } => migrate::migrate(out, &db),
    }
}

/// The command line, parsed. Help and the version are printed as clap prints them; an error in the
/// arguments is printed with the password of every argument that holds one left out (clap quotes
/// the argument it refuses: `unexpected argument 'password=…'`), and ends the tool with clap's
/// status.
fn parse() -> Result<Cli, ExitCode> {
    let e = match Cli::try_parse() {
        Ok(cli) => return Ok(cli),
        Err(e) => e,
    };
    if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
        e.exit();
    }
    let mut message = e.render().to_string();
    for arg in std::env::args_os().skip(1) {
        let arg = arg.to_string_lossy();
        let shown = redact(&arg);
        if shown != arg {
            message = message.replace(&*arg, &shown);
        }
    }
    let _ = write!(io::stderr(), "{message}");
    Err(ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2)))
}

fn main() -> ExitCode {
    let cli = match parse() {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    let mut out = BufWriter::new(io::stdout().lock());
    let stop = match run(cli, &mut out).and_then(|()| Ok(out.flush()?)) {
        Ok(()) => return ExitCode::SUCCESS,
        Err(stop) => stop,
    };
    let message = match stop {
        // The reader went away (`miniflow pending db | head -1`): there is no one left to tell.
        Stop::Output(e) if e.kind() == io::ErrorKind::BrokenPipe => return ExitCode::SUCCESS,
        Stop::Output(e) => format!("cannot write the output: {e}"),
        Stop::Failed(message) => match out.flush() {
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => return ExitCode::FAILURE,
            _ => message,
        },
    };
    // Nothing sensible is left to do when stderr is gone too.
    let _ = writeln!(io::stderr(), "miniflow: {message}");
    ExitCode::FAILURE
}
