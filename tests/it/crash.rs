//! Crash tests: producer and worker processes are killed with SIGKILL at chosen points and at random
//! times, then restarted. After every run no event lacks its commands, no command lacks its event, no
//! command is lost, every command is delivered at least once and has exactly one effect, every timer
//! fired exactly once and every dead command fed exactly one `command_failed` event back.
//!
//! The random sample prints its seed; `MINIFLOW_CRASH_SEED=<seed>` replays it, and
//! `MINIFLOW_CRASH_ROUNDS=<n>` runs a longer soak.

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Child;
use std::time::Duration;

use miniflow::SqliteStore;

use crate::child;
use crate::delivery::{
    check_invariants, produce, run_workers, worker_settings, CrashPoint, Receiver,
};

const ORDERS: usize = 40; // × 5 commands

fn assert_killed(process: Child, what: &str) {
    let out = process.wait_with_output().unwrap();
    assert_eq!(
        out.status.signal(),
        Some(9),
        "{what} was meant to die by SIGKILL but ended with {}:\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn spawn_worker(db: &Path, receiver: &Path, workers: usize, crash: Option<CrashPoint>) -> Child {
    child::spawn(
        "delivery::child_worker_process",
        "worker",
        &worker_settings(db, receiver, workers, crash),
    )
}

fn spawn_producer(db: &Path, crash: Option<CrashPoint>) -> Child {
    let settings = [
        ("MINIFLOW_DB", db.display().to_string()),
        ("MINIFLOW_ORDERS", ORDERS.to_string()),
        (
            "MINIFLOW_CRASH",
            crash.map(CrashPoint::to_setting).unwrap_or_default(),
        ),
    ];
    child::spawn("delivery::child_producer_process", "producer", &settings)
}

/// Restarts after a crash: finishes placing orders, then delivers until nothing is unfinished.
fn recover_and_check(db: &Path, receiver: &Path, context: &str) {
    produce(&mut SqliteStore::open(db).unwrap(), ORDERS);
    run_workers(db, receiver, 2, None, true);
    check_invariants(db, receiver, ORDERS, context);
}

fn fresh(dir: &Path, name: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let (db, receiver) = (
        dir.join(format!("{name}.db")),
        dir.join(format!("{name}-receiver.db")),
    );
    drop(SqliteStore::open(&db).unwrap());
    drop(Receiver::open(&receiver));
    (db, receiver)
}

#[test]
fn producer_killed_inside_a_commit_leaves_no_partial_commit() {
    let dir = tempfile::tempdir().unwrap();
    for nth in [1, 2, 17] {
        let (db, receiver) = fresh(dir.path(), &format!("producer-{nth}"));
        assert_killed(
            spawn_producer(&db, Some(CrashPoint::InsideCommit(nth))),
            "producer",
        );
        let placed = rusqlite::Connection::open(&db)
            .unwrap()
            .query_row("SELECT COUNT(*) FROM events", [], |r| r.get::<_, i64>(0))
            .unwrap();
        assert_eq!(
            placed,
            nth as i64 - 1,
            "the commit killed in flight is not there, the ones before are"
        );
        recover_and_check(
            &db,
            &receiver,
            &format!("producer killed inside commit {nth}"),
        );
    }
}

#[test]
fn workers_killed_at_chosen_points_lose_nothing_and_repeat_no_effect() {
    let dir = tempfile::tempdir().unwrap();
    let points = [
        CrashPoint::InsideCommit(1), // inside the first claim
        CrashPoint::InsideCommit(2), // inside the first batch of acks
        CrashPoint::InsideCommit(5),
        CrashPoint::HoldingLeases(1), // a batch leased, nothing delivered
        CrashPoint::HoldingLeases(20),
        CrashPoint::AfterEffect(1), // the receiver did it, the ack never came
        CrashPoint::AfterEffect(33),
        CrashPoint::InsideFiring(1), // a reminder or a failure's feedback half-committed
        CrashPoint::InsideFiring(9),
        CrashPoint::InsideCommit(40),
    ];
    for point in points {
        let name = point.to_setting().replace(':', "-");
        let (db, receiver) = fresh(dir.path(), &name);
        produce(&mut SqliteStore::open(&db).unwrap(), ORDERS);
        assert_killed(spawn_worker(&db, &receiver, 2, Some(point)), "worker");
        recover_and_check(&db, &receiver, &format!("worker killed at {point:?}"));
    }
}

/// SplitMix64: a small seeded generator, so a failing sample replays from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[test]
fn processes_killed_at_random_times_lose_nothing_and_repeat_no_effect() {
    let seed = std::env::var("MINIFLOW_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            u64::from(std::process::id()) ^ miniflow::Clock::now(&miniflow::SystemClock).as_millis()
        });
    let rounds: u64 = std::env::var("MINIFLOW_CRASH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4);
    eprintln!("random crash sample: seed {seed}, {rounds} rounds (replay with MINIFLOW_CRASH_SEED={seed})");
    let mut rng = Rng(seed);
    let dir = tempfile::tempdir().unwrap();
    for round in 0..rounds {
        let context =
            format!("seed {seed}, round {round} (replay with MINIFLOW_CRASH_SEED={seed})");
        let (db, receiver) = fresh(dir.path(), &format!("random-{round}"));
        let mut processes = vec![
            spawn_producer(&db, None),
            spawn_worker(&db, &receiver, 2, None),
            spawn_worker(&db, &receiver, 3, None),
        ];
        std::thread::sleep(Duration::from_millis(rng.below(250)));
        let victim = rng.below(processes.len() as u64) as usize;
        processes[victim].kill().unwrap(); // SIGKILL on Unix
        for process in processes {
            let _ = process.wait_with_output().unwrap();
        }
        recover_and_check(&db, &receiver, &context);
    }
}
