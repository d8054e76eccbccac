//! Appends per second into the native `MemoryStore`: one event with two commands per commit, each on a
//! new workflow — the native side of the JS package's benchmark (`scripts/bench-js` prints both).
//!
//! Run with `cargo bench --bench memory` (`-- --quick` for a short run). `cargo test` runs it once
//! with tiny sizes, as a smoke test.

use std::time::Instant;

use miniflow::prelude::*;
use miniflow::{json, Command, Commit, Decision, Event, MemoryStore, Seq, Timestamp, WorkflowId};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let commits = if !args.iter().any(|a| a == "--bench") {
        100
    } else if args.iter().any(|a| a == "--quick") {
        20_000
    } else {
        200_000
    };
    let mut best = f64::MAX;
    for _ in 0..5 {
        let mut store = MemoryStore::new();
        let start = Instant::now();
        for n in 0..commits {
            let id = WorkflowId::new(format!("trip-{n}")).unwrap();
            let event = Event::new("trip_requested", json!({ "city": "成都", "travellers": 2 }));
            let decision = Decision::new()
                .command(Command::new(
                    "lock_budget",
                    json!({ "trip_id": "t", "amount": 1200 }),
                ))
                .command(Command::new(
                    "book_flight",
                    json!({ "to": "成都", "class": "economy" }),
                ));
            let commit =
                Commit::new(id, Seq::ZERO, event, decision, Timestamp::from_millis(1)).unwrap();
            store.append_with_commands(&commit).unwrap();
        }
        best = best.min(start.elapsed().as_secs_f64());
        assert_eq!(store.pending(usize::MAX).unwrap().len(), 2 * commits);
    }
    println!(
        "| native MemoryStore (Rust) | {commits} | {:.0} |",
        commits as f64 / best
    );
}
