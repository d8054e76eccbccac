//! Delivery across processes: several OS processes, each with a pool of workers, deliver one outbox to
//! an idempotent receiver and fire timers and failure feedback. The pieces here (producer, receiver,
//! worker process, invariant check) are shared with the crash tests.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use miniflow::prelude::*;
use miniflow::{
    json, Clock, Command, Decision, Delivery, Dispatcher, Engine, Event, EventRecord, Outcome,
    SqliteStore, Stats, SystemClock, Timer, Workflow, WorkflowId, COMMAND_FAILED, TIMER_FIRED,
};
use rusqlite::functions::FunctionFlags;
use rusqlite::{Connection, OptionalExtension, TransactionBehavior};

use crate::child;

/// Every order ships this many parcels.
pub const COMMANDS_PER_ORDER: usize = 5;

/// Whether the last parcel of order `n` is lost: its `ship` command fails for good, every third order.
pub fn loses_a_parcel(order: usize) -> bool {
    order.is_multiple_of(3)
}

/// An order workflow: `order_placed` ships [`COMMANDS_PER_ORDER`] parcels and sets a reminder timer;
/// the reminder sends a `remind` command; a lost parcel's `command_failed` sends a `refund`.
pub struct Orders;

impl Workflow for Orders {
    type State = ();

    fn evolve(&self, _: &mut (), _: &EventRecord) {}

    fn decide(&self, _: &(), event: &EventRecord) -> Decision {
        let order = &event.workflow_id;
        match event.kind.as_str() {
            "order_placed" => (0..COMMANDS_PER_ORDER)
                .map(|n| {
                    Command::new(
                        "ship",
                        json!({ "order": order, "parcel": n, "n": event.payload["n"] }),
                    )
                })
                .fold(Decision::new(), Decision::command)
                .timer(Timer::after(
                    "reminder",
                    Duration::from_millis(30),
                    json!({}),
                )),
            TIMER_FIRED => {
                Decision::new().command(Command::new("remind", json!({ "order": order })))
            }
            COMMAND_FAILED => {
                Decision::new().command(Command::new("refund", event.payload.clone()))
            }
            _ => Decision::none(),
        }
    }
}

pub fn order_id(n: usize) -> WorkflowId {
    WorkflowId::new(format!("order-{n:05}")).unwrap()
}

/// Places orders `0..orders` that are not placed yet, through the engine.
pub fn produce(store: &mut SqliteStore, orders: usize) {
    let engine = Engine::new(Orders);
    for n in 0..orders {
        let id = order_id(n);
        if store.load(&id).unwrap().is_empty() {
            let event = Event::new("order_placed", json!({ "n": n }));
            engine.handle(store, &id, event, SystemClock.now()).unwrap();
        }
    }
}

/// Which commits a crash point counts: a temporary trigger on the writer's connection marks the
/// transaction (`None`: every commit counts).
pub type Mark = Option<&'static str>;

/// A commit that fires a timer or failure feedback into its workflow.
pub const FIRING: Mark = Some("AFTER UPDATE OF status ON main.timers WHEN NEW.status = 'fired'");

/// Set inside a transaction of this process's writer that did what a [`Mark`] selects.
static MARKED: AtomicBool = AtomicBool::new(false);

/// Arms a SIGKILL of this process inside the `nth` commit of `store`'s writer (the process's one
/// writing connection) that `mark` selects, counting across every store that shares `commits`. A
/// transaction rolled back instead clears the mark.
pub fn kill_inside_commit(store: &SqliteStore, nth: u64, mark: Mark, commits: Arc<AtomicU64>) {
    let armed = Arc::new(AtomicBool::new(false));
    let live = armed.clone();
    let storage = |e: rusqlite::Error| miniflow::Error::Storage(Box::new(e));
    store
        .writer()
        .expect("a store that writes")
        .run(move |tx| {
            if let Some(when) = mark {
                tx.create_scalar_function("crash_mark", 0, FunctionFlags::SQLITE_UTF8, |_| {
                    MARKED.store(true, Ordering::SeqCst);
                    Ok(0_i64)
                })
                .map_err(storage)?;
                tx.execute_batch(&format!(
                    "CREATE TEMP TRIGGER IF NOT EXISTS crash_mark {when} \
                     BEGIN SELECT crash_mark(); END;"
                ))
                .map_err(storage)?;
            }
            tx.rollback_hook(Some(|| MARKED.store(false, Ordering::SeqCst)))
                .map_err(storage)?;
            tx.commit_hook(Some(move || {
                let marked = MARKED.swap(false, Ordering::SeqCst);
                // The commit that installs the hook does not count.
                if live.load(Ordering::SeqCst)
                    && (marked || mark.is_none())
                    && commits.fetch_add(1, Ordering::SeqCst) + 1 == nth
                {
                    child::kill_self();
                }
                false // go on with the commit
            }))
            .map_err(storage)?;
            Ok(())
        })
        .expect("arm the crash");
    armed.store(true, Ordering::SeqCst);
}

/// A receiver that honours idempotency keys, on its own SQLite file: every delivery is logged, the
/// effect happens once per command ID, in the same transaction as the record that folds duplicates.
pub struct Receiver {
    conn: Connection,
}

impl Receiver {
    pub fn open(path: &Path) -> Self {
        let conn = Connection::open(path).unwrap();
        conn.busy_timeout(Duration::from_secs(30)).unwrap();
        // NORMAL is safe against a process crash in WAL mode, which is what these tests inflict.
        conn.execute_batch(
            "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL;
             CREATE TABLE IF NOT EXISTS deliveries (command_id TEXT NOT NULL, pid INTEGER NOT NULL);
             CREATE TABLE IF NOT EXISTS idempotency (command_id TEXT PRIMARY KEY, reference TEXT NOT NULL);
             CREATE TABLE IF NOT EXISTS side_effects (command_id TEXT NOT NULL);",
        )
        .unwrap();
        Self { conn }
    }

    /// Takes one delivery; returns the reference of its (single) effect.
    pub fn deliver(&mut self, command_id: &str) -> String {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .unwrap();
        tx.execute(
            "INSERT INTO deliveries VALUES (?1, ?2)",
            (command_id, std::process::id()),
        )
        .unwrap();
        let known: Option<String> = tx
            .query_row(
                "SELECT reference FROM idempotency WHERE command_id = ?1",
                [command_id],
                |r| r.get(0),
            )
            .optional()
            .unwrap();
        let reference = match known {
            Some(reference) => reference,
            None => {
                let reference = format!("REF-{command_id}");
                tx.execute(
                    "INSERT INTO idempotency VALUES (?1, ?2)",
                    (command_id, &reference),
                )
                .unwrap();
                tx.execute("INSERT INTO side_effects VALUES (?1)", [command_id])
                    .unwrap();
                reference
            }
        };
        tx.commit().unwrap();
        reference
    }
}

fn strings(conn: &Connection, sql: &str) -> Vec<String> {
    conn.prepare(sql)
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

fn count(conn: &Connection, sql: &str) -> i64 {
    conn.query_row(sql, [], |r| r.get(0)).unwrap()
}

/// Checks every invariant after a run over orders `0..orders`:
/// - each order placed once, its event with exactly its parcels; each timer fired exactly once and its
///   event with exactly its `remind`; each lost parcel dead with exactly one `command_failed` event and
///   its `refund`; no command without its event; no timer left scheduled;
/// - every command settled (done, or dead for the lost parcels), none lost;
/// - every done command delivered at least once, with exactly one effect at the receiver.
pub fn check_invariants(db: &Path, receiver: &Path, orders: usize, context: &str) {
    let store = Connection::open(db).unwrap();
    let lost = (0..orders).filter(|n| loses_a_parcel(*n)).count();
    let events_of = |kind: &str| {
        count(
            &store,
            &format!("SELECT COUNT(*) FROM events WHERE kind = '{kind}'"),
        )
    };
    assert_eq!(
        events_of("order_placed"),
        orders as i64,
        "{context}: every order placed exactly once"
    );
    assert_eq!(
        events_of(TIMER_FIRED),
        orders as i64,
        "{context}: one reminder fired per order"
    );
    assert_eq!(
        events_of(COMMAND_FAILED),
        lost as i64,
        "{context}: one failure event per lost parcel"
    );
    let wrong = strings(
        &store,
        "SELECT e.workflow_id || ':' || e.seq || ' ' || e.kind || ' ' || COUNT(o.idx) FROM events e \
         LEFT JOIN outbox o ON o.workflow_id = e.workflow_id AND o.event_seq = e.seq \
         GROUP BY e.workflow_id, e.seq \
         HAVING COUNT(o.idx) != CASE e.kind WHEN 'order_placed' THEN 5 ELSE 1 END",
    );
    assert!(
        wrong.is_empty(),
        "{context}: events without exactly their commands: {wrong:?}"
    );
    let orphans = strings(
        &store,
        "SELECT o.command_id FROM outbox o LEFT JOIN events e \
         ON e.workflow_id = o.workflow_id AND e.seq = o.event_seq WHERE e.seq IS NULL",
    );
    assert!(
        orphans.is_empty(),
        "{context}: commands without their event: {orphans:?}"
    );
    let fired_twice = strings(
        &store,
        "SELECT json_extract(payload, '$.timer_id') FROM events WHERE kind = 'timer_fired' \
         GROUP BY 1 HAVING COUNT(*) > 1",
    );
    assert!(
        fired_twice.is_empty(),
        "{context}: timers fired twice: {fired_twice:?}"
    );
    let failed_twice = strings(
        &store,
        "SELECT json_extract(payload, '$.command_id') FROM events WHERE kind = 'command_failed' \
         GROUP BY 1 HAVING COUNT(*) > 1",
    );
    assert!(
        failed_twice.is_empty(),
        "{context}: failures reported twice: {failed_twice:?}"
    );
    let timers = strings(
        &store,
        "SELECT status || ' ' || COUNT(*) FROM timers GROUP BY status",
    );
    assert_eq!(
        timers,
        [format!("fired {}", orders + lost)],
        "{context}: every timer fired, none left"
    );
    let expected_commands = orders * (COMMANDS_PER_ORDER + 1) + lost;
    let commands: BTreeSet<String> = strings(&store, "SELECT command_id FROM outbox")
        .into_iter()
        .collect();
    assert_eq!(
        commands.len(),
        expected_commands,
        "{context}: no command lost"
    );
    let unsettled = strings(
        &store,
        "SELECT command_id || ' ' || status FROM outbox WHERE status NOT IN ('done', 'dead')",
    );
    assert!(
        unsettled.is_empty(),
        "{context}: commands not settled: {unsettled:?}"
    );
    let dead = count(&store, "SELECT COUNT(*) FROM outbox WHERE status = 'dead'");
    assert_eq!(
        dead, lost as i64,
        "{context}: only the lost parcels are dead"
    );
    let done: BTreeSet<String> = strings(
        &store,
        "SELECT command_id FROM outbox WHERE status = 'done'",
    )
    .into_iter()
    .collect();

    let receiver = Connection::open(receiver).unwrap();
    let delivered: BTreeSet<String> =
        strings(&receiver, "SELECT DISTINCT command_id FROM deliveries")
            .into_iter()
            .collect();
    assert_eq!(
        delivered, done,
        "{context}: every done command delivered at least once, nothing else"
    );
    let twice = strings(
        &receiver,
        "SELECT command_id FROM side_effects GROUP BY command_id HAVING COUNT(*) > 1",
    );
    assert!(twice.is_empty(), "{context}: effects repeated: {twice:?}");
    assert_eq!(
        count(&receiver, "SELECT COUNT(*) FROM side_effects"),
        done.len() as i64,
        "{context}: one effect per command"
    );
}

/// Whether anything is left to do: unfinished commands or scheduled timers.
pub fn work_left(db: &Path) -> bool {
    let store = Connection::open(db).unwrap();
    count(&store, "SELECT (SELECT COUNT(*) FROM outbox WHERE processed_at IS NULL) + (SELECT COUNT(*) FROM timers WHERE processed_at IS NULL)") > 0
}

thread_local! {
    static RECEIVER: RefCell<Option<Receiver>> = const { RefCell::new(None) };
}

/// Where a worker process kills itself.
#[derive(Debug, Clone, Copy)]
pub enum CrashPoint {
    /// Inside the nth commit of its writer (claims, acks, lease extensions, firings).
    InsideCommit(u64),
    /// Inside the nth commit that fires a timer or failure feedback.
    InsideFiring(u64),
    /// At the start of the nth delivery: leases held, no effect yet.
    HoldingLeases(u64),
    /// After the nth delivery's effect committed at the receiver, before `complete`.
    AfterEffect(u64),
}

impl CrashPoint {
    pub fn to_setting(self) -> String {
        match self {
            CrashPoint::InsideCommit(n) => format!("inside_commit:{n}"),
            CrashPoint::InsideFiring(n) => format!("inside_firing:{n}"),
            CrashPoint::HoldingLeases(n) => format!("holding_leases:{n}"),
            CrashPoint::AfterEffect(n) => format!("after_effect:{n}"),
        }
    }

    fn parse(text: &str) -> Self {
        let (point, n) = text.split_once(':').unwrap();
        let n = n.parse().unwrap();
        match point {
            "inside_commit" => CrashPoint::InsideCommit(n),
            "inside_firing" => CrashPoint::InsideFiring(n),
            "holding_leases" => CrashPoint::HoldingLeases(n),
            "after_effect" => CrashPoint::AfterEffect(n),
            other => panic!("unknown crash point {other}"),
        }
    }
}

/// Runs a dispatcher on `db` delivering to `receiver` until nothing is unfinished (waiting for the leases
/// of crashed processes to expire), or until idle when `until_empty` is false.
pub fn run_workers(
    db: &Path,
    receiver: &Path,
    workers: usize,
    crash: Option<CrashPoint>,
    until_empty: bool,
) -> Stats {
    let deliveries = Arc::new(AtomicU64::new(0));
    let commits = Arc::new(AtomicU64::new(0));
    let receiver = receiver.to_path_buf();
    let handler = {
        let deliveries = deliveries.clone();
        move |d: &Delivery| {
            let n = deliveries.fetch_add(1, Ordering::SeqCst) + 1;
            if matches!(crash, Some(CrashPoint::HoldingLeases(at)) if at == n) {
                child::kill_self();
            }
            let order = d.payload["n"].as_u64().unwrap_or_default() as usize;
            if d.kind == "ship"
                && d.payload["parcel"] == COMMANDS_PER_ORDER - 1
                && loses_a_parcel(order)
            {
                return Outcome::permanent("parcel lost");
            }
            RECEIVER.with(|slot| {
                let mut slot = slot.borrow_mut();
                slot.get_or_insert_with(|| Receiver::open(&receiver))
                    .deliver(&d.command_id.to_string())
            });
            if matches!(crash, Some(CrashPoint::AfterEffect(at)) if at == n) {
                child::kill_self();
            }
            Outcome::Done
        }
    };
    let db_path: PathBuf = db.to_path_buf();
    let open = move || {
        let store = SqliteStore::open(&db_path)?;
        match crash {
            Some(CrashPoint::InsideCommit(nth)) => {
                kill_inside_commit(&store, nth, None, commits.clone())
            }
            Some(CrashPoint::InsideFiring(nth)) => {
                kill_inside_commit(&store, nth, FIRING, commits.clone())
            }
            _ => {}
        }
        Ok(store)
    };
    let lease = Duration::from_millis(300);
    let dispatcher = Dispatcher::new(open, handler)
        .workflow(Engine::new(Orders))
        .workers(workers)
        .batch_size(32)
        .lease_ttl(lease)
        .poll_interval(Duration::from_millis(20));
    let mut stats = Stats::default();
    loop {
        stats += dispatcher.run_until_idle().unwrap();
        if !until_empty || !work_left(db) {
            return stats;
        }
        std::thread::sleep(lease / 3); // leases of a crashed process run out; timers come due
    }
}

/// Child process: a worker process. Settings: `MINIFLOW_DB`, `MINIFLOW_RECEIVER`, `MINIFLOW_WORKERS`,
/// optional `MINIFLOW_CRASH` (a [`CrashPoint`]). Prints its stats.
#[test]
fn child_worker_process() {
    if child::role().as_deref() != Some("worker") {
        return;
    }
    let db = PathBuf::from(child::setting("MINIFLOW_DB"));
    let receiver = PathBuf::from(child::setting("MINIFLOW_RECEIVER"));
    let workers = child::setting("MINIFLOW_WORKERS").parse().unwrap();
    let crash = child::optional("MINIFLOW_CRASH").map(|c| CrashPoint::parse(&c));
    let stats = run_workers(&db, &receiver, workers, crash, true);
    println!(
        "claimed={} completed={} store_errors={} lost_leases={}",
        stats.claimed, stats.completed, stats.store_errors, stats.lost_leases
    );
}

/// Child process: a producer placing orders. Settings: `MINIFLOW_DB`, `MINIFLOW_ORDERS`, optional
/// `MINIFLOW_CRASH` = `inside_commit:N`.
#[test]
fn child_producer_process() {
    if child::role().as_deref() != Some("producer") {
        return;
    }
    let mut store = SqliteStore::open(child::setting("MINIFLOW_DB")).unwrap();
    if let Some(CrashPoint::InsideCommit(nth)) =
        child::optional("MINIFLOW_CRASH").map(|c| CrashPoint::parse(&c))
    {
        kill_inside_commit(&store, nth, None, Arc::new(AtomicU64::new(0)));
    }
    produce(
        &mut store,
        child::setting("MINIFLOW_ORDERS").parse().unwrap(),
    );
}

pub fn worker_settings(
    db: &Path,
    receiver: &Path,
    workers: usize,
    crash: Option<CrashPoint>,
) -> Vec<(&'static str, String)> {
    vec![
        ("MINIFLOW_DB", db.display().to_string()),
        ("MINIFLOW_RECEIVER", receiver.display().to_string()),
        ("MINIFLOW_WORKERS", workers.to_string()),
        (
            "MINIFLOW_CRASH",
            crash.map(CrashPoint::to_setting).unwrap_or_default(),
        ),
    ]
}

#[test]
fn several_processes_deliver_5000_commands_with_one_effect_each() {
    let dir = tempfile::tempdir().unwrap();
    let (db, receiver) = (dir.path().join("outbox.db"), dir.path().join("receiver.db"));
    let orders = 1_000; // × 5 commands
    produce(&mut SqliteStore::open(&db).unwrap(), orders);
    drop(Receiver::open(&receiver));
    let processes: Vec<_> = (0..3)
        .map(|_| {
            child::spawn(
                "delivery::child_worker_process",
                "worker",
                &worker_settings(&db, &receiver, 3, None),
            )
        })
        .collect();
    let mut completed = 0;
    for process in processes {
        let stdout = child::wait_ok(process, "worker process");
        assert_eq!(
            child::reported(&stdout, "store_errors").as_deref(),
            Some("0"),
            "a store error reached a worker: {stdout}"
        );
        completed += child::reported(&stdout, "completed")
            .unwrap()
            .parse::<u64>()
            .unwrap();
    }
    // 5,000 parcels (one lost per third order), a reminder per order, a refund per lost parcel.
    assert_eq!(completed, 5_000 + 1_000);
    check_invariants(&db, &receiver, orders, "3 processes × 3 workers");
}
