//! Commit throughput and `pending` latency of `SqliteStore`, side by side with raw rusqlite doing the
//! same writes with the same pragmas.
//!
//! Run with `cargo bench --bench append` (add `-- --quick` for a short run). Prints a table.
//! `cargo test` runs it once with tiny sizes, as a smoke test.

use std::time::{Duration, Instant};

use miniflow::prelude::*;
use miniflow::{
    json, Command, Commit, Decision, Engine, EventRecord, Seq, SqliteStore, Timestamp, Workflow,
    WorkflowId,
};
use rusqlite::{params, Connection, TransactionBehavior};

mod support;
use support::{decision, event};

const NOW: Timestamp = Timestamp::from_millis(1_700_000_000_000);

/// `commits` commits of one event and two commands through `SqliteStore`, one workflow each.
fn miniflow_appends(dir: &std::path::Path, round: usize, commits: usize) -> Duration {
    let mut store = SqliteStore::open(dir.join(format!("miniflow-{round}.db"))).unwrap();
    let start = Instant::now();
    for n in 0..commits {
        let id = WorkflowId::new(format!("trip-{n}")).unwrap();
        let commit = Commit::new(id, Seq::ZERO, event(), decision(), NOW).unwrap();
        store.append_with_commands(&commit).unwrap();
    }
    start.elapsed()
}

/// The same through the engine: load + replay + decide + commit.
fn engine_appends(dir: &std::path::Path, round: usize, commits: usize) -> Duration {
    struct Trip;
    impl Workflow for Trip {
        type State = ();
        fn evolve(&self, _: &mut (), _: &EventRecord) {}
        fn decide(&self, _: &(), _: &EventRecord) -> Decision {
            decision()
        }
    }
    let mut store = SqliteStore::open(dir.join(format!("engine-{round}.db"))).unwrap();
    let engine = Engine::new(Trip);
    let start = Instant::now();
    for n in 0..commits {
        let id = WorkflowId::new(format!("trip-{n}")).unwrap();
        engine.handle(&mut store, &id, event(), NOW).unwrap();
    }
    start.elapsed()
}

/// Raw rusqlite: the same schema (created by `SqliteStore`), pragmas, transaction and inserts.
fn raw_appends(dir: &std::path::Path, round: usize, commits: usize) -> Duration {
    let path = dir.join(format!("raw-{round}.db"));
    drop(SqliteStore::open(&path).unwrap()); // the same schema
    let mut conn = Connection::open(&path).unwrap();
    conn.busy_timeout(Duration::from_secs(10)).unwrap();
    conn.execute_batch(
        "PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON; \
         PRAGMA cache_size = -16384;",
    )
    .unwrap();
    let payload = serde_json::to_string(&json!({ "city": "成都", "travellers": 2 })).unwrap();
    let c0 = serde_json::to_string(&json!({ "trip_id": "t", "amount": 1200 })).unwrap();
    let c1 = serde_json::to_string(&json!({ "to": "成都", "class": "economy" })).unwrap();
    let now = NOW.as_millis() as i64;
    let start = Instant::now();
    for n in 0..commits {
        let id = format!("trip-{n}");
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .unwrap();
        let last: i64 = tx
            .prepare_cached("SELECT COALESCE(MAX(seq), 0) FROM events WHERE workflow_id = ?1")
            .unwrap()
            .query_row([&id], |r| r.get(0))
            .unwrap();
        assert_eq!(last, 0);
        tx.prepare_cached("INSERT INTO events (workflow_id, seq, kind, payload, recorded_at) VALUES (?1, 1, 'trip_requested', ?2, ?3)")
            .unwrap()
            .execute(params![id, payload, now])
            .unwrap();
        let mut insert = tx
            .prepare_cached("INSERT INTO outbox (workflow_id, event_seq, idx, kind, payload, status, available_at, created_at) VALUES (?1, 1, ?2, ?3, ?4, 'pending', ?5, ?5)")
            .unwrap();
        insert
            .execute(params![id, 0, "lock_budget", c0, now])
            .unwrap();
        insert
            .execute(params![id, 1, "book_flight", c1, now])
            .unwrap();
        drop(insert);
        tx.commit().unwrap();
    }
    start.elapsed()
}

/// A store with `pending` unfinished commands and `done` finished ones.
fn outbox_with(dir: &std::path::Path, pending: usize, done: usize) -> SqliteStore {
    let mut store = SqliteStore::open(dir.join(format!("pending-{pending}-{done}.db"))).unwrap();
    let batch = 1_000;
    for (prefix, count) in [("done", done), ("live", pending)] {
        for b in 0..count.div_ceil(batch) {
            let commands: Vec<Command> = (0..batch.min(count - b * batch))
                .map(|i| Command::new("notify", json!({ "n": i })))
                .collect();
            let id = WorkflowId::new(format!("{prefix}-{b:05}")).unwrap();
            let commit = Commit::new(id, Seq::ZERO, event(), commands.into(), NOW).unwrap();
            store.append_with_commands(&commit).unwrap();
        }
    }
    // Settle the old rows in bulk (set-up only; a worker settles them one lease at a time).
    store
        .connection()
        .execute(
            "UPDATE outbox SET status = 'done', processed_at = ?1 WHERE workflow_id LIKE 'done-%'",
            [NOW.as_millis() as i64],
        )
        .unwrap();
    assert_eq!(store.pending(usize::MAX).unwrap().len(), pending);
    store
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

/// Median time of `pending()` on each store, the calls interleaved so drift hits both alike.
fn time_pending(stores: [&SqliteStore; 2], runs: usize) -> [Duration; 2] {
    let mut samples = [Vec::new(), Vec::new()];
    for _ in 0..runs {
        for (store, samples) in stores.iter().zip(&mut samples) {
            let start = Instant::now();
            let rows = store.pending(usize::MAX).unwrap();
            samples.push(start.elapsed());
            assert_eq!(rows.len(), 1_000);
        }
    }
    samples.map(median)
}

fn rate(commits: usize, took: Duration) -> f64 {
    commits as f64 / took.as_secs_f64()
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let (commits, rounds, done) = if quick {
        (500, 1, 20_000)
    } else {
        (3_000, 3, 200_000)
    };
    let dir =
        tempfile::tempdir_in(std::env::var("BENCH_DIR").unwrap_or_else(|_| ".".into())).unwrap();

    let (mut raw, mut ours, mut engine) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        raw.push(raw_appends(dir.path(), round, commits));
        ours.push(miniflow_appends(dir.path(), round, commits));
        engine.push(engine_appends(dir.path(), round, commits));
    }
    let (raw, ours, engine) = (median(raw), median(ours), median(engine));
    println!("## Commits: 1 event + 2 commands per transaction, WAL, synchronous=FULL ({commits} commits, median of {rounds})");
    println!();
    println!("| writer | commits/s | µs/commit | vs raw |");
    println!("|---|---:|---:|---:|");
    for (name, took) in [
        ("raw rusqlite", raw),
        ("SqliteStore::append_with_commands", ours),
        ("Engine::handle (load+replay+decide+commit)", engine),
    ] {
        println!(
            "| {name} | {:.0} | {:.1} | {:.2}× |",
            rate(commits, took),
            took.as_secs_f64() * 1e6 / commits as f64,
            rate(commits, took) / rate(commits, raw)
        );
    }

    let empty = outbox_with(dir.path(), 1_000, 0);
    let full = outbox_with(dir.path(), 1_000, done);
    let [t_empty, t_full] = time_pending([&empty, &full], 301);
    println!();
    println!("## `pending()` returning 1,000 rows (median of 301 interleaved calls)");
    println!();
    println!("| outbox | time | vs no done rows |");
    println!("|---|---:|---:|");
    println!(
        "| 1,000 pending, 0 done | {:.3} ms | 1.00× |",
        t_empty.as_secs_f64() * 1e3
    );
    println!(
        "| 1,000 pending, {done} done | {:.3} ms | {:.2}× |",
        t_full.as_secs_f64() * 1e3,
        t_full.as_secs_f64() / t_empty.as_secs_f64()
    );
}
