//! `AsyncStore::handle` (the async API, feature `tokio`) side by side with `Engine::handle` on a
//! `SqliteStore` (the synchronous path) doing the same work, and with hand-written rusqlite.
//!
//! The work: record one event and its two commands in each of `workflows` workflows, `events` times
//! over, on one SQLite file with the durable defaults (WAL, `synchronous=FULL`). Only the calls are
//! timed (stores are opened before). On a shared machine an `fsync` takes from 0.3 to 5 ms as other
//! work comes and goes, so the run is many short rounds, and the median round is what counts. One caller at a
//! time, then 8 callers at once (threads with a store each on the synchronous side, tasks on a
//! 2-thread runtime on the async side); both write through the file's writer thread, which commits
//! whatever arrives together in one transaction. The sides run in turns, round after round (each
//! round starting with another side), each on a fresh file; the table shows the median round and
//! the CPU time per call of the whole run (`getrusage`, this process: the writer thread included).
//!
//! Run with `cargo bench --bench async_handle --features tokio` (add `-- --quick` for a short run).
//! `cargo test --benches --features tokio` runs it once with tiny sizes, as a smoke test.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use miniflow::tokio::AsyncStore;
use miniflow::{
    json, Command, Decision, Engine, Event, EventRecord, SqliteStore, Timestamp, Workflow,
    WorkflowId,
};
use rusqlite::{params, Connection, TransactionBehavior};

mod support;
use support::process_cpu;

/// A trip that counts its events and books a flight and a hotel for each.
struct Trip;

impl Workflow for Trip {
    type State = u64;

    fn evolve(&self, seen: &mut u64, _: &EventRecord) {
        *seen += 1;
    }

    fn decide(&self, seen: &u64, event: &EventRecord) -> Decision {
        Decision::new()
            .command(Command::new(
                "book_flight",
                json!({ "to": event.payload["city"], "leg": seen }),
            ))
            .command(Command::new(
                "book_hotel",
                json!({ "city": event.payload["city"], "nights": 2 }),
            ))
    }
}

fn event(n: usize) -> Event {
    Event::new("leg_added", json!({ "city": "成都", "n": n }))
}

struct Sizes {
    workflows: usize,
    events: usize,
    rounds: usize,
}

const CALLERS: usize = 8;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let sizes = if !args.iter().any(|a| a == "--bench") {
        Sizes {
            workflows: 16,
            events: 2,
            rounds: 1,
        }
    } else if args.iter().any(|a| a == "--quick") {
        Sizes {
            workflows: 40,
            events: 4,
            rounds: 6,
        }
    } else {
        Sizes {
            workflows: 40,
            events: 5,
            rounds: 21,
        }
    };
    let dir =
        tempfile::tempdir_in(std::env::var("BENCH_DIR").unwrap_or_else(|_| ".".into())).unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let calls = sizes.workflows * sizes.events;

    println!(
        "## `AsyncStore::handle` vs `Engine::handle` on `SqliteStore` ({} workflows × {} events, \
         1 event + 2 commands per call, WAL, synchronous=FULL)",
        sizes.workflows, sizes.events
    );
    println!();
    println!(
        "Median of {} rounds; CPU time per call over all rounds (this process, the writer thread \
         included).",
        sizes.rounds
    );
    println!();
    println!("| callers | path | calls/s | µs/call | CPU-µs/call | vs sync |");
    println!("|---|---|---:|---:|---:|---:|");
    for callers in [1, CALLERS] {
        let mut runs: [Vec<Run>; 3] = [Vec::new(), Vec::new(), Vec::new()];
        for round in 0..sizes.rounds {
            // Each round starts with another side, so none always follows the same one (the disk
            // may still be writing back what the side before wrote).
            for side in (0..3).map(|n| (n + round) % 3) {
                let file = dir.path().join(format!("{side}-{callers}-{round}.db"));
                runs[side].push(match side {
                    0 => sync_handles(&file, &sizes, callers),
                    1 => async_handles(&runtime, &file, &sizes, callers),
                    _ => raw_handles(&file, &sizes, callers),
                });
            }
        }
        let [sync, asynchronous, raw] = runs.map(Run::summary);
        for (path, run) in [
            ("`Engine::handle`, `SqliteStore` (sync)", &sync),
            ("`AsyncStore::handle` (async)", &asynchronous),
            ("raw rusqlite, state in memory", &raw),
        ] {
            println!(
                "| {callers} | {path} | {:.0} | {:.1} | {:.1} | {:.2}× |",
                calls as f64 / run.wall.as_secs_f64(),
                micros(run.wall) / calls as f64,
                micros(run.cpu) / calls as f64,
                sync.wall.as_secs_f64() / run.wall.as_secs_f64(),
            );
        }
    }
}

/// `callers` threads, each with a `SqliteStore` of its own, handle their share of the workflows;
/// only the calls are timed.
fn sync_handles(path: &Path, sizes: &Sizes, callers: usize) -> Run {
    let engine = Arc::new(Engine::new(Trip));
    let stores: Vec<SqliteStore> = (0..callers)
        .map(|_| SqliteStore::open(path).unwrap())
        .collect();
    timed(|| {
        std::thread::scope(|scope| {
            for (caller, mut store) in stores.into_iter().enumerate() {
                let engine = engine.clone();
                scope.spawn(move || {
                    for n in 0..sizes.events {
                        for w in (caller..sizes.workflows).step_by(callers) {
                            let id = WorkflowId::new(format!("trip-{w}")).unwrap();
                            engine.handle(&mut store, &id, event(n), now()).unwrap();
                        }
                    }
                });
            }
        });
    })
}

/// `callers` tasks on one `AsyncStore` handle their share of the workflows; only the calls are
/// timed.
fn async_handles(
    runtime: &tokio::runtime::Runtime,
    path: &Path,
    sizes: &Sizes,
    callers: usize,
) -> Run {
    let engine = Arc::new(Engine::new(Trip));
    let store = runtime.block_on(AsyncStore::open(path)).unwrap();
    timed(|| {
        runtime.block_on(async {
            let mut tasks = tokio::task::JoinSet::new();
            for caller in 0..callers {
                let (engine, store) = (engine.clone(), store.clone());
                let (workflows, events) = (sizes.workflows, sizes.events);
                tasks.spawn(async move {
                    for n in 0..events {
                        for w in (caller..workflows).step_by(callers) {
                            let id = WorkflowId::new(format!("trip-{w}")).unwrap();
                            store.handle(&engine, &id, event(n)).await.unwrap();
                        }
                    }
                });
            }
            while let Some(done) = tasks.join_next().await {
                done.unwrap();
            }
        })
    })
}

/// Hand-written: `callers` threads with a connection each, the state in memory, one `BEGIN
/// IMMEDIATE` transaction per call (the workflow's last seq checked, the event and two commands
/// inserted).
fn raw_handles(path: &Path, sizes: &Sizes, callers: usize) -> Run {
    drop(SqliteStore::open(path).unwrap());
    let connections: Vec<Connection> = (0..callers)
        .map(|_| {
            let conn = Connection::open(path).unwrap();
            conn.busy_timeout(Duration::from_secs(30)).unwrap();
            conn.execute_batch("PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON;")
                .unwrap();
            conn
        })
        .collect();
    timed(|| {
        std::thread::scope(|scope| {
            for (caller, mut conn) in connections.into_iter().enumerate() {
                scope.spawn(move || {
                    let now = now().as_millis() as i64;
                    for n in 0..sizes.events {
                        for w in (caller..sizes.workflows).step_by(callers) {
                            let id = format!("trip-{w}");
                            let seq = n as i64 + 1;
                            let tx = conn
                                .transaction_with_behavior(TransactionBehavior::Immediate)
                                .unwrap();
                            let last: i64 = tx
                            .prepare_cached(
                                "SELECT COALESCE(MAX(seq), 0) FROM events WHERE workflow_id = ?1",
                            )
                            .unwrap()
                            .query_row([&id], |r| r.get(0))
                            .unwrap();
                            assert_eq!(last, seq - 1);
                            let payload = json!({ "city": "成都", "n": n }).to_string();
                            tx.prepare_cached(
                            "INSERT INTO events (workflow_id, seq, kind, payload, recorded_at) \
                             VALUES (?1, ?2, 'leg_added', ?3, ?4)",
                        )
                        .unwrap()
                        .execute(params![id, seq, payload, now])
                        .unwrap();
                            let mut insert = tx
                            .prepare_cached(
                                "INSERT INTO outbox (workflow_id, event_seq, idx, kind, payload, \
                                 status, available_at, created_at) \
                                 VALUES (?1, ?2, ?3, ?4, ?5, 'pending', ?6, ?6)",
                            )
                            .unwrap();
                            let flight = json!({ "to": "成都", "leg": last }).to_string();
                            let hotel = json!({ "city": "成都", "nights": 2 }).to_string();
                            insert
                                .execute(params![id, seq, 0, "book_flight", flight, now])
                                .unwrap();
                            insert
                                .execute(params![id, seq, 1, "book_hotel", hotel, now])
                                .unwrap();
                            drop(insert);
                            tx.commit().unwrap();
                        }
                    }
                });
            }
        })
    })
}

fn now() -> Timestamp {
    Timestamp::from_millis(1_700_000_000_000)
}

struct Run {
    wall: Duration,
    cpu: Duration,
}

impl Run {
    /// The median round's wall time, and the CPU time per round over all rounds.
    fn summary(mut runs: Vec<Run>) -> Run {
        let rounds = runs.len() as u32;
        let cpu = runs.iter().map(|r| r.cpu).sum::<Duration>() / rounds;
        runs.sort_by_key(|r| r.wall);
        Run {
            wall: runs[runs.len() / 2].wall,
            cpu,
        }
    }
}

/// Wall and CPU time of `run`.
fn timed(run: impl FnOnce()) -> Run {
    let (wall, cpu) = (Instant::now(), process_cpu());
    run();
    Run {
        wall: wall.elapsed(),
        cpu: process_cpu().saturating_sub(cpu),
    }
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}
