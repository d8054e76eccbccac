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
//! or milliseconds since the Unix epoch), for stores driven by a clock of their own (tests,
//! simulations); by default it is the system clock.
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
    check_bulk, Clock, CommandId, Error, EventRecord, KindChange, OutboxRow, PostgresOptions,
    PostgresStore, Seq, SqliteStore, Status, SystemClock, TimerId, TimerRow, TimerStatus,
    Timestamp, WorkflowId, COMMAND_FAILED, MAX_BULK_BATCH, POSTGRES_SCHEMA_VERSION, SCHEMA_VERSION,
};
use rusqlite::types::ValueRef;

#[derive(Parser)]
#[command(
    name = "miniflow",
    version,
    about = "Inspect a miniflow store (a SQLite file or a PostgreSQL database) and handle its dead letters"
)]
struct Cli {
    /// Print JSON instead of a table: a list as one array (`[]` when empty), a single value as one
    /// object.
    #[arg(long, global = true)]
    json: bool,
    /// Act at this time instead of the system clock's: RFC 3339 (`2025-01-01T12:00:00Z`,
    /// `2025-01-01T20:00:00+08:00`) or milliseconds since the Unix epoch.
    #[arg(long, global = true, value_name = "TIME", value_parser = instant)]
    now: Option<Timestamp>,
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
    /// Puts a dead command back to pending, with a fresh set of attempts; or, with `--kind K
    /// --all-dead`, every dead command of kind K.
    ///
    /// Refuses when a workflow already received the `command_failed` event of this death (it may
    /// have compensated; a retry sends the command again), unless `--force`.
    Retry {
        /// The store: its SQLite file, or a postgresql:// URL.
        db: PathBuf,
        /// The command ID, `workflow:seq:index`.
        command_id: Option<String>,
        /// Every dead command of this kind (with `--all-dead`).
        #[arg(long, requires = "all_dead", conflicts_with = "command_id")]
        kind: Option<String>,
        /// Confirms a bulk action on every dead command of `--kind`.
        #[arg(long, requires = "kind")]
        all_dead: bool,
        /// Retry even though a workflow already received `command_failed`.
        #[arg(long)]
        force: bool,
        /// List what would be retried, and change nothing (with `--kind`).
        #[arg(long, requires = "kind")]
        dry_run: bool,
    },
    /// Closes a dead command by hand; its workflow receives a `command_resolved` event. Or, with
    /// `--kind K --all-dead`, every dead command of kind K.
    Resolve {
        /// The store: its SQLite file, or a postgresql:// URL.
        db: PathBuf,
        /// The command ID, `workflow:seq:index`.
        command_id: Option<String>,
        /// Every dead command of this kind (with `--all-dead`).
        #[arg(long, requires = "all_dead", conflicts_with = "command_id")]
        kind: Option<String>,
        /// Confirms a bulk action on every dead command of `--kind`.
        #[arg(long, requires = "kind")]
        all_dead: bool,
        /// What was done about it, kept with the command.
        #[arg(long)]
        note: String,
        /// List what would be resolved, and change nothing (with `--kind`).
        #[arg(long, requires = "kind")]
        dry_run: bool,
    },
    /// Outbox depth by kind (pending, due, leased, dead), the lag, and the paused and limited kinds.
    Stats {
        /// The store: its SQLite file, or a postgresql:// URL.
        db: PathBuf,
    },
    /// Claims skip commands of KIND (in every process) until it is resumed; they keep being
    /// committed.
    Pause {
        /// The store: its SQLite file, or a postgresql:// URL.
        db: PathBuf,
        /// The command kind.
        kind: String,
        /// Who pauses it, recorded with the pause (default: $USER).
        #[arg(long)]
        by: Option<String>,
    },
    /// Claims take commands of KIND again.
    Resume {
        /// The store: its SQLite file, or a postgresql:// URL.
        db: PathBuf,
        /// The command kind.
        kind: String,
        /// Who resumes it, recorded (default: $USER).
        #[arg(long)]
        by: Option<String>,
    },
    /// At most N commands of KIND leased at once, across every worker and process; `none` removes
    /// the limit.
    Limit {
        /// The store: its SQLite file, or a postgresql:// URL.
        db: PathBuf,
        /// The command kind.
        kind: String,
        /// The most leased at once (1 to 100000), or `none`.
        #[arg(value_parser = concurrency_limit)]
        limit: LimitSetting,
        /// Who sets it, recorded (default: $USER).
        #[arg(long)]
        by: Option<String>,
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
    /// Deletes the whole history (events, commands, timers) of workflows finished longer ago than
    /// `--older-than`: every command done or cancelled, no timer scheduled. A retired workflow ID
    /// takes no new event.
    PurgeFinished {
        /// The store: its SQLite file, or a postgresql:// URL.
        db: PathBuf,
        /// The retention period with its unit, e.g. `90d`, `12h`, `90m`, `45s`.
        #[arg(long, value_parser = retention)]
        older_than: Duration,
        /// Print how many would be retired, and change nothing.
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

/// Parses `--now`: milliseconds since the Unix epoch, or an RFC 3339 time with `Z` or an offset.
fn instant(text: &str) -> Result<Timestamp, String> {
    let hint = "write e.g. 2025-01-01T12:00:00Z, 2025-01-01T20:00:00+08:00 or 1735732800000";
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        return text
            .parse()
            .map(Timestamp::from_millis)
            .map_err(|e| format!("{text:?} is not a time ({e}); {hint}"));
    }
    // humantime reads UTC (`Z`) only: an offset `±HH:MM` is taken off by hand.
    let split = text
        .len()
        .checked_sub(6)
        .filter(|at| text.is_char_boundary(*at))
        .map(|at| text.split_at(at));
    let (utc, offset_ms) = match split {
        Some((local, offset))
            if matches!(offset.as_bytes(), [b'+' | b'-', h1, h2, b':', m1, m2]
                if [h1, h2, m1, m2].iter().all(|b| b.is_ascii_digit())) =>
        {
            let hours: i64 = offset[1..3].parse().unwrap_or(0);
            let minutes: i64 = offset[4..6].parse().unwrap_or(0);
            let sign = if offset.starts_with('-') { -1 } else { 1 };
            (
                format!("{local}Z"),
                sign * (hours * 3_600_000 + minutes * 60_000),
            )
        }
        _ => (text.to_owned(), 0),
    };
    let at = humantime::parse_rfc3339(&utc)
        .map_err(|e| format!("{text:?} is not a time ({e}); {hint}"))?;
    let millis = at
        .duration_since(UNIX_EPOCH)
        .map_err(|_| format!("{text:?} is before 1970; {hint}"))?
        .as_millis();
    let millis = i128::try_from(millis).unwrap_or(i128::MAX) - i128::from(offset_ms);
    u64::try_from(millis)
        .map(Timestamp::from_millis)
        .map_err(|_| format!("{text:?} is before 1970; {hint}"))
}

/// The limit of `miniflow limit`: a number, or none.
#[derive(Debug, Clone, Copy)]
struct LimitSetting(Option<u32>);

/// Parses the limit of `miniflow limit`: a number, or `none` to remove the limit. The bounds are
/// the store's (`KindControl::change`).
fn concurrency_limit(text: &str) -> Result<LimitSetting, String> {
    if text.eq_ignore_ascii_case("none") {
        return Ok(LimitSetting(None));
    }
    text.parse::<u32>()
        .map(|n| LimitSetting(Some(n)))
        .map_err(|_| format!("{text:?} is not a limit; write a number such as 2, or none"))
}

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

/// A JSON array written as it goes, one element per line: `[`, the elements separated by commas,
/// `]`; `[]` when it stays empty.
struct JsonList<'a, W: Write> {
    out: &'a mut W,
    empty: bool,
}

impl<'a, W: Write> JsonList<'a, W> {
    fn new(out: &'a mut W) -> Self {
        Self { out, empty: true }
    }

    fn push(&mut self, text: serde_json::Result<String>) -> Done {
        let text = text.map_err(|e| e.to_string())?;
        let before = if self.empty { "[\n" } else { ",\n" };
        self.empty = false;
        write!(self.out, "{before}{text}")?;
        Ok(())
    }

    fn end(self) -> Done {
        writeln!(self.out, "{}", if self.empty { "[]" } else { "\n]" })?;
        Ok(())
    }
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

impl Unreadable {
    /// The JSON report of the row: `{"unreadable": {…}}`.
    fn to_json(&self) -> serde_json::Value {
        serde_json::json!({ "unreadable": {
            "command_id": self.command_id,
            "status": self.status,
            "error": self.error,
        }})
    }
}

/// Prints the rows that read, then the ones that do not: in a section of their own in a table, as
/// `{"unreadable": {…}}` elements after the rows in JSON. With unreadable rows the tool ends with
/// status 1 after printing everything.
fn print_rows(
    out: &mut impl Write,
    rows: &[OutboxRow],
    unreadable: &[Unreadable],
    json: bool,
) -> Done {
    if json {
        let mut list = JsonList::new(out);
        for row in rows {
            list.push(serde_json::to_string(row))?;
        }
        for row in unreadable {
            list.push(serde_json::to_string(&row.to_json()))?;
        }
        list.end()?;
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
            print_unreadable_table(out, unreadable)?;
        }
    }
    unreadable_found(unreadable)
}

/// The unreadable section of a table.
fn print_unreadable_table(out: &mut impl Write, unreadable: &[Unreadable]) -> Done {
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
    Ok(())
}

/// Ends the tool with status 1 when there is any unreadable row.
fn unreadable_found(unreadable: &[Unreadable]) -> Done {
    if unreadable.is_empty() {
        return Ok(());
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

/// What a listing found: the rows that read, the ones that do not, and whether `--limit` cut it.
struct Listed {
    rows: Vec<OutboxRow>,
    unreadable: Vec<Unreadable>,
    cut: bool,
}

/// The first `limit` rows of `listing` (see [`list`]), and whether there are more.
fn list_up_to(store: &Store, listing: Listing, limit: usize) -> Result<Listed, Stop> {
    let (rows, unreadable) = list(store, listing, limit.saturating_add(1))?;
    if rows.len() + unreadable.len() <= limit {
        return Ok(Listed {
            rows,
            unreadable,
            cut: false,
        });
    }
    // Which of the two lists holds the last one is not known: list again, to the limit.
    let (rows, unreadable) = list(store, listing, limit)?;
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

fn show(out: &mut impl Write, store: &Store, id: &str, json: bool) -> Done {
    let command_id: CommandId = id.parse()?;
    match on_store!(store, store => store.command(&command_id)) {
        Ok(Some(row)) if json => json_line(out, serde_json::to_string(&row)),
        Ok(Some(row)) => {
            writeln!(out, "{}", readable_row(&row)?)?;
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
        if let Some(at) = on_store!(store, store => store.retired_at(workflow_id))? {
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

/// Who changes a control: `--by`, or the user running the tool.
fn operator(by: Option<String>) -> String {
    let user = || {
        ["USER", "USERNAME"]
            .into_iter()
            .filter_map(|name| std::env::var(name).ok())
            .find(|name| !name.is_empty())
    };
    by.or_else(user).unwrap_or_else(|| "miniflow".to_owned())
}

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

fn stats(out: &mut impl Write, db: &Path, now: Timestamp, json: bool) -> Done {
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
fn control(
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

/// The dead commands of `kind` whose `command_failed` feedback already reached their workflow (see
/// [`failure_already_delivered`]), one timer read per workflow.
fn failures_already_delivered(store: &Store, dead: &[OutboxRow]) -> Result<Vec<CommandId>, Stop> {
    let mut timers: std::collections::HashMap<WorkflowId, Vec<TimerRow>> =
        std::collections::HashMap::new();
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
enum Bulk<'a> {
    Retry { force: bool },
    Resolve { note: &'a str },
}

/// `retry` or `resolve` of every dead command of `kind`, in batches of [`MAX_BULK_BATCH`], each
/// recorded as one by one; `dry_run` opens the store read-only and lists what it would change.
fn bulk(
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

fn purge_done(
    out: &mut impl Write,
    db: &Path,
    older_than: Duration,
    dry_run: bool,
    now: Timestamp,
    json: bool,
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
        if json {
            return purge_json(out, "commands", count, older_than, true);
        }
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
    if json {
        return purge_json(out, "commands", purged, older_than, false);
    }
    writeln!(
        out,
        "purged {} processed more than {period} ago",
        plural(purged, "done command")
    )?;
    Ok(())
}

fn purge_finished(
    out: &mut impl Write,
    db: &Path,
    older_than: Duration,
    dry_run: bool,
    now: Timestamp,
    json: bool,
) -> Done {
    let period = humantime::format_duration(older_than);
    if dry_run {
        let store = open_to_read(db)?;
        let count = on_store!(&store, store => store.count_finished(older_than, now))?;
        if json {
            return purge_json(out, "workflows", count, older_than, true);
        }
        writeln!(
            out,
            "would retire {} finished more than {period} ago (their events, commands and timers); \
             nothing was changed (dry run)",
            plural(count, "workflow")
        )?;
        return Ok(());
    }
    let mut store = open_to_write(db)?;
    let retired = on_store!(&mut store, store => store.purge_finished(older_than, now, 1_000))?;
    if json {
        return purge_json(out, "workflows", retired, older_than, false);
    }
    writeln!(
        out,
        "retired {} finished more than {period} ago (their events, commands and timers)",
        plural(retired, "workflow")
    )?;
    Ok(())
}

fn migrate(out: &mut impl Write, db: &Path) -> Done {
    if let Some(url) = database_url(db) {
        let found = PostgresStore::migrate(&with_password(url))?;
        let (url, version) = (miniflow::redact_password(url), POSTGRES_SCHEMA_VERSION);
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
    let now = cli.now.unwrap_or_else(|| SystemClock.now());
    let json = cli.json;
    match cli.command {
        Action::Pending { db, limit } => {
            let listed = list_up_to(&open_to_read(&db)?, Listing::Pending, limit)?;
            print_listing(out, &listed, limit, json)
        }
        Action::Dead { db, limit } => {
            let listed = list_up_to(&open_to_read(&db)?, Listing::Dead, limit)?;
            print_listing(out, &listed, limit, json)
        }
        Action::Stats { db } => stats(out, &db, now, json),
        Action::Pause { db, kind, by } => {
            control(out, &db, &kind, KindChange::Pause, operator(by), now, json)
        }
        Action::Resume { db, kind, by } => {
            control(out, &db, &kind, KindChange::Resume, operator(by), now, json)
        }
        Action::Limit {
            db,
            kind,
            limit,
            by,
        } => {
            let change = limit.0.map_or(KindChange::RemoveLimit, KindChange::Limit);
            control(out, &db, &kind, change, operator(by), now, json)
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
            kind,
            force,
            dry_run,
            ..
        } => match (command_id, kind) {
            (_, Some(kind)) => bulk(out, &db, &kind, Bulk::Retry { force }, dry_run, now, json),
            (Some(command_id), None) => retry(out, &db, &command_id, force, now),
            (None, None) => Err(Stop::Failed(
                "name the command to act on (workflow:seq:index), or every dead command of a \
                 kind with --kind KIND --all-dead"
                    .to_owned(),
            )),
        },
        Action::Resolve {
            db,
            command_id,
            kind,
            note,
            dry_run,
            ..
        } => match (command_id, kind) {
            (_, Some(kind)) => bulk(
                out,
                &db,
                &kind,
                Bulk::Resolve { note: &note },
                dry_run,
                now,
                json,
            ),
            (Some(command_id), None) => {
                let id: CommandId = command_id.parse()?;
                on_store!(&mut open_to_write(&db)?, store => store.resolve(&id, &note, now))?;
                writeln!(out, "{id}: resolved by hand")?;
                Ok(())
            }
            (None, None) => Err(Stop::Failed(
                "name the command to act on (workflow:seq:index), or every dead command of a \
                 kind with --kind KIND --all-dead"
                    .to_owned(),
            )),
        },
        Action::PurgeDone {
            db,
            older_than,
            dry_run,
        } => purge_done(out, &db, older_than, dry_run, now, json),
        Action::PurgeFinished {
            db,
            older_than,
            dry_run,
        } => purge_finished(out, &db, older_than, dry_run, now, json),
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
