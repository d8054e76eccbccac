//! `PostgresStore` and `AsyncPostgresStore` on a real server, side by side with raw SQL doing the
//! same writes on the same server: commits (1 event + 2 commands per transaction) on 1 and 8
//! connections, and claim + complete with 1 and 4 workers, through the store's own `claim` +
//! `complete_all` and through `Dispatcher::postgres`; the async store's commits from 8 and 64 tasks
//! on a pool of 8 against tokio-postgres by hand (the one-statement commit, pipelined), and its
//! claim + complete from 4 and 16 handlers against the raw statements on tokio-postgres.
//!
//! The raw side is hand-written SQL for the same rows: per commit, one transaction with one `INSERT`
//! per table (the event guarded by the workflow's last seq, both commands in one statement), and the
//! same in one statement (a CTE, its own transaction); per batch, one claim statement (a CTE taking
//! the longest-due rows `FOR UPDATE SKIP LOCKED` + `UPDATE … RETURNING`) and one batched
//! acknowledgement. Every side uses prepared statements, opens its connections before the clock
//! starts, and runs in turn with the others, round after round, on a freshly truncated database of
//! its own.
//!
//! Run with `cargo bench --bench postgres --features postgres,tokio` (add `-- --quick` for a short
//! run, `-- commits`, `-- claims` or `-- async` for one workload).
//! It starts a throwaway cluster of its own (`initdb` into a temporary directory, as the `postgres`
//! user when run as root, on a free port of 127.0.0.1, `fsync` and `synchronous_commit` on), or uses
//! `MINIFLOW_BENCH_DATABASE_URL` (a role that may `CREATE DATABASE`; it creates and drops databases
//! `miniflow_bench_*`). Prints a markdown table: operations per second, the ratio to raw SQL, and the
//! CPU time per operation of this (client) process, from `getrusage`, and of the server's processes
//! (throwaway cluster only), so a noisy machine can be seen for what it is.
//! `cargo test --all-targets --all-features` runs it once with tiny sizes, as a smoke test.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, Command as Process, Stdio};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use miniflow::postgres::{Client, NoTls};
use miniflow::prelude::*;
use miniflow::tokio::AsyncPostgresStore;
use miniflow::{
    json, Ack, ClaimRequest, Command, Commit, Delivery, Dispatcher, Event, Outcome,
    PostgresDispatcher, PostgresOptions, PostgresStore, Seq, Timestamp, WorkflowId,
};

mod support;
use support::{decision, event, process_cpu};

const NOW: Timestamp = Timestamp::from_millis(1_700_000_000_000);
const BATCH: usize = 256;
const LEASE_TTL_MS: i64 = 30_000;

fn main() {
    // A thread that panics would leave the others waiting at a barrier: end the whole run instead
    // (the watchdog stops a throwaway cluster).
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        report(info);
        std::process::exit(101);
    }));
    let args: Vec<String> = std::env::args().collect();
    let sizes = if !args.iter().any(|a| a == "--bench") {
        Sizes {
            commits: 200,
            commands: 1_200,
            rounds: 1,
        }
    } else if args.iter().any(|a| a == "--quick") {
        Sizes {
            commits: 8_000,
            commands: 40_000,
            rounds: 2,
        }
    } else {
        Sizes {
            commits: 40_000,
            commands: 200_000,
            rounds: 5,
        }
    };
    // `commits` or `claims` runs that workload alone.
    let only = |workload: &str| {
        let chosen: Vec<&String> = args
            .iter()
            .skip(1)
            .filter(|a| !a.starts_with("--"))
            .collect();
        chosen.is_empty() || chosen.iter().any(|a| *a == workload)
    };
    let server = Server::start();
    let mut admin = server.admin();
    let version: String = admin
        .query_one("SHOW server_version", &[])
        .and_then(|row| row.try_get(0))
        .unwrap();
    let settings = [
        "fsync",
        "synchronous_commit",
        "shared_buffers",
        "max_wal_size",
    ]
    .map(|name| {
        let value: String = admin
            .query_one(&format!("SHOW {name}"), &[])
            .and_then(|row| row.try_get(0))
            .unwrap();
        format!("{name}={value}")
    })
    .join(", ");
    let mut results: Vec<Workload> = Vec::new();
    for connections in [1, 8].into_iter().filter(|_| only("commits")) {
        let n = sizes.commits.div_ceil(connections) * connections;
        let sides: [Side<'_>; 3] = [
            (
                "raw SQL: BEGIN, INSERT event, INSERT commands, COMMIT",
                &|url| raw_commits(&server, url, connections, n, false),
            ),
            ("raw SQL: one statement (a CTE)", &|url| {
                raw_commits(&server, url, connections, n, true)
            }),
            ("miniflow `append_with_commands`", &|url| {
                miniflow_commits(&server, url, connections, n)
            }),
        ];
        let name = format!("commit, {connections} connection{}", plural(connections));
        let runs = alternate(&server, &name, &sides, sizes.rounds, |_| {});
        results.push(Workload {
            name,
            unit: "commits",
            n,
            runs,
        });
    }
    for workers in [1, 4].into_iter().filter(|_| only("claims")) {
        let n = sizes.commands;
        let sides: [Side<'_>; 3] = [
            ("raw SQL: claim statement + ack statement", &|url| {
                raw_deliveries(&server, url, workers, n)
            }),
            ("miniflow `claim` + `complete_all` loop", &|url| {
                store_deliveries(&server, url, workers, n)
            }),
            ("miniflow `Dispatcher::postgres`", &|url| {
                miniflow_deliveries(&server, url, workers, n)
            }),
        ];
        let name = format!("claim + complete, {workers} worker{}", plural(workers));
        let runs = alternate(&server, &name, &sides, sizes.rounds, |url| seed(url, n));
        results.push(Workload {
            name,
            unit: "commands",
            n,
            runs,
        });
    }
    // The async API: commits from many tasks on a pool of 8, claim + complete from concurrent
    // handlers, each against tokio-postgres by hand; the synchronous store's commits beside them.
    const POOL: usize = 8;
    for tasks in [8, 64].into_iter().filter(|_| only("async")) {
        let n = sizes.commits.div_ceil(tasks) * tasks;
        let sides: [Side<'_>; 4] = [
            ("raw tokio-postgres: one statement, pipelined", &|url| {
                raw_async_commits(&server, url, tasks, POOL, n)
            }),
            ("miniflow async `append`", &|url| {
                async_commits(&server, url, tasks, POOL, n, true)
            }),
            ("miniflow async `append`, `notify(false)`", &|url| {
                async_commits(&server, url, tasks, POOL, n, false)
            }),
            ("miniflow sync `append_with_commands`, 8 threads", &|url| {
                miniflow_commits(&server, url, POOL, n)
            }),
        ];
        let name = format!("async commit, {tasks} tasks, {POOL} connections");
        let runs = alternate(&server, &name, &sides, sizes.rounds, |_| {});
        results.push(Workload {
            name,
            unit: "commits",
            n,
            runs,
        });
    }
    for handlers in [4, 16].into_iter().filter(|_| only("async")) {
        let n = sizes.commands;
        let sides: [Side<'_>; 2] = [
            (
                "raw tokio-postgres: claim statement + ack statement",
                &|url| raw_async_deliveries(&server, url, handlers, n),
            ),
            ("miniflow async `claim` + `complete_all` loop", &|url| {
                async_deliveries(&server, url, handlers, n)
            }),
        ];
        let name = format!("async claim + complete, {handlers} handlers");
        let runs = alternate(&server, &name, &sides, sizes.rounds, |url| seed(url, n));
        results.push(Workload {
            name,
            unit: "commands",
            n,
            runs,
        });
    }

    println!(
        "## PostgreSQL {version} ({settings}), median of {} round{}, sides in turn",
        sizes.rounds,
        plural(sizes.rounds)
    );
    println!();
    println!(
        "Commits: 1 event + 2 commands per transaction, one new workflow each, {} commits per run. \
         Claim + complete: batches of {BATCH}, a no-op handler, {} commands per run (1,000 per \
         workflow). `vs raw`: against the workload's first row. CPU: µs per operation (a commit, a \
         command) of this process (`getrusage`) and of the server's processes.",
        sizes.commits, sizes.commands
    );
    println!();
    println!("| workload | side | ops/s | vs raw | client CPU µs/op | server CPU µs/op |");
    println!("|---|---|---:|---:|---:|---:|");
    for Workload {
        name,
        unit,
        n,
        runs,
    } in &results
    {
        let reference = runs[0].1.rate(*n);
        for (side, run) in runs {
            println!(
                "| {name} | {side} | {:.0} {unit}/s | {:.2}× | {:.1} | {} |",
                run.rate(*n),
                run.rate(*n) / reference,
                run.client_cpu.as_secs_f64() * 1e6 / *n as f64,
                run.server_cpu.map_or("-".to_owned(), |cpu| format!(
                    "{:.1}",
                    cpu.as_secs_f64() * 1e6 / *n as f64
                )),
            );
        }
    }
    drop(admin);
    server.stop();
}

/// A side of a workload: its name, and what runs it on a database (by URL).
type Side<'a> = (&'static str, &'a dyn Fn(&str) -> Run);

/// One workload's median run of each side, the reference (raw SQL) first.
struct Workload {
    name: String,
    unit: &'static str,
    n: usize,
    runs: Vec<(&'static str, Run)>,
}

struct Sizes {
    commits: usize,
    commands: usize,
    rounds: usize,
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// What one run took: wall time, and CPU time of this process and of the server.
#[derive(Debug, Clone, Copy)]
struct Run {
    wall: Duration,
    client_cpu: Duration,
    server_cpu: Option<Duration>,
}

impl Run {
    fn rate(&self, n: usize) -> f64 {
        n as f64 / self.wall.as_secs_f64()
    }
}

/// Runs each side `rounds` times, each on a database of its own, emptied and prepared (`prepare`)
/// before every round, with the sides in a rotating order (so drift on a noisy machine hits all of
/// them alike); returns each side's median run (by wall time).
fn alternate(
    server: &Server,
    workload: &str,
    sides: &[Side<'_>],
    rounds: usize,
    prepare: impl Fn(&str),
) -> Vec<(&'static str, Run)> {
    let tag: String = workload
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .collect();
    let urls: Vec<String> = (0..sides.len())
        .map(|side| server.database(&format!("{tag}_{side}")))
        .collect();
    let mut runs: Vec<Vec<Run>> = vec![Vec::new(); sides.len()];
    for round in 0..rounds {
        for url in &urls {
            empty(url);
            prepare(url);
        }
        server.checkpoint();
        for k in 0..sides.len() {
            let side = (round + k) % sides.len();
            runs[side].push((sides[side].1)(&urls[side]));
        }
    }
    sides
        .iter()
        .zip(runs)
        .map(|((name, _), runs)| (*name, median(runs)))
        .collect()
}

fn median(mut runs: Vec<Run>) -> Run {
    runs.sort_by_key(|run| run.wall);
    runs[runs.len() / 2]
}

/// Wall clock and CPU time (of this process and of the server) since it started.
struct Stopwatch {
    wall: Instant,
    client: Duration,
    server: Option<Duration>,
}

impl Stopwatch {
    fn start(server: &Server) -> Self {
        Self {
            server: server.cpu(),
            client: process_cpu(),
            wall: Instant::now(),
        }
    }

    fn stop(self, server: &Server) -> Run {
        let wall = self.wall.elapsed();
        Run {
            wall,
            client_cpu: process_cpu().saturating_sub(self.client),
            server_cpu: match (self.server, server.cpu()) {
                (Some(before), Some(after)) => Some(after.saturating_sub(before)),
                _ => None,
            },
        }
    }
}

/// `n` commits through `PostgresStore::append_with_commands` on `connections` threads, one new
/// workflow each, with the store's default options (durable commits, NOTIFY on).
fn miniflow_commits(server: &Server, url: &str, connections: usize, n: usize) -> Run {
    let options = PostgresOptions::new().pool_size(connections as u32);
    let store = PostgresStore::connect_with(url, &options).unwrap();
    warm_pool(&store, connections);
    let ready = Arc::new(Barrier::new(connections + 1));
    // The scope joins the threads before it returns the stopwatch.
    let stopwatch = std::thread::scope(|scope| {
        for t in 0..connections {
            let mut store = store.clone();
            let ready = ready.clone();
            scope.spawn(move || {
                let commit = |store: &mut PostgresStore, id: String| {
                    let id = WorkflowId::new(id).unwrap();
                    let commit = Commit::new(id, Seq::ZERO, event(), decision(), NOW).unwrap();
                    store.append_with_commands(&commit).unwrap();
                };
                for w in 0..3 {
                    commit(&mut store, format!("warm-{t}-{w}"));
                }
                ready.wait();
                for i in 0..n / connections {
                    commit(&mut store, format!("trip-{t}-{i}"));
                }
            });
        }
        ready.wait();
        Stopwatch::start(server)
    });
    let run = stopwatch.stop(server);
    assert_eq!(count(url, "events"), (n + 3 * connections) as i64);
    run
}

/// Checks out `size` connections at once, so the pool holds them open before the clock starts.
fn warm_pool(store: &PostgresStore, size: usize) {
    let clients: Vec<_> = (0..size).map(|_| store.client().unwrap()).collect();
    drop(clients);
}

const RAW_EVENT: &str = "INSERT INTO events (workflow_id, seq, kind, payload, recorded_at) \
     SELECT $1, $2::bigint + 1, $3, $4, $5 \
     WHERE (SELECT COALESCE(MAX(seq), 0) FROM events WHERE workflow_id = $1) = $2::bigint";
const RAW_COMMANDS: &str =
    "INSERT INTO outbox (workflow_id, event_seq, idx, kind, payload, status, \
     available_at, created_at) VALUES ($1, $2, 0, $3, $4, 'pending', $7, $7), \
     ($1, $2, 1, $5, $6, 'pending', $7, $7)";
/// The event and both commands in one statement, so in a transaction of its own: one round trip.
const RAW_COMMIT: &str = "WITH e AS (\
         INSERT INTO events (workflow_id, seq, kind, payload, recorded_at) \
         SELECT $1, $2::bigint + 1, $3, $4, $5 \
         WHERE (SELECT COALESCE(MAX(seq), 0) FROM events WHERE workflow_id = $1) = $2::bigint \
         RETURNING seq) \
     INSERT INTO outbox (workflow_id, event_seq, idx, kind, payload, status, available_at, \
         created_at) \
     SELECT $1, e.seq, c.idx, c.kind, c.payload, 'pending', $5, $5 \
     FROM e, (VALUES (0::bigint, $6, $7), (1::bigint, $8, $9)) AS c (idx, kind, payload)";

/// The same rows as [`miniflow_commits`] through hand-written SQL: per commit one transaction,
/// the event inserted only when the workflow's last seq is the expected one, both commands in one
/// `INSERT` (or, `one_statement`, all of it in one statement).
fn raw_commits(
    server: &Server,
    url: &str,
    connections: usize,
    n: usize,
    one_statement: bool,
) -> Run {
    let ready = Arc::new(Barrier::new(connections + 1));
    let stopwatch = std::thread::scope(|scope| {
        for t in 0..connections {
            let ready = ready.clone();
            scope.spawn(move || {
                let mut client = Client::connect(url, NoTls).unwrap();
                let insert_event = client.prepare(RAW_EVENT).unwrap();
                let insert_commands = client.prepare(RAW_COMMANDS).unwrap();
                let insert_commit = client.prepare(RAW_COMMIT).unwrap();
                let now = NOW.as_millis() as i64;
                let mut commit = |id: String| {
                    let payload = serde_json::to_string(&event().payload).unwrap();
                    let c0 =
                        serde_json::to_string(&json!({ "trip_id": "t", "amount": 1200 })).unwrap();
                    let c1 = serde_json::to_string(&json!({ "to": "成都", "class": "economy" }))
                        .unwrap();
                    if one_statement {
                        let inserted = client
                            .execute(
                                &insert_commit,
                                &[
                                    &id,
                                    &0_i64,
                                    &"trip_requested",
                                    &payload,
                                    &now,
                                    &"lock_budget",
                                    &c0,
                                    &"book_flight",
                                    &c1,
                                ],
                            )
                            .unwrap();
                        assert_eq!(inserted, 2);
                        return;
                    }
                    let mut tx = client.transaction().unwrap();
                    let inserted = tx
                        .execute(
                            &insert_event,
                            &[&id, &0_i64, &"trip_requested", &payload, &now],
                        )
                        .unwrap();
                    assert_eq!(inserted, 1);
                    tx.execute(
                        &insert_commands,
                        &[&id, &1_i64, &"lock_budget", &c0, &"book_flight", &c1, &now],
                    )
                    .unwrap();
                    tx.commit().unwrap();
                };
                for w in 0..3 {
                    commit(format!("warm-{t}-{w}"));
                }
                ready.wait();
                for i in 0..n / connections {
                    commit(format!("trip-{t}-{i}"));
                }
            });
        }
        ready.wait();
        Stopwatch::start(server)
    });
    let run = stopwatch.stop(server);
    assert_eq!(count(url, "events"), (n + 3 * connections) as i64);
    run
}

/// `commands` pending commands, 1,000 per workflow (set-up, not timed), then `VACUUM ANALYZE`.
fn seed(url: &str, commands: usize) {
    let mut store = PostgresStore::connect(url).unwrap();
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
    let mut client = Client::connect(url, NoTls).unwrap();
    client
        .batch_execute("VACUUM ANALYZE events, outbox, timers")
        .unwrap();
}

/// `Dispatcher::postgres` with a no-op handler and `workers` workers, until nothing is left.
fn miniflow_deliveries(server: &Server, url: &str, workers: usize, commands: usize) -> Run {
    let options = PostgresOptions::new().pool_size(workers as u32 + 2);
    let store = PostgresStore::connect_with(url, &options).unwrap();
    warm_pool(&store, workers + 1);
    let dispatcher = Dispatcher::postgres(&store, |_: &Delivery| Outcome::Done)
        .unwrap()
        .workers(workers)
        .batch_size(BATCH)
        .ack_delay(Duration::from_secs(1));
    let stopwatch = Stopwatch::start(server);
    let stats = dispatcher.run_until_idle().unwrap();
    let run = stopwatch.stop(server);
    assert_eq!(stats.claimed, commands as u64);
    assert_eq!(stats.completed, commands as u64);
    assert!(store.pending(1).unwrap().is_empty());
    run
}

/// `workers` threads on one `PostgresStore`, each claiming a batch and acknowledging it with
/// `complete_all`, until a claim comes back empty: the store without the dispatcher around it.
fn store_deliveries(server: &Server, url: &str, workers: usize, commands: usize) -> Run {
    let options = PostgresOptions::new().pool_size(workers as u32);
    let store = PostgresStore::connect_with(url, &options).unwrap();
    warm_pool(&store, workers);
    let ready = Arc::new(Barrier::new(workers + 1));
    let stopwatch = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|w| {
                let mut store = store.clone();
                let ready = ready.clone();
                scope.spawn(move || {
                    let request = ClaimRequest::new(format!("store-{w}"))
                        .limit(BATCH)
                        .lease_ttl(Duration::from_millis(LEASE_TTL_MS as u64));
                    ready.wait();
                    let mut done = 0;
                    loop {
                        let batch = store.claim(&request, NOW).unwrap();
                        if batch.is_empty() {
                            return done;
                        }
                        let acks: Vec<Ack> = batch
                            .iter()
                            .map(|d| Ack {
                                command_id: d.command_id.clone(),
                                token: d.token,
                                result: None,
                            })
                            .collect();
                        let results = store.complete_all(acks, NOW).unwrap();
                        assert!(results.iter().all(Result::is_ok));
                        done += batch.len();
                    }
                })
            })
            .collect();
        ready.wait();
        let stopwatch = Stopwatch::start(server);
        let done: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
        assert_eq!(done, commands);
        stopwatch
    });
    stopwatch.stop(server)
}

/// Takes the longest-due claimable rows and leases them, in one statement.
const RAW_CLAIM: &str = "WITH due AS ( \
         SELECT workflow_id, event_seq, idx FROM outbox \
         WHERE processed_at IS NULL AND available_at <= $1 \
         ORDER BY available_at, workflow_id, event_seq, idx LIMIT $2 \
         FOR UPDATE SKIP LOCKED) \
     UPDATE outbox o SET status = 'leased', attempts = o.attempts + 1, available_at = $3, \
         lease_owner = $4, lease_expires_at = $3, lease_token = o.lease_token + 1 \
     FROM due WHERE o.workflow_id = due.workflow_id AND o.event_seq = due.event_seq \
         AND o.idx = due.idx \
     RETURNING o.workflow_id, o.event_seq, o.idx, o.lease_token, o.kind, o.payload, o.attempts";
/// Marks a batch done, each row only under the lease it was claimed with. (`(SELECT 'leased')`
/// keeps statistics gathered while nothing was leased from turning the key lookups into a scan of
/// the whole table, as miniflow's own acknowledgement does.)
const RAW_ACK: &str = "UPDATE outbox o SET status = 'done', processed_at = $5 \
     FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::bigint[]) \
         AS c (workflow_id, event_seq, idx, token) \
     WHERE o.workflow_id = c.workflow_id AND o.event_seq = c.event_seq AND o.idx = c.idx \
         AND o.status = (SELECT 'leased') AND o.lease_token = c.token";

/// `workers` threads, each claiming a batch in one statement and acknowledging it in another, until a
/// claim comes back empty.
fn raw_deliveries(server: &Server, url: &str, workers: usize, commands: usize) -> Run {
    let ready = Arc::new(Barrier::new(workers + 1));
    let stopwatch = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|w| {
                let ready = ready.clone();
                scope.spawn(move || {
                    let mut client = Client::connect(url, NoTls).unwrap();
                    let claim = client.prepare(RAW_CLAIM).unwrap();
                    let ack = client.prepare(RAW_ACK).unwrap();
                    let owner = format!("raw-{w}");
                    let now = NOW.as_millis() as i64;
                    ready.wait();
                    let mut done = 0;
                    loop {
                        let rows = client
                            .query(
                                &claim,
                                &[&now, &(BATCH as i64), &(now + LEASE_TTL_MS), &owner],
                            )
                            .unwrap();
                        if rows.is_empty() {
                            return done;
                        }
                        let (mut ws, mut ss, mut is, mut ts) =
                            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
                        for row in &rows {
                            let _kind: &str = row.get(4);
                            let _payload: serde_json::Value =
                                serde_json::from_str(row.get::<_, &str>(5)).unwrap();
                            ws.push(row.get::<_, String>(0));
                            ss.push(row.get::<_, i64>(1));
                            is.push(row.get::<_, i64>(2));
                            ts.push(row.get::<_, i64>(3));
                        }
                        let acked = client.execute(&ack, &[&ws, &ss, &is, &ts, &now]).unwrap();
                        assert_eq!(acked as usize, rows.len());
                        done += rows.len();
                    }
                })
            })
            .collect();
        ready.wait();
        let stopwatch = Stopwatch::start(server);
        let done: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
        assert_eq!(done, commands);
        stopwatch
    });
    stopwatch.stop(server)
}

/// Empties miniflow's tables (the databases are the benchmark's own).
fn empty(url: &str) {
    let mut client = Client::connect(url, NoTls).unwrap();
    client
        .batch_execute("TRUNCATE events, outbox, timers")
        .unwrap();
}

fn count(url: &str, table: &str) -> i64 {
    let mut client = Client::connect(url, NoTls).unwrap();
    client
        .query_one(&format!("SELECT count(*) FROM {table}"), &[])
        .and_then(|row| row.try_get(0))
        .unwrap()
}

/// The server: a throwaway cluster of the benchmark's own, or the one `MINIFLOW_BENCH_DATABASE_URL`
/// names.
struct Server {
    base: String,
    cluster: Option<Cluster>,
    databases: std::sync::Mutex<Vec<String>>,
}

/// A cluster in a temporary directory; a watchdog stops it and removes the directory when this
/// process ends, however it ends.
struct Cluster {
    dir: PathBuf,
    bin: PathBuf,
    root: bool,
    pid: u32,
    port: u16,
    _watchdog: ChildStdin,
}

impl Server {
    fn start() -> Self {
        if let Ok(url) = std::env::var("MINIFLOW_BENCH_DATABASE_URL") {
            if !url.trim().is_empty() {
                return Self {
                    base: url.trim().to_owned(),
                    cluster: None,
                    databases: Default::default(),
                };
            }
        }
        let cluster = Cluster::start();
        let port = cluster.port;
        Self {
            base: format!("postgresql://postgres@127.0.0.1:{port}/postgres"),
            cluster: Some(cluster),
            databases: Default::default(),
        }
    }

    fn admin(&self) -> Client {
        Client::connect(&self.base, NoTls).unwrap()
    }

    /// A new database of the benchmark's own, with miniflow's schema; its URL.
    fn database(&self, name: &str) -> String {
        let name = format!("miniflow_bench_{}_{name}", std::process::id());
        self.admin()
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .unwrap();
        self.databases.lock().unwrap().push(name.clone());
        let url = replace_database(&self.base, &name);
        drop(PostgresStore::connect(&url).unwrap()); // the schema, for both sides
        url
    }

    /// Flushes dirty buffers between runs, so no run pays for the one before it (best effort: an
    /// external server may not allow it).
    fn checkpoint(&self) {
        let _ = self.admin().batch_execute("CHECKPOINT");
    }

    /// The CPU time of the throwaway cluster's processes so far (none for an external server).
    fn cpu(&self) -> Option<Duration> {
        self.cluster.as_ref().map(Cluster::cpu)
    }

    fn stop(self) {
        let mut admin = self.admin();
        for name in self.databases.lock().unwrap().iter() {
            let _ = admin.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"));
        }
        drop(admin);
        if let Some(cluster) = self.cluster {
            cluster.stop();
        }
    }
}

impl Cluster {
    fn start() -> Self {
        let bin = postgres_bin_dir();
        let root = Process::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == "0");
        let parent = if root {
            PathBuf::from("/tmp")
        } else {
            std::env::temp_dir()
        };
        let stamp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        let dir = parent.join(format!("miniflow-bench-pg-{}-{stamp}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let watchdog = watchdog(&dir);
        if root {
            run(Process::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(&dir));
        }
        let data = dir.join("data");
        run(as_postgres(root, &bin.join("initdb"))
            .current_dir(&dir)
            .arg("-D")
            .arg(&data)
            .args(["-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync"]));
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .unwrap()
            .port();
        // Durable commits (miniflow refuses less); room for the runs' WAL between checkpoints.
        let options = format!(
            "-k {} -p {port} -c listen_addresses=127.0.0.1 -c fsync=on -c synchronous_commit=on \
             -c max_connections=100 -c shared_buffers=256MB -c max_wal_size=4GB \
             -c checkpoint_timeout=30min",
            dir.display()
        );
        run(as_postgres(root, &bin.join("pg_ctl"))
            .current_dir(&dir)
            .arg("-D")
            .arg(&data)
            .args(["-w", "-t", "60", "-l"])
            .arg(dir.join("server.log"))
            .args(["-o", &options, "start"]));
        let pid = std::fs::read_to_string(data.join("postmaster.pid"))
            .unwrap()
            .lines()
            .next()
            .and_then(|line| line.trim().parse().ok())
            .unwrap();
        Self {
            dir,
            bin,
            root,
            pid,
            port,
            _watchdog: watchdog,
        }
    }

    /// User + system CPU of the postmaster, of its live children (backends, WAL writer,
    /// checkpointer…) and of the children it already reaped.
    fn cpu(&self) -> Duration {
        let ticks = |fields: &[&str], at: &[usize]| -> u64 {
            at.iter()
                .map(|&i| {
                    fields
                        .get(i)
                        .and_then(|f| f.parse::<u64>().ok())
                        .unwrap_or(0)
                })
                .sum()
        };
        // Fields after the command name: state is field 0 here (field 3 in proc(5)).
        let stat = |pid: &str| -> Option<(u32, Vec<String>)> {
            let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let rest = text.rsplit_once(')')?.1;
            let fields: Vec<String> = rest.split_whitespace().map(str::to_owned).collect();
            let ppid = fields.get(1)?.parse().ok()?;
            Some((ppid, fields))
        };
        let mut total = 0;
        if let Some((_, fields)) = stat(&self.pid.to_string()) {
            let fields: Vec<&str> = fields.iter().map(String::as_str).collect();
            // utime, stime, cutime, cstime: proc(5) fields 14–17.
            total += ticks(&fields, &[11, 12, 13, 14]);
        }
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if !name.bytes().all(|b| b.is_ascii_digit()) {
                continue;
            }
            if let Some((ppid, fields)) = stat(&name) {
                if ppid == self.pid {
                    let fields: Vec<&str> = fields.iter().map(String::as_str).collect();
                    total += ticks(&fields, &[11, 12]);
                }
            }
        }
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
        Duration::from_micros(total * 1_000_000 / hz)
    }

    /// Stops the server (fast shutdown) and removes its directory.
    fn stop(self) {
        let _ = as_postgres(self.root, &self.bin.join("pg_ctl"))
            .current_dir(&self.dir)
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(["-w", "-m", "fast", "stop"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Where `initdb` and `pg_ctl` are: `MINIFLOW_PG_BIN_DIR`, `pg_config --bindir`, or the newest
/// `/usr/lib/postgresql/*/bin`.
fn postgres_bin_dir() -> PathBuf {
    let has_initdb = |dir: &Path| dir.join("initdb").is_file() && dir.join("pg_ctl").is_file();
    if let Ok(dir) = std::env::var("MINIFLOW_PG_BIN_DIR") {
        return PathBuf::from(dir);
    }
    if let Ok(out) = Process::new("pg_config").arg("--bindir").output() {
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if out.status.success() && has_initdb(&dir) {
            return dir;
        }
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_string_lossy().parse().ok()?;
            Some((version, entry.path().join("bin")))
        })
        .filter(|(_, dir)| has_initdb(dir))
        .collect();
    versions.sort();
    versions.pop().map(|(_, dir)| dir).unwrap_or_else(|| {
        panic!(
            "initdb not found: install PostgreSQL, set MINIFLOW_PG_BIN_DIR, or point \
             MINIFLOW_BENCH_DATABASE_URL at a server"
        )
    })
}

/// `program` run as the `postgres` user when run as root (PostgreSQL refuses root).
fn as_postgres(root: bool, program: &Path) -> Process {
    if root {
        let runuser = ["/usr/sbin/runuser", "/sbin/runuser", "/usr/bin/runuser"]
            .into_iter()
            .find(|path| Path::new(path).is_file())
            .unwrap_or("runuser");
        let mut command = Process::new(runuser);
        command.args(["-u", "postgres", "--"]).arg(program);
        command
    } else {
        Process::new(program)
    }
}

fn run(command: &mut Process) {
    let out = command.stdin(Stdio::null()).output().unwrap();
    assert!(
        out.status.success(),
        "{command:?} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The process that stops the cluster in `dir` and removes `dir` once this process is gone: it
/// blocks reading a pipe whose only writer is this process. It is never waited for: it is to
/// outlive this process.
#[allow(clippy::zombie_processes)]
fn watchdog(dir: &Path) -> ChildStdin {
    const SCRIPT: &str = r#"
trap '' INT TERM HUP QUIT
cat > /dev/null
pid=$(head -n 1 "$1/data/postmaster.pid" 2>/dev/null)
if [ -n "$pid" ]; then
  kill -INT "$pid" 2>/dev/null
  i=0
  while [ -f "$1/data/postmaster.pid" ] && kill -0 "$pid" 2>/dev/null && [ "$i" -lt 100 ]; do
    sleep 0.1
    i=$((i + 1))
  done
  kill -QUIT "$pid" 2>/dev/null
fi
rm -rf "$1"
"#;
    let mut child = Process::new("sh")
        .args(["-c", SCRIPT, "miniflow-bench-pg-watchdog"])
        .arg(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut pipe = child.stdin.take().unwrap();
    pipe.write_all(b"").unwrap();
    pipe
}

/// `base` with its database replaced by `database`, its parameters kept.
fn replace_database(base: &str, database: &str) -> String {
    let (address, query) = match base.split_once('?') {
        Some((address, query)) => (address, format!("?{query}")),
        None => (base, String::new()),
    };
    let authority_start = address.find("://").map_or(0, |i| i + 3);
    let host_end = address[authority_start..]
        .find('/')
        .map_or(address.len(), |i| authority_start + i);
    format!("{}/{database}{query}", &address[..host_end])
}

/// A tokio runtime for an async side: as many workers as the machine has cores.
fn tokio_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// `n` commits through `AsyncPostgresStore::append` from `tasks` tasks on a pool of
/// `connections`, one new workflow each, with the store's default options (`notify`: the wake-up
/// hints on, as by default, or off, to show what they cost).
fn async_commits(
    server: &Server,
    url: &str,
    tasks: usize,
    connections: usize,
    n: usize,
    notify: bool,
) -> Run {
    let runtime = tokio_runtime();
    let run = runtime.block_on(async {
        let options = PostgresOptions::new()
            .pool_size(connections as u32)
            .notify(notify);
        let store = AsyncPostgresStore::connect_with(url, &options)
            .await
            .unwrap();
        let commit = |store: AsyncPostgresStore, id: String| async move {
            let id = WorkflowId::new(id).unwrap();
            let commit = Commit::new(id, Seq::ZERO, event(), decision(), NOW).unwrap();
            store.append(&commit).await.unwrap();
        };
        // Every connection of the pool opened, and its statements prepared, before the clock.
        let warm: Vec<_> = (0..connections)
            .map(|c| tokio::spawn(commit(store.clone(), format!("warm-{c}"))))
            .collect();
        for task in warm {
            task.await.unwrap();
        }
        let stopwatch = Stopwatch::start(server);
        let running: Vec<_> = (0..tasks)
            .map(|t| {
                let store = store.clone();
                tokio::spawn(async move {
                    for i in 0..n / tasks {
                        commit(store.clone(), format!("trip-{t}-{i}")).await;
                    }
                })
            })
            .collect();
        for task in running {
            task.await.unwrap();
        }
        stopwatch.stop(server)
    });
    assert_eq!(count(url, "events"), (n + connections) as i64);
    run
}

/// The same rows as [`async_commits`] through tokio-postgres by hand, as a careful service would
/// write them: the one-statement commit ([`RAW_COMMIT`], prepared), `tasks` tasks sharing
/// `connections` clients, so the statements of tasks on one client are pipelined.
fn raw_async_commits(
    server: &Server,
    url: &str,
    tasks: usize,
    connections: usize,
    n: usize,
) -> Run {
    use miniflow::tokio::tokio_postgres;
    let runtime = tokio_runtime();
    let run = runtime.block_on(async {
        let mut clients = Vec::new();
        for _ in 0..connections {
            let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
                .await
                .unwrap();
            tokio::spawn(connection);
            let statement = client.prepare(RAW_COMMIT).await.unwrap();
            clients.push(Arc::new((client, statement)));
        }
        let commit = |shared: Arc<(tokio_postgres::Client, tokio_postgres::Statement)>,
                      id: String| async move {
            let payload = serde_json::to_string(&event().payload).unwrap();
            let c0 = serde_json::to_string(&json!({ "trip_id": "t", "amount": 1200 })).unwrap();
            let c1 = serde_json::to_string(&json!({ "to": "成都", "class": "economy" })).unwrap();
            let now = NOW.as_millis() as i64;
            let (client, statement) = &*shared;
            let inserted = client
                .execute(
                    statement,
                    &[
                        &id,
                        &0_i64,
                        &"trip_requested",
                        &payload,
                        &now,
                        &"lock_budget",
                        &c0,
                        &"book_flight",
                        &c1,
                    ],
                )
                .await
                .unwrap();
            assert_eq!(inserted, 2);
        };
        for (c, client) in clients.iter().enumerate() {
            commit(client.clone(), format!("warm-{c}")).await;
        }
        let stopwatch = Stopwatch::start(server);
        let running: Vec<_> = (0..tasks)
            .map(|t| {
                let client = clients[t % connections].clone();
                tokio::spawn(async move {
                    for i in 0..n / tasks {
                        commit(client.clone(), format!("trip-{t}-{i}")).await;
                    }
                })
            })
            .collect();
        for task in running {
            task.await.unwrap();
        }
        stopwatch.stop(server)
    });
    assert_eq!(count(url, "events"), (n + connections) as i64);
    run
}

/// `handlers` tasks on one `AsyncPostgresStore` (a pool of as many connections), each claiming a
/// batch and acknowledging it with `complete_all`, until a claim comes back empty.
fn async_deliveries(server: &Server, url: &str, handlers: usize, commands: usize) -> Run {
    let runtime = tokio_runtime();
    runtime.block_on(async {
        let options = PostgresOptions::new().pool_size(handlers as u32);
        let store = AsyncPostgresStore::connect_with(url, &options)
            .await
            .unwrap()
            .with_clock(Arc::new(miniflow::ManualClock::new(NOW)));
        // Every connection of the pool opened before the clock starts.
        let mut clients = Vec::new();
        for _ in 0..handlers {
            clients.push(store.client().await.unwrap());
        }
        drop(clients);
        let stopwatch = Stopwatch::start(server);
        let running: Vec<_> = (0..handlers)
            .map(|h| {
                let store = store.clone();
                tokio::spawn(async move {
                    let request = ClaimRequest::new(format!("async-{h}"))
                        .limit(BATCH)
                        .lease_ttl(Duration::from_millis(LEASE_TTL_MS as u64));
                    let mut done = 0;
                    loop {
                        let batch = store.claim(request.clone()).await.unwrap();
                        if batch.is_empty() {
                            return done;
                        }
                        let acks: Vec<Ack> = batch
                            .iter()
                            .map(|d| Ack {
                                command_id: d.command_id.clone(),
                                token: d.token,
                                result: None,
                            })
                            .collect();
                        let results = store.complete_all(acks).await.unwrap();
                        assert!(results.iter().all(Result::is_ok));
                        done += batch.len();
                    }
                })
            })
            .collect();
        let mut done = 0;
        for task in running {
            done += task.await.unwrap();
        }
        assert_eq!(done, commands);
        stopwatch.stop(server)
    })
}

/// [`RAW_CLAIM`] and [`RAW_ACK`] through tokio-postgres by hand: `handlers` tasks, each on a
/// client of its own, claiming a batch in one statement and acknowledging it in another.
fn raw_async_deliveries(server: &Server, url: &str, handlers: usize, commands: usize) -> Run {
    use miniflow::tokio::tokio_postgres;
    let runtime = tokio_runtime();
    runtime.block_on(async {
        let mut clients = Vec::new();
        for _ in 0..handlers {
            let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
                .await
                .unwrap();
            tokio::spawn(connection);
            let claim = client.prepare(RAW_CLAIM).await.unwrap();
            let ack = client.prepare(RAW_ACK).await.unwrap();
            clients.push((client, claim, ack));
        }
        let stopwatch = Stopwatch::start(server);
        let running: Vec<_> = clients
            .into_iter()
            .enumerate()
            .map(|(h, (client, claim, ack))| {
                tokio::spawn(async move {
                    let owner = format!("raw-{h}");
                    let now = NOW.as_millis() as i64;
                    let mut done = 0;
                    loop {
                        let rows = client
                            .query(
                                &claim,
                                &[&now, &(BATCH as i64), &(now + LEASE_TTL_MS), &owner],
                            )
                            .await
                            .unwrap();
                        if rows.is_empty() {
                            return done;
                        }
                        let (mut ws, mut ss, mut is, mut ts) =
                            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
                        for row in &rows {
                            let _kind: &str = row.get(4);
                            let _payload: serde_json::Value =
                                serde_json::from_str(row.get::<_, &str>(5)).unwrap();
                            ws.push(row.get::<_, String>(0));
                            ss.push(row.get::<_, i64>(1));
                            is.push(row.get::<_, i64>(2));
                            ts.push(row.get::<_, i64>(3));
                        }
                        let acked = client
                            .execute(&ack, &[&ws, &ss, &is, &ts, &now])
                            .await
                            .unwrap();
                        assert_eq!(acked as usize, rows.len());
                        done += rows.len();
                    }
                })
            })
            .collect();
        let mut done = 0;
        for task in running {
            done += task.await.unwrap();
        }
        assert_eq!(done, commands);
        stopwatch.stop(server)
    })
}
