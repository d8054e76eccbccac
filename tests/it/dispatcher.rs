//! The dispatcher in one process: outcomes, panics, heartbeats, lost leases, shutdown, strict order,
//! configuration bounds, failing stores, timers whose workflow panics or rejects, and recurring
//! schedules.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use miniflow::prelude::*;
use miniflow::{
    json, Ack, ClaimOrder, ClaimRequest, Clock, Command, CommandId, Commit, Decision, Delivery,
    Dispatcher, Engine, Error, Event, EventRecord, Extended, Failure, ManualClock, MemoryStore,
    OutboxRow, Outcome, RetryPolicy, Seq, Settled, Settlement, SqliteStore, Status, Timer, TimerId,
    TimerRow, TimerStatus, Timestamp, Value, Workflow, WorkflowId, TIMER_FIRED,
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

/// The heartbeat extends every lease a worker holds in one store call a tick, not one call a
/// lease: a batch whose first delivery is slow keeps all its leases through `extend_all`.
#[test]
fn the_heartbeat_extends_a_batchs_leases_in_one_call() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flow.db");
    seed(&path, &[("w", 4)]);
    let faults = Arc::new(Faults::default());
    let stats = Flaky::dispatcher(&path, &faults, |delivery: &Delivery| {
        if delivery.command_id == cid("w:1:0") {
            std::thread::sleep(Duration::from_millis(600));
        }
        Outcome::Done
    })
    .batch_size(4)
    .lease_ttl(Duration::from_millis(200))
    .run_until_idle()
    .unwrap();
    assert_eq!((stats.completed, stats.lost_leases), (4, 0), "{stats:?}");
    assert_eq!(
        faults.extends.load(Ordering::SeqCst),
        0,
        "no lease on its own"
    );
    let calls = faults.extend_alls.lock().unwrap().clone();
    assert!(
        calls.contains(&4),
        "the batch's four leases in one call: {calls:?}"
    );
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

/// A shutdown lets the delivery in hand finish, and the heartbeat keeps its lease meanwhile: a rival
/// claiming all along gets nothing, however long the delivery runs past its lease's TTL.
#[test]
fn a_shutdown_keeps_the_lease_of_the_delivery_it_lets_finish() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flow.db");
    let store = seed(&path, &[("w", 1)]);
    let (started_tx, started_rx) = mpsc::channel();
    let started_tx = Mutex::new(started_tx);
    let running = Dispatcher::sqlite(&path, move |_: &Delivery| {
        let _ = started_tx.lock().unwrap().send(());
        std::thread::sleep(Duration::from_millis(900));
        Outcome::Done
    })
    .lease_ttl(Duration::from_millis(200))
    .start()
    .unwrap();
    started_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    let rival_path = path.clone();
    let rival = std::thread::spawn(move || {
        let mut rival = SqliteStore::open(&rival_path).unwrap();
        let mut stolen = 0;
        for _ in 0..12 {
            std::thread::sleep(Duration::from_millis(75));
            let now = miniflow::SystemClock.now();
            stolen += rival.claim(&ClaimRequest::new("rival"), now).unwrap().len();
        }
        stolen
    });
    let shutdown = running.shutdown(Duration::from_secs(10));
    assert_eq!(
        rival.join().unwrap(),
        0,
        "the lease ran out while the shutdown waited for its delivery"
    );
    assert_eq!(shutdown.unfinished_workers, 0);
    assert_eq!(
        (shutdown.stats.completed, shutdown.stats.lost_leases),
        (1, 0)
    );
    let row = store.command(&cid("w:1:0")).unwrap().unwrap();
    assert_eq!((row.status, row.attempts), (Status::Done, 1));
}

/// A handler that runs long does not hold back the acks of the deliveries before it in its batch:
/// once they have waited `ack_delay`, they are written while it still runs, and each is reported
/// once, as completed, when it returns.
#[test]
fn a_long_handler_does_not_hold_back_the_acks_before_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flow.db");
    let store = seed(&path, &[("w", 3)]);
    let (entered, in_slow) = mpsc::channel();
    let (release, released) = mpsc::channel::<()>();
    let (entered, released) = (Mutex::new(entered), Mutex::new(released));
    let settled = Arc::new(Mutex::new(Vec::new()));
    let log = settled.clone();
    let running = Dispatcher::sqlite(&path, move |d: &Delivery| {
        if d.command_id == cid("w:1:2") {
            entered.lock().unwrap().send(()).unwrap();
            released
                .lock()
                .unwrap()
                .recv_timeout(Duration::from_secs(30))
                .unwrap();
        }
        Outcome::Done
    })
    .batch_size(3)
    .ack_delay(Duration::from_millis(20))
    .on_settled(move |d: &Delivery, s: &Settlement| {
        log.lock()
            .unwrap()
            .push((d.command_id.to_string(), s.clone()));
    })
    .start()
    .unwrap();
    in_slow.recv_timeout(Duration::from_secs(10)).unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    let status = |id: &str| store.command(&cid(id)).unwrap().unwrap().status;
    while status("w:1:0") != Status::Done || status("w:1:1") != Status::Done {
        assert!(
            Instant::now() < until,
            "the acks before the long handler waited for it"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(status("w:1:2"), Status::Leased, "the long one still runs");
    release.send(()).unwrap();
    let shutdown = running.shutdown(Duration::from_secs(10));
    assert!(shutdown.errors.is_empty(), "{:?}", shutdown.errors);
    assert_eq!(
        (shutdown.stats.completed, shutdown.stats.store_errors),
        (3, 0)
    );
    assert_eq!(status("w:1:2"), Status::Done);
    let mut settled = settled.lock().unwrap().clone();
    settled.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        settled,
        ["w:1:0", "w:1:1", "w:1:2"].map(|id| (id.to_owned(), Settlement::Completed)),
        "each reported once"
    );
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

/// Reads a meter every minute from `install` until `remove`: each occurrence decides a `read`.
struct Meter;

impl Workflow for Meter {
    type State = ();

    fn evolve(&self, _: &mut (), _: &EventRecord) {}

    fn decide(&self, _: &(), event: &EventRecord) -> Decision {
        if let Some(Ok(tick)) = event.decode::<miniflow::ScheduleFired>() {
            let reading = json!({ "scheduled_at": tick.scheduled_at, "missed": tick.missed });
            return Decision::new().command(Command::new("read", reading));
        }
        match event.kind.as_str() {
            "install" => Decision::new().schedule(miniflow::Schedule::every(
                "reading",
                Duration::from_secs(60),
            )),
            "remove" => Decision::new().cancel_schedule("reading"),
            _ => Decision::none(),
        }
    }
}

#[test]
fn a_dispatcher_fires_each_occurrence_of_a_schedule_once_and_one_for_an_outage() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flow.db");
    let mut store = SqliteStore::open(&path).unwrap();
    let meter = WorkflowId::new("meter-7").unwrap();
    let engine = Engine::new(Meter);
    engine
        .handle(&mut store, &meter, Event::new("install", json!({})), T0)
        .unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let readings = Arc::new(Mutex::new(Vec::new()));
    let log = readings.clone();
    let handler = move |d: &Delivery| {
        let minute = (d.payload["scheduled_at"].as_u64().unwrap() - T0.as_millis()) / 60_000;
        log.lock()
            .unwrap()
            .push((minute, d.payload["missed"].as_u64().unwrap()));
        Outcome::Done
    };
    let dispatcher = Dispatcher::sqlite(&path, handler)
        .clock(clock.clone())
        .workflow(Engine::new(Meter))
        .workers(2);
    for _ in 0..3 {
        assert_eq!(
            dispatcher.run_until_idle().unwrap().timers_fired,
            0,
            "not yet"
        );
        clock.advance(Duration::from_secs(60));
        let stats = dispatcher.run_until_idle().unwrap();
        assert_eq!((stats.timers_fired, stats.completed), (1, 1));
    }
    // The host is down from minute 3 to minute 13 and a half: one reading, for minute 13.
    clock.advance(Duration::from_secs(630));
    let stats = dispatcher.run_until_idle().unwrap();
    assert_eq!((stats.timers_fired, stats.completed), (1, 1));
    assert_eq!(*readings.lock().unwrap(), [(1, 0), (2, 0), (3, 0), (13, 9)]);
    engine
        .handle(
            &mut store,
            &meter,
            Event::new("remove", json!({})),
            clock.now(),
        )
        .unwrap();
    clock.advance(Duration::from_secs(3_600));
    assert_eq!(
        dispatcher.run_until_idle().unwrap().timers_fired,
        0,
        "stopped"
    );
    let states: Vec<TimerStatus> = store
        .timers(&meter)
        .unwrap()
        .iter()
        .map(|t| t.status)
        .collect();
    assert_eq!(
        states,
        [
            TimerStatus::Fired,
            TimerStatus::Fired,
            TimerStatus::Fired,
            TimerStatus::Fired,
            TimerStatus::Cancelled
        ]
    );
}

/// Runs `f` on a thread of its own and fails the test if it does not finish within `secs` seconds: a
/// dispatcher that spins must fail the test, not hang it.
fn finishes_within<T: Send + 'static>(secs: u64, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(secs))
        .unwrap_or_else(|_| panic!("did not return within {secs} s"))
}

/// The field of an [`Error::InvalidInput`], or what else came back.
fn refused_field<T: std::fmt::Debug>(result: Result<T, Error>) -> String {
    match result {
        Err(Error::InvalidInput { field, .. }) => field.to_owned(),
        other => format!("not refused: {other:?}"),
    }
}

#[test]
fn settings_out_of_bounds_are_refused_naming_them_before_anything_starts() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flow.db");
    seed(&path, &[("w", 1)]);
    let opened = Arc::new(AtomicU32::new(0));
    let dispatcher = || {
        let (path, opened) = (path.clone(), opened.clone());
        Dispatcher::new(
            move || {
                opened.fetch_add(1, Ordering::SeqCst);
                SqliteStore::open(&path)
            },
            |_: &Delivery| Outcome::Done,
        )
    };
    type Setting = fn(Dispatcher<SqliteStore>) -> Dispatcher<SqliteStore>;
    let cases: Vec<(Setting, &str)> = vec![
        (|d| d.lease_ttl(Duration::MAX), "lease_ttl"),
        (
            |d| d.lease_ttl(Duration::from_secs(24 * 3600 + 1)),
            "lease_ttl",
        ),
        (|d| d.lease_ttl(Duration::ZERO), "lease_ttl"),
        (|d| d.lease_ttl(Duration::from_millis(3)), "lease_ttl"),
        (|d| d.workers(0), "workers"),
        (|d| d.workers(257), "workers"),
        (|d| d.batch_size(0), "batch_size"),
        (|d| d.batch_size(1_001), "batch_size"),
        (|d| d.poll_interval(Duration::ZERO), "poll_interval"),
        (
            |d| d.poll_interval(Duration::from_secs(61)),
            "poll_interval",
        ),
        (|d| d.ack_delay(Duration::from_secs(61)), "ack_delay"),
        (|d| d.name("night\nshift"), "worker"),
        (|d| d.name("w".repeat(130)), "worker"),
        (
            |d| d.retry_policy(RetryPolicy::default().multiplier(f64::NAN)),
            "retry_policy.multiplier",
        ),
        (
            |d| d.retry_policy(RetryPolicy::default().multiplier(0.5)),
            "retry_policy.multiplier",
        ),
        (
            |d| d.retry_policy(RetryPolicy::default().max_delay(Duration::MAX)),
            "retry_policy.max_delay",
        ),
        (
            |d| d.retry_policy(RetryPolicy::default().initial_delay(Duration::from_secs(3600))),
            "retry_policy.max_delay",
        ),
    ];
    for (setting, field) in cases {
        assert_eq!(refused_field(setting(dispatcher()).run_until_idle()), field);
        assert_eq!(
            refused_field(setting(dispatcher()).start().map(drop)),
            field
        );
    }
    assert_eq!(opened.load(Ordering::SeqCst), 0, "no store was opened");
    let error = dispatcher()
        .lease_ttl(Duration::MAX)
        .run_until_idle()
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("lease_ttl") && error.contains("18446744073709551615"),
        "names the setting and its value: {error}"
    );
    let edges = dispatcher()
        .workers(256)
        .batch_size(1_000)
        .lease_ttl(Duration::from_secs(24 * 3600))
        .poll_interval(Duration::from_millis(1))
        .ack_delay(Duration::ZERO);
    assert_eq!(
        edges.run_until_idle().unwrap().completed,
        1,
        "the bounds are inclusive"
    );
}

#[test]
fn every_store_refuses_a_claim_out_of_bounds_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut sqlite = seed(&dir.path().join("flow.db"), &[("w", 1)]);
    let mut memory = MemoryStore::new();
    let commit = Commit::new(
        WorkflowId::new("w").unwrap(),
        Seq::ZERO,
        Event::new("start", json!({})),
        vec![Command::new("deliver", json!({}))].into(),
        T0,
    )
    .unwrap();
    memory.append_with_commands(&commit).unwrap();
    let requests = [
        (
            ClaimRequest::new("w1").lease_ttl(Duration::MAX),
            "lease_ttl",
        ),
        (ClaimRequest::new("w1").limit(0), "limit"),
        (ClaimRequest::new("w1").limit(usize::MAX), "limit"),
        (ClaimRequest::new("night\u{1b}[2Jshift"), "worker"),
    ];
    let stores: [&mut dyn Store; 2] = [&mut sqlite, &mut memory];
    for store in stores {
        for (request, field) in &requests {
            assert_eq!(refused_field(store.claim(request, T0)), *field);
        }
        let row = store.command(&cid("w:1:0")).unwrap().unwrap();
        assert_eq!((row.status, row.attempts), (Status::Pending, 0));
    }
}

/// What a [`Flaky`] store is told to do, shared with the test.
#[derive(Default)]
struct Faults {
    /// `claim` calls so far.
    claims: AtomicU32,
    /// The next this many claims fail (`u32::MAX`: every one).
    failing_claims: AtomicU32,
    /// The next this many `complete_all` calls fail (`u32::MAX`: every one).
    failing_completes: AtomicU32,
    /// Fail with [`Error::Busy`] instead of [`Error::Storage`].
    busy: AtomicBool,
    /// how opening a store on the ack thread (`*-acks`) goes: 0 opens, 1 fails, 2 panics,
    /// 3 fails after 1 s.
    acks_open: AtomicU8,
    /// `complete_all` on the ack thread fails (with `busy` deciding the kind).
    acks_complete_fails: AtomicBool,
    /// `complete_all` calls on the ack thread.
    acks_completes: AtomicU32,
    /// `extend` calls (one lease each).
    extends: AtomicU32,
    /// How many leases each `extend_all` call extended.
    extend_alls: Mutex<Vec<usize>>,
}

fn on_acks_thread() -> bool {
    std::thread::current()
        .name()
        .is_some_and(|n| n.ends_with("-acks"))
}

impl Faults {
    fn fail_claims(&self, times: u32) {
        self.failing_claims.store(times, Ordering::SeqCst);
    }

    fn claims(&self) -> u32 {
        self.claims.load(Ordering::SeqCst)
    }

    /// The error for this call, if `counter` says it fails.
    fn fault(&self, counter: &AtomicU32) -> Option<Error> {
        let failing = counter
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| match n {
                0 => None,
                u32::MAX => Some(n),
                n => Some(n - 1),
            })
            .is_ok();
        failing.then(|| {
            if self.busy.load(Ordering::SeqCst) {
                Error::Busy("database is locked".into())
            } else {
                Error::Storage("disk I/O error".into())
            }
        })
    }
}

/// A SQLite store whose claims and acks fail when its [`Faults`] say so.
struct Flaky {
    inner: SqliteStore,
    faults: Arc<Faults>,
}

impl Flaky {
    /// A dispatcher over `path` whose stores fail as `faults` say.
    fn dispatcher(
        path: &Path,
        faults: &Arc<Faults>,
        handler: impl miniflow::Handler,
    ) -> Dispatcher<Flaky> {
        let (path, faults) = (path.to_path_buf(), faults.clone());
        Dispatcher::new(
            move || {
                if on_acks_thread() {
                    match faults.acks_open.load(Ordering::SeqCst) {
                        1 => return Err(Error::Storage("acks: cannot open".into())),
                        2 => panic!("acks: opener panicked"),
                        3 => {
                            std::thread::sleep(Duration::from_secs(1));
                            return Err(Error::Storage("acks: slow open failed".into()));
                        }
                        _ => {}
                    }
                }
                Ok(Flaky {
                    inner: SqliteStore::open(&path)?,
                    faults: faults.clone(),
                })
            },
            handler,
        )
    }
}

impl EventLog for Flaky {
    fn load(&self, workflow_id: &WorkflowId) -> Result<Vec<EventRecord>, Error> {
        self.inner.load(workflow_id)
    }
    fn append_with_commands(&mut self, commit: &Commit) -> Result<(), Error> {
        self.inner.append_with_commands(commit)
    }
}

impl Outbox for Flaky {
    fn pending(&self, limit: usize) -> Result<Vec<OutboxRow>, Error> {
        self.inner.pending(limit)
    }
    fn command(&self, command_id: &CommandId) -> Result<Option<OutboxRow>, Error> {
        self.inner.command(command_id)
    }
    fn commands(&self, workflow_id: &WorkflowId) -> Result<Vec<OutboxRow>, Error> {
        self.inner.commands(workflow_id)
    }
    fn mark_done(&mut self, command_id: &CommandId, now: Timestamp) -> Result<(), Error> {
        self.inner.mark_done(command_id, now)
    }
    fn claim(&mut self, request: &ClaimRequest, now: Timestamp) -> Result<Vec<Delivery>, Error> {
        self.faults.claims.fetch_add(1, Ordering::SeqCst);
        match self.faults.fault(&self.faults.failing_claims) {
            Some(error) => Err(error),
            None => self.inner.claim(request, now),
        }
    }
    fn extend(
        &mut self,
        command_id: &CommandId,
        token: u64,
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Extended, Error> {
        self.faults.extends.fetch_add(1, Ordering::SeqCst);
        self.inner.extend(command_id, token, ttl, now)
    }
    fn extend_all(
        &mut self,
        leases: &[(CommandId, u64)],
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Vec<Result<Extended, Error>>, Error> {
        self.faults.extend_alls.lock().unwrap().push(leases.len());
        self.inner.extend_all(leases, ttl, now)
    }
    fn release(&mut self, command_id: &CommandId, token: u64, now: Timestamp) -> Result<(), Error> {
        self.inner.release(command_id, token, now)
    }
    fn complete(
        &mut self,
        command_id: &CommandId,
        token: u64,
        result: Option<&Value>,
        now: Timestamp,
    ) -> Result<(), Error> {
        self.inner.complete(command_id, token, result, now)
    }
    fn complete_all(
        &mut self,
        acks: Vec<Ack>,
        now: Timestamp,
    ) -> Result<Vec<Result<(), Error>>, Error> {
        if on_acks_thread() {
            self.faults.acks_completes.fetch_add(1, Ordering::SeqCst);
            if self.faults.acks_complete_fails.load(Ordering::SeqCst) {
                return Err(if self.faults.busy.load(Ordering::SeqCst) {
                    Error::Busy("acks: database is locked".into())
                } else {
                    Error::Storage("acks: disk I/O error".into())
                });
            }
        }
        match self.faults.fault(&self.faults.failing_completes) {
            Some(error) => Err(error),
            None => self.inner.complete_all(acks, now),
        }
    }
    fn fail(
        &mut self,
        command_id: &CommandId,
        token: u64,
        failure: &Failure,
        policy: &RetryPolicy,
        now: Timestamp,
    ) -> Result<Settled, Error> {
        self.inner.fail(command_id, token, failure, policy, now)
    }
}

impl Timers for Flaky {
    fn claim_timers(
        &mut self,
        limit: usize,
        lease_ttl: Duration,
        now: Timestamp,
    ) -> Result<Vec<TimerRow>, Error> {
        self.inner.claim_timers(limit, lease_ttl, now)
    }
    fn reject_timer(&mut self, id: &TimerId, reason: &str, now: Timestamp) -> Result<(), Error> {
        self.inner.reject_timer(id, reason, now)
    }
    fn timers(&self, workflow_id: &WorkflowId) -> Result<Vec<TimerRow>, Error> {
        self.inner.timers(workflow_id)
    }
}

impl Operations for Flaky {
    fn purge_done(
        &mut self,
        older_than: Duration,
        now: Timestamp,
        batch: usize,
    ) -> Result<usize, Error> {
        self.inner.purge_done(older_than, now, batch)
    }
    fn dead_letters(&self, limit: usize) -> Result<Vec<OutboxRow>, Error> {
        self.inner.dead_letters(limit)
    }
    fn retry(&mut self, command_id: &CommandId, now: Timestamp) -> Result<(), Error> {
        self.inner.retry(command_id, now)
    }
    fn resolve(&mut self, command_id: &CommandId, note: &str, now: Timestamp) -> Result<(), Error> {
        self.inner.resolve(command_id, note, now)
    }
    fn stats(&self, now: Timestamp) -> Result<miniflow::OutboxStats, Error> {
        self.inner.stats(now)
    }
    fn kind_controls(&self) -> Result<Vec<miniflow::KindControl>, Error> {
        self.inner.kind_controls()
    }
    fn control_kind(
        &mut self,
        kind: &str,
        change: miniflow::KindChange,
        by: &str,
        now: Timestamp,
    ) -> Result<miniflow::KindControl, Error> {
        self.inner.control_kind(kind, change, by, now)
    }
    fn dead_letters_of_kind(&self, kind: &str, limit: usize) -> Result<Vec<OutboxRow>, Error> {
        self.inner.dead_letters_of_kind(kind, limit)
    }
    fn retry_dead_of_kind(
        &mut self,
        kind: &str,
        batch: usize,
        now: Timestamp,
    ) -> Result<Vec<CommandId>, Error> {
        self.inner.retry_dead_of_kind(kind, batch, now)
    }
    fn resolve_dead_of_kind(
        &mut self,
        kind: &str,
        note: &str,
        batch: usize,
        now: Timestamp,
    ) -> Result<Vec<CommandId>, Error> {
        self.inner.resolve_dead_of_kind(kind, note, batch, now)
    }
}

/// An `on_error` hook that keeps what it is given, as text.
fn error_log() -> (
    Arc<Mutex<Vec<String>>>,
    impl Fn(&Error) + Send + Sync + 'static,
) {
    let log = Arc::new(Mutex::new(Vec::new()));
    let keep = log.clone();
    (log, move |e: &Error| {
        // The once-per-dispatcher notices of configuration (a result nobody asked for, feedback
        // nobody fires) have tests of their own; these tests count store errors.
        let text = e.to_string();
        if !text.ends_with("(reported once per dispatcher)") {
            keep.lock().unwrap().push(text)
        }
    })
}

/// A handler that did its work but returns a result no store keeps: the command is completed without
/// the result (its effect is neither repeated by a redelivery nor compensated by a failure), and the
/// refusal is reported naming the command.
#[test]
fn a_result_past_the_limits_completes_the_command_without_it_and_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flow.db");
    let store = seed(&path, &[("w", 2)]);
    let calls = Arc::new(AtomicU32::new(0));
    let counted = calls.clone();
    let (errors, on_error) = error_log();
    let clock = Arc::new(ManualClock::new(T0));
    let stats = Dispatcher::sqlite(&path, move |d: &Delivery| {
        counted.fetch_add(1, Ordering::SeqCst);
        match d.command_id.index() {
            0 => Outcome::done_with(json!("x".repeat(2 << 20))),
            _ => Outcome::done_with(json!({ "kept": true })),
        }
    })
    .clock(clock.clone())
    .on_error(on_error)
    .run_until_idle()
    .unwrap();
    // Past every lease it could have held: nothing comes back.
    clock.advance(Duration::from_secs(3_600));
    let again = Dispatcher::sqlite(&path, |_: &Delivery| Outcome::Done)
        .clock(clock)
        .run_until_idle()
        .unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 2, "each delivered once");
    assert_eq!((stats.completed, stats.store_errors), (2, 0), "{stats:?}");
    assert_eq!(again.claimed, 0, "{again:?}");
    let row = |id: &str| store.command(&cid(id)).unwrap().unwrap();
    assert_eq!(
        (row("w:1:0").status, row("w:1:0").result),
        (Status::Done, None)
    );
    assert_eq!(row("w:1:1").result, Some(json!({ "kept": true })));
    let errors = errors.lock().unwrap();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].contains("w:1:0") && errors[0].contains("completed without it"),
        "{errors:?}"
    );
}

#[test]
fn run_until_idle_returns_a_storage_error_at_once_and_reports_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flow.db");
    seed(&path, &[("w", 3)]);
    let faults = Arc::new(Faults::default());
    faults.fail_claims(u32::MAX); // a full disk, a corrupt row: every claim fails
    let (errors, on_error) = error_log();
    let dispatcher = Flaky::dispatcher(&path, &faults, |_: &Delivery| Outcome::Done)
        .workers(2)
        .on_error(on_error);
    let result = finishes_within(10, move || dispatcher.run_until_idle());
    assert!(matches!(result, Err(Error::Storage(_))), "{result:?}");
    let claims = faults.claims();
    assert!(
        (1..=2).contains(&claims),
        "one failed claim per worker, not a loop: {claims}"
    );
    let errors = errors.lock().unwrap();
    assert_eq!(errors.len(), claims as usize, "each failure reported once");
    assert!(
        errors.iter().all(|e| e.contains("disk I/O error")),
        "{errors:?}"
    );
}

#[test]
fn run_until_idle_backs_off_on_a_busy_store_then_gives_up_returning_busy() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flow.db");
    seed(&path, &[("w", 1)]);
    let faults = Arc::new(Faults::default());
    faults.busy.store(true, Ordering::SeqCst);
    faults.fail_claims(u32::MAX);
    let (errors, on_error) = error_log();
    let dispatcher = Flaky::dispatcher(&path, &faults, |_: &Delivery| Outcome::Done)
        .poll_interval(Duration::from_millis(1))
        .on_error(on_error);
    let started = Instant::now();
    let result = finishes_within(30, move || dispatcher.run_until_idle());
    let elapsed = started.elapsed();
    assert!(matches!(result, Err(Error::Busy(_))), "{result:?}");
    assert_eq!(faults.claims(), 8, "gives up after 8 busy claims in a row");
    assert_eq!(errors.lock().unwrap().len(), 8);
    // Pauses of 1, 2, 4 … 64 ms between the 8 tries: a tight loop would be done in a few ms.
    assert!(
        elapsed >= Duration::from_millis(127),
        "backed off: {elapsed:?}"
    );
}

#[test]
fn a_store_that_recovers_is_ridden_out_and_its_errors_counted() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flow.db");
    seed(&path, &[("w", 5)]);
    let faults = Arc::new(Faults::default());
    faults.busy.store(true, Ordering::SeqCst);
    faults.fail_claims(5);
    let (errors, on_error) = error_log();
    let stats = Flaky::dispatcher(&path, &faults, |_: &Delivery| Outcome::Done)
        .poll_interval(Duration::from_millis(1))
        .on_error(on_error)
        .run_until_idle()
        .unwrap();
    assert_eq!((stats.store_errors, stats.completed), (5, 5));
    assert_eq!(errors.lock().unwrap().len(), 5);
}

#[test]
fn run_until_idle_returns_an_ack_that_cannot_be_written_and_the_command_comes_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flow.db");
    let store = seed(&path, &[("w", 3)]);
    let faults = Arc::new(Faults::default());
    faults.failing_completes.store(u32::MAX, Ordering::SeqCst);
    let clock = Arc::new(ManualClock::new(T0));
    let calls = Arc::new(AtomicU32::new(0));
    let counter = calls.clone();
    let settled = Arc::new(Mutex::new(Vec::new()));
    let record = settled.clone();
    let dispatcher = Flaky::dispatcher(&path, &faults, move |_: &Delivery| {
        counter.fetch_add(1, Ordering::SeqCst);
        Outcome::Done
    })
    .clock(clock.clone())
    .batch_size(3)
    .ack_delay(Duration::ZERO)
    .on_settled(move |d, s| {
        record
            .lock()
            .unwrap()
            .push((d.command_id.to_string(), s.clone()))
    });
    let result = dispatcher.run_until_idle();
    assert!(matches!(result, Err(Error::Storage(_))), "{result:?}");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "stops after the first lost ack"
    );
    assert_eq!(
        *settled.lock().unwrap(),
        [
            ("w:1:1".to_owned(), Settlement::Released),
            ("w:1:2".to_owned(), Settlement::Released)
        ],
        "the rest of the batch is given back undelivered"
    );
    let rows = store.pending(10).unwrap();
    assert_eq!(
        rows[0].status,
        Status::Leased,
        "its lease runs out, then it is delivered again"
    );
    assert!(
        rows[1..]
            .iter()
            .all(|r| r.status == Status::Pending && r.attempts == 0),
        "{rows:?}"
    );
}

#[test]
fn a_started_dispatcher_backs_off_from_a_failing_store_reports_it_and_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flow.db");
    seed(&path, &[("w", 1)]);
    let faults = Arc::new(Faults::default());
    faults.fail_claims(u32::MAX);
    let (error_tx, error_rx) = mpsc::channel();
    let error_tx = Mutex::new(error_tx);
    let (done_tx, done_rx) = mpsc::channel();
    let done_tx = Mutex::new(done_tx);
    let running = Flaky::dispatcher(&path, &faults, |_: &Delivery| Outcome::Done)
        .poll_interval(Duration::from_millis(2))
        .on_error(move |e| {
            let _ = error_tx
                .lock()
                .unwrap()
                .send((Instant::now(), e.to_string()));
        })
        .on_settled(move |d, s| {
            let _ = done_tx
                .lock()
                .unwrap()
                .send((d.command_id.to_string(), s.clone()));
        })
        .start()
        .unwrap();
    let reported: Vec<(Instant, String)> = (0..6)
        .map(|_| error_rx.recv_timeout(Duration::from_secs(10)).unwrap())
        .collect();
    assert!(reported.iter().all(|(_, e)| e.contains("disk I/O error")));
    let spread = reported[5].0 - reported[0].0;
    // Pauses of 2, 4, 8, 16, 32 ms between the first six tries; a fixed 2 ms pause would take 10 ms.
    assert!(
        spread >= Duration::from_millis(62),
        "backed off: {spread:?}"
    );
    faults.fail_claims(0); // the disk has room again
    let (id, settlement) = done_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!((id.as_str(), settlement), ("w:1:0", Settlement::Completed));
    let shutdown = running.shutdown(Duration::from_secs(5));
    assert!(
        shutdown.errors.is_empty(),
        "a started dispatcher rides errors out"
    );
    assert_eq!(shutdown.stats.completed, 1);
    assert_eq!(
        shutdown.stats.store_errors,
        6 + error_rx
            .try_iter()
            .filter(|(_, e)| !e.ends_with("(reported once per dispatcher)"))
            .count() as u64,
        "every store error counted and reported"
    );
}

/// Starts with a command and a timer due in 10 s; misbehaves when the timer fires, as `mode` says:
/// 0 behaves (the timer decides a `wake` command), 1 panics in `decide`, 2 panics in `evolve`,
/// 3 rejects the event.
struct Fragile {
    mode: Arc<AtomicU8>,
}

impl Workflow for Fragile {
    type State = ();

    fn evolve(&self, _: &mut (), event: &EventRecord) {
        if self.mode.load(Ordering::SeqCst) == 2 && event.kind == "start" {
            panic!("evolve cannot read the start event");
        }
    }

    fn decide(&self, _: &(), event: &EventRecord) -> Decision {
        match (event.kind.as_str(), self.mode.load(Ordering::SeqCst)) {
            ("start", _) => Decision::new()
                .command(Command::new("greet", json!({})))
                .timer(Timer::after("alarm", Duration::from_secs(10), json!({}))),
            (TIMER_FIRED, 1) => panic!("decide is not ready for alarms"),
            (TIMER_FIRED, 3) => Decision::reject("alarms are switched off"),
            (TIMER_FIRED, _) => Decision::new().command(Command::new("wake", json!({}))),
            _ => Decision::none(),
        }
    }
}

#[test]
fn a_timer_whose_workflow_panics_stays_scheduled_is_reported_and_the_worker_goes_on() {
    for (mode, place) in [(1, "decide"), (2, "evolve")] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("flow.db");
        let mut store = SqliteStore::open(&path).unwrap();
        let fragile = Arc::new(AtomicU8::new(0));
        let id = WorkflowId::new("fragile").unwrap();
        let engine = || {
            Engine::new(Fragile {
                mode: fragile.clone(),
            })
        };
        engine()
            .handle(&mut store, &id, Event::new("start", json!({})), T0)
            .unwrap();
        let clock = Arc::new(ManualClock::new(T0 + Duration::from_secs(10)));
        let errors = Arc::new(Mutex::new(Vec::new()));
        let dispatcher = || {
            let errors = errors.clone();
            Dispatcher::sqlite(&path, |_: &Delivery| Outcome::Done)
                .workflow(engine())
                .clock(clock.clone())
                .lease_ttl(Duration::from_secs(30))
                .on_error(move |e: &Error| errors.lock().unwrap().push(e.to_string()))
        };

        fragile.store(mode, Ordering::SeqCst);
        let first = dispatcher();
        let stats = finishes_within(10, move || first.run_until_idle()).unwrap();
        assert_eq!(
            (stats.timer_panics, stats.timers_fired, stats.completed),
            (1, 0, 1),
            "{place}: the panic is counted and the worker delivers the rest"
        );
        let reported = errors.lock().unwrap().clone();
        assert_eq!(reported.len(), 1, "{reported:?}");
        assert!(
            reported[0].contains("panicked") && reported[0].contains("fragile:1:t0"),
            "names the timer: {reported:?}"
        );
        let timer = &store.timers(&id).unwrap()[0];
        assert_eq!(
            timer.status,
            TimerStatus::Scheduled,
            "{place}: nothing written"
        );

        let again = dispatcher().run_until_idle().unwrap();
        assert_eq!(
            again.timer_panics, 0,
            "{place}: not retried before its take runs out"
        );

        fragile.store(0, Ordering::SeqCst); // fixed and redeployed
        clock.advance(Duration::from_secs(30));
        let fixed = dispatcher().run_until_idle().unwrap();
        assert_eq!((fixed.timers_fired, fixed.completed), (1, 1), "{place}");
        assert_eq!(store.timers(&id).unwrap()[0].status, TimerStatus::Fired);
    }
}

#[test]
fn a_rejected_timer_ends_rejected_is_reported_once_and_not_offered_again() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flow.db");
    let mut store = SqliteStore::open(&path).unwrap();
    let mode = Arc::new(AtomicU8::new(3));
    let id = WorkflowId::new("fragile").unwrap();
    Engine::new(Fragile { mode: mode.clone() })
        .handle(&mut store, &id, Event::new("start", json!({})), T0)
        .unwrap();
    let clock = Arc::new(ManualClock::new(T0 + Duration::from_secs(10)));
    let (errors, on_error) = error_log();
    let dispatcher = Dispatcher::sqlite(&path, |_: &Delivery| Outcome::Done)
        .workflow(Engine::new(Fragile { mode }))
        .clock(clock.clone())
        .lease_ttl(Duration::from_secs(30))
        .on_error(on_error);
    let first = dispatcher.run_until_idle().unwrap();
    assert_eq!(
        (
            first.timers_rejected,
            first.timers_fired,
            first.store_errors
        ),
        (1, 0, 0)
    );
    clock.advance(Duration::from_secs(30));
    let second = dispatcher.run_until_idle().unwrap();
    assert_eq!(
        second.timers_rejected, 0,
        "a rejected timer is not offered again"
    );
    let errors = errors.lock().unwrap();
    assert_eq!(errors.len(), 1);
    assert!(
        errors[0].contains("fragile:1:t0") && errors[0].contains("alarms are switched off"),
        "{errors:?}"
    );
    let timer = &store.timers(&id).unwrap()[0];
    assert_eq!(timer.status, TimerStatus::Rejected);
    assert!(timer
        .last_error
        .as_deref()
        .is_some_and(|e| e.contains("alarms are switched off")));
}

// ---------------------------------------------------------------------------------------------
// the ack thread (`{name}-acks`).

type Log = Arc<Mutex<Vec<(String, Settlement)>>>;

fn settled_log() -> (Log, impl Fn(&Delivery, &Settlement) + Send + Sync + 'static) {
    let log: Log = Arc::new(Mutex::new(Vec::new()));
    let keep = log.clone();
    (log, move |d: &Delivery, s: &Settlement| {
        keep.lock()
            .unwrap()
            .push((d.command_id.to_string(), s.clone()))
    })
}

/// Waits (polling, up to 10 s) until the ack thread has called `complete_all`.
fn until_the_ack_thread_wrote(faults: &Faults) {
    let until = Instant::now() + Duration::from_secs(10);
    while faults.acks_completes.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < until, "the ack thread never wrote");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// A parked ack whose lease another worker took over while a later handler ran: the ack thread's
/// write is stale, and it is reported as a lost lease, not a completion.
#[test]
fn a_flushed_ack_whose_lease_was_taken_over_is_reported_lost() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flow.db");
    let store = seed(&path, &[("w", 2)]);
    let faults = Arc::new(Faults::default());
    let clock = Arc::new(ManualClock::new(T0));
    let (rival_clock, rival_path, waits) = (clock.clone(), path.clone(), faults.clone());
    let (log, on_settled) = settled_log();
    let stats = Flaky::dispatcher(&path, &faults, move |d: &Delivery| {
        if d.command_id == cid("w:1:1") {
            rival_clock.advance(Duration::from_secs(61));
            let mut rival = SqliteStore::open(&rival_path).unwrap();
            let taken = rival
                .claim(&ClaimRequest::new("rival").limit(1), rival_clock.now())
                .unwrap();
            assert_eq!(taken[0].command_id, cid("w:1:0"));
            until_the_ack_thread_wrote(&waits);
        }
        Outcome::Done
    })
    .clock(clock.clone())
    .lease_ttl(Duration::from_secs(60))
    .batch_size(2)
    .ack_delay(Duration::from_millis(20))
    .on_settled(on_settled)
    .run_until_idle()
    .unwrap();
    let log = log.lock().unwrap().clone();
    assert_eq!((stats.completed, stats.lost_leases), (1, 1), "{stats:?}");
    assert!(
        log.contains(&("w:1:0".to_owned(), Settlement::LeaseLost)),
        "{log:?}"
    );
    assert_eq!(
        log.iter().filter(|(id, _)| id == "w:1:0").count(),
        1,
        "{log:?}"
    );
    let row = store.command(&cid("w:1:0")).unwrap().unwrap();
    assert_eq!(row.lease.unwrap().owner, "rival");
}

/// The ack thread's write fails (a full disk): counted and reported once, the acks it held are not
/// reported completed, and `run_until_idle` returns the error.
#[test]
fn a_failed_write_of_the_ack_thread_is_counted_and_reported_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flow.db");
    let store = seed(&path, &[("w", 2)]);
    let faults = Arc::new(Faults::default());
    faults.acks_complete_fails.store(true, Ordering::SeqCst);
    let waits = faults.clone();
    let (errors, on_error) = error_log();
    let (log, on_settled) = settled_log();
    let result = finishes_within(20, {
        let path = path.clone();
        let faults = faults.clone();
        move || {
            Flaky::dispatcher(&path, &faults, move |d: &Delivery| {
                if d.command_id == cid("w:1:1") {
                    until_the_ack_thread_wrote(&waits);
                }
                Outcome::Done
            })
            .batch_size(2)
            .ack_delay(Duration::from_millis(20))
            .on_settled(on_settled)
            .on_error(on_error)
            .run_until_idle()
        }
    });
    let log = log.lock().unwrap().clone();
    let errors = errors.lock().unwrap().clone();
    assert!(matches!(result, Err(Error::Storage(_))), "{result:?}");
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(!log.iter().any(|(id, _)| id == "w:1:0"), "{log:?}");
    let row = store.command(&cid("w:1:0")).unwrap().unwrap();
    assert_eq!(row.status, Status::Leased);
}

/// Delivers `w:1:0` and `w:1:1` in one batch with `faults` and a 20 ms ack delay, until idle (within
/// 20 s); `w:1:1`'s handler runs until an error has been reported (the ack thread's, which tries
/// while it runs). Returns the stats and the errors reported.
fn with_a_second_delivery_until_an_error(
    path: &Path,
    faults: &Arc<Faults>,
) -> (miniflow::Stats, Vec<String>) {
    let (errors, on_error) = error_log();
    let seen = errors.clone();
    let stats = finishes_within(20, {
        let (path, faults) = (path.to_path_buf(), faults.clone());
        move || {
            Flaky::dispatcher(&path, &faults, move |d: &Delivery| {
                if d.command_id == cid("w:1:1") {
                    let until = Instant::now() + Duration::from_secs(10);
                    while seen.lock().unwrap().is_empty() && Instant::now() < until {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                }
                Outcome::Done
            })
            .batch_size(2)
            .ack_delay(Duration::from_millis(20))
            .on_error(on_error)
            .run_until_idle()
        }
    })
    .unwrap();
    let errors = errors.lock().unwrap().clone();
    (stats, errors)
}

/// The ack thread cannot open its store: that is a store error like any other, reported and
/// counted.
#[test]
fn the_ack_thread_failing_to_open_its_store_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flow.db");
    seed(&path, &[("w", 2)]);
    let faults = Arc::new(Faults::default());
    faults.acks_open.store(1, Ordering::SeqCst);
    let (stats, errors) = with_a_second_delivery_until_an_error(&path, &faults);
    assert_eq!(stats.completed, 2);
    assert!(stats.store_errors >= 1, "not counted: {stats:?}");
    assert!(!errors.is_empty(), "not reported");
}

/// The ack thread opening its store slowly (and failing) does not hold the worker back when its
/// handler returns: the ack thread takes no acks before its store is open.
#[test]
fn a_slow_open_on_the_ack_thread_does_not_hold_the_worker() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flow.db");
    seed(&path, &[("w", 3)]);
    let faults = Arc::new(Faults::default());
    faults.acks_open.store(3, Ordering::SeqCst);
    let returned = Arc::new(Mutex::new(None::<Instant>));
    let gap = Arc::new(Mutex::new(None::<Duration>));
    let (returned_h, gap_h) = (returned.clone(), gap.clone());
    finishes_within(20, {
        let path = path.clone();
        let faults = faults.clone();
        move || {
            Flaky::dispatcher(&path, &faults, move |d: &Delivery| {
                if d.command_id == cid("w:1:2") {
                    let back = returned_h.lock().unwrap().unwrap();
                    *gap_h.lock().unwrap() = Some(back.elapsed());
                }
                if d.command_id == cid("w:1:1") {
                    std::thread::sleep(Duration::from_millis(60));
                    *returned_h.lock().unwrap() = Some(Instant::now());
                }
                Outcome::Done
            })
            .batch_size(3)
            .ack_delay(Duration::from_millis(20))
            .run_until_idle()
        }
    })
    .unwrap();
    let gap = gap.lock().unwrap().unwrap();
    assert!(
        gap < Duration::from_millis(500),
        "the worker waited {gap:?}"
    );
}

/// A panic on the ack thread (here, in the store opener) does not hang the worker or
/// `run_until_idle`: it is reported as a store error, and the worker writes its acks itself.
#[test]
fn a_panic_on_the_ack_thread_does_not_hang_the_dispatcher() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flow.db");
    seed(&path, &[("w", 2)]);
    let faults = Arc::new(Faults::default());
    faults.acks_open.store(2, Ordering::SeqCst);
    let (stats, errors) = with_a_second_delivery_until_an_error(&path, &faults);
    assert_eq!(stats.completed, 2, "{stats:?}");
    assert!(stats.store_errors >= 1, "{stats:?}");
    assert!(
        errors
            .iter()
            .any(|e| e.contains("the ack thread panicked opening its store")),
        "{errors:?}"
    );
}

/// A handler outlives the shutdown's deadline after the ack thread wrote the acks before it: those
/// completions are durable, so the shutdown counts and reports them, and only once.
#[test]
fn acks_written_before_a_shutdown_deadline_are_reported() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flow.db");
    let store = seed(&path, &[("w", 2)]);
    let (entered, in_slow) = mpsc::channel();
    let (release, released) = mpsc::channel::<()>();
    let (entered, released) = (Mutex::new(entered), Mutex::new(released));
    let (log, on_settled) = settled_log();
    let running = Dispatcher::sqlite(&path, move |d: &Delivery| {
        if d.command_id == cid("w:1:1") {
            entered.lock().unwrap().send(()).unwrap();
            let _ = released
                .lock()
                .unwrap()
                .recv_timeout(Duration::from_secs(30));
        }
        Outcome::Done
    })
    .batch_size(2)
    .ack_delay(Duration::from_millis(20))
    .on_settled(on_settled)
    .start()
    .unwrap();
    in_slow.recv_timeout(Duration::from_secs(10)).unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    while store.command(&cid("w:1:0")).unwrap().unwrap().status != Status::Done {
        assert!(Instant::now() < until);
        std::thread::sleep(Duration::from_millis(5));
    }
    let shutdown = running.shutdown(Duration::from_millis(100));
    let at_shutdown = log.lock().unwrap().clone();
    release.send(()).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let later = log.lock().unwrap().clone();
    assert_eq!(shutdown.unfinished_workers, 1);
    assert_eq!(
        (shutdown.stats.completed, at_shutdown),
        (1, vec![("w:1:0".to_owned(), Settlement::Completed)]),
        "w:1:0 is durably completed: counted and reported by the shutdown"
    );
    assert!(
        !later[1..].iter().any(|(id, _)| id == "w:1:0"),
        "reported again by its worker: {later:?}"
    );
}

/// Many workers, handlers of mixed length: each command is completed and reported exactly once.
#[test]
fn mixed_handlers_settle_each_command_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flow.db");
    let workflows: Vec<(String, usize)> = (0..20).map(|n| (format!("w{n}"), 10)).collect();
    let refs: Vec<(&str, usize)> = workflows.iter().map(|(w, n)| (w.as_str(), *n)).collect();
    let store = seed(&path, &refs);
    let (log, on_settled) = settled_log();
    let calls = Arc::new(AtomicU32::new(0));
    let counted = calls.clone();
    let stats = Dispatcher::sqlite(&path, move |d: &Delivery| {
        counted.fetch_add(1, Ordering::SeqCst);
        if d.command_id.index() % 4 == 3 {
            std::thread::sleep(Duration::from_millis(15));
        }
        Outcome::Done
    })
    .workers(4)
    .batch_size(10)
    .ack_delay(Duration::from_millis(5))
    .on_settled(on_settled)
    .run_until_idle()
    .unwrap();
    let log = log.lock().unwrap().clone();
    assert_eq!(calls.load(Ordering::SeqCst), 200);
    assert_eq!(
        (stats.completed, stats.store_errors, stats.lost_leases),
        (200, 0, 0),
        "{stats:?}"
    );
    let mut ids: Vec<&String> = log.iter().map(|(id, _)| id).collect();
    ids.sort();
    ids.dedup();
    assert_eq!((ids.len(), log.len()), (200, 200));
    assert!(log.iter().all(|(_, s)| *s == Settlement::Completed));
    assert!(store.pending(1000).unwrap().is_empty());
}

/// Books a room and records the reference its result carries back.
struct Booking;

impl Workflow for Booking {
    type State = Vec<String>;

    fn evolve(&self, kinds: &mut Vec<String>, event: &EventRecord) {
        kinds.push(event.kind.clone());
    }

    fn decide(&self, _: &Vec<String>, event: &EventRecord) -> Decision {
        match event.kind.as_str() {
            "requested" => Decision::new()
                .command(Command::new("book_room", json!({})).report_result())
                .command(Command::new("book_taxi", json!({})).report_result()),
            _ => Decision::none(),
        }
    }
}

/// `run_until_idle` returns only when nothing due is left, the feedback of its last acks included:
/// a program that runs it once and then reads its workflows sees every result fed back.
#[test]
fn run_until_idle_fires_the_feedback_of_its_last_acks_before_it_returns() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flow.db");
    let mut store = SqliteStore::open(&path).unwrap();
    let engine = Engine::new(Booking);
    let trips: Vec<WorkflowId> = (0..4)
        .map(|n| WorkflowId::new(format!("trip-{n}")).unwrap())
        .collect();
    for trip in &trips {
        engine
            .handle(&mut store, trip, Event::new("requested", json!({})), T0)
            .unwrap();
    }
    let stats = Dispatcher::sqlite(&path, |d: &Delivery| {
        Outcome::done_with(json!(format!("REF-{}", d.command_id)))
    })
    .workflow(Engine::new(Booking))
    .workers(2)
    .run_until_idle()
    .unwrap();
    assert_eq!(stats.completed, 8);
    assert_eq!(stats.timers_fired, 8, "{stats:?}");
    for trip in &trips {
        let kinds: Vec<String> = store
            .load(trip)
            .unwrap()
            .iter()
            .map(|e| e.kind.clone())
            .collect();
        assert_eq!(
            kinds,
            ["requested", "command_completed", "command_completed"],
            "{trip}"
        );
        assert!(store
            .timers(trip)
            .unwrap()
            .iter()
            .all(|t| t.status != TimerStatus::Scheduled));
    }
}

/// What `on_error` was told: each error's field (for `InvalidInput`) and message.
type Told = Arc<Mutex<Vec<(&'static str, String)>>>;

fn record_into(told: &Told) -> impl Fn(&Error) + Send + Sync + 'static {
    let told = told.clone();
    move |e: &Error| {
        let field = match e {
            Error::InvalidInput { field, .. } => field,
            _ => "(not a notice)",
        };
        told.lock().unwrap().push((field, e.to_string()));
    }
}

/// The fields of the notices a run reported.
fn notices_of(told: &Told) -> Vec<&'static str> {
    told.lock()
        .unwrap()
        .iter()
        .map(|(field, _)| *field)
        .collect()
}

/// A dispatcher built without a workflow says, once, that the results it completes wait for a
/// dispatcher that feeds them back; and a result for a command that did not ask for one is
/// reported once, not dropped silently.
#[test]
fn results_nobody_feeds_back_are_reported_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flow.db");
    let mut store = SqliteStore::open(&path).unwrap();
    let engine = Engine::new(Booking);
    for n in 0..3 {
        let trip = WorkflowId::new(format!("trip-{n}")).unwrap();
        engine
            .handle(&mut store, &trip, Event::new("requested", json!({})), T0)
            .unwrap();
    }
    seed_more(&mut store, "plain", 3);
    let errors: Told = Arc::default();
    let stats = Dispatcher::sqlite(&path, |_: &Delivery| Outcome::done_with(json!("REF")))
        .on_error(record_into(&errors))
        .run_until_idle()
        .unwrap();
    assert_eq!(stats.completed, 9);
    let mut notices = notices_of(&errors);
    notices.sort_unstable();
    assert_eq!(
        notices,
        ["result", "workflow"],
        "{:?}",
        errors.lock().unwrap()
    );
    let text: Vec<String> = errors
        .lock()
        .unwrap()
        .iter()
        .map(|(_, t)| t.clone())
        .collect();
    assert!(text.iter().any(|t| t.contains("report_result")), "{text:?}");
    assert!(
        text.iter().any(|t| t.contains(".workflow(engine)")),
        "{text:?}"
    );
}

/// A dispatcher built without a workflow that finds timers due says so once, and leaves them for
/// a dispatcher that fires them.
#[test]
fn due_timers_of_a_dispatcher_without_a_workflow_are_reported_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flow.db");
    let mut store = SqliteStore::open(&path).unwrap();
    let decision = Decision::new().timer(Timer::after("remind", Duration::ZERO, json!({})));
    let commit = Commit::new(
        WorkflowId::new("w").unwrap(),
        Seq::ZERO,
        Event::new("e", json!({})),
        decision,
        T0,
    )
    .unwrap();
    store.append_with_commands(&commit).unwrap();
    let errors: Told = Arc::default();
    let clock = Arc::new(ManualClock::new(T0));
    let dispatcher = Dispatcher::sqlite(&path, |_: &Delivery| Outcome::Done)
        .clock(clock.clone())
        .on_error(record_into(&errors));
    dispatcher.run_until_idle().unwrap();
    assert_eq!(notices_of(&errors), ["workflow"]);
    assert!(errors.lock().unwrap()[0].1.contains("timers are due"));
    let timers = store.timers(&WorkflowId::new("w").unwrap()).unwrap();
    assert_eq!(timers[0].status, TimerStatus::Scheduled, "left to a firer");
}

/// Adds `count` commands that do not ask for their result, on a workflow of their own.
fn seed_more(store: &mut SqliteStore, workflow: &str, count: usize) {
    let decision: Vec<Command> = (0..count)
        .map(|n| Command::new("notify", json!({ "n": n })))
        .collect();
    let commit = Commit::new(
        WorkflowId::new(workflow).unwrap(),
        Seq::ZERO,
        Event::new("e", json!({})),
        decision.into(),
        T0,
    )
    .unwrap();
    store.append_with_commands(&commit).unwrap();
}
