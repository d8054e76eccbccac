//! `Engine::handle` on a workflow with 10,000 recorded events, side by side with the same call on a
//! new workflow, with the engine's state cache on and off, and with hand-written rusqlite that keeps
//! the state in a variable (the best a program written by hand can do: no replay at all, the same
//! rows in one `BEGIN IMMEDIATE` transaction, the workflow's last seq checked first).
//!
//! Each call records one event and decides two commands. The "new" and "long" sides run in turns,
//! round after round on the same store, so drift on a shared machine hits both alike; the table shows
//! the median round's wall time per call and the CPU time per call of the whole run (`getrusage`).
//!
//! Run with `cargo bench --bench replay` (add `-- --quick` for a short run). `cargo test --benches`
//! runs it once with tiny sizes, as a smoke test.

use std::path::Path;
use std::time::{Duration, Instant};

use miniflow::prelude::*;
use miniflow::{
    json, Command, Decision, Engine, Event, EventRecord, MemoryStore, SqliteOptions, SqliteStore,
    Synchronous, Timestamp, Workflow, WorkflowId,
};
use rusqlite::{params, Connection, TransactionBehavior};

mod support;
use support::process_cpu;

const NOW: Timestamp = Timestamp::from_millis(1_700_000_000_000);

/// An order that adds up its items; each item decides a reservation and a price check.
struct Order;

#[derive(Default)]
struct Cart {
    items: u64,
    total: i64,
    last_sku: String,
}

impl Workflow for Order {
    type State = Cart;

    fn evolve(&self, cart: &mut Cart, event: &EventRecord) {
        cart.items += 1;
        cart.total += event.payload["price"].as_i64().unwrap_or(0);
        if let Some(sku) = event.payload["sku"].as_str() {
            sku.clone_into(&mut cart.last_sku);
        }
    }

    fn decide(&self, cart: &Cart, event: &EventRecord) -> Decision {
        Decision::new()
            .command(Command::new(
                "reserve_stock",
                json!({ "sku": event.payload["sku"], "after": cart.items }),
            ))
            .command(Command::new(
                "check_price",
                json!({ "total": cart.total, "previous": cart.last_sku }),
            ))
    }
}

fn item(n: u64) -> Event {
    Event::new(
        "item_added",
        json!({ "sku": format!("sku-{}", n % 97), "price": 1200 + (n % 13) as i64 }),
    )
}

struct Sizes {
    long: u64,
    calls: u64,
    rounds: usize,
    uncached_calls: u64,
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let sizes = if !args.iter().any(|a| a == "--bench") {
        Sizes {
            long: 200,
            calls: 20,
            rounds: 1,
            uncached_calls: 2,
        }
    } else if args.iter().any(|a| a == "--quick") {
        Sizes {
            long: 10_000,
            calls: 200,
            rounds: 3,
            uncached_calls: 10,
        }
    } else {
        Sizes {
            long: 10_000,
            calls: 500,
            rounds: 5,
            uncached_calls: 30,
        }
    };
    let dir =
        tempfile::tempdir_in(std::env::var("BENCH_DIR").unwrap_or_else(|_| ".".into())).unwrap();
    let long = WorkflowId::new("order-long").unwrap();

    println!(
        "## `Engine::handle` on a workflow with {} events vs on a new workflow",
        sizes.long
    );
    println!();
    println!(
        "One event and two commands per call; wall time per call is the median of {} rounds of {} \
         calls per side, CPU time per call is over all rounds.",
        sizes.rounds, sizes.calls
    );
    println!();
    println!(
        "| store | workflow | state cache | µs/call | CPU-µs/call | vs new workflow (wall) | \
         vs new workflow (CPU) |"
    );
    println!("|---|---|---|---:|---:|---:|---:|");

    // MemoryStore: the commit itself is cheap, so any replay shows most.
    let mut memory = MemoryStore::new();
    let build = grow(&mut memory, &long, sizes.long);
    let rows = compare(&mut memory, &long, &sizes, "memory");
    print_rows("MemoryStore", &rows, sizes.long);

    // SqliteStore: built once, then opened with each durability setting.
    let path = dir.path().join("replay.db");
    let normal = SqliteOptions {
        synchronous: Synchronous::Normal,
        ..SqliteOptions::default()
    };
    let mut store = SqliteStore::open_with(&path, &normal).unwrap();
    let sqlite_build = grow(&mut store, &long, sizes.long);
    let rows = compare(&mut store, &long, &sizes, "normal");
    let raw = raw_rusqlite(&path, &long, &sizes, false);
    print_rows("SqliteStore, synchronous=NORMAL", &rows, sizes.long);
    print_raw("raw rusqlite, synchronous=NORMAL", raw, &rows[0]);
    drop(store);

    let mut store = SqliteStore::open(&path).unwrap();
    let rows = compare(&mut store, &long, &sizes, "full");
    let raw = raw_rusqlite(&path, &long, &sizes, true);
    print_rows("SqliteStore, synchronous=FULL", &rows, sizes.long);
    print_raw("raw rusqlite, synchronous=FULL", raw, &rows[0]);

    println!();
    println!(
        "Recording the {} events one `handle` at a time (state cache on): MemoryStore {:.2} s, \
         SqliteStore (NORMAL) {:.2} s.",
        sizes.long,
        build.as_secs_f64(),
        sqlite_build.as_secs_f64()
    );
}

/// Records `events` events in `w` through `Engine::handle`, one call each; returns the time it took.
fn grow<S: Store>(store: &mut S, w: &WorkflowId, events: u64) -> Duration {
    let engine = Engine::new(Order);
    let start = Instant::now();
    for n in 0..events {
        engine.handle(store, w, item(n), NOW).unwrap();
    }
    start.elapsed()
}

struct Row {
    workflow: &'static str,
    cache: &'static str,
    wall: Duration,
    cpu: Duration,
}

/// The three sides on one store: new workflows, the long workflow with the cache, the long workflow
/// without it.
fn compare<S: Store>(store: &mut S, long: &WorkflowId, sizes: &Sizes, tag: &str) -> [Row; 3] {
    let cached = Engine::new(Order);
    let uncached = Engine::new(Order).state_cache(0);
    // The cached engine's first call on the long workflow replays it; that is not what is measured.
    cached.handle(store, long, item(0), NOW).unwrap();
    let mut new_n = 0u64;
    let (mut new_wall, mut long_wall, mut new_cpu, mut long_cpu) =
        (Vec::new(), Vec::new(), Duration::ZERO, Duration::ZERO);
    for _ in 0..sizes.rounds {
        let (wall, cpu) = timed(|| {
            for _ in 0..sizes.calls {
                new_n += 1;
                let w = WorkflowId::new(format!("order-{tag}-{new_n}")).unwrap();
                cached.handle(store, &w, item(new_n), NOW).unwrap();
            }
        });
        new_wall.push(wall);
        new_cpu += cpu;
        let (wall, cpu) = timed(|| {
            for n in 0..sizes.calls {
                cached.handle(store, long, item(n), NOW).unwrap();
            }
        });
        long_wall.push(wall);
        long_cpu += cpu;
    }
    let stats = cached.state_cache_stats();
    assert!(
        stats.hits >= sizes.calls * sizes.rounds as u64,
        "the long workflow was folded from its cached state: {stats:?}"
    );
    let (uncached_wall, uncached_cpu) = timed(|| {
        for n in 0..sizes.uncached_calls {
            uncached.handle(store, long, item(n), NOW).unwrap();
        }
    });
    let calls = sizes.calls * sizes.rounds as u64;
    [
        Row {
            workflow: "new",
            cache: "on",
            wall: median(new_wall) / sizes.calls as u32,
            cpu: new_cpu / calls as u32,
        },
        Row {
            workflow: "long",
            cache: "on",
            wall: median(long_wall) / sizes.calls as u32,
            cpu: long_cpu / calls as u32,
        },
        Row {
            workflow: "long",
            cache: "off (replays every call)",
            wall: uncached_wall / sizes.uncached_calls as u32,
            cpu: uncached_cpu / sizes.uncached_calls as u32,
        },
    ]
}

fn print_rows(store: &str, rows: &[Row; 3], long: u64) {
    for row in rows {
        let workflow = match row.workflow {
            "new" => "new".to_owned(),
            _ => format!("{long}+ events"),
        };
        println!(
            "| {store} | {workflow} | {} | {:.1} | {:.1} | {:.2}× | {:.2}× |",
            row.cache,
            micros(row.wall),
            micros(row.cpu),
            row.wall.as_secs_f64() / rows[0].wall.as_secs_f64(),
            row.cpu.as_secs_f64() / rows[0].cpu.as_secs_f64()
        );
    }
}

fn print_raw(name: &str, (wall, cpu): (Duration, Duration), new: &Row) {
    println!(
        "| {name} | long, state in a variable | — | {:.1} | {:.1} | {:.2}× | {:.2}× |",
        micros(wall),
        micros(cpu),
        wall.as_secs_f64() / new.wall.as_secs_f64(),
        cpu.as_secs_f64() / new.cpu.as_secs_f64()
    );
}

/// Hand-written: the state in a variable, the same rows written in one `BEGIN IMMEDIATE`
/// transaction after checking the workflow's last seq. Returns wall and CPU time per call.
fn raw_rusqlite(path: &Path, long: &WorkflowId, sizes: &Sizes, full: bool) -> (Duration, Duration) {
    let mut conn = Connection::open(path).unwrap();
    conn.busy_timeout(Duration::from_secs(10)).unwrap();
    let sync = if full { "FULL" } else { "NORMAL" };
    conn.execute_batch(&format!(
        "PRAGMA journal_mode = WAL; PRAGMA synchronous = {sync}; PRAGMA foreign_keys = ON;"
    ))
    .unwrap();
    let id = long.as_str();
    let mut last: i64 = conn
        .query_row(
            "SELECT COALESCE(MAX(seq), 0) FROM events WHERE workflow_id = ?1",
            [id],
            |r| r.get(0),
        )
        .unwrap();
    let mut cart = Cart::default();
    let now = NOW.as_millis() as i64;
    let mut walls = Vec::new();
    let mut cpu = Duration::ZERO;
    for _ in 0..sizes.rounds {
        let (wall, used) = timed(|| {
            for n in 0..sizes.calls {
                let event = item(n);
                let tx = conn
                    .transaction_with_behavior(TransactionBehavior::Immediate)
                    .unwrap();
                let actual: i64 = tx
                    .prepare_cached(
                        "SELECT COALESCE(MAX(seq), 0) FROM events WHERE workflow_id = ?1",
                    )
                    .unwrap()
                    .query_row([id], |r| r.get(0))
                    .unwrap();
                assert_eq!(actual, last);
                let seq = last + 1;
                let c0 = json!({ "sku": event.payload["sku"], "after": cart.items });
                let c1 = json!({ "total": cart.total, "previous": cart.last_sku });
                tx.prepare_cached(
                    "INSERT INTO events (workflow_id, seq, kind, payload, recorded_at) \
                     VALUES (?1, ?2, ?3, ?4, ?5)",
                )
                .unwrap()
                .execute(params![id, seq, event.kind, event.payload.to_string(), now])
                .unwrap();
                let mut insert = tx
                    .prepare_cached(
                        "INSERT INTO outbox (workflow_id, event_seq, idx, kind, payload, status, \
                         available_at, created_at) VALUES (?1, ?2, ?3, ?4, ?5, 'pending', ?6, ?6)",
                    )
                    .unwrap();
                insert
                    .execute(params![id, seq, 0, "reserve_stock", c0.to_string(), now])
                    .unwrap();
                insert
                    .execute(params![id, seq, 1, "check_price", c1.to_string(), now])
                    .unwrap();
                drop(insert);
                tx.commit().unwrap();
                cart.items += 1;
                cart.total += event.payload["price"].as_i64().unwrap_or(0);
                last = seq;
            }
        });
        walls.push(wall);
        cpu += used;
    }
    let calls = sizes.calls * sizes.rounds as u64;
    (median(walls) / sizes.calls as u32, cpu / calls as u32)
}

/// Wall and CPU time of `run`.
fn timed(run: impl FnOnce()) -> (Duration, Duration) {
    let (wall, cpu) = (Instant::now(), process_cpu());
    run();
    (wall.elapsed(), process_cpu().saturating_sub(cpu))
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}
