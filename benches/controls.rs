//! The operators' controls on `SqliteStore`: what a claim costs when a paused kind, or a limited kind
//! with no slot left, has a backlog of due commands ahead of the ones the claim may take, and when
//! priorities put the work to take behind an older backlog; and what `stats` costs on an outbox full
//! of done rows. Side by side with hand-written rusqlite on the same file layout, which knows the kind
//! to skip without reading any control.
//!
//! Run with `cargo bench --bench controls` (add `-- --quick` for a short run). Prints tables: wall
//! time and CPU time (`getrusage`, user + system) per operation, medians of alternating runs.
//! `cargo test --all-targets` runs it once with tiny sizes, as a smoke test.

use std::path::Path;
use std::time::{Duration, Instant};

use miniflow::prelude::*;
use miniflow::{
    json, Ack, ClaimRequest, Command, Commit, Decision, Event, KindChange, Seq, SqliteOptions,
    SqliteStore, Synchronous, Timestamp, WorkflowId,
};
use rusqlite::{params, Connection, TransactionBehavior};

mod support;
use support::process_cpu;

const NOW: Timestamp = Timestamp::from_millis(1_700_000_000_000);
/// Commands per claim.
const BATCH: usize = 32;
const TTL: Duration = Duration::from_secs(60);

struct Sizes {
    backlog: usize,
    done: usize,
    claims: usize,
    rounds: usize,
}

/// What stands in the way of the claims.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Scenario {
    /// No backlog, no control: the baseline.
    Plain,
    /// A backlog of `mail`, due before the work, and `mail` paused.
    Paused,
    /// A backlog of `mail`, due before the work, and `mail` limited to 2 with 2 leased.
    Full,
    /// A backlog of `mail` at priority 0, due before the work at priority 1; no control.
    Priority,
}

impl Scenario {
    fn name(self) -> &'static str {
        match self {
            Scenario::Plain => "no backlog, no control",
            Scenario::Paused => "backlog of a paused kind ahead",
            Scenario::Full => "backlog of a limited kind with no slot ahead",
            Scenario::Priority => "older backlog of a lower priority",
        }
    }
}

fn options() -> SqliteOptions {
    SqliteOptions {
        synchronous: Synchronous::Normal,
        ..SqliteOptions::default()
    }
}

/// Commits `count` commands of `kind` at `priority`, due at `at`, 1,000 per workflow.
fn commit(
    store: &mut SqliteStore,
    prefix: &str,
    kind: &str,
    priority: i32,
    count: usize,
    at: Timestamp,
) {
    for b in 0..count.div_ceil(1_000) {
        let decision: Decision = (0..1_000.min(count - b * 1_000))
            .map(|i| Command::new(kind, json!({ "n": i })).priority(priority))
            .collect::<Vec<_>>()
            .into();
        let id = WorkflowId::new(format!("{prefix}-{b:05}")).unwrap();
        let commit = Commit::new(id, Seq::ZERO, Event::new("e", json!({})), decision, at).unwrap();
        store.append_with_commands(&commit).unwrap();
    }
}

/// A store with `done` done rows, the scenario's backlog, and `claims × BATCH` due `book` commands.
fn seed(path: &Path, scenario: Scenario, sizes: &Sizes) -> SqliteStore {
    let mut store = SqliteStore::open_with(path, &options()).unwrap();
    let earlier = Timestamp::from_millis(NOW.as_millis() - 1_000);
    commit(&mut store, "done", "notify", 0, sizes.done, earlier);
    // Settle the old rows in bulk (set-up only).
    store
        .connection()
        .execute(
            "UPDATE outbox SET status = 'done', processed_at = ?1 WHERE workflow_id LIKE 'done-%'",
            [earlier.as_millis() as i64],
        )
        .unwrap();
    if scenario != Scenario::Plain {
        commit(&mut store, "mail", "mail", 0, sizes.backlog, earlier);
    }
    let work = if scenario == Scenario::Priority { 1 } else { 0 };
    commit(&mut store, "work", "book", work, sizes.claims * BATCH, NOW);
    match scenario {
        Scenario::Paused => {
            store
                .control_kind("mail", KindChange::Pause, "bench", NOW)
                .unwrap();
        }
        Scenario::Full => {
            let take = ClaimRequest::new("holder")
                .limit(2)
                .lease_ttl(Duration::from_secs(3_600));
            assert_eq!(store.claim(&take, NOW).unwrap().len(), 2);
            store
                .control_kind("mail", KindChange::Limit(2), "bench", NOW)
                .unwrap();
        }
        Scenario::Plain | Scenario::Priority => {}
    }
    store
}

/// Wall and CPU time of the claims (the acks between them not counted).
#[derive(Clone, Copy, Default)]
struct Spent {
    wall: Duration,
    cpu: Duration,
}

fn miniflow_claims(store: &mut SqliteStore, claims: usize) -> Spent {
    let request = ClaimRequest::new("bench").limit(BATCH).lease_ttl(TTL);
    let mut spent = Spent::default();
    for _ in 0..claims {
        let (wall, cpu) = (Instant::now(), process_cpu());
        let batch = store.claim(&request, NOW).unwrap();
        spent.wall += wall.elapsed();
        spent.cpu += process_cpu().saturating_sub(cpu);
        assert_eq!(batch.len(), BATCH);
        assert!(batch.iter().all(|d| d.kind == "book"));
        let acks: Vec<Ack> = batch
            .iter()
            .map(|d| Ack::new(d.command_id.clone(), d.token))
            .collect();
        store.complete_all(acks, NOW).unwrap();
    }
    spent
}

/// The same claims by hand: one `BEGIN IMMEDIATE`, the due candidates in claim order with the kind
/// to skip written into the query (their keys from a covering index, then the rows; for a limited
/// kind, its leases counted first), one `UPDATE` per lease; the acks one `UPDATE` each in one
/// transaction.
fn raw_claims(path: &Path, scenario: Scenario, claims: usize) -> Spent {
    let mut conn = Connection::open(path).unwrap();
    conn.execute_batch("PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL;")
        .unwrap();
    let select = match scenario {
        Scenario::Priority => {
            "SELECT workflow_id, event_seq, idx, lease_token FROM outbox \
             WHERE processed_at IS NULL AND available_at <= ?1 \
             ORDER BY priority DESC, available_at, workflow_id, event_seq, idx LIMIT ?2"
        }
        // The keys from the covering `outbox_claim` first (one priority: all are 0), then the rows:
        // the walk past the skipped kind stays in the index.
        _ => {
            "SELECT o.workflow_id, o.event_seq, o.idx, o.lease_token FROM \
             (SELECT workflow_id, event_seq, idx FROM outbox \
              WHERE processed_at IS NULL AND priority = 0 AND available_at <= ?1 \
              AND kind <> 'mail' \
              ORDER BY available_at, workflow_id, event_seq, idx LIMIT ?2) k \
             JOIN outbox o USING (workflow_id, event_seq, idx)"
        }
    };
    let now = NOW.as_millis() as i64;
    let expires = (NOW + TTL).as_millis() as i64;
    let mut spent = Spent::default();
    for _ in 0..claims {
        let (wall, cpu) = (Instant::now(), process_cpu());
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .unwrap();
        if scenario == Scenario::Full {
            let leased: i64 = tx
                .prepare_cached(
                    "SELECT count(*) FROM outbox WHERE status = 'leased' AND lease_counted = 1 \
                     AND kind = 'mail' AND available_at > ?1",
                )
                .unwrap()
                .query_row([now], |row| row.get(0))
                .unwrap();
            assert_eq!(leased, 2);
        }
        let rows: Vec<(String, i64, i64, i64)> = tx
            .prepare_cached(select)
            .unwrap()
            .query_map(params![now, BATCH as i64], |row| {
                Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?))
            })
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        for (w, s, i, token) in &rows {
            tx.prepare_cached(
                "UPDATE outbox SET status = 'leased', attempts = attempts + 1, available_at = ?4, \
                 lease_owner = 'raw', lease_expires_at = ?4, lease_token = ?5 \
                 WHERE workflow_id = ?1 AND event_seq = ?2 AND idx = ?3",
            )
            .unwrap()
            .execute(params![w, s, i, expires, token + 1])
            .unwrap();
        }
        tx.commit().unwrap();
        spent.wall += wall.elapsed();
        spent.cpu += process_cpu().saturating_sub(cpu);
        assert_eq!(rows.len(), BATCH);
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .unwrap();
        for (w, s, i, token) in &rows {
            tx.prepare_cached(
                "UPDATE outbox SET status = 'done', processed_at = ?4 \
                 WHERE workflow_id = ?1 AND event_seq = ?2 AND idx = ?3 AND lease_token = ?5",
            )
            .unwrap()
            .execute(params![w, s, i, now, token + 1])
            .unwrap();
        }
        tx.commit().unwrap();
    }
    spent
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn us(d: Duration, n: usize) -> f64 {
    d.as_secs_f64() * 1e6 / n as f64
}

fn claims_table(dir: &Path, sizes: &Sizes) {
    println!(
        "## Claims of {BATCH} among {} done rows, WAL + synchronous=NORMAL ({} claims per run, \
         backlog {} commands, median of {} alternating runs)",
        sizes.done, sizes.claims, sizes.backlog, sizes.rounds
    );
    println!();
    println!("| in the way | raw µs/claim | miniflow µs/claim | miniflow / raw | raw CPU µs/claim | miniflow CPU µs/claim |");
    println!("|---|---:|---:|---:|---:|---:|");
    for scenario in [
        Scenario::Plain,
        Scenario::Paused,
        Scenario::Full,
        Scenario::Priority,
    ] {
        let (mut raw, mut ours) = (Vec::new(), Vec::new());
        for round in 0..sizes.rounds {
            let raw_path = dir.join(format!("raw-{}-{round}.db", scenario as u8));
            drop(seed(&raw_path, scenario, sizes));
            raw.push(raw_claims(&raw_path, scenario, sizes.claims));
            let ours_path = dir.join(format!("miniflow-{}-{round}.db", scenario as u8));
            let mut store = seed(&ours_path, scenario, sizes);
            ours.push(miniflow_claims(&mut store, sizes.claims));
        }
        let wall = |spent: &[Spent]| median(spent.iter().map(|s| s.wall).collect());
        let cpu = |spent: &[Spent]| median(spent.iter().map(|s| s.cpu).collect());
        let n = sizes.claims;
        println!(
            "| {} | {:.1} | {:.1} | {:.2}× | {:.1} | {:.1} |",
            scenario.name(),
            us(wall(&raw), n),
            us(wall(&ours), n),
            wall(&ours).as_secs_f64() / wall(&raw).as_secs_f64(),
            us(cpu(&raw), n),
            us(cpu(&ours), n),
        );
    }
}

/// `stats` against the same counts by hand, and against counting the whole table.
fn stats_table(dir: &Path, sizes: &Sizes) {
    let path = dir.join("stats.db");
    let store = seed(&path, Scenario::Paused, sizes);
    let conn = Connection::open(&path).unwrap();
    let now = NOW.as_millis() as i64;
    let by_hand = || {
        let mut stmt = conn
            .prepare_cached(
                "SELECT kind, status, count(*), sum(available_at <= ?1), \
                 min(CASE WHEN available_at <= ?1 THEN available_at END) FROM outbox \
                 WHERE processed_at IS NULL GROUP BY kind, status",
            )
            .unwrap();
        let groups = stmt
            .query_map([now], |row| row.get::<_, i64>(2))
            .unwrap()
            .count();
        let dead: i64 = conn
            .prepare_cached("SELECT count(*) FROM outbox WHERE status = 'dead'")
            .unwrap()
            .query_row([], |row| row.get(0))
            .unwrap();
        groups + dead as usize
    };
    let whole_table = || {
        conn.prepare_cached("SELECT kind, status, count(*) FROM outbox GROUP BY kind, status")
            .unwrap()
            .query_map([], |row| row.get::<_, i64>(2))
            .unwrap()
            .count()
    };
    let runs = sizes.rounds * 10 + 1;
    let mut samples: [Vec<Duration>; 3] = Default::default();
    let mut cpu: [Duration; 3] = Default::default();
    for _ in 0..runs {
        for (side, samples) in samples.iter_mut().enumerate() {
            let (wall, before) = (Instant::now(), process_cpu());
            match side {
                0 => assert!(by_hand() > 0),
                1 => assert!(store.stats(NOW).unwrap().pending() > 0),
                _ => assert!(whole_table() > 0),
            }
            samples.push(wall.elapsed());
            cpu[side] += process_cpu().saturating_sub(before);
        }
    }
    let [raw, ours, whole] = samples.map(median);
    println!();
    println!(
        "## `stats` among {} done rows, {} unfinished (median of {runs} interleaved calls)",
        sizes.done,
        sizes.backlog + sizes.claims * BATCH
    );
    println!();
    println!("| reader | µs/call | vs by hand | CPU µs/call |");
    println!("|---|---:|---:|---:|");
    for (name, took, cpu) in [
        ("by hand: the same grouped counts", raw, cpu[0]),
        ("SqliteStore::stats", ours, cpu[1]),
        ("counting the whole table", whole, cpu[2]),
    ] {
        println!(
            "| {name} | {:.0} | {:.2}× | {:.0} |",
            took.as_secs_f64() * 1e6,
            took.as_secs_f64() / raw.as_secs_f64(),
            us(cpu, runs),
        );
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let sizes = if !args.iter().any(|a| a == "--bench") {
        Sizes {
            backlog: 300,
            done: 1_000,
            claims: 4,
            rounds: 1,
        }
    } else if args.iter().any(|a| a == "--quick") {
        Sizes {
            backlog: 2_000,
            done: 20_000,
            claims: 50,
            rounds: 3,
        }
    } else {
        Sizes {
            backlog: 10_000,
            done: 200_000,
            claims: 200,
            rounds: 3,
        }
    };
    let dir =
        tempfile::tempdir_in(std::env::var("BENCH_DIR").unwrap_or_else(|_| ".".into())).unwrap();
    claims_table(dir.path(), &sizes);
    stats_table(dir.path(), &sizes);
}
