//! The async API (feature `tokio`): `AsyncStore` over the writer thread, the caller's transaction,
//! `AsyncDispatcher` (concurrency, outcomes, heartbeats, shutdown, timers, bounds) and
//! `AsyncIdempotencyStore`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use miniflow::prelude::*;
use miniflow::tokio::{AsyncDispatcher, AsyncIdempotencyStore, AsyncStore};
use miniflow::{
    json, Begin, ClaimRequest, Clock, Command, CommandCompleted, Decision, Delivery, Digest,
    Engine, Error, Event, EventRecord, IdempotencyKey, IdempotencyPolicy, Outcome, RetryPolicy,
    Settlement, SqliteStore, Status, Workflow, WorkflowId, COMMAND_COMPLETED,
};

/// Counts its events; each event decides one command carrying the count it was decided on (a
/// command for `"book"` asks for its result), so a decision on a stale state shows.
struct Counter;

impl Workflow for Counter {
    type State = u64;

    fn evolve(&self, seen: &mut u64, _: &EventRecord) {
        *seen += 1;
    }

    fn decide(&self, seen: &u64, event: &EventRecord) -> Decision {
        match event.kind.as_str() {
            COMMAND_COMPLETED => Decision::none(),
            "book" => Decision::new()
                .command(Command::new("book", json!({ "seen": seen })).report_result()),
            "refuse" => Decision::reject("refused"),
            "cancel" => Decision::new().cancel_commands_of_kind("count"),
            _ => Decision::new().command(Command::new("count", json!({ "seen": seen }))),
        }
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn wid(text: &str) -> WorkflowId {
    WorkflowId::new(text).unwrap()
}

/// Every command of `w` carries the count of the events before its own.
fn assert_decided_on_every_event(store: &SqliteStore, w: &str) {
    for row in store.commands(&wid(w)).unwrap() {
        if row.kind == "count" || row.kind == "book" {
            assert_eq!(
                row.payload["seen"],
                json!(row.command_id.event_seq().get() - 1),
                "{} decided on a stale state",
                row.command_id
            );
        }
    }
}

async fn open(dir: &tempfile::TempDir) -> AsyncStore {
    AsyncStore::open(dir.path().join("flow.db")).await.unwrap()
}

#[test]
fn concurrent_handles_on_one_workflow_commit_gapless_each_on_the_state_before_it() {
    runtime().block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let store = open(&dir).await;
        let engine = Arc::new(Engine::new(Counter));
        // 60 calls at once on one workflow and 60 on others: the writer groups them, and each
        // decides on the events committed (or grouped) before it.
        let mut calls = tokio::task::JoinSet::new();
        for n in 0..120 {
            let (store, engine) = (store.clone(), engine.clone());
            let w = if n % 2 == 0 {
                wid("hot")
            } else {
                wid(&format!("cold-{}", n % 6))
            };
            calls.spawn(async move {
                store
                    .handle(&engine, &w, Event::new("tick", json!(n)))
                    .await
            });
        }
        while let Some(handled) = calls.join_next().await {
            let handled = handled.unwrap().unwrap();
            assert_eq!(
                handled.conflicts, 0,
                "the writer's transaction has no race to lose"
            );
        }
        let sync = SqliteStore::open(store.path()).unwrap();
        let seqs: Vec<u64> = sync
            .load(&wid("hot"))
            .unwrap()
            .iter()
            .map(|e| e.seq.get())
            .collect();
        assert_eq!(seqs, (1..=60).collect::<Vec<_>>());
        assert_decided_on_every_event(&sync, "hot");
        for n in 0..6 {
            assert_decided_on_every_event(&sync, &format!("cold-{n}"));
        }
        let stats = engine.state_cache_stats();
        assert!(
            stats.hits >= 50,
            "the engine folded from its cached states: {stats:?}"
        );
    });
}

#[test]
fn concurrent_starts_of_one_workflow_commit_exactly_one_first_event() {
    runtime().block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let store = open(&dir).await;
        let engine = Arc::new(Engine::new(Counter));
        let mut calls = tokio::task::JoinSet::new();
        for n in 0..16 {
            let (store, engine) = (store.clone(), engine.clone());
            calls.spawn(async move {
                store
                    .start(&engine, &wid("order"), Event::new("placed", json!(n)))
                    .await
            });
        }
        let (mut started, mut refused) = (0, 0);
        while let Some(result) = calls.join_next().await {
            match result.unwrap() {
                Ok(handled) => {
                    assert_eq!(handled.seq.get(), 1);
                    started += 1;
                }
                Err(Error::Conflict { actual, .. }) => {
                    assert_eq!(actual.get(), 1);
                    refused += 1;
                }
                Err(other) => panic!("{other}"),
            }
        }
        assert_eq!((started, refused), (1, 15));
        // The workflow goes on through `handle`, from the event the start wrote.
        store
            .handle(&engine, &wid("order"), Event::new("tick", json!(0)))
            .await
            .unwrap();
        let sync = SqliteStore::open(store.path()).unwrap();
        assert_eq!(sync.load(&wid("order")).unwrap().len(), 2);
        assert_eq!(sync.commands(&wid("order")).unwrap().len(), 2);
        assert_decided_on_every_event(&sync, "order");
    });
}

#[test]
fn a_transaction_commits_the_callers_rows_with_events_and_commands_or_nothing() {
    runtime().block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let store = open(&dir).await;
        let engine = Arc::new(Engine::new(Counter));
        store
            .transaction(|tx| tx.execute("CREATE TABLE orders (id TEXT PRIMARY KEY)", []))
            .await
            .unwrap();
        let place = |id: &'static str, fail_after: bool| {
            let (store, engine) = (store.clone(), engine.clone());
            async move {
                store
                    .transaction(move |tx| {
                        tx.execute("INSERT INTO orders VALUES (?1)", [id])?;
                        let first =
                            tx.handle(&engine, &wid(id), Event::new("placed", json!({})))?;
                        let second = tx.handle(&engine, &wid(id), Event::new("paid", json!({})))?;
                        if fail_after {
                            return Err(Error::invalid("order", id, "refused after the writes"));
                        }
                        Ok((first.seq.get(), second.seq.get()))
                    })
                    .await
            }
        };
        assert_eq!(place("order-1", false).await.unwrap(), (1, 2));
        let refused = place("order-2", true).await.unwrap_err();
        assert!(matches!(refused, Error::InvalidInput { .. }), "{refused}");
        // A rejected decision inside the closure, returned as the closure's error.
        let rejected = store
            .transaction({
                let engine = engine.clone();
                move |tx| tx.handle(&engine, &wid("order-1"), Event::new("refuse", json!({})))
            })
            .await
            .unwrap_err();
        assert!(matches!(rejected, Error::Rejected { .. }), "{rejected}");

        let sync = SqliteStore::open(store.path()).unwrap();
        let orders: Vec<String> = sync
            .connection()
            .prepare("SELECT id FROM orders ORDER BY id")
            .unwrap()
            .query_map([], |row| row.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(
            orders,
            ["order-1"],
            "the refused order's row was rolled back"
        );
        assert!(
            sync.load(&wid("order-2")).unwrap().is_empty(),
            "and its events"
        );
        assert!(
            sync.commands(&wid("order-2")).unwrap().is_empty(),
            "and its commands"
        );
        assert_eq!(sync.commands(&wid("order-1")).unwrap().len(), 2);

        // States folded in the rolled-back transaction were not kept: order-2 starts afresh, and
        // order-1 goes on from its two committed events.
        let handled = store
            .handle(&engine, &wid("order-2"), Event::new("placed", json!({})))
            .await
            .unwrap();
        assert_eq!(handled.seq.get(), 1);
        store
            .handle(&engine, &wid("order-1"), Event::new("shipped", json!({})))
            .await
            .unwrap();
        assert_decided_on_every_event(&sync, "order-1");
        assert_decided_on_every_event(&sync, "order-2");
    });
}

#[test]
fn async_writes_run_on_the_writers_durable_connection() {
    runtime().block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let store = open(&dir).await;
        let (journal, synchronous): (String, i64) = store
            .transaction(|tx| {
                let pragma = |name: &str| format!("PRAGMA {name}");
                let sql = tx.sql();
                let journal = sql.query_row(&pragma("journal_mode"), [], |row| row.get(0));
                let synchronous = sql.query_row(&pragma("synchronous"), [], |row| row.get(0));
                journal
                    .and_then(|j| synchronous.map(|s| (j, s)))
                    .map_err(|e| Error::Storage(Box::new(e)))
            })
            .await
            .unwrap();
        // The writer commits without waiting for the disk and syncs the WAL before it answers, as
        // durable as synchronous=FULL (see the writer's own tests).
        assert_eq!(
            (journal.as_str(), synchronous),
            ("wal", 1),
            "WAL, committed with synchronous=NORMAL and synced by the writer's reply thread"
        );
        let sync = SqliteStore::open(store.path()).unwrap();
        assert!(
            sync.writer().unwrap().same_thread_as(store.writer()),
            "the async and the sync store of one file share its writer"
        );
    });
}

#[test]
fn claims_acks_failures_extensions_and_releases_settle_as_in_the_sync_store() {
    runtime().block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let store = open(&dir).await;
        let engine = Arc::new(Engine::new(Counter));
        for n in 0..3 {
            store
                .handle(
                    &engine,
                    &wid(&format!("w{n}")),
                    Event::new("tick", json!({})),
                )
                .await
                .unwrap();
        }
        let request = ClaimRequest::new("async")
            .limit(3)
            .lease_ttl(Duration::from_secs(30));
        let claimed = store.claim(request.clone()).await.unwrap();
        assert_eq!(claimed.len(), 3);
        assert!(
            store.claim(request).await.unwrap().is_empty(),
            "leased: not claimable"
        );
        let [a, b, c] = [&claimed[0], &claimed[1], &claimed[2]];
        store
            .complete(&a.command_id, a.token, Some(json!({ "ok": 1 })))
            .await
            .unwrap();
        let stale = store
            .complete(&b.command_id, b.token + 1, None)
            .await
            .unwrap_err();
        assert!(matches!(stale, Error::StaleLease { .. }), "{stale}");
        let extended = store
            .extend(&b.command_id, b.token, Duration::from_secs(60))
            .await
            .unwrap();
        assert!(extended.expires_at > b.lease_expires_at);
        let settled = store
            .fail(
                &b.command_id,
                b.token,
                miniflow::Failure::permanent("422"),
                RetryPolicy::default(),
            )
            .await
            .unwrap();
        assert_eq!(settled, miniflow::Settled::Dead);
        store.release(&c.command_id, c.token).await.unwrap();

        let rows = store
            .with_store(|sync| {
                Ok([&"w0:1:0", &"w1:1:0", &"w2:1:0"]
                    .map(|id| sync.command(&id.parse().unwrap()).unwrap().unwrap()))
            })
            .await
            .unwrap();
        assert_eq!(rows[0].status, Status::Done);
        assert_eq!(rows[0].result, Some(json!({ "ok": 1 })));
        assert_eq!(rows[1].status, Status::Dead);
        assert_eq!(
            (rows[2].status, rows[2].attempts),
            (Status::Pending, 0),
            "released unattempted"
        );
    });
}

#[test]
fn idle_claims_take_no_write_lock() {
    runtime().block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let store = open(&dir).await;
        // Another process holds the file's write lock (for less than its busy timeout).
        let mut other = miniflow::rusqlite::Connection::open(store.path()).unwrap();
        let locked = other
            .transaction_with_behavior(miniflow::rusqlite::TransactionBehavior::Immediate)
            .unwrap();
        let started = std::time::Instant::now();
        let request = ClaimRequest::new("idle").limit(10);
        assert!(store.claim(request).await.unwrap().is_empty());
        assert!(store
            .claim_timers(10, Duration::from_secs(1))
            .await
            .unwrap()
            .is_empty());
        let stats = AsyncDispatcher::new(store.clone(), |_: Delivery| async { Outcome::Done })
            .workflow(Arc::new(Engine::new(Counter)))
            .run_until_idle()
            .await
            .unwrap();
        assert_eq!(stats.claimed, 0);
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "nothing was due, so nothing waited for the lock: {:?}",
            started.elapsed()
        );
        drop(locked);
    });
}

/// `n` workflows with one `count` command each.
async fn seed(store: &AsyncStore, engine: &Arc<Engine<Counter>>, n: usize) {
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..n {
        let (store, engine) = (store.clone(), engine.clone());
        calls.spawn(async move {
            store
                .handle(
                    &engine,
                    &wid(&format!("order-{i:03}")),
                    Event::new("tick", json!({})),
                )
                .await
        });
    }
    while let Some(handled) = calls.join_next().await {
        handled.unwrap().unwrap();
    }
}

#[test]
fn the_async_dispatcher_delivers_each_command_once_at_most_concurrency_at_a_time() {
    runtime().block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let store = open(&dir).await;
        let engine = Arc::new(Engine::new(Counter));
        seed(&store, &engine, 120).await;
        let (running, most, delivered) = (
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicUsize::new(0)),
            Arc::new(Mutex::new(Vec::new())),
        );
        let handler = {
            let (running, most, delivered) = (running.clone(), most.clone(), delivered.clone());
            move |delivery: Delivery| {
                let (running, most, delivered) = (running.clone(), most.clone(), delivered.clone());
                async move {
                    let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    delivered
                        .lock()
                        .unwrap()
                        .push(delivery.command_id.to_string());
                    running.fetch_sub(1, Ordering::SeqCst);
                    Outcome::Done
                }
            }
        };
        let stats = AsyncDispatcher::new(store.clone(), handler)
            .concurrency(8)
            .batch_size(5)
            .run_until_idle()
            .await
            .unwrap();
        assert_eq!((stats.claimed, stats.completed), (120, 120), "{stats:?}");
        let mut delivered = delivered.lock().unwrap().clone();
        delivered.sort();
        delivered.dedup();
        assert_eq!(delivered.len(), 120, "each command delivered once");
        let most = most.load(Ordering::SeqCst);
        assert!((2..=8).contains(&most), "{most} deliveries ran at once");
        let pending = store.with_store(|s| s.pending(usize::MAX)).await.unwrap();
        assert!(
            pending.is_empty(),
            "every completion acknowledged: {pending:?}"
        );
    });
}

#[test]
fn retries_refusals_and_panics_settle_as_the_sync_dispatcher_settles_them() {
    runtime().block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let store = open(&dir).await;
        let engine = Arc::new(Engine::new(Counter));
        seed(&store, &engine, 3).await;
        let attempts = Arc::new(Mutex::new(std::collections::HashMap::<String, u32>::new()));
        let settled = Arc::new(Mutex::new(Vec::new()));
        let handler = {
            let attempts = attempts.clone();
            move |delivery: Delivery| {
                let attempts = attempts.clone();
                async move {
                    let id = delivery.command_id.to_string();
                    let n = {
                        let mut attempts = attempts.lock().unwrap();
                        let n = attempts.entry(id.clone()).or_default();
                        *n += 1;
                        *n
                    };
                    tokio::task::yield_now().await;
                    match (id.as_str(), n) {
                        ("order-000:1:0", 1) => Outcome::retry("503"),
                        ("order-001:1:0", _) => Outcome::permanent("422 no such order"),
                        ("order-002:1:0", 1) => panic!("the handler broke"),
                        _ => Outcome::Done,
                    }
                }
            }
        };
        // Time stands still unless moved: the retries are due only once the clock passes them.
        let clock = Arc::new(miniflow::ManualClock::new(miniflow::SystemClock.now()));
        let store = store.with_clock(clock.clone());
        let log = settled.clone();
        let dispatcher = AsyncDispatcher::new(store.clone(), handler)
            .concurrency(4)
            .retry_policy(RetryPolicy::default().initial_delay(Duration::from_secs(1)).jitter(0.0))
            .poll_interval(Duration::from_millis(2))
            .on_settled(move |d, s| log.lock().unwrap().push((d.command_id.to_string(), s.clone())));
        let first = dispatcher.run_until_idle().await.unwrap();
        assert_eq!(
            (first.completed, first.retried, first.dead, first.panics),
            (0, 2, 1, 1),
            "{first:?}"
        );
        clock.advance(Duration::from_secs(1));
        let again = dispatcher.run_until_idle().await.unwrap();
        assert_eq!((again.completed, again.retried), (2, 0), "{again:?}");
        let settled = settled.lock().unwrap().clone();
        assert!(settled.iter().any(|(id, s)| id == "order-001:1:0"
            && *s == Settlement::Dead { error: "422 no such order".into() }));
        assert!(settled.iter().any(|(id, s)| id == "order-002:1:0"
            && matches!(s, Settlement::RetryAt { error, .. } if error.contains("the handler broke"))));
        let dead = store.with_store(|s| s.dead_letters(10)).await.unwrap();
        assert_eq!(dead.len(), 1);
        assert_eq!(dead[0].command_id.to_string(), "order-001:1:0");
    });
}

#[test]
fn heartbeats_keep_a_long_delivery_leased_and_cancellations_reach_the_handler() {
    runtime().block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let store = open(&dir).await;
        let engine = Arc::new(Engine::new(Counter));
        seed(&store, &engine, 2).await;
        let saw_cancel = Arc::new(Mutex::new(Vec::new()));
        let started = Arc::new(AtomicUsize::new(0));
        let handler = {
            let (saw_cancel, started) = (saw_cancel.clone(), started.clone());
            move |delivery: Delivery| {
                let saw_cancel = saw_cancel.clone();
                started.fetch_add(1, Ordering::SeqCst);
                async move {
                    // Four lease TTLs: only the heartbeat keeps the lease.
                    for _ in 0..40 {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        // The function the synchronous dispatcher's handlers ask answers here too.
                        let requested = miniflow::cancellation_requested();
                        assert_eq!(requested, miniflow::tokio::cancellation_requested());
                        if requested {
                            saw_cancel
                                .lock()
                                .unwrap()
                                .push(delivery.command_id.to_string());
                            return Outcome::retry("cancelled by its workflow");
                        }
                    }
                    Outcome::Done
                }
            }
        };
        let running = AsyncDispatcher::new(store.clone(), handler)
            .concurrency(2)
            .lease_ttl(Duration::from_millis(200))
            .start()
            .unwrap();
        // Both leased and in their handlers, then past their first TTL.
        while started.load(Ordering::SeqCst) < 2 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let rival = store
            .claim(
                ClaimRequest::new("rival")
                    .limit(5)
                    .lease_ttl(Duration::from_secs(5)),
            )
            .await
            .unwrap();
        assert!(
            rival.is_empty(),
            "past their first TTL both leases are still held"
        );
        // order-001's workflow withdraws its command while it is being delivered.
        store
            .handle(&engine, &wid("order-001"), Event::new("cancel", json!({})))
            .await
            .unwrap();
        assert!(
            !miniflow::tokio::cancellation_requested(),
            "outside a handler"
        );
        // Shutting down at once: the deliveries finish meanwhile, and the heartbeat keeps their
        // leases and tells the withdrawn one of its cancellation until they have.
        let shutdown = running.shutdown(Duration::from_secs(5)).await;
        let stats = shutdown.stats;
        assert_eq!(
            (stats.completed, stats.cancelled, stats.lost_leases),
            (1, 1, 0),
            "{stats:?}"
        );
        assert_eq!(*saw_cancel.lock().unwrap(), ["order-001:1:0"]);
        let row = store
            .with_store(|s| s.command(&"order-001:1:0".parse().unwrap()))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(row.status, Status::Cancelled);
    });
}

#[test]
fn shutdown_lets_deliveries_finish_and_cuts_off_the_ones_past_the_deadline() {
    runtime().block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let store = open(&dir).await;
        let engine = Arc::new(Engine::new(Counter));
        seed(&store, &engine, 4).await;
        let started = Arc::new(AtomicUsize::new(0));
        let handler = {
            let started = started.clone();
            move |delivery: Delivery| {
                let started = started.clone();
                async move {
                    started.fetch_add(1, Ordering::SeqCst);
                    if delivery.command_id.to_string() == "order-003:1:0" {
                        std::future::pending::<()>().await; // hangs
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    Outcome::Done
                }
            }
        };
        let running = AsyncDispatcher::new(store.clone(), handler)
            .concurrency(4)
            .lease_ttl(Duration::from_millis(400))
            .start()
            .unwrap();
        while started.load(Ordering::SeqCst) < 4 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let shutdown = running.shutdown(Duration::from_millis(300)).await;
        assert_eq!(shutdown.stats.completed, 3, "{:?}", shutdown.stats);
        assert_eq!(
            shutdown.unfinished_workers, 1,
            "the hanging delivery was cut off"
        );
        assert!(shutdown.errors.is_empty(), "{:?}", shutdown.errors);
        // Its lease runs out (the heartbeat stopped with the dispatcher), and the next dispatcher
        // delivers it.
        tokio::time::sleep(Duration::from_millis(700)).await;
        let stats = AsyncDispatcher::new(store.clone(), |_: Delivery| async { Outcome::Done })
            .run_until_idle()
            .await
            .unwrap();
        assert_eq!(stats.completed, 1);
    });
}

#[test]
fn results_come_back_through_timers_fired_by_the_engine() {
    runtime().block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let store = open(&dir).await;
        let engine = Arc::new(Engine::new(Counter));
        for n in 0..5 {
            store
                .handle(
                    &engine,
                    &wid(&format!("trip-{n}")),
                    Event::new("book", json!({})),
                )
                .await
                .unwrap();
        }
        let stats = AsyncDispatcher::new(store.clone(), |d: Delivery| async move {
            Outcome::done_with(json!({ "reference": format!("REF-{}", d.command_id) }))
        })
        .concurrency(3)
        .workflow(engine.clone())
        .run_until_idle()
        .await
        .unwrap();
        assert_eq!((stats.completed, stats.timers_fired), (5, 5), "{stats:?}");
        let events = store.with_store(|s| s.load(&wid("trip-3"))).await.unwrap();
        assert_eq!(events.len(), 2);
        let completed: CommandCompleted =
            serde_json::from_value(events[1].payload.clone()).unwrap();
        assert_eq!(completed.result, json!({ "reference": "REF-trip-3:1:0" }));
    });
}

#[test]
fn settings_out_of_bounds_are_refused_naming_the_setting() {
    runtime().block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let store = open(&dir).await;
        let dispatcher =
            || AsyncDispatcher::new(store.clone(), |_: Delivery| async { Outcome::Done });
        for (field, attempt) in [
            (
                "concurrency",
                dispatcher().concurrency(0).run_until_idle().await,
            ),
            (
                "concurrency",
                dispatcher().concurrency(10_001).run_until_idle().await,
            ),
            (
                "lease_ttl",
                dispatcher()
                    .lease_ttl(Duration::from_millis(1))
                    .run_until_idle()
                    .await,
            ),
            (
                "batch_size",
                dispatcher().batch_size(0).run_until_idle().await,
            ),
            (
                "poll_interval",
                dispatcher()
                    .poll_interval(Duration::ZERO)
                    .run_until_idle()
                    .await,
            ),
        ] {
            match attempt {
                Err(Error::InvalidInput { field: f, .. }) => assert_eq!(f, field),
                other => panic!("{field}: {other:?}"),
            }
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let store = runtime().block_on(open(&dir));
    let outside = AsyncDispatcher::new(store, |_: Delivery| async { Outcome::Done }).start();
    assert!(
        matches!(&outside, Err(Error::InvalidInput { field, .. }) if *field == "runtime"),
        "{:?}",
        outside.err()
    );
}

#[test]
fn an_async_receiver_makes_one_effect_per_key_under_concurrent_deliveries() {
    runtime().block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let store = open(&dir).await;
        let keys = AsyncIdempotencyStore::new(store.clone(), IdempotencyPolicy::default()).unwrap();
        store
            .transaction(|tx| {
                tx.execute(
                    "CREATE TABLE bookings (key TEXT PRIMARY KEY, n INTEGER)",
                    [],
                )
            })
            .await
            .unwrap();
        // Ten deliveries of one key and one of another, at once.
        let mut calls = tokio::task::JoinSet::new();
        for n in 0..11 {
            let (store, keys) = (store.clone(), keys.clone());
            let key = if n < 10 { "trip-1:1:0" } else { "trip-2:1:0" };
            calls.spawn(async move {
                store
                    .transaction(move |tx| {
                        let key = IdempotencyKey::new(key)?;
                        match keys.begin_in(tx, &key, Digest::of(&json!({ "seat": "12A" })))? {
                            Begin::Fresh { token } => {
                                tx.execute(
                                    "INSERT INTO bookings VALUES (?1, ?2)",
                                    (key.as_str(), n),
                                )?;
                                let result = json!({ "booking": n });
                                keys.finish_in(tx, &key, token, &result)?;
                                Ok(result)
                            }
                            Begin::Completed { result } => Ok(result),
                            other => panic!("{other:?}"),
                        }
                    })
                    .await
            });
        }
        let mut answers = Vec::new();
        while let Some(answer) = calls.join_next().await {
            answers.push(answer.unwrap().unwrap());
        }
        let bookings: i64 = store
            .transaction(|tx| {
                tx.sql()
                    .query_row("SELECT count(*) FROM bookings", [], |row| row.get(0))
                    .map_err(|e| Error::Storage(Box::new(e)))
            })
            .await
            .unwrap();
        assert_eq!(bookings, 2, "one effect per key");
        answers.sort_by_key(|a| a.to_string());
        answers.dedup();
        assert_eq!(
            answers.len(),
            2,
            "every delivery of a key got the same answer"
        );

        // Outside a transaction: begin, a repeat in progress, finish, a repeat completed.
        let key = IdempotencyKey::new("trip-3:1:0").unwrap();
        let digest = Digest::of(&json!({ "seat": "1C" }));
        let Begin::Fresh { token } = keys.begin(&key, digest).await.unwrap() else {
            panic!("fresh")
        };
        assert!(matches!(
            keys.begin(&key, digest).await.unwrap(),
            Begin::InProgress { .. }
        ));
        keys.finish(&key, token, json!("done")).await.unwrap();
        assert_eq!(
            keys.begin(&key, digest).await.unwrap(),
            Begin::Completed {
                result: json!("done")
            }
        );
        let conflict = keys
            .begin(&key, Digest::of(&json!({ "seat": "2D" })))
            .await
            .unwrap();
        assert!(matches!(conflict, Begin::Conflict { .. }), "{conflict:?}");
    });
}
