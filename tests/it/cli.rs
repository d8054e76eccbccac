//! The `miniflow` command-line tool, run as an operator runs it.
#![cfg(feature = "cli")]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command as Process, Stdio};

use miniflow::prelude::*;
use miniflow::{
    json, ClaimRequest, Clock, Command, Commit, Decision, Engine, Event, EventRecord, Failure,
    PostgresStore, RetryPolicy, Seq, SqliteOptions, SqliteStore, Status, Synchronous, SystemClock,
    Timestamp, Workflow, WorkflowId, POSTGRES_SCHEMA_VERSION, SCHEMA_VERSION,
};

use crate::postgres::TestDatabase;

fn miniflow(args: &[&str]) -> (bool, String, String) {
    miniflow_in(None, args)
}

/// Runs the tool, in `cwd` when given.
fn miniflow_in(cwd: Option<&Path>, args: &[&str]) -> (bool, String, String) {
    let mut process = Process::new(env!("CARGO_BIN_EXE_miniflow"));
    if let Some(cwd) = cwd {
        process.current_dir(cwd);
    }
    let out = process.args(args).output().expect("run miniflow");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The elements of a `--json` list: one JSON array.
fn json_list(out: &str) -> Vec<serde_json::Value> {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("not a JSON array ({e}): {out}"))
}

/// Every file in `dir` with its bytes: what a read must leave exactly as it was.
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
    rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
        .unwrap()
        .query_row("PRAGMA user_version", [], |row| row.get(0))
        .unwrap()
}

/// A store as the first release of miniflow wrote it: schema version 1 only.
fn version_1_store(path: &Path) {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.execute_batch(include_str!("../../host-native/migrations/0001_init.sql"))
        .unwrap();
    conn.execute_batch(
        "PRAGMA user_version = 1;
         INSERT INTO events VALUES ('trip-001', 1, 'trip_requested', '{}', 1);
         INSERT INTO outbox (workflow_id, event_seq, idx, kind, payload, status, available_at,
             created_at) VALUES ('trip-001', 1, 0, 'lock_budget', '{}', 'pending', 1, 1);",
    )
    .unwrap();
}

/// A store with `trip-001:1:0` done, `trip-001:1:1` dead and `trip-001:1:2` pending.
fn seeded(path: &Path) -> SqliteStore {
    let mut store = SqliteStore::open(path).unwrap();
    seed_trip(&mut store);
    store
}

/// Commits `trip-001`'s three commands, completes the first and fails the second for good.
fn seed_trip(store: &mut impl Store) {
    let decision = Decision::new()
        .command(Command::new("lock_budget", json!({})))
        .command(Command::new("book_hotel", json!({ "hotel": "Atlantis" })))
        .command(Command::new("book_flight", json!({})));
    let commit = Commit::new(
        WorkflowId::new("trip-001").unwrap(),
        Seq::ZERO,
        Event::new("trip_requested", json!({ "city": "成都" })),
        decision,
        Timestamp::from_millis(1),
    )
    .unwrap();
    store.append_with_commands(&commit).unwrap();
    let claimed = store
        .claim(&ClaimRequest::new("w").limit(2), Timestamp::from_millis(2))
        .unwrap();
    store
        .complete(
            &claimed[0].command_id,
            claimed[0].token,
            None,
            Timestamp::from_millis(3),
        )
        .unwrap();
    store
        .fail(
            &claimed[1].command_id,
            claimed[1].token,
            &Failure::permanent("422 no such hotel"),
            &RetryPolicy::default(),
            Timestamp::from_millis(3),
        )
        .unwrap();
}

#[test]
fn operators_list_retry_and_resolve_dead_letters_from_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("flow.db");
    let store = seeded(&db);
    let db_arg = db.to_str().unwrap();

    let (ok, out, _) = miniflow(&["dead", db_arg]);
    assert!(ok);
    assert!(
        out.contains("trip-001:1:1")
            && out.contains("422 no such hotel")
            && out.contains("(1 command)"),
        "{out}"
    );

    let (ok, out, _) = miniflow(&["pending", db_arg, "--json"]);
    assert!(ok);
    let rows = json_list(&out);
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["command_id"], "trip-001:1:2");

    let (ok, _, err) = miniflow(&["resolve", db_arg, "trip-001:1:2", "--note", "oops"]);
    assert!(!ok, "a live command cannot be resolved by accident");
    assert!(
        err.contains("cannot resolve command trip-001:1:2: it is pending"),
        "{err}"
    );

    let (ok, out, _) = miniflow(&["retry", db_arg, "trip-001:1:1"]);
    assert!(ok, "{out}");
    assert_eq!(
        store
            .command(&"trip-001:1:1".parse().unwrap())
            .unwrap()
            .unwrap()
            .status,
        Status::Pending
    );

    // It dies again; this time a person closes it.
    // The tool stamps with the system clock: the retried command is due from now.
    let mut store = store;
    let now = miniflow::Clock::now(&miniflow::SystemClock);
    let again = store.claim(&ClaimRequest::new("w").limit(5), now).unwrap();
    let hotel = again.iter().find(|d| d.kind == "book_hotel").unwrap();
    store
        .fail(
            &hotel.command_id,
            hotel.token,
            &Failure::permanent("still no hotel"),
            &RetryPolicy::default(),
            now,
        )
        .unwrap();
    let (ok, out, _) = miniflow(&[
        "resolve",
        db_arg,
        "trip-001:1:1",
        "--note",
        "booked by phone",
    ]);
    assert!(ok, "{out}");
    let row = store
        .command(&"trip-001:1:1".parse().unwrap())
        .unwrap()
        .unwrap();
    assert_eq!(
        (row.status, row.resolution.as_deref()),
        (Status::Done, Some("booked by phone"))
    );

    let (ok, out, _) = miniflow(&["show", db_arg, "trip-001:1:1"]);
    assert!(
        ok && out.contains("\"resolution\": \"booked by phone\""),
        "{out}"
    );
    let (ok, out, _) = miniflow(&["events", db_arg, "trip-001"]);
    assert!(ok, "{out}");
    assert_eq!(out.trim(), "1 trip_requested           {\"city\":\"成都\"}");
}

#[test]
fn bad_input_gets_a_clear_error_and_a_failing_exit_code() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("flow.db");
    seeded(&db);
    let missing = dir.path().join("nope.db");
    for (args, says) in [
        (vec!["dead", missing.to_str().unwrap()], "no store at"),
        (
            vec!["show", db.to_str().unwrap(), "trip-001:x:0"],
            "invalid command_id \"trip-001:x:0\"",
        ),
        (
            vec!["show", db.to_str().unwrap(), "trip-001:9:0"],
            "unknown command trip-001:9:0",
        ),
        (
            vec!["retry", db.to_str().unwrap(), "trip-001:1:2"],
            "cannot retry command trip-001:1:2: it is pending",
        ),
    ] {
        let (ok, _, err) = miniflow(&args);
        assert!(!ok, "{args:?} succeeded");
        assert!(err.contains(says), "{args:?}: {err}");
    }
    assert!(
        !missing.exists(),
        "looking at a missing store must not create it"
    );
    let (ok, out, _) = miniflow(&["purge-done", db.to_str().unwrap(), "--older-than", "0s"]);
    assert!(ok && out.contains("purged 1 done command"), "{out}");
}

const READS: [&str; 4] = ["pending", "dead", "show", "events"];

/// The arguments of every command that takes a store, on `db`.
fn every_command(db: &str) -> Vec<Vec<&str>> {
    vec![
        vec!["pending", db],
        vec!["dead", db],
        vec!["show", db, "trip-001:1:0"],
        vec!["show", db, "--raw", "trip-001:1:0"],
        vec!["events", db, "trip-001"],
        vec!["purge-done", db, "--older-than", "0s", "--dry-run"],
        vec!["stats", db],
        vec![
            "retry",
            db,
            "--kind",
            "book_hotel",
            "--all-dead",
            "--dry-run",
        ],
        vec!["retry", db, "trip-001:1:0"],
        vec!["retry", db, "--kind", "book_hotel", "--all-dead"],
        vec!["resolve", db, "trip-001:1:0", "--note", "n"],
        vec![
            "resolve",
            db,
            "--kind",
            "book_hotel",
            "--all-dead",
            "--note",
            "n",
        ],
        vec!["pause", db, "book_hotel"],
        vec!["resume", db, "book_hotel"],
        vec!["limit", db, "book_hotel", "2"],
        vec!["limit", db, "book_hotel", "none"],
        vec!["purge-done", db, "--older-than", "0s"],
    ]
}

#[test]
fn no_command_turns_what_is_not_a_store_into_one_or_touches_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = |name: &str| dir.path().join(name);
    std::fs::write(path("empty.db"), b"").unwrap();
    std::fs::write(path("notes.txt"), "plain text, not a database: ".repeat(8)).unwrap();
    rusqlite::Connection::open(path("foreign.db"))
        .unwrap()
        .execute_batch(
            "CREATE TABLE accounts (id INTEGER PRIMARY KEY); INSERT INTO accounts VALUES (7);",
        )
        .unwrap();
    rusqlite::Connection::open(path("future.db"))
        .unwrap()
        .execute_batch("CREATE TABLE later (x); PRAGMA user_version = 99;")
        .unwrap();
    // The same in WAL mode, closed: no -wal or -shm beside them, and none may appear.
    for (name, sql) in [
        (
            "foreign-wal.db",
            "CREATE TABLE accounts (id INTEGER PRIMARY KEY);",
        ),
        (
            "future-wal.db",
            "CREATE TABLE later (x); PRAGMA user_version = 99;",
        ),
    ] {
        rusqlite::Connection::open(path(name))
            .unwrap()
            .execute_batch(&format!("PRAGMA journal_mode = WAL; {sql}"))
            .unwrap();
        assert!(!path(&format!("{name}-shm")).exists());
    }
    version_1_store(&path("v1.db"));
    let before = snapshot(dir.path());

    for (name, says) in [
        (
            "missing.db",
            "no store at this path: the file does not exist",
        ),
        ("empty.db", "is an empty file, not a miniflow store"),
        (
            "notes.txt",
            "is not a SQLite database, so not a miniflow store",
        ),
        (
            "foreign.db",
            "is a SQLite database but not a miniflow store (user_version 0, tables: accounts)",
        ),
        (
            "future.db",
            &format!("schema version 99, this miniflow supports up to {SCHEMA_VERSION}: upgrade miniflow"),
        ),
        (
            "foreign-wal.db",
            "is a SQLite database but not a miniflow store (user_version 0, tables: accounts)",
        ),
        (
            "future-wal.db",
            &format!("schema version 99, this miniflow supports up to {SCHEMA_VERSION}: upgrade miniflow"),
        ),
        (
            "v1.db",
            &format!("is a miniflow store of schema version 1, older than version {SCHEMA_VERSION}"),
        ),
    ] {
        let db = path(name);
        for args in every_command(db.to_str().unwrap()) {
            let (ok, out, err) = miniflow(&args);
            assert!(!ok, "{args:?} succeeded: {out}");
            assert!(err.contains(says), "{args:?}: {err}");
        }
    }
    let (_, _, err) = miniflow(&["pending", path("v1.db").to_str().unwrap()]);
    assert!(
        err.contains(&format!(
            "upgrade it first with `miniflow migrate {}`",
            path("v1.db").display()
        )),
        "{err}"
    );
    assert_eq!(
        snapshot(dir.path()),
        before,
        "a command changed a file that is not a store"
    );
    assert_eq!(user_version(&path("v1.db")), 1);
}

#[test]
fn reading_a_store_changes_nothing_in_it() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("flow.db");
    drop(seeded(&db));
    let stored = std::fs::read(&db).unwrap();
    let db_arg = db.to_str().unwrap();
    for read in READS {
        let args = match read {
            "show" => vec![read, db_arg, "trip-001:1:1"],
            "events" => vec![read, db_arg, "trip-001"],
            _ => vec![read, db_arg],
        };
        let (ok, out, err) = miniflow(&args);
        assert!(ok, "{args:?}: {err}");
        assert!(
            out.contains("trip-001") || out.contains("trip_requested"),
            "{out}"
        );
    }
    let (ok, out, _) = miniflow(&["purge-done", db_arg, "--older-than", "0s", "--dry-run"]);
    assert!(ok && out.contains("would purge 1 done command"), "{out}");
    let (ok, out, err) = miniflow(&["stats", db_arg]);
    assert!(ok && out.contains("book_hotel"), "{out}{err}");
    for bulk in ["retry", "resolve"] {
        let (ok, out, err) = miniflow(
            &[
                bulk,
                db_arg,
                "--kind",
                "book_hotel",
                "--all-dead",
                "--note",
                "n",
                "--dry-run",
            ]
            .into_iter()
            .filter(|arg| bulk == "resolve" || !["--note", "n"].contains(arg))
            .collect::<Vec<_>>(),
        );
        assert!(ok && out.contains("would"), "{bulk}: {out}{err}");
    }
    assert_eq!(
        std::fs::read(&db).unwrap(),
        stored,
        "a read wrote the store"
    );
    // SQLite reads a WAL store through a -shm index and an (empty) -wal log beside it.
    for (name, bytes) in snapshot(dir.path()) {
        match name.as_str() {
            "flow.db" | "flow.db-shm" => {}
            "flow.db-wal" => assert!(bytes.is_empty(), "a read wrote to the log"),
            other => panic!("a read left {other} beside the store"),
        }
    }
    let store = SqliteStore::open(&db).unwrap();
    assert!(store
        .command(&"trip-001:1:0".parse().unwrap())
        .unwrap()
        .is_some());
}

#[test]
fn migrate_upgrades_an_older_store_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let v1 = dir.path().join("v1.db");
    version_1_store(&v1);
    let v1_arg = v1.to_str().unwrap();

    let (ok, out, err) = miniflow(&["migrate", v1_arg]);
    assert!(ok, "{err}");
    let says = format!("upgraded from schema version 1 to {SCHEMA_VERSION}");
    assert!(out.contains(&says), "{out}");
    assert_eq!(user_version(&v1), SCHEMA_VERSION);
    let (ok, out, err) = miniflow(&["pending", v1_arg]);
    assert!(ok && out.contains("trip-001:1:0"), "{out}{err}");
    let (ok, out, _) = miniflow(&["migrate", v1_arg]);
    let says = format!("already at schema version {SCHEMA_VERSION}");
    assert!(ok && out.contains(&says), "{out}");

    let foreign = dir.path().join("foreign.db");
    rusqlite::Connection::open(&foreign)
        .unwrap()
        .execute_batch("CREATE TABLE accounts (id)")
        .unwrap();
    let bytes = std::fs::read(&foreign).unwrap();
    let (ok, _, err) = miniflow(&["migrate", foreign.to_str().unwrap()]);
    assert!(!ok && err.contains("not a miniflow store"), "{err}");
    assert_eq!(std::fs::read(&foreign).unwrap(), bytes);
    let missing = dir.path().join("missing.db");
    let (ok, _, err) = miniflow(&["migrate", missing.to_str().unwrap()]);
    assert!(!ok && err.contains("does not exist"), "{err}");
    assert!(!missing.exists());
}

#[test]
fn a_path_starting_with_file_names_a_file_not_a_uri() {
    let dir = tempfile::tempdir().unwrap();
    drop(seeded(&dir.path().join("file:flow.db")));
    let cwd = Some(dir.path());

    let (ok, out, err) = miniflow_in(cwd, &["dead", "file:flow.db"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("trip-001:1:1") && out.contains("(1 command)"),
        "{out}"
    );
    let (ok, out, err) = miniflow_in(cwd, &["retry", "file:flow.db", "trip-001:1:1"]);
    assert!(ok, "{out}{err}");
    let (ok, out, _) = miniflow_in(cwd, &["dead", "file:flow.db"]);
    assert!(ok && out.contains("(0 commands)"), "{out}");
    let names: Vec<String> = snapshot(dir.path())
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    assert!(
        names.iter().all(|name| name.starts_with("file:flow.db")),
        "SQLite opened another file: {names:?}"
    );
}

#[test]
fn purge_finished_retires_finished_workflows_only_and_a_dry_run_counts_them() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("flow.db");
    let mut store = seeded(&db); // trip-001: a dead and a pending command, unfinished
    finished_workflows(&mut store);
    drop(store);
    let db_arg = db.to_str().unwrap();

    let stored = std::fs::read(&db).unwrap();
    let (ok, out, err) = miniflow(&["purge-finished", db_arg, "--older-than", "0s", "--dry-run"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("would retire 2 workflows finished more than"),
        "{out}"
    );
    let (ok, out, _) = miniflow(&[
        "purge-finished",
        db_arg,
        "--older-than",
        "1000years",
        "--dry-run",
    ]);
    assert!(ok && out.contains("would retire 0 workflows"), "{out}");
    assert_eq!(
        std::fs::read(&db).unwrap(),
        stored,
        "a dry run wrote the store"
    );

    let (ok, out, err) = miniflow(&["purge-finished", db_arg, "--older-than", "0s"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("retired 2 workflows finished more than"),
        "{out}"
    );
    let store = SqliteStore::open(&db).unwrap();
    for w in ["done-1", "done-2"] {
        assert!(store.load(&WorkflowId::new(w).unwrap()).unwrap().is_empty());
    }
    let (ok, out, err) = miniflow(&["events", db_arg, "done-1"]);
    assert!(ok && out.is_empty(), "{out}{err}");
    assert!(err.contains("done-1 was retired by retention at "), "{err}");
    let (ok, out, err) = miniflow(&["events", db_arg, "never-seen"]);
    assert!(ok && out.is_empty() && err.is_empty(), "{out}{err}");
    let trip = WorkflowId::new("trip-001").unwrap();
    assert_eq!(
        store.load(&trip).unwrap().len(),
        1,
        "an unfinished workflow stays"
    );
    assert_eq!(store.commands(&trip).unwrap().len(), 3);
    let (ok, out, _) = miniflow(&["purge-finished", db_arg, "--older-than", "0s", "--dry-run"]);
    assert!(ok && out.contains("would retire 0 workflows"), "{out}");
}

/// Commits `done-1` and `done-2`, each with one command, done at 6 ms.
fn finished_workflows(store: &mut (impl EventLog + Outbox)) {
    for w in ["done-1", "done-2"] {
        let decision = Decision::new().command(Command::new("notify", json!({})));
        let commit = Commit::new(
            WorkflowId::new(w).unwrap(),
            Seq::ZERO,
            Event::new("happened", json!({})),
            decision,
            Timestamp::from_millis(5),
        )
        .unwrap();
        store.append_with_commands(&commit).unwrap();
        let id = format!("{w}:1:0").parse().unwrap();
        store.mark_done(&id, Timestamp::from_millis(6)).unwrap();
    }
}

#[test]
fn purge_finished_retires_the_finished_workflows_of_a_postgres_database() {
    let database = TestDatabase::new();
    let url = database.url();
    let mut store = postgres_seeded(&url); // trip-001: a dead and a pending command, unfinished
    finished_workflows(&mut store);
    let before = postgres_contents(&database);
    let (ok, out, err) = miniflow(&["purge-finished", &url, "--older-than", "0s", "--dry-run"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("would retire 2 workflows finished more than"),
        "{out}"
    );
    assert_eq!(postgres_contents(&database), before, "a dry run wrote");

    let (ok, out, err) = miniflow(&["purge-finished", &url, "--older-than", "0s", "--json"]);
    assert!(ok, "{err}");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&out).unwrap(),
        json!({ "workflows": 2, "older_than_ms": 0, "dry_run": false })
    );
    for w in ["done-1", "done-2"] {
        let id = WorkflowId::new(w).unwrap();
        assert!(store.load(&id).unwrap().is_empty() && store.commands(&id).unwrap().is_empty());
        assert!(store.retired_at(&id).unwrap().is_some(), "{w}");
    }
    let (ok, _, err) = miniflow(&["events", &url, "done-1", "--json"]);
    assert!(
        ok && err.contains("done-1 was retired by retention"),
        "{err}"
    );
    let trip = WorkflowId::new("trip-001").unwrap();
    assert_eq!(
        store.load(&trip).unwrap().len(),
        1,
        "an unfinished workflow stays"
    );
    assert_eq!(store.commands(&trip).unwrap().len(), 3);
    let retired = postgres_contents(&database)
        .into_iter()
        .filter(|row| row.starts_with("retired_workflows: "))
        .count();
    assert_eq!(retired, 2);
}

#[test]
fn purge_done_wants_a_unit_and_a_dry_run_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("flow.db");
    drop(seeded(&db));
    let db_arg = db.to_str().unwrap();

    for bare in ["0", "30"] {
        let (ok, _, err) = miniflow(&["purge-done", db_arg, "--older-than", bare]);
        assert!(!ok, "--older-than {bare} was taken");
        assert!(err.contains(&format!("\"{bare}\" has no unit")), "{err}");
    }
    let (ok, _, err) = miniflow(&["purge-done", db_arg, "--older-than", "3 fortnights"]);
    assert!(
        !ok && err.contains("\"3 fortnights\" is not a duration"),
        "{err}"
    );

    let stored = std::fs::read(&db).unwrap();
    for period in ["30d", "12h", "90m", "45s", "0s"] {
        let (ok, out, err) = miniflow(&["purge-done", db_arg, "--older-than", period, "--dry-run"]);
        assert!(ok, "{period}: {err}");
        assert!(
            out.contains("would purge 1 done command processed more than"),
            "{out}"
        );
    }
    let (ok, out, _) = miniflow(&[
        "purge-done",
        db_arg,
        "--older-than",
        "1000years",
        "--dry-run",
    ]);
    assert!(ok && out.contains("would purge 0 done commands"), "{out}");
    let (ok, out, err) = miniflow(&[
        "purge-done",
        db_arg,
        "--older-than",
        "1s",
        "--dry-run",
        "--json",
    ]);
    assert!(ok, "{err}");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&out).unwrap(),
        json!({ "commands": 1, "older_than_ms": 1_000, "dry_run": true })
    );
    assert_eq!(
        std::fs::read(&db).unwrap(),
        stored,
        "a dry run wrote the store"
    );

    let (ok, out, _) = miniflow(&["purge-done", db_arg, "--older-than", "30d", "--json"]);
    assert!(ok, "{out}");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&out).unwrap(),
        json!({ "commands": 1, "older_than_ms": 2_592_000_000u64, "dry_run": false })
    );
    let store = SqliteStore::open(&db).unwrap();
    assert!(store
        .command(&"trip-001:1:0".parse().unwrap())
        .unwrap()
        .is_none());
}

#[test]
fn tables_escape_control_characters_and_json_keeps_them() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("flow.db");
    let mut store = SqliteStore::open(&db).unwrap();
    let error =
        "\u{1b}[2J\u{1b}[31mboom\u{1b}[0m\ntrip-999:1:0   book_hotel   dead   1  all fine\r\u{9b}";
    let commit = Commit::new(
        WorkflowId::new("trip-001").unwrap(),
        Seq::ZERO,
        Event::new(
            "trip_requested",
            json!({ "note": "a\u{9b}b\u{202e}c\u{7f}" }),
        ),
        Decision::new().command(Command::new("book_hotel", json!({}))),
        Timestamp::from_millis(1),
    )
    .unwrap();
    store.append_with_commands(&commit).unwrap();
    let claimed = store
        .claim(&ClaimRequest::new("w"), Timestamp::from_millis(2))
        .unwrap();
    store
        .fail(
            &claimed[0].command_id,
            claimed[0].token,
            &Failure::permanent(error),
            &RetryPolicy::default(),
            Timestamp::from_millis(3),
        )
        .unwrap();
    let db_arg = db.to_str().unwrap();
    let raw = |out: &str| {
        out.chars()
            .any(|c| c.is_control() && c != '\n' || c == '\u{202e}')
    };

    let (ok, out, _) = miniflow(&["dead", db_arg]);
    assert!(ok);
    assert!(!raw(&out), "raw control characters in the table: {out:?}");
    assert_eq!(out.lines().count(), 3, "a field forged a row: {out}");
    assert!(
        out.contains(r"\u{1b}[2J\u{1b}[31mboom\u{1b}[0m\ntrip-999:1:0   book_hotel   dead   1  all fine\r\u{9b}"),
        "{out}"
    );
    let (ok, out, _) = miniflow(&["events", db_arg, "trip-001"]);
    assert!(ok && !raw(&out), "{out:?}");
    assert!(out.contains(r"a\u{9b}b\u{202e}c\u{7f}"), "{out}");
    let (ok, out, _) = miniflow(&["show", db_arg, "trip-001:1:0"]);
    assert!(ok && !raw(&out), "{out:?}");
    let shown: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(shown["last_error"], error, "the pretty JSON means the same");
    let (ok, out, _) = miniflow(&["show", db_arg, "--raw", "trip-001:1:0"]);
    assert!(ok && !raw(&out), "{out:?}");

    let (ok, out, _) = miniflow(&["dead", db_arg, "--json"]);
    assert!(ok);
    let rows = json_list(&out);
    assert_eq!(rows[0]["last_error"], error, "JSON output is exact");
    let (ok, out, _) = miniflow(&["events", db_arg, "trip-001", "--json"]);
    let events = json_list(&out);
    assert!(ok);
    assert_eq!(events[0]["payload"]["note"], "a\u{9b}b\u{202e}c\u{7f}");
}

#[cfg(unix)]
#[test]
fn a_closed_pipe_ends_the_listing_quietly() {
    use std::os::unix::process::ExitStatusExt;

    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("flow.db");
    let options = SqliteOptions {
        synchronous: Synchronous::Normal,
        ..SqliteOptions::default()
    };
    let mut store = SqliteStore::open_with(&db, &options).unwrap();
    let mut decision = Decision::new();
    for i in 0..3_000 {
        decision = decision.command(Command::new("lock_budget", json!({ "i": i })));
    }
    let commit = Commit::new(
        WorkflowId::new("trip-001").unwrap(),
        Seq::ZERO,
        Event::new("trip_requested", json!({})),
        decision,
        Timestamp::from_millis(1),
    )
    .unwrap();
    store.append_with_commands(&commit).unwrap();
    drop(store);

    for format in [None, Some("--json")] {
        let mut args = vec!["pending", db.to_str().unwrap(), "--limit", "5000"];
        args.extend(format);
        let mut child = Process::new(env!("CARGO_BIN_EXE_miniflow"))
            .args(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut first = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut first)
            .unwrap();
        assert!(!first.is_empty());
        // The reader is gone: the tool writes into a closed pipe.
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.is_empty(), "{args:?} complained: {err}");
        assert!(
            out.status.success() || out.status.signal() == Some(13),
            "{args:?}: {:?}",
            out.status
        );
    }
}

/// A workflow that takes every event and decides nothing.
struct Quiet;

impl Workflow for Quiet {
    type State = ();
    fn evolve(&self, _: &mut (), _: &EventRecord) {}
    fn decide(&self, _: &(), _: &EventRecord) -> Decision {
        Decision::new()
    }
}

/// Fires every due timer of `store` (the failure feedback of dead commands) into its workflow.
fn deliver_feedback(store: &mut SqliteStore, now: Timestamp) -> usize {
    let timers = store
        .claim_timers(10, std::time::Duration::from_secs(30), now)
        .unwrap();
    for timer in &timers {
        Engine::new(Quiet).fire(store, timer, now).unwrap();
    }
    timers.len()
}

#[test]
fn retry_refuses_a_command_whose_failure_its_workflow_already_received() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("flow.db");
    let mut store = seeded(&db);
    let db_arg = db.to_str().unwrap();
    let id = "trip-001:1:1".parse().unwrap();
    assert_eq!(deliver_feedback(&mut store, SystemClock.now()), 1);

    let (ok, out, err) = miniflow(&["retry", db_arg, "trip-001:1:1"]);
    assert!(!ok, "{out}");
    for says in [
        "not retrying trip-001:1:1: its workflow trip-001 already received command_failed",
        "feedback trip-001:1:1:failed1 fired at",
        "may have compensated; a retry sends the command again",
        "--force",
    ] {
        assert!(err.contains(says), "{err}");
    }
    assert_eq!(store.command(&id).unwrap().unwrap().status, Status::Dead);

    let (ok, out, err) = miniflow(&["retry", db_arg, "trip-001:1:1", "--force"]);
    assert!(ok && out.contains("back to pending"), "{err}");
    let row = store.command(&id).unwrap().unwrap();
    assert_eq!((row.status, row.manual_retries), (Status::Pending, 1));

    // It dies again: its new feedback has not reached the workflow yet, so a retry goes ahead.
    let now = SystemClock.now();
    let claimed = store.claim(&ClaimRequest::new("w").limit(5), now).unwrap();
    let again = claimed.iter().find(|d| d.command_id == id).unwrap();
    store
        .fail(
            &id,
            again.token,
            &Failure::permanent("no"),
            &RetryPolicy::default(),
            now,
        )
        .unwrap();
    let (ok, _, err) = miniflow(&["retry", db_arg, "trip-001:1:1"]);
    assert!(ok, "{err}");
}

#[test]
fn unreadable_rows_are_listed_apart_and_shown_as_stored() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("flow.db");
    let mut store = seeded(&db);
    for seq in [0, 1] {
        let commit = Commit::new(
            WorkflowId::new("trip-002").unwrap(),
            Seq::new(seq).unwrap(),
            Event::new("trip_requested", json!({ "n": seq })),
            Decision::new().command(Command::new("lock_budget", json!({}))),
            Timestamp::from_millis(5),
        )
        .unwrap();
        store.append_with_commands(&commit).unwrap();
    }
    store
        .connection()
        .execute_batch(
            "UPDATE outbox SET payload = 'not json {' WHERE workflow_id = 'trip-001' AND idx = 2;
             UPDATE outbox SET created_at = -5 WHERE workflow_id = 'trip-001' AND idx = 1;
             UPDATE events SET payload = '{' WHERE workflow_id = 'trip-002' AND seq = 1;",
        )
        .unwrap();
    drop(store);
    let db_arg = db.to_str().unwrap();

    let (ok, out, err) = miniflow(&["pending", db_arg]);
    assert!(!ok, "unreadable rows end the tool with a failing status");
    assert!(err.contains("1 command could not be read"), "{err}");
    let (listed, unreadable) = out.split_once("unreadable (1 command;").expect(&out);
    assert!(
        listed.contains("trip-002:1:0")
            && listed.contains("trip-002:2:0")
            && listed.contains("(2 commands)"),
        "{out}"
    );
    assert!(!listed.contains("trip-001:1:2"), "{out}");
    assert!(
        unreadable.contains("trip-001:1:2")
            && unreadable.contains("pending")
            && unreadable.contains("column payload cannot be read as JSON"),
        "{out}"
    );

    let (ok, out, _) = miniflow(&["pending", db_arg, "--json"]);
    assert!(!ok);
    let lines = json_list(&out);
    assert_eq!(lines.len(), 3, "{out}");
    assert_eq!(lines[0]["command_id"], "trip-002:1:0");
    assert_eq!(lines[2]["unreadable"]["command_id"], "trip-001:1:2");
    assert_eq!(lines[2]["unreadable"]["status"], "pending");

    let (ok, out, _) = miniflow(&["dead", db_arg]);
    assert!(!ok);
    assert!(
        out.contains("(0 commands)")
            && out.contains("trip-001:1:1")
            && out.contains("negative time"),
        "{out}"
    );

    let (ok, out, err) = miniflow(&["show", db_arg, "trip-001:1:2"]);
    assert!(!ok && err.contains("show --raw"), "{err}");
    assert!(
        out.contains("trip-001:1:2") && out.contains("payload cannot be read as JSON"),
        "{out}"
    );
    let (ok, out, err) = miniflow(&["show", db_arg, "--raw", "trip-001:1:2"]);
    assert!(ok, "{err}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("payload") && l.ends_with(" not json {")),
        "{out}"
    );
    let (ok, out, _) = miniflow(&["show", db_arg, "--raw", "trip-001:1:2", "--json"]);
    let stored: serde_json::Value = serde_json::from_str(out.trim_end()).unwrap();
    assert!(ok);
    assert_eq!(
        (&stored["payload"], &stored["status"]),
        (&json!("not json {"), &json!("pending"))
    );

    let (ok, out, err) = miniflow(&["events", db_arg, "trip-002"]);
    assert!(
        !ok && err.contains("1 event of trip-002 could not be read"),
        "{err}"
    );
    assert!(
        out.contains("2 trip_requested           {\"n\":1}"),
        "{out}"
    );
    assert!(
        out.contains("1 unreadable: column payload cannot be read as JSON"),
        "{out}"
    );
}

/// A store on a read-only file system, as a backup is often mounted, can be read. Needs a private
/// mount namespace (`unshare -m`, as root); skipped where there is none.
#[cfg(target_os = "linux")]
#[test]
fn a_store_on_a_read_only_mount_can_be_read() {
    let dir = tempfile::tempdir().unwrap();
    let (files, mount) = (dir.path().join("files"), dir.path().join("mount"));
    std::fs::create_dir_all(&files).unwrap();
    std::fs::create_dir_all(&mount).unwrap();
    drop(seeded(&files.join("flow.db")));
    let script = r#"mount --bind "$1" "$2" && mount -o remount,bind,ro "$2" || exit 77
        touch "$2/probe" 2>/dev/null && exit 77
        exec "$3" dead "$2/flow.db""#;
    let out = Process::new("unshare")
        .args(["-m", "sh", "-c", script, "sh"])
        .args([
            &files,
            &mount,
            &PathBuf::from(env!("CARGO_BIN_EXE_miniflow")),
        ])
        .output();
    let out = match out {
        Ok(out) if out.status.code() != Some(77) => out,
        _ => return eprintln!("skipped: no read-only mount here"),
    };
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    if stderr.contains("unshare:") {
        return eprintln!("skipped: {stderr}");
    }
    assert!(out.status.success(), "{stderr}");
    assert!(
        stdout.contains("trip-001:1:1") && stdout.contains("422 no such hotel"),
        "{stdout}"
    );
}

// ------------------------------------------------------------------------------------------------
// PostgreSQL: the same commands on a database named by its URL.

/// A database with `trip-001:1:0` done, `trip-001:1:1` dead and `trip-001:1:2` pending.
fn postgres_seeded(url: &str) -> PostgresStore {
    let mut store = PostgresStore::connect(url).unwrap();
    seed_trip(&mut store);
    store
}

/// Everything a database holds: its tables and views (outside the system's schemas) and the rows of
/// miniflow's, as text.
fn postgres_contents(database: &TestDatabase) -> Vec<String> {
    let mut client = database.client();
    let mut contents: Vec<String> = client
        .query(
            "SELECT table_schema || '.' || table_name FROM information_schema.tables \
             WHERE table_schema NOT IN ('pg_catalog', 'information_schema') ORDER BY 1",
            &[],
        )
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    for table in [
        "miniflow_schema",
        "events",
        "outbox",
        "timers",
        "idempotency",
        "kind_controls",
        "retired_workflows",
    ] {
        let exists: bool = client
            .query_one("SELECT to_regclass($1) IS NOT NULL", &[&table])
            .unwrap()
            .get(0);
        if exists {
            let rows = client
                .query(
                    &format!("SELECT t::text FROM {table} t ORDER BY t::text COLLATE \"C\""),
                    &[],
                )
                .unwrap();
            contents.extend(
                rows.iter()
                    .map(|row| format!("{table}: {}", row.get::<_, String>(0))),
            );
        }
    }
    contents
}

#[test]
fn operators_handle_dead_letters_in_a_postgres_database_as_in_a_file() {
    let database = TestDatabase::new();
    let url = database.url();
    let store = postgres_seeded(&url);

    let (ok, out, err) = miniflow(&["dead", &url]);
    assert!(ok, "{err}");
    assert!(
        out.contains("trip-001:1:1")
            && out.contains("422 no such hotel")
            && out.contains("(1 command)"),
        "{out}"
    );
    let (ok, out, _) = miniflow(&["pending", &url, "--json"]);
    assert!(ok);
    let rows = json_list(&out);
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["command_id"], "trip-001:1:2");
    let (ok, out, _) = miniflow(&["show", &url, "trip-001:1:1"]);
    assert!(ok && out.contains("\"status\": \"dead\""), "{out}");
    let (ok, out, err) = miniflow(&["show", &url, "--raw", "trip-001:1:1", "--json"]);
    assert!(ok, "{err}");
    let stored: serde_json::Value = serde_json::from_str(out.trim_end()).unwrap();
    assert_eq!(
        (
            &stored["status"],
            &stored["attempts"],
            &stored["report_result"]
        ),
        (&json!("dead"), &json!(1), &json!(false))
    );
    let (ok, out, _) = miniflow(&["events", &url, "trip-001"]);
    assert!(ok);
    assert_eq!(out.trim(), "1 trip_requested           {\"city\":\"成都\"}");

    let (ok, _, err) = miniflow(&["resolve", &url, "trip-001:1:2", "--note", "oops"]);
    assert!(!ok, "a live command cannot be resolved by accident");
    assert!(
        err.contains("cannot resolve command trip-001:1:2: it is pending"),
        "{err}"
    );
    let (ok, out, err) = miniflow(&["retry", &url, "trip-001:1:1"]);
    assert!(ok && out.contains("back to pending"), "{err}");
    let id = "trip-001:1:1".parse().unwrap();
    assert_eq!(store.command(&id).unwrap().unwrap().status, Status::Pending);

    let (ok, out, _) = miniflow(&["purge-done", &url, "--older-than", "0s", "--dry-run"]);
    assert!(ok && out.contains("would purge 1 done command"), "{out}");
    let (ok, out, _) = miniflow(&["purge-finished", &url, "--older-than", "0s", "--dry-run"]);
    assert!(ok && out.contains("would retire 0 workflows"), "{out}");
    let (ok, out, _) = miniflow(&["purge-done", &url, "--older-than", "0s"]);
    assert!(ok && out.contains("purged 1 done command"), "{out}");
    let done = "trip-001:1:0".parse().unwrap();
    assert!(store.command(&done).unwrap().is_none());
}

#[test]
fn reading_a_postgres_database_changes_nothing_in_it() {
    let database = TestDatabase::new();
    let url = database.url();
    drop(postgres_seeded(&url));
    let before = postgres_contents(&database);
    for read in READS {
        let args = match read {
            "show" => vec![read, &url, "trip-001:1:1"],
            "events" => vec![read, &url, "trip-001"],
            _ => vec![read, &url],
        };
        let (ok, out, err) = miniflow(&args);
        assert!(ok, "{args:?}: {err}");
        assert!(
            out.contains("trip-001") || out.contains("trip_requested"),
            "{out}"
        );
    }
    let (ok, out, _) = miniflow(&["show", &url, "--raw", "trip-001:1:1"]);
    assert!(ok && out.contains("422 no such hotel"), "{out}");
    let (ok, out, _) = miniflow(&["purge-done", &url, "--older-than", "0s", "--dry-run"]);
    assert!(ok && out.contains("would purge 1 done command"), "{out}");
    let (ok, out, _) = miniflow(&["purge-finished", &url, "--older-than", "0s", "--dry-run"]);
    assert!(ok && out.contains("would retire 0 workflows"), "{out}");
    let (ok, out, err) = miniflow(&["stats", &url]);
    assert!(ok && out.contains("book_hotel"), "{out}{err}");
    let (ok, out, err) = miniflow(&[
        "retry",
        &url,
        "--kind",
        "book_hotel",
        "--all-dead",
        "--dry-run",
    ]);
    assert!(
        ok && out.contains("would retry 1 dead command"),
        "{out}{err}"
    );
    assert_eq!(
        postgres_contents(&database),
        before,
        "a read wrote the database"
    );

    // The reads' sessions are read-only: the database itself refuses a write through them.
    let mut reader = PostgresStore::connect_read_only(&url).unwrap();
    let commit = Commit::new(
        WorkflowId::new("trip-009").unwrap(),
        Seq::ZERO,
        Event::new("trip_requested", json!({})),
        Decision::new().command(Command::new("lock_budget", json!({}))),
        Timestamp::from_millis(9),
    )
    .unwrap();
    let refused = reader.append_with_commands(&commit).unwrap_err();
    assert!(refused.to_string().contains("read-only"), "{refused}");
    assert_eq!(postgres_contents(&database), before);
}

#[test]
fn no_command_turns_a_database_without_miniflow_into_a_store_but_migrate() {
    let database = TestDatabase::new();
    let url = database.url();
    database
        .client()
        .batch_execute(
            "CREATE TABLE accounts (id BIGINT PRIMARY KEY); INSERT INTO accounts VALUES (7)",
        )
        .unwrap();
    let before = postgres_contents(&database);
    for args in every_command(&url) {
        let (ok, out, err) = miniflow(&args);
        assert!(!ok, "{args:?} succeeded: {out}");
        assert!(
            err.contains("holds no miniflow schema")
                && err.contains(&format!("create it with `miniflow migrate {url}`")),
            "{args:?}: {err}"
        );
    }
    assert_eq!(
        postgres_contents(&database),
        before,
        "a command created tables"
    );

    let (ok, out, err) = miniflow(&["migrate", &url]);
    assert!(ok, "{err}");
    let says = format!("created miniflow's schema, version {POSTGRES_SCHEMA_VERSION}");
    assert!(out.contains(&says), "{out}");
    let (ok, out, _) = miniflow(&["migrate", &url]);
    let says = format!("already at schema version {POSTGRES_SCHEMA_VERSION}");
    assert!(ok && out.contains(&says), "{out}");
    let (ok, out, err) = miniflow(&["pending", &url]);
    assert!(ok && out.contains("(0 commands)"), "{out}{err}");

    // A database a newer miniflow migrated is refused by every command, `migrate` included.
    database
        .client()
        .batch_execute("INSERT INTO miniflow_schema (version) VALUES (99)")
        .unwrap();
    let says = format!("schema version 99, this miniflow supports up to {POSTGRES_SCHEMA_VERSION}");
    for args in every_command(&url)
        .into_iter()
        .chain([vec!["migrate", &url]])
    {
        let (ok, out, err) = miniflow(&args);
        assert!(!ok, "{args:?} succeeded: {out}");
        assert!(err.contains(&says), "{args:?}: {err}");
    }
}

#[test]
fn unreadable_rows_in_a_postgres_database_are_listed_apart_and_shown_as_stored() {
    let database = TestDatabase::new();
    let url = database.url();
    drop(postgres_seeded(&url));
    database
        .client()
        .batch_execute(
            "UPDATE outbox SET payload = 'not json {' WHERE workflow_id = 'trip-001' AND idx = 2;
             INSERT INTO events VALUES ('trip-001', 2, 'note', '{', 4);",
        )
        .unwrap();

    let (ok, out, err) = miniflow(&["pending", &url]);
    assert!(!ok, "unreadable rows end the tool with a failing status");
    assert!(err.contains("1 command could not be read"), "{err}");
    let (listed, unreadable) = out.split_once("unreadable (1 command;").expect(&out);
    assert!(listed.contains("(0 commands)"), "{out}");
    assert!(
        unreadable.contains("trip-001:1:2")
            && unreadable.contains("pending")
            && unreadable.contains("column payload cannot be read as JSON"),
        "{out}"
    );
    let (ok, out, err) = miniflow(&["show", &url, "trip-001:1:2"]);
    assert!(!ok && err.contains("show --raw"), "{err}");
    assert!(out.contains("payload cannot be read as JSON"), "{out}");
    let (ok, out, err) = miniflow(&["show", &url, "--raw", "trip-001:1:2"]);
    assert!(ok, "{err}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("payload") && l.ends_with(" not json {")),
        "{out}"
    );
    let (ok, out, err) = miniflow(&["events", &url, "trip-001"]);
    assert!(
        !ok && err.contains("1 event of trip-001 could not be read"),
        "{err}"
    );
    assert!(
        out.contains("1 trip_requested")
            && out.contains("2 unreadable: column payload cannot be read as JSON"),
        "{out}"
    );
}

#[test]
fn a_password_in_a_database_url_is_never_printed() {
    for url in [
        "postgresql://app:s3cret@127.0.0.1:1/flow",
        "postgres://app:s3cret@127.0.0.1:notaport/flow",
    ] {
        for args in every_command(url).into_iter().chain([vec!["migrate", url]]) {
            let (ok, out, err) = miniflow(&args);
            assert!(!ok, "{args:?} succeeded: {out}");
            assert!(
                !out.contains("s3cret") && !err.contains("s3cret"),
                "{args:?}: {err}"
            );
        }
    }
    // A password from PGPASSWORD is not printed either.
    let out = Process::new(env!("CARGO_BIN_EXE_miniflow"))
        .args(["dead", "postgresql://app@127.0.0.1:1/flow"])
        .env("PGPASSWORD", "s3cret")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && !err.contains("s3cret"), "{err}");
}

// ------------------------------------------------------------------------------------------------
// Operator controls: stats, pause, resume, limit, bulk actions, `--now`.

/// Milliseconds of an RFC 3339 time (UTC), for comparing what the tool stamped.
fn millis(rfc3339: &str) -> u64 {
    let at = humantime::parse_rfc3339(rfc3339).unwrap();
    let since = at.duration_since(std::time::UNIX_EPOCH).unwrap();
    u64::try_from(since.as_millis()).unwrap()
}

#[test]
fn stats_show_depth_lag_and_controls_as_a_table_and_as_json() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("flow.db");
    let store = seeded(&db);
    let db_arg = db.to_str().unwrap();

    // trip-001:1:2 book_flight is due since 1 ms, trip-001:1:1 book_hotel dead.
    let (ok, out, err) = miniflow(&["stats", db_arg, "--now", "10"]);
    assert!(ok, "{err}");
    assert!(
        out.starts_with("at 1970-01-01T00:00:00.010Z: lag 9ms"),
        "{out}"
    );
    let row = |kind: &str| {
        out.lines()
            .find(|l| l.starts_with(kind))
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .unwrap_or_else(|| panic!("no {kind} in {out}"))
    };
    assert_eq!(
        row("book_flight"),
        [
            "book_flight",
            "1",
            "1",
            "0",
            "0",
            "1970-01-01T00:00:00.001Z",
            "-"
        ]
    );
    assert_eq!(
        row("book_hotel"),
        ["book_hotel", "0", "0", "0", "1", "-", "-"]
    );
    assert_eq!(row("(total)"), ["(total)", "1", "1", "0", "1"]);
    assert!(
        !out.contains("lock_budget"),
        "done commands are not counted: {out}"
    );

    let (ok, out, _) = miniflow(&["stats", db_arg, "--json", "--now", "1970-01-01T00:00:01Z"]);
    assert!(ok);
    let stats: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(stats["now"], 1_000);
    assert_eq!(stats["lag_ms"], 999);
    assert_eq!(
        stats["totals"],
        json!({ "pending": 1, "due": 1, "leased": 0, "dead": 1, "oldest_due": 1, "idle": false })
    );
    assert!(stats["timers"]["scheduled"].is_u64(), "{stats}");
    assert_eq!(stats["kinds"][1]["kind"], "book_hotel");
    assert_eq!(stats["kinds"][1]["dead"], 1);
    assert_eq!(stats["controls"], json!([]));

    // A control shows in both forms, with who made it and when.
    drop(store);
    let (ok, _, err) = miniflow(&[
        "pause",
        db_arg,
        "book_hotel",
        "--by",
        "alice",
        "--now",
        "2025-01-01T08:00:00+08:00",
    ]);
    assert!(ok, "{err}");
    let (ok, out, _) = miniflow(&["stats", db_arg, "--now", "2025-01-01T00:00:00Z"]);
    assert!(ok);
    assert!(
        out.lines()
            .any(|l| l.starts_with("book_hotel") && l.ends_with("paused")),
        "{out}"
    );
    assert!(
        out.contains("controls:") && out.contains("by alice at 2025-01-01T00:00:00.000Z"),
        "{out}"
    );
    let (ok, out, _) = miniflow(&["stats", db_arg, "--json"]);
    assert!(ok);
    let stats: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(stats["controls"][0]["changed_by"], "alice");
    assert_eq!(
        stats["controls"][0]["changed_at"],
        millis("2025-01-01T00:00:00Z")
    );

    // An empty store: nothing due, no kinds.
    let empty = dir.path().join("empty.db");
    drop(SqliteStore::open(&empty).unwrap());
    let (ok, out, _) = miniflow(&["stats", empty.to_str().unwrap(), "--now", "5"]);
    assert!(ok && out.contains("lag 0s (nothing due)"), "{out}");
    assert!(
        out.contains("timers: 0 not fired (0 of them feedback), 0 due, next -")
            && out.contains("idle: nothing to deliver or fire"),
        "{out}"
    );
    let (ok, out, _) = miniflow(&["stats", empty.to_str().unwrap(), "--json"]);
    assert!(ok);
    let stats = serde_json::from_str::<serde_json::Value>(&out).unwrap();
    assert_eq!(stats["kinds"], json!([]));
    assert_eq!(stats["totals"]["idle"], true);
}

#[test]
fn pause_resume_and_limit_are_stored_recorded_and_obeyed_by_claims() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("flow.db");
    drop(seeded(&db));
    let db_arg = db.to_str().unwrap();
    let at = |ms: u64| Timestamp::from_millis(ms);

    let (ok, out, err) = miniflow(&[
        "pause",
        db_arg,
        "book_flight",
        "--by",
        "alice",
        "--now",
        "20",
    ]);
    assert!(ok, "{err}");
    assert_eq!(
        out,
        "book_flight: paused by alice at 1970-01-01T00:00:00.020Z; claims skip it until it is \
         resumed\n"
    );
    let mut store = SqliteStore::open(&db).unwrap();
    let controls = store.kind_controls().unwrap();
    assert_eq!(
        (
            controls[0].paused,
            controls[0].changed_by.as_str(),
            controls[0].changed_at
        ),
        (true, "alice", at(20))
    );
    assert!(store
        .claim(&ClaimRequest::new("w").limit(5), at(30))
        .unwrap()
        .is_empty());

    let (ok, out, err) = miniflow(&[
        "limit",
        db_arg,
        "book_flight",
        "1",
        "--by",
        "bob",
        "--json",
        "--now",
        "40",
    ]);
    assert!(ok, "{err}");
    let control: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        control,
        json!({ "kind": "book_flight", "paused": true, "concurrency_limit": 1,
                "changed_by": "bob", "changed_at": 40 })
    );
    let (ok, _, err) = miniflow(&["resume", db_arg, "book_flight", "--now", "50"]);
    assert!(ok, "{err}");
    let claimed = store
        .claim(&ClaimRequest::new("w").limit(5), at(60))
        .unwrap();
    assert_eq!(claimed.len(), 1, "resumed, at most one leased");
    let (ok, out, _) = miniflow(&[
        "limit",
        db_arg,
        "book_flight",
        "none",
        "--by",
        "bob",
        "--now",
        "70",
    ]);
    assert!(
        ok && out == "book_flight: limit removed by bob at 1970-01-01T00:00:00.070Z\n",
        "{out}"
    );
    assert!(!store.kind_controls().unwrap()[0].is_active());

    for (args, says) in [
        (
            vec!["limit", db_arg, "book_flight", "0"],
            "must be at least 1; pause the kind",
        ),
        (
            vec!["limit", db_arg, "book_flight", "many"],
            "\"many\" is not a limit",
        ),
        (
            vec!["pause", db_arg, ""],
            "invalid kind \"\": must not be empty",
        ),
        (vec!["pause", db_arg, "k", "--by", ""], "invalid by \"\""),
        (
            vec!["pause", db_arg, "k", "--now", "yesterday"],
            "\"yesterday\" is not a time",
        ),
        (
            vec!["pause", db_arg, "k", "--now", "1970-01-01T00:30:00+01:00"],
            "before 1970",
        ),
    ] {
        let (ok, _, err) = miniflow(&args);
        assert!(!ok && err.contains(says), "{args:?}: {err}");
    }
    assert_eq!(
        store.kind_controls().unwrap().len(),
        1,
        "nothing else was stored"
    );
}

/// A store with the `book_hotel` of three trips dead, and the `lock_budget` of trip-001.
fn dead_hotels(path: &Path) -> SqliteStore {
    let mut store = SqliteStore::open(path).unwrap();
    let now = Timestamp::from_millis(1);
    for n in 1..=3 {
        let decision = Decision::new()
            .command(Command::new("lock_budget", json!({})))
            .command(Command::new("book_hotel", json!({})));
        let commit = Commit::new(
            WorkflowId::new(format!("trip-00{n}")).unwrap(),
            Seq::ZERO,
            Event::new("trip_requested", json!({})),
            decision,
            now,
        )
        .unwrap();
        store.append_with_commands(&commit).unwrap();
    }
    for d in store.claim(&ClaimRequest::new("w").limit(10), now).unwrap() {
        if d.kind == "book_hotel" || d.command_id.to_string() == "trip-001:1:0" {
            store
                .fail(
                    &d.command_id,
                    d.token,
                    &Failure::permanent("422"),
                    &RetryPolicy::default(),
                    now,
                )
                .unwrap();
        } else {
            store.complete(&d.command_id, d.token, None, now).unwrap();
        }
    }
    store
}

#[test]
fn bulk_retry_and_resolve_of_a_kind_list_first_and_refuse_reported_failures() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("flow.db");
    let mut store = dead_hotels(&db);
    let db_arg = db.to_str().unwrap();
    let bulk = |extra: &[&str]| {
        let mut args = vec!["retry", db_arg, "--kind", "book_hotel", "--all-dead"];
        args.extend(extra);
        miniflow(&args)
    };

    let stored = std::fs::read(&db).unwrap();
    let (ok, out, err) = bulk(&["--dry-run"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("trip-001:1:1")
            && out.contains("trip-003:1:1")
            && !out.contains("trip-001:1:0"),
        "{out}"
    );
    assert!(
        out.contains(
            "would retry 3 dead commands of kind book_hotel; nothing was changed (dry run)"
        ),
        "{out}"
    );
    let (ok, out, _) = bulk(&["--dry-run", "--json"]);
    assert!(ok);
    assert_eq!(json_list(&out).len(), 3);
    assert_eq!(
        std::fs::read(&db).unwrap(),
        stored,
        "a dry run wrote the store"
    );

    // The workflows hear of the failures: a retry now needs --force, the dry run says so.
    let now = Timestamp::from_millis(2);
    while deliver_feedback(&mut store, now) > 0 {}
    let (ok, out, _) = bulk(&["--dry-run"]);
    assert!(
        ok && out.contains(
            "3 already reported to their workflow as command_failed (retrying them needs --force)"
        ),
        "{out}"
    );
    let (ok, _, err) = bulk(&[]);
    assert!(
        !ok && err.contains("the workflows of 3 commands already received command_failed")
            && err.contains("add --force"),
        "{err}"
    );
    assert_eq!(
        store.dead_letters_of_kind("book_hotel", 10).unwrap().len(),
        3
    );

    let (ok, out, err) = bulk(&["--force", "--json", "--now", "100"]);
    assert!(ok, "{err}");
    assert_eq!(
        json_list(&out),
        [
            json!("trip-001:1:1"),
            json!("trip-002:1:1"),
            json!("trip-003:1:1")
        ]
    );
    let row = store
        .command(&"trip-002:1:1".parse().unwrap())
        .unwrap()
        .unwrap();
    assert_eq!(
        (row.status, row.manual_retries, row.available_at),
        (Status::Pending, 1, Timestamp::from_millis(100))
    );
    assert_eq!(
        status_of(&store, "trip-001:1:0"),
        Status::Dead,
        "another kind"
    );

    let (ok, out, err) = miniflow(&[
        "resolve",
        db_arg,
        "--kind",
        "lock_budget",
        "--all-dead",
        "--note",
        "refunded",
        "--now",
        "200",
    ]);
    assert!(ok, "{err}");
    assert!(
        out.contains("trip-001:1:0: resolved by hand")
            && out.contains("1 dead command of kind lock_budget resolved by hand"),
        "{out}"
    );
    let row = store
        .command(&"trip-001:1:0".parse().unwrap())
        .unwrap()
        .unwrap();
    assert_eq!(
        (row.status, row.resolution.as_deref()),
        (Status::Done, Some("refunded"))
    );
    let (ok, out, _) = miniflow(&[
        "resolve",
        db_arg,
        "--kind",
        "lock_budget",
        "--all-dead",
        "--note",
        "x",
        "--dry-run",
        "--json",
    ]);
    assert!(ok && out.trim() == "[]", "{out}");
    let (ok, _, err) = miniflow(&["retry", db_arg, "--kind", "book_hotel"]);
    assert!(
        !ok && err.contains("--all-dead"),
        "a bulk action must be confirmed: {err}"
    );
    let (ok, _, err) = miniflow(&["retry", db_arg]);
    assert!(!ok && err.contains("--kind KIND --all-dead"), "{err}");
}

fn status_of(store: &SqliteStore, id: &str) -> Status {
    store.command(&id.parse().unwrap()).unwrap().unwrap().status
}

#[test]
fn now_stamps_actions_and_show_prints_rfc_3339_times() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("flow.db");
    let store = seeded(&db);
    let db_arg = db.to_str().unwrap();
    let (ok, _, err) = miniflow(&[
        "retry",
        db_arg,
        "trip-001:1:1",
        "--now",
        "2030-01-01T00:00:00.250+01:30",
    ]);
    assert!(ok, "{err}");
    let row = store
        .command(&"trip-001:1:1".parse().unwrap())
        .unwrap()
        .unwrap();
    assert_eq!(
        row.available_at.as_millis(),
        millis("2029-12-31T22:30:00Z") + 250
    );

    let (ok, out, _) = miniflow(&["show", db_arg, "trip-001:1:1"]);
    assert!(ok);
    let shown: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(shown["available_at"], "2029-12-31T22:30:00.250Z");
    assert_eq!(shown["created_at"], "1970-01-01T00:00:00.001Z");
    assert_eq!(shown["processed_at"], serde_json::Value::Null);
    assert_eq!(shown["lease"]["expires_at"], "1970-01-01T00:00:30.002Z");
    let (ok, out, _) = miniflow(&["show", db_arg, "trip-001:1:1", "--json"]);
    assert!(ok);
    let exact: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        exact["available_at"],
        millis("2029-12-31T22:30:00Z") + 250,
        "JSON keeps milliseconds"
    );
}

#[test]
fn empty_json_lists_are_brackets_and_a_cut_listing_says_so_on_stderr() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.db");
    drop(SqliteStore::open(&empty).unwrap());
    let empty_arg = empty.to_str().unwrap();
    for args in [
        vec!["pending", empty_arg, "--json"],
        vec!["dead", empty_arg, "--json"],
        vec!["events", empty_arg, "trip-001", "--json"],
    ] {
        let (ok, out, err) = miniflow(&args);
        assert!(
            ok && out == "[]\n" && err.is_empty(),
            "{args:?}: {out:?} {err}"
        );
    }

    let db = dir.path().join("flow.db");
    let mut store = SqliteStore::open(&db).unwrap();
    let decision: Decision = (0..3)
        .map(|n| Command::new("mail", json!({ "n": n })))
        .collect::<Vec<_>>()
        .into();
    let commit = Commit::new(
        WorkflowId::new("w").unwrap(),
        Seq::ZERO,
        Event::new("e", json!({})),
        decision,
        Timestamp::from_millis(1),
    )
    .unwrap();
    store.append_with_commands(&commit).unwrap();
    let db_arg = db.to_str().unwrap();
    let (ok, out, err) = miniflow(&["pending", db_arg, "--limit", "2", "--json"]);
    assert!(ok);
    assert_eq!(json_list(&out).len(), 2);
    assert_eq!(
        err,
        "miniflow: showing the first 2 commands; there are more (raise --limit to see them)\n"
    );
    for limit in ["3", "4"] {
        let (ok, out, err) = miniflow(&["pending", db_arg, "--limit", limit]);
        assert!(
            ok && out.contains("(3 commands)") && err.is_empty(),
            "{limit}: {out}{err}"
        );
    }
}

/// The commands of the README's "Operator controls" session: `cargo run --example operate` builds
/// the store, each `miniflow …` line runs the tool; comments after `#` and the alias line are left
/// out. Quotes group words, as a shell's do.
fn readme_session() -> Vec<Vec<String>> {
    let readme = include_str!("../../docs/operating.md");
    let section = readme
        .split("### Operator controls")
        .nth(1)
        .expect("README has an Operator controls section");
    let block = section
        .split("```sh\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("the section has a sh block");
    block
        .lines()
        .map(|line| line.split(" #").next().unwrap_or_default().trim())
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(|line| {
            let mut words = Vec::new();
            let mut word = String::new();
            let mut quoted = false;
            for c in line.chars() {
                match c {
                    '"' => quoted = !quoted,
                    ' ' if !quoted => {
                        if !word.is_empty() {
                            words.push(std::mem::take(&mut word));
                        }
                    }
                    c => word.push(c),
                }
            }
            if !word.is_empty() {
                words.push(word);
            }
            words
        })
        .collect()
}

#[test]
fn the_operator_controls_session_of_the_readme_runs() {
    let dir = tempfile::tempdir().unwrap();
    let session = readme_session();
    assert!(session.len() >= 8, "{session:?}");
    let mut outputs = Vec::new();
    for words in &session {
        match words
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>()
            .as_slice()
        {
            ["cargo", "run", "--example", name, "--", file] => {
                let path = dir.path().join(file);
                outputs.push(crate::examples::run_example(
                    name,
                    &[path.to_str().unwrap()],
                ));
            }
            ["miniflow", args @ ..] => {
                let (ok, out, err) = miniflow_in(Some(dir.path()), args);
                assert!(ok, "miniflow {args:?} failed: {err}\n{out}");
                outputs.push(out);
            }
            other => panic!("the README's session has a line the test cannot run: {other:?}"),
        }
    }
    let all = outputs.join("\n");
    for says in [
        "book_hotel: paused by alice at 2025-01-01T00:01:00.000Z",
        "send_confirmation: limited to 2 commands leased at once by alice at 2025-01-01T00:01:00.000Z",
        "would retry 2 dead commands of kind book_hotel",
        "2 dead commands of kind book_hotel back to pending",
        "book_hotel: resumed by alice",
        "send_confirmation: limit removed by alice",
    ] {
        assert!(all.contains(says), "the session did not print {says:?}:\n{all}");
    }
}

// ------------------------------------------------------------------------------------------------
// Times out of range, and what is not a store.

/// Runs the tool and returns its exit code (`None` when a signal ended it), stdout and stderr.
fn miniflow_status(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Process::new(env!("CARGO_BIN_EXE_miniflow"))
        .args(args)
        .output()
        .expect("run miniflow");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Whether the tool ended as a tool does, with 0 or 1 (or clap's 2 for bad arguments), rather than
/// by a panic (101) or a signal.
fn ended_cleanly(code: Option<i32>) -> bool {
    matches!(code, Some(0..=2))
}

#[test]
fn a_now_out_of_range_is_refused_naming_it_and_the_range() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("flow.db");
    let store = seeded(&db);
    let db_arg = db.to_str().unwrap();

    // Microseconds given as milliseconds: the year 58,900.
    let (code, out, err) =
        miniflow_status(&["retry", db_arg, "trip-001:1:1", "--now", "1796152429467000"]);
    assert!(
        ended_cleanly(code) && code != Some(0),
        "{code:?}: {out}{err}"
    );
    assert!(
        err.contains("1796152429467000")
            && err.contains("9999-12-31T23:59:59.999Z")
            && err.contains("253402300799999")
            && err.contains("microseconds")
            && err.contains("1796152429467"),
        "{err}"
    );
    assert_eq!(
        status_of(&store, "trip-001:1:1"),
        Status::Dead,
        "nothing was retried"
    );
    let (code, _, err) = miniflow_status(&["stats", db_arg, "--now", "1796152429467000"]);
    assert!(
        ended_cleanly(code) && code != Some(0) && err.contains("microseconds"),
        "{code:?}: {err}"
    );

    // The last millisecond of the year 9999 is accepted; the next one is not.
    let (code, out, err) = miniflow_status(&["stats", db_arg, "--now", "253402300799999"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.starts_with("at 9999-12-31T23:59:59.999Z:"), "{out}");
    let (code, _, err) = miniflow_status(&["stats", db_arg, "--now", "253402300800000"]);
    assert!(ended_cleanly(code) && code != Some(0), "{code:?}: {err}");
    assert!(
        err.contains("253402300800000") && err.contains("past the year 9999"),
        "{err}"
    );
    let (code, _, err) = miniflow_status(&["stats", db_arg, "--now", "18446744073709551616"]);
    assert!(ended_cleanly(code) && code != Some(0), "{code:?}: {err}");
    assert!(err.contains("18446744073709551616"), "{err}");

    // Seconds given as milliseconds are a time in January 1970: taken, with a word about it.
    let (code, out, err) = miniflow_status(&["stats", db_arg, "--now", "1735732800"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.starts_with("at 1970-01-21T02:08:52.800Z:"), "{out}");
    assert!(
        err.contains("seconds") && err.contains("1735732800000"),
        "{err}"
    );
}

#[test]
fn no_stored_time_makes_a_command_panic() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("flow.db");
    let store = seeded(&db);
    // What a `retry --now` in microseconds wrote, and the largest times a file can hold.
    store
        .connection()
        .execute_batch(
            "UPDATE outbox SET available_at = 1796152429467000 WHERE idx = 2;
             UPDATE outbox SET created_at = 9223372036854775807,
                 lease_expires_at = 9223372036854775807 WHERE idx = 1;
             UPDATE outbox SET processed_at = 9223372036854775807 WHERE idx = 0;
             UPDATE events SET recorded_at = 9223372036854775807;
             INSERT INTO kind_controls VALUES ('book_flight', 1, NULL, 'alice', 9223372036854775807);
             INSERT INTO retired_workflows VALUES ('trip-gone', 3, 9223372036854775807);",
        )
        .unwrap();
    drop(store);
    let db_arg = db.to_str().unwrap();
    let mut runs: Vec<Vec<&str>> = Vec::new();
    for id in ["trip-001:1:0", "trip-001:1:1", "trip-001:1:2"] {
        runs.push(vec!["show", db_arg, id]);
        runs.push(vec!["show", db_arg, id, "--json"]);
        runs.push(vec!["show", db_arg, id, "--raw"]);
    }
    for now in ["1", "2025-01-01T00:00:00Z", "9999-12-31T23:59:59.999Z"] {
        runs.push(vec!["stats", db_arg, "--now", now]);
        runs.push(vec!["stats", db_arg, "--now", now, "--json"]);
    }
    for list in ["pending", "dead"] {
        runs.push(vec![list, db_arg]);
        runs.push(vec![list, db_arg, "--json"]);
    }
    for workflow in ["trip-001", "trip-gone"] {
        runs.push(vec!["events", db_arg, workflow]);
        runs.push(vec!["events", db_arg, workflow, "--json"]);
    }
    runs.push(vec![
        "purge-done",
        db_arg,
        "--older-than",
        "1s",
        "--dry-run",
    ]);
    runs.push(vec![
        "purge-finished",
        db_arg,
        "--older-than",
        "1s",
        "--dry-run",
    ]);
    for args in &runs {
        let (code, out, err) = miniflow_status(args);
        assert!(
            ended_cleanly(code),
            "{args:?} ended with {code:?}:\n{out}\n{err}"
        );
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }

    // A time that has no RFC 3339 form is printed as the number it is.
    let (code, out, err) = miniflow_status(&["show", db_arg, "trip-001:1:2"]);
    assert_eq!(code, Some(0), "{err}");
    let shown: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        shown["available_at"],
        "1796152429467000 ms since the Unix epoch (past the year 9999)"
    );
    let (_, out, _) = miniflow_status(&["events", db_arg, "trip-gone"]);
    assert!(out.is_empty(), "{out}");
    let (_, _, err) = miniflow_status(&["events", db_arg, "trip-gone"]);
    assert!(
        err.contains("9223372036854775807 ms since the Unix epoch"),
        "{err}"
    );
    let (_, out, _) = miniflow_status(&["stats", db_arg, "--now", "1"]);
    assert!(
        out.contains("by alice at 9223372036854775807 ms since the Unix epoch"),
        "{out}"
    );
}

/// Connection strings that name no PostgreSQL database by URL, with the password `s3cret`, and how
/// the tool shows each.
const NOT_A_STORE: [(&str, &str); 4] = [
    (
        "host=db.internal password=s3cret dbname=flow",
        "host=db.internal password=*** dbname=flow",
    ),
    (
        "dbname=flow user=app password='s3 cret'",
        "dbname=flow user=app password=***",
    ),
    ("mysql://u:s3cret@h/x", "mysql://u:***@h/x"),
    (
        "sqlite://flow.db?password=s3cret",
        "sqlite://flow.db?password=***",
    ),
];

#[test]
fn a_connection_string_that_is_no_postgres_url_is_refused_without_its_password() {
    let dir = tempfile::tempdir().unwrap();
    for (given, shown) in NOT_A_STORE {
        for args in every_command(given).into_iter().chain([
            vec!["migrate", given],
            vec!["purge-finished", given, "--older-than", "1d"],
        ]) {
            let (ok, out, err) = miniflow_in(Some(dir.path()), &args);
            assert!(!ok, "{args:?} succeeded: {out}");
            for secret in ["s3cret", "s3 cret"] {
                assert!(
                    !out.contains(secret) && !err.contains(secret),
                    "{args:?} printed the password: {out}{err}"
                );
            }
            assert!(
                err.contains(shown)
                    && err.contains("connection string")
                    && err.contains("postgresql://")
                    && err.contains("SQLite file"),
                "{args:?}: {err}"
            );
        }
    }
    assert!(
        std::fs::read_dir(dir.path()).unwrap().next().is_none(),
        "no file is created for a connection string"
    );
    // Written without quotes, the words are arguments of their own: clap's complaint about them
    // does not show the password either.
    let (ok, out, err) = miniflow(&["dead", "host=db.internal", "password=s3cret"]);
    assert!(!ok, "{out}");
    assert!(!out.contains("s3cret") && !err.contains("s3cret"), "{err}");
    assert!(err.contains("password=***"), "{err}");
}
