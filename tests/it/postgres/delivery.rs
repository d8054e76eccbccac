//! Several processes, one database: producer and worker processes (this test binary started again)
//! share one PostgreSQL outbox. Workers deliver to an idempotent receiver in the same database whose
//! effect commits with the record that folds repeats — a receipt per command counting its attempts,
//! or miniflow's own receiver records (`PostgresIdempotencyStore::finish_in`) — and every delivery
//! it sees is logged. A trigger records every change of an outbox row's lease, so that the
//! checks can tell whether a command was ever handed out while another holder's lease was live.
//!
//! The pieces here (workflow, producer, receiver, worker process, crash points, invariant checks)
//! are shared with the crash and restart tests.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use miniflow::postgres::{Client, Config, NoTls};
use miniflow::prelude::*;
use miniflow::{
    json, Begin, Clock, Command, Decision, Delivery, Digest, Dispatcher, Engine, Error, Event,
    EventRecord, IdempotencyKey, IdempotencyPolicy, IdempotencyStore, Outcome, PostgresDispatcher,
    PostgresIdempotencyStore, PostgresOptions, PostgresStore, RetryPolicy, Stats, SystemClock,
    Timer, Workflow, WorkflowId, COMMAND_FAILED, TIMER_FIRED,
};

use super::TestDatabase;
use crate::child;

/// Every order ships this many parcels.
pub const PARCELS: usize = 16;

/// Every this many orders, one loses a parcel.
const LOSS_EVERY: usize = 4;

/// Whether the last parcel of order `n` is lost: its `ship` fails for good, every
/// [`LOSS_EVERY`]th order.
pub fn loses_a_parcel(order: usize) -> bool {
    order.is_multiple_of(LOSS_EVERY)
}

/// How many orders of `0..orders` lose a parcel.
pub fn lost(orders: usize) -> usize {
    (0..orders).filter(|n| loses_a_parcel(*n)).count()
}

/// How many commands orders `0..orders` make: their parcels, a reminder each, a refund per lost
/// parcel.
pub fn commands_of(orders: usize) -> usize {
    orders * (PARCELS + 1) + lost(orders)
}

/// An order: `order_placed` ships [`PARCELS`] parcels and sets a reminder; the reminder sends a
/// `remind`; a lost parcel's `command_failed` sends a `refund`.
pub struct Shipping;

impl Workflow for Shipping {
    type State = ();

    fn evolve(&self, _: &mut (), _: &EventRecord) {}

    fn decide(&self, _: &(), event: &EventRecord) -> Decision {
        let order = &event.workflow_id;
        match event.kind.as_str() {
            "order_placed" => (0..PARCELS)
                .map(|parcel| {
                    Command::new(
                        "ship",
                        json!({ "order": order, "parcel": parcel, "n": event.payload["n"] }),
                    )
                })
                .fold(Decision::new(), Decision::command)
                .timer(Timer::after(
                    "reminder",
                    Duration::from_millis(20),
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

/// The prefix of the notice a crash point raises; the process that reads it dies (see [`connect`]).
const CRASH_NOTICE: &str = "miniflow-test-crash:";

/// Where a process kills itself with SIGKILL. The points inside a transaction are raised by the
/// database (a trigger's `NOTICE`, read by the process while it waits for its statement), so the
/// process dies with the transaction open: written, not committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashPoint {
    /// Inside the claim of its nth command, the lease written.
    InsideClaim(u64),
    /// Inside the ack of its nth command, the command marked done.
    InsideAck(u64),
    /// Inside the nth extension of a lease by its heartbeat.
    InsideExtend(u64),
    /// Inside the nth commit of a timer's event (a reminder) into its workflow.
    InsideFiring(u64),
    /// Inside the nth commit of a dead command's `command_failed` event into its workflow.
    InsideFeedback(u64),
    /// Inside the nth commit of an event (a producer's).
    InsideCommit(u64),
    /// At the start of the nth delivery: leases held, nothing done.
    HoldingLeases(u64),
    /// Inside the receiver's nth effect transaction: the effect written, its record not yet.
    InsideEffect(u64),
    /// After the receiver committed its nth effect, before the ack.
    AfterEffect(u64),
}

impl CrashPoint {
    fn parts(self) -> (&'static str, u64) {
        match self {
            CrashPoint::InsideClaim(n) => ("inside_claim", n),
            CrashPoint::InsideAck(n) => ("inside_ack", n),
            CrashPoint::InsideExtend(n) => ("inside_extend", n),
            CrashPoint::InsideFiring(n) => ("inside_firing", n),
            CrashPoint::InsideFeedback(n) => ("inside_feedback", n),
            CrashPoint::InsideCommit(n) => ("inside_commit", n),
            CrashPoint::HoldingLeases(n) => ("holding_leases", n),
            CrashPoint::InsideEffect(n) => ("inside_effect", n),
            CrashPoint::AfterEffect(n) => ("after_effect", n),
        }
    }

    pub fn to_setting(self) -> String {
        let (point, n) = self.parts();
        format!("{point}:{n}")
    }

    pub fn parse(text: &str) -> Self {
        let (point, n) = text.split_once(':').expect("point:n");
        let n = n.parse().expect("a count");
        match point {
            "inside_claim" => CrashPoint::InsideClaim(n),
            "inside_ack" => CrashPoint::InsideAck(n),
            "inside_extend" => CrashPoint::InsideExtend(n),
            "inside_firing" => CrashPoint::InsideFiring(n),
            "inside_feedback" => CrashPoint::InsideFeedback(n),
            "inside_commit" => CrashPoint::InsideCommit(n),
            "holding_leases" => CrashPoint::HoldingLeases(n),
            "inside_effect" => CrashPoint::InsideEffect(n),
            "after_effect" => CrashPoint::AfterEffect(n),
            other => panic!("unknown crash point {other}"),
        }
    }

    /// Whether the database raises this point (a trigger counts it).
    fn in_database(self) -> bool {
        matches!(
            self,
            CrashPoint::InsideClaim(_)
                | CrashPoint::InsideAck(_)
                | CrashPoint::InsideExtend(_)
                | CrashPoint::InsideFiring(_)
                | CrashPoint::InsideFeedback(_)
                | CrashPoint::InsideCommit(_)
        )
    }
}

/// The test's own tables and triggers, beside miniflow's:
/// - `lease_history`: every change of an outbox row's status, token or lease expiry, with the
///   database's clock and the writer's `application_name`;
/// - `crash_plan`: which process (by `application_name`) dies at which point; the triggers count the
///   points and raise a notice at the planned one;
/// - `deliveries` and `effects`: the receiver's log of what it was handed and what it did.
const INSTRUMENTATION: &str = r#"
CREATE FUNCTION test_db_ms() RETURNS bigint LANGUAGE sql VOLATILE AS
    $$ SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint $$;

CREATE TABLE lease_history (
    id          BIGSERIAL PRIMARY KEY,
    command_id  TEXT NOT NULL,
    old_status  TEXT NOT NULL,
    new_status  TEXT NOT NULL,
    old_token   BIGINT NOT NULL,
    new_token   BIGINT NOT NULL,
    old_expires BIGINT,
    new_expires BIGINT,
    old_owner   TEXT,
    owner       TEXT,
    app         TEXT NOT NULL,
    at          BIGINT NOT NULL
);
CREATE INDEX lease_history_command ON lease_history (command_id, id);

CREATE TABLE crash_plan (
    app   TEXT NOT NULL,
    point TEXT NOT NULL,
    nth   BIGINT NOT NULL,
    seen  BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (app, point)
);

-- Counts point `p` for this connection's process; at the planned one, raises the notice that kills
-- it, naming `subject` (a command or a workflow).
CREATE FUNCTION test_crash_point(p TEXT, subject TEXT) RETURNS void LANGUAGE plpgsql AS $$
DECLARE hit BOOLEAN;
BEGIN
    UPDATE crash_plan SET seen = seen + 1
        WHERE app = current_setting('application_name') AND point = p
        RETURNING seen = nth INTO hit;
    IF hit THEN
        RAISE NOTICE 'miniflow-test-crash:% %', p, subject;
    END IF;
END $$;

CREATE FUNCTION test_outbox_changed() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE id TEXT := NEW.workflow_id || ':' || NEW.event_seq || ':' || NEW.idx;
BEGIN
    INSERT INTO lease_history (command_id, old_status, new_status, old_token, new_token,
        old_expires, new_expires, old_owner, owner, app, at)
    VALUES (id, OLD.status, NEW.status, OLD.lease_token, NEW.lease_token, OLD.lease_expires_at,
        NEW.lease_expires_at, OLD.lease_owner, NEW.lease_owner, current_setting('application_name'),
        test_db_ms());
    IF NEW.lease_token <> OLD.lease_token THEN
        PERFORM test_crash_point('inside_claim', id);
    ELSIF NEW.status = 'done' AND OLD.status = 'leased' THEN
        PERFORM test_crash_point('inside_ack', id);
    ELSIF NEW.status = 'leased' AND OLD.status = 'leased'
        AND NEW.lease_expires_at > OLD.lease_expires_at THEN
        PERFORM test_crash_point('inside_extend', id);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER test_outbox_changed AFTER UPDATE ON outbox FOR EACH ROW
    WHEN (OLD.status IS DISTINCT FROM NEW.status OR OLD.lease_token IS DISTINCT FROM NEW.lease_token
        OR OLD.lease_expires_at IS DISTINCT FROM NEW.lease_expires_at
        OR OLD.lease_owner IS DISTINCT FROM NEW.lease_owner)
    EXECUTE FUNCTION test_outbox_changed();

CREATE FUNCTION test_event_written() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.kind = 'timer_fired' THEN
        PERFORM test_crash_point('inside_firing', NEW.workflow_id || ' ' || NEW.kind);
    ELSIF NEW.kind = 'command_failed' THEN
        PERFORM test_crash_point('inside_feedback', NEW.workflow_id || ' ' || NEW.kind);
    END IF;
    PERFORM test_crash_point('inside_commit', NEW.workflow_id);
    RETURN NULL;
END $$;
CREATE TRIGGER test_event_written AFTER INSERT ON events FOR EACH ROW
    EXECUTE FUNCTION test_event_written();

CREATE TABLE deliveries (
    id         BIGSERIAL PRIMARY KEY,
    command_id TEXT NOT NULL,
    token      BIGINT NOT NULL,
    attempt    BIGINT NOT NULL,
    app        TEXT NOT NULL,
    pid        BIGINT NOT NULL,
    -- What the receiver made of it: effect, completed (a repeat), in_progress, lost (a lost parcel).
    answer     TEXT NOT NULL,
    at         BIGINT NOT NULL DEFAULT test_db_ms()
);
-- The receipts of `Idempotency::Receipts`.
CREATE TABLE receipts (
    command_id TEXT PRIMARY KEY,
    attempts   BIGINT NOT NULL
);
-- No key: an effect done twice shows as two rows.
CREATE TABLE effects (
    command_id TEXT NOT NULL,
    token      BIGINT NOT NULL,
    app        TEXT NOT NULL,
    pid        BIGINT NOT NULL,
    at         BIGINT NOT NULL DEFAULT test_db_ms()
);
"#;

/// The store's options in every process: the database's clock for leases, as workers on several
/// machines would use.
pub fn options() -> PostgresOptions {
    PostgresOptions::new().database_clock(true).pool_size(16)
}

/// Connects to `url` as `app` (its `application_name`) with [`options`]. A crash notice the
/// database raises on one of its connections kills a child process with SIGKILL on the spot, inside
/// the open transaction.
pub fn connect(url: &str, app: &str) -> Result<PostgresStore, Error> {
    connect_with(url, app, &options())
}

/// As [`connect`], with `options`.
pub fn connect_with(
    url: &str,
    app: &str,
    options: &PostgresOptions,
) -> Result<PostgresStore, Error> {
    let mut config: Config = url.parse().expect("a PostgreSQL URL");
    config.application_name(app);
    config.notice_callback(|notice| {
        if let Some(crash) = notice.message().strip_prefix(CRASH_NOTICE) {
            if child::role().is_some() {
                let (point, subject) = crash.split_once(' ').unwrap_or((crash, ""));
                // One line: the subject may hold a space (a workflow and an event's kind).
                println!(
                    "killed_inside={point} killed_subject={}",
                    subject.replace(' ', "/")
                );
                child::kill_self();
            }
            eprintln!("a crash notice reached the test process itself: {crash}");
        }
    });
    PostgresStore::connect_tls(config, NoTls, options)
}

/// A plain connection as `app`, for checks and monitors.
pub fn plain_client(url: &str, app: &str) -> Result<Client, miniflow::postgres::Error> {
    let mut config: Config = url.parse().expect("a PostgreSQL URL");
    config.application_name(app);
    config.connect_timeout(Duration::from_secs(5));
    config.connect(NoTls)
}

/// Migrates the database at `url` and installs the test's tables and triggers.
pub fn prepare(url: &str) {
    drop(connect(url, "setup").expect("connect and migrate"));
    plain_client(url, "setup")
        .unwrap()
        .batch_execute(INSTRUMENTATION)
        .expect("install the instrumentation");
}

/// Plans that the process connecting as `app` dies at `point` (a point the database raises).
pub fn plan_crash(url: &str, app: &str, point: CrashPoint) {
    if !point.in_database() {
        return;
    }
    let (name, nth) = point.parts();
    plain_client(url, "setup")
        .unwrap()
        .execute(
            "INSERT INTO crash_plan (app, point, nth) VALUES ($1, $2, $3)",
            &[&app, &name, &i64::try_from(nth).unwrap()],
        )
        .unwrap();
}

/// Places the orders `n` of `0..orders` with `n % shares == share` that are not placed yet, riding
/// out store errors (a server restarting): an order whose commit failed is looked up again, so one
/// whose commit landed unseen is not placed twice.
pub fn produce(store: &mut PostgresStore, orders: usize, share: usize, shares: usize) -> u64 {
    let engine = Engine::new(Shipping);
    let mut errors = 0;
    for n in (0..orders).filter(|n| n % shares == share) {
        let id = order_id(n);
        let mut pause = Duration::from_millis(10);
        loop {
            let placed = store.load(&id).and_then(|events| {
                if !events.is_empty() {
                    return Ok(());
                }
                let event = Event::new("order_placed", json!({ "n": n }));
                engine
                    .handle(store, &id, event, SystemClock.now())
                    .map(drop)
            });
            match placed {
                Ok(()) => break,
                Err(e) => {
                    errors += 1;
                    eprintln!("producer: order {n}: {e}; trying again in {pause:?}");
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_secs(1));
                }
            }
        }
    }
    errors
}

/// How long the receiver's reservations hold: a receiver killed inside its effect leaves its key
/// reserved this long.
const RESERVATION: Duration = Duration::from_secs(1);

/// How long a delivery takes when a heartbeat's extension is to be crashed in.
const SLOW_DELIVERY: Duration = Duration::from_millis(150);

/// How the receiver keeps a command's effect to one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Idempotency {
    /// miniflow's receiver records: `PostgresIdempotencyStore::begin` reserves the key, and the
    /// effect commits with `finish_in` under the reservation's token.
    Reservations,
    /// A receipt per command with a count of attempts, written in the effect's statement: the
    /// first attempt makes the effect, a repeat only counts. One round trip a delivery.
    Receipts,
}

/// The idempotent receiver, on the outbox's database: a repeat makes no new effect, and the effect
/// commits with the record that folds repeats, so it happens at most once whatever the timing.
/// Every delivery is logged in `deliveries`.
pub struct Receiver {
    keys: PostgresIdempotencyStore,
    idempotency: Idempotency,
    app: String,
    crash: Option<CrashPoint>,
    deliveries: AtomicU64,
    effects: AtomicU64,
}

impl Receiver {
    pub fn on(
        store: &PostgresStore,
        idempotency: Idempotency,
        app: &str,
        crash: Option<CrashPoint>,
    ) -> Self {
        let policy = IdempotencyPolicy {
            retention: Duration::from_secs(24 * 3600),
            reservation_timeout: RESERVATION,
        };
        Self {
            keys: PostgresIdempotencyStore::on(store, policy).unwrap(),
            idempotency,
            app: app.to_owned(),
            crash,
            deliveries: AtomicU64::new(0),
            effects: AtomicU64::new(0),
        }
    }

    /// Takes one delivery.
    pub fn deliver(&self, d: &Delivery) -> Outcome {
        let n = self.deliveries.fetch_add(1, Ordering::SeqCst) + 1;
        if self.crash == Some(CrashPoint::HoldingLeases(n)) {
            self.die(d);
        }
        if matches!(self.crash, Some(CrashPoint::InsideExtend(_))) {
            // A slow receiver: the leases of the batch waiting behind it need extending.
            std::thread::sleep(SLOW_DELIVERY);
        }
        let order = d.payload["n"].as_u64().unwrap_or_default() as usize;
        if d.kind == "ship" && d.payload["parcel"] == PARCELS - 1 && loses_a_parcel(order) {
            return match self.log(d, "lost") {
                Ok(()) => Outcome::permanent("parcel lost"),
                Err(e) => Outcome::retry(e),
            };
        }
        let outcome = match self.idempotency {
            Idempotency::Reservations => self.effect(d),
            Idempotency::Receipts => self.receipt(d),
        };
        outcome.unwrap_or_else(|e| Outcome::retry(format!("receiver: {e}")))
    }

    /// The receipt, the delivery's log entry and, on the first attempt, the effect: one statement,
    /// one commit.
    fn receipt(&self, d: &Delivery) -> Result<Outcome, Error> {
        let logged = Logged::of(d, &self.app);
        self.keys
            .client()?
            .query_one(
                "WITH receipt AS (INSERT INTO receipts (command_id, attempts) VALUES ($1, 1) \
                     ON CONFLICT (command_id) DO UPDATE SET attempts = receipts.attempts + 1 \
                     RETURNING attempts), \
                 effect AS (INSERT INTO effects (command_id, token, app, pid) \
                     SELECT $1, $2, $4, $5 FROM receipt WHERE attempts = 1) \
                 INSERT INTO deliveries (command_id, token, attempt, app, pid, answer) \
                 SELECT $1, $2, $3, $4, $5, \
                     CASE WHEN attempts = 1 THEN 'effect' ELSE 'completed' END FROM receipt \
                 RETURNING answer",
                &[
                    &logged.id,
                    &logged.token,
                    &logged.attempt,
                    &logged.app,
                    &logged.pid,
                ],
            )
            .map_err(storage)?;
        Ok(Outcome::done_with(
            json!({ "reference": format!("REF-{}", logged.id) }),
        ))
    }

    fn effect(&self, d: &Delivery) -> Result<Outcome, Error> {
        let id = d.command_id.to_string();
        let key = IdempotencyKey::new(id.as_str())?;
        let token =
            match self
                .keys
                .clone()
                .begin(&key, Digest::of(&d.payload), SystemClock.now())?
            {
                Begin::Fresh { token } => token,
                Begin::Completed { result } => {
                    self.log(d, "completed")?;
                    return Ok(Outcome::done_with(result));
                }
                Begin::InProgress { .. } => {
                    self.log(d, "in_progress")?;
                    return Ok(Outcome::retry("409: in progress"));
                }
                conflict @ Begin::Conflict { .. } => {
                    return Ok(Outcome::permanent(format!("422: {conflict:?}")))
                }
            };
        let n = self.effects.fetch_add(1, Ordering::SeqCst) + 1;
        let logged = Logged::of(d, &self.app);
        let mut client = self.keys.client()?;
        let mut tx = client.transaction().map_err(storage)?;
        tx.execute(
            "INSERT INTO deliveries (command_id, token, attempt, app, pid, answer) \
             VALUES ($1, $2, $3, $4, $5, 'effect')",
            &[
                &logged.id,
                &logged.token,
                &logged.attempt,
                &logged.app,
                &logged.pid,
            ],
        )
        .map_err(storage)?;
        tx.execute(
            "INSERT INTO effects (command_id, token, app, pid) VALUES ($1, $2, $3, $4)",
            &[&logged.id, &logged.token, &logged.app, &logged.pid],
        )
        .map_err(storage)?;
        if self.crash == Some(CrashPoint::InsideEffect(n)) {
            self.die(d);
        }
        let result = json!({ "reference": format!("REF-{id}") });
        match self
            .keys
            .finish_in(&mut tx, &key, token, &result, SystemClock.now())
        {
            Ok(()) => {}
            Err(e @ Error::StaleReservation { .. }) => {
                drop(tx); // rolled back, the effect with it
                return Ok(Outcome::retry(format!("409: {e}")));
            }
            Err(e) => return Err(e),
        }
        tx.commit().map_err(storage)?;
        if self.crash == Some(CrashPoint::AfterEffect(n)) {
            self.die(d);
        }
        Ok(Outcome::done_with(result))
    }

    /// Logs a delivery that made no effect.
    fn log(&self, d: &Delivery, answer: &str) -> Result<(), Error> {
        let logged = Logged::of(d, &self.app);
        self.keys
            .client()?
            .execute(
                "INSERT INTO deliveries (command_id, token, attempt, app, pid, answer) \
                 VALUES ($1, $2, $3, $4, $5, $6)",
                &[
                    &logged.id,
                    &logged.token,
                    &logged.attempt,
                    &logged.app,
                    &logged.pid,
                    &answer,
                ],
            )
            .map_err(storage)?;
        Ok(())
    }

    fn die(&self, d: &Delivery) -> ! {
        println!("killed_subject={}", d.command_id);
        child::kill_self();
    }
}

/// A delivery as the receiver logs it.
struct Logged {
    id: String,
    token: i64,
    attempt: i64,
    app: String,
    pid: i64,
}

impl Logged {
    fn of(d: &Delivery, app: &str) -> Self {
        Self {
            id: d.command_id.to_string(),
            token: i64::try_from(d.token).unwrap(),
            attempt: i64::from(d.attempt),
            app: app.to_owned(),
            pid: i64::from(std::process::id()),
        }
    }
}

fn storage(e: miniflow::postgres::Error) -> Error {
    Error::Storage(Box::new(e))
}

/// Whether every order of `0..orders` is placed and every command and timer settled.
pub fn settled(client: &mut Client, orders: usize) -> Result<bool, miniflow::postgres::Error> {
    client
        .query_one(
            "SELECT (SELECT count(*) FROM events WHERE kind = 'order_placed') = $1 \
             AND NOT EXISTS (SELECT 1 FROM outbox WHERE processed_at IS NULL) \
             AND NOT EXISTS (SELECT 1 FROM timers WHERE processed_at IS NULL)",
            &[&i64::try_from(orders).unwrap()],
        )
        .and_then(|row| row.try_get(0))
}

/// What a worker process (or the test's own dispatcher) did.
#[derive(Debug, Default)]
pub struct Report {
    pub stats: Stats,
    /// Errors reported through `on_error`.
    pub errors: u64,
    /// The first few of them.
    pub first_errors: Vec<String>,
    /// Whether everything was settled when it stopped.
    pub settled: bool,
    /// The errors worker threads stopped on before the shutdown (a started dispatcher's workers
    /// are to ride out every error).
    pub stopped_on: Vec<String>,
    /// Whether its notification listener was connected at the end.
    pub listening: bool,
}

/// The retries of every worker process: quick, and many, so that an outage does not kill a
/// command.
pub fn retry_policy() -> RetryPolicy {
    RetryPolicy::default()
        .initial_delay(Duration::from_millis(50))
        .max_delay(Duration::from_millis(200))
        .max_attempts(200)
}

/// The errors a dispatcher reported through `on_error`: how many, and the first few.
#[derive(Clone, Default)]
pub struct ErrorLog {
    count: Arc<AtomicU64>,
    first: Arc<Mutex<Vec<String>>>,
}

impl ErrorLog {
    /// An `on_error` callback recording into this log, printing the first few as `app`.
    pub fn recorder(&self, app: &str) -> impl Fn(&Error) + Send + Sync + 'static {
        let (count, first, app) = (self.count.clone(), self.first.clone(), app.to_owned());
        move |e| {
            count.fetch_add(1, Ordering::SeqCst);
            let mut first = first.lock().unwrap();
            if first.len() < 5 {
                eprintln!("{app}: {e}");
                first.push(e.to_string());
            }
        }
    }

    /// The report of a worker process whose dispatcher shut down with `shutdown`.
    pub fn report(
        &self,
        workers: &Workers,
        shutdown: miniflow::Shutdown,
        settled: bool,
        listening: bool,
    ) -> Report {
        assert_eq!(
            shutdown.unfinished_workers, 0,
            "{}: workers stuck at shutdown",
            workers.app
        );
        Report {
            stats: shutdown.stats,
            errors: self.count.load(Ordering::SeqCst),
            first_errors: self.first.lock().unwrap().clone(),
            settled,
            stopped_on: shutdown.errors.iter().map(ToString::to_string).collect(),
            listening,
        }
    }
}

/// How a worker process delivers.
#[derive(Debug, Clone)]
pub struct Workers {
    pub url: String,
    pub app: String,
    pub workers: usize,
    pub lease: Duration,
    pub orders: usize,
    pub idempotency: Idempotency,
    /// How long an operation waits for a connection ([`PostgresOptions::connect_timeout`]), if not
    /// the default.
    pub connect_timeout: Option<Duration>,
    pub crash: Option<CrashPoint>,
    /// The longest it waits for everything to settle.
    pub deadline: Duration,
    /// Whether it runs the async API (`AsyncDispatcher` on `AsyncPostgresStore`, the receiver on
    /// `AsyncPostgresIdempotencyStore`) rather than the synchronous one.
    pub asynchronous: bool,
}

impl Workers {
    /// Runs a dispatcher (`Dispatcher::postgres`, or `AsyncDispatcher` on the async store when
    /// [`Workers::asynchronous`]), firing timers and failures too, until every order is placed and
    /// every command and timer settled, or until the deadline.
    pub fn run(&self) -> Report {
        if self.asynchronous {
            return super::async_processes::run_workers(self);
        }
        let store = loop {
            match connect_with(&self.url, &self.app, &self.options()) {
                Ok(store) => break store,
                Err(e) => {
                    eprintln!("{}: connect: {e}", self.app);
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
        };
        let receiver = Arc::new(Receiver::on(
            &store,
            self.idempotency,
            &self.app,
            self.crash,
        ));
        let errors = ErrorLog::default();
        let running = Dispatcher::postgres(&store, move |d: &Delivery| receiver.deliver(d))
            .expect("a listener")
            .workflow(Engine::new(Shipping))
            .name(self.app.clone())
            .workers(self.workers)
            .batch_size(32)
            .ack_delay(Duration::from_millis(50))
            .lease_ttl(self.lease)
            .retry_policy(retry_policy())
            .on_error(errors.recorder(&self.app))
            .start()
            .expect("start the dispatcher");
        let (settled, listening) = self.watch();
        let shutdown = running.shutdown(Duration::from_secs(10));
        errors.report(self, shutdown, settled, listening)
    }

    /// The store's options in a worker process.
    pub fn options(&self) -> PostgresOptions {
        match self.connect_timeout {
            Some(timeout) => options().connect_timeout(timeout),
            None => options(),
        }
    }

    /// Waits until every order is placed and every command and timer settled, or until the
    /// deadline; returns whether it was, and whether the dispatcher's listener is connected then.
    pub fn watch(&self) -> (bool, bool) {
        let started = Instant::now();
        let mut monitor: Option<Client> = None;
        let mut is_settled = false;
        while started.elapsed() < self.deadline {
            std::thread::sleep(Duration::from_millis(50));
            let client = match monitor.as_mut() {
                Some(client) => client,
                None => match plain_client(&self.url, &format!("{}-monitor", self.app)) {
                    Ok(client) => monitor.insert(client),
                    Err(_) => continue,
                },
            };
            match settled(client, self.orders) {
                Ok(true) => {
                    is_settled = true;
                    break;
                }
                Ok(false) => {}
                Err(_) => monitor = None, // the server went away: connect again
            }
        }
        let listening = is_settled && monitor.as_mut().is_some_and(|db| self.listening(db));
        (is_settled, listening)
    }

    /// Whether the dispatcher's listener is connected: a session of this process whose last
    /// statement was its `LISTEN` (waiting up to 10 s for one that reconnects).
    fn listening(&self, db: &mut Client) -> bool {
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(10) {
            let sessions: i64 = db
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity \
                     WHERE application_name = $1 AND query ILIKE 'LISTEN%'",
                    &[&self.app],
                )
                .map_or(0, |row| row.get(0));
            if sessions > 0 {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }

    /// The settings of a child worker process.
    pub fn settings(&self) -> Vec<(&'static str, String)> {
        vec![
            ("MINIFLOW_PG_URL", self.url.clone()),
            ("MINIFLOW_PG_APP", self.app.clone()),
            ("MINIFLOW_WORKERS", self.workers.to_string()),
            ("MINIFLOW_LEASE_MS", self.lease.as_millis().to_string()),
            ("MINIFLOW_ORDERS", self.orders.to_string()),
            (
                "MINIFLOW_RECEIPTS",
                (self.idempotency == Idempotency::Receipts).to_string(),
            ),
            (
                "MINIFLOW_CONNECT_TIMEOUT_MS",
                self.connect_timeout
                    .map(|t| t.as_millis().to_string())
                    .unwrap_or_default(),
            ),
            (
                "MINIFLOW_CRASH",
                self.crash.map(CrashPoint::to_setting).unwrap_or_default(),
            ),
            (
                "MINIFLOW_DEADLINE_MS",
                self.deadline.as_millis().to_string(),
            ),
            ("MINIFLOW_ASYNC", self.asynchronous.to_string()),
        ]
    }

    /// Starts a child process delivering with these settings.
    pub fn spawn(&self) -> std::process::Child {
        if let Some(point) = self.crash {
            plan_crash(&self.url, &self.app, point);
        }
        child::spawn(
            "postgres::delivery::child_pg_worker",
            "pg_worker",
            &self.settings(),
        )
    }
}

/// Child process: a worker process (see [`Workers`]). Prints what it did.
#[test]
fn child_pg_worker() {
    if child::role().as_deref() != Some("pg_worker") {
        return;
    }
    let ms = |name| Duration::from_millis(child::setting(name).parse().unwrap());
    let workers = Workers {
        url: child::setting("MINIFLOW_PG_URL"),
        app: child::setting("MINIFLOW_PG_APP"),
        workers: child::setting("MINIFLOW_WORKERS").parse().unwrap(),
        lease: ms("MINIFLOW_LEASE_MS"),
        orders: child::setting("MINIFLOW_ORDERS").parse().unwrap(),
        idempotency: if child::setting("MINIFLOW_RECEIPTS") == "true" {
            Idempotency::Receipts
        } else {
            Idempotency::Reservations
        },
        connect_timeout: child::optional("MINIFLOW_CONNECT_TIMEOUT_MS")
            .map(|ms| Duration::from_millis(ms.parse().unwrap())),
        crash: child::optional("MINIFLOW_CRASH").map(|c| CrashPoint::parse(&c)),
        deadline: ms("MINIFLOW_DEADLINE_MS"),
        asynchronous: child::setting("MINIFLOW_ASYNC") == "true",
    };
    let report = workers.run();
    let s = report.stats;
    println!(
        "settled={} claimed={} completed={} dead={} retried={} lost_leases={} released={} \
         timers_fired={} store_errors={} errors={} workers_stopped={} listening={}",
        report.settled,
        s.claimed,
        s.completed,
        s.dead,
        s.retried,
        s.lost_leases,
        s.released,
        s.timers_fired,
        s.store_errors,
        report.errors,
        report.stopped_on.len(),
        report.listening
    );
    for error in &report.first_errors {
        println!("error: {error}");
    }
    assert!(
        report.settled && report.stopped_on.is_empty(),
        "not settled by the deadline, or workers stopped: {report:?}"
    );
}

/// Starts a producer process placing its share of orders `0..orders`, as `app`.
pub fn spawn_producer(
    url: &str,
    app: &str,
    orders: usize,
    share: usize,
    shares: usize,
    crash: Option<CrashPoint>,
) -> std::process::Child {
    if let Some(point) = crash {
        plan_crash(url, app, point);
    }
    let settings = [
        ("MINIFLOW_PG_URL", url.to_owned()),
        ("MINIFLOW_PG_APP", app.to_owned()),
        ("MINIFLOW_ORDERS", orders.to_string()),
        ("MINIFLOW_SHARE", format!("{share}/{shares}")),
    ];
    child::spawn(
        "postgres::delivery::child_pg_producer",
        "pg_producer",
        &settings,
    )
}

/// Child process: a producer placing its share of the orders. Prints how many errors it rode out.
#[test]
fn child_pg_producer() {
    if child::role().as_deref() != Some("pg_producer") {
        return;
    }
    let url = child::setting("MINIFLOW_PG_URL");
    let app = child::setting("MINIFLOW_PG_APP");
    let share = child::setting("MINIFLOW_SHARE");
    let (share, shares) = share.split_once('/').unwrap();
    let mut store = connect(&url, &app).unwrap();
    let errors = produce(
        &mut store,
        child::setting("MINIFLOW_ORDERS").parse().unwrap(),
        share.parse().unwrap(),
        shares.parse().unwrap(),
    );
    println!("producer_errors={errors}");
}

/// The sum of what child worker processes reported as `key`.
pub fn sum_reported(outputs: &[String], key: &str) -> u64 {
    outputs
        .iter()
        .map(|out| {
            child::reported(out, key)
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or_else(|| panic!("no {key} in:\n{out}"))
        })
        .sum()
}

fn strings(client: &mut Client, sql: &str) -> Vec<String> {
    client
        .query(sql, &[])
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .iter()
        .map(|row| row.get(0))
        .collect()
}

fn count(client: &mut Client, sql: &str) -> i64 {
    client
        .query_one(sql, &[])
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .get(0)
}

/// Fails with `what` and the first offenders unless `offenders` is empty.
fn none(offenders: Vec<String>, context: &str, what: &str) {
    assert!(
        offenders.is_empty(),
        "{context}: {what} ({} in all): {:#?}",
        offenders.len(),
        &offenders[..offenders.len().min(10)]
    );
}

/// Checks every invariant after a run over orders `0..orders`:
/// - each order placed once with exactly its parcels; each reminder fired exactly once with its
///   `remind`; each lost parcel dead with exactly one `command_failed` and its `refund`; no timer
///   left scheduled;
/// - every command settled: done, or dead for the lost parcels; none lost;
/// - exactly one effect per done command, none for any other, every receiver record completed;
/// - the leases, from the history of every outbox row: a fencing token only ever grows, by one, at
///   a claim; a claim takes a leased command only once its lease ran out (by the database's
///   clock); only the current holder's token completes it; every delivery the receiver saw carries
///   a token a claim handed out, and no token was delivered twice.
///
/// Returns what the history shows of the run.
pub fn check_invariants(url: &str, orders: usize, context: &str) -> History {
    let mut db = plain_client(url, "check").unwrap();
    let lost = lost(orders) as i64;
    let orders = orders as i64;
    let events_of = |db: &mut Client, kind: &str| {
        count(
            db,
            &format!("SELECT count(*) FROM events WHERE kind = '{kind}'"),
        )
    };
    assert_eq!(
        events_of(&mut db, "order_placed"),
        orders,
        "{context}: every order placed exactly once"
    );
    assert_eq!(
        events_of(&mut db, TIMER_FIRED),
        orders,
        "{context}: one reminder fired per order"
    );
    assert_eq!(
        events_of(&mut db, COMMAND_FAILED),
        lost,
        "{context}: one failure event per lost parcel"
    );
    none(
        strings(
            &mut db,
            &format!(
                "SELECT e.workflow_id || ':' || e.seq || ' ' || e.kind || ' with ' || count(o.idx) \
                 FROM events e LEFT JOIN outbox o \
                     ON o.workflow_id = e.workflow_id AND o.event_seq = e.seq \
                 GROUP BY e.workflow_id, e.seq, e.kind \
                 HAVING count(o.idx) != CASE e.kind WHEN 'order_placed' THEN {PARCELS} ELSE 1 END"
            ),
        ),
        context,
        "events without exactly their commands",
    );
    none(
        strings(
            &mut db,
            "SELECT payload FROM events WHERE kind IN ('timer_fired', 'command_failed') \
             GROUP BY workflow_id, payload HAVING count(*) > 1",
        ),
        context,
        "timers fired or failures fed back twice",
    );
    let timers = strings(
        &mut db,
        "SELECT status || ' ' || count(*) FROM timers GROUP BY status",
    );
    assert_eq!(
        timers,
        [format!("fired {}", orders + lost)],
        "{context}: every timer fired, none left"
    );

    let expected = commands_of(orders as usize) as i64;
    assert_eq!(
        count(&mut db, "SELECT count(*) FROM outbox"),
        expected,
        "{context}: no command lost"
    );
    none(
        strings(
            &mut db,
            "SELECT workflow_id || ':' || event_seq || ':' || idx || ' ' || status FROM outbox \
             WHERE status NOT IN ('done', 'dead')",
        ),
        context,
        "commands not settled",
    );
    none(
        strings(
            &mut db,
            &format!(
                "SELECT workflow_id || ':' || event_seq || ':' || idx || ' ' || kind || ' ' || \
                     coalesce(last_error, '') FROM outbox \
                 WHERE status = 'dead' AND NOT (kind = 'ship' AND payload::jsonb->'parcel' = '{}' \
                     AND (payload::jsonb->>'n')::int % {LOSS_EVERY} = 0)",
                PARCELS - 1
            ),
        ),
        context,
        "dead commands other than the lost parcels",
    );
    assert_eq!(
        count(&mut db, "SELECT count(*) FROM outbox WHERE status = 'dead'"),
        lost,
        "{context}: every lost parcel dead"
    );

    // One effect per done command, none for another.
    none(
        strings(
            &mut db,
            "SELECT o.workflow_id || ':' || o.event_seq || ':' || o.idx || ' ' || o.status || \
                 ' with ' || count(e.command_id) || ' effects' \
             FROM outbox o LEFT JOIN effects e \
                 ON e.command_id = o.workflow_id || ':' || o.event_seq || ':' || o.idx \
             GROUP BY o.workflow_id, o.event_seq, o.idx, o.status \
             HAVING count(e.command_id) != CASE o.status WHEN 'done' THEN 1 ELSE 0 END",
        ),
        context,
        "commands without exactly one effect each (done) or none (dead)",
    );
    none(
        strings(
            &mut db,
            "SELECT e.command_id FROM effects e LEFT JOIN outbox o \
                 ON e.command_id = o.workflow_id || ':' || o.event_seq || ':' || o.idx \
             WHERE o.idx IS NULL",
        ),
        context,
        "effects of unknown commands",
    );
    none(
        strings(&mut db, "SELECT key FROM idempotency WHERE result IS NULL"),
        context,
        "receiver records not completed",
    );
    none(
        strings(
            &mut db,
            "SELECT r.command_id || ' receipt counts ' || r.attempts || ', receiver logged ' || \
                 count(d.id) FROM receipts r LEFT JOIN deliveries d \
                 ON d.command_id = r.command_id AND d.answer IN ('effect', 'completed') \
             GROUP BY r.command_id, r.attempts HAVING count(d.id) != r.attempts",
        ),
        context,
        "receipts whose count of attempts is not what the receiver logged",
    );
    none(
        strings(
            &mut db,
            "SELECT e.command_id || ' effect by token ' || e.token || ', receiver saw ' || \
                 string_agg(d.token::text || ' ' || d.answer, ', ') \
             FROM effects e JOIN deliveries d ON d.command_id = e.command_id \
             GROUP BY e.command_id, e.token \
             HAVING count(*) FILTER (WHERE d.answer = 'effect') != 1",
        ),
        context,
        "effects not logged as exactly one delivery that made it",
    );

    check_leases(&mut db, context);
    let mut of = |sql: &str| u64::try_from(count(&mut db, sql)).unwrap();
    History {
        deliveries: of("SELECT count(*) FROM deliveries"),
        repeats: of("SELECT count(*) FROM deliveries WHERE answer IN ('completed', 'in_progress')"),
        takeovers: of(
            "SELECT count(*) FROM lease_history WHERE new_token > old_token AND old_status = 'leased'",
        ),
    }
}

/// What the history of a run shows, beside its invariants.
#[derive(Debug)]
pub struct History {
    /// Deliveries the receiver saw.
    pub deliveries: u64,
    /// Deliveries of a command it had already done or was doing (answered from its record).
    pub repeats: u64,
    /// Claims of a command whose lease had run out (its holder crashed, stalled, or lost the server).
    pub takeovers: u64,
}

/// The lease checks of [`check_invariants`], on `lease_history` and `deliveries`.
fn check_leases(db: &mut Client, context: &str) {
    // Every change of a row, in the order the row's lock serialised them.
    let rows = db
        .query(
            "SELECT command_id, old_status, new_status, old_token, new_token, old_expires, \
                 new_expires, old_owner, owner, app, at FROM lease_history \
             ORDER BY command_id, id",
            &[],
        )
        .unwrap();
    let mut claimed: BTreeMap<String, BTreeSet<i64>> = BTreeMap::new();
    let mut violations = Vec::new();
    for row in &rows {
        let command: String = row.get(0);
        let (old_status, new_status): (String, String) = (row.get(1), row.get(2));
        let (old_token, new_token): (i64, i64) = (row.get(3), row.get(4));
        let (old_expires, new_expires): (Option<i64>, Option<i64>) = (row.get(5), row.get(6));
        let (old_owner, owner): (Option<String>, Option<String>) = (row.get(7), row.get(8));
        let (app, at): (String, i64) = (row.get(9), row.get(10));
        let change = format!(
            "{command}: {old_status}→{new_status}, token {old_token}→{new_token}, lease \
             {old_expires:?}→{new_expires:?}, owner {old_owner:?}→{owner:?}, written by {app} \
             at {at}"
        );
        if new_token != old_token {
            if new_token != old_token + 1 || new_status != "leased" {
                violations.push(format!("a token changed other than by a claim: {change}"));
            }
            if old_status == "leased" && old_expires.is_none_or(|expires| expires > at) {
                violations.push(format!("claimed while the lease was live: {change}"));
            }
            if !claimed
                .entry(command.clone())
                .or_default()
                .insert(new_token)
            {
                violations.push(format!("a token handed out twice: {change}"));
            }
        } else if new_status == "done" && old_status != "leased" {
            violations.push(format!("completed without a lease: {change}"));
        } else if new_status == "leased" && old_status != "leased" {
            violations.push(format!("leased without a new token: {change}"));
        } else if new_status == "leased" && owner != old_owner {
            violations.push(format!(
                "a live lease changed hands, its token kept: {change}"
            ));
        }
        if matches!(old_status.as_str(), "done" | "dead") {
            violations.push(format!("a settled command changed: {change}"));
        }
    }
    none(violations, context, "lease violations");

    let deliveries = db
        .query(
            "SELECT command_id, token, app, answer FROM deliveries ORDER BY id",
            &[],
        )
        .unwrap();
    let mut delivered: BTreeMap<(String, i64), String> = BTreeMap::new();
    let mut violations = Vec::new();
    for row in &deliveries {
        let (command, token, app, answer): (String, i64, String, String) =
            (row.get(0), row.get(1), row.get(2), row.get(3));
        let this = format!("{command} token {token} to {app} ({answer})");
        if !claimed.get(&command).is_some_and(|t| t.contains(&token)) {
            violations.push(format!(
                "delivered with a token no claim handed out: {this}"
            ));
        }
        if let Some(before) = delivered.insert((command, token), this.clone()) {
            violations.push(format!("one lease delivered twice: {before} and {this}"));
        }
    }
    none(violations, context, "delivery violations");
}

/// Runs a dispatcher in this process until everything is settled (the recovery after a crash):
/// finishes placing the orders, then delivers. Panics, saying what is left, past `deadline`.
pub fn recover(url: &str, orders: usize, lease: Duration, context: &str) -> Report {
    let mut store = connect(url, "recovery").unwrap();
    produce(&mut store, orders, 0, 1);
    let report = Workers {
        url: url.to_owned(),
        app: "recovery".to_owned(),
        workers: 2,
        lease,
        orders,
        idempotency: Idempotency::Reservations,
        connect_timeout: None,
        crash: None,
        deadline: Duration::from_secs(60),
        asynchronous: false,
    }
    .run();
    if !report.settled || !report.stopped_on.is_empty() {
        let mut db = plain_client(url, "check").unwrap();
        let left = strings(
            &mut db,
            "SELECT workflow_id || ':' || event_seq || ':' || idx || ' ' || status || ' ' || \
                 attempts || ' ' || coalesce(last_error, '') FROM outbox \
             WHERE processed_at IS NULL LIMIT 10",
        );
        // What else `settled` waits for: every order placed, every timer settled.
        let placed = count(
            &mut db,
            "SELECT count(*) FROM events WHERE kind = 'order_placed'",
        );
        let timers = strings(
            &mut db,
            "SELECT timer_id || ' ' || status || ' available_at=' || available_at || \
                 ' now=' || floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint \
             FROM timers WHERE processed_at IS NULL LIMIT 10",
        );
        panic!(
            "{context}: recovery did not settle everything: {report:?}, left: {left:?}, \
             orders placed: {placed} of {orders}, timers left: {timers:?}"
        );
    }
    report
}

/// A fresh database for one run, instrumented.
pub fn fresh_database() -> (TestDatabase, String) {
    let database = TestDatabase::new();
    let url = database.url();
    prepare(&url);
    (database, url)
}

#[test]
fn three_processes_deliver_10000_commands_with_one_effect_each_and_no_double_claim() {
    const PRODUCERS: usize = 4;
    let orders = 600; // 10,350 commands
    let started = Instant::now();
    let (_database, url) = fresh_database();
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|share| {
            spawn_producer(
                &url,
                &format!("producer-{share}"),
                orders,
                share,
                PRODUCERS,
                None,
            )
        })
        .collect();
    let workers: Vec<_> = (0..3)
        .map(|n| {
            Workers {
                url: url.clone(),
                app: format!("workers-{n}"),
                workers: 3,
                lease: Duration::from_secs(30),
                orders,
                idempotency: Idempotency::Receipts,
                connect_timeout: None,
                crash: None,
                deadline: Duration::from_secs(120),
                asynchronous: false,
            }
            .spawn()
        })
        .collect();
    for producer in producers {
        let out = child::wait_ok(producer, "producer process");
        assert_eq!(
            child::reported(&out, "producer_errors").as_deref(),
            Some("0"),
            "{out}"
        );
    }
    let outputs: Vec<String> = workers
        .into_iter()
        .map(|process| child::wait_ok(process, "worker process"))
        .collect();
    let elapsed = started.elapsed();
    let context = &format!("3 worker processes × 3 workers, {PRODUCERS} producer processes");
    let commands = commands_of(orders) as u64;
    let dead = lost(orders) as u64;
    let history = check_invariants(&url, orders, context);
    assert_eq!(
        (history.deliveries, history.repeats, history.takeovers),
        (commands, 0, 0),
        "{context}: without a crash, one delivery per command and no lease taken over"
    );
    // Without a crash every command is claimed and delivered exactly once, on its first lease.
    let mut db = plain_client(&url, "check").unwrap();
    none(
        strings(
            &mut db,
            "SELECT command_id || ' delivered ' || count(*) || ' times, tokens ' || \
                 string_agg(token::text, ',') FROM deliveries GROUP BY command_id \
             HAVING count(*) != 1 OR max(token) != 1",
        ),
        context,
        "commands not delivered exactly once, with token 1",
    );
    assert_eq!(
        count(&mut db, "SELECT count(DISTINCT command_id) FROM deliveries"),
        commands as i64,
        "{context}: every command delivered"
    );
    for key in ["store_errors", "errors", "lost_leases", "released"] {
        assert_eq!(
            sum_reported(&outputs, key),
            0,
            "{context}: {key}: {outputs:#?}"
        );
    }
    assert_eq!(
        sum_reported(&outputs, "completed"),
        commands - dead,
        "{context}: {outputs:#?}"
    );
    assert_eq!(sum_reported(&outputs, "dead"), dead, "{context}");
    assert_eq!(
        sum_reported(&outputs, "claimed"),
        commands,
        "{context}: each command claimed once"
    );
    assert_eq!(
        sum_reported(&outputs, "timers_fired"),
        (orders as u64) + dead,
        "{context}"
    );
    for out in &outputs {
        assert!(
            sum_reported(std::slice::from_ref(out), "completed") > 0,
            "{context}: a process did nothing:\n{out}"
        );
    }
    eprintln!(
        "{context}: {commands} commands ({} done, {dead} dead) delivered in {:.1} s",
        commands - dead,
        elapsed.as_secs_f64()
    );
}
