//! Connections to a store's file, for the store and its writer alike: their options, the schema
//! migrations, pragmas set and checked, the read-only opening and its checks.

use std::borrow::Cow;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use miniflow_core::Error;
use rusqlite::{Connection, ErrorCode, OpenFlags, TransactionBehavior};
use rusqlite_migration::{Migrations, M};

use crate::errors::storage;

/// The schema migrations, applied in order; the count is the schema version in `PRAGMA user_version`.
const MIGRATIONS: &[&str] = &[
    include_str!("../migrations/0001_init.sql"),
    include_str!("../migrations/0002_idempotency_and_retention.sql"),
    include_str!("../migrations/0003_timers.sql"),
    include_str!("../migrations/0004_fencing_results_and_cancellation.sql"),
    include_str!("../migrations/0005_operator_controls.sql"),
    include_str!("../migrations/0006_trace_context.sql"),
    include_str!("../migrations/0007_lean_outbox_and_retention.sql"),
    include_str!("../migrations/0008_fewer_hot_indexes.sql"),
];

/// The newest schema version this build writes.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// How a commit reaches the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Synchronous {
    /// `synchronous=FULL`: a commit survives a crash and a power loss once it returns. The default.
    #[default]
    Full,
    /// `synchronous=NORMAL`: faster, and still safe against a process crash, but a power loss can undo
    /// the last commits — possibly a commit whose command a worker already delivered. Opt in only when
    /// that is acceptable.
    Normal,
}

/// Settings of a [`SqliteStore`](crate::SqliteStore) and its [`Writer`](crate::Writer); the defaults are the durable ones.
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

/// Opens a connection to the miniflow database at `path`: durable pragmas set and checked, schema
/// migrated to [`SCHEMA_VERSION`] (a newer file is refused untouched).
pub(crate) fn open_connection(path: &Path, options: &SqliteOptions) -> Result<Connection, Error> {
    check_store_path(path)?;
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_CREATE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let mut conn = Connection::open_with_flags(sqlite_path(path), flags).map_err(storage)?;
    conn.busy_timeout(options.busy_timeout).map_err(storage)?;
    let synchronous = match options.synchronous {
        Synchronous::Full => ("FULL", 2),
        Synchronous::Normal => ("NORMAL", 1),
    };
    // Before anything is written: a new file gives freed pages back (see `give_back_free_pages`).
    // On a file that has pages, the pragma would wait for the write lock for nothing.
    let pages: i64 = conn
        .query_row("PRAGMA page_count", [], |row| row.get(0))
        .map_err(storage)?;
    if pages == 0 {
        conn.execute_batch("PRAGMA auto_vacuum = INCREMENTAL")
            .map_err(storage)?;
    }
    // Turning a rollback-journal file (an old store) into WAL reads the file, then takes its write
    // lock; SQLite answers BUSY at once, without the busy handler, when another connection got
    // the write lock between the two (as one opening the file at the same time does). So that
    // opening waits like every other write: up to the busy timeout.
    until_not_busy(options.busy_timeout, || {
        expect_pragma(&conn, "journal_mode", "WAL", "wal".to_owned())
    })?;
    expect_pragma(&conn, "synchronous", synchronous.0, synchronous.1)?;
    expect_pragma(&conn, "foreign_keys", "ON", 1)?;
    // Statement journals (a savepoint per request of the writer) stay in memory.
    conn.execute_batch("PRAGMA cache_size = -16384; PRAGMA temp_store = MEMORY")
        .map_err(storage)?;
    migrate(&mut conn)?;
    give_back_space_from_now_on(&conn)?;
    Ok(conn)
}

/// Runs `attempt` again while it fails with [`Error::Busy`], for up to `timeout` (pausing 1 ms, then
/// longer, up to 50 ms): for the statements SQLite refuses at once instead of calling its busy
/// handler. The last error after `timeout`.
fn until_not_busy<T>(
    timeout: Duration,
    mut attempt: impl FnMut() -> Result<T, Error>,
) -> Result<T, Error> {
    let deadline = std::time::Instant::now() + timeout;
    let mut pause = Duration::from_millis(1);
    loop {
        match attempt() {
            Err(Error::Busy(_)) if std::time::Instant::now() + pause < deadline => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(50));
            }
            done => return done,
        }
    }
}

/// Refuses the names SQLite does not read as a file: the empty name (a temporary database) and
/// `:memory:` — a store is shared by its writer thread and its reads, and lasts after they close.
fn check_store_path(path: &Path) -> Result<(), Error> {
    if path.as_os_str().is_empty() {
        return Err(Error::invalid(
            "path",
            "\"\"",
            "is empty: give the file the store lives in",
        ));
    }
    if path == Path::new(":memory:") {
        return Err(Error::invalid(
            "path",
            ":memory:",
            "names no file: a store is kept in a file that its writer thread and its reads share; \
             for a store in memory use MemoryStore (`./:memory:` is a file of that name)",
        ));
    }
    Ok(())
}

/// The schema version that made the outbox lean and added retired workflows (migration 0007).
const LEAN_OUTBOX_VERSION: i64 = 7;

/// `PRAGMA auto_vacuum` of a file that gives freed pages back when asked (`INCREMENTAL`).
const INCREMENTAL: i64 = 2;

/// Makes a file written before `auto_vacuum = INCREMENTAL` give freed pages back: SQLite applies the
/// setting to an existing file only by rebuilding it (`VACUUM`, outside any transaction), once. It
/// holds the write lock meanwhile and needs free disk space for a copy of the file.
fn give_back_space_from_now_on(conn: &Connection) -> Result<(), Error> {
    let mode = |conn: &Connection| -> Result<i64, Error> {
        conn.query_row("PRAGMA auto_vacuum", [], |row| row.get(0))
            .map_err(storage)
    };
    if mode(conn)? == INCREMENTAL {
        return Ok(());
    }
    conn.execute_batch("PRAGMA auto_vacuum = INCREMENTAL; VACUUM")
        .map_err(storage)?;
    match mode(conn)? {
        INCREMENTAL => Ok(()),
        other => Err(Error::Storage(
            format!("PRAGMA auto_vacuum is {other} after setting it to INCREMENTAL and a VACUUM")
                .into(),
        )),
    }
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
    ("kind_controls", 5),
    ("retired_workflows", LEAN_OUTBOX_VERSION),
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
pub(crate) fn read_only_connection(path: &Path) -> Result<(Connection, i64), Error> {
    let wal = check_database_file(path)?;
    let open = |name: &Path, flags: OpenFlags| -> rusqlite::Result<(Connection, i64)> {
        let conn = Connection::open_with_flags(name, flags | OpenFlags::SQLITE_OPEN_NO_MUTEX)?;
        conn.busy_timeout(SqliteOptions::default().busy_timeout)?;
        let version = conn.query_row("PRAGMA user_version", [], |row| row.get(0))?;
        Ok((conn, version))
    };
    let cannot_read =
        |e: rusqlite::Error| Error::Storage(format!("cannot read {}: {e}", path.display()).into());
    let closed = wal && !beside(path, "-shm").exists();
    // The `-shm` and `-wal` SQLite would create for a reader that is neither the file's owner nor
    // root (root's are given to the owner) would be the reader's, and every later write of the
    // owner would fail on them ("attempt to write a readonly database"). So such a reader reads a
    // store nobody has open as the file alone, and creates nothing.
    if closed && !creates_files_for_the_owner(path)? {
        refuse_unread_log_of_another_user(path)?;
        let (conn, version) = open(
            Path::new(&immutable_uri(path)?),
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_URI,
        )
        .map_err(cannot_read)?;
        check_schema(&conn, path, version)?;
        return Ok((conn, version));
    }
    // SQLite opens a WAL database, even read-only, through a `-shm` index and a `-wal` log that it
    // creates beside it when nobody has it open. So such a file is checked first as the file alone
    // (immutable: all there is while no `-wal` holds commits), and one that is not a store of this
    // version is refused with nothing created beside it.
    if closed {
        if let Ok(uri) = immutable_uri(path) {
            let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_URI;
            let (alone, version) = open(Path::new(&uri), flags).map_err(cannot_read)?;
            check_schema(&alone, path, version)?;
        }
    }
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

/// Whether the files SQLite creates beside the database at `path` belong to the file's owner: this
/// process runs as the owner, or as root (SQLite gives root's files to the database's owner).
#[cfg(unix)]
fn creates_files_for_the_owner(path: &Path) -> Result<bool, Error> {
    use std::os::unix::fs::MetadataExt;
    let owner = std::fs::metadata(path)
        .map_err(|e| Error::Storage(format!("cannot read {}: {e}", path.display()).into()))?
        .uid();
    let user = rustix::process::geteuid();
    Ok(user.is_root() || user.as_raw() == owner)
}

#[cfg(not(unix))]
fn creates_files_for_the_owner(_: &Path) -> Result<bool, Error> {
    Ok(true)
}

/// Refuses to read, as another user than its owner, a store whose `-wal` holds commits nobody has
/// indexed: reading them would create a `-shm` the owner could not write.
fn refuse_unread_log_of_another_user(path: &Path) -> Result<(), Error> {
    let wal = beside(path, "-wal");
    if std::fs::metadata(&wal).is_ok_and(|meta| meta.len() > 0) {
        return Err(Error::Storage(
            format!(
                "cannot read {} as this user: its write-ahead log {} holds commits that are not \
                 in the file yet, and reading them would create {} owned by this user, which the \
                 store's owner could not write afterwards; read it as its owner (or root), or \
                 after its owner opened it",
                path.display(),
                wal.display(),
                beside(path, "-shm").display(),
            )
            .into(),
        ));
    }
    Ok(())
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
    use miniflow_core::prelude::*;
    use miniflow_core::{ClaimRequest, CommandId, Commit, Seq, Status, Timestamp, WorkflowId};

    use super::*;
    use crate::SqliteStore;

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

    /// Every column of every outbox row but its integer key, as SQLite stores it, in command ID order.
    fn outbox_columns(conn: &Connection) -> Vec<Vec<rusqlite::types::Value>> {
        let columns = crate::sqlite::ROW_COLUMNS.strip_suffix(", id").unwrap();
        let mut stmt = conn
            .prepare(&format!(
                "SELECT {columns}, priority FROM outbox ORDER BY workflow_id, event_seq, idx"
            ))
            .unwrap();
        let count = stmt.column_count();
        stmt.query_map([], |row| (0..count).map(|i| row.get(i)).collect())
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    }

    #[test]
    fn a_version_6_store_keeps_every_outbox_row_and_gives_space_back_after_the_upgrade() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v6.db");
        let conn = Connection::open(&path).unwrap();
        for sql in &MIGRATIONS[..6] {
            conn.execute_batch(sql).unwrap();
        }
        conn.execute_batch(
            "PRAGMA user_version = 6;
             INSERT INTO events VALUES ('w', 1, 'start', '{}', 5), ('w', 2, 'more', '{}', 6),
                 ('v', 1, 'start', '{}', 5);
             INSERT INTO outbox (workflow_id, event_seq, idx, kind, payload, status, attempts,
                 last_error, available_at, lease_owner, lease_expires_at, lease_token, created_at,
                 processed_at, manual_retries, resolution, report_result, result, cancel_requested,
                 priority, traceparent, tracestate)
             VALUES
                 ('w', 1, 0, 'a', '{\"n\":0}', 'pending', 0, NULL, 5, NULL, NULL, 0, 5, NULL, 0, NULL, 0, NULL, 0,
                  3, '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01', 'k=v'),
                 ('w', 1, 1, 'b', '{}', 'leased', 2, 'timeout', 90, 'worker-1', 90, 2, 5, NULL, 0, NULL, 1, NULL, 1, 0, NULL, NULL),
                 ('w', 1, 10, 'c', '{}', 'done', 1, NULL, 30, 'worker-2', 30, 1, 5, 40, 0, NULL, 1, '{\"ref\":7}', 0, -2, NULL, NULL),
                 ('w', 2, 0, 'd', '{}', 'dead', 10, 'refused', 50, 'worker-1', 50, 10, 6, 60, 1, NULL, 0, NULL, 0, 0, NULL, NULL),
                 ('v', 1, 0, 'e', '{}', 'cancelled', 0, NULL, 5, NULL, NULL, 0, 5, 8, 0, NULL, 0, NULL, 0, 0, NULL, NULL),
                 ('v', 1, 1, 'f', '{}', 'done', 1, 'x', 5, 'worker-3', 20, 1, 5, 21, 2, 'by hand', 0, NULL, 0, 0, NULL, NULL);",
        )
        .unwrap();
        let before = outbox_columns(&conn);
        let auto_vacuum = |conn: &Connection| -> i64 {
            conn.query_row("PRAGMA auto_vacuum", [], |row| row.get(0))
                .unwrap()
        };
        assert_eq!(auto_vacuum(&conn), 0, "written without auto_vacuum");
        drop(conn);

        let store = SqliteStore::open(&path).unwrap();
        let conn = store.connection();
        assert_eq!(
            outbox_columns(conn),
            before,
            "every column of every row kept"
        );
        assert_eq!(
            auto_vacuum(conn),
            INCREMENTAL,
            "converted once, by a VACUUM"
        );
        let check: String = conn
            .query_row("PRAGMA integrity_check", [], |row| row.get(0))
            .unwrap();
        assert_eq!(check, "ok");
        let orphans: i64 = conn
            .query_row("SELECT COUNT(*) FROM pragma_foreign_key_check", [], |row| {
                row.get(0)
            })
            .unwrap();
        assert_eq!(orphans, 0);
        let ids: Vec<i64> = conn
            .prepare("SELECT id FROM outbox ORDER BY workflow_id, event_seq, idx")
            .unwrap()
            .query_map([], |row| row.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(ids.len(), 6, "each row has its integer key: {ids:?}");
        let rows = store.commands(&WorkflowId::new("w").unwrap()).unwrap();
        let statuses: Vec<_> = rows
            .iter()
            .map(|r| (r.command_id.to_string(), r.status))
            .collect();
        assert_eq!(
            statuses,
            [
                ("w:1:0".to_owned(), Status::Pending),
                ("w:1:1".to_owned(), Status::Leased),
                ("w:1:10".to_owned(), Status::Done),
                ("w:2:0".to_owned(), Status::Dead),
            ]
        );
        assert_eq!(rows[2].result, Some(serde_json::json!({ "ref": 7 })));
        assert!(rows[1].cancel_requested && rows[1].report_result);
    }

    #[test]
    fn a_new_store_gives_freed_pages_back_from_the_start() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path().join("new.db")).unwrap();
        let mode: i64 = store
            .connection()
            .query_row("PRAGMA auto_vacuum", [], |row| row.get(0))
            .unwrap();
        assert_eq!(mode, INCREMENTAL);
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

    /// A store of schema version 4 (before operator controls) with a command in each status.
    fn version_4_store(path: &Path) {
        let conn = Connection::open(path).unwrap();
        for sql in &MIGRATIONS[..4] {
            conn.execute_batch(sql).unwrap();
        }
        conn.execute_batch(
            "PRAGMA user_version = 4;
             INSERT INTO events VALUES ('w', 1, 'start', '{}', 5);
             INSERT INTO outbox (workflow_id, event_seq, idx, kind, payload, status, attempts,
                 available_at, lease_owner, lease_expires_at, lease_token, created_at, processed_at)
             VALUES ('w', 1, 0, 'book', '{}', 'pending', 0, 5, NULL, NULL, 0, 5, NULL),
                    ('w', 1, 1, 'book', '{}', 'leased', 1, 900, 'old', 900, 1, 5, NULL),
                    ('w', 1, 2, 'mail', '{}', 'dead', 3, 5, 'old', 50, 3, 5, 60),
                    ('w', 1, 3, 'mail', '{}', 'done', 1, 5, 'old', 50, 1, 5, 60);",
        )
        .unwrap();
    }

    /// Opens the old store at `path` while another connection holds its write lock for `held` (as
    /// another process opening it at the same time does while it upgrades it): the opening must
    /// wait for the lock, as every write does, not fail at once.
    fn open_while_written(path: &Path, held: Duration) -> Result<Duration, Error> {
        let writer = Connection::open(path).unwrap();
        writer
            .execute_batch("BEGIN IMMEDIATE; UPDATE events SET recorded_at = recorded_at")
            .unwrap();
        std::thread::scope(|scope| {
            scope.spawn(move || {
                std::thread::sleep(held);
                writer.execute_batch("COMMIT").unwrap();
            });
            let started = std::time::Instant::now();
            open_connection(path, &SqliteOptions::default()).map(|_| started.elapsed())
        })
    }

    #[test]
    fn opening_an_old_store_waits_for_another_writer_instead_of_failing_busy() {
        for wal in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("v4.db");
            version_4_store(&path);
            if wal {
                Connection::open(&path)
                    .unwrap()
                    .pragma_update(None, "journal_mode", "WAL")
                    .unwrap();
            }
            match open_while_written(&path, Duration::from_millis(300)) {
                Ok(waited) => assert!(
                    waited >= Duration::from_millis(250),
                    "WAL {wal}: {waited:?}"
                ),
                Err(e) => panic!("WAL {wal}: {e:?}"),
            }
            assert_eq!(user_version(&path), SCHEMA_VERSION, "WAL {wal}");
        }
    }

    #[test]
    fn connections_opening_an_old_store_at_once_all_wait_for_its_upgrade() {
        const ROUNDS: usize = 6;
        const OPENERS: usize = 8;
        let mut failures = Vec::new();
        for round in 0..ROUNDS {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("v4.db");
            version_4_store(&path);
            let start = std::sync::Barrier::new(OPENERS);
            let opened: Vec<_> = std::thread::scope(|scope| {
                let openers: Vec<_> = (0..OPENERS)
                    .map(|_| {
                        scope.spawn(|| {
                            start.wait();
                            open_connection(&path, &SqliteOptions::default()).map(drop)
                        })
                    })
                    .collect();
                openers.into_iter().map(|t| t.join().unwrap()).collect()
            });
            failures.extend(opened.into_iter().filter_map(Result::err));
            assert_eq!(user_version(&path), SCHEMA_VERSION, "round {round}");
        }
        assert!(failures.is_empty(), "{failures:#?}");
    }

    #[test]
    fn a_version_4_store_keeps_its_commands_through_the_upgrade_to_operator_controls() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v4.db");
        version_4_store(&path);
        assert!(
            SqliteStore::open_read_only(&path).is_err(),
            "reading refuses an older store"
        );
        assert_eq!(SqliteStore::migrate(&path).unwrap(), 4);
        assert_eq!(user_version(&path), SCHEMA_VERSION);

        let mut store = SqliteStore::open(&path).unwrap();
        let rows = store.commands(&WorkflowId::new("w").unwrap()).unwrap();
        let shown: Vec<_> = rows
            .iter()
            .map(|r| (r.command_id.to_string(), r.status))
            .collect();
        assert_eq!(
            shown,
            [
                ("w:1:0".to_owned(), Status::Pending),
                ("w:1:1".to_owned(), Status::Leased),
                ("w:1:2".to_owned(), Status::Dead),
                ("w:1:3".to_owned(), Status::Done),
            ]
        );
        assert!(store.kind_controls().unwrap().is_empty());
        let stats = store.stats(Timestamp::from_millis(100)).unwrap();
        let book = stats.kind("book").unwrap();
        assert_eq!((book.pending, book.leased, book.due), (1, 1, 1));
        assert_eq!(stats.kind("mail").unwrap().dead, 1);
        // Claims go on where version 4 left off: the pending command, then the expired lease.
        let claimed = store
            .claim(
                &ClaimRequest::new("new").limit(5),
                Timestamp::from_millis(1_000),
            )
            .unwrap();
        let ids: Vec<_> = claimed.iter().map(|d| d.command_id.to_string()).collect();
        assert_eq!(ids, ["w:1:0", "w:1:1"]);
        assert_eq!(claimed[1].token, 2, "the fencing token goes on counting");
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
            .connection()
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
