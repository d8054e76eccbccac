//! The command line: clap's definitions, and the parsers of the values it takes (times, durations,
//! limits, where the store is), each refusing what it cannot take with a message naming it.

use std::path::{Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

use clap::{Parser, Subcommand};
use miniflow::Timestamp;

use crate::output::{redact, when, LATEST};

#[derive(Parser)]
#[command(
    name = "miniflow",
    version,
    about = "Inspect a miniflow store (a SQLite file or a PostgreSQL database) and handle its dead letters"
)]
pub struct Cli {
    /// Print JSON instead of a table: a list as one array (`[]` when empty), a single value as one
    /// object.
    #[arg(long, global = true)]
    pub json: bool,
    /// Act at this time instead of the system clock's: RFC 3339 (`2025-01-01T12:00:00Z`,
    /// `2025-01-01T20:00:00+08:00`) or milliseconds since the Unix epoch, from 1970 to the end of
    /// the year 9999.
    #[arg(long, global = true, value_name = "TIME", value_parser = instant)]
    pub now: Option<GivenTime>,
    #[command(subcommand)]
    pub command: Action,
}

#[derive(Subcommand)]
pub enum Action {
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

/// A `--now` as given: the time, and a word for the operator when the number looks like seconds.
#[derive(Debug, Clone)]
pub struct GivenTime {
    pub at: Timestamp,
    pub note: Option<String>,
}

/// What `--now` accepts, for its messages.
const ACCEPTED: &str = "accepted: RFC 3339 from 1970-01-01T00:00:00Z to 9999-12-31T23:59:59.999Z \
     (e.g. 2025-01-01T12:00:00Z or 2025-01-01T20:00:00+08:00), or milliseconds since the Unix \
     epoch from 0 to 253402300799999 (e.g. 1735732800000)";

/// Parses `--now`: milliseconds since the Unix epoch, or an RFC 3339 time with `Z` or an offset,
/// from 1970 to the end of the year 9999 ([`LATEST`]). A number past it that is a time in
/// microseconds or nanoseconds is refused saying so; one that would be a recent time in seconds is
/// taken (it is a time in 1970), with a note saying how to write it in milliseconds.
pub fn instant(text: &str) -> Result<GivenTime, String> {
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        return millis(text);
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
        .map_err(|e| format!("{text:?} is not a time ({e}); {ACCEPTED}"))?;
    let before_1970 = || format!("{text:?} is before 1970; {ACCEPTED}");
    let millis = at
        .duration_since(UNIX_EPOCH)
        .map_err(|_| before_1970())?
        .as_millis();
    let millis = i128::try_from(millis).unwrap_or(i128::MAX) - i128::from(offset_ms);
    let millis = u64::try_from(millis).map_err(|_| before_1970())?;
    let at = Timestamp::from_millis(millis);
    if at > LATEST {
        return Err(format!("{text:?} is past the year 9999; {ACCEPTED}"));
    }
    Ok(GivenTime { at, note: None })
}

/// [`instant`] of a number: milliseconds since the Unix epoch.
fn millis(text: &str) -> Result<GivenTime, String> {
    // As many digits as fit, to say what a number past the range may have meant.
    let n = text.parse::<u128>().unwrap_or(u128::MAX);
    if n > u128::from(LATEST.as_millis()) {
        let in_range = |scale: u128| {
            u64::try_from(n / scale)
                .ok()
                .map(Timestamp::from_millis)
                .filter(|at| *at <= LATEST && n / scale >= 1_000_000_000_000)
        };
        let meant = [(1_000, "microseconds"), (1_000_000, "nanoseconds")]
            .into_iter()
            .find_map(|(scale, unit)| {
                let at = in_range(scale)?;
                Some(format!(
                    "; it looks like {unit}: in milliseconds that is {}, {}",
                    at.as_millis(),
                    when(at)
                ))
            })
            .unwrap_or_default();
        return Err(format!(
            "{text} milliseconds since the Unix epoch is past the year 9999{meant}; {ACCEPTED}"
        ));
    }
    let at = Timestamp::from_millis(u64::try_from(n).unwrap_or(u64::MAX));
    // Ten digits: the seconds of every time from 2001 to 2286, and as milliseconds a time in 1970.
    let note = (1_000_000_000..10_000_000_000).contains(&n).then(|| {
        let seconds = Timestamp::from_millis(at.as_millis().saturating_mul(1_000));
        format!(
            "--now {text} is {} in milliseconds; if it is seconds since the Unix epoch ({}), \
             write {}",
            when(at),
            when(seconds),
            seconds.as_millis()
        )
    });
    Ok(GivenTime { at, note })
}

/// The limit of `miniflow limit`: a number, or none.
#[derive(Debug, Clone, Copy)]
pub struct LimitSetting(pub Option<u32>);

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

/// Who changes a control: `--by`, or the user running the tool.
pub fn operator(by: Option<String>) -> String {
    let user = || {
        ["USER", "USERNAME"]
            .into_iter()
            .filter_map(|name| std::env::var(name).ok())
            .find(|name| !name.is_empty())
    };
    by.or_else(user).unwrap_or_else(|| "miniflow".to_owned())
}

/// Where the store named on the command line is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Location<'a> {
    /// A SQLite file.
    File(&'a Path),
    /// A PostgreSQL database, by its `postgres://` or `postgresql://` URL.
    Postgres(&'a str),
}

/// The settings of a libpq `key=value` connection string (`host=db dbname=flow`).
const CONNINFO_KEYS: &[&str] = &[
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "passfile",
    "require_auth",
    "channel_binding",
    "connect_timeout",
    "client_encoding",
    "options",
    "application_name",
    "fallback_application_name",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_count",
    "tcp_user_timeout",
    "replication",
    "gssencmode",
    "sslmode",
    "requiressl",
    "sslcompression",
    "sslcert",
    "sslkey",
    "sslpassword",
    "sslcertmode",
    "sslrootcert",
    "sslcrl",
    "sslcrldir",
    "sslsni",
    "requirepeer",
    "ssl_min_protocol_version",
    "ssl_max_protocol_version",
    "krbsrvname",
    "gsslib",
    "gssdelegation",
    "service",
    "target_session_attrs",
    "load_balance_hosts",
];

/// Where `db` names a store: a PostgreSQL database when it is a `postgres://` or `postgresql://`
/// URL (the scheme in any case), else a SQLite file — unless it looks like another connection
/// string (`scheme://…`, or `key=value` settings such as `host=… dbname=…`), which is refused,
/// with its password left out, rather than taken for a file name. A file whose name looks so is
/// written `./NAME`.
pub fn location(db: &Path) -> Result<Location<'_>, String> {
    let Some(text) = db.to_str() else {
        return Ok(Location::File(db));
    };
    let scheme = text
        .split_once("://")
        .map(|(scheme, _)| scheme)
        .filter(|s| {
            s.starts_with(|c: char| c.is_ascii_alphabetic())
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"+.-".contains(&b))
        });
    let what = match scheme {
        Some(s) if s.eq_ignore_ascii_case("postgres") || s.eq_ignore_ascii_case("postgresql") => {
            return Ok(Location::Postgres(text));
        }
        Some(s) => format!("a {s}:// URL"),
        None if is_conninfo(text) => "a key=value connection string".to_owned(),
        None => return Ok(Location::File(db)),
    };
    Err(format!(
        "{:?} looks like a connection string ({what}), not a store: a store is a SQLite file, \
         named by its path, or a PostgreSQL database, named by a postgresql:// or postgres:// URL \
         (e.g. postgresql://operator@db.internal/flow, the password best left to PGPASSWORD); a \
         file whose name looks so is written ./NAME",
        redact(text)
    ))
}

/// Whether `text` holds a libpq setting: a word `key=value` (or `key = value`) whose key is one of
/// [`CONNINFO_KEYS`].
fn is_conninfo(text: &str) -> bool {
    let words: Vec<&str> = text.split_whitespace().collect();
    words.iter().enumerate().any(|(i, word)| {
        let (key, set) = match word.split_once('=') {
            Some((key, _)) => (key, true),
            None => (
                *word,
                words.get(i + 1).is_some_and(|next| next.starts_with('=')),
            ),
        };
        set && CONNINFO_KEYS.iter().any(|k| key.eq_ignore_ascii_case(k))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn now_is_taken_from_1970_to_the_end_of_the_year_9999() {
        let at = |text: &str| instant(text).map(|given| given.at.as_millis());
        assert_eq!(at("0"), Ok(0));
        assert_eq!(at("253402300799999"), Ok(253_402_300_799_999));
        assert_eq!(at("9999-12-31T23:59:59.999Z"), Ok(253_402_300_799_999));
        assert_eq!(at("1970-01-01T00:30:00+00:30"), Ok(0));
        for refused in [
            "253402300800000",
            "18446744073709551616",
            "99999999999999999999999999999999999999999999",
            "9999-12-31T23:59:59-00:01",
            "1970-01-01T00:00:00+00:01",
            "yesterday",
            "",
        ] {
            let message = instant(refused).unwrap_err();
            assert!(message.contains(refused), "{message}");
            assert!(message.contains("9999-12-31T23:59:59.999Z"), "{message}");
        }
    }

    #[test]
    fn a_number_in_other_units_is_named_as_such() {
        let message = instant("1796152429467000").unwrap_err();
        assert!(
            message.contains("looks like microseconds: in milliseconds that is 1796152429467"),
            "{message}"
        );
        let message = instant("1796152429467000000").unwrap_err();
        assert!(message.contains("looks like nanoseconds"), "{message}");
        let message = instant("253402300800000").unwrap_err();
        assert!(!message.contains("looks like"), "{message}");
        let given = instant("1735732800").unwrap();
        assert_eq!(given.at.as_millis(), 1_735_732_800);
        let note = given.note.unwrap();
        assert!(
            note.contains("seconds") && note.contains("write 1735732800000"),
            "{note}"
        );
        assert!(instant("1735732800000").unwrap().note.is_none());
        assert!(instant("50").unwrap().note.is_none());
    }

    #[test]
    fn only_postgres_urls_and_file_names_are_stores() {
        let at = |text: &'static str| location(Path::new(text));
        assert_eq!(at("flow.db"), Ok(Location::File(Path::new("flow.db"))));
        assert_eq!(
            at("PostgreSQL://u@h/x"),
            Ok(Location::Postgres("PostgreSQL://u@h/x"))
        );
        assert_eq!(
            at("postgres://h/x"),
            Ok(Location::Postgres("postgres://h/x"))
        );
        for file in [
            "./mysql://u:pw@h/x",
            "./host=h",
            "data/a=b.db",
            "backup 2025=old.db",
            "file:flow.db",
        ] {
            assert_eq!(at(file), Ok(Location::File(Path::new(file))), "{file}");
        }
        for (given, shown) in [
            ("mysql://u:pw@h/x", "mysql://u:***@h/x"),
            ("host=h password=pw", "host=h password=***"),
            ("dbname = flow", "dbname = flow"),
            ("HOST=h", "HOST=h"),
            ("sqlite:///tmp/flow.db", "sqlite:///tmp/flow.db"),
        ] {
            let message = at(given).unwrap_err();
            assert!(message.contains(shown), "{message}");
            assert!(
                !message.contains(":pw@") && !message.contains("=pw"),
                "{message}"
            );
        }
    }
}
