//! Claim + complete throughput of the `Dispatcher` with a no-op handler, with 1, 2 and 4 workers on one
//! SQLite file (WAL, `synchronous=FULL`), beside raw rusqlite threads doing the same writes: claim a
//! batch in one `BEGIN IMMEDIATE` transaction, acknowledge it in another.
//!
//! Run with `cargo bench --bench delivery` (add `-- --quick` for a short run). Prints a table.
//! `cargo test` runs it once with tiny sizes, as a smoke test.

use std::path::Path;
use std::time::{Duration, Instant};

use miniflow::prelude::*;
use miniflow::{
    json, Command, Commit, Delivery, Dispatcher, Event, Outcome, Seq, SqliteStore, Timestamp,
    WorkflowId,
};
use rusqlite::{params, Connection, TransactionBehavior};

const BATCH: usize = 256;
const NOW: Timestamp = Timestamp::from_millis(1_700_000_000_000);

/// A store at `path` with `commands` pending commands, 1,000 per workflow.
fn seed(path: &Path, commands: usize) {
    let mut store = SqliteStore::open(path).unwrap();
    for w in 0..commands.div_ceil(1_000) {
        let decision: Vec<Command> = (0..1_000.min(commands - w * 1_000))
            .map(|n| Command::new("notify", json!({ "n": n, "to": "someone@example.com" })))
            .collect();
        let id = WorkflowId::new(format!("w-{w:04}")).unwrap();
        let commit = Commit::new(
            id,
            Seq::ZERO,
            Event::new("e", json!({})),
            decision.into(),
            NOW,
        )
        .unwrap();
        store.append_with_commands(&commit).unwrap();
    }
}

fn miniflow_run(path: &Path, workers: usize) -> Duration {
    let dispatcher = Dispatcher::sqlite(path, |_: &Delivery| Outcome::Done)
        .workers(workers)
        .batch_size(BATCH)
        .ack_delay(Duration::from_secs(1));
    let start = Instant::now();
    let stats = dispatcher.run_until_idle().unwrap();
    let took = start.elapsed();
    assert_eq!(stats.completed, stats.claimed);
    took
}

/// One raw worker: claim a batch (select + update each row), then ack it, each in its own transaction.
fn raw_worker(path: &Path, name: &str) {
    let mut conn = Connection::open(path).unwrap();
    conn.busy_timeout(Duration::from_secs(10)).unwrap();
    conn.execute_batch(
        "PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON; \
         PRAGMA cache_size = -16384;",
    )
    .unwrap();
    let now = NOW.as_millis() as i64;
    loop {
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .unwrap();
        let claimed: Vec<(String, i64, i64, i64)> = {
            let mut select = tx
                .prepare_cached(
                    "SELECT workflow_id, event_seq, idx, lease_token, kind, payload, attempts FROM outbox \
                     WHERE processed_at IS NULL AND available_at <= ?1 \
                     ORDER BY available_at, workflow_id, event_seq, idx LIMIT ?2",
                )
                .unwrap();
            let rows = select
                .query_map(params![now, BATCH as i64], |r| {
                    let _payload: String = r.get(5)?;
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get::<_, i64>(3)? + 1))
                })
                .unwrap()
                .collect::<Result<Vec<_>, _>>()
                .unwrap();
            let mut lease = tx
                .prepare_cached(
                    "UPDATE outbox SET status = 'leased', attempts = attempts + 1, available_at = ?4, \
                     lease_owner = ?5, lease_expires_at = ?4, lease_token = ?6 \
                     WHERE workflow_id = ?1 AND event_seq = ?2 AND idx = ?3",
                )
                .unwrap();
            for (w, s, i, token) in &rows {
                lease
                    .execute(params![w, s, i, now + 30_000, name, token])
                    .unwrap();
            }
            rows
        };
        tx.commit().unwrap();
        if claimed.is_empty() {
            return;
        }
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .unwrap();
        {
            let mut ack = tx
                .prepare_cached(
                    "UPDATE outbox SET status = 'done', processed_at = ?5 WHERE workflow_id = ?1 \
                     AND event_seq = ?2 AND idx = ?3 AND status = 'leased' AND lease_token = ?4",
                )
                .unwrap();
            for (w, s, i, token) in &claimed {
                assert_eq!(ack.execute(params![w, s, i, token, now]).unwrap(), 1);
            }
        }
        tx.commit().unwrap();
    }
}

fn raw_run(path: &Path, workers: usize) -> Duration {
    let start = Instant::now();
    std::thread::scope(|scope| {
        for n in 0..workers {
            scope.spawn(move || raw_worker(path, &format!("raw-{n}")));
        }
    });
    start.elapsed()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let commands = if !args.iter().any(|a| a == "--bench") {
        600
    } else if args.iter().any(|a| a == "--quick") {
        20_000
    } else {
        100_000
    };
    let dir =
        tempfile::tempdir_in(std::env::var("BENCH_DIR").unwrap_or_else(|_| ".".into())).unwrap();
    println!("## Claim + complete, no-op handler, batches of {BATCH}, WAL + synchronous=FULL ({commands} commands, best of 2 alternating runs)");
    println!();
    println!("| workers | raw rusqlite cmd/s | miniflow Dispatcher cmd/s | miniflow / raw |");
    println!("|---:|---:|---:|---:|");
    for workers in [1, 2, 4] {
        // Alternate the two sides and keep each one's best run, so drift on a noisy machine does not
        // decide the ratio.
        let (mut raw, mut ours) = (Duration::MAX, Duration::MAX);
        for round in 0..2 {
            let raw_path = dir.path().join(format!("raw-{workers}-{round}.db"));
            let ours_path = dir.path().join(format!("miniflow-{workers}-{round}.db"));
            seed(&raw_path, commands);
            seed(&ours_path, commands);
            raw = raw.min(raw_run(&raw_path, workers));
            ours = ours.min(miniflow_run(&ours_path, workers));
            assert!(SqliteStore::open(&ours_path)
                .unwrap()
                .pending(1)
                .unwrap()
                .is_empty());
        }
        let (raw_rate, our_rate) = (
            commands as f64 / raw.as_secs_f64(),
            commands as f64 / ours.as_secs_f64(),
        );
        println!(
            "| {workers} | {raw_rate:.0} | {our_rate:.0} | {:.2}× |",
            our_rate / raw_rate
        );
    }
}
