//! Crash tests: producer and worker processes are killed with SIGKILL at chosen points and at random
//! times, then restarted. After every run no event lacks its commands, no command lacks its event, no
//! command is lost, every command is delivered at least once and has exactly one effect, every timer
//! fired exactly once and every dead command fed exactly one `command_failed` event back.
//!
//! Results: a worker killed between a receiver's effect and the ack, inside the ack of a command
//! that reports its result, or inside the firing of that result still feeds exactly one
//! `command_completed` event per command back into its workflow, carrying the result of the
//! command's single effect.
//!
//! A receiver whose effect and idempotency record commit in one transaction
//! (`SqliteIdempotencyStore::finish_in`), killed inside that transaction, leaves no effect behind;
//! the redelivery makes exactly one.
//!
//! A schedule's firer killed inside any of its commits (the take of an occurrence, or the commit
//! that records it and arms the next) leaves the schedule whole: each occurrence accounted for once,
//! one armed; after a restart every occurrence fires once.
//!
//! The random sample prints its seed; `MINIFLOW_CRASH_SEED=<seed>` replays it, and
//! `MINIFLOW_CRASH_ROUNDS=<n>` runs a longer soak.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use miniflow::backend::RecordState;
use miniflow::prelude::*;
use miniflow::rusqlite::{Connection, TransactionBehavior};
use miniflow::{
    json, Begin, Clock, Command, CommandCompleted, Decision, Delivery, Digest, Dispatcher, Engine,
    Error, Event, EventRecord, IdempotencyKey, IdempotencyPolicy, IdempotencyStore, Outcome,
    RetryPolicy, SqliteIdempotencyStore, SqliteStore, Status, SystemClock, TimerId, TimerStatus,
    Workflow, WorkflowId, COMMAND_COMPLETED,
};

use crate::child;
use crate::delivery::{
    check_invariants, kill_inside_commit, produce, run_workers, work_left, worker_settings,
    CrashPoint, Mark, Receiver,
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
        // Late, yet within reach however the writer groups the worker's commits: its 40 reminders
        // fire in at least 20 commits (its 2 workers fire one timer at a time each).
        CrashPoint::InsideCommit(20),
    ];
    for point in points {
        let name = point.to_setting().replace(':', "-");
        let (db, receiver) = fresh(dir.path(), &name);
        produce(&mut SqliteStore::open(&db).unwrap(), ORDERS);
        assert_killed(
            spawn_worker(&db, &receiver, 2, Some(point)),
            &format!("worker to be killed at {point:?}"),
        );
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

// Results fed back across crashes.

const TRIPS: usize = 20;
/// Every trip books this many legs, each asking for its result.
const LEGS: usize = 3;
/// How long a crashed worker's leases (and its takes of timers) hold.
const LEASE: Duration = Duration::from_millis(300);

/// `trip_requested` books [`LEGS`] legs and asks for each result; a `command_completed` is recorded
/// and decides nothing more.
struct Legs;

impl Workflow for Legs {
    type State = ();

    fn evolve(&self, _: &mut (), _: &EventRecord) {}

    fn decide(&self, _: &(), event: &EventRecord) -> Decision {
        match event.kind.as_str() {
            "trip_requested" => (0..LEGS)
                .map(|leg| {
                    Command::new("book_leg", json!({ "trip": event.workflow_id, "leg": leg }))
                        .report_result()
                })
                .fold(Decision::new(), Decision::command),
            COMMAND_COMPLETED => Decision::none(),
            _ => Decision::none(),
        }
    }
}

fn trip_id(n: usize) -> WorkflowId {
    WorkflowId::new(format!("trip-{n:03}")).unwrap()
}

/// Requests trips `0..trips`.
fn request_trips(db: &Path, trips: usize) {
    let mut store = SqliteStore::open(db).unwrap();
    let engine = Engine::new(Legs);
    for n in 0..trips {
        let event = Event::new("trip_requested", json!({ "n": n }));
        engine
            .handle(&mut store, &trip_id(n), event, SystemClock.now())
            .unwrap();
    }
}

/// The reference a receiver gives the single effect of `command_id`.
fn reference(command_id: &str) -> String {
    format!("REF-{command_id}")
}

/// Where a worker delivering commands that report their results kills itself.
#[derive(Debug, Clone, Copy)]
enum ResultCrash {
    /// After the nth delivery's effect committed at the receiver, before the ack.
    AfterEffect(u64),
    /// Inside the nth commit that acknowledges commands and schedules their `command_completed`.
    InsideAck(u64),
    /// Inside the nth commit that fires a `command_completed` event into its workflow.
    InsideFeedback(u64),
}

impl ResultCrash {
    fn to_setting(self) -> String {
        match self {
            ResultCrash::AfterEffect(n) => format!("after_effect:{n}"),
            ResultCrash::InsideAck(n) => format!("inside_ack:{n}"),
            ResultCrash::InsideFeedback(n) => format!("inside_feedback:{n}"),
        }
    }

    fn parse(text: &str) -> Self {
        let (point, n) = text.split_once(':').unwrap();
        let n = n.parse().unwrap();
        match point {
            "after_effect" => ResultCrash::AfterEffect(n),
            "inside_ack" => ResultCrash::InsideAck(n),
            "inside_feedback" => ResultCrash::InsideFeedback(n),
            other => panic!("unknown crash point {other}"),
        }
    }
}

/// A commit that acknowledges a command and schedules its `command_completed`.
const ACK_WITH_RESULT: Mark =
    Some("AFTER INSERT ON main.timers WHEN NEW.event_kind = 'command_completed'");
/// A commit that fires a `command_completed` event into its workflow.
const FIRING_A_RESULT: Mark = Some(
    "AFTER UPDATE OF status ON main.timers \
     WHEN NEW.status = 'fired' AND NEW.event_kind = 'command_completed'",
);

thread_local! {
    static RESULT_RECEIVER: RefCell<Option<Receiver>> = const { RefCell::new(None) };
}

/// Delivers the trips' commands to the idempotent receiver at `receiver`, completing each with its
/// reference, and fires the results back, until nothing is left (waiting out the leases of a
/// crashed process).
fn deliver_results(db: &Path, receiver: &Path, crash: Option<ResultCrash>) {
    let deliveries = Arc::new(AtomicU64::new(0));
    let commits = Arc::new(AtomicU64::new(0));
    let receiver = receiver.to_path_buf();
    let handler = move |d: &Delivery| {
        let n = deliveries.fetch_add(1, Ordering::SeqCst) + 1;
        let reference = RESULT_RECEIVER.with(|slot| {
            slot.borrow_mut()
                .get_or_insert_with(|| Receiver::open(&receiver))
                .deliver(&d.command_id.to_string())
        });
        if matches!(crash, Some(ResultCrash::AfterEffect(at)) if at == n) {
            child::kill_self();
        }
        Outcome::done_with(json!({ "reference": reference }))
    };
    let path = db.to_path_buf();
    let open = move || {
        let store = SqliteStore::open(&path)?;
        match crash {
            Some(ResultCrash::InsideAck(nth)) => {
                kill_inside_commit(&store, nth, ACK_WITH_RESULT, commits.clone())
            }
            Some(ResultCrash::InsideFeedback(nth)) => {
                kill_inside_commit(&store, nth, FIRING_A_RESULT, commits.clone())
            }
            _ => {}
        }
        Ok(store)
    };
    let dispatcher = Dispatcher::new(open, handler)
        .workflow(Engine::new(Legs))
        .workers(2)
        .batch_size(8)
        .lease_ttl(LEASE)
        .poll_interval(Duration::from_millis(20));
    loop {
        dispatcher.run_until_idle().unwrap();
        if !work_left(db) {
            return;
        }
        std::thread::sleep(LEASE / 3);
    }
}

/// Child process: a worker process delivering commands that report their results. Settings:
/// `MINIFLOW_DB`, `MINIFLOW_RECEIVER`, `MINIFLOW_CRASH` (a [`ResultCrash`]).
#[test]
fn child_result_worker() {
    if child::role().as_deref() != Some("result_worker") {
        return;
    }
    let db = PathBuf::from(child::setting("MINIFLOW_DB"));
    let receiver = PathBuf::from(child::setting("MINIFLOW_RECEIVER"));
    let crash = ResultCrash::parse(&child::setting("MINIFLOW_CRASH"));
    deliver_results(&db, &receiver, Some(crash));
}

fn count_by_command(conn: &Connection, sql: &str) -> BTreeMap<String, i64> {
    conn.prepare(sql)
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

/// Every trip's commands, and the `command_completed` events in its workflow.
fn commands_and_results(
    store: &SqliteStore,
    trips: usize,
) -> (Vec<miniflow::OutboxRow>, Vec<CommandCompleted>) {
    let (mut commands, mut results) = (Vec::new(), Vec::new());
    for n in 0..trips {
        commands.extend(store.commands(&trip_id(n)).unwrap());
        for event in store.load(&trip_id(n)).unwrap() {
            if let Some(done) = event.decode::<CommandCompleted>() {
                results.push(done.unwrap());
            }
        }
    }
    (commands, results)
}

/// What must hold at any moment, a crash included: a command is done exactly when its
/// `command_completed` feedback is scheduled (or fired) — the ack and its feedback are one commit —
/// and no command has fed more than one result back.
fn check_acks_carry_their_feedback(db: &Path, trips: usize, context: &str) {
    let store = SqliteStore::open(db).unwrap();
    let (commands, results) = commands_and_results(&store, trips);
    let done: BTreeSet<String> = commands
        .iter()
        .filter(|c| c.status == Status::Done)
        .map(|c| c.command_id.to_string())
        .collect();
    let mut with_feedback = BTreeSet::new();
    for n in 0..trips {
        for timer in store.timers(&trip_id(n)).unwrap() {
            let command = commands
                .iter()
                .find(|c| TimerId::completion(c.command_id.clone()) == timer.timer_id)
                .unwrap_or_else(|| panic!("{context}: a timer that is no feedback: {timer:?}"));
            with_feedback.insert(command.command_id.to_string());
        }
    }
    assert_eq!(
        done, with_feedback,
        "{context}: done commands and scheduled feedback differ"
    );
    let fed_back: BTreeSet<String> = results.iter().map(|r| r.command_id.to_string()).collect();
    assert_eq!(
        fed_back.len(),
        results.len(),
        "{context}: a result was fed back twice"
    );
    assert!(
        fed_back.is_subset(&done),
        "{context}: a result came back for a command not done"
    );
}

/// After recovery: every command done with the result of its single effect, and exactly one
/// `command_completed` event per command in its workflow, carrying that result.
fn check_results(db: &Path, receiver: &Path, trips: usize, context: &str) {
    let store = SqliteStore::open(db).unwrap();
    let (commands, results) = commands_and_results(&store, trips);
    assert_eq!(commands.len(), trips * LEGS, "{context}: no command lost");
    for command in &commands {
        let id = command.command_id.to_string();
        assert_eq!(command.status, Status::Done, "{context}: {id} not done");
        assert_eq!(
            command.result,
            Some(json!({ "reference": reference(&id) })),
            "{context}: {id} completed with another result"
        );
        let fed_back: Vec<&CommandCompleted> = results
            .iter()
            .filter(|r| r.command_id == command.command_id)
            .collect();
        assert_eq!(
            fed_back.len(),
            1,
            "{context}: {id} fed back {} results",
            fed_back.len()
        );
        assert_eq!(fed_back[0].kind, "book_leg");
        assert_eq!(fed_back[0].result, json!({ "reference": reference(&id) }));
        assert_eq!(
            fed_back[0].attempts, command.attempts,
            "{context}: {id} attempts"
        );
    }
    assert_eq!(results.len(), commands.len(), "{context}: one result each");
    for n in 0..trips {
        for timer in store.timers(&trip_id(n)).unwrap() {
            assert_eq!(
                timer.status,
                TimerStatus::Fired,
                "{context}: feedback {} not fired",
                timer.timer_id
            );
        }
    }

    let receiver = Connection::open(receiver).unwrap();
    let effects = count_by_command(
        &receiver,
        "SELECT command_id, COUNT(*) FROM side_effects GROUP BY command_id",
    );
    let delivered = count_by_command(
        &receiver,
        "SELECT command_id, COUNT(*) FROM deliveries GROUP BY command_id",
    );
    for command in &commands {
        let id = command.command_id.to_string();
        assert_eq!(
            effects.get(&id),
            Some(&1),
            "{context}: {id} has not exactly one effect"
        );
        assert!(
            delivered.contains_key(&id),
            "{context}: {id} never delivered"
        );
    }
    assert_eq!(
        effects.len(),
        commands.len(),
        "{context}: effects of unknown commands"
    );
}

/// Waits for `process`, which was meant to die by SIGKILL; returns its standard output.
fn killed_output(process: Child, what: &str) -> String {
    let out = process.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(
        out.status.signal(),
        Some(9),
        "{what} was meant to die by SIGKILL but ended with {}:\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn workers_killed_around_an_ack_with_a_result_feed_it_back_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let points = [
        ResultCrash::AfterEffect(1), // the receiver did it, the ack never came
        ResultCrash::AfterEffect(29),
        ResultCrash::InsideAck(1), // the ack and its scheduled feedback, half-committed
        ResultCrash::InsideAck(3), // a later one: acks of both workers may share a commit
        ResultCrash::InsideFeedback(1), // the result half-fired into its workflow
        ResultCrash::InsideFeedback(13),
    ];
    for point in points {
        let context = format!("worker killed at {point:?}");
        let name = point.to_setting().replace(':', "-");
        let (db, receiver) = (
            dir.path().join(format!("{name}.db")),
            dir.path().join(format!("{name}-receiver.db")),
        );
        request_trips(&db, TRIPS);
        drop(Receiver::open(&receiver));
        let settings = [
            ("MINIFLOW_DB", db.display().to_string()),
            ("MINIFLOW_RECEIVER", receiver.display().to_string()),
            ("MINIFLOW_CRASH", point.to_setting()),
        ];
        let worker = child::spawn("crash::child_result_worker", "result_worker", &settings);
        killed_output(worker, &context);
        check_acks_carry_their_feedback(&db, TRIPS, &format!("{context}, right after"));
        deliver_results(&db, &receiver, None);
        check_results(&db, &receiver, TRIPS, &context);
    }
}

// A receiver whose effect and record commit in one transaction, killed inside it.

/// How long the transactional receiver's reservations hold.
const RESERVATION: Duration = Duration::from_millis(400);

/// Where the transactional receiver's process kills itself, in the nth effect transaction.
#[derive(Debug, Clone, Copy)]
enum ReceiverCrash {
    /// The effect written, its record (`finish_in`) not yet.
    AfterEffect(u64),
    /// The effect and its record written, not committed.
    BeforeCommit(u64),
    /// Inside the commit of the effect and its record.
    InsideCommit(u64),
}

impl ReceiverCrash {
    fn to_setting(self) -> String {
        match self {
            ReceiverCrash::AfterEffect(n) => format!("after_effect:{n}"),
            ReceiverCrash::BeforeCommit(n) => format!("before_commit:{n}"),
            ReceiverCrash::InsideCommit(n) => format!("inside_commit:{n}"),
        }
    }

    fn parse(text: &str) -> Self {
        let (point, n) = text.split_once(':').unwrap();
        let n = n.parse().unwrap();
        match point {
            "after_effect" => ReceiverCrash::AfterEffect(n),
            "before_commit" => ReceiverCrash::BeforeCommit(n),
            "inside_commit" => ReceiverCrash::InsideCommit(n),
            other => panic!("unknown crash point {other}"),
        }
    }
}

/// A receiver on its own SQLite file that commits its effect (a `side_effects` row) and its
/// idempotency record (`finish_in`) in one transaction, under the reservation's token. Every
/// delivery is logged in `deliveries`.
struct TransactionalReceiver {
    keys: SqliteIdempotencyStore,
    conn: Connection,
    /// Set just before this receiver commits an effect transaction in which it is to die.
    dying: Arc<AtomicBool>,
}

impl TransactionalReceiver {
    fn open(path: &Path) -> Self {
        let policy = IdempotencyPolicy {
            retention: Duration::from_secs(24 * 3600),
            reservation_timeout: RESERVATION,
        };
        let keys = SqliteIdempotencyStore::open(path, policy).unwrap();
        let conn = Connection::open(path).unwrap();
        conn.busy_timeout(Duration::from_secs(30)).unwrap();
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS deliveries (command_id TEXT NOT NULL, pid INTEGER NOT NULL);
             CREATE TABLE IF NOT EXISTS side_effects \
                 (command_id TEXT NOT NULL, pid INTEGER NOT NULL);",
        )
        .unwrap();
        let dying = Arc::new(AtomicBool::new(false));
        let dies = dying.clone();
        conn.commit_hook(Some(move || {
            if dies.load(Ordering::SeqCst) {
                child::kill_self();
            }
            false
        }))
        .unwrap();
        Self { keys, conn, dying }
    }

    /// Takes one delivery; `effects` counts the effect transactions begun (across threads), and
    /// `crash` says where, if anywhere, this process dies.
    fn deliver(
        &mut self,
        delivery: &Delivery,
        effects: &AtomicU64,
        crash: Option<ReceiverCrash>,
    ) -> Outcome {
        let id = delivery.command_id.to_string();
        let key = IdempotencyKey::new(id.as_str()).unwrap();
        self.conn
            .execute(
                "INSERT INTO deliveries VALUES (?1, ?2)",
                (&id, std::process::id()),
            )
            .unwrap();
        let token = match self
            .keys
            .begin(&key, Digest::of(&delivery.payload), SystemClock.now())
        {
            Ok(Begin::Fresh { token }) => token,
            Ok(Begin::Completed { result }) => return Outcome::done_with(result),
            Ok(Begin::InProgress { .. }) => return Outcome::retry("409: in progress"),
            Ok(conflict @ Begin::Conflict { .. }) => {
                return Outcome::permanent(format!("422: {conflict:?}"))
            }
            Err(e) => return Outcome::retry(e),
        };
        let n = effects.fetch_add(1, Ordering::SeqCst) + 1;
        let die = || {
            println!("killed_in={id}");
            child::kill_self();
        };
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .unwrap();
        tx.execute(
            "INSERT INTO side_effects VALUES (?1, ?2)",
            (&id, std::process::id()),
        )
        .unwrap();
        if matches!(crash, Some(ReceiverCrash::AfterEffect(at)) if at == n) {
            die();
        }
        let result = json!({ "reference": reference(&id) });
        match self
            .keys
            .finish_in(&tx, &key, token, &result, SystemClock.now())
        {
            Ok(()) => {}
            Err(e @ Error::StaleReservation { .. }) => {
                tx.rollback().unwrap(); // the effect goes with it
                return Outcome::retry(format!("409: {e}"));
            }
            Err(e) => return Outcome::retry(e), // `tx` is dropped: rolled back
        }
        if matches!(crash, Some(ReceiverCrash::BeforeCommit(at)) if at == n) {
            die();
        }
        if matches!(crash, Some(ReceiverCrash::InsideCommit(at)) if at == n) {
            println!("killed_in={id}");
            self.dying.store(true, Ordering::SeqCst);
        }
        tx.commit().unwrap();
        Outcome::done_with(result)
    }
}

thread_local! {
    static TX_RECEIVER: RefCell<Option<TransactionalReceiver>> = const { RefCell::new(None) };
}

/// Delivers the trips' commands to the transactional receiver at `receiver` and fires the results
/// back, until nothing is left (waiting out the leases and reservations of a crashed process).
fn deliver_transactionally(db: &Path, receiver: &Path, crash: Option<ReceiverCrash>) {
    let effects = Arc::new(AtomicU64::new(0));
    let receiver = receiver.to_path_buf();
    let handler = move |d: &Delivery| {
        TX_RECEIVER.with(|slot| {
            slot.borrow_mut()
                .get_or_insert_with(|| TransactionalReceiver::open(&receiver))
                .deliver(d, &effects, crash)
        })
    };
    let dispatcher = Dispatcher::sqlite(db, handler)
        .workflow(Engine::new(Legs))
        .workers(2)
        .batch_size(8)
        .lease_ttl(LEASE)
        .retry_policy(
            RetryPolicy::default()
                .initial_delay(Duration::from_millis(50))
                .max_delay(Duration::from_millis(200))
                .max_attempts(100),
        )
        .poll_interval(Duration::from_millis(20));
    loop {
        dispatcher.run_until_idle().unwrap();
        if !work_left(db) {
            return;
        }
        std::thread::sleep(LEASE / 3);
    }
}

/// Child process: a worker process whose handler is the transactional receiver. Settings:
/// `MINIFLOW_DB`, `MINIFLOW_RECEIVER`, `MINIFLOW_CRASH` (a [`ReceiverCrash`]).
#[test]
fn child_transactional_receiver() {
    if child::role().as_deref() != Some("transactional_receiver") {
        return;
    }
    let db = PathBuf::from(child::setting("MINIFLOW_DB"));
    let receiver = PathBuf::from(child::setting("MINIFLOW_RECEIVER"));
    let crash = ReceiverCrash::parse(&child::setting("MINIFLOW_CRASH"));
    deliver_transactionally(&db, &receiver, Some(crash));
}

/// The receiver dies after its effect is written and before its transaction commits. (A receiver
/// that commits its effect first and records it in a second transaction would leave the effect
/// behind here, and the redelivery, taking the timed-out reservation over, would repeat it.)
#[test]
fn a_receiver_killed_inside_its_effect_transaction_leaves_no_effect_and_redelivery_makes_one() {
    let dir = tempfile::tempdir().unwrap();
    let trips = 10;
    let points = [
        ReceiverCrash::AfterEffect(1),
        ReceiverCrash::AfterEffect(14),
        ReceiverCrash::BeforeCommit(1),
        ReceiverCrash::BeforeCommit(9),
        ReceiverCrash::InsideCommit(1),
        ReceiverCrash::InsideCommit(21),
    ];
    for point in points {
        let context = format!("receiver killed at {point:?}");
        let name = point.to_setting().replace(':', "-");
        let (db, receiver) = (
            dir.path().join(format!("{name}.db")),
            dir.path().join(format!("{name}-receiver.db")),
        );
        request_trips(&db, trips);
        drop(TransactionalReceiver::open(&receiver));
        let settings = [
            ("MINIFLOW_DB", db.display().to_string()),
            ("MINIFLOW_RECEIVER", receiver.display().to_string()),
            ("MINIFLOW_CRASH", point.to_setting()),
        ];
        let process = child::spawn(
            "crash::child_transactional_receiver",
            "transactional_receiver",
            &settings,
        );
        let stdout = killed_output(process, &context);
        let killed = child::reported(&stdout, "killed_in")
            .unwrap_or_else(|| panic!("{context}: where it died is not known: {stdout}"));

        // Right after the crash: the effect of the transaction killed in flight is not there, its
        // key is still reserved, and every other effect has its completed record, and the reverse.
        let records = TransactionalReceiver::open(&receiver);
        let effects = count_by_command(
            &records.conn,
            "SELECT command_id, COUNT(*) FROM side_effects GROUP BY command_id",
        );
        assert!(
            !effects.contains_key(&killed),
            "{context}: the effect of {killed} outlived its transaction"
        );
        let record = records
            .keys
            .record(&IdempotencyKey::new(killed.as_str()).unwrap())
            .unwrap()
            .unwrap_or_else(|| panic!("{context}: {killed} has no reservation"));
        assert_eq!(record.state, RecordState::Reserved, "{context}: {killed}");
        let store = SqliteStore::open(&db).unwrap();
        for command in commands_and_results(&store, trips).0 {
            let id = command.command_id.to_string();
            let completed = records
                .keys
                .record(&IdempotencyKey::new(id.as_str()).unwrap())
                .unwrap()
                .is_some_and(|r| matches!(r.state, RecordState::Completed { .. }));
            assert_eq!(
                effects.get(&id).copied().unwrap_or(0),
                i64::from(completed),
                "{context}: {id}'s effect and its record disagree"
            );
        }
        drop(records);

        deliver_transactionally(&db, &receiver, None);
        check_results(&db, &receiver, trips, &context);
        let redone: i64 = Connection::open(&receiver)
            .unwrap()
            .query_row(
                "SELECT pid FROM side_effects WHERE command_id = ?1",
                [&killed],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(
            redone,
            i64::from(std::process::id()),
            "{context}: {killed}'s one effect is the redelivery's"
        );
    }
}

/// Starts a schedule `tick` every second on `start`; each occurrence decides one `record` command.
struct Ticking;

impl Workflow for Ticking {
    type State = ();

    fn evolve(&self, _: &mut (), _: &EventRecord) {}

    fn decide(&self, _: &(), event: &EventRecord) -> Decision {
        if let Some(Ok(tick)) = event.decode::<miniflow::ScheduleFired>() {
            let record = json!({ "scheduled_at": tick.scheduled_at, "missed": tick.missed });
            return Decision::new().command(Command::new("record", record));
        }
        match event.kind.as_str() {
            "start" => {
                Decision::new().schedule(miniflow::Schedule::every("tick", Duration::from_secs(1)))
            }
            _ => Decision::none(),
        }
    }
}

const TICKS: u64 = 5;
const TICK_T0: u64 = 1_700_000_000_000;

fn ticking() -> WorkflowId {
    WorkflowId::new("ticking").unwrap()
}

/// Takes and fires the schedule's occurrences at each of its `TICKS` seconds, in turn. (Taken for no
/// time, so that a restart at the same second takes again what a killed firer had taken.)
fn fire_ticks(store: &mut SqliteStore) {
    let engine = Engine::new(Ticking);
    for tick in 1..=TICKS {
        let now = miniflow::Timestamp::from_millis(TICK_T0 + tick * 1_000);
        for timer in store.claim_timers(10, Duration::ZERO, now).unwrap() {
            engine.fire(store, &timer, now).unwrap();
        }
    }
}

/// The schedule's state is whole: each occurrence up to the last fired one is accounted for once
/// (an event of its own, or counted as missed), and exactly one occurrence is armed: the one the
/// last event named (the first, when none fired). Returns the fired occurrences, in seconds.
fn check_schedule(store: &SqliteStore, context: &str) -> Vec<(u64, u64)> {
    let fired: Vec<miniflow::ScheduleFired> = store
        .load(&ticking())
        .unwrap()
        .iter()
        .filter_map(|e| e.decode::<miniflow::ScheduleFired>())
        .map(Result::unwrap)
        .collect();
    let seconds = |t: miniflow::Timestamp| (t.as_millis() - TICK_T0) / 1_000;
    let occurrences: Vec<(u64, u64)> = fired
        .iter()
        .map(|f| (seconds(f.scheduled_at), f.missed))
        .collect();
    let accounted: u64 = occurrences.iter().map(|(_, missed)| 1 + missed).sum();
    let last = occurrences.last().map_or(0, |(at, _)| *at);
    assert_eq!(
        accounted, last,
        "{context}: each occurrence once, in {occurrences:?}"
    );
    let armed: Vec<u64> = store
        .timers(&ticking())
        .unwrap()
        .iter()
        .filter(|t| t.status == TimerStatus::Scheduled)
        .map(|t| seconds(t.fire_at))
        .collect();
    assert_eq!(armed, [last + 1], "{context}: one armed occurrence");
    let commands = store.commands(&ticking()).unwrap();
    assert_eq!(
        commands.len(),
        fired.len(),
        "{context}: one command per event"
    );
    occurrences
}

#[test]
fn a_schedule_firer_killed_inside_any_commit_loses_no_occurrence_and_doubles_none() {
    let dir = tempfile::tempdir().unwrap();
    // Each second is a claim and a firing: two commits, ten in all.
    for nth in 1..=2 * TICKS {
        let db = dir.path().join(format!("ticks-{nth}.db"));
        let mut store = SqliteStore::open(&db).unwrap();
        let start = miniflow::Timestamp::from_millis(TICK_T0);
        Engine::new(Ticking)
            .handle(
                &mut store,
                &ticking(),
                Event::new("start", json!({})),
                start,
            )
            .unwrap();
        let settings = [
            ("MINIFLOW_DB", db.display().to_string()),
            ("MINIFLOW_CRASH_AT", nth.to_string()),
        ];
        assert_killed(
            child::spawn("crash::child_schedule_firer", "schedule-firer", &settings),
            "schedule firer",
        );
        let context = format!("killed inside commit {nth}");
        let before = check_schedule(&store, &context);
        assert_eq!(
            before.len() as u64,
            (nth - 1) / 2,
            "{context}: the firings committed before the kill, not the one killed"
        );
        // Restarted: the rest fires, each occurrence at its second, once.
        let mut store = SqliteStore::open(&db).unwrap();
        fire_ticks(&mut store);
        let after = check_schedule(&store, &context);
        assert_eq!(
            after,
            (1..=TICKS).map(|s| (s, 0)).collect::<Vec<_>>(),
            "{context}"
        );
    }
}

#[test]
fn child_schedule_firer() {
    if child::role().as_deref() != Some("schedule-firer") {
        return;
    }
    let mut store = SqliteStore::open(child::setting("MINIFLOW_DB")).unwrap();
    let nth = child::setting("MINIFLOW_CRASH_AT").parse().unwrap();
    kill_inside_commit(&store, nth, None, Arc::new(AtomicU64::new(0)));
    fire_ticks(&mut store);
}
