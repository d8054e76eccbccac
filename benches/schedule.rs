//! What a recurring schedule costs: the commit that fires an occurrence and arms the next, beside a
//! one-shot timer's firing commit and beside raw rusqlite doing the same writes by hand in one
//! transaction; and the catch-up after an outage (the core alone, on a `MemoryStore`): an interval
//! counts its missed occurrences by arithmetic, a cron expression match by match.
//!
//! Run with `cargo bench --bench schedule` (add `-- --quick` for a short run). Prints tables with
//! the wall time and the CPU time (`getrusage`) per operation. `cargo test` runs it once with tiny
//! sizes, as a smoke test.

use std::time::{Duration, Instant};

use miniflow::prelude::*;
use miniflow::{
    json, Command, Decision, Engine, Event, EventRecord, MemoryStore, Schedule, ScheduleFired,
    SqliteStore, Timer, TimerRow, Timestamp, Workflow, WorkflowId, SCHEDULE_FIRED,
};
use rusqlite::{params, Connection, TransactionBehavior};

mod support;
use support::process_cpu as cpu;

const NOW: Timestamp = Timestamp::from_millis(1_700_000_000_000);
const SECOND: Duration = Duration::from_secs(1);

/// `start` sets a one-shot timer or starts a schedule (as its payload says), due one second later;
/// each firing decides one command.
struct Ticking;

impl Workflow for Ticking {
    type State = ();

    fn evolve(&self, _: &mut (), _: &EventRecord) {}

    fn decide(&self, _: &(), event: &EventRecord) -> Decision {
        match event.kind.as_str() {
            "start" => match event.payload["cron"].as_str() {
                Some(expression) => Decision::new().schedule(Schedule::cron("tick", expression)),
                None if event.payload["schedule"] == json!(true) => {
                    Decision::new().schedule(Schedule::every("tick", SECOND))
                }
                None => Decision::new().timer(Timer::after("tick", SECOND, json!(null))),
            },
            _ => Decision::new().command(Command::new("record", json!({ "seq": event.seq }))),
        }
    }
}

/// Wall and CPU time of `f`.
fn timed(f: impl FnOnce()) -> (Duration, Duration) {
    let (wall, cpu0) = (Instant::now(), cpu());
    f();
    (wall.elapsed(), cpu() - cpu0)
}

/// A store at `path` with `n` workflows, each with a timer or schedule (`start`) due at `NOW`, all
/// of them taken: what a firer holds before it fires.
fn taken(
    path: &std::path::Path,
    n: usize,
    start: &serde_json::Value,
) -> (SqliteStore, Vec<TimerRow>) {
    let mut store = SqliteStore::open(path).unwrap();
    let engine = Engine::new(Ticking);
    let before = Timestamp::from_millis(NOW.as_millis() - 1_000);
    for i in 0..n {
        let id = WorkflowId::new(format!("w-{i}")).unwrap();
        engine
            .handle(&mut store, &id, Event::new("start", start.clone()), before)
            .unwrap();
    }
    let due = store.claim_timers(n, Duration::from_secs(60), NOW).unwrap();
    assert_eq!(due.len(), n);
    (store, due)
}

/// Fires `n` one-shot timers (`schedule` false) or schedule occurrences through `Engine::fire`.
fn engine_fires(
    dir: &std::path::Path,
    round: usize,
    n: usize,
    schedule: bool,
) -> (Duration, Duration) {
    let path = dir.join(format!("engine-{schedule}-{round}.db"));
    let (mut store, due) = taken(&path, n, &json!({ "schedule": schedule }));
    let engine = Engine::new(Ticking);
    let took = timed(|| {
        for timer in &due {
            engine.fire(&mut store, timer, NOW).unwrap().unwrap();
        }
    });
    let armed = store
        .claim_timers(usize::MAX, SECOND, NOW + SECOND)
        .unwrap();
    assert_eq!(armed.len(), if schedule { n } else { 0 });
    took
}

/// Raw rusqlite firing `n` occurrences: one transaction each that reads the last seq, inserts the
/// event and its command, marks the timer fired and inserts the next occurrence.
fn raw_fires(dir: &std::path::Path, round: usize, n: usize) -> (Duration, Duration) {
    let path = dir.join(format!("raw-{round}.db"));
    let (store, due) = taken(&path, n, &json!({ "schedule": true }));
    drop(store);
    let mut conn = Connection::open(&path).unwrap();
    conn.busy_timeout(Duration::from_secs(10)).unwrap();
    conn.execute_batch(
        "PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON; \
         PRAGMA cache_size = -16384;",
    )
    .unwrap();
    let now = NOW.as_millis() as i64;
    let next_at = now + 1_000;
    let took = timed(|| {
        for timer in &due {
            let workflow = timer.timer_id.workflow_id().as_str();
            let id = timer.timer_id.to_string();
            let next_id = id.replace(&format!("@{now}"), &format!("@{next_at}"));
            let event = serde_json::to_string(&timer.event_payload).unwrap();
            let tx = conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .unwrap();
            let last: i64 = tx
                .prepare_cached("SELECT COALESCE(MAX(seq), 0) FROM events WHERE workflow_id = ?1")
                .unwrap()
                .query_row([workflow], |r| r.get(0))
                .unwrap();
            tx.prepare_cached(
                "INSERT INTO events (workflow_id, seq, kind, payload, recorded_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5)",
            )
            .unwrap()
            .execute(params![workflow, last + 1, SCHEDULE_FIRED, event, now])
            .unwrap();
            tx.prepare_cached(
                "INSERT INTO outbox (workflow_id, event_seq, idx, kind, payload, status, \
                 available_at, created_at) VALUES (?1, ?2, 0, 'record', ?3, 'pending', ?4, ?4)",
            )
            .unwrap()
            .execute(params![workflow, last + 1, r#"{"seq":2}"#, now])
            .unwrap();
            let fired = tx
                .prepare_cached(
                    "UPDATE timers SET status = 'fired', processed_at = ?2 \
                     WHERE timer_id = ?1 AND processed_at IS NULL",
                )
                .unwrap()
                .execute(params![id, now])
                .unwrap();
            assert_eq!(fired, 1);
            tx.prepare_cached(
                "INSERT INTO timers (workflow_id, timer_id, name, event_kind, event_payload, \
                 fire_at, available_at, status, created_at) \
                 VALUES (?1, ?2, 'tick', ?3, ?4, ?5, ?5, 'scheduled', ?6)",
            )
            .unwrap()
            .execute(params![
                workflow,
                next_id,
                SCHEDULE_FIRED,
                event,
                next_at,
                now
            ])
            .unwrap();
            tx.commit().unwrap();
        }
    });
    took
}

/// Fires the first occurrence of a schedule (`start`) after `outage` without a firer, on a
/// `MemoryStore`; returns the time of that one firing and how many occurrences it counted missed.
fn catch_up(start: serde_json::Value, outage: Duration) -> ((Duration, Duration), u64) {
    let mut store = MemoryStore::new();
    let engine = Engine::new(Ticking);
    let id = WorkflowId::new("w").unwrap();
    engine
        .handle(&mut store, &id, Event::new("start", start), NOW)
        .unwrap();
    let back = NOW + outage;
    let due = store.claim_timers(1, SECOND, back).unwrap();
    let took = timed(|| {
        engine.fire(&mut store, &due[0], back).unwrap().unwrap();
    });
    let events = store.load(&id).unwrap();
    let fired = events[1].decode::<ScheduleFired>().unwrap().unwrap();
    (took, fired.missed)
}

fn median(mut samples: Vec<(Duration, Duration)>) -> (Duration, Duration) {
    samples.sort();
    samples[samples.len() / 2]
}

fn per_op(took: Duration, n: usize) -> f64 {
    took.as_secs_f64() * 1e6 / n as f64
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (n, rounds, outages) = if !args.iter().any(|a| a == "--bench") {
        (20, 1, vec![60])
    } else if args.iter().any(|a| a == "--quick") {
        (500, 3, vec![60, 3_600])
    } else {
        (2_000, 5, vec![60, 3_600, 86_400, 2 * 86_400])
    };
    let dir =
        tempfile::tempdir_in(std::env::var("BENCH_DIR").unwrap_or_else(|_| ".".into())).unwrap();

    let (mut raw, mut timer, mut schedule) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        raw.push(raw_fires(dir.path(), round, n));
        timer.push(engine_fires(dir.path(), round, n, false));
        schedule.push(engine_fires(dir.path(), round, n, true));
    }
    let (raw, timer, schedule) = (median(raw), median(timer), median(schedule));
    println!(
        "## Firing commits on SQLite, WAL + synchronous=FULL ({n} firings, median of {rounds})"
    );
    println!();
    println!("| firing | µs/firing | CPU µs/firing | vs raw |");
    println!("|---|---:|---:|---:|");
    for (name, (wall, cpu)) in [
        (
            "raw rusqlite: event + command + fired + next occurrence, one transaction",
            raw,
        ),
        (
            "Engine::fire, a one-shot timer (event + command + fired)",
            timer,
        ),
        (
            "Engine::fire, a schedule's occurrence (event + command + fired + next)",
            schedule,
        ),
    ] {
        println!(
            "| {name} | {:.1} | {:.1} | {:.2}× |",
            per_op(wall, n),
            per_op(cpu, n),
            wall.as_secs_f64() / raw.0.as_secs_f64()
        );
    }

    println!();
    println!("## Catching up after an outage: the one firing that folds it in (MemoryStore, Missed::FireOnce)");
    println!();
    println!("| schedule | outage | missed | ms | CPU ms |");
    println!("|---|---:|---:|---:|---:|");
    for outage_secs in outages {
        let outage = Duration::from_secs(outage_secs);
        let cases = [
            ("every 1 s", json!({ "schedule": true })),
            (
                "cron `* * * * * *` (every second)",
                json!({ "cron": "* * * * * *" }),
            ),
        ];
        for (name, start) in cases {
            let ((wall, cpu), missed) = catch_up(start, outage);
            println!(
                "| {name} | {outage_secs} s | {missed} | {:.3} | {:.3} |",
                wall.as_secs_f64() * 1e3,
                cpu.as_secs_f64() * 1e3
            );
        }
    }
}
