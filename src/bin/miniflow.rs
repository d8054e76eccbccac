//! `miniflow`: look into a miniflow store and handle what waits for a person.
//!
//! ```text
//! miniflow pending flow.db            # unfinished commands, in delivery order
//! miniflow dead flow.db               # dead letters with their last error
//! miniflow show flow.db trip-001:1:0  # one command, every column (--raw: as stored)
//! miniflow events flow.db trip-001    # a workflow's event log
//! miniflow retry flow.db trip-001:1:2
//! miniflow resolve flow.db trip-001:1:2 --note "refunded by phone"
//! miniflow purge-done flow.db --older-than 30d [--dry-run]
//! miniflow migrate flow.db            # upgrade a store written by an older miniflow
//! miniflow dead postgresql://operator@db.internal/flow   # the same on PostgreSQL
//! ```
//!
//! Add `--json` for one JSON value per line instead of a table.
//!
//! The store is a SQLite file, or a PostgreSQL database named by a `postgres://` or
//! `postgresql://` URL (a file whose name starts so is written `./postgres://…`). Without a password
//! in the URL, `PGPASSWORD` is used when set, so that the password need not be on the command line.
//! Connections are without TLS.
//!
//! The read commands open the store read-only and change nothing (no pragma, no migration, no new
//! store; on PostgreSQL, read-only sessions: `default_transaction_read_only`). The write commands
//! refuse a path or database that holds no miniflow store of this version instead of creating or
//! upgrading one; `migrate` is the only command that upgrades (on PostgreSQL it also creates
//! miniflow's schema in a database without one, as a store connecting for the first time would).
//!
//! Exit status: 0 on success (also when the reader of the output goes away, as with `| head`), 1 on
//! an error, and 1 after printing everything readable when some rows could not be read.

use std::borrow::Cow;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, UNIX_EPOCH};

use clap::{Parser, Subcommand};
use miniflow::postgres::types::Type;
use miniflow::prelude::*;
use miniflow::{
    Clock, CommandId, Error, EventRecord, OutboxRow, PostgresOptions, PostgresStore, Seq,
    SqliteStore, Status, SystemClock, TimerId, TimerRow, TimerStatus, Timestamp, WorkflowId,
    COMMAND_FAILED, POSTGRES_SCHEMA_VERSION, SCHEMA_VERSION,
};
use rusqlite::types::ValueRef;

#[derive(Parser)]
#[command(
    name = "miniflow",
    version,
    about = "Inspect a miniflow store (a SQLite file or a PostgreSQL database) and handle its dead letters"
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
        /// The store: its SQLite file, or a postgresql:// URL.
        db: PathBuf,
        /// How many at most.
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// Dead commands: out of attempts, or failed for good. They wait for `retry` or `resolve`.
    Dead {
        /// The store: its SQLite file, or a postgresql:// URL.
        db: PathBuf,
        /// How many at most.
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// One command with every column.
    Show {
        /// The store: its SQLite file, or a postgresql:// URL.
        db: PathBuf,
        /// The command ID, `workflow:seq:index`.
        command_id: String,
        /// Print the columns as stored, also for a row miniflow cannot read.
        #[arg(long)]
        raw: bool,
    },
    /// A workflow's events, in seq order.
    Events {
        /// The store: its SQLite file, or a postgresql:// URL.
        db: PathBuf,
        /// The workflow ID.
        workflow_id: String,
    },
    /// Puts a dead command back to pending, with a fresh set of attempts.
    ///
    /// Refuses when its workflow already received the `command_failed` event of this death (it may
    /// have compensated; a retry sends the command again), unless `--force`.
    Retry {
        /// The store: its SQLite file, or a postgresql:// URL.
        db: PathBuf,
        /// The command ID, `workflow:seq:index`.
        command_id: String,
        /// Retry even though the workflow already received `command_failed`.
        #[arg(long)]
        force: bool,
    },
    /// Closes a dead command by hand; its workflow receives a `command_resolved` event.
    Resolve {
        /// The store: its SQLite file, or a postgresql:// URL.
        db: PathBuf,
        /// The command ID, `workflow:seq:index`.
        command_id: String,
        /// What was done about it, kept with the command.
        #[arg(long)]
        note: String,
    },
    /// Deletes done commands processed longer ago than `--older-than` (never pending, leased or dead ones).
    PurgeDone {
        /// The store: its SQLite file, or a postgresql:// URL.
        db: PathBuf,
        /// The retention period with its unit, e.g. `30d`, `12h`, `90m`, `45s`.
        #[arg(long, value_parser = retention)]
        older_than: Duration,
        /// Print how many would be deleted, and delete nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Upgrades a store written by an older miniflow to this version's schema.
    ///
    /// Older versions of miniflow refuse the store afterwards: upgrade every service that opens it.
    Migrate {
        /// The store: its SQLite file, or a postgresql:// URL.
        db: PathBuf,
    },
}

/// Why the tool stops early.
enum Stop {
    /// What went wrong, for the operator.
    Failed(String),
    /// Writing the output failed; a closed pipe (`| head`) ends the tool quietly.
    Output(io::Error),
}

impl From<io::Error> for Stop {
    fn from(e: io::Error) -> Self {
        Stop::Output(e)
    }
}

impl From<Error> for Stop {
    fn from(e: Error) -> Self {
        Stop::Failed(e.to_string())
    }
}

impl From<String> for Stop {
    fn from(message: String) -> Self {
        Stop::Failed(message)
    }
}

type Done = Result<(), Stop>;

/// Parses `--older-than`: a number with its unit. A bare number is refused rather than guessed at.
fn retention(text: &str) -> Result<Duration, String> {
    let hint = "write e.g. 30d, 12h, 90m or 45s";
    if !text.is_empty() && text.trim().bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("{text:?} has no unit; {hint}"));
    }
    humantime::parse_duration(text).map_err(|e| format!("{text:?} is not a duration ({e}); {hint}"))
}

/// A store the tool opened: a SQLite file, or a PostgreSQL database.
enum Store {
    Sqlite(SqliteStore),
    Postgres(PostgresStore),
}

/// `$body` with `$store` bound to whichever store `$on` holds (`&Store` or `&mut Store`).
macro_rules! on_store {
    ($on:expr, $store:ident => $body:expr) => {
        match $on {
            Store::Sqlite($store) => $body,
            Store::Postgres($store) => $body,
        }
    };
}

/// The PostgreSQL URL `db` is, if it is one (`postgres://` or `postgresql://`, the scheme in any
/// case); anything else names a file.
fn database_url(db: &Path) -> Option<&str> {
    let text = db.to_str()?;
    let scheme = text.split_once("://")?.0;
    (scheme.eq_ignore_ascii_case("postgres") || scheme.eq_ignore_ascii_case("postgresql"))
        .then_some(text)
}

/// `url` with the password of `PGPASSWORD` when it names none itself (as libpq does).
fn with_password(url: &str) -> Cow<'_, str> {
    let Ok(password) = std::env::var("PGPASSWORD") else {
        return Cow::Borrowed(url);
    };
    let Some((scheme, rest)) = url.split_once("://") else {
        return Cow::Borrowed(url);
    };
    let authority = rest.split(['/', '?']).next().unwrap_or_default();
    let Some((userinfo, _)) = authority.rsplit_once('@') else {
        return Cow::Borrowed(url); // no user named: nothing to give a password to
    };
    if userinfo.contains(':') || password.is_empty() {
        return Cow::Borrowed(url);
    }
    let encoded: String = password
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect();
    Cow::Owned(format!(
        "{scheme}://{userinfo}:{encoded}{}",
        &rest[userinfo.len()..]
    ))
}

/// `url` without its password, for messages.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            match userinfo.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..scheme + 3], &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

/// Opens the store to read it: nothing in or beside the file changes, and a path without a miniflow
/// store of this version is refused. A database is read in read-only sessions, without migrating
/// it, and must hold miniflow's schema at this version.
fn open_to_read(db: &Path) -> Result<Store, Stop> {
    Ok(match database_url(db) {
        Some(url) => Store::Postgres(PostgresStore::connect_read_only(&with_password(url))?),
        None => Store::Sqlite(SqliteStore::open_read_only(db)?),
    })
}

/// Opens the store to change it. It must already be a store of this version: a write command never
/// turns a missing, empty or foreign file (or a database without miniflow's schema) into a store,
/// nor upgrades an older one (`migrate` does).
fn open_to_write(db: &Path) -> Result<Store, Stop> {
    if let Some(url) = database_url(db) {
        let options = PostgresOptions::new().migrate(false).pool_size(2);
        return Ok(Store::Postgres(PostgresStore::connect_with(
            &with_password(url),
            &options,
        )?));
    }
    drop(open_to_read(db)?);
    SqliteStore::open(db)
        .map(Store::Sqlite)
        .map_err(|e| Stop::Failed(format!("cannot open {} for writing: {e}", db.display())))
}

/// Whether a character is shown escaped in a table: control characters (which move the cursor,
/// recolour the terminal or start a new line) and the invisible marks that reorder text on screen.
fn hidden(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `text` for a table cell: every [`hidden`] character escaped (`\n`, `\u{1b}`), so a field cannot
/// forge a row or take over the terminal.
fn cell(text: &str) -> Cow<'_, str> {
    if !text.chars().any(hidden) {
        return Cow::Borrowed(text);
    }
    let mut shown = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if hidden(c) {
            shown.extend(c.escape_debug());
        } else {
            shown.push(c);
        }
    }
    Cow::Owned(shown)
}

/// Pretty JSON for a person: serde_json escapes the C0 controls; the other [`hidden`] characters
/// (which can only be inside strings) become `\uXXXX` escapes too, so the text means the same JSON.
fn pretty_json(text: serde_json::Result<String>) -> Result<String, Stop> {
    let text = text.map_err(|e| e.to_string())?;
    let mut shown = String::with_capacity(text.len());
    for c in text.chars() {
        if hidden(c) && c > '\u{7e}' {
            shown.push_str(&format!("\\u{:04x}", u32::from(c)));
        } else {
            shown.push(c);
        }
    }
    Ok(shown)
}

/// Prints one JSON value (from `serde_json::to_string`) on its own line.
fn json_line(out: &mut impl Write, text: serde_json::Result<String>) -> Done {
    let text = text.map_err(|e| e.to_string())?;
    writeln!(out, "{text}")?;
    Ok(())
}

fn plural(n: usize, what: &str) -> String {
    format!("{n} {what}{}", if n == 1 { "" } else { "s" })
}

/// A row the store holds but cannot read (edited by hand, or damaged).
struct Unreadable {
    /// Its ID as stored (`workflow_id:event_seq:idx`).
    command_id: String,
    /// Its stored status.
    status: String,
    /// Why it cannot be read.
    error: String,
}

/// Prints the rows that read, then the ones that do not in their own section; with unreadable rows
/// the tool ends with status 1 after printing everything.
fn print_rows(
    out: &mut impl Write,
    rows: &[OutboxRow],
    unreadable: &[Unreadable],
    json: bool,
) -> Done {
    if json {
        for row in rows {
            json_line(out, serde_json::to_string(row))?;
        }
    } else {
        writeln!(
            out,
            "{:<40} {:<16} {:<8} {:>8}  last error",
            "command", "kind", "status", "attempts"
        )?;
        for row in rows {
            writeln!(
                out,
                "{:<40} {:<16} {:<8} {:>8}  {}",
                cell(&row.command_id.to_string()),
                cell(&row.kind),
                row.status.to_string(),
                row.attempts,
                cell(row.last_error.as_deref().unwrap_or("-")),
            )?;
        }
        writeln!(out, "({})", plural(rows.len(), "command"))?;
        if !unreadable.is_empty() {
            writeln!(out)?;
        }
    }
    print_unreadable(out, unreadable, json)
}

/// The unreadable section: one JSON value `{"unreadable": {…}}` per row, or a table of its own. Ends
/// the tool with status 1 when there is any.
fn print_unreadable(out: &mut impl Write, unreadable: &[Unreadable], json: bool) -> Done {
    if unreadable.is_empty() {
        return Ok(());
    }
    if json {
        for row in unreadable {
            let report = serde_json::json!({ "unreadable": {
                "command_id": row.command_id,
                "status": row.status,
                "error": row.error,
            }});
            json_line(out, serde_json::to_string(&report))?;
        }
    } else {
        writeln!(
            out,
            "unreadable ({}; `miniflow show --raw DB ID` prints what is stored):",
            plural(unreadable.len(), "command")
        )?;
        writeln!(out, "{:<40} {:<8}  error", "command", "status")?;
        for row in unreadable {
            writeln!(
                out,
                "{:<40} {:<8}  {}",
                cell(&row.command_id),
                cell(&row.status),
                cell(&row.error)
            )?;
        }
    }
    Err(Stop::Failed(format!(
        "{} could not be read (listed as unreadable); `miniflow show --raw DB ID` prints what \
         is stored",
        plural(unreadable.len(), "command")
    )))
}

/// Which outbox rows a listing selects.
#[derive(Clone, Copy)]
enum Listing {
    Pending,
    Dead,
}

/// The rows of `listing`, and apart from them the ones among them that cannot be read: an unreadable
/// row does not hide the others.
fn list(
    store: &Store,
    listing: Listing,
    limit: usize,
) -> Result<(Vec<OutboxRow>, Vec<Unreadable>), Stop> {
    let (rows, unreadable) = match (store, listing) {
        (Store::Sqlite(store), listing) => {
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
        }
        (Store::Postgres(store), listing) => {
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
        }
    };
    Ok((rows, unreadable))
}

/// A stored value as text: text as it is, numbers in decimal, blobs in hex, NULL as `NULL`.
fn text(value: ValueRef<'_>) -> String {
    match value {
        ValueRef::Null => "NULL".to_owned(),
        ValueRef::Integer(i) => i.to_string(),
        ValueRef::Real(f) => f.to_string(),
        ValueRef::Text(t) => String::from_utf8_lossy(t).into_owned(),
        ValueRef::Blob(b) => blob(b),
    }
}

fn blob(bytes: &[u8]) -> String {
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("x'{hex}'")
}

/// A stored value as JSON: numbers as numbers, text as a string, blobs as `x'…'` strings.
fn raw_json(value: ValueRef<'_>) -> serde_json::Value {
    match value {
        ValueRef::Null => serde_json::Value::Null,
        ValueRef::Integer(i) => i.into(),
        ValueRef::Real(f) => f.into(),
        ValueRef::Text(t) => String::from_utf8_lossy(t).into_owned().into(),
        ValueRef::Blob(b) => blob(b).into(),
    }
}

/// Every stored column of one outbox row, by name, as stored. `id` need not be a valid command ID
/// (see [`raw_sqlite_row`] and [`raw_postgres_row`]).
fn raw_row(store: &Store, id: &str) -> Result<Option<Vec<(String, serde_json::Value)>>, Stop> {
    match store {
        Store::Sqlite(store) => raw_sqlite_row(store, id),
        Store::Postgres(store) => raw_postgres_row(store, id),
    }
}

/// [`raw_row`] in a SQLite file: when `id` is no valid command ID, the row is looked up by its
/// stored `command_id` text.
fn raw_sqlite_row(
    store: &SqliteStore,
    id: &str,
) -> Result<Option<Vec<(String, serde_json::Value)>>, Stop> {
    let by_key = "SELECT * FROM outbox WHERE workflow_id = ?1 AND event_seq = ?2 AND idx = ?3";
    let by_text = "SELECT * FROM outbox WHERE command_id = ?1";
    let conn = store.connection();
    let read = |sql: &str, params: &[&dyn rusqlite::ToSql]| {
        let mut stmt = conn.prepare(sql)?;
        let names: Vec<String> = stmt.column_names().into_iter().map(str::to_owned).collect();
        let mut rows = stmt.query(params)?;
        let Some(row) = rows.next()? else {
            return Ok(None);
        };
        let mut columns = Vec::with_capacity(names.len());
        for (i, name) in names.into_iter().enumerate() {
            columns.push((name, raw_json(row.get_ref(i)?)));
        }
        Ok(Some(columns))
    };
    let found = match id.parse::<CommandId>() {
        Ok(key) => read(
            by_key,
            &[
                &key.workflow_id().as_str(),
                &i64::try_from(key.event_seq().get()).unwrap_or(i64::MAX),
                &i64::from(key.index()),
            ],
        ),
        Err(_) => Ok(None),
    };
    // A key stored in another shape (e.g. a seq stored as text) is found by its text.
    let found = match found {
        Ok(None) => read(by_text, &[&id]),
        other => other,
    };
    found.map_err(|e: rusqlite::Error| Stop::Failed(format!("cannot read command {id:?}: {e}")))
}

/// [`raw_row`] in a PostgreSQL database: the key is read from the right (`workflow:seq:index`, the
/// workflow ID as it is stored, whatever it holds); numbers as numbers, booleans as booleans, text as
/// text.
fn raw_postgres_row(
    store: &PostgresStore,
    id: &str,
) -> Result<Option<Vec<(String, serde_json::Value)>>, Stop> {
    let mut key = id.rsplitn(3, ':');
    let (Some(idx), Some(seq), Some(workflow_id)) = (key.next(), key.next(), key.next()) else {
        return Ok(None);
    };
    let (Ok(seq), Ok(idx)) = (seq.parse::<i64>(), idx.parse::<i64>()) else {
        return Ok(None);
    };
    let failed =
        |e: miniflow::postgres::Error| Stop::Failed(format!("cannot read command {id:?}: {e}"));
    let Some(row) = store
        .client()?
        .query_opt(
            "SELECT * FROM outbox WHERE workflow_id = $1 AND event_seq = $2 AND idx = $3",
            &[&workflow_id, &seq, &idx],
        )
        .map_err(failed)?
    else {
        return Ok(None);
    };
    let mut columns = Vec::with_capacity(row.len());
    for (i, column) in row.columns().iter().enumerate() {
        let value = match *column.type_() {
            Type::INT8 => row
                .try_get::<_, Option<i64>>(i)
                .map(serde_json::Value::from),
            Type::INT4 => row
                .try_get::<_, Option<i32>>(i)
                .map(serde_json::Value::from),
            Type::INT2 => row
                .try_get::<_, Option<i16>>(i)
                .map(serde_json::Value::from),
            Type::BOOL => row
                .try_get::<_, Option<bool>>(i)
                .map(serde_json::Value::from),
            Type::FLOAT8 => row
                .try_get::<_, Option<f64>>(i)
                .map(serde_json::Value::from),
            _ => row
                .try_get::<_, Option<String>>(i)
                .map(serde_json::Value::from),
        };
        let value = value.unwrap_or_else(|e| format!("(cannot be shown: {e})").into());
        columns.push((column.name().to_owned(), value));
    }
    Ok(Some(columns))
}

fn show_raw(out: &mut impl Write, store: &Store, id: &str, json: bool) -> Done {
    let columns = raw_row(store, id)?.ok_or_else(|| format!("unknown command {id}"))?;
    if json {
        let object: serde_json::Map<String, serde_json::Value> = columns.into_iter().collect();
        return json_line(out, serde_json::to_string(&object));
    }
    for (name, value) in columns {
        writeln!(out, "{name:<16} {}", cell(&text_of(&value)))?;
    }
    Ok(())
}

fn show(out: &mut impl Write, store: &Store, id: &str, json: bool) -> Done {
    let command_id: CommandId = id.parse()?;
    match on_store!(store, store => store.command(&command_id)) {
        Ok(Some(row)) if json => json_line(out, serde_json::to_string(&row)),
        Ok(Some(row)) => {
            writeln!(out, "{}", pretty_json(serde_json::to_string_pretty(&row))?)?;
            Ok(())
        }
        Ok(None) => Err(Stop::Failed(format!("unknown command {command_id}"))),
        Err(Error::Corrupt(what)) => {
            let status = raw_row(store, id)?
                .and_then(|columns| columns.into_iter().find(|(name, _)| name == "status"))
                .map_or_else(|| "?".to_owned(), |(_, value)| text_of(&value));
            let row = Unreadable {
                command_id: command_id.to_string(),
                status,
                error: Error::Corrupt(what).to_string(),
            };
            print_unreadable(out, &[row], json)
        }
        Err(e) => Err(e.into()),
    }
}

/// A value of [`raw_row`] as text, as [`text`] shows it.
fn text_of(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Null => "NULL".to_owned(),
        other => other.to_string(),
    }
}

/// A workflow's events; when one cannot be read, the others are still printed and the unreadable
/// ones are listed after them.
fn events(out: &mut impl Write, store: &Store, workflow_id: &WorkflowId, json: bool) -> Done {
    let (records, unreadable) = match on_store!(store, store => store.load(workflow_id)) {
        Ok(records) => (records, Vec::new()),
        Err(Error::Corrupt(_)) => events_one_by_one(store, workflow_id)?,
        Err(e) => return Err(e.into()),
    };
    for event in &records {
        if json {
            json_line(out, serde_json::to_string(event))?;
        } else {
            writeln!(
                out,
                "{:>4} {:<24} {}",
                event.seq,
                cell(&event.kind),
                cell(&miniflow::canonical_json(&event.payload))
            )?;
        }
    }
    for event in &unreadable {
        if json {
            let report =
                serde_json::json!({ "unreadable": { "seq": event.seq, "error": event.error } });
            json_line(out, serde_json::to_string(&report))?;
        } else {
            writeln!(
                out,
                "{:>4} unreadable: {}",
                cell(&event.seq),
                cell(&event.error)
            )?;
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

/// An event the store holds but cannot read: its stored seq, and why.
struct UnreadableEvent {
    seq: String,
    error: String,
}

/// An event row as stored: seq, kind, payload, recorded_at.
type StoredEvent = [rusqlite::types::Value; 4];

/// A workflow's events as stored, in seq order.
fn stored_events(store: &Store, workflow_id: &WorkflowId) -> Result<Vec<StoredEvent>, Stop> {
    let failed =
        |e: &dyn std::fmt::Display| format!("cannot read the events of {workflow_id}: {e}");
    match store {
        Store::Sqlite(store) => store
            .connection()
            .prepare(
                "SELECT seq, kind, payload, recorded_at FROM events WHERE workflow_id = ?1 \
                 ORDER BY seq",
            )
            .and_then(|mut stmt| {
                stmt.query_map([workflow_id.as_str()], |row| {
                    Ok([row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?])
                })?
                .collect()
            })
            .map_err(|e| Stop::Failed(failed(&e))),
        Store::Postgres(store) => {
            use rusqlite::types::Value;
            let rows = store
                .client()?
                .query(
                    "SELECT seq, kind, payload, recorded_at FROM events WHERE workflow_id = $1 \
                     ORDER BY seq",
                    &[&workflow_id.as_str()],
                )
                .map_err(|e| Stop::Failed(failed(&e)))?;
            rows.iter()
                .map(|row| {
                    Ok([
                        Value::Integer(row.try_get(0)?),
                        Value::Text(row.try_get(1)?),
                        Value::Text(row.try_get(2)?),
                        Value::Integer(row.try_get(3)?),
                    ])
                })
                .collect::<Result<_, miniflow::postgres::Error>>()
                .map_err(|e| Stop::Failed(failed(&e)))
        }
    }
}

/// Reads a workflow's events one by one, keeping the ones that read.
fn events_one_by_one(
    store: &Store,
    workflow_id: &WorkflowId,
) -> Result<(Vec<EventRecord>, Vec<UnreadableEvent>), Stop> {
    let stored = stored_events(store, workflow_id)?;
    let (mut records, mut unreadable) = (Vec::new(), Vec::new());
    for columns in &stored {
        match decode_event(workflow_id, columns) {
            Ok(record) => records.push(record),
            Err(error) => unreadable.push(UnreadableEvent {
                seq: text((&columns[0]).into()),
                error: format!("corrupt store: {error}"),
            }),
        }
    }
    Ok((records, unreadable))
}

/// An [`EventRecord`] from its stored columns, or what is wrong with them.
fn decode_event(
    workflow_id: &WorkflowId,
    [seq, kind, payload, recorded_at]: &StoredEvent,
) -> Result<EventRecord, String> {
    use rusqlite::types::Value;
    let number = |value: &Value, what: &str| match value {
        Value::Integer(i) => u64::try_from(*i).map_err(|_| format!("{what} {i} is negative")),
        other => Err(format!("{what} {} is not a number", text(other.into()))),
    };
    let text_in = |value: &Value, what: &str| match value {
        Value::Text(t) => Ok(t.clone()),
        other => Err(format!("{what} {} is not text", text(other.into()))),
    };
    Ok(EventRecord {
        workflow_id: workflow_id.clone(),
        seq: Seq::new(number(seq, "seq")?).map_err(|e| e.to_string())?,
        kind: text_in(kind, "kind")?,
        payload: serde_json::from_str(&text_in(payload, "payload")?)
            .map_err(|e| format!("payload is not JSON: {e}"))?,
        recorded_at: Timestamp::from_millis(number(recorded_at, "recorded_at")?),
    })
}

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

fn when(t: Timestamp) -> String {
    let at = UNIX_EPOCH + Duration::from_millis(t.as_millis());
    humantime::format_rfc3339_millis(at).to_string()
}

fn retry(out: &mut impl Write, db: &Path, id: &str, force: bool, now: Timestamp) -> Done {
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

fn purge_done(
    out: &mut impl Write,
    db: &Path,
    older_than: Duration,
    dry_run: bool,
    now: Timestamp,
) -> Done {
    let period = humantime::format_duration(older_than);
    if dry_run {
        let store = open_to_read(db)?;
        // The rows `Store::purge_done` deletes (`OutboxRow::is_purgeable`): done (or cancelled, as
        // final), processed at least `older_than` ago.
        let count: i64 = match now.checked_sub(older_than) {
            None => 0,
            Some(cutoff) => {
                let cutoff = i64::try_from(cutoff.as_millis()).unwrap_or(i64::MAX);
                let failed = |e: &dyn std::fmt::Display| {
                    Stop::Failed(format!("cannot count the done commands: {e}"))
                };
                match &store {
                    Store::Sqlite(store) => store
                        .connection()
                        .query_row(
                            "SELECT COUNT(*) FROM outbox WHERE status IN ('done', 'cancelled') \
                             AND processed_at <= ?1",
                            [cutoff],
                            |row| row.get(0),
                        )
                        .map_err(|e| failed(&e))?,
                    Store::Postgres(store) => store
                        .client()?
                        .query_one(
                            "SELECT count(*) FROM outbox WHERE status IN ('done', 'cancelled') \
                             AND processed_at <= $1",
                            &[&cutoff],
                        )
                        .and_then(|row| row.try_get(0))
                        .map_err(|e| failed(&e))?,
                }
            }
        };
        let count = usize::try_from(count).unwrap_or(0);
        writeln!(
            out,
            "would purge {} processed more than {period} ago; nothing was changed (dry run)",
            plural(count, "done command")
        )?;
        return Ok(());
    }
    let mut store = open_to_write(db)?;
    let mut purged = 0;
    loop {
        let batch = on_store!(&mut store, store => store.purge_done(older_than, now, 1_000))?;
        purged += batch;
        if batch < 1_000 {
            break;
        }
    }
    writeln!(
        out,
        "purged {} processed more than {period} ago",
        plural(purged, "done command")
    )?;
    Ok(())
}

fn migrate(out: &mut impl Write, db: &Path) -> Done {
    if let Some(url) = database_url(db) {
        let found = PostgresStore::migrate(&with_password(url))?;
        let (url, version) = (redact(url), POSTGRES_SCHEMA_VERSION);
        match found {
            0 => writeln!(out, "{url}: created miniflow's schema, version {version}")?,
            found if found == version => writeln!(
                out,
                "{url}: already at schema version {version}; nothing to do"
            )?,
            found => writeln!(
                out,
                "{url}: upgraded from schema version {found} to {version}; older versions of \
                 miniflow now refuse it"
            )?,
        }
        return Ok(());
    }
    let found = SqliteStore::migrate(db)?;
    if found == SCHEMA_VERSION {
        writeln!(
            out,
            "{}: already at schema version {SCHEMA_VERSION}; nothing to do",
            db.display()
        )?;
    } else {
        writeln!(
            out,
            "{}: upgraded from schema version {found} to {SCHEMA_VERSION}; older versions of \
             miniflow now refuse it",
            db.display()
        )?;
    }
    Ok(())
}

fn run(cli: Cli, out: &mut impl Write) -> Done {
    let now = SystemClock.now();
    let json = cli.json;
    match cli.command {
        Action::Pending { db, limit } => {
            let (rows, unreadable) = list(&open_to_read(&db)?, Listing::Pending, limit)?;
            print_rows(out, &rows, &unreadable, json)
        }
        Action::Dead { db, limit } => {
            let (rows, unreadable) = list(&open_to_read(&db)?, Listing::Dead, limit)?;
            print_rows(out, &rows, &unreadable, json)
        }
        Action::Show {
            db,
            command_id,
            raw,
        } => {
            let store = open_to_read(&db)?;
            if raw {
                show_raw(out, &store, &command_id, json)
            } else {
                show(out, &store, &command_id, json)
            }
        }
        Action::Events { db, workflow_id } => {
            let workflow_id = WorkflowId::new(workflow_id)?;
            events(out, &open_to_read(&db)?, &workflow_id, json)
        }
        Action::Retry {
            db,
            command_id,
            force,
        } => retry(out, &db, &command_id, force, now),
        Action::Resolve {
            db,
            command_id,
            note,
        } => {
            let id: CommandId = command_id.parse()?;
            on_store!(&mut open_to_write(&db)?, store => store.resolve(&id, &note, now))?;
            writeln!(out, "{id}: resolved by hand")?;
            Ok(())
        }
        Action::PurgeDone {
            db,
            older_than,
            dry_run,
        } => purge_done(out, &db, older_than, dry_run, now),
        Action::Migrate { db } => migrate(out, &db),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
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
