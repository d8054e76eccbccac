//! [`SqliteStore`]: the miniflow [`Store`] on one SQLite file.

use std::borrow::Cow;
use std::collections::HashSet;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use miniflow_core::prelude::*;
use miniflow_core::{
    canonical_json, Ack, Cancelled, Changed, ClaimOrder, ClaimRequest, CommandId, Commit, Delivery,
    Engine, Error, Event, EventRecord, Extended, Failure, Handled, Lease, OutboxRow, RetryPolicy,
    Seq, Settled, Status, TimerId, TimerRow, Timestamp, Workflow, WorkflowId,
};
use rusqlite::types::{Value as SqlValue, ValueRef};
use rusqlite::{params, Connection, ErrorCode, OpenFlags, Row, Transaction, TransactionBehavior};
use rusqlite_migration::{Migrations, M};

/// The schema migrations, applied in order; the count is the schema version in `PRAGMA user_version`.
const MIGRATIONS: &[&str] = &[
    include_str!("../migrations/0001_init.sql"),
    include_str!("../migrations/0002_idempotency_and_retention.sql"),
    include_str!("../migrations/0003_timers.sql"),
    include_str!("../migrations/0004_fencing_results_and_cancellation.sql"),
];

/// The newest schema version this build writes.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// How a commit reaches the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Synchronous {
    /// `synchronous=FULL`: a commit survives a crash and a power loss once it returns. The default.
    #[default]
    Full,
    /// `synchronous=NORMAL`: faster, and still safe against a process crash, but a power loss can undo
    /// the last commits — possibly a commit whose command a worker already delivered. Opt in only when
    /// that is acceptable.
    Normal,
}

/// Settings of a [`SqliteStore`]; the defaults are the durable ones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqliteOptions {
    /// How commits reach the disk (default [`Synchronous::Full`]).
    pub synchronous: Synchronous,
    /// How long a writer waits for another writer's lock before giving up with [`Error::Busy`]
    /// (default 10 s: far longer than any miniflow transaction holds it).
    pub busy_timeout: Duration,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        Self {
            synchronous: Synchronous::Full,
            busy_timeout: Duration::from_secs(10),
        }
    }
}

/// The miniflow [`Store`] on a SQLite file (WAL, `synchronous=FULL`, `BEGIN IMMEDIATE` writes).
///
/// One `SqliteStore` is one connection. Open one per thread or process; they coordinate through the
/// file, and every write is one short `BEGIN IMMEDIATE` transaction.
///
/// ```
/// use miniflow_core::prelude::*;
/// use miniflow_core::{Command, Commit, Decision, Event, Seq, Timestamp, WorkflowId};
/// use miniflow_native::SqliteStore;
/// use serde_json::json;
///
/// let dir = tempfile::tempdir()?;
/// let mut store = SqliteStore::open(dir.path().join("flow.db"))?;
/// let trip = WorkflowId::new("trip-001")?;
/// let decision = Decision::new().command(Command::new("lock_budget", json!({ "trip_id": "trip-001" })));
/// let event = Event::new("trip_requested", json!({ "city": "成都" }));
/// store.append_with_commands(&Commit::new(trip, Seq::ZERO, event, decision, Timestamp::from_millis(0))?)?;
/// assert_eq!(store.pending(10)?[0].command_id.to_string(), "trip-001:1:0");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct SqliteStore {
    conn: Connection,
    path: PathBuf,
}

/// Maps a driver error onto miniflow's kinds: a locked database is [`Error::Busy`].
pub(crate) fn storage(e: rusqlite::Error) -> Error {
    match e.sqlite_error_code() {
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => Error::Busy(Box::new(e)),
        _ => Error::Storage(Box::new(e)),
    }
}

pub(crate) fn to_sql_time(field: &'static str, t: Timestamp) -> Result<i64, Error> {
    i64::try_from(t.as_millis())
        .map_err(|_| Error::invalid(field, t, "is past the year 292 million"))
}

fn to_sql_u64(field: &'static str, n: u64) -> Result<i64, Error> {
    i64::try_from(n).map_err(|_| Error::invalid(field, n, "is too large to store"))
}

pub(crate) fn limit(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl SqliteStore {
    /// Opens (or creates) the store at `path` with the durable defaults. `path` is a file name, never
    /// a URI: `file:flow.db` is the file of that name. To look at a store without changing it, use
    /// [`SqliteStore::open_read_only`].
    ///
    /// # Errors
    ///
    /// [`Error::UnsupportedSchema`] when the file was written by a newer miniflow (it is left as it is);
    /// [`Error::Storage`] when the file cannot be opened or a pragma does not take effect.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, Error> {
        Self::open_with(path, &SqliteOptions::default())
    }

    /// Opens (or creates) the store at `path` with `options`.
    ///
    /// # Errors
    ///
    /// As [`SqliteStore::open`].
    pub fn open_with(path: impl AsRef<Path>, options: &SqliteOptions) -> Result<Self, Error> {
        let path = path.as_ref().to_path_buf();
        let conn = open_connection(&path, options)?;
        Ok(Self { conn, path })
    }

    /// Opens the store at `path` to read it, and changes nothing: the file is opened with
    /// `SQLITE_OPEN_READ_ONLY`, no pragma is set, no migration runs, and a file that is not a miniflow
    /// store is refused before SQLite reads it. Every write through the store fails with
    /// [`Error::Storage`] (SQLite's "attempt to write a readonly database").
    ///
    /// Reading a store in WAL mode (every store [`SqliteStore::open`] wrote) takes SQLite's `-shm`
    /// and `-wal` files beside it: SQLite creates them when they are missing and the directory is
    /// writable, and the next writer that closes the store removes them. The store file itself is never
    /// written. On a read-only file system, a store that was closed cleanly (no `-wal` with content
    /// beside it) is read as an immutable file, without locks.
    ///
    /// ```
    /// use miniflow_core::prelude::*;
    /// use miniflow_native::SqliteStore;
    ///
    /// let dir = tempfile::tempdir()?;
    /// let path = dir.path().join("flow.db");
    /// drop(SqliteStore::open(&path)?);
    /// let store = SqliteStore::open_read_only(&path)?;
    /// assert!(store.pending(10)?.is_empty());
    /// assert!(SqliteStore::open_read_only(dir.path().join("missing.db")).is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] naming the path when there is no miniflow store at `path`: no file, a
    /// directory, an empty file, a file that is not a SQLite database, a SQLite database without
    /// miniflow's tables, or a store of an older schema version (upgrade it with
    /// [`SqliteStore::migrate`] or `miniflow migrate PATH`); [`Error::UnsupportedSchema`] when a newer
    /// miniflow wrote it; [`Error::Storage`] when it cannot be read.
    pub fn open_read_only(path: impl AsRef<Path>) -> Result<Self, Error> {
        let path = path.as_ref().to_path_buf();
        let (conn, version) = read_only_connection(&path)?;
        if version < SCHEMA_VERSION {
            return Err(Error::invalid(
                "path",
                path.display(),
                format!(
                    "is a miniflow store of schema version {version}, older than version \
                     {SCHEMA_VERSION} that this miniflow reads; upgrade it first with \
                     `miniflow migrate {}` (after that, older versions of miniflow refuse it)",
                    path.display()
                ),
            ));
        }
        Ok(Self { conn, path })
    }

    /// Upgrades the store at `path` to [`SCHEMA_VERSION`] and returns the schema version it had. A store
    /// that is already current is not written at all. Unlike [`SqliteStore::open`], it never creates a
    /// store and never adds miniflow's tables to another database. Once upgraded, older versions of
    /// miniflow refuse the store with their [`Error::UnsupportedSchema`].
    ///
    /// # Errors
    ///
    /// As [`SqliteStore::open_read_only`] for a file that is not a miniflow store or is newer than this
    /// miniflow; as [`SqliteStore::open`] when the upgrade fails (nothing is changed then).
    pub fn migrate(path: impl AsRef<Path>) -> Result<i64, Error> {
        let path = path.as_ref();
        let (conn, found) = read_only_connection(path)?;
        drop(conn);
        if found < SCHEMA_VERSION {
            open_connection(path, &SqliteOptions::default())?;
        }
        Ok(found)
    }

    /// The file this store lives in.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The underlying connection, for diagnostics and tests. Writing through it bypasses every rule
    /// miniflow keeps.
    pub fn connection(&self) -> &Connection {
        &self.conn
    }

    /// Whether `sql` (an `EXISTS` over the due index) finds anything due at `now`. Idle workers poll
    /// with it, so they take the write lock only when there is something to take.
    fn any_due(&self, sql: &str, now: Timestamp) -> Result<bool, Error> {
        let now = to_sql_time("now", now)?;
        self.conn
            .prepare_cached(sql)
            .and_then(|mut stmt| stmt.query_row([now], |row| row.get(0)))
            .map_err(storage)
    }

    fn write(&mut self) -> Result<Transaction<'_>, Error> {
        self.conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(storage)
    }

    /// Writes `commit` inside the caller's own transaction `tx`, so the caller's rows (an `orders`
    /// table, say) commit together with the event and its commands — or not at all. The store never
    /// commits `tx`; on an error nothing of the commit is left in it (a savepoint is rolled back) and
    /// the caller decides whether to roll back the rest.
    ///
    /// The caller guarantees: `tx` is on the same file as the store, opened after the store (so its
    /// schema is current), and began with `BEGIN IMMEDIATE`
    /// (`TransactionBehavior::Immediate`) so that no other writer moves the workflow between the read
    /// and the write; the file keeps the WAL journal the store set, and `tx` is committed with the
    /// durability the caller needs (miniflow's own connections use `synchronous=FULL`).
    ///
    /// ```
    /// use miniflow_native::SqliteStore;
    /// use miniflow_core::prelude::*;
    /// use miniflow_core::{json, Command, Commit, Decision, Event, Seq, Timestamp, WorkflowId};
    /// use rusqlite::{Connection, TransactionBehavior};
    ///
    /// let dir = tempfile::tempdir()?;
    /// let path = dir.path().join("shop.db");
    /// let store = SqliteStore::open(&path)?; // creates or upgrades miniflow's tables
    /// let mut conn = Connection::open(&path)?;
    /// conn.execute_batch("CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY, total INTEGER)")?;
    ///
    /// let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    /// tx.execute("INSERT INTO orders VALUES ('order-7', 1200)", [])?;
    /// let order = WorkflowId::new("order-7")?;
    /// let decision = Decision::new().command(Command::new("charge_card", json!({ "amount": 1200 })));
    /// let commit = Commit::new(order.clone(), Seq::ZERO, Event::new("placed", json!({})), decision, Timestamp::from_millis(0))?;
    /// SqliteStore::append_in(&tx, &commit)?;
    /// tx.commit()?; // the order row, the event and its command, together
    ///
    /// assert_eq!(store.commands(&order)?.len(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`EventLog::append_with_commands`].
    pub fn append_in(tx: &Transaction<'_>, commit: &Commit) -> Result<(), Error> {
        in_savepoint(tx, |conn| write_commit(conn, commit))
    }

    /// [`Engine::handle`] inside the caller's own transaction `tx`: replays the workflow from `tx`,
    /// decides, and writes the commit with [`SqliteStore::append_in`], under the same guarantees.
    /// Under `BEGIN IMMEDIATE` no other writer can move the workflow meanwhile, so there is no
    /// conflict to retry.
    ///
    /// # Errors
    ///
    /// As [`Engine::handle`].
    pub fn handle_in<W: Workflow>(
        tx: &Transaction<'_>,
        engine: &Engine<W>,
        workflow_id: &WorkflowId,
        event: Event,
        now: Timestamp,
    ) -> Result<Handled, Error> {
        let events = load_events(tx, workflow_id)?;
        let commit = engine.plan(&events, workflow_id, event, now)?;
        Self::append_in(tx, &commit)?;
        Ok(Handled::of(&commit, 0))
    }

    /// Applies `change` to one row inside one `BEGIN IMMEDIATE` transaction; an error rolls it back.
    /// The rules themselves live in [`OutboxRow`]'s methods, shared with every store.
    fn update<T>(
        &mut self,
        command_id: &CommandId,
        now: Timestamp,
        change: impl FnOnce(&mut OutboxRow) -> Result<T, Error>,
    ) -> Result<T, Error> {
        let tx = self.write()?;
        let row = select_row(&tx, command_id)?.ok_or_else(|| Error::UnknownCommand {
            command_id: command_id.clone(),
        })?;
        let changed = row.change(now, change)?;
        write_change(&tx, &changed)?;
        tx.commit().map_err(storage)?;
        Ok(changed.value)
    }
}

/// Opens a connection to the miniflow database at `path`: durable pragmas set and checked, schema
/// migrated to [`SCHEMA_VERSION`] (a newer file is refused untouched).
pub(crate) fn open_connection(path: &Path, options: &SqliteOptions) -> Result<Connection, Error> {
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_CREATE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let mut conn = Connection::open_with_flags(sqlite_path(path), flags).map_err(storage)?;
    conn.busy_timeout(options.busy_timeout).map_err(storage)?;
    let synchronous = match options.synchronous {
        Synchronous::Full => ("FULL", 2),
        Synchronous::Normal => ("NORMAL", 1),
    };
    expect_pragma(&conn, "journal_mode", "WAL", "wal".to_owned())?;
    expect_pragma(&conn, "synchronous", synchronous.0, synchronous.1)?;
    expect_pragma(&conn, "foreign_keys", "ON", 1)?;
    conn.execute_batch("PRAGMA cache_size = -16384")
        .map_err(storage)?;
    migrate(&mut conn)?;
    Ok(conn)
}

/// Sets a pragma and checks the value that comes back: a misspelt or refused pragma is silently
/// ignored by SQLite, so the value is read back instead of trusted.
fn expect_pragma<V>(conn: &Connection, name: &str, set: &str, expected: V) -> Result<(), Error>
where
    V: rusqlite::types::FromSql + PartialEq + std::fmt::Debug,
{
    conn.execute_batch(&format!("PRAGMA {name} = {set}"))
        .map_err(storage)?;
    let actual: V = conn
        .query_row(&format!("PRAGMA {name}"), [], |row| row.get(0))
        .map_err(storage)?;
    if actual != expected {
        return Err(Error::Storage(
            format!("PRAGMA {name} is {actual:?} after setting it to {set}").into(),
        ));
    }
    Ok(())
}

fn migrate(conn: &mut Connection) -> Result<(), Error> {
    let version = |conn: &Connection| -> Result<i64, Error> {
        conn.query_row("PRAGMA user_version", [], |row| row.get(0))
            .map_err(storage)
    };
    let found = version(conn)?;
    if found > SCHEMA_VERSION {
        return Err(Error::UnsupportedSchema {
            found,
            supported: SCHEMA_VERSION,
        });
    }
    if found == SCHEMA_VERSION {
        return Ok(());
    }
    let migrations = Migrations::new(MIGRATIONS.iter().map(|sql| M::up(sql)).collect());
    conn.set_transaction_behavior(TransactionBehavior::Immediate);
    let applied = migrations.to_latest(conn);
    conn.set_transaction_behavior(TransactionBehavior::Deferred);
    match applied {
        Ok(()) => Ok(()),
        // Another connection migrated the file between our check and our transaction.
        Err(_) if version(conn)? == SCHEMA_VERSION => Ok(()),
        Err(e) => Err(Error::Storage(Box::new(e))),
    }
}

/// `path` as SQLite must be given it to open the file of that name. Without `SQLITE_OPEN_URI` a name
/// is still read as a URI when it starts with `file:` (the bundled SQLite is built with
/// `SQLITE_USE_URI`), so such a relative path is spelt `./file:…`.
fn sqlite_path(path: &Path) -> Cow<'_, Path> {
    if path.as_os_str().as_encoded_bytes().starts_with(b"file:") {
        Cow::Owned(Path::new(".").join(path))
    } else {
        Cow::Borrowed(path)
    }
}

/// Every miniflow table, with the schema version that added it.
const TABLES: &[(&str, i64)] = &[
    ("events", 1),
    ("outbox", 1),
    ("idempotency", 2),
    ("timers", 3),
];

/// The 16 bytes a SQLite database file starts with.
const SQLITE_HEADER: &[u8; 16] = b"SQLite format 3\0";

/// An [`Error::InvalidInput`] saying what the file at `path` is instead of a miniflow store.
fn not_a_store(path: &Path, what: impl Into<String>) -> Error {
    Error::invalid("path", path.display(), what)
}

/// Looks at the file before SQLite does, so that nothing is created or opened for a file that cannot
/// be a store. Returns whether the database is in WAL mode.
fn check_database_file(path: &Path) -> Result<bool, Error> {
    let unreadable =
        |e: std::io::Error| Error::Storage(format!("cannot read {}: {e}", path.display()).into());
    let meta = match std::fs::metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(not_a_store(
                path,
                "no store at this path: the file does not exist",
            ))
        }
        Err(e) => return Err(unreadable(e)),
    };
    if meta.is_dir() {
        return Err(not_a_store(path, "is a directory, not a miniflow store"));
    }
    if meta.len() == 0 {
        return Err(not_a_store(path, "is an empty file, not a miniflow store"));
    }
    let mut header = [0u8; 100];
    let mut file = std::fs::File::open(path).map_err(unreadable)?;
    match file.read_exact(&mut header) {
        Ok(()) if header.starts_with(SQLITE_HEADER) => {}
        Ok(()) => {
            return Err(not_a_store(
                path,
                "is not a SQLite database, so not a miniflow store",
            ))
        }
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            return Err(not_a_store(
                path,
                "is not a SQLite database, so not a miniflow store",
            ))
        }
        Err(e) => return Err(unreadable(e)),
    }
    // Bytes 18 and 19, the file format write and read versions, are 2 in WAL mode.
    Ok(header[18] == 2 && header[19] == 2)
}

/// Opens `path` read-only and returns the connection with the store's schema version, refusing a
/// file that is not a miniflow store and a newer schema.
fn read_only_connection(path: &Path) -> Result<(Connection, i64), Error> {
    let wal = check_database_file(path)?;
    let open = |name: &Path, flags: OpenFlags| -> rusqlite::Result<(Connection, i64)> {
        let conn = Connection::open_with_flags(name, flags | OpenFlags::SQLITE_OPEN_NO_MUTEX)?;
        conn.busy_timeout(SqliteOptions::default().busy_timeout)?;
        let version = conn.query_row("PRAGMA user_version", [], |row| row.get(0))?;
        Ok((conn, version))
    };
    let cannot_read =
        |e: rusqlite::Error| Error::Storage(format!("cannot read {}: {e}", path.display()).into());
    let (conn, version) = match open(&sqlite_path(path), OpenFlags::SQLITE_OPEN_READ_ONLY) {
        Ok(opened) => opened,
        // SQLite reads a WAL database through its `-shm` index, which it cannot create on a
        // read-only file system.
        Err(e)
            if wal
                && e.sqlite_error_code() == Some(ErrorCode::CannotOpen)
                && !beside(path, "-shm").exists() =>
        {
            open(
                Path::new(&immutable_uri(path)?),
                OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_URI,
            )
            .map_err(cannot_read)?
        }
        Err(e) => return Err(cannot_read(e)),
    };
    check_schema(&conn, path, version)?;
    Ok((conn, version))
}

/// `path` with `suffix` appended to its file name, as SQLite names the files beside a database.
fn beside(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// A URI that opens the WAL store at `path` as an immutable file (no locks, no `-shm`), for a store
/// on a read-only file system. Only a store closed cleanly, whose `-wal` is missing or empty, is the
/// file alone; a `-wal` with commits in it is refused rather than skipped. Every byte of the path
/// that is not plainly safe is percent-encoded, so the path cannot add URI parameters.
fn immutable_uri(path: &Path) -> Result<String, Error> {
    let wal = beside(path, "-wal");
    if std::fs::metadata(&wal).is_ok_and(|meta| meta.len() > 0) {
        return Err(Error::Storage(
            format!(
                "cannot read {}: its write-ahead log {} holds commits that are not in the file \
                 yet, and SQLite cannot create the index it needs to read them (a read-only file \
                 system?); copy the store with its -wal file to a writable place to read it",
                path.display(),
                wal.display(),
            )
            .into(),
        ));
    }
    let absolute = std::path::absolute(path)
        .map_err(|e| Error::Storage(format!("cannot read {}: {e}", path.display()).into()))?;
    let mut uri = String::from("file:");
    for &byte in absolute.as_os_str().as_encoded_bytes() {
        if byte.is_ascii_alphanumeric() || b"/-._~".contains(&byte) {
            uri.push(char::from(byte));
        } else {
            uri.push_str(&format!("%{byte:02X}"));
        }
    }
    uri.push_str("?mode=ro&immutable=1");
    Ok(uri)
}

/// Refuses a database without miniflow's tables for `version`, and a newer schema.
fn check_schema(conn: &Connection, path: &Path, version: i64) -> Result<(), Error> {
    if version > SCHEMA_VERSION {
        return Err(Error::UnsupportedSchema {
            found: version,
            supported: SCHEMA_VERSION,
        });
    }
    let tables: Vec<String> = conn
        .prepare("SELECT name FROM sqlite_schema WHERE type = 'table' ORDER BY name")
        .and_then(|mut stmt| stmt.query_map([], |row| row.get(0))?.collect())
        .map_err(|e| Error::Storage(format!("cannot read {}: {e}", path.display()).into()))?;
    if tables.is_empty() {
        return Err(not_a_store(
            path,
            "is an empty SQLite database, not a miniflow store",
        ));
    }
    let missing = TABLES
        .iter()
        .any(|(table, since)| *since <= version && !tables.iter().any(|t| t == table));
    if version < 1 || missing {
        const SHOWN: usize = 8;
        let mut names = tables
            .iter()
            .take(SHOWN)
            .cloned()
            .collect::<Vec<_>>()
            .join(", ");
        if tables.len() > SHOWN {
            names.push_str(&format!(" and {} more", tables.len() - SHOWN));
        }
        return Err(not_a_store(
            path,
            format!(
                "is a SQLite database but not a miniflow store (user_version {version}, tables: \
                 {names})"
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod opening_tests {
    use super::*;

    /// The names in `dir` with each file's bytes: what a read must leave exactly as it was.
    fn snapshot(dir: &Path) -> Vec<(String, Vec<u8>)> {
        let mut files: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|entry| {
                let entry = entry.unwrap();
                let bytes = std::fs::read(entry.path()).unwrap_or_default();
                (entry.file_name().to_string_lossy().into_owned(), bytes)
            })
            .collect();
        files.sort();
        files
    }

    fn user_version(path: &Path) -> i64 {
        Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap()
            .query_row("PRAGMA user_version", [], |row| row.get(0))
            .unwrap()
    }

    /// A store as the first release of miniflow left it, in rollback-journal mode.
    fn version_1_store(path: &Path) {
        let conn = Connection::open(path).unwrap();
        conn.execute_batch(MIGRATIONS[0]).unwrap();
        conn.execute_batch("PRAGMA user_version = 1").unwrap();
    }

    #[test]
    fn a_version_3_store_keeps_its_timers_and_reservations_through_the_upgrade() {
        use miniflow_core::{Digest, IdempotencyKey, IdempotencyPolicy, IdempotencyStore};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v3.db");
        let conn = Connection::open(&path).unwrap();
        for sql in &MIGRATIONS[..3] {
            conn.execute_batch(sql).unwrap();
        }
        conn.execute_batch(
            "PRAGMA user_version = 3;
             INSERT INTO events VALUES ('w', 1, 'start', '{}', 5);
             INSERT INTO timers VALUES ('w:1:t0', 'w', 'deadline', 'timer_fired',
                 '{\"name\":\"deadline\",\"payload\":{},\"timer_id\":\"w:1:t0\"}', 50, 50,
                 'scheduled', 5, NULL);
             INSERT INTO timers VALUES ('w:1:t1', 'w', 'gone', 'timer_fired', '{}', 50, 50,
                 'cancelled', 5, 7);
             INSERT INTO idempotency VALUES ('k', '44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a',
                 10, NULL, NULL, 10);",
        )
        .unwrap();
        drop(conn);

        let store = SqliteStore::open(&path).unwrap();
        let timers = store.timers(&WorkflowId::new("w").unwrap()).unwrap();
        let states: Vec<_> = timers.iter().map(|t| (t.name.as_str(), t.status)).collect();
        assert_eq!(
            states,
            [
                ("deadline", miniflow_core::TimerStatus::Scheduled),
                ("gone", miniflow_core::TimerStatus::Cancelled)
            ]
        );
        drop(store);
        let policy = IdempotencyPolicy {
            retention: Duration::from_secs(3600),
            reservation_timeout: Duration::from_millis(100),
        };
        let mut keys = crate::SqliteIdempotencyStore::open(&path, policy).unwrap();
        let key = IdempotencyKey::new("k").unwrap();
        assert_eq!(keys.record(&key).unwrap().unwrap().token, 0);
        let digest = Digest::of(&serde_json::json!({}));
        let answer = keys
            .begin(&key, digest, Timestamp::from_millis(500))
            .unwrap();
        assert_eq!(answer, miniflow_core::Begin::Fresh { token: 500 });
    }

    fn refusal(path: &Path) -> String {
        match SqliteStore::open_read_only(path) {
            Err(e @ Error::InvalidInput { .. }) => e.to_string(),
            other => panic!("{} was not refused: {other:?}", path.display()),
        }
    }

    #[test]
    fn a_path_starting_with_file_is_a_file_name_not_a_uri() {
        assert_eq!(
            sqlite_path(Path::new("file:flow.db")),
            Path::new("./file:flow.db")
        );
        assert_eq!(
            sqlite_path(Path::new("file:flow.db?mode=memory")),
            Path::new("./file:flow.db?mode=memory")
        );
        assert_eq!(
            sqlite_path(Path::new("/srv/file:x.db")),
            Path::new("/srv/file:x.db")
        );
        assert_eq!(sqlite_path(Path::new("flow.db")), Path::new("flow.db"));
    }

    #[test]
    fn the_immutable_uri_keeps_the_path_a_path() {
        let uri = immutable_uri(Path::new("/srv/a b?mode=rw#x%.db")).unwrap();
        assert_eq!(
            uri,
            "file:/srv/a%20b%3Fmode%3Drw%23x%25.db?mode=ro&immutable=1"
        );
    }

    #[test]
    fn the_table_list_names_every_table_the_migrations_create() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path().join("flow.db")).unwrap();
        let mut tables: Vec<String> = store
            .conn
            .prepare("SELECT name FROM sqlite_schema WHERE type = 'table' ORDER BY name")
            .unwrap()
            .query_map([], |row| row.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let mut listed: Vec<&str> = TABLES.iter().map(|(name, _)| *name).collect();
        tables.sort();
        listed.sort_unstable();
        assert_eq!(tables, listed);
        assert!(TABLES.iter().all(|(_, v)| (1..=SCHEMA_VERSION).contains(v)));
    }

    #[test]
    fn reading_refuses_what_is_not_a_store_and_leaves_it_as_it_was() {
        let dir = tempfile::tempdir().unwrap();
        let path = |name: &str| dir.path().join(name);
        std::fs::write(path("empty.db"), b"").unwrap();
        std::fs::write(
            path("notes.txt"),
            b"not a database at all, longer than a header would be; \
            long enough to fill the hundred bytes SQLite's header takes up at the start",
        )
        .unwrap();
        Connection::open(path("foreign.db"))
            .unwrap()
            .execute_batch(
                "CREATE TABLE accounts (id INTEGER PRIMARY KEY); INSERT INTO accounts VALUES (1);",
            )
            .unwrap();
        Connection::open(path("lookalike.db"))
            .unwrap()
            .execute_batch("CREATE TABLE events (x); CREATE TABLE outbox (y);")
            .unwrap();
        Connection::open(path("blank.db"))
            .unwrap()
            .execute_batch("PRAGMA user_version = 0; VACUUM")
            .unwrap();
        version_1_store(&path("v1.db"));
        Connection::open(path("future.db"))
            .unwrap()
            .execute_batch("CREATE TABLE later (x); PRAGMA user_version = 99;")
            .unwrap();
        let before = snapshot(dir.path());

        for (name, says) in [
            ("missing.db", "the file does not exist"),
            ("empty.db", "is an empty file, not a miniflow store"),
            ("notes.txt", "is not a SQLite database"),
            (
                "foreign.db",
                "not a miniflow store (user_version 0, tables: accounts)",
            ),
            (
                "lookalike.db",
                "not a miniflow store (user_version 0, tables: events, outbox)",
            ),
        ] {
            let err = refusal(&path(name));
            assert!(err.contains(says), "{name}: {err}");
        }
        let err = refusal(&path("v1.db"));
        let says = format!("schema version 1, older than version {SCHEMA_VERSION}");
        assert!(err.contains(&says), "v1.db: {err}");
        assert!(refusal(&path("v1.db"))
            .contains(&format!("`miniflow migrate {}`", path("v1.db").display())));
        assert!(refusal(dir.path()).contains("is a directory"));
        assert!(matches!(
            SqliteStore::open_read_only(path("future.db")),
            Err(Error::UnsupportedSchema {
                found: 99,
                supported: SCHEMA_VERSION
            })
        ));
        assert_eq!(
            snapshot(dir.path()),
            before,
            "reading changed the directory"
        );
        assert_eq!(user_version(&path("v1.db")), 1);
    }

    #[test]
    fn writes_through_a_read_only_store_fail_and_change_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("flow.db");
        let mut store = SqliteStore::open(&path).unwrap();
        let commit = Commit::new(
            WorkflowId::new("w").unwrap(),
            Seq::ZERO,
            miniflow_core::Event::new("e", serde_json::json!({})),
            miniflow_core::Decision::new()
                .command(miniflow_core::Command::new("c", serde_json::json!({}))),
            Timestamp::from_millis(1),
        )
        .unwrap();
        store.append_with_commands(&commit).unwrap();
        drop(store);
        let bytes = std::fs::read(&path).unwrap();

        let mut store = SqliteStore::open_read_only(&path).unwrap();
        let id: CommandId = "w:1:0".parse().unwrap();
        let now = Timestamp::from_millis(10);
        assert_eq!(store.pending(10).unwrap().len(), 1);
        let again = Commit::new(
            WorkflowId::new("w").unwrap(),
            Seq::new(1).unwrap(),
            miniflow_core::Event::new("e", serde_json::json!({})),
            miniflow_core::Decision::none(),
            now,
        )
        .unwrap();
        let writes = [
            store.append_with_commands(&again).err(),
            store.claim(&ClaimRequest::new("w"), now).err(),
            store.mark_done(&id, now).err(),
            store.purge_done(Duration::ZERO, now, 10).err(),
        ];
        for err in writes {
            match err {
                Some(Error::Storage(e)) => assert!(e.to_string().contains("readonly"), "{e}"),
                other => panic!("a write through a read-only store gave {other:?}"),
            }
        }
        drop(store);
        assert_eq!(std::fs::read(&path).unwrap(), bytes);
    }

    #[test]
    fn migrate_upgrades_an_older_store_and_refuses_anything_else() {
        let dir = tempfile::tempdir().unwrap();
        let v1 = dir.path().join("v1.db");
        version_1_store(&v1);
        assert_eq!(SqliteStore::migrate(&v1).unwrap(), 1);
        assert_eq!(user_version(&v1), SCHEMA_VERSION);
        assert!(SqliteStore::open_read_only(&v1).is_ok());

        let bytes = std::fs::read(&v1).unwrap();
        assert_eq!(SqliteStore::migrate(&v1).unwrap(), SCHEMA_VERSION);
        assert_eq!(
            std::fs::read(&v1).unwrap(),
            bytes,
            "a current store is not written"
        );

        let foreign = dir.path().join("foreign.db");
        Connection::open(&foreign)
            .unwrap()
            .execute_batch("CREATE TABLE t (x)")
            .unwrap();
        let bytes = std::fs::read(&foreign).unwrap();
        assert!(matches!(
            SqliteStore::migrate(&foreign),
            Err(Error::InvalidInput { .. })
        ));
        assert!(SqliteStore::migrate(dir.path().join("missing.db")).is_err());
        assert!(!dir.path().join("missing.db").exists());
        assert_eq!(std::fs::read(&foreign).unwrap(), bytes);
    }
}

/// The columns of an [`OutboxRow`], in the order [`read_outbox_row`] reads them by name.
macro_rules! row_columns {
    () => {
        "workflow_id, event_seq, idx, kind, payload, status, attempts, last_error, available_at, \
         lease_owner, lease_expires_at, lease_token, created_at, processed_at, manual_retries, \
         resolution, report_result, result, cancel_requested"
    };
}

/// A `SELECT` of whole outbox rows followed by `$rest`.
macro_rules! select_rows {
    ($rest:literal) => {
        concat!("SELECT ", row_columns!(), " FROM outbox o ", $rest)
    };
}

/// `LIMIT -1`: no limit, for queries whose reader stops by itself.
const NO_LIMIT: i64 = -1;
const SELECT_ONE: &str = select_rows!("WHERE workflow_id = ?1 AND event_seq = ?2 AND idx = ?3");
const SELECT_PENDING: &str =
    select_rows!("WHERE processed_at IS NULL ORDER BY workflow_id, event_seq, idx LIMIT ?1");
const SELECT_UNFINISHED_OF_WORKFLOW: &str =
    select_rows!("WHERE workflow_id = ?1 AND processed_at IS NULL ORDER BY event_seq, idx");
const SELECT_WORKFLOW: &str = select_rows!("WHERE workflow_id = ?1 ORDER BY event_seq, idx");
const SELECT_DEAD: &str =
    select_rows!("WHERE status = 'dead' ORDER BY workflow_id, event_seq, idx LIMIT ?1");
/// A claim reads its candidates in pages, in claim order, each page after the key `(?3, ?4, ?5, ?6)` of
/// the last candidate it looked at (see [`claim_in`]).
const CLAIM_DUE_FIRST: &str = select_rows!(
    "WHERE processed_at IS NULL AND available_at <= ?1 \
     AND (available_at, workflow_id, event_seq, idx) > (?3, ?4, ?5, ?6) \
     ORDER BY available_at, workflow_id, event_seq, idx LIMIT ?2"
);
const ANY_COMMAND_DUE: &str =
    "SELECT EXISTS (SELECT 1 FROM outbox WHERE processed_at IS NULL AND available_at <= ?1)";
const CLAIM_STRICT: &str = select_rows!(
    "WHERE processed_at IS NULL AND available_at <= ?1 \
     AND (available_at, workflow_id, event_seq, idx) > (?3, ?4, ?5, ?6) \
     AND NOT EXISTS (SELECT 1 FROM outbox e WHERE e.workflow_id = o.workflow_id \
         AND e.processed_at IS NULL AND (e.event_seq, e.idx) < (o.event_seq, o.idx)) \
     ORDER BY available_at, workflow_id, event_seq, idx LIMIT ?2"
);

/// A stored value that cannot be read back (a damaged or hand-edited file, or a value an older version
/// wrote that this one cannot parse): its column, and why.
#[derive(Debug)]
struct Unreadable {
    column: String,
    reason: String,
}

impl std::fmt::Display for Unreadable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "column {} {}", self.column, self.reason)
    }
}

impl std::error::Error for Unreadable {}

fn column_name(row: &Row<'_>, column: usize) -> String {
    row.as_ref()
        .column_name(column)
        .map_or_else(|_| format!("#{column}"), str::to_owned)
}

/// The read error for a value in `column` of `row` that cannot be read, and why.
fn unreadable(row: &Row<'_>, column: usize, reason: impl std::fmt::Display) -> rusqlite::Error {
    rusqlite::Error::ToSqlConversionFailure(Box::new(Unreadable {
        column: column_name(row, column),
        reason: reason.to_string(),
    }))
}

/// Whether the error of reading `row` is a stored value that cannot be read (and which), or a driver
/// failure (returned as it is).
fn unreadable_value(row: &Row<'_>, e: rusqlite::Error) -> Result<Unreadable, rusqlite::Error> {
    let at = |column: usize, reason: String| Unreadable {
        column: column_name(row, column),
        reason,
    };
    match e {
        rusqlite::Error::ToSqlConversionFailure(inner) => inner
            .downcast::<Unreadable>()
            .map(|why| *why)
            .map_err(rusqlite::Error::ToSqlConversionFailure),
        rusqlite::Error::FromSqlConversionFailure(column, _, why) => {
            Ok(at(column, format!("cannot be read: {why}")))
        }
        rusqlite::Error::InvalidColumnType(column, _, found) => {
            Ok(at(column, format!("holds a value of type {found}")))
        }
        rusqlite::Error::IntegralValueOutOfRange(column, value) => {
            Ok(at(column, format!("holds {value}, out of range")))
        }
        rusqlite::Error::Utf8Error(column, why) => Ok(at(column, format!("is not UTF-8: {why}"))),
        other => Err(other),
    }
}

/// A row a query found but cannot read whole: which row (e.g. `command w:1:0`), and why.
#[derive(Debug)]
struct UnreadableRow {
    row: String,
    why: Unreadable,
}

impl UnreadableRow {
    fn into_error(self) -> Error {
        Error::Corrupt(format!("{}: {}", self.row, self.why))
    }
}

/// Steps through the rows `sql` selects: `visit` gets each one read by `read`, or, for a row holding a
/// value that cannot be read, the [`UnreadableRow`] that `name` names; it says whether to go on.
fn each_row<T>(
    conn: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
    read: impl Fn(&Row<'_>) -> rusqlite::Result<T>,
    name: impl Fn(&Row<'_>) -> String,
    mut visit: impl FnMut(Result<T, UnreadableRow>) -> Result<bool, Error>,
) -> Result<(), Error> {
    let mut stmt = conn.prepare_cached(sql).map_err(storage)?;
    let mut rows = stmt.query(params).map_err(storage)?;
    while let Some(row) = rows.next().map_err(storage)? {
        let item = match read(row) {
            Ok(value) => Ok(value),
            Err(e) => Err(UnreadableRow {
                row: name(row),
                why: unreadable_value(row, e).map_err(storage)?,
            }),
        };
        if !visit(item)? {
            break;
        }
    }
    Ok(())
}

/// Every row `sql` selects; one that cannot be read is [`Error::Corrupt`] naming it and its column.
fn read_all<T>(
    conn: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
    read: impl Fn(&Row<'_>) -> rusqlite::Result<T>,
    name: impl Fn(&Row<'_>) -> String,
) -> Result<Vec<T>, Error> {
    let mut out = Vec::new();
    each_row(conn, sql, params, read, name, |item| {
        out.push(item.map_err(UnreadableRow::into_error)?);
        Ok(true)
    })?;
    Ok(out)
}

/// Up to `limit` rows of `sql` that can be read, skipping those that cannot: one damaged row must not
/// hide every other (DESIGN rule 13). `sql` takes no limit of its own (`LIMIT -1`).
fn read_readable<T>(
    conn: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
    read: impl Fn(&Row<'_>) -> rusqlite::Result<T>,
    limit: usize,
) -> Result<Vec<T>, Error> {
    let skip = |_: &Row<'_>| None;
    Ok(read_listing(conn, sql, params, read, skip, limit)?.0)
}

/// Up to `limit` rows of `sql`, the ones that read and the ones that do not. `name` names an
/// unreadable row to report it (counted in `limit`), or returns `None` to skip it (not counted).
fn read_listing<T>(
    conn: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
    read: impl Fn(&Row<'_>) -> rusqlite::Result<T>,
    name: impl Fn(&Row<'_>) -> Option<UnreadableCommand>,
    limit: usize,
) -> Result<(Vec<T>, Vec<UnreadableCommand>), Error> {
    let (mut rows, mut unreadable) = (Vec::new(), Vec::new());
    if limit == 0 {
        return Ok((rows, unreadable));
    }
    let mut stmt = conn.prepare_cached(sql).map_err(storage)?;
    let mut cursor = stmt.query(params).map_err(storage)?;
    while let Some(row) = cursor.next().map_err(storage)? {
        match read(row) {
            Ok(value) => rows.push(value),
            Err(e) => {
                let why = unreadable_value(row, e).map_err(storage)?;
                if let Some(named) = name(row) {
                    unreadable.push(UnreadableCommand {
                        error: why.to_string(),
                        ..named
                    });
                }
            }
        }
        if rows.len() + unreadable.len() >= limit {
            break;
        }
    }
    Ok((rows, unreadable))
}

/// An outbox row that a listing found but cannot read (a damaged file, or a value an older version
/// wrote): what is known of it, as stored, and why it cannot be read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct UnreadableCommand {
    /// Its ID as stored (`workflow_id:event_seq:idx`).
    pub command_id: String,
    /// Its stored status.
    pub status: String,
    /// Why it cannot be read, naming the column.
    pub error: String,
}

/// The raw ID and status of an outbox row, whatever the rest of it holds.
fn name_unreadable(row: &Row<'_>) -> Option<UnreadableCommand> {
    let raw = |column: usize| match row.get_ref(column) {
        Ok(ValueRef::Text(t)) => String::from_utf8_lossy(t).into_owned(),
        Ok(ValueRef::Integer(i)) => i.to_string(),
        Ok(other) => format!("{other:?}"),
        Err(e) => format!("({e})"),
    };
    Some(UnreadableCommand {
        command_id: format!(
            "{}:{}:{}",
            raw(col::WORKFLOW_ID),
            raw(col::EVENT_SEQ),
            raw(col::IDX)
        ),
        status: raw(col::STATUS),
        error: String::new(),
    })
}

/// What an operator's listing shows: the rows that read, and apart from them the ones that do not.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct Listing {
    /// The rows that read, in the listing's order.
    pub rows: Vec<OutboxRow>,
    /// The rows among the first `limit` that cannot be read.
    pub unreadable: Vec<UnreadableCommand>,
}

impl SqliteStore {
    /// As [`Outbox::pending`], with the unreadable rows among the first `limit` reported apart instead
    /// of skipped (for operators' tools).
    ///
    /// # Errors
    ///
    /// [`Error::Storage`] when the file cannot be read at all.
    pub fn pending_listing(&self, limit: usize) -> Result<Listing, Error> {
        self.listing(SELECT_PENDING, limit)
    }

    /// As [`Operations::dead_letters`], with the unreadable rows among the first `limit` reported apart.
    ///
    /// # Errors
    ///
    /// [`Error::Storage`] when the file cannot be read at all.
    pub fn dead_listing(&self, limit: usize) -> Result<Listing, Error> {
        self.listing(SELECT_DEAD, limit)
    }

    fn listing(&self, sql: &str, limit: usize) -> Result<Listing, Error> {
        let (rows, unreadable) = read_listing(
            &self.conn,
            sql,
            [NO_LIMIT],
            read_outbox_row,
            name_unreadable,
            limit,
        )?;
        Ok(Listing { rows, unreadable })
    }
}

/// Column positions of [`row_columns!`].
mod col {
    pub const WORKFLOW_ID: usize = 0;
    pub const EVENT_SEQ: usize = 1;
    pub const IDX: usize = 2;
    pub const KIND: usize = 3;
    pub const PAYLOAD: usize = 4;
    pub const STATUS: usize = 5;
    pub const ATTEMPTS: usize = 6;
    pub const LAST_ERROR: usize = 7;
    pub const AVAILABLE_AT: usize = 8;
    pub const LEASE_OWNER: usize = 9;
    pub const LEASE_EXPIRES_AT: usize = 10;
    pub const LEASE_TOKEN: usize = 11;
    pub const CREATED_AT: usize = 12;
    pub const PROCESSED_AT: usize = 13;
    pub const MANUAL_RETRIES: usize = 14;
    pub const RESOLUTION: usize = 15;
    pub const REPORT_RESULT: usize = 16;
    pub const RESULT: usize = 17;
    pub const CANCEL_REQUESTED: usize = 18;
}

fn read_text<'r>(row: &'r Row<'_>, column: usize) -> rusqlite::Result<&'r str> {
    row.get_ref(column)?
        .as_str()
        .map_err(|e| unreadable(row, column, format!("is not text: {e}")))
}

fn read_time(row: &Row<'_>, column: usize) -> rusqlite::Result<Timestamp> {
    let millis: i64 = row.get(column)?;
    u64::try_from(millis)
        .map(Timestamp::from_millis)
        .map_err(|_| unreadable(row, column, format!("holds the negative time {millis}")))
}

fn read_optional_time(row: &Row<'_>, column: usize) -> rusqlite::Result<Option<Timestamp>> {
    match row.get::<_, Option<i64>>(column)? {
        Some(_) => read_time(row, column).map(Some),
        None => Ok(None),
    }
}

fn read_json(row: &Row<'_>, column: usize) -> rusqlite::Result<serde_json::Value> {
    serde_json::from_str(read_text(row, column)?)
        .map_err(|e| unreadable(row, column, format!("cannot be read as JSON: {e}")))
}

fn read_command_id(row: &Row<'_>) -> rusqlite::Result<CommandId> {
    let workflow_id = WorkflowId::new(read_text(row, col::WORKFLOW_ID)?)
        .map_err(|e| unreadable(row, col::WORKFLOW_ID, e))?;
    let seq = u64::try_from(row.get::<_, i64>(col::EVENT_SEQ)?).unwrap_or(u64::MAX);
    let seq = Seq::new(seq).map_err(|e| unreadable(row, col::EVENT_SEQ, e))?;
    let index = u32::try_from(row.get::<_, i64>(col::IDX)?).unwrap_or(u32::MAX);
    CommandId::new(workflow_id, seq, index).map_err(|e| unreadable(row, col::IDX, e))
}

/// What `column` holds, whatever it is: for messages about a row that cannot be read.
fn raw_text(row: &Row<'_>, column: usize) -> String {
    match row.get_ref(column) {
        Ok(ValueRef::Text(text)) => String::from_utf8_lossy(text).into_owned(),
        Ok(ValueRef::Integer(n)) => n.to_string(),
        Ok(other) => format!("{other:?}"),
        Err(_) => "?".to_owned(),
    }
}

/// The command ID an outbox row's key columns spell, whatever they hold.
fn raw_command_id(row: &Row<'_>) -> String {
    format!(
        "command {}:{}:{}",
        raw_text(row, col::WORKFLOW_ID),
        raw_text(row, col::EVENT_SEQ),
        raw_text(row, col::IDX)
    )
}

fn read_outbox_row(row: &Row<'_>) -> rusqlite::Result<OutboxRow> {
    let lease = match row.get::<_, Option<String>>(col::LEASE_OWNER)? {
        Some(owner) => Some(Lease {
            owner,
            expires_at: read_time(row, col::LEASE_EXPIRES_AT)?,
            token: row.get::<_, i64>(col::LEASE_TOKEN)? as u64,
        }),
        None => None,
    };
    Ok(OutboxRow {
        command_id: read_command_id(row)?,
        kind: row.get(col::KIND)?,
        payload: read_json(row, col::PAYLOAD)?,
        status: read_text(row, col::STATUS)?
            .parse()
            .map_err(|e| unreadable(row, col::STATUS, e))?,
        attempts: row.get(col::ATTEMPTS)?,
        last_error: row.get(col::LAST_ERROR)?,
        available_at: read_time(row, col::AVAILABLE_AT)?,
        lease,
        created_at: read_time(row, col::CREATED_AT)?,
        processed_at: read_optional_time(row, col::PROCESSED_AT)?,
        manual_retries: row.get(col::MANUAL_RETRIES)?,
        resolution: row.get(col::RESOLUTION)?,
        report_result: row.get(col::REPORT_RESULT)?,
        result: match row.get_ref(col::RESULT)? {
            ValueRef::Null => None,
            _ => Some(read_json(row, col::RESULT)?),
        },
        cancel_requested: row.get(col::CANCEL_REQUESTED)?,
    })
}

/// Every outbox row `sql` selects; one that cannot be read is [`Error::Corrupt`] naming the command and
/// the column.
fn query_rows(
    conn: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
) -> Result<Vec<OutboxRow>, Error> {
    read_all(conn, sql, params, read_outbox_row, raw_command_id)
}

fn id_params(id: &CommandId) -> (&str, i64, i64) {
    (
        id.workflow_id().as_str(),
        id.event_seq().get() as i64,
        i64::from(id.index()),
    )
}

fn select_row(conn: &Connection, id: &CommandId) -> Result<Option<OutboxRow>, Error> {
    let (w, s, i) = id_params(id);
    Ok(query_rows(conn, SELECT_ONE, params![w, s, i])?.pop())
}

/// Writes back every column an [`OutboxRow`] method may change.
fn write_row(conn: &Connection, row: &OutboxRow) -> Result<(), Error> {
    let (w, s, i) = id_params(&row.command_id);
    let lease = row.lease.as_ref();
    let lease_expires_at = lease
        .map(|l| to_sql_time("lease_expires_at", l.expires_at))
        .transpose()?;
    let processed_at = row
        .processed_at
        .map(|t| to_sql_time("processed_at", t))
        .transpose()?;
    let available_at = to_sql_time("available_at", row.available_at)?;
    let token = to_sql_u64("lease_token", row.token())?;
    let mut stmt = conn
        .prepare_cached(
            "UPDATE outbox SET status = ?4, attempts = ?5, last_error = ?6, available_at = ?7, \
             lease_owner = ?8, lease_expires_at = ?9, lease_token = ?10, processed_at = ?11, \
             manual_retries = ?12, resolution = ?13, result = ?14, cancel_requested = ?15 \
             WHERE workflow_id = ?1 AND event_seq = ?2 AND idx = ?3",
        )
        .map_err(storage)?;
    stmt.execute(params![
        w,
        s,
        i,
        row.status.as_str(),
        row.attempts,
        row.last_error,
        available_at,
        lease.map(|l| l.owner.as_str()),
        lease_expires_at,
        token,
        processed_at,
        row.manual_retries,
        row.resolution,
        row.result.as_ref().map(canonical_json),
        row.cancel_requested,
    ])
    .map_err(storage)?;
    Ok(())
}

/// Writes the columns a claim changes: the hot path of [`Outbox::claim`].
fn write_lease(conn: &Connection, row: &OutboxRow) -> Result<(), Error> {
    let (w, s, i) = id_params(&row.command_id);
    let lease = row.lease.as_ref().ok_or_else(|| {
        Error::Corrupt(format!("claimed command {} has no lease", row.command_id))
    })?;
    let expires_at = to_sql_time("lease_expires_at", lease.expires_at)?;
    conn.prepare_cached(
        "UPDATE outbox SET status = 'leased', attempts = ?4, available_at = ?5, lease_owner = ?6, \
         lease_expires_at = ?5, lease_token = ?7 WHERE workflow_id = ?1 AND event_seq = ?2 AND idx = ?3",
    )
    .and_then(|mut stmt| {
        stmt.execute(params![
            w,
            s,
            i,
            row.attempts,
            expires_at,
            lease.owner,
            token_param(lease.token)
        ])
    })
    .map_err(storage)?;
    Ok(())
}

/// A token as an SQL parameter; a token too large to store matches no lease.
fn token_param(token: u64) -> i64 {
    i64::try_from(token).unwrap_or(-1)
}

/// An acknowledgement. The fast path is one `UPDATE` guarded by the lease, for a command that feeds
/// nothing back; on a miss, the row is read: a command that reports its completion is settled by the
/// shared rule ([`OutboxRow::complete`]) with its feedback, and anything else is explained by
/// [`OutboxRow::check_lease`].
fn complete_in(
    conn: &Connection,
    id: &CommandId,
    token: u64,
    result: Option<&serde_json::Value>,
    now: Timestamp,
) -> Result<(), Error> {
    let (w, s, i) = id_params(id);
    if let Some(result) = result {
        miniflow_core::JsonLimits::default().check("result", result)?;
    }
    let now_sql = to_sql_time("now", now)?;
    let changed = conn
        .prepare_cached(
            "UPDATE outbox SET status = 'done', processed_at = ?5, result = ?6 \
             WHERE workflow_id = ?1 AND event_seq = ?2 AND idx = ?3 \
             AND status = 'leased' AND lease_token = ?4 \
             AND report_result = 0 AND cancel_requested = 0",
        )
        .and_then(|mut stmt| {
            stmt.execute(params![
                w,
                s,
                i,
                token_param(token),
                now_sql,
                result.map(canonical_json)
            ])
        })
        .map_err(storage)?;
    if changed == 1 {
        return Ok(());
    }
    let row = select_row(conn, id)?.ok_or_else(|| Error::UnknownCommand {
        command_id: id.clone(),
    })?;
    let changed = row.change(now, |row| row.complete(token, result, now))?;
    if !changed.row.reports_completion() {
        return Err(Error::Corrupt(format!(
            "command {id} holds lease {token} but did not complete"
        )));
    }
    write_change(conn, &changed)
}

/// The events of `workflow_id` in seq order, as `conn` sees them.
fn load_events(conn: &Connection, workflow_id: &WorkflowId) -> Result<Vec<EventRecord>, Error> {
    let read = |row: &Row<'_>| {
        let seq: i64 = row.get(0)?;
        Ok(EventRecord {
            workflow_id: workflow_id.clone(),
            seq: u64::try_from(seq)
                .ok()
                .and_then(|s| Seq::new(s).ok())
                .ok_or_else(|| unreadable(row, 0, format!("holds {seq}, out of range")))?,
            kind: row.get(1)?,
            payload: read_json(row, 2)?,
            recorded_at: read_time(row, 3)?,
        })
    };
    let name = |row: &Row<'_>| format!("event {workflow_id}#{}", raw_text(row, 0));
    read_all(
        conn,
        "SELECT seq, kind, payload, recorded_at FROM events WHERE workflow_id = ?1 ORDER BY seq",
        [workflow_id.as_str()],
        read,
        name,
    )
}

/// Runs `write` inside a savepoint of the caller's transaction: on an error the savepoint is rolled
/// back, so nothing of the write stays, and the caller's own writes are left as they were.
pub(crate) fn in_savepoint<T>(
    conn: &Connection,
    write: impl FnOnce(&Connection) -> Result<T, Error>,
) -> Result<T, Error> {
    conn.execute_batch("SAVEPOINT miniflow_write")
        .map_err(storage)?;
    match write(conn) {
        Ok(out) => {
            conn.execute_batch("RELEASE miniflow_write")
                .map_err(storage)?;
            Ok(out)
        }
        Err(e) => {
            // Rolling back can only fail if the connection is gone; the error that matters is `e`.
            let _ = conn.execute_batch("ROLLBACK TO miniflow_write; RELEASE miniflow_write");
            Err(e)
        }
    }
}

/// Writes `commit` on `tx`, which the caller has opened and will commit or roll back (see
/// [`EventLog::append_with_commands`] for what is written, and [`SqliteStore::append_in`]).
fn write_commit(tx: &Connection, commit: &Commit) -> Result<(), Error> {
    let workflow_id = commit.workflow_id().as_str();
    let actual: i64 = tx
        .prepare_cached("SELECT COALESCE(MAX(seq), 0) FROM events WHERE workflow_id = ?1")
        .and_then(|mut stmt| stmt.query_row([workflow_id], |row| row.get(0)))
        .map_err(storage)?;
    let actual = Seq::new(actual as u64)?;
    if actual != commit.expected_seq() {
        return Err(commit.conflict(actual));
    }
    {
        let mut insert_event = tx
            .prepare_cached(
                "INSERT INTO events (workflow_id, seq, kind, payload, recorded_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5)",
            )
            .map_err(storage)?;
        for event in commit.events() {
            insert_event
                .execute(params![
                    workflow_id,
                    event.seq.get() as i64,
                    event.kind,
                    canonical_json(&event.payload),
                    to_sql_time("now", event.recorded_at)?,
                ])
                .map_err(|e| match e.sqlite_error_code() {
                    Some(ErrorCode::ConstraintViolation) => commit.conflict(actual),
                    _ => storage(e),
                })?;
        }
        let mut insert_command = tx
            .prepare_cached(
                "INSERT INTO outbox (workflow_id, event_seq, idx, kind, payload, status, \
                 available_at, created_at, report_result) \
                 VALUES (?1, ?2, ?3, ?4, ?5, 'pending', ?6, ?6, ?7)",
            )
            .map_err(storage)?;
        if let Some(timer_id) = commit.fires() {
            fire_timer(tx, timer_id, commit.now())?;
        }
        cancel_commands(tx, commit)?;
        for row in commit.commands() {
            insert_command
                .execute(params![
                    workflow_id,
                    row.command_id.event_seq().get() as i64,
                    i64::from(row.command_id.index()),
                    row.kind,
                    canonical_json(&row.payload),
                    to_sql_time("now", row.created_at)?,
                    row.report_result,
                ])
                .map_err(storage)?;
        }
        cancel_timers(tx, commit)?;
        for timer in commit.timers() {
            insert_timer(tx, timer)?;
        }
    }
    Ok(())
}

/// Withdraws the unfinished commands of `commit`'s workflow that it cancels, by the shared rule
/// ([`OutboxRow::cancel`]).
fn cancel_commands(conn: &Connection, commit: &Commit) -> Result<(), Error> {
    if commit.cancel_commands().is_empty() {
        return Ok(());
    }
    let rows = query_rows(
        conn,
        SELECT_UNFINISHED_OF_WORKFLOW,
        [commit.workflow_id().as_str()],
    )?;
    for mut row in rows.into_iter().filter(|row| commit.cancels(row)) {
        if row.cancel(commit.now()) != Cancelled::Unchanged {
            write_row(conn, &row)?;
        }
    }
    Ok(())
}

const TIMER_COLUMNS: &str = "timer_id, name, event_kind, event_payload, fire_at, available_at, \
     status, created_at, processed_at, last_error";

/// A `SELECT` of whole timer rows followed by `$rest`.
macro_rules! select_timers {
    ($rest:literal) => {
        concat!(
            "SELECT timer_id, name, event_kind, event_payload, fire_at, available_at, status, \
             created_at, processed_at, last_error FROM timers ",
            $rest
        )
    };
}

const CLAIM_TIMERS: &str = select_timers!(
    "WHERE processed_at IS NULL AND available_at <= ?1 ORDER BY available_at, timer_id LIMIT ?2"
);
const SELECT_WORKFLOW_TIMERS: &str = select_timers!("WHERE workflow_id = ?1 ORDER BY timer_id");
const ANY_TIMER_DUE: &str =
    "SELECT EXISTS (SELECT 1 FROM timers WHERE processed_at IS NULL AND available_at <= ?1)";
const SELECT_TIMER: &str = select_timers!("WHERE timer_id = ?1");
const CANCEL_TIMERS: &str = "UPDATE timers SET status = 'cancelled', processed_at = ?3 \
     WHERE workflow_id = ?1 AND name = ?2 AND processed_at IS NULL";
/// The oldest done rows first (the order of `outbox_done`, whose entries end with the primary key).
const PURGE_DONE: &str = "DELETE FROM outbox WHERE (workflow_id, event_seq, idx) IN \
     (SELECT workflow_id, event_seq, idx FROM outbox \
      WHERE status IN ('done', 'cancelled') AND processed_at <= ?1 \
      ORDER BY processed_at, workflow_id, event_seq, idx LIMIT ?2)";

fn read_timer(row: &Row<'_>) -> rusqlite::Result<TimerRow> {
    let parse_status = |text: &str| text.parse().map_err(|e| unreadable(row, 6, e));
    Ok(TimerRow {
        timer_id: read_text(row, 0)?
            .parse()
            .map_err(|e| unreadable(row, 0, e))?,
        name: row.get(1)?,
        event_kind: row.get(2)?,
        event_payload: read_json(row, 3)?,
        fire_at: read_time(row, 4)?,
        available_at: read_time(row, 5)?,
        status: parse_status(read_text(row, 6)?)?,
        created_at: read_time(row, 7)?,
        processed_at: read_optional_time(row, 8)?,
        last_error: row.get(9)?,
    })
}

/// Every timer `sql` selects; one that cannot be read is [`Error::Corrupt`] naming it and the column.
fn query_timers(
    conn: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
) -> Result<Vec<TimerRow>, Error> {
    read_all(conn, sql, params, read_timer, |row| {
        format!("timer {}", raw_text(row, 0))
    })
}

/// Times come from `Timestamp`s already checked on the way in; clamp rather than fail.
fn to_sql_time_lossy(t: Timestamp) -> i64 {
    i64::try_from(t.as_millis()).unwrap_or(i64::MAX)
}

fn insert_timer(conn: &Connection, timer: &TimerRow) -> Result<(), Error> {
    let sql = format!(
        "INSERT INTO timers (workflow_id, {TIMER_COLUMNS}) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)"
    );
    let processed_at = timer
        .processed_at
        .map(|t| to_sql_time("processed_at", t))
        .transpose()?;
    let fire_at = to_sql_time("fire_at", timer.fire_at)?;
    let available_at = to_sql_time("available_at", timer.available_at)?;
    let created_at = to_sql_time("now", timer.created_at)?;
    conn.prepare_cached(&sql)
        .and_then(|mut stmt| {
            stmt.execute(params![
                timer.timer_id.workflow_id().as_str(),
                timer.timer_id.to_string(),
                timer.name,
                timer.event_kind,
                canonical_json(&timer.event_payload),
                fire_at,
                available_at,
                timer.status.as_str(),
                created_at,
                processed_at,
                timer.last_error,
            ])
        })
        .map_err(storage)?;
    Ok(())
}

/// Marks the timer a commit fires as fired, by the shared rule ([`TimerRow::fire`]).
fn fire_timer(conn: &Connection, timer_id: &TimerId, now: Timestamp) -> Result<(), Error> {
    let mut timer = query_timers(conn, SELECT_TIMER, [timer_id.to_string()])?
        .pop()
        .ok_or_else(|| Error::TimerNotScheduled {
            timer_id: timer_id.to_string(),
            status: "unknown",
        })?;
    timer.fire(now)?;
    conn.prepare_cached(
        "UPDATE timers SET status = 'fired', processed_at = ?2 WHERE timer_id = ?1",
    )
    .and_then(|mut stmt| stmt.execute(params![timer_id.to_string(), to_sql_time_lossy(now)]))
    .map_err(storage)?;
    Ok(())
}

fn cancel_timers(conn: &Connection, commit: &Commit) -> Result<(), Error> {
    let now = to_sql_time("now", commit.now())?;
    for name in commit.cancel_timers() {
        conn.prepare_cached(CANCEL_TIMERS)
            .and_then(|mut stmt| stmt.execute(params![commit.workflow_id().as_str(), name, now]))
            .map_err(storage)?;
    }
    Ok(())
}

/// Writes a row change the core computed and the feedback it schedules, in the caller's transaction.
fn write_change<T>(conn: &Connection, changed: &Changed<T>) -> Result<(), Error> {
    write_row(conn, &changed.row)?;
    match &changed.feedback {
        Some(timer) => insert_timer(conn, timer),
        None => Ok(()),
    }
}

/// A command a claim looked at: its key in claim order, and its row, or what the claim needs to bury
/// a row that cannot be read.
struct Candidate {
    /// `(available_at, workflow_id, event_seq, idx)` as stored.
    key: [SqlValue; 4],
    row: Result<OutboxRow, Unclaimable>,
}

/// A candidate that cannot be read: why, and what could be read of it (see [`salvage`]).
struct Unclaimable {
    why: UnreadableRow,
    salvaged: Option<OutboxRow>,
}

impl Candidate {
    fn read(row: &Row<'_>) -> rusqlite::Result<Self> {
        let key = [
            col::AVAILABLE_AT,
            col::WORKFLOW_ID,
            col::EVENT_SEQ,
            col::IDX,
        ]
        .map(|column| row.get::<_, SqlValue>(column).unwrap_or(SqlValue::Null));
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
        Ok(Self { key, row })
    }

    /// The command and its workflow as stored, to recognise a candidate seen before.
    fn identity(&self) -> (String, String) {
        let [_, workflow_id, event_seq, idx] = &self.key;
        let workflow_id = match workflow_id {
            SqlValue::Text(text) => text.clone(),
            other => format!("{other:?}"),
        };
        (format!("{workflow_id}:{event_seq:?}:{idx:?}"), workflow_id)
    }
}

/// What can be read of an outbox row that cannot be read whole, for its failure feedback: the columns
/// that read, a null payload, and empty values for the others; `None` when its key columns do not
/// spell a command ID (then there is no workflow to tell).
fn salvage(row: &Row<'_>) -> Option<OutboxRow> {
    Some(OutboxRow {
        command_id: read_command_id(row).ok()?,
        kind: row.get(col::KIND).unwrap_or_default(),
        payload: serde_json::Value::Null,
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
    })
}

/// Leases up to `request.limit` commands inside `tx`, going through the commands claimable at `now` in
/// claim order as they stood when the claim began, like every store (see [`OutboxRow::claim`]).
///
/// Two kinds of candidate are buried on the way and do not count towards the limit: a lease that ran
/// out on its last allowed attempt, and a row that cannot be read (DESIGN rule 13, see
/// [`bury_unreadable`]). So the claim reads on, a page of what it still needs at a time, after the last
/// candidate it looked at.
fn claim_in(
    tx: &Transaction<'_>,
    request: &ClaimRequest,
    now: Timestamp,
) -> Result<Vec<Delivery>, Error> {
    let sql = match request.order {
        ClaimOrder::DueFirst => CLAIM_DUE_FIRST,
        ClaimOrder::StrictPerWorkflow => CLAIM_STRICT,
    };
    let now_sql = to_sql_time("now", now)?;
    let mut after = [
        SqlValue::Integer(i64::MIN),
        SqlValue::Text(String::new()),
        SqlValue::Integer(i64::MIN),
        SqlValue::Integer(i64::MIN),
    ];
    // What this claim already looked at. A lease shorter than a millisecond leaves a claimed command
    // due, and in strict order a burial lets the next command of its workflow qualify: neither was a
    // candidate when the claim began, so neither is taken now.
    let mut seen: HashSet<String> = HashSet::new();
    let mut seen_workflows: HashSet<String> = HashSet::new();
    let mut deliveries = Vec::new();
    while deliveries.len() < request.limit {
        let wanted = request.limit - deliveries.len();
        let mut page = Vec::with_capacity(wanted);
        let [a, w, s, i] = &after;
        each_row(
            tx,
            sql,
            params![now_sql, limit(wanted), a, w, s, i],
            Candidate::read,
            |_| String::new(),
            |candidate| {
                page.push(candidate.map_err(UnreadableRow::into_error)?);
                Ok(true)
            },
        )?;
        let full_page = page.len() == wanted;
        for candidate in page {
            let (command, workflow) = candidate.identity();
            after = candidate.key;
            let first_look = match request.order {
                ClaimOrder::DueFirst => seen.insert(command),
                ClaimOrder::StrictPerWorkflow => seen_workflows.insert(workflow),
            };
            if !first_look {
                continue;
            }
            match candidate.row {
                Ok(row) => {
                    let changed = row.change(now, |row| Ok(row.claim(request, now)))?;
                    match &changed.value {
                        Some(delivery) => {
                            write_lease(tx, &changed.row)?;
                            deliveries.push(delivery.clone());
                        }
                        None => write_change(tx, &changed)?,
                    }
                }
                Err(unclaimable) => bury_unreadable(tx, &after, unclaimable, now)?,
            }
        }
        if !full_page {
            break;
        }
    }
    Ok(deliveries)
}

/// Buries a claim candidate that cannot be read, inside the claim's transaction, so that it stops no
/// other delivery (DESIGN rule 13): dead, `last_error` naming the column and the reason, processed at
/// `now`, and its `command_failed` feedback scheduled like any dead command's, built from the columns
/// that could be read. Its other columns stay as they are, for whoever repairs it.
fn bury_unreadable(
    tx: &Transaction<'_>,
    key: &[SqlValue; 4],
    unclaimable: Unclaimable,
    now: Timestamp,
) -> Result<(), Error> {
    let reason = format!(
        "the stored command could not be read: {}",
        unclaimable.why.why
    );
    let [_, workflow_id, event_seq, idx] = key;
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
        "UPDATE outbox SET status = ?4, last_error = ?5, processed_at = ?6 \
         WHERE workflow_id = ?1 AND event_seq = ?2 AND idx = ?3",
    )
    .and_then(|mut stmt| {
        stmt.execute(params![
            workflow_id,
            event_seq,
            idx,
            status.as_str(),
            last_error,
            processed_at
        ])
    })
    .map_err(storage)?;
    match feedback {
        // A count of manual retries that could not be read may name a failure already reported.
        Some(timer) if !timer_exists(tx, &timer.timer_id)? => insert_timer(tx, &timer),
        _ => Ok(()),
    }
}

fn timer_exists(conn: &Connection, timer_id: &TimerId) -> Result<bool, Error> {
    conn.prepare_cached("SELECT EXISTS (SELECT 1 FROM timers WHERE timer_id = ?1)")
        .and_then(|mut stmt| stmt.query_row([timer_id.to_string()], |row| row.get(0)))
        .map_err(storage)
}

impl EventLog for SqliteStore {
    fn load(&self, workflow_id: &WorkflowId) -> Result<Vec<EventRecord>, Error> {
        load_events(&self.conn, workflow_id)
    }
    fn append_with_commands(&mut self, commit: &Commit) -> Result<(), Error> {
        let tx = self.write()?;
        write_commit(&tx, commit)?;
        tx.commit().map_err(storage)
    }
}

impl Outbox for SqliteStore {
    /// Skips rows that cannot be read (DESIGN rule 13): a claim buries them when they are due.
    fn pending(&self, limit_rows: usize) -> Result<Vec<OutboxRow>, Error> {
        read_readable(
            &self.conn,
            SELECT_PENDING,
            [NO_LIMIT],
            read_outbox_row,
            limit_rows,
        )
    }
    fn command(&self, command_id: &CommandId) -> Result<Option<OutboxRow>, Error> {
        select_row(&self.conn, command_id)
    }
    fn commands(&self, workflow_id: &WorkflowId) -> Result<Vec<OutboxRow>, Error> {
        query_rows(&self.conn, SELECT_WORKFLOW, [workflow_id.as_str()])
    }
    fn mark_done(&mut self, command_id: &CommandId, now: Timestamp) -> Result<(), Error> {
        self.update(command_id, now, |row| row.mark_done(now))
    }
    fn claim(&mut self, request: &ClaimRequest, now: Timestamp) -> Result<Vec<Delivery>, Error> {
        request.validate()?;
        if !self.any_due(ANY_COMMAND_DUE, now)? {
            return Ok(Vec::new());
        }
        let tx = self.write()?;
        let deliveries = claim_in(&tx, request, now)?;
        tx.commit().map_err(storage)?;
        Ok(deliveries)
    }
    fn extend(
        &mut self,
        command_id: &CommandId,
        token: u64,
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Extended, Error> {
        self.update(command_id, now, |row| row.extend(token, ttl, now))
    }
    fn release(&mut self, command_id: &CommandId, token: u64, now: Timestamp) -> Result<(), Error> {
        self.update(command_id, now, |row| row.release(token, now))
    }
    fn complete(
        &mut self,
        command_id: &CommandId,
        token: u64,
        result: Option<&serde_json::Value>,
        now: Timestamp,
    ) -> Result<(), Error> {
        let tx = self.write()?;
        complete_in(&tx, command_id, token, result, now)?;
        tx.commit().map_err(storage)
    }
    /// All acks in one `BEGIN IMMEDIATE` transaction: one fsync for the batch. The results are returned
    /// only after the commit, so a reported completion is durable.
    fn complete_all(
        &mut self,
        acks: &[Ack],
        now: Timestamp,
    ) -> Result<Vec<Result<(), Error>>, Error> {
        let tx = self.write()?;
        let mut results = Vec::with_capacity(acks.len());
        for ack in acks {
            let completed = complete_in(&tx, &ack.command_id, ack.token, ack.result.as_ref(), now);
            results.push(match completed {
                Err(e @ (Error::Storage(_) | Error::Busy(_))) => return Err(e),
                other => other,
            });
        }
        tx.commit().map_err(storage)?;
        Ok(results)
    }
    fn fail(
        &mut self,
        command_id: &CommandId,
        token: u64,
        failure: &Failure,
        policy: &RetryPolicy,
        now: Timestamp,
    ) -> Result<Settled, Error> {
        self.update(command_id, now, |row| row.fail(token, failure, policy, now))
    }
}

impl Timers for SqliteStore {
    fn claim_timers(
        &mut self,
        limit_rows: usize,
        lease_ttl: Duration,
        now: Timestamp,
    ) -> Result<Vec<TimerRow>, Error> {
        if !self.any_due(ANY_TIMER_DUE, now)? {
            return Ok(Vec::new());
        }
        let tx = self.write()?;
        let mut timers = Vec::new();
        let mut unreadable = Vec::new();
        each_row(
            &tx,
            CLAIM_TIMERS,
            params![to_sql_time("now", now)?, limit(limit_rows)],
            read_timer,
            |row| raw_text(row, 0),
            |timer| {
                match timer {
                    Ok(timer) => timers.push(timer),
                    Err(bad) => unreadable.push(bad),
                }
                Ok(true)
            },
        )?;
        // A timer that cannot be read stops no other (DESIGN rule 13): it ends `rejected` with the
        // read error, where operators see it, and is not taken again.
        for bad in unreadable {
            let reason = format!("the stored timer could not be read: {}", bad.why);
            tx.prepare_cached(
                "UPDATE timers SET status = 'rejected', processed_at = ?2, last_error = ?3 \
                 WHERE timer_id = ?1 AND processed_at IS NULL",
            )
            .and_then(|mut stmt| stmt.execute(params![bad.row, to_sql_time_lossy(now), reason]))
            .map_err(storage)?;
        }
        for timer in &mut timers {
            timer.take(lease_ttl, now);
            tx.prepare_cached("UPDATE timers SET available_at = ?2 WHERE timer_id = ?1")
                .and_then(|mut stmt| {
                    stmt.execute(params![
                        timer.timer_id.to_string(),
                        to_sql_time_lossy(timer.available_at)
                    ])
                })
                .map_err(storage)?;
        }
        tx.commit().map_err(storage)?;
        Ok(timers)
    }
    fn reject_timer(
        &mut self,
        timer_id: &TimerId,
        reason: &str,
        now: Timestamp,
    ) -> Result<(), Error> {
        let tx = self.write()?;
        let mut timer = query_timers(&tx, SELECT_TIMER, [timer_id.to_string()])?
            .pop()
            .ok_or_else(|| Error::TimerNotScheduled {
                timer_id: timer_id.to_string(),
                status: "unknown",
            })?;
        timer.reject(reason, now)?;
        tx.prepare_cached(
            "UPDATE timers SET status = ?2, processed_at = ?3, last_error = ?4 WHERE timer_id = ?1",
        )
        .and_then(|mut stmt| {
            stmt.execute(params![
                timer_id.to_string(),
                timer.status.as_str(),
                to_sql_time_lossy(now),
                timer.last_error
            ])
        })
        .map_err(storage)?;
        tx.commit().map_err(storage)
    }
    fn timers(&self, workflow_id: &WorkflowId) -> Result<Vec<TimerRow>, Error> {
        query_timers(&self.conn, SELECT_WORKFLOW_TIMERS, [workflow_id.as_str()])
    }
}

impl Operations for SqliteStore {
    fn purge_done(
        &mut self,
        older_than: Duration,
        now: Timestamp,
        batch: usize,
    ) -> Result<usize, Error> {
        // Purgeable when processed_at + older_than <= now (see `OutboxRow::is_purgeable`).
        let Some(cutoff) = now.checked_sub(older_than) else {
            return Ok(0);
        };
        let cutoff = to_sql_time("now", cutoff)?;
        self.conn
            .prepare_cached(PURGE_DONE)
            .and_then(|mut stmt| stmt.execute(params![cutoff, limit(batch)]))
            .map_err(storage)
    }
    /// Skips rows that cannot be read (DESIGN rule 13); the operators' tools list those apart.
    fn dead_letters(&self, limit_rows: usize) -> Result<Vec<OutboxRow>, Error> {
        read_readable(
            &self.conn,
            SELECT_DEAD,
            [NO_LIMIT],
            read_outbox_row,
            limit_rows,
        )
    }
    fn retry(&mut self, command_id: &CommandId, now: Timestamp) -> Result<(), Error> {
        self.update(command_id, now, |row| row.retry(now))
    }
    fn resolve(&mut self, command_id: &CommandId, note: &str, now: Timestamp) -> Result<(), Error> {
        self.update(command_id, now, |row| row.resolve(note, now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every query a worker or `pending` runs is answered from an index: none walks the done rows,
    /// and none sorts in a temporary b-tree.
    #[test]
    fn hot_queries_use_their_indexes() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path().join("plan.db")).unwrap();
        for (name, sql, index) in [
            ("pending", SELECT_PENDING, "outbox_unfinished"),
            ("claim", CLAIM_DUE_FIRST, "outbox_due"),
            ("strict claim", CLAIM_STRICT, "outbox_due"),
            ("dead letters", SELECT_DEAD, "outbox_dead"),
            ("one row", SELECT_ONE, "PRIMARY KEY"),
            ("a workflow's rows", SELECT_WORKFLOW, "PRIMARY KEY"),
            ("due timers", CLAIM_TIMERS, "timers_due"),
            ("anything due", ANY_COMMAND_DUE, "outbox_due"),
            ("any timer due", ANY_TIMER_DUE, "timers_due"),
            ("one timer", SELECT_TIMER, "PRIMARY KEY"),
            (
                "a workflow's timers",
                SELECT_WORKFLOW_TIMERS,
                "timers_by_workflow",
            ),
            (
                "timers to cancel",
                CANCEL_TIMERS,
                "timers_scheduled_by_name",
            ),
            ("old done rows", PURGE_DONE, "outbox_done"),
        ] {
            let mut stmt = store
                .conn
                .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
                .unwrap();
            let args = rusqlite::params_from_iter(0..stmt.parameter_count() as i64);
            let plan: Vec<String> = stmt
                .query_map(args, |row| row.get::<_, String>("detail"))
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap();
            let plan = plan.join(" | ");
            assert!(plan.contains(index), "{name} does not use {index}: {plan}");
            assert!(!plan.contains("TEMP B-TREE"), "{name} sorts: {plan}");
            assert!(
                !plan.contains("SCAN o ") || plan.contains("USING INDEX"),
                "{name} scans the table: {plan}"
            );
        }
    }
}
