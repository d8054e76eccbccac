//! The async store on PostgreSQL (`miniflow::tokio::AsyncPostgresStore`): the synchronous store's
//! operations awaited on tokio-postgres, the caller's own transaction, a receiver's records in the
//! effect's transaction, and what a dropped call leaves behind.

use std::sync::Arc;
use std::time::Duration;

use super::TestDatabase;
use miniflow::tokio::{AsyncPostgresIdempotencyStore, AsyncPostgresStore};
use miniflow::{
    json, Begin, ClaimRequest, Command, Decision, Digest, Engine, Error, Event, EventRecord,
    IdempotencyKey, IdempotencyPolicy, ManualClock, PostgresOptions, Received, Status, Timer,
    Timestamp, Value, Workflow, WorkflowId,
};

const T0: Timestamp = Timestamp::from_millis(1_700_000_000_000);

fn wid(text: &str) -> WorkflowId {
    WorkflowId::new(text).unwrap()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// An order: placing it charges the card and arms a reminder; a charge's result is recorded.
struct Orders;

impl Workflow for Orders {
    type State = u32;
    fn evolve(&self, events: &mut u32, _: &EventRecord) {
        *events += 1;
    }
    fn decide(&self, events: &u32, event: &EventRecord) -> Decision {
        match event.kind.as_str() {
            "placed" => Decision::new()
                .command(Command::new("charge_card", event.payload.clone()))
                .timer(Timer::after("remind", Duration::from_secs(60), json!({}))),
            "paid" => {
                Decision::new().command(Command::new("ship", json!({ "events_before": *events })))
            }
            _ => Decision::none(),
        }
    }
}

async fn connect(database: &TestDatabase, clock: &Arc<ManualClock>) -> AsyncPostgresStore {
    AsyncPostgresStore::connect(&database.url())
        .await
        .unwrap()
        .with_clock(clock.clone())
}

async fn order_rows(store: &AsyncPostgresStore) -> i64 {
    let client = store.client().await.unwrap();
    client
        .query_one("SELECT count(*) FROM orders", &[])
        .await
        .unwrap()
        .get(0)
}

#[test]
fn the_async_store_starts_handles_claims_completes_and_fires_from_spawned_tasks() {
    let database = TestDatabase::new();
    runtime().block_on(async {
        let clock = Arc::new(ManualClock::new(T0));
        let store = connect(&database, &clock).await;
        let engine = Arc::new(Engine::new(Orders));
        // On tasks of their own: every future of the store is Send.
        let (s, e) = (store.clone(), engine.clone());
        let started = tokio::spawn(async move {
            s.start(
                &e,
                &wid("order-1"),
                Event::new("placed", json!({ "amount": 5 })),
            )
            .await
        })
        .await
        .unwrap()
        .unwrap();
        assert_eq!(started.command_ids[0].to_string(), "order-1:1:0");
        let again = store
            .start(&engine, &wid("order-1"), Event::new("placed", json!({})))
            .await;
        assert!(matches!(again, Err(Error::Conflict { .. })), "{again:?}");

        let (s, e) = (store.clone(), engine.clone());
        let paid = tokio::spawn(async move {
            s.handle(&e, &wid("order-1"), Event::new("paid", json!({})))
                .await
        })
        .await
        .unwrap()
        .unwrap();
        assert_eq!(paid.command_ids[0].to_string(), "order-1:2:0");
        let ship = store.command(&paid.command_ids[0]).await.unwrap().unwrap();
        assert_eq!(
            ship.payload,
            json!({ "events_before": 1 }),
            "decided on the replayed history"
        );

        let claimed = store
            .claim(ClaimRequest::new("worker-1").limit(10))
            .await
            .unwrap();
        assert_eq!(claimed.len(), 2);
        store
            .complete(&claimed[0].command_id, claimed[0].token, None)
            .await
            .unwrap();
        let stale = store
            .complete(&claimed[1].command_id, claimed[1].token + 1, None)
            .await;
        assert!(matches!(stale, Err(Error::StaleLease { .. })), "{stale:?}");
        let row = store
            .command(&claimed[0].command_id)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(row.status, Status::Done);
        assert_eq!(store.stats().await.unwrap().leased(), 1);

        assert!(store
            .claim_timers(10, Duration::from_secs(30))
            .await
            .unwrap()
            .is_empty());
        clock.advance(Duration::from_secs(61));
        assert!(store.any_timer_due().await.unwrap());
        let timers = store
            .claim_timers(10, Duration::from_secs(30))
            .await
            .unwrap();
        assert_eq!(timers.len(), 1);
        let fired = store.fire(&engine, &timers[0]).await.unwrap().unwrap();
        assert_eq!(fired.command_ids.len(), 0);
        let events = store.load(&wid("order-1")).await.unwrap();
        assert_eq!(
            events.iter().map(|e| e.kind.as_str()).collect::<Vec<_>>(),
            ["placed", "paid", "timer_fired"]
        );
        assert!(
            store.fire(&engine, &timers[0]).await.unwrap().is_none(),
            "fired once"
        );
    });
}

#[test]
fn the_callers_transaction_commits_its_rows_with_the_workflows_and_a_conflict_leaves_it_usable() {
    let database = TestDatabase::new();
    runtime().block_on(async {
        let clock = Arc::new(ManualClock::new(T0));
        let store = connect(&database, &clock).await;
        let engine = Engine::new(Orders);
        {
            let client = store.client().await.unwrap();
            client
                .batch_execute("CREATE TABLE orders (id TEXT PRIMARY KEY)")
                .await
                .unwrap();
        }

        // Rolled back: neither the order row nor the workflow.
        let mut client = store.client().await.unwrap();
        let tx = client.transaction().await.unwrap();
        tx.execute("INSERT INTO orders VALUES ('order-1')", &[])
            .await
            .unwrap();
        store
            .start_in(
                &tx,
                &engine,
                &wid("order-1"),
                Event::new("placed", json!({})),
            )
            .await
            .unwrap();
        tx.rollback().await.unwrap();
        assert_eq!(order_rows(&store).await, 0);
        assert!(store.load(&wid("order-1")).await.unwrap().is_empty());

        // Committed: both, together.
        let tx = client.transaction().await.unwrap();
        tx.execute("INSERT INTO orders VALUES ('order-1')", &[])
            .await
            .unwrap();
        store
            .start_in(
                &tx,
                &engine,
                &wid("order-1"),
                Event::new("placed", json!({})),
            )
            .await
            .unwrap();
        tx.commit().await.unwrap();
        assert_eq!(order_rows(&store).await, 1);
        assert_eq!(store.load(&wid("order-1")).await.unwrap().len(), 1);

        // Starting it again is a conflict, and the caller's transaction goes on: its next row and
        // an event of another workflow commit.
        let tx = client.transaction().await.unwrap();
        let again = store
            .start_in(
                &tx,
                &engine,
                &wid("order-1"),
                Event::new("placed", json!({})),
            )
            .await;
        assert!(matches!(again, Err(Error::Conflict { .. })), "{again:?}");
        tx.execute("INSERT INTO orders VALUES ('order-2')", &[])
            .await
            .unwrap();
        store
            .handle_in(&tx, &engine, &wid("order-1"), Event::new("paid", json!({})))
            .await
            .unwrap();
        tx.commit().await.unwrap();
        assert_eq!(order_rows(&store).await, 2);
        assert_eq!(store.load(&wid("order-1")).await.unwrap().len(), 2);
    });
}

#[test]
fn two_callers_racing_on_one_workflow_get_one_commit_and_one_conflict_in_a_usable_transaction() {
    let database = TestDatabase::new();
    runtime().block_on(async {
        let clock = Arc::new(ManualClock::new(T0));
        let store = connect(&database, &clock).await;
        let engine = Engine::new(Orders);
        store
            .start(&engine, &wid("order-1"), Event::new("placed", json!({})))
            .await
            .unwrap();
        let (mut first, mut second) =
            (store.client().await.unwrap(), store.client().await.unwrap());
        let (a, b) = (
            first.transaction().await.unwrap(),
            second.transaction().await.unwrap(),
        );
        // Both read the same history; `a` commits first, then `b`'s commit finds seq 2 taken.
        store
            .handle_in(
                &a,
                &engine,
                &wid("order-1"),
                Event::new("paid", json!({ "by": "a" })),
            )
            .await
            .unwrap();
        let order = wid("order-1");
        let b_commit = store.handle_in(
            &b,
            &engine,
            &order,
            Event::new("paid", json!({ "by": "b" })),
        );
        let a_commits = async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            a.commit().await
        };
        let (lost, committed) = tokio::join!(b_commit, a_commits);
        committed.unwrap();
        assert!(matches!(lost, Err(Error::Conflict { .. })), "{lost:?}");
        // `b` is not aborted: it still runs statements and commits.
        let one: i32 = b.query_one("SELECT 1", &[]).await.unwrap().get(0);
        assert_eq!(one, 1);
        b.commit().await.unwrap();
        let events = store.load(&wid("order-1")).await.unwrap();
        assert_eq!(events.len(), 2);
        assert_eq!(events[1].payload, json!({ "by": "a" }));
    });
}

#[test]
fn a_dropped_call_leaves_no_transaction_open_on_the_pools_connection() {
    let database = TestDatabase::new();
    runtime().block_on(async {
        let clock = Arc::new(ManualClock::new(T0));
        let store =
            AsyncPostgresStore::connect_with(&database.url(), &PostgresOptions::new().pool_size(1))
                .await
                .unwrap()
                .with_clock(clock.clone());
        let engine = Engine::new(Orders);
        let placed = store
            .start(&engine, &wid("order-1"), Event::new("placed", json!({})))
            .await
            .unwrap();
        let claimed = store
            .claim(ClaimRequest::new("worker-1").limit(1))
            .await
            .unwrap();
        // Another session holds the command's row: the ack waits for it inside its transaction.
        let (client, connection) = miniflow::tokio::tokio_postgres::connect(
            &database.url(),
            miniflow::tokio::tokio_postgres::NoTls,
        )
        .await
        .unwrap();
        tokio::spawn(connection);
        client.batch_execute("BEGIN").await.unwrap();
        client
            .execute(
                "SELECT 1 FROM outbox WHERE workflow_id = 'order-1' FOR UPDATE",
                &[],
            )
            .await
            .unwrap();
        let ack = store.complete(&claimed[0].command_id, claimed[0].token, None);
        let dropped = tokio::time::timeout(Duration::from_millis(300), ack).await;
        assert!(dropped.is_err(), "the ack waited for the lock: {dropped:?}");
        client.batch_execute("ROLLBACK").await.unwrap();

        // The pool's one connection: the next operations run in transactions of their own, and
        // what they commit is seen by another session at once.
        store
            .handle(&engine, &wid("order-1"), Event::new("paid", json!({})))
            .await
            .unwrap();
        let in_transaction: i64 = client
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
                 AND state LIKE 'idle in transaction%'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(
            in_transaction, 0,
            "a connection was left inside a transaction"
        );
        let seen: i64 = client
            .query_one(
                "SELECT count(*) FROM events WHERE workflow_id = 'order-1'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(seen, 2);
        assert_eq!(placed.command_ids.len(), 1);
    });
}

#[test]
fn a_receivers_record_commits_with_its_effect_and_a_repeat_folds_into_it() {
    let database = TestDatabase::new();
    runtime().block_on(async {
        let clock = Arc::new(ManualClock::new(T0));
        let store = connect(&database, &clock).await;
        let keys = AsyncPostgresIdempotencyStore::new(store.clone(), IdempotencyPolicy::default())
            .unwrap();
        {
            let client = store.client().await.unwrap();
            client
                .batch_execute("CREATE TABLE orders (id TEXT PRIMARY KEY)")
                .await
                .unwrap();
        }
        let key = IdempotencyKey::new("order-1:1:0").unwrap();
        let digest = Digest::of(&json!({ "amount": 5 }));
        let book = || async {
            match keys.begin(&key, digest).await.unwrap() {
                Begin::Fresh { token } => {
                    let mut client = store.client().await.unwrap();
                    let tx = client.transaction().await.unwrap();
                    tx.execute("INSERT INTO orders VALUES ($1)", &[&key.as_str()])
                        .await
                        .unwrap();
                    keys.finish_in(&tx, &key, token, &json!({ "booked": true }))
                        .await
                        .unwrap();
                    tx.commit().await.unwrap();
                    json!({ "booked": true })
                }
                Begin::Completed { result } => result,
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(book().await, book().await);
        assert_eq!(order_rows(&store).await, 1, "one effect for two deliveries");

        // A finish whose reservation was taken over writes nothing and leaves the transaction usable.
        let other = IdempotencyKey::new("order-2:1:0").unwrap();
        let Begin::Fresh { token } = keys.begin(&other, digest).await.unwrap() else {
            panic!("a new key is fresh");
        };
        keys.abandon(&other, token).await.unwrap();
        let Begin::Fresh { token: newer } = keys.begin(&other, digest).await.unwrap() else {
            panic!("an abandoned key is fresh");
        };
        let mut client = store.client().await.unwrap();
        let tx = client.transaction().await.unwrap();
        let stale = keys.finish_in(&tx, &other, token, &json!({})).await;
        assert!(
            matches!(stale, Err(Error::StaleReservation { .. })),
            "{stale:?}"
        );
        tx.execute("INSERT INTO orders VALUES ('after')", &[])
            .await
            .unwrap();
        tx.commit().await.unwrap();
        assert_eq!(order_rows(&store).await, 2);
        keys.finish(&other, newer, &json!({ "n": 2 }))
            .await
            .unwrap();
        assert!(keys.record(&other).await.unwrap().is_some());
    });
}

#[test]
fn the_async_store_refuses_a_bad_url_naming_it_without_the_password() {
    runtime().block_on(async {
        let e = AsyncPostgresStore::connect("postgresql://u:secret@127.0.0.1:1/x?sslmode=bogus")
            .await
            .unwrap_err();
        let text = e.to_string();
        assert!(matches!(e, Error::InvalidInput { .. }), "{e:?}");
        assert!(!text.contains("secret"), "{text}");
        let unreachable = AsyncPostgresStore::connect_with(
            "postgresql://u:secret@127.0.0.1:1/x",
            &PostgresOptions::new().connect_timeout(Duration::from_secs(2)),
        )
        .await
        .unwrap_err();
        assert!(matches!(unreachable, Error::Storage(_)), "{unreachable:?}");
        assert!(!unreachable.to_string().contains("secret"), "{unreachable}");
    });
}

#[test]
fn run_does_a_local_effect_once_and_a_failed_or_dropped_run_leaves_no_reservation() {
    let database = TestDatabase::new();
    runtime().block_on(async {
        let clock = Arc::new(ManualClock::new(T0));
        let store = connect(&database, &clock).await;
        let keys = AsyncPostgresIdempotencyStore::new(store.clone(), IdempotencyPolicy::default())
            .unwrap();
        {
            let client = store.client().await.unwrap();
            client
                .batch_execute("CREATE TABLE orders (id TEXT PRIMARY KEY)")
                .await
                .unwrap();
        }
        let key = IdempotencyKey::new("order-1:1:0").unwrap();
        let digest = Digest::of(&json!({ "amount": 5 }));
        let effect = async |tx: &miniflow::tokio::tokio_postgres::Transaction<'_>| {
            tx.execute("INSERT INTO orders VALUES ('order-1')", &[])
                .await
                .map_err(|e| Error::Storage(Box::new(e)))?;
            Ok::<_, Error>(json!({ "booked": 1 }))
        };

        // A failing effect: its rows and the reservation roll back together.
        let failed = keys
            .run(
                &key,
                digest,
                async |tx: &miniflow::tokio::tokio_postgres::Transaction<'_>| {
                    tx.execute("INSERT INTO orders VALUES ('order-1')", &[])
                        .await
                        .map_err(|e| Error::Storage(Box::new(e)))?;
                    Err::<Value, _>(Error::Storage("the supplier's disk is full".into()))
                },
            )
            .await;
        assert!(matches!(failed, Err(Error::Storage(_))), "{failed:?}");
        assert!(
            keys.record(&key).await.unwrap().is_none(),
            "no reservation left"
        );
        assert_eq!(order_rows(&store).await, 0);

        // A run dropped while its effect waits: the same.
        let slow = keys.run(
            &key,
            digest,
            async |_: &miniflow::tokio::tokio_postgres::Transaction<'_>| {
                tokio::time::sleep(Duration::from_secs(10)).await;
                Ok::<_, Error>(json!({}))
            },
        );
        assert!(tokio::time::timeout(Duration::from_millis(200), slow)
            .await
            .is_err());
        let done = keys.run(&key, digest, effect).await.unwrap();
        assert_eq!(
            done,
            Received::Done {
                result: json!({ "booked": 1 })
            }
        );
        let again = keys.run(&key, digest, effect).await.unwrap();
        assert_eq!(
            again,
            Received::Repeated {
                result: json!({ "booked": 1 })
            }
        );
        assert_eq!(order_rows(&store).await, 1, "one effect");
        let other = keys
            .run(&key, Digest::of(&json!({ "amount": 6 })), effect)
            .await
            .unwrap();
        assert!(matches!(other, Received::Conflict { .. }), "{other:?}");
    });
}

#[test]
fn the_synchronous_receiver_runs_a_local_effect_once_in_one_transaction() {
    let database = TestDatabase::new();
    database
        .client()
        .batch_execute("CREATE TABLE orders (id TEXT PRIMARY KEY)")
        .unwrap();
    let keys =
        miniflow::PostgresIdempotencyStore::connect(&database.url(), IdempotencyPolicy::default())
            .unwrap();
    let key = IdempotencyKey::new("order-1:1:0").unwrap();
    let digest = Digest::of(&json!({ "amount": 5 }));
    let insert = |tx: &mut miniflow::postgres::Transaction<'_>| {
        tx.execute("INSERT INTO orders VALUES ('order-1')", &[])
            .map_err(|e| Error::Storage(Box::new(e)))?;
        Ok::<_, Error>(json!({ "booked": 1 }))
    };
    let failed = keys.run(&key, digest, T0, |tx| {
        insert(tx)?;
        Err::<Value, _>(Error::Storage("down".into()))
    });
    assert!(failed.is_err());
    assert!(miniflow::IdempotencyStore::record(&keys, &key)
        .unwrap()
        .is_none());
    assert_eq!(
        keys.run(&key, digest, T0, insert).unwrap(),
        Received::Done {
            result: json!({ "booked": 1 })
        }
    );
    assert_eq!(
        keys.run(&key, digest, T0, insert).unwrap(),
        Received::Repeated {
            result: json!({ "booked": 1 })
        }
    );
    let rows: i64 = database
        .client()
        .query_one("SELECT count(*) FROM orders", &[])
        .unwrap()
        .get(0);
    assert_eq!(rows, 1);
}

/// The next notification on `channel` a listening `client` hears within `timeout`: the process
/// that sent it.
fn notified_by(client: &mut miniflow::postgres::Client, timeout: Duration) -> Option<i32> {
    use fallible_iterator::FallibleIterator;
    let mut notifications = client.notifications();
    let mut heard = notifications.timeout_iter(timeout);
    heard.next().ok().flatten().map(|n| n.process_id())
}

fn listener(database: &TestDatabase) -> miniflow::postgres::Client {
    let mut client = database.client();
    client.batch_execute("LISTEN miniflow_outbox").unwrap();
    client
}

#[test]
fn a_commit_in_the_callers_transaction_is_hinted_after_it_commits_and_not_from_inside_it() {
    let database = TestDatabase::new();
    let store = miniflow::PostgresStore::connect(&database.url()).unwrap();
    let engine = Engine::new(Orders);
    let mut listening = listener(&database);

    let mut client = store.client().unwrap();
    let mut tx = client.transaction().unwrap();
    let caller: i32 = tx.query_one("SELECT pg_backend_pid()", &[]).unwrap().get(0);
    store
        .handle_in(
            &mut tx,
            &engine,
            &wid("order-1"),
            Event::new("placed", json!({})),
            T0,
        )
        .unwrap();
    assert_eq!(
        notified_by(&mut listening, Duration::from_millis(300)),
        None,
        "not before it commits"
    );
    tx.commit().unwrap();
    let sender =
        notified_by(&mut listening, Duration::from_secs(5)).expect("a hint after the commit");
    // The caller's transaction did not NOTIFY: PostgreSQL would make notifying commits wait for
    // each other. The store's own connection did, once the caller's transaction had committed.
    assert_ne!(sender, caller);

    // Rolled back: no hint at all.
    let mut tx = client.transaction().unwrap();
    store
        .handle_in(
            &mut tx,
            &engine,
            &wid("order-2"),
            Event::new("placed", json!({})),
            T0,
        )
        .unwrap();
    tx.rollback().unwrap();
    assert_eq!(
        notified_by(&mut listening, Duration::from_millis(500)),
        None
    );
}

#[test]
fn the_async_store_hints_after_the_callers_transaction_commits_too() {
    let database = TestDatabase::new();
    let mut listening = listener(&database);
    let rt = runtime();
    let clock = Arc::new(ManualClock::new(T0));
    let store = rt.block_on(connect(&database, &clock));
    let engine = Engine::new(Orders);
    let (mut client, caller) = rt.block_on(async {
        let client = store.client().await.unwrap();
        let pid: i32 = client
            .query_one("SELECT pg_backend_pid()", &[])
            .await
            .unwrap()
            .get(0);
        (client, pid)
    });
    rt.block_on(async {
        let tx = client.transaction().await.unwrap();
        store
            .start_in(
                &tx,
                &engine,
                &wid("order-1"),
                Event::new("placed", json!({})),
            )
            .await
            .unwrap();
        tx.commit().await.unwrap();
    });
    let sender =
        notified_by(&mut listening, Duration::from_secs(5)).expect("a hint after the commit");
    assert_ne!(sender, caller);
}

#[test]
fn the_async_dispatcher_delivers_on_postgres_woken_by_a_notification() {
    use miniflow::tokio::AsyncDispatcher;
    use miniflow::{Delivery, Outcome};
    use std::sync::atomic::{AtomicUsize, Ordering};

    let database = TestDatabase::new();
    runtime().block_on(async {
        let store = AsyncPostgresStore::connect(&database.url()).await.unwrap();
        let engine = Arc::new(Engine::new(Orders));
        let delivered = Arc::new(AtomicUsize::new(0));
        let seen = delivered.clone();
        let handler = move |_: Delivery| {
            let seen = seen.clone();
            async move {
                seen.fetch_add(1, Ordering::SeqCst);
                Outcome::Done
            }
        };
        // An idle dispatcher with a long poll: only the notification can wake it in time.
        let running = AsyncDispatcher::new(store.clone(), handler)
            .workflow(engine.clone())
            .concurrency(4)
            .poll_interval(Duration::from_secs(30))
            .start()
            .unwrap();
        let wakeups = store.wakeups();
        let listening = tokio::time::Instant::now() + Duration::from_secs(10);
        while !wakeups.is_listening() && tokio::time::Instant::now() < listening {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(wakeups.is_listening());
        tokio::time::sleep(Duration::from_millis(200)).await;
        for n in 0..5 {
            store
                .start(
                    &engine,
                    &wid(&format!("order-{n}")),
                    Event::new("placed", json!({})),
                )
                .await
                .unwrap();
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while delivered.load(Ordering::SeqCst) < 5 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(
            delivered.load(Ordering::SeqCst),
            5,
            "woken well before the 30 s poll"
        );
        let shutdown = running.shutdown(Duration::from_secs(5)).await;
        assert!(shutdown.errors.is_empty(), "{:?}", shutdown.errors);
        for n in 0..5 {
            let row = store
                .command(&format!("order-{n}:1:0").parse().unwrap())
                .await
                .unwrap()
                .unwrap();
            assert_eq!(row.status, Status::Done);
        }
    });
}

#[test]
fn the_synchronous_store_starts_a_workflow_in_the_callers_transaction_without_reading_it() {
    let database = TestDatabase::new();
    let store = miniflow::PostgresStore::connect(&database.url()).unwrap();
    let engine = Engine::new(Orders);
    let mut client = store.client().unwrap();
    let mut tx = client.transaction().unwrap();
    let started = store
        .start_in(
            &mut tx,
            &engine,
            &wid("order-1"),
            Event::new("placed", json!({})),
            T0,
        )
        .unwrap();
    assert_eq!(started.command_ids[0].to_string(), "order-1:1:0");
    let again = store.start_in(
        &mut tx,
        &engine,
        &wid("order-1"),
        Event::new("placed", json!({})),
        T0,
    );
    assert!(matches!(again, Err(Error::Conflict { .. })), "{again:?}");
    let one: i32 = tx.query_one("SELECT 1", &[]).unwrap().get(0);
    assert_eq!(one, 1, "the transaction is still usable");
    tx.commit().unwrap();
    assert_eq!(
        miniflow::EventLog::load(&store, &wid("order-1"))
            .unwrap()
            .len(),
        1
    );
}

/// A connection of the service's own (not the store's), with the server's default `search_path`.
async fn service_connection(database: &TestDatabase) -> miniflow::tokio::tokio_postgres::Client {
    let (client, connection) = miniflow::tokio::tokio_postgres::connect(
        &database.url(),
        miniflow::tokio::tokio_postgres::NoTls,
    )
    .await
    .unwrap();
    tokio::spawn(connection);
    client
}

/// The `search_path` of the transaction `tx`.
async fn search_path(tx: &miniflow::tokio::tokio_postgres::Transaction<'_>) -> String {
    tx.query_one("SHOW search_path", &[]).await.unwrap().get(0)
}

#[test]
fn a_receivers_own_connection_makes_its_table_alone_in_its_schema_and_does_effects_once() {
    let database = TestDatabase::new();
    runtime().block_on(async {
        let service = service_connection(&database).await;
        service
            .batch_execute("CREATE TABLE bookings (key TEXT PRIMARY KEY)")
            .await
            .unwrap();
        let options = PostgresOptions::new().schema("receiver_keys");
        let keys = AsyncPostgresIdempotencyStore::connect_with(
            &database.url(),
            IdempotencyPolicy::default(),
            &options,
        )
        .await
        .unwrap();
        let tables: Vec<(String, String)> = service
            .query(
                "SELECT schemaname::text, tablename::text FROM pg_tables \
                 WHERE schemaname IN ('public', 'receiver_keys') ORDER BY 1, 2",
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|row| (row.get(0), row.get(1)))
            .collect();
        let table = |schema: &str, name: &str| (schema.to_owned(), name.to_owned());
        assert_eq!(
            tables,
            [
                table("public", "bookings"),
                table("receiver_keys", "idempotency"),
                table("receiver_keys", "miniflow_receiver_schema"),
            ],
            "the supplier's database gets the records beside its own table, no outbox"
        );
        let key = IdempotencyKey::new("trip-1:1:0").unwrap();
        let digest = Digest::of(&json!({ "seat": "12A" }));
        let book = async |tx: &miniflow::tokio::tokio_postgres::Transaction<'_>| {
            // The service's own table, found past the schema on the store's search_path.
            tx.execute("INSERT INTO bookings VALUES ('trip-1')", &[])
                .await
                .map_err(|e| Error::Storage(Box::new(e)))?;
            Ok::<_, Error>(json!({ "booking": 7 }))
        };
        let result = json!({ "booking": 7 });
        assert_eq!(
            keys.run(&key, digest, book).await.unwrap(),
            Received::Done {
                result: result.clone()
            }
        );
        assert_eq!(
            keys.run(&key, digest, book).await.unwrap(),
            Received::Repeated { result }
        );
        let booked: i64 = service
            .query_one("SELECT count(*) FROM bookings", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(booked, 1, "one effect");
    });
}

#[test]
fn a_schema_keeps_miniflows_tables_apart_and_gives_the_callers_transaction_its_search_path_back() {
    let database = TestDatabase::new();
    runtime().block_on(async {
        let mut service = service_connection(&database).await;
        service
            .batch_execute("CREATE TABLE orders (order_id TEXT PRIMARY KEY)")
            .await
            .unwrap();
        let in_schema = |name: &str| PostgresOptions::new().schema(name);
        let a = AsyncPostgresStore::connect_with(&database.url(), &in_schema("flow_a"))
            .await
            .unwrap();
        let b = AsyncPostgresStore::connect_with(&database.url(), &in_schema("flow_b"))
            .await
            .unwrap();
        let engine = Engine::new(Orders);
        a.start(&engine, &wid("order-1"), Event::new("placed", json!({})))
            .await
            .unwrap();
        assert!(b.load(&wid("order-1")).await.unwrap().is_empty(), "b is apart");
        let tables = |schema: &'static str| {
            let service = &service;
            async move {
                let row = service
                    .query_one(
                        "SELECT count(*) FROM pg_tables WHERE schemaname = $1 \
                         AND tablename IN ('events', 'outbox', 'timers', 'idempotency', 'miniflow_schema')",
                        &[&schema],
                    )
                    .await
                    .unwrap();
                row.get::<_, i64>(0)
            }
        };
        assert_eq!((tables("flow_a").await, tables("flow_b").await), (5, 5));
        assert_eq!(tables("public").await, 0, "nothing of miniflow's beside the service's tables");
        // The synchronous store on the same schema sees the same outbox.
        let url = database.url();
        let events = tokio::task::spawn_blocking(move || {
            use miniflow::prelude::*;
            let store = miniflow::PostgresStore::connect_with(&url, &in_schema("flow_a")).unwrap();
            store.load(&wid("order-1")).unwrap().len()
        })
        .await
        .unwrap();
        assert_eq!(events, 1);

        // The service's own transaction: its order row, miniflow's rows in flow_b, its path kept.
        let tx = service.transaction().await.unwrap();
        let before = search_path(&tx).await;
        tx.execute("INSERT INTO orders VALUES ('order-2')", &[])
            .await
            .unwrap();
        b.start_in(&tx, &engine, &wid("order-2"), Event::new("placed", json!({})))
            .await
            .unwrap();
        assert_eq!(search_path(&tx).await, before, "start_in gave the path back");
        b.handle_in(&tx, &engine, &wid("order-2"), Event::new("paid", json!({})))
            .await
            .unwrap();
        let again = b
            .start_in(&tx, &engine, &wid("order-2"), Event::new("placed", json!({})))
            .await;
        assert!(matches!(again, Err(Error::Conflict { .. })), "{again:?}");
        assert_eq!(search_path(&tx).await, before, "a conflict gave the path back too");
        let keys = AsyncPostgresIdempotencyStore::new(b.clone(), IdempotencyPolicy::default()).unwrap();
        let key = IdempotencyKey::new("order-2:1:0").unwrap();
        let Begin::Fresh { token } = keys.begin_in(&tx, &key, Digest::of(&json!({}))).await.unwrap()
        else {
            panic!("a new key")
        };
        keys.finish_in(&tx, &key, token, &json!({ "ok": true }))
            .await
            .unwrap();
        assert_eq!(search_path(&tx).await, before, "the receiver gave the path back");
        tx.execute("INSERT INTO orders VALUES ('order-3')", &[])
            .await
            .expect("the service's own table, as before");
        tx.commit().await.unwrap();

        assert_eq!(b.load(&wid("order-2")).await.unwrap().len(), 2);
        assert!(a.load(&wid("order-2")).await.unwrap().is_empty());
        let count = |sql: &'static str| {
            let service = &service;
            async move { service.query_one(sql, &[]).await.unwrap().get::<_, i64>(0) }
        };
        assert_eq!(count("SELECT count(*) FROM flow_b.idempotency").await, 1);
        assert_eq!(count("SELECT count(*) FROM flow_a.idempotency").await, 0);
        assert_eq!(count("SELECT count(*) FROM orders").await, 2);
    });
}

#[test]
fn a_schema_that_is_not_a_plain_identifier_is_refused_naming_it() {
    let database = TestDatabase::new();
    runtime().block_on(async {
        let refused = AsyncPostgresStore::connect_with(
            &database.url(),
            &PostgresOptions::new().schema("public; DROP TABLE x"),
        )
        .await;
        match refused {
            Err(Error::InvalidInput { field, value, .. }) => {
                assert_eq!((field, value.as_str()), ("schema", "public; DROP TABLE x"));
            }
            other => panic!("{other:?}"),
        }
    });
}
