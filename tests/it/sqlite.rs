//! The SQLite host's own guarantees: durable pragmas, schema versions, and commits racing from several
//! connections and processes on one file.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier};

use crate::child;
use miniflow::prelude::*;
use miniflow::{
    json, Command, Commit, Decision, Engine, Error, Event, EventRecord, Seq, SqliteOptions,
    SqliteStore, Synchronous, Timestamp, TraceContext, Workflow, WorkflowId, SCHEMA_VERSION,
};

fn pragma(store: &SqliteStore, name: &str) -> String {
    store
        .connection()
        .query_row(&format!("PRAGMA {name}"), [], |row| {
            row.get::<_, rusqlite::types::Value>(0)
        })
        .map(|v| match v {
            rusqlite::types::Value::Integer(i) => i.to_string(),
            rusqlite::types::Value::Text(t) => t,
            other => format!("{other:?}"),
        })
        .unwrap()
}

#[test]
fn durable_pragmas_are_on_by_default_and_normal_is_an_opt_in() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("a.db")).unwrap();
    assert_eq!(pragma(&store, "journal_mode"), "wal");
    assert_eq!(pragma(&store, "synchronous"), "2", "FULL");
    assert_eq!(pragma(&store, "foreign_keys"), "1");
    assert_eq!(pragma(&store, "busy_timeout"), "10000");
    assert_eq!(pragma(&store, "user_version"), SCHEMA_VERSION.to_string());
    let options = SqliteOptions {
        synchronous: Synchronous::Normal,
        ..SqliteOptions::default()
    };
    let relaxed = SqliteStore::open_with(dir.path().join("b.db"), &options).unwrap();
    assert_eq!(pragma(&relaxed, "synchronous"), "1", "NORMAL");
}

#[test]
fn a_store_from_a_newer_version_is_refused_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("future.db");
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch("CREATE TABLE from_the_future (x); PRAGMA user_version = 99;")
            .unwrap();
    }
    match SqliteStore::open(&path) {
        Err(Error::UnsupportedSchema { found, supported }) => {
            assert_eq!((found, supported), (99, SCHEMA_VERSION));
        }
        other => panic!("expected UnsupportedSchema, got {other:?}"),
    }
    let err = SqliteStore::open(&path).unwrap_err().to_string();
    assert!(err.contains("99") && err.contains("upgrade"), "{err}");
    let conn = rusqlite::Connection::open(&path).unwrap();
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    let tables: Vec<String> = conn
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(version, 99);
    assert_eq!(tables, ["from_the_future"], "the newer file was altered");
}

#[test]
fn names_that_are_no_file_are_refused_naming_the_path() {
    for (path, says) in [("", "is empty"), (":memory:", "MemoryStore")] {
        let err = SqliteStore::open(path).unwrap_err();
        assert_eq!(err.code(), "INVALID_INPUT", "{path:?}: {err}");
        assert!(
            err.to_string().contains("path") && err.to_string().contains(says),
            "{path:?}: {err}"
        );
    }
}

#[test]
fn reopening_keeps_the_schema_and_the_data() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flow.db");
    let mut store = SqliteStore::open(&path).unwrap();
    let commit = Commit::new(
        wid("w"),
        Seq::ZERO,
        Event::new("e", json!({"b": 1, "a": 2})),
        Decision::none(),
        Timestamp::from_millis(7),
    )
    .unwrap();
    store.append_with_commands(&commit).unwrap();
    drop(store);
    let store = SqliteStore::open(&path).unwrap();
    let stored: String = store
        .connection()
        .query_row("SELECT payload FROM events", [], |r| r.get(0))
        .unwrap();
    assert_eq!(
        stored, r#"{"a":2,"b":1}"#,
        "payloads are stored as canonical JSON"
    );
    assert_eq!(store.load(&wid("w")).unwrap().len(), 1);
}

#[test]
fn unreadable_rows_are_reported_as_corrupt_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = SqliteStore::open(dir.path().join("flow.db")).unwrap();
    let commit = Commit::new(
        wid("w"),
        Seq::ZERO,
        Event::new("e", json!({})),
        Decision::new().command(Command::new("c", json!({}))),
        Timestamp::from_millis(7),
    )
    .unwrap();
    store.append_with_commands(&commit).unwrap();
    store
        .connection()
        .execute_batch("UPDATE outbox SET payload = 'not json'; UPDATE events SET payload = '{'")
        .unwrap();
    // Lists across workflows skip what cannot be read (see `unreadable.rs`); what names the row fails.
    assert!(store.pending(10).unwrap().is_empty());
    let command = "w:1:0".parse().unwrap();
    assert!(matches!(store.command(&command), Err(Error::Corrupt(_))));
    assert!(matches!(store.load(&wid("w")), Err(Error::Corrupt(_))));
}

/// Child process: opens the store `MINIFLOW_TEST_DB` read-only, reads it as `miniflow dead` and
/// `miniflow pending` do, and prints what it read.
#[test]
fn child_reader() {
    if child::role().as_deref() != Some("reader") {
        return;
    }
    let store = match SqliteStore::open_read_only(child::setting("MINIFLOW_TEST_DB")) {
        Ok(store) => store,
        Err(e) => return println!("refused: {e}"),
    };
    let dead = store.dead_letters(10).unwrap().len();
    let pending = store.pending(10).unwrap().len();
    println!("dead={dead} pending={pending}");
}

/// Reads the store at `path` as `nobody` in a child process; what it printed.
fn read_as_nobody(path: &Path) -> String {
    let reader = child::spawn_through(
        &[
            "setpriv",
            "--reuid=nobody",
            "--regid=nogroup",
            "--clear-groups",
        ],
        "sqlite::child_reader",
        "reader",
        &[("MINIFLOW_TEST_DB", path.display().to_string())],
    );
    child::wait_ok(reader, "the read as nobody")
}

#[test]
fn a_read_as_another_user_leaves_nothing_beside_the_store_that_its_owner_cannot_write() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let uid = |path: &Path| std::fs::metadata(path).unwrap().uid();
    if uid(Path::new("/proc/self")) != 0 {
        eprintln!("skipped: reading the store as another user (nobody) needs root to switch users");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // A directory others may create files in, as one shared with operators.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let path = dir.path().join("flow.db");
    let commit = |store: &mut SqliteStore, seq: u64| {
        let commit = Commit::new(
            wid("w"),
            Seq::new(seq).unwrap(),
            Event::new("e", json!({})),
            Decision::new().command(Command::new("send", json!({}))),
            Timestamp::from_millis(7),
        )
        .unwrap();
        store.append_with_commands(&commit)
    };
    let mut store = SqliteStore::open(&path).unwrap();
    commit(&mut store, 0).unwrap();
    drop(store);
    let owner = uid(&path);
    let read = read_as_nobody(&path);
    assert_eq!(
        child::reported(&read, "pending").as_deref(),
        Some("1"),
        "{read}"
    );
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let entry = entry.unwrap();
        assert_eq!(
            entry.metadata().unwrap().uid(),
            owner,
            "{:?} is left beside the store by the reader, not owned by the store's owner",
            entry.file_name()
        );
    }
    let mut store = SqliteStore::open(&path).unwrap();
    commit(&mut store, 1).expect("the owner writes after the read");
    // A store left with commits in its -wal and no -shm (its writer was killed) cannot be read
    // without creating one: refused, saying why, and nothing created.
    let left = dir.path().join("left");
    std::fs::create_dir(&left).unwrap();
    std::fs::set_permissions(&left, std::fs::Permissions::from_mode(0o777)).unwrap();
    for name in ["flow.db", "flow.db-wal"] {
        std::fs::copy(dir.path().join(name), left.join(name)).unwrap();
    }
    drop(store);
    assert!(std::fs::metadata(left.join("flow.db-wal")).unwrap().len() > 0);
    let read = read_as_nobody(&left.join("flow.db"));
    assert!(
        read.contains("refused: ") && read.contains("holds commits that are not in the file yet"),
        "{read}"
    );
    let mut names: Vec<_> = std::fs::read_dir(&left)
        .unwrap()
        .map(|entry| entry.unwrap().file_name())
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["flow.db", "flow.db-wal"],
        "nothing created beside it"
    );
}

fn wid(text: &str) -> WorkflowId {
    WorkflowId::new(text).unwrap()
}

/// Counts its events; decides one `count` command per event.
struct Counter;

impl Workflow for Counter {
    type State = u64;

    fn evolve(&self, seen: &mut u64, _: &EventRecord) {
        *seen += 1;
    }

    fn decide(&self, seen: &u64, _: &EventRecord) -> Decision {
        Decision::new().command(Command::new("count", json!({ "seen": seen })))
    }
}

/// Commits on `expected_seq` 0 from `contenders` connections at once; returns how many won.
fn race_first_commit(path: &Path, contenders: usize) -> (usize, usize) {
    let barrier = Arc::new(Barrier::new(contenders));
    let handles: Vec<_> = (0..contenders)
        .map(|n| {
            let (path, barrier) = (path.to_path_buf(), barrier.clone());
            std::thread::spawn(move || {
                let mut store = SqliteStore::open(&path).unwrap();
                let commit = Commit::new(
                    wid("race"),
                    Seq::ZERO,
                    Event::new("first", json!({ "by": n })),
                    Decision::none(),
                    Timestamp::from_millis(1),
                )
                .unwrap();
                barrier.wait();
                store.append_with_commands(&commit)
            })
        })
        .collect();
    let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let wins = results.iter().filter(|r| r.is_ok()).count();
    let conflicts = results
        .iter()
        .filter(|r| matches!(r, Err(Error::Conflict { expected, actual, .. }) if expected.get() == 0 && actual.get() == 1))
        .count();
    (wins, conflicts)
}

#[test]
fn racing_connections_on_one_file_one_wins_the_others_conflict() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("race.db");
    SqliteStore::open(&path).unwrap();
    for round in 0..5 {
        let path = path.with_extension(format!("{round}.db"));
        SqliteStore::open(&path).unwrap();
        assert_eq!(race_first_commit(&path, 4), (1, 3), "round {round}");
    }
}

/// Child process: waits for the start file, then handles `MINIFLOW_TEST_EVENTS` events on one workflow
/// through the engine, retrying conflicts; prints how many conflicts it met.
#[test]
fn child_appender() {
    if child::role().as_deref() != Some("appender") {
        return;
    }
    let db = PathBuf::from(child::setting("MINIFLOW_TEST_DB"));
    let events: u64 = child::setting("MINIFLOW_TEST_EVENTS").parse().unwrap();
    let mut store = SqliteStore::open(&db).unwrap();
    let engine = Engine::new(Counter).max_conflict_retries(1_000);
    let go = db.with_extension("go");
    while !go.exists() {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let mut conflicts = 0;
    for _ in 0..events {
        let event = Event::new("tick", json!({ "pid": std::process::id() }));
        let handled = engine
            .handle(&mut store, &wid("shared"), event, Timestamp::from_millis(1))
            .unwrap_or_else(|e| panic!("handle failed in child: {e} ({})", e.code()));
        conflicts += handled.conflicts;
    }
    println!("conflicts={conflicts}");
}

#[test]
fn processes_appending_to_one_workflow_commit_gapless_without_busy_errors() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("shared.db");
    SqliteStore::open(&db).unwrap();
    let (processes, events) = (3, 60);
    let settings = [
        ("MINIFLOW_TEST_DB", db.display().to_string()),
        ("MINIFLOW_TEST_EVENTS", events.to_string()),
    ];
    let children: Vec<_> = (0..processes)
        .map(|_| child::spawn("sqlite::child_appender", "appender", &settings))
        .collect();
    std::fs::write(db.with_extension("go"), b"").unwrap();
    let mut conflicts = 0u64;
    for appender in children {
        let stdout = child::wait_ok(appender, "appender");
        let reported = child::reported(&stdout, "conflicts")
            .unwrap_or_else(|| panic!("child did not report: {stdout}"));
        conflicts += reported.parse::<u64>().unwrap();
    }
    let store = SqliteStore::open(&db).unwrap();
    let events_seen = store.load(&wid("shared")).unwrap();
    let seqs: Vec<u64> = events_seen.iter().map(|e| e.seq.get()).collect();
    assert_eq!(
        seqs,
        (1..=processes * events).collect::<Vec<_>>(),
        "gapless from 1"
    );
    let commands = store.commands(&wid("shared")).unwrap();
    assert_eq!(
        commands.len() as u64,
        processes * events,
        "one command per event, none lost or doubled"
    );
    for (n, row) in commands.iter().enumerate() {
        assert_eq!(
            row.payload,
            json!({ "seen": n }),
            "each decision saw every earlier event"
        );
    }
    eprintln!("{conflicts} conflicts were retried by the engine");
}

#[test]
fn idle_polling_does_not_take_the_write_lock() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idle.db");
    let mut store = SqliteStore::open(&path).unwrap();
    let commit = Commit::new(
        wid("w"),
        Seq::ZERO,
        Event::new("e", json!({})),
        Decision::new().command(Command::new("later", json!({}))),
        Timestamp::from_millis(10_000),
    )
    .unwrap();
    store.append_with_commands(&commit).unwrap();
    // Another writer holds the lock (a long producer commit, say).
    let holder = rusqlite::Connection::open(&path).unwrap();
    holder.execute_batch("BEGIN IMMEDIATE").unwrap();
    let options = SqliteOptions {
        busy_timeout: std::time::Duration::from_millis(50),
        ..SqliteOptions::default()
    };
    let mut poller = SqliteStore::open_with(&path, &options).unwrap();
    let request = miniflow::ClaimRequest::new("idle").limit(10);
    // Nothing is due yet: the poll answers at once, without queueing behind the writer.
    assert!(poller
        .claim(&request, Timestamp::from_millis(9_999))
        .unwrap()
        .is_empty());
    assert!(poller
        .claim_timers(
            10,
            std::time::Duration::from_secs(1),
            Timestamp::from_millis(9_999)
        )
        .unwrap()
        .is_empty());
    // Once something is due, a claim needs the lock and says the store is busy.
    assert!(matches!(
        poller.claim(&request, Timestamp::from_millis(10_000)),
        Err(Error::Busy(_))
    ));
    holder.execute_batch("COMMIT").unwrap();
    assert_eq!(
        poller
            .claim(&request, Timestamp::from_millis(10_000))
            .unwrap()
            .len(),
        1
    );
    // Due commands of a paused kind, or of a limited kind with no slot left, are nothing to take:
    // idle polls pass them by without the lock too.
    let commit = Commit::new(
        wid("w"),
        Seq::new(1).unwrap(),
        Event::new("e", json!({})),
        Decision::new()
            .command(Command::new("paused", json!({})))
            .command(Command::new("full", json!({}))),
        Timestamp::from_millis(10_000),
    )
    .unwrap();
    store.append_with_commands(&commit).unwrap();
    let now = Timestamp::from_millis(10_001);
    store
        .control_kind("paused", miniflow::KindChange::Pause, "test", now)
        .unwrap();
    store
        .control_kind("full", miniflow::KindChange::Limit(1), "test", now)
        .unwrap();
    let one = miniflow::ClaimRequest::new("holder").limit(1);
    assert_eq!(store.claim(&one, now).unwrap()[0].kind, "full");
    holder.execute_batch("BEGIN IMMEDIATE").unwrap();
    assert!(poller.claim(&request, now).unwrap().is_empty());
    holder.execute_batch("COMMIT").unwrap();
}

/// Claims batches of 5 as `worker` and completes them until nothing is pending, keeping in `in_flight`
/// how many commands the workers hold at once and in `most` the most they ever held; returns how many
/// it delivered.
pub(crate) fn deliver_counting_leases(
    mut store: impl Store,
    worker: &str,
    in_flight: &std::sync::atomic::AtomicUsize,
    most: &std::sync::atomic::AtomicUsize,
    now: Timestamp,
) -> usize {
    use std::sync::atomic::Ordering;
    use std::time::Duration;
    let request = miniflow::ClaimRequest::new(worker)
        .limit(5)
        .lease_ttl(Duration::from_secs(60));
    let mut delivered = 0;
    loop {
        let batch = store.claim(&request, now).unwrap();
        if batch.is_empty() {
            if store.pending(1).unwrap().is_empty() {
                return delivered;
            }
            std::thread::sleep(Duration::from_millis(1));
            continue;
        }
        let held = in_flight.fetch_add(batch.len(), Ordering::SeqCst) + batch.len();
        most.fetch_max(held, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(2));
        for delivery in &batch {
            // Counted out before the ack: the count never runs ahead of the leases.
            in_flight.fetch_sub(1, Ordering::SeqCst);
            store
                .complete(&delivery.command_id, delivery.token, None, now)
                .unwrap();
            delivered += 1;
        }
    }
}

/// Six workers, each on its own connection to one file, claim a kind limited to 3 at once as fast as
/// they can: a claim counts the kind's leases inside its `BEGIN IMMEDIATE` transaction, so no moment
/// has more than 3 leased, and every command is still delivered.
#[test]
fn a_concurrency_limit_holds_across_connections_claiming_at_once() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limit.db");
    let mut store = SqliteStore::open(&path).unwrap();
    let now = Timestamp::from_millis(1_000);
    for w in 0..20 {
        let decision: Decision = (0..3)
            .map(|n| Command::new("deliver", json!({ "n": n })))
            .collect::<Vec<_>>()
            .into();
        let commit = Commit::new(
            WorkflowId::new(format!("w{w:02}")).unwrap(),
            Seq::ZERO,
            Event::new("start", json!({})),
            decision,
            now,
        )
        .unwrap();
        store.append_with_commands(&commit).unwrap();
    }
    store
        .control_kind("deliver", miniflow::KindChange::Limit(3), "test", now)
        .unwrap();
    let (in_flight, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let workers: Vec<_> = (0..6)
        .map(|n| {
            let (path, in_flight, most) = (path.clone(), in_flight.clone(), most.clone());
            std::thread::spawn(move || {
                let store = SqliteStore::open(&path).unwrap();
                deliver_counting_leases(store, &format!("worker-{n}"), &in_flight, &most, now)
            })
        })
        .collect();
    let delivered: usize = workers.into_iter().map(|w| w.join().unwrap()).sum();
    assert_eq!(delivered, 60, "every command was delivered");
    let most = most.load(Ordering::SeqCst);
    assert!((2..=3).contains(&most), "workers held {most} at once");
}

/// A stored trace context that no longer parses (a hand-edited row, a value from elsewhere) is
/// ignored: the row reads, the command is delivered, only its trace is lost.
#[test]
fn a_stored_trace_context_that_does_not_parse_is_ignored_not_fatal() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = SqliteStore::open(dir.path().join("trace.db")).unwrap();
    let context: TraceContext = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        .parse()
        .unwrap();
    for workflow in ["kept", "damaged", "state"] {
        let decision = Decision::new().command(Command::new("notify", json!({})));
        let commit = Commit::new(
            WorkflowId::new(workflow).unwrap(),
            Seq::ZERO,
            Event::new("e", json!({})),
            decision,
            Timestamp::EPOCH,
        )
        .unwrap()
        .traced(context.clone());
        store.append_with_commands(&commit).unwrap();
    }
    let conn = store.connection();
    conn.execute_batch(
        "UPDATE outbox SET traceparent = 'not a traceparent' WHERE workflow_id = 'damaged';
         UPDATE outbox SET tracestate = 'NOT=valid=state' WHERE workflow_id = 'state';",
    )
    .unwrap();
    let (parent, state): (String, Option<String>) = conn
        .query_row(
            "SELECT traceparent, tracestate FROM outbox WHERE workflow_id = 'kept'",
            [],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .unwrap();
    assert_eq!(
        (parent.as_str(), state),
        (context.traceparent().as_str(), None)
    );
    let claimed = store
        .claim(
            &miniflow::ClaimRequest::new("w").limit(10),
            Timestamp::EPOCH,
        )
        .unwrap();
    let traces: Vec<(String, Option<TraceContext>)> = claimed
        .into_iter()
        .map(|d| (d.command_id.to_string(), d.trace_context))
        .collect();
    assert_eq!(
        traces,
        [
            ("damaged:1:0".to_owned(), None),
            ("kept:1:0".to_owned(), Some(context)),
            ("state:1:0".to_owned(), None),
        ]
    );
}

/// After a lost race the store waits before the engine tries again (`conflict_backoff`, times a
/// random 0.5–1.5), longer after each: writers of one workflow spread out instead of running out of
/// tries together.
#[test]
fn the_store_waits_before_a_retry_longer_after_each_lost_race() {
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir().unwrap();
    let mut store = SqliteStore::open(dir.path().join("flow.db")).unwrap();
    for (conflicts, at_least_ms) in [(1, 0.5), (4, 4.0), (9, 16.0)] {
        let started = Instant::now();
        store.before_retry(conflicts);
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_secs_f64(at_least_ms / 1_000.0),
            "after {conflicts} conflicts it waited {waited:?}"
        );
    }
}
