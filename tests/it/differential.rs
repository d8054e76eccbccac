//! The seeded differential test: random sequences of every [`Store`] operation (the operators' too:
//! controls of kinds, bulk actions, stats) run against a
//! [`MemoryStore`] and a [`SqliteStore`] on a real file side by side (and, with the `postgres`
//! feature, against a [`MemoryStore`] and a `PostgresStore`, so all three agree), with the clock moving forwards and
//! backwards. Every answer must agree (values, and error kinds by [`Error::code`]), and so must the
//! state: the unfinished commands after every step, and every workflow's events, commands and timers
//! and the dead letters every ten steps and after the last. A disagreement fails with the seed, the
//! step, the operation, a line diff of the two answers and the steps that led there.
//!
//! Without settings a fixed set of seeds runs, so a CI failure replays on any machine.
//! `MINIFLOW_DIFF_SEED=n` replays seed `n` alone; `MINIFLOW_DIFF_RUNS=n` soaks `n` seeds from a random
//! start (shown with `--nocapture`, and in any failure).

use std::time::Duration;

use miniflow::prelude::*;
use miniflow::{
    canonical_json, json, Ack, ClaimOrder, ClaimRequest, Command, CommandId, Commit, Decision,
    Delivery, Engine, Error, Event, EventRecord, Extended, Failure, Handled, KindChange,
    KindControl, Lease, MemoryStore, Missed, OutboxRow, OutboxStats, RetryPolicy, Schedule, Seq,
    Settled, SqliteOptions, SqliteStore, Status, Synchronous, Timer, TimerId, TimerRow,
    TimerSource, TimerStatus, Timestamp, Workflow, WorkflowId,
};

/// The seeds CI runs.
const DEFAULT_SEEDS: std::ops::Range<u64> = 0..16;
/// Operations per seed.
const STEPS: usize = 300;
/// The whole state is compared after every this many steps.
const FULL_CHECK_EVERY: usize = 10;
/// The workflows the operations touch: one with a `:`, and two whose IDs order as text, not numbers.
const WORKFLOWS: [&str; 4] = ["a", "a:b", "b-10", "b-9"];
const KINDS: [&str; 3] = ["book", "pay", "mail"];
const TIMER_NAMES: [&str; 3] = ["deadline", "reminder", "expiry"];
/// Where the clock starts; it wanders forwards and backwards from here.
const START: u64 = 1_700_000_000_000;
/// How many deliveries (with their tokens) the run remembers for later acks and failures.
const REMEMBERED_DELIVERIES: usize = 40;

#[test]
fn memory_and_sqlite_agree_on_random_operations() {
    for seed in seeds(DEFAULT_SEEDS) {
        Run::sqlite(seed).play(STEPS);
    }
}

/// The seeds CI runs against PostgreSQL: fewer, as each step is a few round trips.
#[cfg(feature = "postgres")]
const DEFAULT_POSTGRES_SEEDS: std::ops::Range<u64> = 0..8;

#[cfg(feature = "postgres")]
#[test]
fn memory_and_postgres_agree_on_random_operations() {
    for seed in seeds(DEFAULT_POSTGRES_SEEDS) {
        let database = crate::postgres::TestDatabase::new();
        let store = miniflow::PostgresStore::connect(&database.url())
            .expect("connect to the PostgreSQL store");
        Run::new(seed, store, "PostgresStore", Box::new(database)).play(STEPS);
    }
}

/// The async store, through the synchronous traits (`postgres/blocking.rs`): its own statements and
/// transactions, driven by the same random operations.
#[cfg(feature = "postgres")]
#[test]
fn memory_and_async_postgres_agree_on_random_operations() {
    for seed in seeds(DEFAULT_POSTGRES_SEEDS) {
        let database = crate::postgres::TestDatabase::new();
        let store = crate::postgres::Blocking::connect(&database.url());
        Run::new(seed, store, "AsyncPostgresStore", Box::new(database)).play(STEPS);
    }
}

fn seeds(default: std::ops::Range<u64>) -> Vec<u64> {
    let setting = |name: &str| {
        std::env::var(name).ok().map(|value| {
            value
                .trim()
                .parse::<u64>()
                .unwrap_or_else(|_| panic!("{name} must be a number, not {value:?}"))
        })
    };
    if let Some(seed) = setting("MINIFLOW_DIFF_SEED") {
        eprintln!("differential: replaying seed {seed}");
        return vec![seed];
    }
    if let Some(runs) = setting("MINIFLOW_DIFF_RUNS") {
        let start = fastrand::u64(..);
        eprintln!("differential: {runs} seeds from {start}");
        return (0..runs).map(|i| start.wrapping_add(i)).collect();
    }
    default.collect()
}

fn ms(millis: u64) -> Duration {
    Duration::from_millis(millis)
}

fn wid(text: &str) -> WorkflowId {
    WorkflowId::new(text).expect("a valid workflow ID")
}

/// One seeded run: both stores, the clock, and what the run has seen so far.
struct Run<S> {
    seed: u64,
    rng: fastrand::Rng,
    step: usize,
    now: Timestamp,
    memory: MemoryStore,
    /// The store compared with the memory store, and its name in reports.
    other: S,
    name: &'static str,
    /// What the other store lives in (a directory, a database), kept until the run ends.
    _home: Box<dyn std::any::Any>,
    /// Deliveries handed out so far, current or stale: the tokens acks and failures are made with.
    deliveries: Vec<Delivery>,
    /// Each step's operation, for the report of a disagreement.
    log: Vec<String>,
}

impl Run<SqliteStore> {
    fn sqlite(seed: u64) -> Self {
        let dir = tempfile::tempdir().expect("temporary directory");
        // The test compares answers, not durability: NORMAL spares an fsync per step.
        let options = SqliteOptions {
            synchronous: Synchronous::Normal,
            ..SqliteOptions::default()
        };
        let sqlite = SqliteStore::open_with(dir.path().join("differential.db"), &options)
            .expect("open the SQLite store");
        Run::new(seed, sqlite, "SqliteStore", Box::new(dir))
    }
}

impl<S: Store> Run<S> {
    fn new(seed: u64, other: S, name: &'static str, home: Box<dyn std::any::Any>) -> Self {
        Self {
            seed,
            rng: fastrand::Rng::with_seed(seed),
            step: 0,
            now: Timestamp::from_millis(START),
            memory: MemoryStore::new(),
            other,
            name,
            _home: home,
            deliveries: Vec::new(),
            log: Vec::new(),
        }
    }

    fn play(mut self, steps: usize) {
        for step in 1..=steps {
            self.step = step;
            self.one_step();
            if step % FULL_CHECK_EVERY == 0 {
                self.compare_state();
            } else {
                self.compare_queues();
            }
        }
        self.compare_state();
    }

    fn one_step(&mut self) {
        match self.rng.u32(0..110) {
            100..=103 => self.control_kind(),
            104..=106 => self.bulk(),
            0..=19 => self.append(),
            20..=34 => self.claim(),
            35..=43 => self.complete(),
            44..=47 => self.complete_all(),
            48..=55 => self.fail(),
            56..=59 => self.extend(),
            60..=62 => self.release(),
            63..=65 => self.mark_done(),
            66..=69 => self.retry(),
            70..=72 => self.resolve(),
            73..=75 => self.purge_done(),
            76..=79 => self.claim_timers(),
            80..=86 => self.fire(),
            87..=95 => self.move_clock(),
            96..=99 | 107.. => self.read(),
        }
    }

    // ------------------------------------------------------------------------------------------------
    // Comparing

    /// Both answers must be equal values, or errors of the same kind; returns the memory store's value.
    fn agree<T: PartialEq + Lines>(
        &self,
        operation: &str,
        memory: Result<T, Error>,
        sqlite: Result<T, Error>,
    ) -> Option<T> {
        let same = match (&memory, &sqlite) {
            (Ok(m), Ok(s)) => m == s,
            (Err(m), Err(s)) => m.code() == s.code(),
            _ => false,
        };
        if !same {
            self.disagree(operation, &answer_lines(&memory), &answer_lines(&sqlite));
        }
        memory.ok()
    }

    fn disagree(&self, operation: &str, memory: &[String], sqlite: &[String]) -> ! {
        let recent = self.log.len().saturating_sub(30);
        panic!(
            "MemoryStore and {name} disagree: seed {seed}, step {step}\n\
             operation: {operation}\n\
             answers (- memory, + {name}):\n{diff}\n\
             replay: MINIFLOW_DIFF_SEED={seed} cargo test -p miniflow --test it differential::\n\
             the last steps:\n{steps}",
            name = self.name,
            seed = self.seed,
            step = self.step,
            diff = diff(memory, sqlite),
            steps = self.log[recent..].join("\n"),
        );
    }

    /// Runs `operation` on both stores at the run's `now`; both answers must agree.
    fn both<T: PartialEq + Lines>(
        &mut self,
        operation: String,
        run: impl Fn(&mut dyn Store, Timestamp) -> Result<T, Error>,
    ) -> Option<T> {
        self.record(&operation);
        let memory = run(&mut self.memory, self.now);
        let sqlite = run(&mut self.other, self.now);
        self.agree(&operation, memory, sqlite)
    }

    fn record(&mut self, operation: &str) {
        self.log
            .push(format!("  {:>4} @{}: {operation}", self.step, self.now));
    }

    /// Every unfinished command: cheap enough after every step, and where most disagreements show
    /// first (a claim, a failure, a burial).
    fn compare_queues(&self) {
        self.agree(
            "after the step: pending(all)",
            self.memory.pending(usize::MAX),
            self.other.pending(usize::MAX),
        );
    }

    /// Every workflow's events, commands and timers, every unfinished command and every dead letter.
    fn compare_state(&self) {
        for w in WORKFLOWS {
            let w = wid(w);
            self.agree(
                &format!("after the step: load({w})"),
                self.memory.load(&w),
                self.other.load(&w),
            );
            self.agree(
                &format!("after the step: commands({w})"),
                self.memory.commands(&w),
                self.other.commands(&w),
            );
            self.agree(
                &format!("after the step: timers({w})"),
                self.memory.timers(&w),
                self.other.timers(&w),
            );
        }
        self.agree(
            "after the step: pending(all)",
            self.memory.pending(usize::MAX),
            self.other.pending(usize::MAX),
        );
        self.agree(
            "after the step: dead_letters(all)",
            self.memory.dead_letters(usize::MAX),
            self.other.dead_letters(usize::MAX),
        );
        self.agree(
            "after the step: kind_controls()",
            self.memory.kind_controls(),
            self.other.kind_controls(),
        );
        self.agree(
            "after the step: stats(now)",
            self.memory.stats(self.now),
            self.other.stats(self.now),
        );
    }

    // ------------------------------------------------------------------------------------------------
    // Choosing inputs (always from the memory store's state, so both stores get the same input)

    fn workflow(&mut self) -> WorkflowId {
        wid(WORKFLOWS[self.rng.usize(..WORKFLOWS.len())])
    }

    fn last_seq(&self, w: &WorkflowId) -> Seq {
        self.memory
            .load(w)
            .expect("memory load")
            .last()
            .map_or(Seq::ZERO, |e| e.seq)
    }

    fn payload(&mut self, i: usize) -> serde_json::Value {
        json!({ "step": self.step, "i": i, "to": "成都", "tags": [self.rng.u8(..), null, true] })
    }

    fn decision(&mut self, w: &WorkflowId) -> Decision {
        let mut decision = Decision::new();
        // Withdraw earlier commands of the workflow: by kind, or one by ID (any status).
        if self.rng.u8(..5) == 0 {
            decision = decision.cancel_commands_of_kind(KINDS[self.rng.usize(..KINDS.len())]);
        }
        if self.rng.u8(..5) == 0 {
            let rows = self.memory.commands(w).expect("memory commands");
            if !rows.is_empty() {
                let id = rows[self.rng.usize(..rows.len())].command_id.clone();
                decision = decision.cancel_command(id);
            }
        }
        // Now and then more than ten commands, so `…:1:2` must come before `…:1:10`.
        let commands = if self.rng.u8(..20) == 0 {
            11
        } else {
            self.rng.usize(0..=3)
        };
        for i in 0..commands {
            let kind = KINDS[self.rng.usize(..KINDS.len())];
            let payload = self.payload(i);
            let priority = [-1, 0, 0, 0, 2, 5][self.rng.usize(..6)];
            let command = Command::new(kind, payload).priority(priority);
            decision = decision.command(if self.rng.u8(..3) == 0 {
                command.report_result()
            } else {
                command
            });
        }
        if self.rng.u8(..3) == 0 {
            let name = TIMER_NAMES[self.rng.usize(..TIMER_NAMES.len())];
            decision = decision.cancel_timer(name);
        }
        for i in 0..self.rng.usize(0..=2) {
            let name = TIMER_NAMES[self.rng.usize(..TIMER_NAMES.len())];
            let payload = self.payload(i);
            let timer = if self.rng.bool() {
                Timer::after(name, ms(self.rng.u64(0..=4_000)), payload)
            } else {
                let at = (self.now.as_millis() + self.rng.u64(0..=4_000))
                    .saturating_sub(self.rng.u64(0..=2_000));
                Timer::at(name, Timestamp::from_millis(at), payload)
            };
            decision = decision.timer(timer);
        }
        // Now and then a recurring schedule, under a timer's name (replacing what runs under it).
        if self.rng.u8(..6) == 0 {
            let name = TIMER_NAMES[self.rng.usize(..TIMER_NAMES.len())];
            let schedule = if self.rng.bool() {
                Schedule::every(name, ms(1_000 * self.rng.u64(1..=4)))
            } else {
                Schedule::cron(name, "*/2 * * * * *")
            };
            let missed = match self.rng.u32(0..=3) {
                0 => Missed::FireOnce,
                max => Missed::FireAll { max },
            };
            decision = decision.schedule(schedule.on_missed(missed).payload(self.payload(0)));
        }
        decision
    }

    /// A delivery seen so far, mostly a recent one, now and then with a wrong token; an unknown
    /// command when there is none.
    fn delivery(&mut self) -> (CommandId, u64) {
        if self.deliveries.is_empty() || self.rng.u8(..25) == 0 {
            return ("a:999:0".parse().expect("an ID"), 1);
        }
        let n = self.deliveries.len();
        let index = if self.rng.u8(..10) < 7 {
            n - 1 - self.rng.usize(..n.min(6))
        } else {
            self.rng.usize(..n)
        };
        let d = &self.deliveries[index];
        let token = match self.rng.u8(..10) {
            0 => d.token + 1,
            1 => d.token.saturating_sub(1),
            _ => d.token,
        };
        (d.command_id.clone(), token)
    }

    /// A command of any workflow, preferably one in `status`; now and then an unknown one.
    fn command_id(&mut self, status: Status) -> CommandId {
        let rows: Vec<_> = WORKFLOWS
            .iter()
            .flat_map(|w| self.memory.commands(&wid(w)).expect("memory commands"))
            .collect();
        let preferred: Vec<_> = rows.iter().filter(|r| r.status == status).collect();
        if !preferred.is_empty() && self.rng.u8(..10) < 7 {
            return preferred[self.rng.usize(..preferred.len())]
                .command_id
                .clone();
        }
        if rows.is_empty() || self.rng.u8(..20) == 0 {
            return "b-9:999:3".parse().expect("an ID");
        }
        rows[self.rng.usize(..rows.len())].command_id.clone()
    }

    fn ttl(&mut self) -> Duration {
        match self.rng.u8(..40) {
            0 => Duration::ZERO,
            1 => Duration::from_micros(self.rng.u64(1..1_000)),
            _ => ms(self.rng.u64(1..=3_000)),
        }
    }

    fn policy(&mut self) -> RetryPolicy {
        RetryPolicy::default()
            .initial_delay(ms(self.rng.u64(0..=500)))
            .multiplier(f64::from(self.rng.u8(1..=3)))
            .max_delay(ms(self.rng.u64(0..=2_000)))
            .max_attempts(self.rng.u32(1..=4))
            .jitter([0.0, 0.2, 0.5][self.rng.usize(..3)])
    }

    // ------------------------------------------------------------------------------------------------
    // The operations

    fn commit(&mut self, commit: &Commit) {
        let operation = describe(commit);
        self.both(operation, |store, _| store.append_with_commands(commit));
    }

    /// A commit of one or two events with random decisions, usually on the right seq.
    fn append(&mut self) {
        let w = self.workflow();
        let last = self.last_seq(&w).get();
        let expected = match self.rng.u8(..10) {
            0 => last + 1,
            1 => last.saturating_sub(1),
            _ => last,
        };
        let event = Event::new("happened", json!({ "step": self.step }));
        let decision = self.decision(&w);
        let mut commit = Commit::new(
            w.clone(),
            Seq::new(expected).expect("a seq"),
            event,
            decision,
            self.now,
        )
        .expect("a valid commit");
        if self.rng.bool() {
            // Traced commits: the context (and a tracestate, sometimes) rides with each command.
            let trace_id: [u8; 16] = std::array::from_fn(|_| self.rng.u8(..));
            let state = self.rng.bool().then_some("vendor=x");
            let context = miniflow::TraceContext::new(trace_id, [7; 8], 1)
                .and_then(|c| c.with_tracestate(state))
                .expect("a valid trace context");
            commit = commit.traced(context);
        }
        if self.rng.u8(..5) == 0 {
            let decision = self.decision(&w);
            commit
                .push(Event::new("also_happened", json!({})), decision)
                .expect("a valid second event");
        }
        self.commit(&commit);
    }

    /// A commit firing a timer: mostly a scheduled one, sometimes one that fired, was cancelled or
    /// never existed. An occurrence of a schedule fires through the engine, which arms the next
    /// occurrence in the same commit (the decision may stop or restart the schedule).
    fn fire(&mut self) {
        let timers: Vec<TimerRow> = WORKFLOWS
            .iter()
            .flat_map(|w| self.memory.timers(&wid(w)).expect("memory timers"))
            .collect();
        let scheduled: Vec<&TimerRow> = timers
            .iter()
            .filter(|t| t.status == TimerStatus::Scheduled)
            .collect();
        // Occurrences come due one at a time: take a due one when there is one, half the time.
        let due_occurrences: Vec<&TimerRow> = scheduled
            .iter()
            .copied()
            .filter(|t| {
                t.fire_at <= self.now
                    && matches!(t.timer_id.source(), TimerSource::Occurrence { .. })
            })
            .collect();
        let timer_id = if !due_occurrences.is_empty() && self.rng.bool() {
            due_occurrences[self.rng.usize(..due_occurrences.len())]
                .timer_id
                .clone()
        } else if !scheduled.is_empty() && self.rng.u8(..10) < 8 {
            scheduled[self.rng.usize(..scheduled.len())]
                .timer_id
                .clone()
        } else if !timers.is_empty() && self.rng.u8(..10) < 8 {
            timers[self.rng.usize(..timers.len())].timer_id.clone()
        } else {
            TimerId::scheduled(wid("b-10"), Seq::new(999).expect("a seq"), 0).expect("an ID")
        };
        let w = timer_id.workflow_id().clone();
        let decision = self.decision(&w);
        let occurrence = timers.iter().find(|t| {
            t.timer_id == timer_id && matches!(t.timer_id.source(), TimerSource::Occurrence { .. })
        });
        if let Some(row) = occurrence.cloned() {
            let engine = Engine::new(Decides(decision));
            let operation = format!("fire({}) through the engine", row.timer_id);
            self.both(operation, |store, now| engine.fire(store, &row, now));
            return;
        }
        let last = self.last_seq(&w);
        let commit = Commit::new(
            w,
            last,
            Event::new("timer_fired", json!({ "timer_id": timer_id.to_string() })),
            decision,
            self.now,
        )
        .and_then(|commit| commit.firing(timer_id))
        .expect("a valid firing commit");
        self.commit(&commit);
    }

    fn claim(&mut self) {
        let worker = match self.rng.u8(..40) {
            0 => "",
            n if n % 2 == 0 => "w1",
            _ => "w2",
        };
        let order = if self.rng.bool() {
            ClaimOrder::DueFirst
        } else {
            ClaimOrder::StrictPerWorkflow
        };
        let max_attempts = self.rng.u32(1..=4);
        let request = ClaimRequest::new(worker)
            .limit(self.rng.usize(0..=5))
            .lease_ttl(self.ttl())
            .order(order)
            .retry_policy(&RetryPolicy::default().max_attempts(max_attempts));
        let operation = format!(
            "claim(worker {worker:?}, limit {}, ttl {:?}, {order:?}, max_attempts {max_attempts})",
            request.limit, request.lease_ttl
        );
        let answer = self.both(operation, |store, now| store.claim(&request, now));
        if let Some(deliveries) = answer {
            self.deliveries.extend(deliveries);
            let excess = self.deliveries.len().saturating_sub(REMEMBERED_DELIVERIES);
            self.deliveries.drain(..excess);
        }
    }

    fn complete(&mut self) {
        let (id, token) = self.delivery();
        let result = self
            .rng
            .bool()
            .then(|| json!({ "reference": format!("R-{}", self.step) }));
        let operation = format!("complete({id}, token {token}, result {result:?})");
        self.both(operation, |store, now| {
            store.complete(&id, token, result.as_ref(), now)
        });
    }

    fn complete_all(&mut self) {
        let acks: Vec<Ack> = (0..self.rng.usize(0..=4))
            .map(|_| {
                let (id, token) = self.delivery();
                Ack::new(id, token)
            })
            .collect();
        let shown: Vec<String> = acks
            .iter()
            .map(|ack| format!("{} token {}", ack.command_id, ack.token))
            .collect();
        let operation = format!("complete_all({})", shown.join(", "));
        // One result per ack: compared by kind, like every error.
        self.both(operation, |store, now| {
            store.complete_all(acks.clone(), now).map(|results| {
                results
                    .into_iter()
                    .map(|r| r.map_err(|e| e.code()))
                    .collect::<Vec<_>>()
            })
        });
    }

    fn fail(&mut self) {
        let (id, token) = self.delivery();
        let failure = if self.rng.u8(..4) == 0 {
            Failure::permanent(format!("422 refused at step {}", self.step))
        } else {
            Failure::retryable(format!("503 at step {}", self.step))
        };
        let policy = self.policy();
        let operation = format!("fail({id}, token {token}, {failure:?}, {policy:?})");
        self.both(operation, |store, now| {
            store.fail(&id, token, &failure, &policy, now)
        });
    }

    fn extend(&mut self) {
        let (id, token) = self.delivery();
        let ttl = ms(self.rng.u64(0..=3_000));
        let operation = format!("extend({id}, token {token}, {ttl:?})");
        self.both(operation, |store, now| store.extend(&id, token, ttl, now));
    }

    fn release(&mut self) {
        let (id, token) = self.delivery();
        let operation = format!("release({id}, token {token})");
        self.both(operation, |store, now| store.release(&id, token, now));
    }

    fn mark_done(&mut self) {
        let id = self.command_id(Status::Pending);
        let operation = format!("mark_done({id})");
        self.both(operation, |store, now| store.mark_done(&id, now));
    }

    fn retry(&mut self) {
        let id = self.command_id(Status::Dead);
        let operation = format!("retry({id})");
        self.both(operation, |store, now| store.retry(&id, now));
    }

    fn resolve(&mut self) {
        let id = self.command_id(Status::Dead);
        let note = format!("settled by hand at step {}", self.step);
        let operation = format!("resolve({id}, {note:?})");
        self.both(operation, |store, now| store.resolve(&id, &note, now));
    }

    fn purge_done(&mut self) {
        let older_than = ms(self.rng.u64(0..=5_000));
        let batch = self.rng.usize(0..=3);
        let operation = format!("purge_done(older than {older_than:?}, batch {batch})");
        self.both(operation, |store, now| {
            store.purge_done(older_than, now, batch)
        });
    }

    /// An operator's change to the controls of a kind: mostly pauses and resumes and small limits,
    /// now and then a bad one (both stores refuse it alike).
    fn control_kind(&mut self) {
        let kind = match self.rng.u8(..30) {
            0 => "",
            _ => KINDS[self.rng.usize(..KINDS.len())],
        };
        let change = match self.rng.u8(..20) {
            0 => KindChange::Limit(0),
            1..=5 => KindChange::Pause,
            6..=12 => KindChange::Resume,
            13..=16 => KindChange::Limit(self.rng.u32(1..=3)),
            _ => KindChange::RemoveLimit,
        };
        let operation = format!("control_kind({kind:?}, {change:?})");
        self.both(operation, |store, now| {
            store.control_kind(kind, change, "operator", now)
        });
    }

    /// A bulk retry or resolution of a kind's dead commands, now and then with a bad batch.
    fn bulk(&mut self) {
        let kind = KINDS[self.rng.usize(..KINDS.len())];
        let batch = match self.rng.u8(..20) {
            0 => 0,
            _ => self.rng.usize(1..=3),
        };
        if self.rng.bool() {
            let operation = format!("retry_dead_of_kind({kind:?}, batch {batch})");
            self.both(operation, |store, now| {
                store.retry_dead_of_kind(kind, batch, now)
            });
        } else {
            let note = format!("settled in bulk at step {}", self.step);
            let operation = format!("resolve_dead_of_kind({kind:?}, {note:?}, batch {batch})");
            self.both(operation, |store, now| {
                store.resolve_dead_of_kind(kind, &note, batch, now)
            });
        }
    }

    fn claim_timers(&mut self) {
        let limit = self.rng.usize(0..=3);
        let ttl = ms(self.rng.u64(0..=2_000));
        let operation = format!("claim_timers(limit {limit}, ttl {ttl:?})");
        self.both(operation, |store, now| store.claim_timers(limit, ttl, now));
    }

    /// Mostly forwards; about a third of the moves go back, as a host's clock may after a correction.
    fn move_clock(&mut self) {
        let now = self.now.as_millis();
        let now = if self.rng.u8(..3) == 0 {
            now.saturating_sub(self.rng.u64(0..=2_000))
        } else {
            now + self.rng.u64(0..=3_000)
        };
        self.now = Timestamp::from_millis(now);
        self.record("clock moved");
    }

    /// One of the reads, with a random limit or target.
    fn read(&mut self) {
        let limit = self.rng.usize(0..=5);
        match self.rng.u8(..10) {
            6 => {
                let operation = "stats(now)".to_owned();
                self.both(operation, |store, now| store.stats(now));
            }
            7 => {
                let kind = KINDS[self.rng.usize(..KINDS.len())];
                let operation = format!("dead_letters_of_kind({kind:?}, {limit})");
                self.both(operation, |store, _| {
                    store.dead_letters_of_kind(kind, limit)
                });
            }
            8 => {
                self.both("kind_controls()".to_owned(), |store, _| {
                    store.kind_controls()
                });
            }
            0 => {
                let operation = format!("pending({limit})");
                self.both(operation, |store, _| store.pending(limit));
            }
            1 => {
                let operation = format!("dead_letters({limit})");
                self.both(operation, |store, _| store.dead_letters(limit));
            }
            2 => {
                let id = self.command_id(Status::Leased);
                let operation = format!("command({id})");
                self.both(operation, |store, _| store.command(&id));
            }
            3 => {
                let w = self.workflow();
                let operation = format!("commands({w})");
                self.both(operation, |store, _| store.commands(&w));
            }
            4 => {
                let w = self.workflow();
                let operation = format!("timers({w})");
                self.both(operation, |store, _| store.timers(&w));
            }
            5 => {
                let w = self.workflow();
                // Mostly inside the history, sometimes at or past its end.
                let after = self.rng.u64(0..=self.last_seq(&w).get() + 2);
                let after = Seq::new(after).expect("a seq");
                let operation = format!("load_after({w}, {after})");
                self.both(operation, |store, _| store.load_after(&w, after));
            }
            _ => {
                let w = self.workflow();
                let operation = format!("load({w})");
                self.both(operation, |store, _| store.load(&w));
            }
        }
    }
}

/// A commit in one line: workflow, expected seq, events, commands, timers, cancellations, firing.
fn describe(commit: &Commit) -> String {
    let commands: Vec<String> = commit
        .commands()
        .iter()
        .map(|c| format!("{} {}", c.command_id, c.kind))
        .collect();
    let timers: Vec<String> = commit
        .timers()
        .iter()
        .map(|t| format!("{} {} at {}", t.timer_id, t.name, t.fire_at))
        .collect();
    format!(
        "append({}, expected {}, {} event(s), commands {commands:?}, timers {timers:?}, cancel {:?}, fires {:?})",
        commit.workflow_id(),
        commit.expected_seq(),
        commit.events().len(),
        commit.cancel_timers(),
        commit.fires().map(ToString::to_string),
    )
}

// ----------------------------------------------------------------------------------------------------
// Showing a disagreement: each answer as lines, one per row, and a line diff of the two

/// An answer as lines of text, one per row.
trait Lines {
    fn lines(&self) -> Vec<String>;
}

/// One row (or one scalar answer) on one line.
trait Line {
    fn line(&self) -> String;
}

impl<T: Line> Lines for T {
    fn lines(&self) -> Vec<String> {
        vec![self.line()]
    }
}

impl<T: Line> Lines for Vec<T> {
    fn lines(&self) -> Vec<String> {
        self.iter().map(Line::line).collect()
    }
}

macro_rules! debug_line {
    ($($t:ty),* $(,)?) => {
        $(impl Line for $t {
            fn line(&self) -> String {
                format!("{self:?}")
            }
        })*
    };
}

debug_line!(
    (),
    usize,
    Timestamp,
    Extended,
    Settled,
    Result<(), &'static str>,
    CommandId,
    KindControl,
    Option<Handled>
);

/// A workflow whose decision on every event is the one it was made with.
struct Decides(Decision);

impl Workflow for Decides {
    type State = ();

    fn evolve(&self, _: &mut (), _: &EventRecord) {}

    fn decide(&self, _: &(), _: &EventRecord) -> Decision {
        self.0.clone()
    }
}

impl Lines for OutboxStats {
    fn lines(&self) -> Vec<String> {
        let mut lines = vec![format!("now {}", self.now)];
        lines.extend(self.kinds.iter().map(|k| format!("{k:?}")));
        lines.extend(self.controls.iter().map(|c| format!("{c:?}")));
        lines
    }
}

fn lease(lease: Option<&Lease>) -> String {
    lease.map_or("-".to_owned(), |l| {
        format!("{}#{} until {}", l.owner, l.token, l.expires_at)
    })
}

impl Line for OutboxRow {
    fn line(&self) -> String {
        format!(
            "{} {} {} attempts {} available_at {} lease {} processed_at {:?} last_error {:?} \
             manual_retries {} resolution {:?} created_at {} payload {} report_result {} \
             result {:?} cancel_requested {} trace {:?}",
            self.command_id,
            self.kind,
            self.status,
            self.attempts,
            self.available_at,
            lease(self.lease.as_ref()),
            self.processed_at.map(|t| t.as_millis()),
            self.last_error,
            self.manual_retries,
            self.resolution,
            self.created_at,
            canonical_json(&self.payload),
            self.report_result,
            self.result.as_ref().map(canonical_json),
            self.cancel_requested,
            self.trace_context
                .as_ref()
                .map(|c| (c.traceparent(), c.tracestate())),
        )
    }
}

impl Line for Option<OutboxRow> {
    fn line(&self) -> String {
        self.as_ref().map_or("None".to_owned(), Line::line)
    }
}

impl Line for Delivery {
    fn line(&self) -> String {
        format!(
            "{} {} attempt {} token {} until {} due {} payload {} trace {:?}",
            self.command_id,
            self.kind,
            self.attempt,
            self.token,
            self.lease_expires_at,
            self.due_at,
            canonical_json(&self.payload),
            self.trace_context
                .as_ref()
                .map(|c| (c.traceparent(), c.tracestate())),
        )
    }
}

impl Line for TimerRow {
    fn line(&self) -> String {
        format!(
            "{} {} {} {} fire_at {} available_at {} created_at {} processed_at {:?} payload {}",
            self.timer_id,
            self.name,
            self.event_kind,
            self.status,
            self.fire_at,
            self.available_at,
            self.created_at,
            self.processed_at.map(|t| t.as_millis()),
            canonical_json(&self.event_payload),
        )
    }
}

impl Line for EventRecord {
    fn line(&self) -> String {
        format!(
            "{}#{} {} at {} payload {}",
            self.workflow_id,
            self.seq,
            self.kind,
            self.recorded_at,
            canonical_json(&self.payload),
        )
    }
}

fn answer_lines<T: Lines>(answer: &Result<T, Error>) -> Vec<String> {
    match answer {
        Ok(value) => {
            let mut lines = vec!["Ok".to_owned()];
            lines.extend(value.lines());
            if lines.len() == 1 {
                lines.push("(none)".to_owned());
            }
            lines
        }
        Err(e) => vec![format!("Err({}): {e}", e.code())],
    }
}

/// A line diff of two answers (longest common subsequence): `-` only in memory's answer, `+` only in
/// SQLite's, and up to two unchanged lines around each change.
fn diff(memory: &[String], sqlite: &[String]) -> String {
    let (n, m) = (memory.len(), sqlite.len());
    // common[i][j]: the longest common subsequence of memory[i..] and sqlite[j..].
    let mut common = vec![vec![0usize; m + 1]; n + 1];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            common[i][j] = if memory[i] == sqlite[j] {
                common[i + 1][j + 1] + 1
            } else {
                common[i + 1][j].max(common[i][j + 1])
            };
        }
    }
    let mut lines: Vec<(char, &str)> = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < n || j < m {
        if i < n && j < m && memory[i] == sqlite[j] {
            lines.push((' ', &memory[i]));
            (i, j) = (i + 1, j + 1);
        } else if j == m || (i < n && common[i + 1][j] >= common[i][j + 1]) {
            lines.push(('-', &memory[i]));
            i += 1;
        } else {
            lines.push(('+', &sqlite[j]));
            j += 1;
        }
    }
    let near_change = |k: usize| {
        lines[k.saturating_sub(2)..(k + 3).min(lines.len())]
            .iter()
            .any(|(mark, _)| *mark != ' ')
    };
    let mut out = Vec::new();
    let mut skipped = false;
    for (k, (mark, line)) in lines.iter().enumerate() {
        if near_change(k) {
            out.push(format!("  {mark} {line}"));
            skipped = false;
        } else if !skipped {
            out.push("    …".to_owned());
            skipped = true;
        }
    }
    out.join("\n")
}
