//! The native `MemoryStore` doing the JS package's benchmark workloads — the native side of
//! `scripts/bench-js`, which prints it beside the wasm store in Node and a plain-JS store:
//!
//! - `append`: commits of one event with two commands, each on a new workflow;
//! - `drain`: a backlog of 100,000 commands claimed in batches of 100 and completed one by one;
//! - `drain-strict`: the same in strict per-workflow order;
//! - `claim`: claims of 100 from a backlog of 50,000;
//! - `memory`: the resident memory a store of 100,000 workflows (1 event + 2 commands each) holds.
//!
//! Run with `cargo bench --bench memory` for a table, `-- --json [workload]` for the JSON lines
//! `scripts/bench-js` reads, `-- --quick` for smaller sizes. `cargo test` runs it once with tiny sizes,
//! as a smoke test.

use std::time::{Duration, Instant};

use miniflow::prelude::*;
use miniflow::{ClaimOrder, ClaimRequest, Commit, MemoryStore, Seq, Timestamp, WorkflowId};

mod support;
use support::{decision, event, process_cpu as cpu_time};

const NOW: Timestamp = Timestamp::from_millis(1);

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let flag = |name: &str| args.iter().any(|a| a == name);
    // Sizes: commits, backlog commands, claim backlog, workflows held.
    let sizes = if !flag("--bench") {
        [100, 400, 200, 100]
    } else if flag("--quick") {
        [20_000, 20_000, 50_000, 20_000]
    } else {
        [200_000, 100_000, 50_000, 100_000]
    };
    let json = flag("--json");
    let only = args
        .iter()
        .skip(1)
        .find(|a| !a.starts_with("--"))
        .map(String::as_str);
    if !json {
        println!("| workload | ops | ops/s | CPU µs/op |");
        println!("|---|---:|---:|---:|");
    }
    // First, while the process has freed nothing it could reuse.
    if only.is_none_or(|o| o == "memory") {
        let workflows = sizes[3];
        let bytes = memory(workflows);
        if json {
            println!(
                r#"{{"workload":"memory","side":"native","workflows":{workflows},"bytes":{bytes}}}"#
            );
        } else {
            println!(
                "| memory of {workflows} workflows | | {:.1} MB | |",
                bytes as f64 / 1e6
            );
        }
    }
    type Make = fn(usize) -> Workload;
    let workloads: [(&str, usize, Make); 4] = [
        ("append", sizes[0], append),
        ("drain", sizes[1], |n| drain(n, ClaimOrder::DueFirst)),
        ("drain-strict", sizes[1], |n| {
            drain(n, ClaimOrder::StrictPerWorkflow)
        }),
        ("claim", sizes[2], claim),
    ];
    for (name, size, make) in workloads {
        if only.is_some_and(|o| o != name) {
            continue;
        }
        let (ops, per_second, cpu) = measure(make(size));
        if json {
            println!(
                r#"{{"workload":"{name}","side":"native","ops":{ops},"perSecond":{per_second},"cpuMicrosPerOp":{cpu}}}"#
            );
        } else {
            println!("| {name} | {ops} | {per_second:.0} | {cpu:.2} |");
        }
    }
}

/// A workload: `before` builds what it needs and `after` checks the outcome (both untimed); `timed`
/// does `ops` operations.
struct Workload {
    ops: usize,
    before: Box<dyn FnMut() -> MemoryStore>,
    timed: Box<dyn FnMut(&mut MemoryStore)>,
    after: Box<dyn FnMut(&MemoryStore)>,
}

fn fill(store: &mut MemoryStore, workflows: usize) {
    for n in 0..workflows {
        let id = WorkflowId::new(format!("trip-{n}")).unwrap();
        let commit = Commit::new(id, Seq::ZERO, event(), decision(), NOW).unwrap();
        store.append_with_commands(&commit).unwrap();
    }
}

fn append(commits: usize) -> Workload {
    Workload {
        ops: commits,
        before: Box::new(MemoryStore::new),
        timed: Box::new(move |store| fill(store, commits)),
        after: Box::new(move |store| {
            assert_eq!(store.pending(usize::MAX).unwrap().len(), 2 * commits);
        }),
    }
}

fn drain(commands: usize, order: ClaimOrder) -> Workload {
    let request = ClaimRequest::new("w1")
        .limit(100)
        .lease_ttl(Duration::from_secs(30))
        .order(order);
    Workload {
        ops: commands,
        before: Box::new(move || {
            let mut store = MemoryStore::new();
            fill(&mut store, commands / 2);
            store
        }),
        timed: Box::new(move |store| {
            let mut done = 0;
            loop {
                let batch = store.claim(&request, NOW).unwrap();
                if batch.is_empty() {
                    break;
                }
                for delivery in &batch {
                    store
                        .complete(&delivery.command_id, delivery.token, None, NOW)
                        .unwrap();
                }
                done += batch.len();
            }
            assert_eq!(done, commands);
        }),
        after: Box::new(|store| assert!(store.pending(1).unwrap().is_empty())),
    }
}

fn claim(backlog: usize) -> Workload {
    let claims = 50.min(backlog / 100);
    let request = ClaimRequest::new("w1")
        .limit(100)
        .lease_ttl(Duration::from_secs(30));
    Workload {
        ops: claims,
        before: Box::new(move || {
            let mut store = MemoryStore::new();
            fill(&mut store, backlog / 2);
            store
        }),
        timed: Box::new(move |store| {
            for _ in 0..claims {
                assert_eq!(store.claim(&request, NOW).unwrap().len(), 100);
            }
        }),
        after: Box::new(|_| {}),
    }
}

/// Operations, operations per second and CPU µs per operation of the best of 5 rounds.
fn measure(mut workload: Workload) -> (usize, f64, f64) {
    let mut best = (f64::MAX, 0.0);
    for _ in 0..5 {
        let mut store = (workload.before)();
        let (start, cpu) = (Instant::now(), cpu_time());
        (workload.timed)(&mut store);
        let (seconds, cpu) = (start.elapsed().as_secs_f64(), cpu_time() - cpu);
        (workload.after)(&store);
        if seconds < best.0 {
            best = (seconds, cpu.as_secs_f64());
        }
    }
    let ops = workload.ops as f64;
    (workload.ops, ops / best.0, best.1 * 1e6 / ops)
}

/// The growth of this process's resident memory while a store of `workflows` workflows is built
/// (Linux: `/proc/self/statm`; 0 elsewhere).
fn memory(workflows: usize) -> u64 {
    let resident = || -> u64 {
        let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
        let pages: u64 = statm
            .split_whitespace()
            .nth(1)
            .and_then(|p| p.parse().ok())
            .unwrap_or(0);
        pages * 4096
    };
    let before = resident();
    let mut store = MemoryStore::new();
    fill(&mut store, workflows);
    let bytes = resident().saturating_sub(before);
    assert_eq!(store.pending(1).unwrap().len(), 1);
    bytes
}
