//! The SQLite host under load, each workload beside the best design written by hand with rusqlite:
//!
//! - `commits`: 32 producer threads, each commit durable when it returns (`append_with_commands`,
//!   grouped by the process's writer thread), against one raw thread writing 100 commits per
//!   transaction — the most a single writer gets from one fsync — and one writing 16, the group the
//!   writer can gather when 32 producers each wait for their own commit (while one half's group is
//!   synced, the other half's is written).
//! - `dispatch`: a `Dispatcher` with 4 workers and a no-op handler, against one raw thread running
//!   the best hand-written delivery loop: a rowid outbox, only the claim index maintained, the ack of
//!   one batch and the claim of the next in one transaction; and the same loop on miniflow's own
//!   schema, whose other indexes (a workflow's unfinished commands, dead letters, purges, and the
//!   claim order with priorities) a claim and an ack maintain too, and whose checks they pass — the
//!   part of the gap the schema costs.
//! - `e2e`: producers flat out, 2 commands per event (32 and 128 threads starting new workflows
//!   with `Engine::start`; 32 starting them with `Engine::handle`, which reads first; 32 with
//!   `Engine::handle` on 16 workflows each, in turn, committed on the engine's cached states), while
//!   a `Dispatcher` with 4 workers delivers: workflows committed and commands delivered per second,
//!   commit-to-delivery latency (from the producer's return to the handler's call), and the backlog.
//!
//! Every file is WAL with `synchronous=FULL`. Sides take turns, round after round, each on a fresh
//! file; the tables give the median round. CPU: µs of CPU time (user + system, all threads of this
//! process, `getrusage`) per operation, which tells a busy machine from a slow side. The writer's
//! mean group (requests per transaction) comes from its `miniflow_writer_group_size` histogram,
//! through a recorder that keeps that histogram alone.
//!
//! Run with `cargo bench --bench writer` (add `-- --quick` for a short run; `-- commits`,
//! `-- dispatch` or `-- e2e` for one workload; `BENCH_DIR=/some/disk` for where the files go).
//! `cargo test --benches` runs it once with tiny sizes, as a smoke test.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use miniflow::prelude::*;
use miniflow::{
    json, Command, Commit, Decision, Delivery, Dispatcher, Engine, Event, EventRecord, Outcome,
    Seq, SqliteStore, Timestamp, Workflow, WorkflowId,
};
use rusqlite::{params, Connection, TransactionBehavior};

mod support;
use support::{decision, event, process_cpu, thread_cpu};

const NOW: Timestamp = Timestamp::from_millis(1_700_000_000_000);
const PRODUCERS: usize = 32;
const WORKERS: usize = 4;
const RAW_COMMITS_PER_TRANSACTION: usize = 100;
/// The group the writer can gather from 32 producers that each wait for their own durable commit.
const RAW_COMMITS_PER_GROUP: usize = PRODUCERS / 2;
const LEASE_TTL_MS: i64 = 30_000;

struct Sizes {
    commits: usize,
    commands: usize,
    e2e: Duration,
    rounds: usize,
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let sizes = if !args.iter().any(|a| a == "--bench") {
        Sizes {
            commits: 320,
            commands: 2_000,
            e2e: Duration::from_millis(300),
            rounds: 1,
        }
    } else if args.iter().any(|a| a == "--quick") {
        Sizes {
            commits: 16_000,
            commands: 50_000,
            e2e: Duration::from_secs(3),
            rounds: 2,
        }
    } else {
        Sizes {
            commits: 64_000,
            commands: 200_000,
            e2e: Duration::from_secs(10),
            rounds: 3,
        }
    };
    let chosen: Vec<&String> = args
        .iter()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let only = |workload: &str| chosen.is_empty() || chosen.iter().any(|a| *a == workload);
    metrics::set_global_recorder(&GROUPS).expect("the only recorder of this process");
    let dir =
        tempfile::tempdir_in(std::env::var("BENCH_DIR").unwrap_or_else(|_| ".".into())).unwrap();
    let dir = dir.path();

    println!(
        "## SQLite host vs hand-written rusqlite (WAL, synchronous=FULL, median of {} round{})",
        sizes.rounds,
        if sizes.rounds == 1 { "" } else { "s" }
    );
    println!();
    println!(
        "| workload | side | ops/s | vs raw | µs/op (wall) | CPU µs/op | writer thread CPU µs/op | requests per transaction |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|");
    if only("commits") {
        let n = sizes.commits.div_ceil(PRODUCERS) * PRODUCERS;
        let sides: [Side<'_>; 3] = [
            (
                "raw rusqlite, 1 thread, 100 commits per transaction",
                &|path| raw_commits(path, n, RAW_COMMITS_PER_TRANSACTION),
            ),
            (
                "raw rusqlite, 1 thread, 16 commits per transaction (the writer's group)",
                &|path| raw_commits(path, n, RAW_COMMITS_PER_GROUP),
            ),
            (
                "miniflow `append_with_commands`, 32 threads, each durable on return",
                &|path| miniflow_commits(path, n),
            ),
        ];
        let runs = alternate(dir, "commits", &sides, sizes.rounds, |_, _| {});
        print_rows("commit (1 event + 2 commands)", "commits", n, &runs);
    }
    if only("dispatch") {
        let n = sizes.commands;
        for batch in [256, 1000] {
            let sides: [Side<'_>; 3] = [
                (
                    "raw rusqlite, 1 thread: rowid outbox, ack + next claim in one transaction",
                    &|path| raw_dispatch(path, n, batch, RAW_CLAIM),
                ),
                (
                    "the same raw loop on miniflow's own schema (every index it keeps)",
                    &|path| raw_dispatch(path, n, batch, RAW_CLAIM_ON_MINIFLOW),
                ),
                ("miniflow `Dispatcher`, 4 workers", &|path| {
                    miniflow_dispatch(path, n, batch)
                }),
            ];
            let runs = alternate(dir, "dispatch", &sides, sizes.rounds, |side, path| {
                if side == 0 {
                    seed_raw(path, n)
                } else {
                    seed_miniflow(path, n)
                }
            });
            let name = format!("claim + complete, no-op handler, batches of {batch}");
            print_rows(&name, "commands", n, &runs);
        }
    }
    if only("e2e") {
        for (producers, producing) in [
            (PRODUCERS, Producing::Start),
            (4 * PRODUCERS, Producing::Start),
            (PRODUCERS, Producing::HandleNew),
            (PRODUCERS, Producing::HandleOwn),
        ] {
            println!();
            end_to_end(dir, &sizes, producers, producing);
        }
    }
}

/// A side of a workload: its name, and what runs it on a file.
type Side<'a> = (&'static str, &'a dyn Fn(&Path) -> Run);

/// What one run took: wall time, and the CPU time of this process.
#[derive(Debug, Clone, Copy)]
struct Run {
    wall: Duration,
    cpu: Duration,
    /// The CPU time of the writer thread (miniflow's sides).
    writer: Option<Duration>,
    /// Requests (commits, claims, acks) per transaction: the writer's mean group on miniflow's
    /// sides, the commits a raw side writes in each.
    group: Option<f64>,
}

/// Runs each side `rounds` times, each on a fresh file prepared by `prepare(side, path)`, the sides
/// in a rotating order so that drift on a noisy machine hits them alike; returns each side's median.
fn alternate(
    dir: &Path,
    workload: &str,
    sides: &[Side<'_>],
    rounds: usize,
    prepare: impl Fn(usize, &Path),
) -> Vec<(&'static str, Run)> {
    let mut runs: Vec<Vec<Run>> = vec![Vec::new(); sides.len()];
    for round in 0..rounds {
        for k in 0..sides.len() {
            let side = (round + k) % sides.len();
            let path = dir.join(format!("{workload}-{side}-{round}-{}.db", unique()));
            prepare(side, &path);
            runs[side].push((sides[side].1)(&path));
        }
    }
    sides
        .iter()
        .zip(runs)
        .map(|((name, _), mut runs)| {
            runs.sort_by_key(|run| run.wall);
            (*name, runs[runs.len() / 2])
        })
        .collect()
}

fn unique() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::SeqCst)
}

fn print_rows(workload: &str, unit: &str, n: usize, runs: &[(&str, Run)]) {
    let rate = |run: &Run| n as f64 / run.wall.as_secs_f64();
    let reference = rate(&runs[0].1);
    for (side, run) in runs {
        let writer = run.writer.map_or_else(String::new, |writer| {
            format!("{:.2}", writer.as_secs_f64() * 1e6 / n as f64)
        });
        let group = run.group.map_or_else(String::new, |g| format!("{g:.1}"));
        println!(
            "| {workload} | {side} | {:.0} {unit}/s | {:.2}× | {:.2} | {:.2} | {writer} | {group} |",
            rate(run),
            rate(run) / reference,
            run.wall.as_secs_f64() * 1e6 / n as f64,
            run.cpu.as_secs_f64() * 1e6 / n as f64,
        );
    }
}

/// Wall clock and CPU time since it started, the writer thread's too.
struct Stopwatch {
    wall: Instant,
    cpu: Duration,
    writer: Duration,
}

/// The name of the writer thread the SQLite host runs for each file.
const WRITER_THREAD: &str = "miniflow-writer";

impl Stopwatch {
    fn start() -> Self {
        GROUPS.reset();
        Self {
            cpu: process_cpu(),
            writer: thread_cpu(WRITER_THREAD),
            wall: Instant::now(),
        }
    }

    fn stop(self) -> Run {
        Run {
            wall: self.wall.elapsed(),
            cpu: process_cpu().saturating_sub(self.cpu),
            writer: None,
            group: None,
        }
    }

    /// As `stop`, with the writer thread's CPU time (read while it still runs) and mean group.
    fn stop_with_writer(self) -> Run {
        let writer = thread_cpu(WRITER_THREAD).saturating_sub(self.writer);
        Run {
            writer: Some(writer),
            group: GROUPS.mean(),
            ..self.stop()
        }
    }
}

/// The recorder of this benchmark: it keeps the count and sum of the writer's group sizes, and
/// drops every other metric (a recorder that kept them all would slow the dispatcher it measures).
struct WriterGroups {
    count: AtomicU64,
    sum: AtomicU64,
}

static GROUPS: WriterGroups = WriterGroups {
    count: AtomicU64::new(0),
    sum: AtomicU64::new(0),
};

impl WriterGroups {
    fn reset(&self) {
        self.count.store(0, Ordering::SeqCst);
        self.sum.store(0, Ordering::SeqCst);
    }

    fn mean(&self) -> Option<f64> {
        let count = self.count.load(Ordering::SeqCst);
        (count > 0).then(|| self.sum.load(Ordering::SeqCst) as f64 / count as f64)
    }
}

/// The writer's histogram, recorded into [`GROUPS`].
struct GroupSizes;

impl metrics::HistogramFn for GroupSizes {
    fn record(&self, requests: f64) {
        GROUPS.count.fetch_add(1, Ordering::Relaxed);
        GROUPS.sum.fetch_add(requests as u64, Ordering::Relaxed);
    }
}

impl metrics::Recorder for WriterGroups {
    fn describe_counter(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_gauge(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_histogram(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn register_counter(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        metrics::Counter::noop()
    }
    fn register_gauge(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        metrics::Gauge::noop()
    }
    fn register_histogram(
        &self,
        key: &metrics::Key,
        _: &metrics::Metadata<'_>,
    ) -> metrics::Histogram {
        if key.name() == miniflow::telemetry::WRITER_GROUP_SIZE {
            metrics::Histogram::from_arc(std::sync::Arc::new(GroupSizes))
        } else {
            metrics::Histogram::noop()
        }
    }
}

/// The pragmas every miniflow connection sets.
fn raw_connection(path: &Path) -> Connection {
    let conn = Connection::open(path).unwrap();
    conn.busy_timeout(Duration::from_secs(10)).unwrap();
    conn.execute_batch(
        "PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON; \
         PRAGMA cache_size = -16384;",
    )
    .unwrap();
    conn
}

// Commits.

/// `n` commits of 1 event + 2 commands on miniflow's own schema, `per_transaction` in each, one
/// thread.
fn raw_commits(path: &Path, n: usize, per_transaction: usize) -> Run {
    drop(SqliteStore::open(path).unwrap()); // the same schema
    let mut conn = raw_connection(path);
    let payload = serde_json::to_string(&json!({ "city": "成都", "travellers": 2 })).unwrap();
    let c0 = serde_json::to_string(&json!({ "amount": 1200, "trip_id": "t" })).unwrap();
    let c1 = serde_json::to_string(&json!({ "class": "economy", "to": "成都" })).unwrap();
    let now = NOW.as_millis() as i64;
    let clock = Stopwatch::start();
    for chunk in (0..n).collect::<Vec<_>>().chunks(per_transaction) {
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .unwrap();
        for i in chunk {
            let id = format!("trip-{i}");
            let last: i64 = tx
                .prepare_cached("SELECT COALESCE(MAX(seq), 0) FROM events WHERE workflow_id = ?1")
                .unwrap()
                .query_row([&id], |r| r.get(0))
                .unwrap();
            assert_eq!(last, 0);
            tx.prepare_cached(
                "INSERT INTO events (workflow_id, seq, kind, payload, recorded_at) \
                 VALUES (?1, 1, 'trip_requested', ?2, ?3)",
            )
            .unwrap()
            .execute(params![id, payload, now])
            .unwrap();
            let mut insert = tx
                .prepare_cached(
                    "INSERT INTO outbox (workflow_id, event_seq, idx, kind, payload, status, \
                     available_at, created_at) VALUES (?1, 1, ?2, ?3, ?4, 'pending', ?5, ?5)",
                )
                .unwrap();
            insert
                .execute(params![id, 0, "lock_budget", c0, now])
                .unwrap();
            insert
                .execute(params![id, 1, "book_flight", c1, now])
                .unwrap();
        }
        tx.commit().unwrap();
    }
    Run {
        group: Some(per_transaction as f64),
        ..clock.stop()
    }
}

/// `n` commits from 32 threads, each with a store of its own (all sharing the process's writer),
/// each commit durable when `append_with_commands` returns.
fn miniflow_commits(path: &Path, n: usize) -> Run {
    let stores: Vec<SqliteStore> = (0..PRODUCERS)
        .map(|_| SqliteStore::open(path).unwrap())
        .collect();
    let start = Arc::new(Barrier::new(PRODUCERS + 1));
    let threads: Vec<_> = stores
        .into_iter()
        .enumerate()
        .map(|(p, mut store)| {
            let start = start.clone();
            std::thread::spawn(move || {
                start.wait();
                for i in (p..n).step_by(PRODUCERS) {
                    let id = WorkflowId::new(format!("trip-{i}")).unwrap();
                    let commit = Commit::new(id, Seq::ZERO, event(), decision(), NOW).unwrap();
                    store.append_with_commands(&commit).unwrap();
                }
                store // the writer thread runs as long as a store of its file is open
            })
        })
        .collect();
    let clock = Stopwatch::start();
    start.wait();
    let stores: Vec<SqliteStore> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let run = clock.stop_with_writer();
    drop(stores);
    run
}

// Dispatch.

fn commands_of(w: usize, n: usize) -> impl Iterator<Item = (usize, serde_json::Value)> {
    (0..1_000.min(n - w * 1_000)).map(|i| (i, json!({ "n": i, "to": "someone@example.com" })))
}

/// `n` pending commands through `SqliteStore`, 1,000 per workflow.
fn seed_miniflow(path: &Path, n: usize) {
    let mut store = SqliteStore::open(path).unwrap();
    for w in 0..n.div_ceil(1_000) {
        let commands: Vec<Command> = commands_of(w, n)
            .map(|(_, payload)| Command::new("notify", payload))
            .collect();
        let id = WorkflowId::new(format!("w-{w:04}")).unwrap();
        let commit = Commit::new(
            id,
            Seq::ZERO,
            Event::new("e", json!({})),
            commands.into(),
            NOW,
        );
        store.append_with_commands(&commit.unwrap()).unwrap();
    }
}

/// The hand-written design: miniflow's columns in a rowid table, the command ID unique, and one
/// partial index — the claim's, in claim order (due time, then command ID).
const RAW_SCHEMA: &str = "
    CREATE TABLE outbox (
        id INTEGER PRIMARY KEY,
        workflow_id TEXT NOT NULL, event_seq INTEGER NOT NULL, idx INTEGER NOT NULL,
        kind TEXT NOT NULL, payload TEXT NOT NULL, status TEXT NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0, last_error TEXT, available_at INTEGER NOT NULL,
        lease_owner TEXT, lease_expires_at INTEGER, lease_token INTEGER NOT NULL DEFAULT 0,
        created_at INTEGER NOT NULL, processed_at INTEGER,
        manual_retries INTEGER NOT NULL DEFAULT 0, resolution TEXT,
        report_result INTEGER NOT NULL DEFAULT 0, result TEXT,
        cancel_requested INTEGER NOT NULL DEFAULT 0,
        UNIQUE (workflow_id, event_seq, idx)
    );
    CREATE INDEX outbox_due ON outbox (available_at, workflow_id, event_seq, idx)
        WHERE processed_at IS NULL;";

fn seed_raw(path: &Path, n: usize) {
    let mut conn = raw_connection(path);
    conn.execute_batch(RAW_SCHEMA).unwrap();
    let now = NOW.as_millis() as i64;
    for w in 0..n.div_ceil(1_000) {
        let tx = conn.transaction().unwrap();
        for (i, payload) in commands_of(w, n) {
            tx.prepare_cached(
                "INSERT INTO outbox (workflow_id, event_seq, idx, kind, payload, status, \
                 available_at, created_at) VALUES (?1, 1, ?2, 'notify', ?3, 'pending', ?4, ?4)",
            )
            .unwrap()
            .execute(params![
                format!("w-{w:04}"),
                i as i64,
                payload.to_string(),
                now
            ])
            .unwrap();
        }
        tx.commit().unwrap();
    }
}

/// The raw loop's claim: the next due rows in claim order, through the claim index.
const RAW_CLAIM: &str = "SELECT id, workflow_id, event_seq, idx, kind, payload, attempts, \
     lease_token FROM outbox WHERE processed_at IS NULL AND available_at <= ?1 \
     ORDER BY available_at, workflow_id, event_seq, idx LIMIT ?2";
/// The same on miniflow's schema, whose claim index puts the priority first (all 0 here).
const RAW_CLAIM_ON_MINIFLOW: &str = "SELECT id, workflow_id, event_seq, idx, kind, payload, \
     attempts, lease_token FROM outbox \
     WHERE processed_at IS NULL AND priority = 0 AND available_at <= ?1 \
     ORDER BY available_at, workflow_id, event_seq, idx LIMIT ?2";

/// One thread: ack the last batch and claim the next in one transaction (with `claim_sql`), until
/// nothing is left.
fn raw_dispatch(path: &Path, n: usize, batch: usize, claim_sql: &str) -> Run {
    let mut conn = raw_connection(path);
    let now = NOW.as_millis() as i64;
    let mut acks: Vec<(i64, i64)> = Vec::new();
    let mut delivered = 0;
    let clock = Stopwatch::start();
    loop {
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .unwrap();
        {
            let mut ack = tx
                .prepare_cached(
                    "UPDATE outbox SET status = 'done', processed_at = ?3 \
                     WHERE id = ?1 AND status = 'leased' AND lease_token = ?2",
                )
                .unwrap();
            for (id, token) in &acks {
                assert_eq!(ack.execute(params![id, token, now]).unwrap(), 1);
            }
            let mut claim = tx.prepare_cached(claim_sql).unwrap();
            let claimed = claim
                .query_map(params![now, batch as i64], |r| {
                    // What a delivery hands the handler: the command ID, kind and payload.
                    let _id = format!(
                        "{}:{}:{}",
                        r.get_ref(1)?.as_str()?,
                        r.get::<_, i64>(2)?,
                        r.get::<_, i64>(3)?
                    );
                    let _kind: String = r.get(4)?;
                    let _payload: String = r.get(5)?;
                    Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(7)? + 1))
                })
                .unwrap()
                .collect::<Result<Vec<_>, _>>()
                .unwrap();
            let mut lease = tx
                .prepare_cached(
                    "UPDATE outbox SET status = 'leased', attempts = attempts + 1, \
                     available_at = ?2, lease_owner = 'raw', lease_expires_at = ?2, \
                     lease_token = ?3 WHERE id = ?1",
                )
                .unwrap();
            for (id, token) in &claimed {
                lease
                    .execute(params![id, now + LEASE_TTL_MS, token])
                    .unwrap();
            }
            acks = claimed;
        }
        tx.commit().unwrap();
        delivered += acks.len();
        if acks.is_empty() {
            break;
        }
    }
    let run = clock.stop();
    assert_eq!(delivered, n);
    run
}

fn miniflow_dispatch(path: &Path, n: usize, batch: usize) -> Run {
    let dispatcher = Dispatcher::sqlite(path, |_: &Delivery| Outcome::Done)
        .workers(WORKERS)
        .batch_size(batch)
        .ack_delay(Duration::from_secs(1));
    let keep_writer = SqliteStore::open(path).unwrap();
    let clock = Stopwatch::start();
    let stats = dispatcher.run_until_idle().unwrap();
    let run = clock.stop_with_writer();
    drop(keep_writer);
    assert_eq!(stats.completed as usize, n);
    run
}

// End to end.

/// Decides two commands for every event.
struct Trip;

impl Workflow for Trip {
    type State = ();
    fn evolve(&self, _: &mut (), _: &EventRecord) {}
    fn decide(&self, _: &(), event: &EventRecord) -> Decision {
        let n = &event.payload["n"];
        Decision::new()
            .command(Command::new(
                "lock_budget",
                json!({ "n": n, "amount": 1200 }),
            ))
            .command(Command::new("book_flight", json!({ "n": n, "to": "成都" })))
    }
}

/// When each workflow's commit returned to its producer (µs since the run began, 0 until then),
/// and what the handler saw.
struct Clocks {
    began: Instant,
    committed: Vec<AtomicU64>,
    latencies: Mutex<Vec<u32>>,
    delivered: AtomicU64,
}

impl Clocks {
    fn micros(&self) -> u64 {
        self.began.elapsed().as_micros() as u64
    }
}

/// What each producer of the end-to-end run commits.
#[derive(Debug, Clone, Copy)]
enum Producing {
    /// A new workflow per event, with `Engine::start` (no read).
    Start,
    /// A new workflow per event, with `Engine::handle` (which reads the workflow first).
    HandleNew,
    /// The next event of one of its own 16 workflows in turn, with `Engine::handle`: after the
    /// first events, the engine commits on its cached states without reading.
    HandleOwn,
}

/// Workflows per producer when producers handle events of their own workflows.
const OWN_WORKFLOWS: usize = 16;

/// Producers flat out, committing as `producing` says.
fn end_to_end(dir: &Path, sizes: &Sizes, producers: usize, producing: Producing) {
    let path = dir.join(format!("e2e-{producers}-{producing:?}.db"));
    drop(SqliteStore::open(&path).unwrap());
    let capacity = (sizes.e2e.as_secs_f64() * 200_000.0) as usize + 1_000;
    let clocks = Arc::new(Clocks {
        began: Instant::now(),
        committed: (0..capacity).map(|_| AtomicU64::new(0)).collect(),
        latencies: Mutex::new(Vec::with_capacity(capacity * 2)),
        delivered: AtomicU64::new(0),
    });
    let handler = {
        let clocks = clocks.clone();
        move |d: &Delivery| {
            let n = d.payload["n"].as_u64().unwrap_or_default() as usize;
            let committed = clocks.committed[n].load(Ordering::SeqCst);
            // 0: delivered before its producer even saw the commit return.
            let latency =
                clocks.micros().saturating_sub(committed.max(1)) * u64::from(committed > 0);
            clocks.latencies.lock().unwrap().push(latency as u32);
            clocks.delivered.fetch_add(1, Ordering::SeqCst);
            Outcome::Done
        }
    };
    let running = Dispatcher::sqlite(&path, handler)
        .workers(WORKERS)
        .batch_size(256)
        .start()
        .unwrap();
    let next = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let engine = Arc::new(Engine::new(Trip));
    let clock = Stopwatch::start();
    let threads: Vec<_> = (0..producers)
        .map(|p| {
            let (next, stop, engine, clocks) =
                (next.clone(), stop.clone(), engine.clone(), clocks.clone());
            let mut store = SqliteStore::open(&path).unwrap();
            std::thread::spawn(move || {
                let mut turn = 0;
                while !stop.load(Ordering::SeqCst) {
                    let n = next.fetch_add(1, Ordering::SeqCst) as usize;
                    if n >= clocks.committed.len() {
                        break;
                    }
                    let id = match producing {
                        Producing::HandleOwn => format!("trip-{p}-{}", turn % OWN_WORKFLOWS),
                        _ => format!("trip-{n}"),
                    };
                    turn += 1;
                    let id = WorkflowId::new(id).unwrap();
                    let event = Event::new("trip_requested", json!({ "n": n }));
                    let now = miniflow::Clock::now(&miniflow::SystemClock);
                    match producing {
                        Producing::Start => engine.start(&mut store, &id, event, now),
                        _ => engine.handle(&mut store, &id, event, now),
                    }
                    .unwrap();
                    clocks.committed[n].store(clocks.micros(), Ordering::SeqCst);
                }
            })
        })
        .collect();
    // The backlog (committed, not yet delivered), sampled every 100 ms.
    let committed_commands = || {
        2 * clocks
            .committed
            .iter()
            .take(next.load(Ordering::SeqCst) as usize)
            .filter(|c| c.load(Ordering::Relaxed) > 0)
            .count() as u64
    };
    let mut backlog = Vec::new();
    let until = Instant::now() + sizes.e2e;
    while Instant::now() < until {
        std::thread::sleep(Duration::from_millis(100));
        backlog.push(committed_commands().saturating_sub(clocks.delivered.load(Ordering::SeqCst)));
    }
    stop.store(true, Ordering::SeqCst);
    for thread in threads {
        thread.join().unwrap();
    }
    let run = clock.stop_with_writer();
    let workflows = committed_commands() / 2; // events: a workflow each but in `HandleOwn`
    let delivered_in_run = clocks.delivered.load(Ordering::SeqCst);
    // Drain what is left, then stop.
    let drained = Instant::now();
    while clocks.delivered.load(Ordering::SeqCst) < workflows * 2
        && drained.elapsed() < Duration::from_secs(60)
    {
        std::thread::sleep(Duration::from_millis(5));
    }
    let drain = drained.elapsed();
    let shutdown = running.shutdown(Duration::from_secs(10));
    assert!(shutdown.errors.is_empty(), "{:?}", shutdown.errors);
    let mut latencies = std::mem::take(&mut *clocks.latencies.lock().unwrap());
    latencies.sort_unstable();
    let pct = |p: f64| {
        latencies
            .get(((latencies.len() as f64 * p) as usize).min(latencies.len().saturating_sub(1)))
            .map_or(0.0, |us| f64::from(*us) / 1e3)
    };
    let secs = run.wall.as_secs_f64();
    let third = backlog.len() / 3;
    let tail_max = |from: usize| backlog[from..].iter().copied().max().unwrap_or(0);
    println!(
        "### End to end: {producers} producers flat out ({}, 2 commands per event) + \
         `Dispatcher` ({WORKERS} workers, batches of 256), {:.1} s",
        match producing {
            Producing::Start => "`Engine::start`, a new workflow each",
            Producing::HandleNew => "`Engine::handle`, a new workflow each",
            Producing::HandleOwn => "`Engine::handle`, each on its own 16 workflows in turn",
        },
        secs
    );
    println!();
    println!("| measure | value |");
    println!("|---|---:|");
    println!("| events committed/s | {:.0} |", workflows as f64 / secs);
    println!(
        "| commands delivered/s (during the run) | {:.0} |",
        delivered_in_run as f64 / secs
    );
    println!(
        "| commit → delivery latency p50 / p99 / max | {:.1} / {:.1} / {:.1} ms |",
        pct(0.50),
        pct(0.99),
        pct(1.0)
    );
    println!(
        "| backlog (commands) max in 1st / 2nd / 3rd third of the run | {} / {} / {} |",
        backlog[..third].iter().copied().max().unwrap_or(0),
        backlog[third..2 * third].iter().copied().max().unwrap_or(0),
        tail_max(2 * third)
    );
    println!(
        "| backlog left when producers stopped, drained in | {} commands, {:.0} ms |",
        backlog.last().copied().unwrap_or(0),
        drain.as_secs_f64() * 1e3
    );
    println!(
        "| CPU µs per event (commit + 2 deliveries) | {:.1} |",
        run.cpu.as_secs_f64() * 1e6 / workflows.max(1) as f64
    );
    let writer = run.writer.unwrap_or_default().as_secs_f64();
    println!(
        "| writer thread: CPU µs per event, busy | {:.1}, {:.0}% |",
        writer * 1e6 / workflows.max(1) as f64,
        100.0 * writer / secs
    );
    assert_eq!(
        shutdown.stats.completed,
        workflows * 2,
        "every command delivered once"
    );
}
