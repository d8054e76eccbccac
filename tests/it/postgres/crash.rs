//! Crash tests on PostgreSQL: producer and worker processes are killed with SIGKILL at chosen points —
//! inside a claim, an ack, a lease extension, a timer's firing, a failure's feedback, a producer's
//! commit (the database raises the point while the transaction is open), before a delivery, inside the receiver's effect
//! transaction, after the effect before the ack — and at random times. Right after each crash the
//! transaction killed in flight has left nothing; after recovery every command is settled, none is
//! lost, each done command has exactly one effect, and no lease was handed out while live.
//!
//! The random sample prints its seed; `MINIFLOW_PG_CRASH_SEED=<seed>` replays it, and
//! `MINIFLOW_PG_CRASH_ROUNDS=<n>` runs a longer soak.

use std::os::unix::process::ExitStatusExt;
use std::process::Child;
use std::time::{Duration, Instant};

use miniflow::{Clock, SystemClock};

use super::async_processes::spawn_producer as spawn_async_producer;
use super::delivery::{
    check_invariants, connect, fresh_database, plain_client, produce, recover, spawn_producer,
    CrashPoint, Idempotency, Workers,
};
use crate::child;

const ORDERS: usize = 10; // 173 commands, 3 of them lost parcels
/// How long a killed worker's leases (and its takes of timers) hold.
const LEASE: Duration = Duration::from_millis(400);

/// Waits for `process`, which was meant to die by SIGKILL; returns its standard output.
fn killed_output(process: Child, context: &str) -> String {
    let out = process.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(
        out.status.signal(),
        Some(9),
        "{context}: the process was meant to die by SIGKILL but ended with {}:\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// A worker process of 2 workers that dies at `point`.
fn victim(url: &str, point: CrashPoint) -> Child {
    Workers {
        url: url.to_owned(),
        app: "victim".to_owned(),
        workers: 2,
        lease: LEASE,
        orders: ORDERS,
        idempotency: Idempotency::Reservations,
        connect_timeout: None,
        crash: Some(point),
        deadline: Duration::from_secs(30),
        asynchronous: false,
    }
    .spawn()
}

/// One value of `sql` taking the killed subject as `$1`.
fn one<T: for<'a> miniflow::postgres::types::FromSql<'a>>(
    url: &str,
    sql: &str,
    subject: &str,
) -> T {
    plain_client(url, "check")
        .unwrap()
        .query_one(sql, &[&subject])
        .unwrap_or_else(|e| panic!("{sql} with {subject}: {e}"))
        .get(0)
}

/// What must hold right after the victim died at `point` on `subject` (the command it was
/// delivering or acknowledging, or the workflow whose event it was committing): the transaction it
/// died in left nothing behind.
fn check_right_after(url: &str, point: CrashPoint, subject: &str, context: &str) {
    let status = || {
        one::<String>(
            url,
            "SELECT status FROM outbox WHERE workflow_id || ':' || event_seq || ':' || idx = $1",
            subject,
        )
    };
    let effects = || {
        one::<i64>(
            url,
            "SELECT count(*) FROM effects WHERE command_id = $1",
            subject,
        )
    };
    let record = || {
        one::<Option<String>>(
            url,
            "SELECT max(CASE WHEN result IS NULL THEN 'reserved' ELSE 'completed' END) \
             FROM idempotency WHERE key = $1",
            subject,
        )
    };
    match point {
        // Only the victim ran: what it was claiming is still pending — or, if the victim's own
        // lease on it had run out, still leased by that earlier claim.
        CrashPoint::InsideClaim(_) => {
            let claims = one::<i64>(
                url,
                "SELECT count(*) FROM lease_history WHERE command_id = $1 \
                 AND new_token > old_token",
                subject,
            );
            let status = status();
            assert!(
                status == "pending" || (status == "leased" && claims > 0),
                "{context}: {status} after {claims} committed claims"
            );
        }
        CrashPoint::InsideAck(_) => {
            assert_eq!(status(), "leased", "{context}: the ack did not land");
            assert_eq!(effects(), 1, "{context}: the effect came before the ack");
        }
        CrashPoint::InsideExtend(_) => {
            // The heartbeat extends every lease the worker holds, including those whose effect is
            // made and whose ack is queued: the subject may have its effect already, never two.
            assert_eq!(status(), "leased", "{context}");
            assert!(effects() <= 1, "{context}: {} effects", effects());
            // One statement, one transaction: the extension died whole, leaving no lease of the
            // victim extended (every extension before it was an earlier heartbeat's).
            let extended: i64 = plain_client(url, "check")
                .unwrap()
                .query_one(
                    "SELECT count(*) FROM lease_history WHERE app = 'victim' \
                     AND old_status = 'leased' AND new_status = 'leased' \
                     AND new_expires > old_expires",
                    &[],
                )
                .unwrap()
                .get(0);
            if point == CrashPoint::InsideExtend(1) {
                assert_eq!(
                    extended, 0,
                    "{context}: a lease outlived its extension's death"
                );
            }
        }
        CrashPoint::HoldingLeases(_) => {
            assert_eq!(status(), "leased", "{context}");
            assert_eq!(effects(), 0, "{context}");
        }
        CrashPoint::InsideEffect(_) => {
            assert_eq!(status(), "leased", "{context}");
            assert_eq!(
                effects(),
                0,
                "{context}: the effect outlived its transaction"
            );
            assert_eq!(record().as_deref(), Some("reserved"), "{context}");
        }
        CrashPoint::AfterEffect(_) => {
            assert_eq!(status(), "leased", "{context}: no ack yet");
            assert_eq!(effects(), 1, "{context}");
            assert_eq!(record().as_deref(), Some("completed"), "{context}");
        }
        CrashPoint::InsideFiring(_) | CrashPoint::InsideFeedback(_) => {
            let (workflow, kind) = subject.split_once('/').expect("workflow/kind");
            let events: i64 = plain_client(url, "check")
                .unwrap()
                .query_one(
                    "SELECT count(*) FROM events WHERE workflow_id = $1 AND kind = $2",
                    &[&workflow, &kind],
                )
                .unwrap()
                .get(0);
            assert_eq!(
                events, 0,
                "{context}: the event fired in flight is not there"
            );
            let scheduled = one::<i64>(
                url,
                "SELECT count(*) FROM timers WHERE workflow_id = $1 AND status = 'scheduled'",
                workflow,
            );
            assert!(scheduled >= 1, "{context}: its timer is still scheduled");
        }
        CrashPoint::InsideCommit(_) => {
            let events = one::<i64>(
                url,
                "SELECT count(*) FROM events WHERE workflow_id = $1",
                subject,
            );
            assert_eq!(
                events, 0,
                "{context}: the commit killed in flight is not there"
            );
        }
    }
}

/// Kills a lone worker process at each of `points`, checks what it left, recovers, checks again.
fn kill_workers_at(points: &[CrashPoint]) {
    for &point in points {
        let started = Instant::now();
        let context = format!("worker killed at {point:?}");
        let (_database, url) = fresh_database();
        produce(&mut connect(&url, "producer").unwrap(), ORDERS, 0, 1);
        let stdout = killed_output(victim(&url, point), &context);
        let subject = child::reported(&stdout, "killed_subject")
            .unwrap_or_else(|| panic!("{context}: where it died is not known:\n{stdout}"));
        let context = format!("{context} on {subject}");
        check_right_after(&url, point, &subject, &format!("{context}, right after"));
        recover(&url, ORDERS, LEASE, &context);
        let history = check_invariants(&url, ORDERS, &context);
        if matches!(
            point,
            CrashPoint::HoldingLeases(_)
                | CrashPoint::InsideEffect(_)
                | CrashPoint::AfterEffect(_)
                | CrashPoint::InsideAck(_)
                | CrashPoint::InsideExtend(_)
        ) {
            assert!(
                history.takeovers > 0,
                "{context}: the dead worker held leases, yet none was taken over: {history:?}"
            );
        }
        if matches!(point, CrashPoint::AfterEffect(_) | CrashPoint::InsideAck(_)) {
            assert!(
                history.repeats > 0,
                "{context}: a command done before the crash was not delivered again: {history:?}"
            );
        }
        let effect_by = |subject: &str| -> String {
            one(
                &url,
                "SELECT app FROM effects WHERE command_id = $1",
                subject,
            )
        };
        match point {
            // The effect in flight went with its transaction: the redelivery made the one effect.
            CrashPoint::InsideEffect(_) => assert_eq!(
                effect_by(&subject),
                "recovery",
                "{context}: its one effect is the redelivery's"
            ),
            // The effect was made, the ack was not: the redelivery was answered from the record.
            CrashPoint::AfterEffect(_) | CrashPoint::InsideAck(_) => assert_eq!(
                effect_by(&subject),
                "victim",
                "{context}: its one effect is the dead worker's"
            ),
            _ => {}
        }
        eprintln!(
            "{context}: recovered in {:.1} s, {history:?}",
            started.elapsed().as_secs_f64()
        );
    }
}

#[test]
fn workers_killed_inside_claims_acks_extensions_and_firings_lose_nothing() {
    kill_workers_at(&[
        CrashPoint::InsideClaim(1), // the first lease of the first claim
        CrashPoint::InsideClaim(45),
        CrashPoint::InsideAck(1), // the effect made, the ack in flight
        CrashPoint::InsideAck(30),
        CrashPoint::InsideExtend(1), // a heartbeat half-way through its extension
        CrashPoint::InsideFiring(1), // a reminder's event half-committed
        CrashPoint::InsideFiring(6),
        CrashPoint::InsideFeedback(1), // a lost parcel's command_failed half-committed
        CrashPoint::InsideFeedback(2),
    ]);
}

#[test]
fn workers_killed_around_the_receivers_effect_repeat_no_effect() {
    kill_workers_at(&[
        CrashPoint::HoldingLeases(1), // a batch leased, nothing delivered
        CrashPoint::HoldingLeases(40),
        CrashPoint::InsideEffect(1), // the effect written, not committed
        CrashPoint::InsideEffect(25),
        CrashPoint::AfterEffect(1), // the receiver did it, the ack never came
        CrashPoint::AfterEffect(37),
    ]);
}

#[test]
fn a_producer_killed_inside_a_commit_leaves_no_partial_commit() {
    for nth in [1, 7] {
        let point = CrashPoint::InsideCommit(nth);
        let context = format!("producer killed at {point:?}");
        let (_database, url) = fresh_database();
        let stdout = killed_output(
            spawn_producer(&url, "victim", ORDERS, 0, 1, Some(point)),
            &context,
        );
        let subject = child::reported(&stdout, "killed_subject")
            .unwrap_or_else(|| panic!("{context}: where it died is not known:\n{stdout}"));
        check_right_after(&url, point, &subject, &context);
        let mut db = plain_client(&url, "check").unwrap();
        let placed: i64 = db
            .query_one("SELECT count(*) FROM events", &[])
            .unwrap()
            .get(0);
        assert_eq!(
            placed,
            nth as i64 - 1,
            "{context}: the orders before are there, the one in flight is not"
        );
        let commands: i64 = db
            .query_one("SELECT count(*) FROM outbox", &[])
            .unwrap()
            .get(0);
        assert_eq!(
            commands,
            (nth as i64 - 1) * super::delivery::PARCELS as i64,
            "{context}: no command without its event"
        );
        recover(&url, ORDERS, LEASE, &context);
        check_invariants(&url, ORDERS, &context);
    }
}

#[test]
fn processes_killed_at_random_times_lose_nothing_and_repeat_no_effect() {
    kill_at_random(false);
}

#[test]
fn async_processes_killed_at_random_times_lose_nothing_and_repeat_no_effect() {
    kill_at_random(true);
}

/// Kills one to three of a producer and three worker processes — on the async API when
/// `asynchronous` — at random times, lets a recovering process finish, checks the invariants.
fn kill_at_random(asynchronous: bool) {
    let api = if asynchronous { "async" } else { "sync" };
    let seed = std::env::var("MINIFLOW_PG_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| u64::from(std::process::id()) ^ SystemClock.now().as_millis());
    let rounds: u64 = std::env::var("MINIFLOW_PG_CRASH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    eprintln!(
        "random PostgreSQL crash sample, {api} processes: seed {seed}, {rounds} rounds \
         (replay with MINIFLOW_PG_CRASH_SEED={seed})"
    );
    let mut rng = fastrand::Rng::with_seed(seed);
    for round in 0..rounds {
        let context = format!(
            "{api}: seed {seed}, round {round} (replay with MINIFLOW_PG_CRASH_SEED={seed})"
        );
        let (_database, url) = fresh_database();
        let orders = 20; // 345 commands
        let workers = |n: usize| Workers {
            url: url.clone(),
            app: format!("workers-{n}"),
            workers: 2,
            lease: LEASE,
            orders,
            idempotency: Idempotency::Reservations,
            connect_timeout: None,
            crash: None,
            deadline: Duration::from_secs(60),
            asynchronous,
        };
        let producer = if asynchronous {
            spawn_async_producer(&url, "producer", orders, Duration::ZERO)
        } else {
            spawn_producer(&url, "producer", orders, 0, 1, None)
        };
        let mut processes: Vec<(String, Option<Child>)> = vec![
            ("producer".to_owned(), Some(producer)),
            ("workers-0".to_owned(), Some(workers(0).spawn())),
            ("workers-1".to_owned(), Some(workers(1).spawn())),
            ("workers-2".to_owned(), Some(workers(2).spawn())),
        ];
        // One to three kills, each of a process still running, at random times.
        let started = Instant::now();
        let mut kills = Vec::new();
        for _ in 0..rng.usize(1..=3) {
            std::thread::sleep(Duration::from_millis(rng.u64(0..1_200)));
            let (name, process) = &mut processes[rng.usize(0..4)];
            if let Some(mut victim) = process.take() {
                victim.kill().unwrap(); // SIGKILL
                let _ = victim.wait();
                kills.push(format!("{name} at {} ms", started.elapsed().as_millis()));
            }
        }
        let context = format!("{context}, killed {kills:?}");
        eprintln!("{context}");
        // The survivors go on; a recovering process places what is left (once the producer, if it
        // lives, is done: two producers would race to place an order) and delivers beside them.
        let mut survivors = processes.into_iter();
        if let Some((name, Some(producer))) = survivors.next() {
            child::wait_ok(producer, &format!("{context}: {name}, never killed"));
        }
        recover(&url, orders, LEASE, &context);
        for (name, process) in survivors {
            if let Some(process) = process {
                child::wait_ok(process, &format!("{context}: {name}, never killed"));
            }
        }
        let history = check_invariants(&url, orders, &context);
        eprintln!("{context}: {history:?}");
    }
}
