//! What the PostgreSQL store adds to the conformance suite: several connections at once, migrations,
//! errors, durability settings, rows that cannot be read, the caller's transaction, one clock for
//! leases, and wake-ups.

use std::collections::HashSet;
use std::sync::{mpsc, Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use super::TestDatabase;
use miniflow::prelude::*;
use miniflow::{
    json, Begin, ClaimOrder, ClaimRequest, Clock, Command, CommandId, Commit, Decision, Delivery,
    Digest, Dispatcher, Engine, Error, Event, EventRecord, IdempotencyKey, IdempotencyPolicy,
    IdempotencyStore, Outcome, PostgresDispatcher, PostgresIdempotencyStore, PostgresOptions,
    PostgresStore, Seq, Status, SystemClock, Timestamp, TraceContext, Wakeups, Workflow,
    WorkflowId,
};

const T0: Timestamp = Timestamp::from_millis(1_700_000_000_000);

fn wid(text: &str) -> WorkflowId {
    WorkflowId::new(text).unwrap()
}

/// Commits one event with `count` commands on top of the workflow's last seq, at `now`.
fn append(store: &mut PostgresStore, workflow: &str, count: usize, now: Timestamp) {
    let id = wid(workflow);
    let last = store.load(&id).unwrap().last().map_or(Seq::ZERO, |e| e.seq);
    let commands: Vec<Command> = (0..count)
        .map(|n| Command::new("deliver", json!({ "n": n })))
        .collect();
    let commit = Commit::new(
        id,
        last,
        Event::new("start", json!({})),
        commands.into(),
        now,
    )
    .unwrap();
    store.append_with_commands(&commit).unwrap();
}

#[test]
fn a_store_connects_and_migrates_a_fresh_database() {
    let database = TestDatabase::new();
    let store = PostgresStore::connect(&database.url()).unwrap();
    assert!(store.pending(10).unwrap().is_empty());
    let version: i64 = database
        .client()
        .query_one("SELECT max(version) FROM miniflow_schema", &[])
        .unwrap()
        .get(0);
    assert_eq!(version, miniflow::POSTGRES_SCHEMA_VERSION);
}

/// Sets `setting` (`name = value`) for the sessions that connect to `database` from now on.
fn alter_database(database: &TestDatabase, setting: &str) {
    let mut client = database.client();
    let name: String = client
        .query_one("SELECT current_database()", &[])
        .unwrap()
        .get(0);
    client
        .batch_execute(&format!("ALTER DATABASE \"{name}\" SET {setting}"))
        .unwrap();
}

/// A time past what the database stores is refused on every path, the commit's too, never written
/// as another time.
#[test]
fn a_time_past_what_the_database_stores_is_refused_by_commits_too() {
    let database = TestDatabase::new();
    let mut store = PostgresStore::connect(&database.url()).unwrap();
    let far = Timestamp::from_millis(u64::MAX);
    let commit = Commit::new(
        wid("w"),
        Seq::ZERO,
        Event::new("start", json!({})),
        Decision::new().command(Command::new("deliver", json!({}))),
        far,
    )
    .unwrap();
    let err = store.append_with_commands(&commit).unwrap_err();
    assert_eq!(err.code(), "INVALID_INPUT", "{err}");
    assert!(
        err.to_string().contains("past the year 292 million"),
        "{err}"
    );
    assert!(store.load(&wid("w")).unwrap().is_empty(), "nothing written");
    let claimed = store.claim(&ClaimRequest::new("w1"), far);
    assert!(
        matches!(claimed, Err(Error::InvalidInput { .. })),
        "{claimed:?}"
    );
}

/// A pooled connection the server closed while it sat idle (an idle-session timeout here; a
/// restart or a proxy alike) is tested and replaced when it is next checked out, not handed to the
/// caller's operation to fail.
#[test]
fn connections_the_server_closed_while_idle_are_replaced_not_failed() {
    let database = TestDatabase::new();
    alter_database(&database, "idle_session_timeout = '200ms'");
    let mut store = PostgresStore::connect(&database.url()).unwrap();
    for round in 0..3 {
        append(&mut store, &format!("w{round}"), 1, T0);
        // Past the server's timeout: it closes every idle connection of the pool.
        std::thread::sleep(Duration::from_millis(1_300));
        assert_eq!(
            store.pending(10).unwrap().len(),
            round + 1,
            "round {round}: the operation after the idle time succeeds"
        );
    }
}

#[test]
fn processes_migrating_at_once_apply_each_migration_once() {
    let database = TestDatabase::new();
    let url = database.url();
    let start = Arc::new(Barrier::new(6));
    // Outbox stores and receivers' stores alike: a receiver that wins the lock makes its table,
    // and the outbox's migrations then run around it.
    let connecting: Vec<_> = (0..6)
        .map(|n| {
            let (url, start) = (url.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                if n % 2 == 0 {
                    PostgresStore::connect(&url).map(drop)
                } else {
                    PostgresIdempotencyStore::connect(&url, IdempotencyPolicy::default()).map(drop)
                }
            })
        })
        .collect();
    for thread in connecting {
        thread.join().unwrap().unwrap();
    }
    let applied: i64 = database
        .client()
        .query_one("SELECT count(*) FROM miniflow_schema", &[])
        .unwrap()
        .get(0);
    assert_eq!(applied, miniflow::POSTGRES_SCHEMA_VERSION);
}

/// A database of schema version 1 (before operator controls) keeps its commands through the upgrade:
/// they get priority 0, and claims, stats and controls work on them.
#[test]
fn a_version_1_database_keeps_its_commands_through_the_upgrade_to_operator_controls() {
    let database = TestDatabase::new();
    let mut client = database.client();
    client
        .batch_execute(concat!(
            include_str!("../../../host-postgres/migrations/0001_init.sql"),
            include_str!("../../../host-postgres/migrations/idempotency.sql")
        ))
        .unwrap();
    client
        .batch_execute(
            "CREATE TABLE miniflow_schema (version BIGINT PRIMARY KEY,
                 applied_at TIMESTAMPTZ NOT NULL DEFAULT now());
             INSERT INTO miniflow_schema (version) VALUES (1);
             INSERT INTO events VALUES ('w', 1, 'start', '{}', 5);
             INSERT INTO outbox (workflow_id, event_seq, idx, kind, payload, status, attempts,
                 available_at, lease_owner, lease_expires_at, lease_token, created_at, processed_at)
             VALUES ('w', 1, 0, 'book', '{}', 'pending', 0, 5, NULL, NULL, 0, 5, NULL),
                    ('w', 1, 1, 'book', '{}', 'leased', 1, 900, 'old', 900, 1, 5, NULL),
                    ('w', 1, 2, 'mail', '{}', 'dead', 3, 5, 'old', 50, 3, 5, 60);",
        )
        .unwrap();
    assert!(
        PostgresStore::connect_read_only(&database.url()).is_err(),
        "reading refuses an older schema"
    );
    let mut store = PostgresStore::connect(&database.url()).unwrap();
    let versions: Vec<i64> = client
        .query("SELECT version FROM miniflow_schema ORDER BY version", &[])
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    let every: Vec<i64> = (1..=miniflow::POSTGRES_SCHEMA_VERSION).collect();
    assert_eq!(versions, every);
    let stats = store.stats(Timestamp::from_millis(100)).unwrap();
    let book = stats.kind("book").unwrap();
    assert_eq!((book.pending, book.leased, book.due), (1, 1, 1));
    assert_eq!(stats.kind("mail").unwrap().dead, 1);
    let claimed = store
        .claim(
            &ClaimRequest::new("new").limit(5),
            Timestamp::from_millis(1_000),
        )
        .unwrap();
    let ids: Vec<_> = claimed.iter().map(|d| d.command_id.to_string()).collect();
    assert_eq!(ids, ["w:1:0", "w:1:1"]);
    assert_eq!(claimed[1].token, 2, "the fencing token goes on counting");
    let priorities: Vec<i32> = client
        .query("SELECT priority FROM outbox ORDER BY idx", &[])
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(priorities, [0, 0, 0]);
}

#[test]
fn a_database_of_a_newer_miniflow_is_refused_untouched() {
    let database = TestDatabase::new();
    drop(PostgresStore::connect(&database.url()).unwrap());
    database
        .client()
        .batch_execute("INSERT INTO miniflow_schema (version) VALUES (99)")
        .unwrap();
    match PostgresStore::connect(&database.url()) {
        Err(Error::UnsupportedSchema {
            found: 99,
            supported,
        }) => {
            assert_eq!(supported, miniflow::POSTGRES_SCHEMA_VERSION);
        }
        other => panic!("a newer schema was not refused: {other:?}"),
    }
}

/// The tables of the database's `public` schema, sorted.
fn public_tables(database: &TestDatabase) -> Vec<String> {
    database
        .client()
        .query(
            "SELECT tablename::text FROM pg_tables WHERE schemaname = 'public' ORDER BY 1",
            &[],
        )
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect()
}

#[test]
fn a_receivers_store_makes_its_table_alone_and_an_outbox_migrated_later_keeps_its_records() {
    let database = TestDatabase::new();
    let policy = IdempotencyPolicy::default();
    let mut keys = PostgresIdempotencyStore::connect(&database.url(), policy).unwrap();
    assert_eq!(
        public_tables(&database),
        ["idempotency", "miniflow_receiver_schema"],
        "a supplier's database gets the records, no outbox"
    );
    let key = IdempotencyKey::new("trip-1:1:0").unwrap();
    let digest = Digest::of(&json!({ "seat": "12A" }));
    let Begin::Fresh { token } = keys.begin(&key, digest, T0).unwrap() else {
        panic!("a new key is fresh")
    };
    keys.finish(&key, token, &json!({ "booking": 7 }), T0)
        .unwrap();

    // The same database becomes an outbox's too: its migrations run around the table.
    let store = PostgresStore::connect(&database.url()).unwrap();
    assert!(store.pending(10).unwrap().is_empty());
    let version: i64 = database
        .client()
        .query_one("SELECT max(version) FROM miniflow_schema", &[])
        .unwrap()
        .get(0);
    assert_eq!(version, miniflow::POSTGRES_SCHEMA_VERSION);
    for keys in [
        &mut keys,
        &mut PostgresIdempotencyStore::connect(&database.url(), policy).unwrap(),
        &mut PostgresIdempotencyStore::on(&store, policy).unwrap(),
    ] {
        match keys.begin(&key, digest, T0).unwrap() {
            Begin::Completed { result } => assert_eq!(result, json!({ "booking": 7 })),
            other => panic!("the record did not survive the outbox's migrations: {other:?}"),
        }
    }
    // A receiver that does not migrate accepts either track.
    let checking = PostgresOptions::new().migrate(false);
    PostgresIdempotencyStore::connect_with(&database.url(), policy, &checking).unwrap();
    let receivers_only = TestDatabase::new();
    drop(PostgresIdempotencyStore::connect(&receivers_only.url(), policy).unwrap());
    PostgresIdempotencyStore::connect_with(&receivers_only.url(), policy, &checking).unwrap();
    // ...and an outbox store that does not migrate still wants the outbox.
    match PostgresStore::connect_with(&receivers_only.url(), &checking) {
        Err(Error::InvalidInput { field: "url", .. }) => {}
        other => panic!("a receiver's database was taken for an outbox: {other:?}"),
    }
}

#[test]
fn a_receiver_refuses_a_database_without_records_or_of_a_newer_miniflow_untouched() {
    let policy = IdempotencyPolicy::default();
    let empty = TestDatabase::new();
    let checking = PostgresOptions::new().migrate(false);
    match PostgresIdempotencyStore::connect_with(&empty.url(), policy, &checking) {
        Err(e @ Error::InvalidInput { field: "url", .. }) => assert!(
            e.to_string()
                .contains("holds no miniflow idempotency records"),
            "the message says what is missing: {e}"
        ),
        other => panic!("an empty database was accepted: {other:?}"),
    }
    assert!(public_tables(&empty).is_empty(), "nothing was created");

    for (table, by_an_outbox) in [
        ("miniflow_receiver_schema", false),
        ("miniflow_schema", true),
    ] {
        let database = TestDatabase::new();
        if by_an_outbox {
            drop(PostgresStore::connect(&database.url()).unwrap());
        } else {
            drop(PostgresIdempotencyStore::connect(&database.url(), policy).unwrap());
        }
        database
            .client()
            .batch_execute(&format!("INSERT INTO {table} (version) VALUES (99)"))
            .unwrap();
        let before = public_tables(&database);
        match PostgresIdempotencyStore::connect(&database.url(), policy) {
            Err(Error::UnsupportedSchema { found: 99, .. }) => {}
            other => panic!("a newer {table} was not refused: {other:?}"),
        }
        assert_eq!(
            public_tables(&database),
            before,
            "{table}: nothing was changed"
        );
    }
}

#[test]
fn connection_failures_and_bad_settings_are_reported_as_their_kinds() {
    let unreachable = "postgresql://nobody@127.0.0.1:1/none";
    let options = PostgresOptions::new().connect_timeout(Duration::from_secs(2));
    match PostgresStore::connect_with(unreachable, &options) {
        Err(e @ Error::Storage(_)) => {
            assert_eq!(e.code(), "STORAGE");
            assert!(
                e.to_string()
                    .contains("cannot connect to url postgresql://nobody@127.0.0.1:1/none"),
                "the message says where: {e}"
            );
        }
        other => panic!("an unreachable server gave {other:?}"),
    }
    match PostgresStore::connect("postgresql://[not a url") {
        Err(Error::InvalidInput { field: "url", .. }) => {}
        other => panic!("a malformed URL gave {other:?}"),
    }
    match PostgresStore::connect_with(
        "postgresql://app:s3cret@127.0.0.1:1/x",
        &PostgresOptions::new().pool_size(0),
    ) {
        Err(Error::InvalidInput {
            field: "pool_size", ..
        }) => {}
        other => panic!("a pool of 0 gave {other:?}"),
    }
}

#[test]
fn a_row_locked_past_the_lock_timeout_is_busy_and_changes_nothing() {
    let database = TestDatabase::new();
    let mut store = PostgresStore::connect(&database.url()).unwrap();
    append(&mut store, "w", 1, T0);
    alter_database(&database, "lock_timeout = '100ms'");
    // A new pool, so its connections start with the database's lock timeout.
    let mut store = PostgresStore::connect(&database.url()).unwrap();
    let mut holder = database.client();
    let mut tx = holder.transaction().unwrap();
    tx.batch_execute("SELECT * FROM outbox FOR UPDATE").unwrap();
    let id: CommandId = "w:1:0".parse().unwrap();
    match store.mark_done(&id, T0) {
        Err(e @ Error::Busy(_)) => assert_eq!(e.code(), "BUSY"),
        other => panic!("a lock held past the lock timeout gave {other:?}"),
    }
    tx.rollback().unwrap();
    assert_eq!(store.command(&id).unwrap().unwrap().status, Status::Pending);
    store.mark_done(&id, T0).unwrap();
}

#[test]
fn a_server_that_may_lose_commits_is_refused_unless_the_caller_opts_in() {
    let database = TestDatabase::new();
    alter_database(&database, "synchronous_commit = off");
    match PostgresStore::connect(&database.url()) {
        Err(Error::Storage(e)) => assert!(e.to_string().contains("synchronous_commit"), "{e}"),
        other => panic!("synchronous_commit = off was accepted: {other:?}"),
    }
    let opted_in = PostgresOptions::new().require_durable_commits(false);
    PostgresStore::connect_with(&database.url(), &opted_in).unwrap();
}

#[test]
fn test_databases_sort_text_by_a_language_and_miniflow_still_sorts_bytes() {
    let database = TestDatabase::new();
    let mut store = PostgresStore::connect(&database.url()).unwrap();
    for workflow in ["b", "B", "a:b", "a", "a-b"] {
        append(&mut store, workflow, 1, T0);
    }
    let order: Vec<String> = store
        .pending(10)
        .unwrap()
        .iter()
        .map(|row| row.command_id.workflow_id().to_string())
        .collect();
    assert_eq!(order, ["B", "a", "a-b", "a:b", "b"]);
    let icu: bool = database
        .client()
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_collation WHERE collprovider = 'i')",
            &[],
        )
        .unwrap()
        .get(0);
    if icu {
        let provider: i8 = database
            .client()
            .query_one(
                "SELECT datlocprovider FROM pg_database WHERE datname = current_database()",
                &[],
            )
            .unwrap()
            .get(0);
        assert_eq!(provider as u8, b'i', "the test databases use ICU collation");
    }
}

#[test]
fn workers_on_many_connections_never_hold_the_same_command() {
    let database = TestDatabase::new();
    let mut store = PostgresStore::connect(&database.url()).unwrap();
    for workflow in 0..20 {
        append(&mut store, &format!("w{workflow:02}"), 10, T0);
    }
    let taken = Arc::new(Mutex::new(Vec::<CommandId>::new()));
    let workers: Vec<_> = (0..6)
        .map(|n| {
            let (mut store, taken) = (store.clone(), taken.clone());
            std::thread::spawn(move || {
                let request = ClaimRequest::new(format!("worker-{n}"))
                    .limit(7)
                    .lease_ttl(Duration::from_secs(60));
                loop {
                    let batch = store.claim(&request, T0).unwrap();
                    if batch.is_empty() {
                        break;
                    }
                    for delivery in &batch {
                        taken.lock().unwrap().push(delivery.command_id.clone());
                        store
                            .complete(&delivery.command_id, delivery.token, None, T0)
                            .unwrap();
                    }
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().unwrap();
    }
    let taken = taken.lock().unwrap();
    let distinct: HashSet<_> = taken.iter().collect();
    assert_eq!(taken.len(), 200, "every command was delivered");
    assert_eq!(distinct.len(), 200, "and none twice");
    assert!(store.pending(10).unwrap().is_empty());
}

/// Six workers on their own connections claim a kind limited to 3 at once, as fast as they can:
/// the claims lock the kind's control row (`FOR UPDATE SKIP LOCKED`) before they count its leases,
/// so no moment ever has more than 3 leased, by the workers' own count or by the database's, and
/// every command is still delivered.
#[test]
fn a_concurrency_limit_holds_across_connections_claiming_at_once() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let database = TestDatabase::new();
    let mut store = PostgresStore::connect(&database.url()).unwrap();
    for workflow in 0..20 {
        append(&mut store, &format!("w{workflow:02}"), 3, T0);
    }
    store
        .control_kind("deliver", miniflow::KindChange::Limit(3), "test", T0)
        .unwrap();
    let (in_flight, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let done = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (mut client, done) = (database.client(), done.clone());
        std::thread::spawn(move || {
            let mut seen = 0;
            while !done.load(Ordering::SeqCst) {
                let leased: i64 = client
                    .query_one(
                        "SELECT count(*) FROM outbox WHERE kind = 'deliver' AND status = 'leased'",
                        &[],
                    )
                    .unwrap()
                    .get(0);
                seen = seen.max(leased);
            }
            seen
        })
    };
    let workers: Vec<_> = (0..6)
        .map(|n| {
            let (store, in_flight, most) = (store.clone(), in_flight.clone(), most.clone());
            std::thread::spawn(move || {
                crate::sqlite::deliver_counting_leases(
                    store,
                    &format!("worker-{n}"),
                    &in_flight,
                    &most,
                    T0,
                )
            })
        })
        .collect();
    let delivered: usize = workers.into_iter().map(|w| w.join().unwrap()).sum();
    done.store(true, Ordering::SeqCst);
    let seen_by_database = watcher.join().unwrap();
    assert_eq!(delivered, 60, "every command was delivered");
    assert!(
        most.load(Ordering::SeqCst) <= 3,
        "workers held {} at once",
        most.load(Ordering::SeqCst)
    );
    assert!(
        seen_by_database <= 3,
        "the database had {seen_by_database} leased"
    );
    assert!(most.load(Ordering::SeqCst) >= 2, "the workers did overlap");
}

struct Counter;

impl Workflow for Counter {
    type State = ();
    fn evolve(&self, _: &mut (), _: &EventRecord) {}
    fn decide(&self, _: &(), _: &EventRecord) -> Decision {
        Decision::new().command(Command::new("tick", json!({})))
    }
}

#[test]
fn racing_commits_on_one_workflow_keep_its_seqs_gapless() {
    let database = TestDatabase::new();
    let store = PostgresStore::connect(&database.url()).unwrap();
    let start = Arc::new(Barrier::new(4));
    let writers: Vec<_> = (0..4)
        .map(|_| {
            let (mut store, start) = (store.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                let engine = Engine::new(Counter);
                let mut written = 0;
                while written < 10 {
                    // The engine retries a lost race a few times; four writers can outlast that.
                    match engine.handle(&mut store, &wid("shared"), Event::new("e", json!({})), T0)
                    {
                        Ok(_) => written += 1,
                        Err(Error::Conflict { .. }) => {}
                        Err(e) => panic!("{e}"),
                    }
                }
            })
        })
        .collect();
    for writer in writers {
        writer.join().unwrap();
    }
    let seqs: Vec<u64> = store
        .load(&wid("shared"))
        .unwrap()
        .iter()
        .map(|e| e.seq.get())
        .collect();
    assert_eq!(seqs, (1..=40).collect::<Vec<_>>());
    assert_eq!(store.commands(&wid("shared")).unwrap().len(), 40);
}

#[test]
fn a_lost_race_is_a_conflict_naming_the_actual_seq() {
    let database = TestDatabase::new();
    let mut store = PostgresStore::connect(&database.url()).unwrap();
    append(&mut store, "w", 0, T0);
    append(&mut store, "w", 0, T0);
    let stale = Commit::new(
        wid("w"),
        Seq::new(1).unwrap(),
        Event::new("late", json!({})),
        Decision::none(),
        T0,
    )
    .unwrap();
    match store.append_with_commands(&stale) {
        Err(Error::Conflict {
            expected, actual, ..
        }) => assert_eq!((expected.get(), actual.get()), (1, 2)),
        other => panic!("a stale commit gave {other:?}"),
    }
}

#[test]
fn a_row_that_cannot_be_read_is_buried_by_the_claim_and_stops_no_other() {
    let database = TestDatabase::new();
    let mut store = PostgresStore::connect(&database.url()).unwrap();
    append(&mut store, "bad", 1, T0);
    append(&mut store, "good", 2, T0);
    database
        .client()
        .batch_execute("UPDATE outbox SET payload = '{not json' WHERE workflow_id = 'bad'")
        .unwrap();
    assert_eq!(store.pending(10).unwrap().len(), 2, "pending skips it");
    let request = ClaimRequest::new("w").limit(2);
    let claimed: Vec<String> = store
        .claim(&request, T0)
        .unwrap()
        .iter()
        .map(|d| d.command_id.to_string())
        .collect();
    assert_eq!(
        claimed,
        ["good:1:0", "good:1:1"],
        "the burial took no place"
    );
    let (status, error): (String, String) = database
        .client()
        .query_one(
            "SELECT status, last_error FROM outbox WHERE workflow_id = 'bad'",
            &[],
        )
        .map(|row| (row.get(0), row.get(1)))
        .unwrap();
    assert_eq!(status, "dead");
    assert!(error.contains("column payload"), "{error}");
    let feedback: Vec<String> = store
        .timers(&wid("bad"))
        .unwrap()
        .iter()
        .map(|t| t.timer_id.to_string())
        .collect();
    assert_eq!(feedback, ["bad:1:0:failed1"], "its workflow is told");
}

/// A stored trace context that no longer parses is ignored: the row reads and is delivered, only
/// its trace is lost; a valid one comes back as it was committed.
#[test]
fn a_stored_trace_context_that_does_not_parse_is_ignored_not_fatal() {
    let database = TestDatabase::new();
    let mut store = PostgresStore::connect(&database.url()).unwrap();
    let context = TraceContext::parse(
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        Some("vendor=1"),
    )
    .unwrap();
    for workflow in ["damaged", "kept"] {
        let commit = Commit::new(
            wid(workflow),
            Seq::ZERO,
            Event::new("start", json!({})),
            Decision::new().command(Command::new("deliver", json!({}))),
            T0,
        )
        .unwrap()
        .traced(context.clone());
        store.append_with_commands(&commit).unwrap();
    }
    database
        .client()
        .batch_execute("UPDATE outbox SET traceparent = '00-zz' WHERE workflow_id = 'damaged'")
        .unwrap();
    let traces: Vec<(String, Option<TraceContext>)> = store
        .claim(&ClaimRequest::new("w").limit(10), T0)
        .unwrap()
        .into_iter()
        .map(|d| (d.command_id.to_string(), d.trace_context))
        .collect();
    assert_eq!(
        traces,
        [
            ("damaged:1:0".to_owned(), None),
            ("kept:1:0".to_owned(), Some(context))
        ]
    );
}

#[test]
fn errors_with_nul_characters_are_kept_readable() {
    let database = TestDatabase::new();
    let mut store = PostgresStore::connect(&database.url()).unwrap();
    append(&mut store, "w", 1, T0);
    let delivery = store.claim(&ClaimRequest::new("w"), T0).unwrap().remove(0);
    store
        .fail(
            &delivery.command_id,
            delivery.token,
            &miniflow::Failure::permanent("bad\0byte"),
            &miniflow::RetryPolicy::default(),
            T0,
        )
        .unwrap();
    let row = store.command(&delivery.command_id).unwrap().unwrap();
    assert_eq!(row.status, Status::Dead);
    assert_eq!(row.last_error.as_deref(), Some("bad\u{FFFD}byte"));
}

#[test]
fn a_commit_in_the_callers_transaction_stands_or_falls_with_it() {
    let database = TestDatabase::new();
    let store = PostgresStore::connect(&database.url()).unwrap();
    let mut client = store.client().unwrap();
    client
        .batch_execute("CREATE TABLE orders (id TEXT PRIMARY KEY, total BIGINT)")
        .unwrap();
    let engine = Engine::new(Counter);
    for commit in [false, true] {
        let mut tx = client.transaction().unwrap();
        tx.execute("INSERT INTO orders VALUES ('order-7', 1200)", &[])
            .unwrap();
        store
            .handle_in(
                &mut tx,
                &engine,
                &wid("order-7"),
                Event::new("placed", json!({})),
                T0,
            )
            .unwrap();
        if commit {
            tx.commit().unwrap();
        } else {
            tx.rollback().unwrap();
            assert!(store.load(&wid("order-7")).unwrap().is_empty());
            assert!(store.pending(10).unwrap().is_empty());
        }
    }
    assert_eq!(store.commands(&wid("order-7")).unwrap().len(), 1);
    // A conflict inside the caller's transaction leaves the caller's own rows to the caller.
    let mut tx = client.transaction().unwrap();
    tx.execute("INSERT INTO orders VALUES ('order-8', 5)", &[])
        .unwrap();
    let stale = Commit::new(
        wid("order-7"),
        Seq::ZERO,
        Event::new("placed", json!({})),
        Decision::none(),
        T0,
    )
    .unwrap();
    assert!(matches!(
        store.append_in(&mut tx, &stale),
        Err(Error::Conflict { .. })
    ));
    tx.commit().unwrap();
    let orders: i64 = client
        .query_one("SELECT count(*) FROM orders", &[])
        .unwrap()
        .get(0);
    assert_eq!(orders, 2);
}

#[test]
fn a_batch_of_acks_settles_like_the_same_acks_one_by_one() {
    use miniflow::{Ack, MemoryStore};
    let database = TestDatabase::new();
    let mut postgres = PostgresStore::connect(&database.url()).unwrap();
    let mut memory = MemoryStore::new();
    let stores: [&mut dyn Store; 2] = [&mut memory, &mut postgres];
    let mut answers = Vec::new();
    for store in stores {
        let id = wid("w");
        let decision = Decision::new()
            .command(Command::new("plain", json!({})))
            .command(Command::new("plain", json!({})))
            .command(Command::new("reported", json!({})).report_result());
        let commit = Commit::new(
            id.clone(),
            Seq::ZERO,
            Event::new("e", json!({})),
            decision,
            T0,
        )
        .unwrap();
        store.append_with_commands(&commit).unwrap();
        let d = store.claim(&ClaimRequest::new("w").limit(3), T0).unwrap();
        let acks = [
            Ack::new(d[0].command_id.clone(), d[0].token).with_result(json!({ "first": 1 })),
            Ack::new(d[0].command_id.clone(), d[0].token).with_result(json!({ "second": 2 })),
            Ack::new(d[1].command_id.clone(), d[1].token + 1),
            Ack::new(d[1].command_id.clone(), d[1].token),
            Ack::new(d[2].command_id.clone(), d[2].token).with_result(json!("booked")),
            Ack::new("w:9:9".parse().unwrap(), 1),
        ];
        let results: Vec<Result<(), &str>> = store
            .complete_all(acks.to_vec(), T0)
            .unwrap()
            .into_iter()
            .map(|r| r.map_err(|e| e.code()))
            .collect();
        let rows: Vec<(String, Status, Option<serde_json::Value>)> = store
            .commands(&id)
            .unwrap()
            .into_iter()
            .map(|row| (row.command_id.to_string(), row.status, row.result))
            .collect();
        let timers = store.timers(&id).unwrap().len();
        answers.push((results, rows, timers));
    }
    assert_eq!(answers[0], answers[1], "memory, then PostgreSQL");
    assert_eq!(
        answers[1].0,
        [
            Ok(()),
            Err("STALE_LEASE"),
            Err("STALE_LEASE"),
            Ok(()),
            Ok(()),
            Err("NOT_FOUND")
        ]
    );
}

// ------------------------------------------------------------------------------------------------
// One clock for leases (DESIGN rule 18)

const HOUR: Duration = Duration::from_secs(3600);

fn ago(t: Timestamp, d: Duration) -> Timestamp {
    t.checked_sub(d).unwrap()
}

/// A worker whose clock runs an hour behind holds a lease and keeps it with heartbeats; a worker whose
/// clock is right claims meanwhile. `options` decides which clock the store compares with.
fn lagging_holder_and_a_punctual_claimer(options: &PostgresOptions) -> (Delivery, Vec<Delivery>) {
    let database = TestDatabase::new();
    let url = database.url();
    let mut lagging = PostgresStore::connect_with(&url, options).unwrap();
    let mut punctual = PostgresStore::connect_with(&url, options).unwrap();
    let lagging_now = || ago(SystemClock.now(), HOUR);
    append(&mut lagging, "trip", 1, lagging_now());
    let ttl = Duration::from_secs(30);
    let held = lagging
        .claim(&ClaimRequest::new("lagging").lease_ttl(ttl), lagging_now())
        .unwrap()
        .remove(0);
    lagging
        .extend(&held.command_id, held.token, ttl, lagging_now())
        .unwrap();
    let taken = punctual
        .claim(&ClaimRequest::new("punctual"), SystemClock.now())
        .unwrap();
    (held, taken)
}

#[test]
fn with_the_callers_clocks_a_lagging_holder_loses_its_lease_to_a_punctual_worker() {
    // The problem the database clock solves: the lease was set, and extended, on a clock an hour
    // behind, so for the punctual worker it ran out long ago.
    let (held, taken) = lagging_holder_and_a_punctual_claimer(&PostgresOptions::new());
    assert_eq!(taken.len(), 1, "the punctual worker took the command over");
    assert_eq!(taken[0].command_id, held.command_id);
}

#[test]
fn with_the_database_clock_workers_an_hour_apart_agree_on_the_lease() {
    let options = PostgresOptions::new().database_clock(true);
    let before = ago(SystemClock.now(), HOUR);
    let (held, taken) = lagging_holder_and_a_punctual_claimer(&options);
    assert!(taken.is_empty(), "the lease still holds: {taken:?}");
    // The holder sees its lease in its own clock, about 30 s after its own now.
    let expires = held.lease_expires_at.as_millis();
    let lagging_now = before.as_millis();
    assert!(
        expires >= lagging_now + 29_000 && expires <= lagging_now + 60_000,
        "lease expiry {expires} vs the lagging clock {lagging_now}"
    );
}

#[test]
fn with_the_database_clock_a_lease_still_runs_out_in_real_time() {
    let options = PostgresOptions::new().database_clock(true);
    let database = TestDatabase::new();
    let mut store = PostgresStore::connect_with(&database.url(), &options).unwrap();
    // The caller's clock says 1970: it does not matter, the database's decides.
    append(&mut store, "w", 1, T0);
    let ttl = Duration::from_millis(300);
    let first = store
        .claim(&ClaimRequest::new("a").lease_ttl(ttl), Timestamp::EPOCH)
        .unwrap();
    assert_eq!(first.len(), 1, "due at once, whatever the caller's clock");
    assert!(store
        .claim(
            &ClaimRequest::new("b"),
            Timestamp::from_millis(u64::from(u32::MAX))
        )
        .unwrap()
        .is_empty());
    std::thread::sleep(Duration::from_millis(400));
    let second = store
        .claim(&ClaimRequest::new("b"), Timestamp::EPOCH)
        .unwrap();
    assert_eq!(second.len(), 1, "taken over once the lease ran out");
    assert!(second[0].token > first[0].token);
    assert!(matches!(
        store.complete(&first[0].command_id, first[0].token, None, T0),
        Err(Error::StaleLease { .. })
    ));
}

/// The system clock, off by `offset_ms` (negative: behind).
struct SkewedClock {
    offset_ms: i64,
}

impl Clock for SkewedClock {
    fn now(&self) -> Timestamp {
        let now = SystemClock
            .now()
            .as_millis()
            .saturating_add_signed(self.offset_ms);
        Timestamp::from_millis(now)
    }
}

#[test]
fn dispatchers_two_hours_apart_share_leases_by_the_database_clock() {
    let options = PostgresOptions::new().database_clock(true);
    let database = TestDatabase::new();
    let mut store = PostgresStore::connect_with(&database.url(), &options).unwrap();
    let hour = 3_600_000;
    // Committed by a producer on the lagging clock: due for both dispatchers whatever the clock.
    let lagging = SkewedClock { offset_ms: -hour };
    for n in 0..2 {
        append(&mut store, &format!("w{n}"), 1, lagging.now());
    }
    let delivered = Arc::new(Mutex::new(Vec::<(String, CommandId)>::new()));
    let run = |name: &'static str, offset_ms: i64, batch_size: usize| {
        let log = delivered.clone();
        Dispatcher::postgres(&store, move |d: &Delivery| {
            log.lock()
                .unwrap()
                .push((name.to_owned(), d.command_id.clone()));
            // Longer than the lease: only heartbeats keep it.
            std::thread::sleep(Duration::from_millis(700));
            Outcome::Done
        })
        .unwrap()
        .name(name)
        .batch_size(batch_size)
        .lease_ttl(Duration::from_millis(200))
        .clock(Arc::new(SkewedClock { offset_ms }))
    };
    let (behind, ahead) = (run("behind", -hour, 2), run("ahead", hour, 1));
    // The lagging dispatcher leases both commands and delivers them one after the other, its
    // heartbeat keeping both leases; the one two hours ahead comes looking for work meanwhile.
    let behind = std::thread::spawn(move || behind.run_until_idle());
    std::thread::sleep(Duration::from_millis(100));
    let ahead = std::thread::spawn(move || ahead.run_until_idle());
    let (behind, ahead) = (
        behind.join().unwrap().unwrap(),
        ahead.join().unwrap().unwrap(),
    );
    assert_eq!(
        behind.lost_leases + ahead.lost_leases,
        0,
        "{behind:?} {ahead:?}"
    );
    assert_eq!(
        (behind.completed, ahead.completed),
        (2, 0),
        "{behind:?} {ahead:?}"
    );
    let delivered = delivered.lock().unwrap();
    let distinct: HashSet<_> = delivered.iter().map(|(_, id)| id).collect();
    assert_eq!((delivered.len(), distinct.len()), (2, 2), "{delivered:?}");
    assert!(store.pending(10).unwrap().is_empty());
}

// ------------------------------------------------------------------------------------------------
// Wake-ups

#[test]
fn a_commit_with_commands_wakes_a_listener() {
    let database = TestDatabase::new();
    let mut store = PostgresStore::connect(&database.url()).unwrap();
    let wakeups = Wakeups::listen(&store).unwrap();
    assert!(wakeups.is_listening());
    let before = wakeups.generation();
    append(&mut store, "w", 0, T0);
    assert!(
        !wakeups.wait_past(before, Duration::from_millis(300)),
        "a commit without commands or timers notifies nobody"
    );
    append(&mut store, "w", 2, T0);
    assert!(wakeups.wait_past(before, Duration::from_secs(5)));
}

#[test]
fn an_idle_woken_store_asks_the_database_only_when_told_or_at_the_fallback() {
    let database = TestDatabase::new();
    let url = database.url();
    let mut producer = PostgresStore::connect(&url).unwrap();
    let quiet = PostgresOptions::new().notify(false);
    let mut silent_producer = PostgresStore::connect_with(&url, &quiet).unwrap();
    let wakeups = Wakeups::listen(&producer).unwrap();
    let fallback = Duration::from_millis(700);
    let mut worker = producer.clone().woken_by(&wakeups, fallback);
    let request = ClaimRequest::new("w").limit(10);
    assert!(worker.claim(&request, T0).unwrap().is_empty(), "idle now");

    // A commit that does not notify is found at the fallback poll, not before.
    let started = Instant::now();
    append(&mut silent_producer, "quiet", 1, T0);
    assert!(
        worker.claim(&request, T0).unwrap().is_empty(),
        "not told yet"
    );
    let found = loop {
        let batch = worker.claim(&request, T0).unwrap();
        if !batch.is_empty() || started.elapsed() > Duration::from_secs(5) {
            break batch;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    assert_eq!(found.len(), 1);
    assert!(
        started.elapsed() >= Duration::from_millis(500),
        "{:?}",
        started.elapsed()
    );
    assert!(worker.claim(&request, T0).unwrap().is_empty(), "idle again");

    // A notifying commit is found at once.
    let started = Instant::now();
    let before = wakeups.generation();
    append(&mut producer, "loud", 1, T0);
    assert!(wakeups.wait_past(before, Duration::from_secs(5)));
    assert_eq!(worker.claim(&request, T0).unwrap().len(), 1);
    assert!(started.elapsed() < fallback, "{:?}", started.elapsed());
}

#[test]
fn an_idle_woken_store_wakes_itself_when_a_retry_falls_due() {
    let database = TestDatabase::new();
    let mut store = PostgresStore::connect(&database.url()).unwrap();
    let wakeups = Wakeups::listen(&store).unwrap();
    let mut worker = store.clone().woken_by(&wakeups, Duration::from_secs(60));
    append(&mut store, "w", 1, T0);
    let request = ClaimRequest::new("w");
    let clock = || Timestamp::from_millis(T0.as_millis() + 10_000_000);
    let delivery = loop {
        if let Some(d) = worker.claim(&request, clock()).unwrap().pop() {
            break d;
        }
    };
    let policy = miniflow::RetryPolicy::default()
        .initial_delay(Duration::from_millis(200))
        .max_delay(Duration::from_millis(200))
        .jitter(0.0);
    let now = SystemClock.now();
    store
        .fail(
            &delivery.command_id,
            delivery.token,
            &miniflow::Failure::retryable("timeout"),
            &policy,
            now,
        )
        .unwrap();
    // Idle until the retry is due: 200 ms on the caller's clock, with no notification after it.
    let started = Instant::now();
    let retried = loop {
        let batch = worker.claim(&request, SystemClock.now()).unwrap();
        if !batch.is_empty() || started.elapsed() > Duration::from_secs(5) {
            break batch;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    assert_eq!(
        retried.len(),
        1,
        "retried without waiting for the 60 s fallback"
    );
}

#[test]
fn the_postgres_dispatcher_delivers_what_is_committed_while_it_runs() {
    let database = TestDatabase::new();
    let mut store = PostgresStore::connect(&database.url()).unwrap();
    let delivered = Arc::new(Mutex::new(Vec::<CommandId>::new()));
    let log = delivered.clone();
    let running = Dispatcher::postgres(&store, move |d: &Delivery| {
        log.lock().unwrap().push(d.command_id.clone());
        Outcome::Done
    })
    .unwrap()
    .workers(2)
    .start()
    .unwrap();
    for n in 0..5 {
        append(&mut store, &format!("w{n}"), 3, SystemClock.now());
        std::thread::sleep(Duration::from_millis(50));
    }
    let started = Instant::now();
    while delivered.lock().unwrap().len() < 15 && started.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let shutdown = running.shutdown(Duration::from_secs(5));
    assert_eq!(shutdown.unfinished_workers, 0);
    let mut delivered = delivered.lock().unwrap().clone();
    delivered.sort();
    delivered.dedup();
    assert_eq!(delivered.len(), 15);
    assert!(store.pending(100).unwrap().is_empty());
}

#[test]
fn the_postgres_dispatcher_runs_until_idle_in_strict_order() {
    let database = TestDatabase::new();
    let mut store = PostgresStore::connect(&database.url()).unwrap();
    for workflow in ["a", "b", "c"] {
        append(&mut store, workflow, 4, T0);
    }
    let delivered = Arc::new(Mutex::new(Vec::<CommandId>::new()));
    let log = delivered.clone();
    let stats = Dispatcher::postgres(&store, move |d: &Delivery| {
        log.lock().unwrap().push(d.command_id.clone());
        Outcome::Done
    })
    .unwrap()
    .workers(3)
    .order(ClaimOrder::StrictPerWorkflow)
    .run_until_idle()
    .unwrap();
    assert_eq!(stats.completed, 12);
    let delivered = delivered.lock().unwrap();
    for workflow in ["a", "b", "c"] {
        let order: Vec<u32> = delivered
            .iter()
            .filter(|id| id.workflow_id().as_str() == workflow)
            .map(CommandId::index)
            .collect();
        assert_eq!(order, [0, 1, 2, 3], "workflow {workflow}");
    }
}

/// The PostgreSQL dispatcher's ack thread writes the acks kept before a long handler while it runs,
/// on a connection of the pool (see the SQLite dispatcher's test of the same).
#[test]
fn the_postgres_dispatcher_writes_the_acks_before_a_long_handler_while_it_runs() {
    let database = TestDatabase::new();
    let mut store = PostgresStore::connect(&database.url()).unwrap();
    append(&mut store, "w", 3, T0);
    let (entered, in_slow) = mpsc::channel();
    let (release, released) = mpsc::channel::<()>();
    let (entered, released) = (Mutex::new(entered), Mutex::new(released));
    let running = Dispatcher::postgres(&store, move |d: &Delivery| {
        if d.command_id.index() == 2 {
            entered.lock().unwrap().send(()).unwrap();
            let _ = released
                .lock()
                .unwrap()
                .recv_timeout(Duration::from_secs(30));
        }
        Outcome::Done
    })
    .unwrap()
    .batch_size(3)
    .ack_delay(Duration::from_millis(20))
    .start()
    .unwrap();
    in_slow.recv_timeout(Duration::from_secs(10)).unwrap();
    let done = |store: &PostgresStore| {
        store
            .commands(&wid("w"))
            .unwrap()
            .iter()
            .filter(|row| row.status == Status::Done)
            .count()
    };
    let until = Instant::now() + Duration::from_secs(10);
    while done(&store) < 2 {
        assert!(
            Instant::now() < until,
            "the acks before the long handler waited for it"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    release.send(()).unwrap();
    let shutdown = running.shutdown(Duration::from_secs(10));
    assert!(shutdown.errors.is_empty(), "{:?}", shutdown.errors);
    assert_eq!(
        (shutdown.stats.completed, shutdown.stats.store_errors),
        (3, 0)
    );
    assert_eq!(done(&store), 3);
}

// ------------------------------------------------------------------------------------------------
// Query plans

#[test]
fn hot_queries_use_their_indexes_among_many_done_rows() {
    let database = TestDatabase::new();
    drop(PostgresStore::connect(&database.url()).unwrap());
    let mut client = database.client();
    // 20,000 commands, most done, a backlog of 2,000 pending (in three priorities) and 500 dead, and
    // 2,000 timers, most fired, with statistics: a plan that walks done rows or sorts the backlog shows here.
    client
        .batch_execute(
            "INSERT INTO events SELECT 'w' || (n / 10), n % 10 + 1, 'e', '{}', 0
                 FROM generate_series(0, 19999) n;
             INSERT INTO outbox (workflow_id, event_seq, idx, kind, payload, status, available_at,
                     created_at, processed_at)
                 SELECT 'w' || (n / 10), n % 10 + 1, 0, 'k', '{}', 'done', 0, 0, n
                 FROM generate_series(0, 19999) n;
             UPDATE outbox SET status = 'pending', processed_at = NULL, available_at = event_seq
                 WHERE processed_at < 2000;
             UPDATE outbox SET status = 'dead' WHERE processed_at BETWEEN 2000 AND 2499;
             UPDATE outbox SET priority = event_seq % 3 WHERE processed_at IS NULL;
             INSERT INTO timers SELECT 'w' || n, 'w' || n || ':1:t0', 't', 'timer_fired', '{}', 0, n,
                     CASE WHEN n < 200 THEN 'scheduled' ELSE 'fired' END, 0,
                     CASE WHEN n < 200 THEN NULL ELSE 1 END
                 FROM generate_series(0, 1999) n;
             ANALYZE;",
        )
        .unwrap();
    for (name, sql, args, index) in miniflow_postgres_hot_queries() {
        let args = if args.is_empty() {
            String::new()
        } else {
            format!("({args})")
        };
        let plan: Vec<String> = client
            .simple_query(&format!(
                "PREPARE q AS {sql}; EXPLAIN EXECUTE q{args}; DEALLOCATE q;"
            ))
            .unwrap()
            .into_iter()
            .filter_map(|message| match message {
                miniflow::postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_owned),
                _ => None,
            })
            .collect();
        let plan = plan.join("\n");
        assert!(
            index.split('|').any(|index| plan.contains(index)),
            "{name} does not use {index}:\n{plan}"
        );
        assert!(!plan.contains("Seq Scan"), "{name} scans a table:\n{plan}");
        // One workflow's rows may be sorted: they are few. A backlog must come in index order.
        let one_workflow = name.starts_with("a workflow's") || name == "one row";
        assert!(
            one_workflow || !plan.contains("Sort"),
            "{name} sorts:\n{plan}"
        );
    }
}

fn miniflow_postgres_hot_queries() -> Vec<(&'static str, &'static str, &'static str, &'static str)>
{
    miniflow_postgres::hot_queries()
}

/// After a lost race the store waits before the engine tries again, longer after each (see the
/// SQLite store's test of the same).
#[test]
fn the_store_waits_before_a_retry_longer_after_each_lost_race() {
    let database = TestDatabase::new();
    let mut store = PostgresStore::connect(&database.url()).unwrap();
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

/// How many transactions last wrote the outbox rows of `workflow` (the cluster's transaction
/// counter is shared with every test running beside this one; a row's `xmin` is its own).
fn transactions_that_last_wrote(database: &TestDatabase, workflow: &str) -> i64 {
    database
        .client()
        .query_one(
            "SELECT count(DISTINCT xmin::text) FROM outbox WHERE workflow_id = $1",
            &[&workflow],
        )
        .unwrap()
        .get(0)
}

#[test]
fn a_heartbeat_extends_all_of_a_workers_leases_in_one_transaction() {
    let database = TestDatabase::new();
    let mut store = PostgresStore::connect(&database.url()).unwrap();
    append(&mut store, "w", 4, T0);
    // Claimed one by one, each row last written by its own transaction.
    let claimed: Vec<_> = (0..4)
        .flat_map(|_| {
            store
                .claim(&ClaimRequest::new("worker-1").limit(1), T0)
                .unwrap()
        })
        .collect();
    assert_eq!(claimed.len(), 4);
    assert_eq!(transactions_that_last_wrote(&database, "w"), 4);
    let leases: Vec<(CommandId, u64)> = claimed
        .iter()
        .map(|d| (d.command_id.clone(), d.token))
        .collect();
    let later = T0 + Duration::from_secs(10);
    let answers = store
        .extend_all(&leases, Duration::from_secs(60), later)
        .unwrap();
    assert_eq!(transactions_that_last_wrote(&database, "w"), 1);
    for (answer, delivery) in answers.iter().zip(&claimed) {
        let extended = answer.as_ref().unwrap();
        assert_eq!(extended.expires_at, later + Duration::from_secs(60));
        let row = store.command(&delivery.command_id).unwrap().unwrap();
        assert_eq!(row.available_at, later + Duration::from_secs(60));
    }
}
