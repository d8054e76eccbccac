//! The dispatcher in one process: outcomes, panics, heartbeats, lost leases, shutdown, strict order.

use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use miniflow::{
    json, ClaimOrder, ClaimRequest, Clock, Command, CommandId, Commit, Delivery, Dispatcher, Event,
    ManualClock, Outcome, RetryPolicy, Seq, Settlement, SqliteStore, Status, Store, Timestamp,
    WorkflowId,
};

const T0: Timestamp = Timestamp::from_millis(1_700_000_000_000);

/// A store at `path` with one workflow per entry of `commands_per_workflow`.
fn seed(path: &Path, workflows: &[(&str, usize)]) -> SqliteStore {
    let mut store = SqliteStore::open(path).unwrap();
    for (workflow, count) in workflows {
        let commands: Vec<Command> = (0..*count)
            .map(|n| Command::new("deliver", json!({ "n": n })))
            .collect();
        let id = WorkflowId::new(*workflow).unwrap();
        let commit = Commit::new(
            id,
            Seq::ZERO,
            Event::new("start", json!({})),
            commands.into(),
            T0,
        )
        .unwrap();
        store.append_with_commands(&commit).unwrap();
    }
    store
}

fn cid(text: &str) -> CommandId {
    text.parse().unwrap()
}

#[test]
fn run_until_idle_delivers_every_command_once_when_all_succeed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flow.db");
    let store = seed(&path, &[("a", 40), ("b", 40), ("c", 40)]);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let stats = Dispatcher::sqlite(&path, move |d: &Delivery| {
        log.lock().unwrap().push(d.command_id.clone());
        Outcome::Done
    })
    .workers(3)
    .batch_size(7)
    .run_until_idle()
    .unwrap();
    let mut seen = seen.lock().unwrap().clone();
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), 120);
    assert_eq!(
        (stats.claimed, stats.completed, stats.store_errors),
        (120, 120, 0)
    );
    assert!(store.pending(usize::MAX).unwrap().is_empty());
}

#[test]
fn outcomes_settle_as_done_retry_or_dead_and_panics_do_not_kill_the_worker() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flow.db");
    let store = seed(&path, &[("w", 4)]);
    let clock = Arc::new(ManualClock::new(T0));
    let calls = Arc::new(AtomicU32::new(0));
    let counter = calls.clone();
    let settled = Arc::new(Mutex::new(Vec::new()));
    let record = settled.clone();
    let policy = RetryPolicy::default()
        .initial_delay(Duration::from_secs(1))
        .max_attempts(3)
        .jitter(0.0);
    let dispatcher = Dispatcher::sqlite(&path, move |d: &Delivery| {
        counter.fetch_add(1, Ordering::SeqCst);
        match d.command_id.index() {
            0 => Outcome::Done,
            1 if d.attempt == 1 => panic!("supplier client bug"),
            1 => Outcome::Done,
            2 => Outcome::retry("503 busy"),
            _ => Outcome::permanent("422 no such hotel"),
        }
    })
    .retry_policy(policy)
    .clock(clock.clone())
    .on_settled(move |d, s| {
        record
            .lock()
            .unwrap()
            .push((d.command_id.to_string(), d.attempt, s.clone()))
    });

    let first = dispatcher.run_until_idle().unwrap();
    assert_eq!(
        (first.completed, first.retried, first.dead, first.panics),
        (1, 2, 1, 1)
    );
    let row = store.command(&cid("w:1:1")).unwrap().unwrap();
    assert_eq!(row.status, Status::Pending);
    let error = row.last_error.unwrap();
    assert!(error.contains("supplier client bug"), "{error}");
    assert_eq!(
        row.available_at,
        T0 + Duration::from_secs(1),
        "backoff, not an immediate retry"
    );

    clock.advance(Duration::from_secs(1));
    dispatcher.run_until_idle().unwrap(); // w:1:1 done, w:1:2 fails again (attempt 2, backoff 2 s)
    clock.advance(Duration::from_secs(2));
    dispatcher.run_until_idle().unwrap(); // w:1:2 attempt 3: dead
    let dead: Vec<String> = store
        .dead_letters(10)
        .unwrap()
        .iter()
        .map(|r| r.command_id.to_string())
        .collect();
    assert_eq!(dead, ["w:1:2", "w:1:3"]);
    assert_eq!(
        store
            .command(&cid("w:1:2"))
            .unwrap()
            .unwrap()
            .last_error
            .as_deref(),
        Some("503 busy")
    );
    assert_eq!(
        store.command(&cid("w:1:1")).unwrap().unwrap().status,
        Status::Done
    );
    let settled = settled.lock().unwrap();
    let w12: Vec<_> = settled
        .iter()
        .filter(|(id, _, _)| id == "w:1:2")
        .map(|(_, a, s)| (*a, s.clone()))
        .collect();
    assert_eq!(
        w12,
        [
            (
                1,
                Settlement::RetryAt {
                    at: T0 + Duration::from_secs(1),
                    backoff: Duration::from_secs(1),
                    error: "503 busy".into()
                }
            ),
            (
                2,
                Settlement::RetryAt {
                    at: T0 + Duration::from_secs(3),
                    backoff: Duration::from_secs(2),
                    error: "503 busy".into()
                }
            ),
            (
                3,
                Settlement::Dead {
                    error: "503 busy".into()
                }
            ),
        ]
    );
    assert_eq!(calls.load(Ordering::SeqCst), 7);
}

#[test]
fn a_lost_lease_is_noticed_and_its_result_not_written() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flow.db");
    seed(&path, &[("w", 1)]);
    let clock = Arc::new(ManualClock::new(T0));
    let (rival_clock, rival_path) = (clock.clone(), path.clone());
    let rival_token = Arc::new(Mutex::new(None));
    let rival_slot = rival_token.clone();
    let stats = Dispatcher::sqlite(&path, move |_: &Delivery| {
        // The delivery stalls past its lease (no heartbeat tick in between: the TTL is a minute of
        // real time) and another worker takes the command over.
        rival_clock.advance(Duration::from_secs(61));
        let mut rival = SqliteStore::open(&rival_path).unwrap();
        let taken = rival
            .claim(
                &ClaimRequest::new("rival").lease_ttl(Duration::from_secs(60)),
                rival_clock.now(),
            )
            .unwrap();
        *rival_slot.lock().unwrap() = Some(taken[0].token);
        Outcome::Done
    })
    .clock(clock.clone())
    .lease_ttl(Duration::from_secs(60))
    .run_until_idle()
    .unwrap();
    assert_eq!((stats.completed, stats.lost_leases), (0, 1));
    let store = SqliteStore::open(&path).unwrap();
    let row = store.command(&cid("w:1:0")).unwrap().unwrap();
    assert_eq!(
        row.status,
        Status::Leased,
        "the stale result was not written"
    );
    let lease = row.lease.unwrap();
    assert_eq!(
        (lease.owner.as_str(), Some(lease.token)),
        ("rival", *rival_token.lock().unwrap())
    );
}

#[test]
fn the_heartbeat_keeps_a_long_delivery_leased() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flow.db");
    seed(&path, &[("w", 1)]);
    let rival_path = path.clone();
    let stolen = Arc::new(AtomicU32::new(0));
    let steals = stolen.clone();
    let stats = Dispatcher::sqlite(&path, move |_: &Delivery| {
        let mut rival = SqliteStore::open(&rival_path).unwrap();
        for _ in 0..8 {
            std::thread::sleep(Duration::from_millis(100));
            let now = miniflow::SystemClock.now();
            steals.fetch_add(
                rival.claim(&ClaimRequest::new("rival"), now).unwrap().len() as u32,
                Ordering::SeqCst,
            );
        }
        Outcome::Done
    })
    .lease_ttl(Duration::from_millis(400))
    .run_until_idle()
    .unwrap();
    assert_eq!(
        stolen.load(Ordering::SeqCst),
        0,
        "the lease expired under a live delivery"
    );
    assert_eq!((stats.completed, stats.lost_leases), (1, 0));
}

#[test]
fn shutdown_finishes_the_delivery_in_hand_and_gives_back_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flow.db");
    let store = seed(&path, &[("w", 10)]);
    let (started_tx, started_rx) = std::sync::mpsc::channel();
    let started_tx = Mutex::new(started_tx);
    let running = Dispatcher::sqlite(&path, move |_: &Delivery| {
        let _ = started_tx.lock().unwrap().send(());
        std::thread::sleep(Duration::from_millis(150));
        Outcome::Done
    })
    .batch_size(10)
    .start()
    .unwrap();
    started_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    let shutdown = running.shutdown(Duration::from_secs(5));
    assert_eq!(shutdown.unfinished_workers, 0);
    assert!(shutdown.errors.is_empty());
    assert_eq!((shutdown.stats.completed, shutdown.stats.released), (1, 9));
    let pending = store.pending(usize::MAX).unwrap();
    assert_eq!(pending.len(), 9);
    assert!(pending
        .iter()
        .all(|r| r.status == Status::Pending && r.attempts == 0));
}

#[test]
fn strict_order_delivers_a_workflows_commands_one_after_another() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flow.db");
    seed(&path, &[("a", 15), ("b", 15)]);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    Dispatcher::sqlite(&path, move |d: &Delivery| {
        log.lock()
            .unwrap()
            .push((d.command_id.workflow_id().to_string(), d.command_id.index()));
        std::thread::sleep(Duration::from_millis(1));
        Outcome::Done
    })
    .workers(4)
    .batch_size(8)
    .order(ClaimOrder::StrictPerWorkflow)
    .run_until_idle()
    .unwrap();
    let seen = seen.lock().unwrap();
    for workflow in ["a", "b"] {
        let order: Vec<u32> = seen
            .iter()
            .filter(|(w, _)| w == workflow)
            .map(|(_, i)| *i)
            .collect();
        assert_eq!(order, (0..15).collect::<Vec<_>>(), "workflow {workflow}");
    }
}

/// Sets a 10 s timer on `start`; the fired timer decides a `wake` command.
struct Alarm;

impl miniflow::Workflow for Alarm {
    type State = ();

    fn evolve(&self, _: &mut (), _: &miniflow::EventRecord) {}

    fn decide(&self, _: &(), event: &miniflow::EventRecord) -> miniflow::Decision {
        match event.kind.as_str() {
            "start" => miniflow::Decision::new().timer(miniflow::Timer::after(
                "alarm",
                Duration::from_secs(10),
                json!({}),
            )),
            miniflow::TIMER_FIRED => {
                miniflow::Decision::new().command(Command::new("wake", json!({})))
            }
            _ => miniflow::Decision::none(),
        }
    }
}

#[test]
fn a_dispatcher_with_a_workflow_fires_due_timers_and_delivers_what_they_decide() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flow.db");
    let mut store = SqliteStore::open(&path).unwrap();
    let alarm = WorkflowId::new("alarm").unwrap();
    miniflow::Engine::new(Alarm)
        .handle(&mut store, &alarm, Event::new("start", json!({})), T0)
        .unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let delivered = Arc::new(Mutex::new(Vec::new()));
    let log = delivered.clone();
    let handler = move |d: &Delivery| {
        log.lock().unwrap().push(d.command_id.to_string());
        Outcome::Done
    };

    let without = Dispatcher::sqlite(&path, handler.clone()).clock(clock.clone());
    clock.advance(Duration::from_secs(60));
    assert_eq!(
        without.run_until_idle().unwrap().timers_fired,
        0,
        "no workflow, no firing"
    );
    assert_eq!(
        store.timers(&alarm).unwrap()[0].status,
        miniflow::TimerStatus::Scheduled
    );

    let with = Dispatcher::sqlite(&path, handler)
        .clock(clock.clone())
        .workflow(miniflow::Engine::new(Alarm))
        .workers(3);
    let stats = with.run_until_idle().unwrap();
    assert_eq!((stats.timers_fired, stats.completed), (1, 1));
    assert_eq!(*delivered.lock().unwrap(), ["alarm:2:0"]);
    assert_eq!(
        store.timers(&alarm).unwrap()[0].status,
        miniflow::TimerStatus::Fired
    );
    assert_eq!(with.run_until_idle().unwrap().timers_fired, 0, "fired once");
}
