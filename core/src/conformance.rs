//! The conformance suite: the tests every [`Store`] must pass to be a miniflow store (DESIGN rules 2–9).
//!
//! A backend implements [`Harness`] (open an empty store, reopen it, inject a failure) and expands
//! [`store_conformance_tests!`](crate::store_conformance_tests) once in its tests; every case becomes a
//! `#[test]` of its own. Time is controlled by the tests: every `now` is a parameter.
//!
//! ```
//! use miniflow_core::conformance::Harness;
//! use miniflow_core::MemoryStore;
//!
//! struct MyHarness;
//!
//! impl Harness for MyHarness {
//!     type Store = MemoryStore;
//!
//!     fn open(&mut self) -> MemoryStore {
//!         MemoryStore::new()
//!     }
//!
//!     fn reopen(&mut self, store: MemoryStore) -> MemoryStore {
//!         store
//!     }
//!
//!     fn fail_commits_with_command_kind(&mut self, store: &mut MemoryStore, kind: &str) {
//!         store.fail_commits_with_command_kind(kind);
//!     }
//! }
//!
//! // In a test file: one `#[test]` per case.
//! mod my_store {
//!     miniflow_core::store_conformance_tests!(super::MyHarness);
//! }
//! ```

use std::time::Duration;

use serde::Deserialize;
use serde_json::{json, Value};

use crate::prelude::*;
use crate::{
    Ack, Begin, ClaimOrder, ClaimRequest, Command, CommandCompleted, CommandId, Commit, Decision,
    Digest, Engine, Error, Event, EventRecord, Failure, IdempotencyKey, IdempotencyPolicy,
    IdempotencyStore, RecordState, RetryPolicy, Seq, Settled, Status, Store, Timer, TimerId,
    TimerRow, TimerStatus, Timestamp, Workflow, WorkflowId, COMMAND_COMPLETED, COMMAND_FAILED,
    TIMER_FIRED,
};

/// How the suite drives one backend.
pub trait Harness {
    /// The store under test.
    type Store: Store;

    /// A new, empty store.
    fn open(&mut self) -> Self::Store;

    /// Closes `store` and opens the same data again, as after a restart (an in-memory store may return
    /// it as it is).
    fn reopen(&mut self, store: Self::Store) -> Self::Store;

    /// Makes every later commit that carries a command of `kind` fail after the commit's event rows were
    /// written (a disk error half-way through), so the suite can check that nothing of it remains.
    fn fail_commits_with_command_kind(&mut self, store: &mut Self::Store, kind: &str);
}

/// The command ID vectors shared by every host, as shipped in this crate.
pub const COMMAND_ID_VECTORS: &str = include_str!("../tests/vectors/command_ids.json");

/// The parsed form of [`COMMAND_ID_VECTORS`].
#[derive(Debug, Deserialize)]
pub struct CommandIdVectors {
    /// IDs derived from their parts.
    pub valid: Vec<ValidCase>,
    /// Workflow IDs that must be refused.
    pub invalid_workflow_ids: Vec<InvalidWorkflowId>,
    /// Command IDs that must not parse.
    pub invalid_command_ids: Vec<InvalidCommandId>,
    /// The order `pending` must return.
    pub ordering: OrderingCase,
    /// Timer IDs.
    pub timer_ids: TimerIdVectors,
}

/// Timer ID cases.
#[derive(Debug, Deserialize)]
#[allow(missing_docs)]
pub struct TimerIdVectors {
    pub valid: Vec<TimerIdCase>,
    pub invalid: Vec<InvalidTimerId>,
}

/// One derivable timer ID.
#[derive(Debug, Deserialize)]
#[allow(missing_docs)]
pub struct TimerIdCase {
    pub source: String,
    pub workflow_id: String,
    pub event_seq: Option<u64>,
    pub index: Option<u32>,
    pub command_id: Option<String>,
    pub n: Option<u32>,
    pub timer_id: String,
}

/// A timer ID every host refuses.
#[derive(Debug, Deserialize)]
#[allow(missing_docs)]
pub struct InvalidTimerId {
    pub timer_id: String,
    pub why: String,
}

impl TimerIdCase {
    /// The ID derived from the case's parts.
    pub fn derive(&self) -> Result<TimerId, Error> {
        let command = || -> Result<CommandId, Error> {
            self.command_id.as_deref().unwrap_or_default().parse()
        };
        match self.source.as_str() {
            "scheduled" => TimerId::scheduled(
                WorkflowId::new(self.workflow_id.clone())?,
                Seq::new(self.event_seq.unwrap_or_default())?,
                self.index.unwrap_or_default(),
            ),
            "failure" => Ok(TimerId::failure(command()?, self.n.unwrap_or_default())),
            "completion" => Ok(TimerId::completion(command()?)),
            _ => Ok(TimerId::resolution(command()?)),
        }
    }
}

/// One derivable command ID.
#[derive(Debug, Deserialize)]
#[allow(missing_docs)]
pub struct ValidCase {
    pub workflow_id: String,
    pub event_seq: u64,
    pub index: u32,
    pub command_id: String,
}

/// A workflow ID every host refuses.
#[derive(Debug, Deserialize)]
#[allow(missing_docs)]
pub struct InvalidWorkflowId {
    pub workflow_id: String,
    pub why: String,
}

/// A command ID every host refuses.
#[derive(Debug, Deserialize)]
#[allow(missing_docs)]
pub struct InvalidCommandId {
    pub command_id: String,
    pub why: String,
}

/// 12 commands at seq 1 and one at seq 2 of one workflow, and the order they must come out in.
#[derive(Debug, Deserialize)]
#[allow(missing_docs)]
pub struct OrderingCase {
    pub workflow_id: String,
    pub expected_pending_order: Vec<String>,
}

/// [`COMMAND_ID_VECTORS`], parsed.
///
/// # Panics
///
/// If the shipped file is malformed (a build defect, not an input).
pub fn command_id_vectors() -> CommandIdVectors {
    serde_json::from_str(COMMAND_ID_VECTORS).expect("the shipped command ID vectors parse")
}

// ----------------------------------------------------------------------------------------------------
// Helpers

const T0: Timestamp = Timestamp::from_millis(1_000_000);

fn at(offset_ms: u64) -> Timestamp {
    Timestamp::from_millis(T0.as_millis() + offset_ms)
}

fn wid(text: &str) -> WorkflowId {
    WorkflowId::new(text).expect("valid workflow id in test")
}

fn cid(text: &str) -> CommandId {
    text.parse().expect("valid command id in test")
}

fn commands(kinds: &[&str]) -> Decision {
    kinds
        .iter()
        .map(|kind| Command::new(*kind, json!({ "kind": kind })))
        .collect::<Vec<_>>()
        .into()
}

/// Commits one event with commands of `kinds` on top of the workflow's current last seq.
fn append<S: Store>(store: &mut S, workflow: &str, kinds: &[&str]) -> Seq {
    let id = wid(workflow);
    let last = store
        .load(&id)
        .expect("load")
        .last()
        .map_or(Seq::ZERO, |e| e.seq);
    let commit = Commit::new(
        id,
        last,
        Event::new("happened", json!({})),
        commands(kinds),
        T0,
    )
    .expect("valid commit");
    store.append_with_commands(&commit).expect("commit");
    commit.last_seq()
}

fn seqs(events: &[EventRecord]) -> Vec<u64> {
    events.iter().map(|e| e.seq.get()).collect()
}

fn pending_ids<S: Store>(store: &S) -> Vec<String> {
    store
        .pending(usize::MAX)
        .expect("pending")
        .iter()
        .map(|row| row.command_id.to_string())
        .collect()
}

fn status<S: Store>(store: &S, id: &str) -> Status {
    store
        .command(&cid(id))
        .expect("command")
        .expect("row exists")
        .status
}

fn claim<S: Store>(
    store: &mut S,
    worker: &str,
    limit: usize,
    ttl_ms: u64,
    now: Timestamp,
) -> Vec<crate::Delivery> {
    let request = ClaimRequest::new(worker)
        .limit(limit)
        .lease_ttl(Duration::from_millis(ttl_ms));
    store.claim(&request, now).expect("claim")
}

fn policy() -> RetryPolicy {
    RetryPolicy::default()
        .initial_delay(Duration::from_millis(100))
        .multiplier(2.0)
        .max_delay(Duration::from_millis(350))
        .max_attempts(4)
        .jitter(0.25)
}

/// A workflow that counts its events and decides one command per event; `decide` panics if replay
/// ever calls it.
struct Counter;

impl Workflow for Counter {
    type State = u64;

    fn evolve(&self, state: &mut u64, _event: &EventRecord) {
        *state += 1;
    }

    fn decide(&self, state: &u64, _event: &EventRecord) -> Decision {
        Decision::new().command(Command::new("count", json!({ "seen": state })))
    }
}

// ----------------------------------------------------------------------------------------------------
// Events and the commit (rules 2–4)

/// Seqs are 1, 2, 3… with no gaps, also for several events in one commit.
pub fn seqs_are_gapless_from_one<H: Harness>(h: &mut H) {
    let mut store = h.open();
    let w = wid("w");
    assert!(store.load(&w).unwrap().is_empty());
    append(&mut store, "w", &[]);
    append(&mut store, "w", &["a"]);
    let mut commit = Commit::new(
        w.clone(),
        Seq::new(2).unwrap(),
        Event::new("x", json!(1)),
        commands(&["b"]),
        T0,
    )
    .unwrap();
    commit
        .push(Event::new("y", json!(2)), commands(&["c", "d"]))
        .unwrap();
    store.append_with_commands(&commit).unwrap();
    append(&mut store, "other", &[]);
    let events = store.load(&w).unwrap();
    assert_eq!(seqs(&events), [1, 2, 3, 4]);
    assert_eq!(events[2].kind, "x");
    assert_eq!(events[3].payload, json!(2));
    assert_eq!(events[0].recorded_at, T0);
    assert_eq!(pending_ids(&store), ["w:2:0", "w:3:0", "w:4:0", "w:4:1"]);
    let store = h.reopen(store);
    assert_eq!(seqs(&store.load(&w).unwrap()), [1, 2, 3, 4]);
    assert_eq!(seqs(&store.load(&wid("other")).unwrap()), [1]);
}

/// A commit that fails half-way leaves nothing behind, also after a restart.
pub fn failed_commit_writes_nothing<H: Harness>(h: &mut H) {
    let mut store = h.open();
    append(&mut store, "w", &["ok"]);
    h.fail_commits_with_command_kind(&mut store, "explode");
    let commit = Commit::new(
        wid("w"),
        Seq::new(1).unwrap(),
        Event::new("second", json!({})),
        commands(&["ok", "ok", "explode", "ok"]),
        T0,
    )
    .unwrap();
    let err = store.append_with_commands(&commit).unwrap_err();
    assert!(
        !matches!(err, Error::Conflict { .. }),
        "the injected failure is not a conflict: {err}"
    );
    let check = |store: &H::Store| {
        assert_eq!(
            seqs(&store.load(&wid("w")).unwrap()),
            [1],
            "no event of the failed commit"
        );
        assert_eq!(
            pending_ids(store),
            ["w:1:0"],
            "no command of the failed commit"
        );
        assert!(store.command(&cid("w:2:0")).unwrap().is_none());
    };
    check(&store);
    let mut store = h.reopen(store);
    check(&store);
    // The workflow goes on at the same seq.
    assert_eq!(append(&mut store, "w", &["ok"]), Seq::new(2).unwrap());
}

/// A commit on a stale `expected_seq` gets `Conflict { expected, actual }` and writes nothing.
pub fn stale_expected_seq_conflicts<H: Harness>(h: &mut H) {
    let mut store = h.open();
    append(&mut store, "w", &["a"]);
    append(&mut store, "w", &["b"]);
    for expected in [0, 1, 3, 7] {
        let commit = Commit::new(
            wid("w"),
            Seq::new(expected).unwrap(),
            Event::new("late", json!({})),
            commands(&["c"]),
            T0,
        )
        .unwrap();
        match store.append_with_commands(&commit) {
            Err(Error::Conflict {
                workflow_id,
                expected: e,
                actual,
            }) => {
                assert_eq!(workflow_id, wid("w"));
                assert_eq!(e.get(), expected);
                assert_eq!(actual.get(), 2);
            }
            other => panic!("expected a conflict for expected_seq {expected}, got {other:?}"),
        }
    }
    assert_eq!(seqs(&store.load(&wid("w")).unwrap()), [1, 2]);
    assert_eq!(pending_ids(&store), ["w:1:0", "w:2:0"]);
}

/// The engine replays, decides and commits, and on a conflict decides again at the next seq.
pub fn engine_retries_a_conflict_at_the_next_seq<H: Harness>(h: &mut H) {
    let mut store = h.open();
    let engine = Engine::new(Counter);
    let w = wid("race");
    // A rival commits between our replay and our commit: simulate by committing on the stale seq.
    let stale = engine.replay(&store, &w).unwrap();
    engine
        .handle(&mut store, &w, Event::new("first", json!({})), T0)
        .unwrap();
    let commit = Commit::new(
        w.clone(),
        stale.last_seq,
        Event::new("second", json!({})),
        Decision::none(),
        T0,
    )
    .unwrap();
    assert!(matches!(
        store.append_with_commands(&commit),
        Err(Error::Conflict { .. })
    ));
    let handled = engine
        .handle(&mut store, &w, Event::new("second", json!({})), T0)
        .unwrap();
    assert_eq!(handled.seq.get(), 2);
    assert_eq!(handled.command_ids, [cid("race:2:0")]);
    let row = store.command(&cid("race:2:0")).unwrap().unwrap();
    assert_eq!(
        row.payload,
        json!({ "seen": 1 }),
        "decided on the state after the rival's event"
    );
    assert_eq!(engine.replay(&store, &w).unwrap().state, 2);
}

/// A workflow that rejects an event gets `Rejected` and nothing is written.
pub fn rejected_events_write_nothing<H: Harness>(h: &mut H) {
    struct Picky;
    impl Workflow for Picky {
        type State = u64;
        fn evolve(&self, seen: &mut u64, _: &EventRecord) {
            *seen += 1;
        }
        fn decide(&self, seen: &u64, _: &EventRecord) -> Decision {
            if *seen >= 1 {
                Decision::reject("only one event allowed")
            } else {
                Decision::new().command(Command::new("once", json!({})))
            }
        }
    }
    let mut store = h.open();
    let engine = Engine::new(Picky);
    engine
        .handle(&mut store, &wid("w"), Event::new("first", json!({})), T0)
        .unwrap();
    match engine.handle(&mut store, &wid("w"), Event::new("second", json!({})), T0) {
        Err(Error::Rejected {
            workflow_id,
            reason,
        }) => {
            assert_eq!(
                (workflow_id, reason.as_str()),
                (wid("w"), "only one event allowed")
            );
        }
        other => panic!("expected a rejection, got {other:?}"),
    }
    assert_eq!(seqs(&store.load(&wid("w")).unwrap()), [1]);
    assert_eq!(pending_ids(&store), ["w:1:0"]);
}

/// Command IDs follow every case of the shared vectors: derived, stored, read back and parsed alike.
pub fn command_ids_match_the_vectors<H: Harness>(h: &mut H) {
    let vectors = command_id_vectors();
    let mut store = h.open();
    for case in &vectors.valid {
        let workflow_id = wid(&case.workflow_id);
        let seq = Seq::new(case.event_seq).unwrap();
        let derived = CommandId::new(workflow_id.clone(), seq, case.index).unwrap();
        assert_eq!(derived.to_string(), case.command_id);
        assert_eq!(case.command_id.parse::<CommandId>().unwrap(), derived);
        if case.event_seq > 3 {
            continue; // too many events to commit here; derivation and parsing are checked above
        }
        // Commit filler events up to the case's seq, then a decision with the case's index.
        while store.load(&workflow_id).unwrap().len() + 1 < case.event_seq as usize {
            append(&mut store, &case.workflow_id, &[]);
        }
        let kinds = vec!["cmd"; case.index as usize + 1];
        append(&mut store, &case.workflow_id, &kinds);
        let row = store
            .command(&derived)
            .unwrap()
            .unwrap_or_else(|| panic!("{} stored", case.command_id));
        assert_eq!(row.command_id.to_string(), case.command_id);
    }
    for case in &vectors.invalid_workflow_ids {
        match WorkflowId::new(case.workflow_id.clone()) {
            Err(Error::InvalidInput { field, value, .. }) => {
                assert_eq!(field, "workflow_id");
                assert_eq!(value, case.workflow_id, "the error names the value");
            }
            other => panic!(
                "workflow id {:?} ({}) was not refused: {other:?}",
                case.workflow_id, case.why
            ),
        }
    }
    for case in &vectors.invalid_command_ids {
        let err = case.command_id.parse::<CommandId>().unwrap_err();
        assert!(
            err.to_string().contains(&case.command_id),
            "{} ({}): {err}",
            case.command_id,
            case.why
        );
    }
}

/// Timer IDs follow every case of the shared vectors; the ones a store derives match, also read back.
pub fn timer_ids_match_the_vectors<H: Harness>(h: &mut H) {
    let vectors = command_id_vectors().timer_ids;
    for case in &vectors.valid {
        let derived = case
            .derive()
            .unwrap_or_else(|e| panic!("{}: {e}", case.timer_id));
        assert_eq!(derived.to_string(), case.timer_id);
        let parsed: TimerId = case.timer_id.parse().unwrap();
        assert_eq!(parsed, derived);
        assert_eq!(parsed.workflow_id().as_str(), case.workflow_id);
    }
    for case in &vectors.invalid {
        let err = case.timer_id.parse::<TimerId>().expect_err(&case.why);
        assert!(
            err.to_string().contains(&case.timer_id),
            "{} ({}): {err}",
            case.timer_id,
            case.why
        );
    }
    // A store derives the same IDs for the scheduled cases with small seqs.
    let mut store = h.open();
    for case in vectors
        .valid
        .iter()
        .filter(|c| c.source == "scheduled" && c.event_seq.unwrap_or(0) <= 3)
    {
        let workflow_id = wid(&case.workflow_id);
        while store.load(&workflow_id).unwrap().len() + 1 < case.event_seq.unwrap() as usize {
            append(&mut store, &case.workflow_id, &[]);
        }
        let mut decision = Decision::new();
        for n in 0..=case.index.unwrap() {
            decision = decision.timer(Timer::after(
                format!("t{n}"),
                Duration::from_secs(1),
                json!(n),
            ));
        }
        let last = store.load(&workflow_id).unwrap().len() as u64;
        let commit = Commit::new(
            workflow_id.clone(),
            Seq::new(last).unwrap(),
            Event::new("e", json!({})),
            decision,
            T0,
        )
        .unwrap();
        store.append_with_commands(&commit).unwrap();
        let store_ids: Vec<String> = store
            .timers(&workflow_id)
            .unwrap()
            .iter()
            .map(|t| t.timer_id.to_string())
            .collect();
        assert!(
            store_ids.contains(&case.timer_id),
            "{} not in {store_ids:?}",
            case.timer_id
        );
    }
}

/// `pending` returns commands by `(workflow_id, event_seq, index)`, the index compared as a number.
pub fn pending_order_matches_the_vectors<H: Harness>(h: &mut H) {
    let vectors = command_id_vectors();
    let mut store = h.open();
    let w = &vectors.ordering.workflow_id;
    append(&mut store, "v", &["first workflow by name"]);
    append(&mut store, w, &["cmd"; 12]);
    append(&mut store, w, &["cmd"]);
    let order: Vec<String> = pending_ids(&store)
        .into_iter()
        .filter(|id| id.starts_with(&format!("{w}:")))
        .collect();
    assert_eq!(order, vectors.ordering.expected_pending_order);
    assert_eq!(
        pending_ids(&store)[0],
        "v:1:0",
        "workflows come out in ID order"
    );
    assert_eq!(store.pending(3).unwrap().len(), 3, "limit is kept");
    let rows = store.commands(&wid(w)).unwrap();
    let ids: Vec<String> = rows.iter().map(|r| r.command_id.to_string()).collect();
    assert_eq!(ids, vectors.ordering.expected_pending_order);
}

/// A new outbox row holds every column of rule 5 with its initial value, and the payload round-trips.
pub fn outbox_rows_start_pending_with_every_column<H: Harness>(h: &mut H) {
    let mut store = h.open();
    let payload = json!({ "city": "成都", "n": 1.5, "list": [1, "x", null], "nested": { "b": true, "a": {} } });
    let decision = Decision::new().command(Command::new("lock_budget", payload.clone()));
    let commit = Commit::new(
        wid("trip-001"),
        Seq::ZERO,
        Event::new("trip_requested", payload.clone()),
        decision,
        at(5),
    )
    .unwrap();
    store.append_with_commands(&commit).unwrap();
    let store = h.reopen(store);
    let row = store.command(&cid("trip-001:1:0")).unwrap().unwrap();
    assert_eq!(row.kind, "lock_budget");
    assert_eq!(row.payload, payload);
    assert_eq!(row.status, Status::Pending);
    assert_eq!(row.attempts, 0);
    assert_eq!(row.last_error, None);
    assert_eq!(row.available_at, at(5));
    assert_eq!(row.lease, None);
    assert_eq!(row.created_at, at(5));
    assert_eq!(row.processed_at, None);
    assert_eq!(store.load(&wid("trip-001")).unwrap()[0].payload, payload);
}

/// `mark_done` twice is harmless; an unknown command is a clear error.
pub fn mark_done_is_idempotent_and_unknown_ids_are_errors<H: Harness>(h: &mut H) {
    let mut store = h.open();
    append(&mut store, "w", &["a", "b"]);
    store.mark_done(&cid("w:1:0"), at(1)).unwrap();
    store.mark_done(&cid("w:1:0"), at(2)).unwrap();
    let row = store.command(&cid("w:1:0")).unwrap().unwrap();
    assert_eq!(row.status, Status::Done);
    assert_eq!(
        row.processed_at,
        Some(at(1)),
        "the second mark changes nothing"
    );
    assert_eq!(pending_ids(&store), ["w:1:1"]);
    for unknown in ["w:1:2", "w:9:0", "nobody:1:0"] {
        match store.mark_done(&cid(unknown), at(3)) {
            Err(Error::UnknownCommand { command_id }) => {
                assert_eq!(command_id.to_string(), unknown)
            }
            other => panic!("mark_done({unknown}) gave {other:?}"),
        }
    }
    assert!(matches!(
        store.complete(&cid("w:7:0"), 1, None, at(3)),
        Err(Error::UnknownCommand { .. })
    ));
    assert!(matches!(
        store.retry(&cid("w:7:0"), at(3)),
        Err(Error::UnknownCommand { .. })
    ));
}

/// Replay of a workflow with no events gives `last_seq` 0; replay folds events and never decides, so it
/// never produces or changes a command.
pub fn replay_folds_and_never_dispatches<H: Harness>(h: &mut H) {
    let mut store = h.open();
    let engine = Engine::new(Counter);
    let empty = engine.replay(&store, &wid("new")).unwrap();
    assert_eq!((empty.state, empty.last_seq), (0, Seq::ZERO));
    let w = wid("w");
    for _ in 0..3 {
        engine
            .handle(&mut store, &w, Event::new("tick", json!({})), T0)
            .unwrap();
    }
    let before = store.pending(usize::MAX).unwrap();
    let replayed = engine.replay(&store, &w).unwrap();
    assert_eq!((replayed.state, replayed.last_seq.get()), (3, 3));
    assert_eq!(
        store.pending(usize::MAX).unwrap(),
        before,
        "replay changed the outbox"
    );
    assert_eq!(before.len(), 3);
}

// ----------------------------------------------------------------------------------------------------
// Leases, acknowledgement, failure (rules 6–9)

/// Two claimers never hold the same command; a claim takes due commands only, longest-due first.
pub fn claims_are_exclusive_and_due_only<H: Harness>(h: &mut H) {
    let mut store = h.open();
    for w in ["a", "b", "c"] {
        append(&mut store, w, &["x", "y"]);
    }
    let first = claim(&mut store, "w1", 4, 1_000, T0);
    let second = claim(&mut store, "w2", 4, 1_000, T0);
    assert_eq!(first.len(), 4);
    assert_eq!(second.len(), 2);
    let mut all: Vec<String> = first
        .iter()
        .chain(&second)
        .map(|d| d.command_id.to_string())
        .collect();
    assert_eq!(all[..4], ["a:1:0", "a:1:1", "b:1:0", "b:1:1"]);
    all.sort();
    all.dedup();
    assert_eq!(all.len(), 6, "no command is held twice");
    assert!(claim(&mut store, "w3", 10, 1_000, T0).is_empty());
    for d in &first {
        assert_eq!(d.attempt, 1);
        assert_eq!(d.lease_expires_at, at(1_000));
        let row = store.command(&d.command_id).unwrap().unwrap();
        assert_eq!(row.status, Status::Leased);
        let lease = row.lease.unwrap();
        assert_eq!((lease.owner.as_str(), lease.token), ("w1", d.token));
    }
    // Not yet due: a commit made later in time is not claimable before its time.
    let mut store = h.open();
    let commit = Commit::new(
        wid("future"),
        Seq::ZERO,
        Event::new("e", json!({})),
        commands(&["x"]),
        at(500),
    )
    .unwrap();
    store.append_with_commands(&commit).unwrap();
    assert!(claim(&mut store, "w1", 1, 1_000, at(499)).is_empty());
    assert_eq!(claim(&mut store, "w1", 1, 1_000, at(500)).len(), 1);
    assert!(
        store.claim(&ClaimRequest::new("").limit(1), T0).is_err(),
        "empty worker name refused"
    );
}

/// An expired lease is taken over with a new token; the old holder's complete, extend and fail get
/// `StaleLease` and change nothing; the new holder settles it.
pub fn expired_leases_are_fenced<H: Harness>(h: &mut H) {
    let mut store = h.open();
    append(&mut store, "w", &["x"]);
    let old = claim(&mut store, "slow", 1, 1_000, T0).remove(0);
    assert!(
        claim(&mut store, "fast", 1, 1_000, at(999)).is_empty(),
        "the lease holds until it expires"
    );
    let new = claim(&mut store, "fast", 1, 1_000, at(1_000)).remove(0);
    assert_eq!(new.command_id, old.command_id);
    assert!(new.token > old.token, "a takeover gets a fresh token");
    assert_eq!(new.attempt, 2);
    let before = store.command(&old.command_id).unwrap();
    let stale = |e: Result<(), Error>| {
        assert!(
            matches!(e, Err(Error::StaleLease { token, .. }) if token == old.token),
            "{e:?}"
        )
    };
    stale(store.complete(&old.command_id, old.token, None, at(1_001)));
    stale(
        store
            .extend(
                &old.command_id,
                old.token,
                Duration::from_secs(9),
                at(1_001),
            )
            .map(|_| ()),
    );
    stale(
        store
            .fail(
                &old.command_id,
                old.token,
                &Failure::retryable("late"),
                &policy(),
                at(1_001),
            )
            .map(|_| ()),
    );
    assert_eq!(
        store.command(&old.command_id).unwrap(),
        before,
        "a stale holder changed the row"
    );
    store
        .complete(&new.command_id, new.token, None, at(1_002))
        .unwrap();
    assert_eq!(status(&store, "w:1:0"), Status::Done);
    stale(store.complete(&old.command_id, old.token, None, at(1_003)));
}

/// A late ack while nobody took over still completes; a holder can extend its lease.
pub fn late_ack_without_takeover_completes_and_extend_works<H: Harness>(h: &mut H) {
    let mut store = h.open();
    append(&mut store, "w", &["x", "y"]);
    let d = claim(&mut store, "w1", 2, 1_000, T0);
    store
        .complete(&d[0].command_id, d[0].token, None, at(5_000))
        .unwrap();
    assert_eq!(status(&store, "w:1:0"), Status::Done);
    let until = store
        .extend(
            &d[1].command_id,
            d[1].token,
            Duration::from_millis(3_000),
            at(900),
        )
        .unwrap();
    assert_eq!(until.expires_at, at(3_900));
    assert!(
        claim(&mut store, "w2", 1, 1_000, at(3_899)).is_empty(),
        "the extended lease holds"
    );
    assert_eq!(claim(&mut store, "w2", 1, 1_000, at(3_900)).len(), 1);
}

/// A retryable failure waits the policy's backoff (never above the cap), then is claimable again; after
/// the last attempt the command is dead with its last error kept.
pub fn backoff_follows_the_policy_then_dead<H: Harness>(h: &mut H) {
    let mut store = h.open();
    append(&mut store, "w", &["flaky"]);
    let policy = policy();
    let id = cid("w:1:0");
    let mut now = T0;
    for attempt in 1..=4u32 {
        let d = claim(&mut store, "w1", 1, 1_000, now)
            .pop()
            .unwrap_or_else(|| panic!("attempt {attempt} claimable at {now}"));
        assert_eq!(d.attempt, attempt);
        let settled = store
            .fail(
                &id,
                d.token,
                &Failure::retryable(format!("boom {attempt}")),
                &policy,
                now,
            )
            .unwrap();
        if attempt == 4 {
            assert_eq!(settled, Settled::Dead);
            break;
        }
        let expected = policy.backoff(&id, attempt);
        assert!(
            expected <= Duration::from_millis(350),
            "backoff above the cap"
        );
        assert_eq!(
            settled,
            Settled::RetryAt {
                at: now + expected,
                backoff: expected
            }
        );
        let row = store.command(&id).unwrap().unwrap();
        assert_eq!(
            (row.status, row.available_at),
            (Status::Pending, now + expected)
        );
        if !expected.is_zero() {
            let just_before = Timestamp::from_millis((now + expected).as_millis() - 1);
            assert!(
                claim(&mut store, "w1", 1, 1_000, just_before).is_empty(),
                "claimed before its backoff"
            );
        }
        now = now + expected;
    }
    let row = store.command(&id).unwrap().unwrap();
    assert_eq!(row.status, Status::Dead);
    assert_eq!(row.last_error.as_deref(), Some("boom 4"));
    assert_eq!(row.attempts, 4);
    assert!(row.processed_at.is_some());
    assert!(
        claim(&mut store, "w1", 1, 1_000, at(10_000_000)).is_empty(),
        "a dead command is never claimed"
    );
    assert!(store.pending(10).unwrap().is_empty());
    assert_eq!(store.dead_letters(10).unwrap().len(), 1);
}

/// A permanent failure is dead at once; a lease that expires on the last attempt is dead, not claimed.
pub fn permanent_failures_and_exhausted_leases_are_dead<H: Harness>(h: &mut H) {
    let mut store = h.open();
    append(&mut store, "w", &["refused", "crashy"]);
    let d = claim(&mut store, "w1", 1, 1_000, T0).remove(0);
    assert_eq!(
        store
            .fail(
                &d.command_id,
                d.token,
                &Failure::permanent("422 unknown hotel"),
                &policy(),
                T0
            )
            .unwrap(),
        Settled::Dead
    );
    let row = store.command(&d.command_id).unwrap().unwrap();
    assert_eq!((row.status, row.attempts), (Status::Dead, 1));
    assert_eq!(row.last_error.as_deref(), Some("422 unknown hotel"));
    // The second command: every holder crashes. With max 2 attempts, the third claim buries it.
    let request = ClaimRequest::new("w1")
        .limit(5)
        .lease_ttl(Duration::from_millis(100))
        .retry_policy(&RetryPolicy::default().max_attempts(2));
    assert_eq!(store.claim(&request, T0).unwrap().len(), 1);
    assert_eq!(store.claim(&request, at(100)).unwrap().len(), 1);
    assert!(store.claim(&request, at(200)).unwrap().is_empty());
    let row = store.command(&cid("w:1:1")).unwrap().unwrap();
    assert_eq!(row.status, Status::Dead);
    assert!(row.last_error.unwrap().contains("lease expired"));
    let dead: Vec<String> = store
        .dead_letters(10)
        .unwrap()
        .iter()
        .map(|r| r.command_id.to_string())
        .collect();
    assert_eq!(dead, ["w:1:0", "w:1:1"]);
}

/// A claim buries the exhausted leases it meets on the way (each with its feedback) and still hands out
/// up to `limit` commands: the burials do not use up the limit, in either order.
pub fn burials_do_not_use_up_the_claim_limit<H: Harness>(h: &mut H) {
    for order in [ClaimOrder::DueFirst, ClaimOrder::StrictPerWorkflow] {
        let mut store = h.open();
        let last_attempt = RetryPolicy::default().max_attempts(1);
        // A worker that crashes on the first command of three workflows, on its only allowed attempt.
        for w in ["a", "b", "c"] {
            append(&mut store, w, &["crashy"]);
        }
        let crashing = ClaimRequest::new("crashing")
            .limit(3)
            .lease_ttl(Duration::from_millis(100))
            .order(order)
            .retry_policy(&last_attempt);
        assert_eq!(store.claim(&crashing, T0).unwrap().len(), 3);
        // Work due after those leases ran out, so the exhausted leases come first in claim order.
        let later = Commit::new(
            wid("d"),
            Seq::ZERO,
            Event::new("e", json!({})),
            commands(&["x", "y"]),
            at(200),
        )
        .unwrap();
        store.append_with_commands(&later).unwrap();
        let request = ClaimRequest::new("w")
            .limit(2)
            .lease_ttl(Duration::from_millis(1_000))
            .order(order)
            .retry_policy(&last_attempt);
        let got: Vec<String> = store
            .claim(&request, at(300))
            .unwrap()
            .iter()
            .map(|d| d.command_id.to_string())
            .collect();
        let expected: &[&str] = match order {
            ClaimOrder::DueFirst => &["d:1:0", "d:1:1"],
            // d:1:1 waits for d:1:0.
            ClaimOrder::StrictPerWorkflow => &["d:1:0"],
        };
        assert_eq!(got, expected, "{order:?}");
        let dead: Vec<String> = store
            .dead_letters(10)
            .unwrap()
            .iter()
            .map(|r| r.command_id.to_string())
            .collect();
        assert_eq!(dead, ["a:1:0", "b:1:0", "c:1:0"], "{order:?}");
        for w in ["a", "b", "c"] {
            let row = store.command(&cid(&format!("{w}:1:0"))).unwrap().unwrap();
            assert!(row.last_error.unwrap().contains("lease expired"));
            assert_eq!(row.processed_at, Some(at(300)));
            let feedback: Vec<String> = store
                .timers(&wid(w))
                .unwrap()
                .into_iter()
                .map(|t| t.event_kind)
                .collect();
            assert_eq!(
                feedback,
                [COMMAND_FAILED],
                "{order:?}: one feedback per burial"
            );
        }
    }
}

/// `retry` and `resolve` of a dead command are recorded; a live command can be neither retried nor
/// resolved; a dead command is never marked done as if it succeeded.
pub fn retry_and_resolve_dead_commands<H: Harness>(h: &mut H) {
    let mut store = h.open();
    append(&mut store, "w", &["a", "b", "c"]);
    let ds = claim(&mut store, "w1", 2, 1_000, T0);
    for d in &ds {
        store
            .fail(
                &d.command_id,
                d.token,
                &Failure::permanent("no"),
                &policy(),
                T0,
            )
            .unwrap();
    }
    let live = cid("w:1:2");
    for result in [
        store.resolve(&live, "oops", at(1)),
        store.retry(&live, at(1)),
    ] {
        assert!(
            matches!(
                result,
                Err(Error::InvalidState {
                    status: Status::Pending,
                    ..
                })
            ),
            "{result:?}"
        );
    }
    assert!(matches!(
        store.mark_done(&cid("w:1:0"), at(1)),
        Err(Error::InvalidState {
            status: Status::Dead,
            ..
        })
    ));
    store.retry(&cid("w:1:0"), at(10)).unwrap();
    let row = store.command(&cid("w:1:0")).unwrap().unwrap();
    assert_eq!(
        (
            row.status,
            row.attempts,
            row.manual_retries,
            row.available_at
        ),
        (Status::Pending, 0, 1, at(10))
    );
    assert_eq!(
        row.last_error.as_deref(),
        Some("no"),
        "the last error stays for the record"
    );
    store
        .resolve(&cid("w:1:1"), "refunded by phone", at(11))
        .unwrap();
    let row = store.command(&cid("w:1:1")).unwrap().unwrap();
    assert_eq!(row.status, Status::Done);
    assert_eq!(row.resolution.as_deref(), Some("refunded by phone"));
    assert_eq!(row.processed_at, Some(at(11)));
    assert!(matches!(
        store.resolve(&cid("w:1:1"), "again", at(12)),
        Err(Error::InvalidState { .. })
    ));
    assert!(store.dead_letters(10).unwrap().is_empty());
    let store = h.reopen(store);
    assert_eq!(
        store
            .command(&cid("w:1:1"))
            .unwrap()
            .unwrap()
            .resolution
            .as_deref(),
        Some("refunded by phone")
    );
    assert_eq!(
        store
            .command(&cid("w:1:0"))
            .unwrap()
            .unwrap()
            .manual_retries,
        1
    );
}

/// With strict order, a command is not handed out while an earlier one of its workflow is pending or
/// leased; done and dead ones do not block.
pub fn strict_order_holds_back_later_commands<H: Harness>(h: &mut H) {
    let mut store = h.open();
    append(&mut store, "a", &["1", "2"]);
    append(&mut store, "a", &["3"]);
    append(&mut store, "b", &["1"]);
    let strict = |worker: &str| {
        ClaimRequest::new(worker)
            .limit(10)
            .lease_ttl(Duration::from_millis(1_000))
            .order(ClaimOrder::StrictPerWorkflow)
    };
    let ids = |ds: Vec<crate::Delivery>| {
        ds.into_iter()
            .map(|d| (d.command_id.to_string(), d.token))
            .collect::<Vec<_>>()
    };
    let first = ids(store.claim(&strict("w1"), T0).unwrap());
    assert_eq!(
        first.iter().map(|(id, _)| id.as_str()).collect::<Vec<_>>(),
        ["a:1:0", "b:1:0"]
    );
    assert!(
        store.claim(&strict("w2"), T0).unwrap().is_empty(),
        "a:1:1 waits for a:1:0"
    );
    // a:1:0 fails and waits for a retry: it still blocks.
    store
        .fail(
            &cid("a:1:0"),
            first[0].1,
            &Failure::retryable("later"),
            &policy(),
            T0,
        )
        .unwrap();
    assert!(store.claim(&strict("w2"), T0).unwrap().is_empty());
    let retry_at = store.command(&cid("a:1:0")).unwrap().unwrap().available_at;
    let again = ids(store.claim(&strict("w2"), retry_at).unwrap());
    assert_eq!(
        again.iter().map(|(id, _)| id.as_str()).collect::<Vec<_>>(),
        ["a:1:0"]
    );
    store
        .complete(&cid("a:1:0"), again[0].1, None, retry_at)
        .unwrap();
    let next = ids(store.claim(&strict("w2"), retry_at).unwrap());
    assert_eq!(
        next.iter().map(|(id, _)| id.as_str()).collect::<Vec<_>>(),
        ["a:1:1"]
    );
    store
        .fail(
            &cid("a:1:1"),
            next[0].1,
            &Failure::permanent("gone"),
            &policy(),
            retry_at,
        )
        .unwrap();
    let last = ids(store.claim(&strict("w2"), retry_at).unwrap());
    assert_eq!(
        last.iter().map(|(id, _)| id.as_str()).collect::<Vec<_>>(),
        ["a:2:0"],
        "a dead command does not block"
    );
    // Without strict order, later commands of a workflow go out beside earlier ones.
    let mut store = h.open();
    append(&mut store, "a", &["1", "2"]);
    assert_eq!(claim(&mut store, "w1", 10, 1_000, T0).len(), 2);
}

/// A released command is claimable again at once, its unstarted attempt not counted; a stale holder
/// cannot release.
pub fn release_gives_a_command_back_unattempted<H: Harness>(h: &mut H) {
    let mut store = h.open();
    append(&mut store, "w", &["x"]);
    let d = claim(&mut store, "w1", 1, 1_000, T0).remove(0);
    store.release(&d.command_id, d.token, at(10)).unwrap();
    let row = store.command(&d.command_id).unwrap().unwrap();
    assert_eq!(
        (row.status, row.attempts, row.available_at),
        (Status::Pending, 0, at(10))
    );
    let again = claim(&mut store, "w2", 1, 1_000, at(10)).remove(0);
    assert_eq!(again.attempt, 1);
    assert!(again.token > d.token);
    assert!(matches!(
        store.release(&d.command_id, d.token, at(11)),
        Err(Error::StaleLease { .. })
    ));
    assert_eq!(status(&store, "w:1:0"), Status::Leased);
}

/// A batch of acks completes the current leases and reports stale ones, one result per ack.
pub fn complete_all_settles_each_ack<H: Harness>(h: &mut H) {
    let mut store = h.open();
    append(&mut store, "w", &["a", "b", "c"]);
    let d = claim(&mut store, "w1", 3, 1_000, T0);
    let acks = vec![
        Ack::new(d[0].command_id.clone(), d[0].token),
        Ack::new(d[1].command_id.clone(), d[1].token + 1),
        Ack::new(d[2].command_id.clone(), d[2].token),
        Ack::new(cid("w:1:9"), 1),
    ];
    let results = store.complete_all(&acks, at(1)).unwrap();
    assert_eq!(results.len(), 4);
    assert!(results[0].is_ok() && results[2].is_ok());
    assert!(matches!(results[1], Err(Error::StaleLease { .. })));
    assert!(matches!(results[3], Err(Error::UnknownCommand { .. })));
    assert_eq!(pending_ids(&store), ["w:1:1"]);
    assert_eq!(status(&store, "w:1:1"), Status::Leased);
}

/// Retention removes done rows older than the period, in bounded batches, and never a pending, leased
/// or dead one.
pub fn purge_done_removes_only_old_done_rows<H: Harness>(h: &mut H) {
    let mut store = h.open();
    append(
        &mut store,
        "w",
        &["done", "done", "done", "pending", "leased", "dead", "late"],
    );
    for n in 0..3 {
        store.mark_done(&cid(&format!("w:1:{n}")), at(0)).unwrap();
    }
    store.mark_done(&cid("w:1:6"), at(500)).unwrap();
    let leased = claim(&mut store, "w1", 3, 1_000_000, T0);
    assert_eq!(leased.len(), 3, "w:1:3, w:1:4, w:1:5");
    store.release(&cid("w:1:3"), leased[0].token, T0).unwrap();
    store
        .fail(
            &cid("w:1:5"),
            leased[2].token,
            &Failure::permanent("no"),
            &policy(),
            T0,
        )
        .unwrap();
    let keep = Duration::from_millis(1_000);
    assert_eq!(
        store.purge_done(keep, at(999), 10).unwrap(),
        0,
        "nothing is old enough yet"
    );
    assert_eq!(
        store.purge_done(keep, at(1_000), 2).unwrap(),
        2,
        "a batch is bounded"
    );
    assert_eq!(store.purge_done(keep, at(1_000), 2).unwrap(), 1);
    assert_eq!(store.purge_done(keep, at(1_000), 2).unwrap(), 0);
    let left: Vec<String> = store
        .commands(&wid("w"))
        .unwrap()
        .iter()
        .map(|r| format!("{} {}", r.command_id, r.status))
        .collect();
    assert_eq!(
        left,
        ["w:1:3 pending", "w:1:4 leased", "w:1:5 dead", "w:1:6 done"]
    );
    assert_eq!(store.purge_done(keep, at(1_500), 10).unwrap(), 1);
    assert_eq!(
        seqs(&store.load(&wid("w")).unwrap()),
        [1],
        "events are never purged"
    );
    let store = h.reopen(store);
    assert_eq!(store.commands(&wid("w")).unwrap().len(), 3);
    // Near the epoch too: a row done at time 0 is not older than 10 s at 5 s.
    let mut early = h.open();
    append(&mut early, "e", &["x"]);
    early.mark_done(&cid("e:1:0"), Timestamp::EPOCH).unwrap();
    let ten_s = Duration::from_secs(10);
    assert_eq!(
        early
            .purge_done(ten_s, Timestamp::from_millis(5_000), 10)
            .unwrap(),
        0
    );
    assert_eq!(
        early
            .purge_done(ten_s, Timestamp::from_millis(10_000), 10)
            .unwrap(),
        1
    );
}

// ----------------------------------------------------------------------------------------------------
// Timers and compensation (rules 11–12)

/// `start` books and sets a 1 s deadline; a failed command is compensated and the deadline cancelled;
/// a fired deadline is compensated too. Every decision is visible in the outbox.
struct Saga;

impl Workflow for Saga {
    type State = ();

    fn evolve(&self, _: &mut (), _: &EventRecord) {}

    fn decide(&self, _: &(), event: &EventRecord) -> Decision {
        match event.kind.as_str() {
            "start" => Decision::new()
                .command(Command::new("book", json!({})))
                .timer(Timer::after(
                    "deadline",
                    Duration::from_millis(1_000),
                    json!({ "why": "too slow" }),
                ))
                .timer(Timer::at("reminder", at(500), json!(null))),
            "reschedule" => Decision::new().cancel_timer("deadline").timer(Timer::after(
                "deadline",
                Duration::from_millis(5_000),
                json!({ "why": "later" }),
            )),
            COMMAND_FAILED => Decision::new()
                .command(Command::new("compensate", event.payload.clone()))
                .cancel_timer("deadline"),
            // Cancelling its own name must not undo the firing of the timer being fired.
            TIMER_FIRED => Decision::new()
                .command(Command::new("on_timer", event.payload.clone()))
                .cancel_timer(event.payload["name"].as_str().unwrap_or_default()),
            _ => Decision::none(),
        }
    }
}

fn timer_states<S: Store>(store: &S, workflow: &str) -> Vec<String> {
    store
        .timers(&wid(workflow))
        .unwrap()
        .iter()
        .map(|t| format!("{} {} {}", t.timer_id, t.name, t.status))
        .collect()
}

fn kinds<S: Store>(store: &S, workflow: &str) -> Vec<String> {
    store
        .load(&wid(workflow))
        .unwrap()
        .into_iter()
        .map(|e| e.kind)
        .collect()
}

/// A decision's timers are written in its commit, with deterministic IDs; a failed commit leaves none.
pub fn timers_are_scheduled_in_the_commit<H: Harness>(h: &mut H) {
    let mut store = h.open();
    let engine = Engine::new(Saga);
    let handled = engine
        .handle(&mut store, &wid("trip"), Event::new("start", json!({})), T0)
        .unwrap();
    let ids: Vec<String> = handled.timer_ids.iter().map(ToString::to_string).collect();
    assert_eq!(ids, ["trip:1:t0", "trip:1:t1"]);
    let store = h.reopen(store);
    let timers = store.timers(&wid("trip")).unwrap();
    assert_eq!(
        timer_states(&store, "trip"),
        [
            "trip:1:t0 deadline scheduled",
            "trip:1:t1 reminder scheduled"
        ]
    );
    assert_eq!((timers[0].fire_at, timers[1].fire_at), (at(1_000), at(500)));
    assert_eq!(timers[0].event_kind, TIMER_FIRED);
    assert_eq!(
        timers[0].event_payload,
        json!({ "timer_id": "trip:1:t0", "name": "deadline", "payload": { "why": "too slow" } })
    );
    let mut store = store;
    h.fail_commits_with_command_kind(&mut store, "explode");
    let decision = Decision::new()
        .command(Command::new("explode", json!({})))
        .timer(Timer::after("x", Duration::ZERO, json!({})));
    let commit = Commit::new(
        wid("trip"),
        Seq::new(1).unwrap(),
        Event::new("e", json!({})),
        decision,
        T0,
    )
    .unwrap();
    assert!(store.append_with_commands(&commit).is_err());
    assert_eq!(
        store.timers(&wid("trip")).unwrap().len(),
        2,
        "no timer of the failed commit"
    );
}

/// A timer is not taken before its time, fires its event through decide exactly once, also after a
/// restart, and firing it again writes nothing.
pub fn timers_fire_once_not_before_their_time<H: Harness>(h: &mut H) {
    let mut store = h.open();
    let engine = Engine::new(Saga);
    engine
        .handle(&mut store, &wid("trip"), Event::new("start", json!({})), T0)
        .unwrap();
    assert!(store
        .claim_timers(10, Duration::from_millis(100), at(499))
        .unwrap()
        .is_empty());
    let due = store
        .claim_timers(10, Duration::from_millis(100), at(500))
        .unwrap();
    assert_eq!(
        due.iter()
            .map(|t| t.timer_id.to_string())
            .collect::<Vec<_>>(),
        ["trip:1:t1"]
    );
    let fired = engine
        .fire(&mut store, &due[0], at(501))
        .unwrap()
        .expect("fires");
    assert_eq!(fired.seq.get(), 2);
    assert_eq!(
        fired.command_ids,
        [cid("trip:2:0")],
        "the fired event was decided on"
    );
    assert_eq!(
        engine.fire(&mut store, &due[0], at(502)).unwrap(),
        None,
        "a timer fires once"
    );
    let mut store = h.reopen(store);
    assert!(store
        .claim_timers(10, Duration::from_millis(100), at(999))
        .unwrap()
        .is_empty());
    let due = store
        .claim_timers(10, Duration::from_millis(100), at(1_000))
        .unwrap();
    assert_eq!(due.len(), 1, "after a restart the deadline is still there");
    assert!(
        store
            .claim_timers(10, Duration::from_millis(100), at(1_050))
            .unwrap()
            .is_empty(),
        "taken: others wait"
    );
    engine
        .fire(&mut store, &due[0], at(1_000))
        .unwrap()
        .expect("fires");
    assert!(store
        .claim_timers(10, Duration::from_millis(100), at(1_000_000))
        .unwrap()
        .is_empty());
    assert_eq!(kinds(&store, "trip"), ["start", TIMER_FIRED, TIMER_FIRED]);
    assert_eq!(
        timer_states(&store, "trip"),
        ["trip:1:t0 deadline fired", "trip:1:t1 reminder fired"]
    );
    let event = &store.load(&wid("trip")).unwrap()[2];
    assert_eq!(event.payload["timer_id"], "trip:1:t0");
}

/// A cancelled timer never fires; a decision can cancel a name and schedule it again.
pub fn cancelled_timers_never_fire<H: Harness>(h: &mut H) {
    let mut store = h.open();
    let engine = Engine::new(Saga);
    engine
        .handle(&mut store, &wid("trip"), Event::new("start", json!({})), T0)
        .unwrap();
    let stale = store
        .claim_timers(10, Duration::from_millis(1), at(1_000))
        .unwrap();
    engine
        .handle(
            &mut store,
            &wid("trip"),
            Event::new("reschedule", json!({})),
            at(10),
        )
        .unwrap();
    assert_eq!(
        timer_states(&store, "trip"),
        [
            "trip:1:t0 deadline cancelled",
            "trip:1:t1 reminder fired",
            "trip:2:t0 deadline scheduled"
        ]
        .map(|s| if s.contains("reminder") {
            "trip:1:t1 reminder scheduled"
        } else {
            s
        })
    );
    let deadline = stale.iter().find(|t| t.name == "deadline").unwrap();
    assert_eq!(
        engine.fire(&mut store, deadline, at(1_001)).unwrap(),
        None,
        "a cancelled timer does not fire"
    );
    let due: Vec<String> = store
        .claim_timers(10, Duration::from_millis(1), at(1_000_000))
        .unwrap()
        .iter()
        .map(|t| t.timer_id.to_string())
        .collect();
    assert_eq!(due, ["trip:1:t1", "trip:2:t0"]);
    assert_eq!(kinds(&store, "trip"), ["start", "reschedule"]);
}

/// Two firers racing on one timer commit one event: the loser's commit writes nothing.
pub fn racing_firers_commit_one_event<H: Harness>(h: &mut H) {
    let mut store = h.open();
    let engine = Engine::new(Saga);
    engine
        .handle(&mut store, &wid("trip"), Event::new("start", json!({})), T0)
        .unwrap();
    let first = store
        .claim_timers(1, Duration::from_millis(100), at(600))
        .unwrap()
        .remove(0);
    // The first firer stalls; its take runs out and a second firer takes the same timer.
    let second = store
        .claim_timers(1, Duration::from_millis(100), at(700))
        .unwrap()
        .remove(0);
    assert_eq!(first.timer_id, second.timer_id);
    // Both replayed before either committed: the first commit wins, the second is stale.
    let replayed = engine.replay(&store, &wid("trip")).unwrap();
    assert!(engine.fire(&mut store, &second, at(701)).unwrap().is_some());
    let stale = Commit::new(
        wid("trip"),
        replayed.last_seq,
        Event::new(TIMER_FIRED, first.event_payload.clone()),
        Decision::none(),
        at(702),
    )
    .unwrap()
    .firing(first.timer_id.clone())
    .unwrap();
    assert!(matches!(
        store.append_with_commands(&stale),
        Err(Error::Conflict { .. })
    ));
    let fresh = Commit::new(
        wid("trip"),
        Seq::new(2).unwrap(),
        Event::new(TIMER_FIRED, first.event_payload.clone()),
        Decision::none(),
        at(702),
    )
    .unwrap()
    .firing(first.timer_id.clone())
    .unwrap();
    assert!(matches!(
        store.append_with_commands(&fresh),
        Err(Error::TimerNotScheduled {
            status: "fired",
            ..
        })
    ));
    assert_eq!(engine.fire(&mut store, &first, at(703)).unwrap(), None);
    assert_eq!(kinds(&store, "trip"), ["start", TIMER_FIRED]);
    assert_eq!(
        store.commands(&wid("trip")).unwrap().len(),
        2,
        "book, and one on_timer"
    );
}

/// A command that becomes dead feeds one `command_failed` event back, whose decision compensates; a
/// second death after a retry feeds a second one; resolving by hand feeds `command_resolved`; a lease
/// that runs out on the last attempt counts as a death too.
pub fn failure_feedback_is_committed_exactly_once<H: Harness>(h: &mut H) {
    let mut store = h.open();
    let engine = Engine::new(Saga);
    engine
        .handle(&mut store, &wid("trip"), Event::new("start", json!({})), T0)
        .unwrap();
    let book = claim(&mut store, "w1", 1, 1_000, T0).remove(0);
    store
        .fail(
            &book.command_id,
            book.token,
            &Failure::permanent("422 no rooms"),
            &policy(),
            at(1),
        )
        .unwrap();
    let feedback: Vec<TimerRow> = store
        .timers(&wid("trip"))
        .unwrap()
        .into_iter()
        .filter(|t| t.event_kind == COMMAND_FAILED)
        .collect();
    assert_eq!(feedback.len(), 1);
    assert_eq!(feedback[0].timer_id.to_string(), "trip:1:0:failed1");
    assert_eq!(feedback[0].fire_at, at(1), "due at once");
    assert_eq!(
        feedback[0].event_payload,
        json!({ "command_id": "trip:1:0", "kind": "book", "error": "422 no rooms", "attempts": 1 })
    );
    let due = store
        .claim_timers(10, Duration::from_millis(100), at(2))
        .unwrap();
    assert_eq!(due.len(), 1, "the deadline is not due yet; the feedback is");
    let compensated = engine.fire(&mut store, &due[0], at(2)).unwrap().unwrap();
    assert_eq!(compensated.command_ids, [cid("trip:2:0")]);
    assert_eq!(
        store.command(&cid("trip:2:0")).unwrap().unwrap().kind,
        "compensate"
    );
    assert_eq!(
        engine.fire(&mut store, &due[0], at(3)).unwrap(),
        None,
        "exactly once"
    );
    assert_eq!(
        timer_states(&store, "trip")[..2],
        [
            "trip:1:0:failed1 command_failed fired".to_owned(),
            "trip:1:t0 deadline cancelled".to_owned()
        ]
    );

    store.retry(&book.command_id, at(10)).unwrap();
    let again = claim(&mut store, "w1", 10, 1_000, at(10))
        .into_iter()
        .find(|d| d.command_id == book.command_id)
        .expect("retried");
    assert_eq!(again.attempt, 1);
    store
        .fail(
            &again.command_id,
            again.token,
            &Failure::permanent("still no rooms"),
            &policy(),
            at(11),
        )
        .unwrap();
    store
        .resolve(&book.command_id, "refunded by phone", at(12))
        .unwrap();
    let ids: Vec<String> = store
        .timers(&wid("trip"))
        .unwrap()
        .iter()
        .map(|t| t.timer_id.to_string())
        .filter(|id| !id.contains(":t"))
        .collect();
    assert_eq!(
        ids,
        ["trip:1:0:failed1", "trip:1:0:failed2", "trip:1:0:resolved"]
    );

    // A worker that keeps dying on a command: the last lease runs out, the command is dead, with feedback.
    let mut store = h.open();
    append(&mut store, "crashy", &["x"]);
    let request = ClaimRequest::new("w")
        .lease_ttl(Duration::from_millis(10))
        .retry_policy(&RetryPolicy::default().max_attempts(1));
    store.claim(&request, T0).unwrap();
    assert!(store.claim(&request, at(10)).unwrap().is_empty());
    let timers = store.timers(&wid("crashy")).unwrap();
    assert_eq!(timers.len(), 1);
    assert_eq!(timers[0].event_kind, COMMAND_FAILED);
    assert!(timers[0].event_payload["error"]
        .as_str()
        .unwrap()
        .contains("lease expired"));
}

/// `levels` nested arrays around `1`.
fn nested(levels: usize) -> serde_json::Value {
    (0..levels).fold(json!(1), |inner, _| json!([inner]))
}

/// Every JSON value a commit writes is checked against the limits (DESIGN rule 13): an event, command
/// or timer payload past them is refused naming its path, and nothing is written; a value at the
/// limits is written and reads back, after a reopen too.
pub fn payloads_over_the_limits_are_refused_naming_their_path<H: Harness>(h: &mut H) {
    let mut store = h.open();
    let deepest = nested(64);
    let over = nested(65);
    let cases = [
        (
            Event::new("e", over.clone()),
            Decision::none(),
            "event.payload",
        ),
        (
            Event::new("e", json!({})),
            Decision::new()
                .command(Command::new("a", json!({})))
                .command(Command::new("b", over.clone())),
            "commands[1].payload",
        ),
        (
            Event::new("e", json!({})),
            Decision::new().timer(Timer::after("t", Duration::ZERO, over.clone())),
            "timers[0].payload",
        ),
        (
            Event::new("e", json!("x".repeat(1 << 20))),
            Decision::none(),
            "event.payload",
        ),
    ];
    for (event, decision, path) in cases {
        let err = Commit::new(wid("w"), Seq::ZERO, event, decision, T0).unwrap_err();
        assert_eq!(err.code(), "INVALID_INPUT", "{path}: {err}");
        assert!(err.to_string().contains(path), "{path}: {err}");
    }
    let engine = Engine::new(Saga);
    let err = engine
        .handle(&mut store, &wid("w"), Event::new("start", over), T0)
        .unwrap_err();
    assert!(err.to_string().contains("event.payload"), "{err}");
    assert!(store.load(&wid("w")).unwrap().is_empty(), "nothing written");
    assert!(store.pending(10).unwrap().is_empty());

    // A timer's payload is stored inside its `timer_fired` event's payload, one level down.
    let err = Commit::new(
        wid("w"),
        Seq::ZERO,
        Event::new("e", json!({})),
        Decision::new().timer(Timer::after("t", Duration::ZERO, deepest.clone())),
        T0,
    )
    .unwrap_err();
    assert!(err.to_string().contains("timers[0].payload"), "{err}");
    let decision = Decision::new()
        .command(Command::new("deep", deepest.clone()))
        .timer(Timer::after("deep", Duration::ZERO, nested(63)));
    let commit = Commit::new(
        wid("w"),
        Seq::ZERO,
        Event::new("e", deepest.clone()),
        decision,
        T0,
    )
    .unwrap();
    store.append_with_commands(&commit).unwrap();
    let mut store = h.reopen(store);
    assert_eq!(store.load(&wid("w")).unwrap()[0].payload, deepest);
    let claimed = claim(&mut store, "w1", 10, 1_000, T0);
    assert_eq!(claimed[0].payload, deepest, "claims read what was written");
    let timers = store.claim_timers(10, Duration::from_secs(1), T0).unwrap();
    assert_eq!(timers[0].event_payload["payload"], nested(63));
    let fired = Engine::new(Saga)
        .fire(&mut store, &timers[0], T0)
        .unwrap()
        .expect("a timer at the limit fires");
    assert_eq!(fired.seq.get(), 2);
}

/// A heartbeat never shortens a lease: an `extend` from a clock behind the one that set the lease
/// keeps the later expiry.
pub fn extend_never_shortens_a_lease<H: Harness>(h: &mut H) {
    let mut store = h.open();
    append(&mut store, "w", &["x"]);
    let d = claim(&mut store, "w1", 1, 10_000, T0);
    let until = store
        .extend(
            &d[0].command_id,
            d[0].token,
            Duration::from_millis(1_000),
            T0,
        )
        .unwrap();
    assert_eq!(
        until.expires_at,
        at(10_000),
        "a shorter extension keeps the lease"
    );
    let until = store
        .extend(
            &d[0].command_id,
            d[0].token,
            Duration::from_millis(1_000),
            Timestamp::from_millis(0),
        )
        .unwrap();
    assert_eq!(
        until.expires_at,
        at(10_000),
        "a lagging clock keeps the lease"
    );
    assert!(claim(&mut store, "w2", 1, 1_000, at(9_999)).is_empty());
    let until = store
        .extend(
            &d[0].command_id,
            d[0].token,
            Duration::from_millis(20_000),
            T0,
        )
        .unwrap();
    assert_eq!(until.expires_at, at(20_000));
}

/// A workflow that refuses a timer's event ends the timer `rejected` with the reason: it is not taken
/// again, its event is not written, and the firer gets the rejection. A timer is not fired before its
/// time.
pub fn rejected_timers_end_rejected_and_are_not_taken_again<H: Harness>(h: &mut H) {
    struct Refuses;
    impl Workflow for Refuses {
        type State = ();
        fn evolve(&self, _: &mut (), _: &EventRecord) {}
        fn decide(&self, _: &(), event: &EventRecord) -> Decision {
            match event.kind.as_str() {
                "start" => Decision::new()
                    .timer(Timer::after("late", Duration::from_millis(100), json!({})))
                    .timer(Timer::after("ok", Duration::from_millis(100), json!({}))),
                TIMER_FIRED if event.payload["name"] == "late" => {
                    Decision::reject("the order is already closed")
                }
                _ => Decision::none(),
            }
        }
    }
    let mut store = h.open();
    let engine = Engine::new(Refuses);
    engine
        .handle(&mut store, &wid("o"), Event::new("start", json!({})), T0)
        .unwrap();
    let scheduled = store.timers(&wid("o")).unwrap();
    let err = engine.fire(&mut store, &scheduled[0], at(99)).unwrap_err();
    assert_eq!(err.code(), "INVALID_INPUT", "not due yet: {err}");
    assert_eq!(kinds(&store, "o"), ["start"]);

    let due = store
        .claim_timers(10, Duration::from_millis(50), at(100))
        .unwrap();
    assert_eq!(due.len(), 2);
    let err = engine.fire(&mut store, &due[0], at(100)).unwrap_err();
    assert_eq!(err.code(), "REJECTED");
    engine
        .fire(&mut store, &due[1], at(100))
        .unwrap()
        .expect("the other timer fires");
    let store = h.reopen(store);
    let timers = store.timers(&wid("o")).unwrap();
    assert_eq!(timers[0].status, TimerStatus::Rejected);
    assert_eq!(
        timers[0].last_error.as_deref(),
        Some("the order is already closed")
    );
    assert_eq!(timers[0].processed_at, Some(at(100)));
    assert_eq!(timers[1].status, TimerStatus::Fired);
    let mut store = store;
    assert!(
        store
            .claim_timers(10, Duration::from_millis(50), at(1_000_000))
            .unwrap()
            .is_empty(),
        "a rejected timer is not taken again"
    );
    assert_eq!(kinds(&store, "o"), ["start", TIMER_FIRED]);
    assert!(matches!(
        store.reject_timer(&timers[1].timer_id, "again", at(200)),
        Err(Error::TimerNotScheduled { .. })
    ));
}

/// An order: placing it books a flight (asking for its reference) and a hotel, and sends a plain
/// notice; a `cancel` event withdraws the hotel by kind and the notice by ID; the flight's result is
/// kept in state.
struct Order;

#[derive(Default)]
struct OrderState {
    reference: Option<Value>,
    completions: u32,
}

impl Workflow for Order {
    type State = OrderState;

    fn evolve(&self, state: &mut OrderState, event: &EventRecord) {
        if let Some(Ok(done)) = event.decode::<CommandCompleted>() {
            state.completions += 1;
            if done.kind == "book_flight" {
                state.reference = Some(done.result);
            }
        }
    }

    fn decide(&self, _: &OrderState, event: &EventRecord) -> Decision {
        match event.kind.as_str() {
            "placed" => Decision::new()
                .command(Command::new("book_flight", json!({ "to": "成都" })).report_result())
                .command(Command::new("book_hotel", json!({})))
                .command(Command::new("notify", json!({}))),
            "cancel" => Decision::new()
                .cancel_commands_of_kind("book_hotel")
                .cancel_command(cid(&format!("{}:1:2", event.workflow_id))),
            _ => Decision::none(),
        }
    }
}

/// Fires every due `command_completed` feedback of `store` at `now`; returns how many fired.
fn fire_feedback<S: Store>(store: &mut S, now: Timestamp) -> usize {
    let engine = Engine::new(Order);
    let due = store
        .claim_timers(100, Duration::from_secs(1), now)
        .unwrap();
    due.iter()
        .filter(|timer| engine.fire(store, timer, now).unwrap().is_some())
        .count()
}

/// A command that asks for its result feeds exactly one `command_completed` event — command ID,
/// kind, result, attempts — back into its workflow, scheduled in the transaction of its ack; a plain
/// command's ack feeds nothing back; a stale or repeated ack records nothing (DESIGN rule 15).
pub fn completions_feed_results_back_exactly_once<H: Harness>(h: &mut H) {
    let mut store = h.open();
    let engine = Engine::new(Order);
    let order = wid("order-1");
    engine
        .handle(&mut store, &order, Event::new("placed", json!({})), T0)
        .unwrap();
    let first = claim(&mut store, "w1", 3, 100, T0);
    assert!(store.commands(&order).unwrap()[0].report_result);
    // The first lease runs out; a second worker delivers and acks with the reference.
    let second = claim(&mut store, "w2", 1, 100, at(100));
    assert_eq!(second[0].command_id, cid("order-1:1:0"));
    let reference = json!({ "reference": "REF-1" });
    store
        .complete(
            &second[0].command_id,
            second[0].token,
            Some(&reference),
            at(150),
        )
        .unwrap();
    let late = store.complete(
        &first[0].command_id,
        first[0].token,
        Some(&json!("late")),
        at(160),
    );
    assert!(matches!(late, Err(Error::StaleLease { .. })), "{late:?}");
    assert!(store
        .complete(
            &second[0].command_id,
            second[0].token,
            Some(&reference),
            at(170)
        )
        .is_err());
    // Plain commands: completed with or without a result, nothing is fed back.
    store
        .complete(
            &first[1].command_id,
            first[1].token,
            Some(&json!({ "room": 7 })),
            at(180),
        )
        .unwrap();
    store
        .complete(&first[2].command_id, first[2].token, None, at(180))
        .unwrap();

    let mut store = h.reopen(store);
    let rows = store.commands(&order).unwrap();
    assert_eq!(rows[0].result, Some(reference.clone()));
    assert_eq!(rows[1].result, Some(json!({ "room": 7 })));
    let feedback: Vec<String> = store
        .timers(&order)
        .unwrap()
        .iter()
        .map(|t| format!("{} {}", t.timer_id, t.event_kind))
        .collect();
    assert_eq!(feedback, ["order-1:1:0:completed command_completed"]);
    assert_eq!(fire_feedback(&mut store, at(200)), 1);
    assert_eq!(fire_feedback(&mut store, at(300)), 0, "exactly once");
    let events = store.load(&order).unwrap();
    assert_eq!(events.len(), 2);
    let done = events[1].decode::<CommandCompleted>().unwrap().unwrap();
    assert_eq!(
        done,
        CommandCompleted {
            command_id: cid("order-1:1:0"),
            kind: "book_flight".into(),
            result: reference.clone(),
            attempts: 2,
        }
    );
    let state = engine.replay(&store, &order).unwrap().state;
    assert_eq!(state.reference, Some(reference));
    assert_eq!(state.completions, 1);
    // A result past the JSON limits is refused, and the command stays leased.
    engine
        .handle(
            &mut store,
            &wid("order-2"),
            Event::new("placed", json!({})),
            T0,
        )
        .unwrap();
    let d = claim(&mut store, "w3", 1, 1_000, at(400));
    let deep = nested(65);
    let err = store
        .complete(&d[0].command_id, d[0].token, Some(&deep), at(401))
        .unwrap_err();
    assert_eq!(err.code(), "INVALID_INPUT", "{err}");
    assert_eq!(status(&store, "order-2:1:0"), Status::Leased);
}

/// A decision withdraws earlier commands of its workflow (DESIGN rule 16): not yet delivered, they
/// become `cancelled` and are never handed out; being delivered, they are marked, the holder's
/// heartbeat learns it, and the real outcome is still recorded — a completion is fed back, a
/// retryable failure leaves it cancelled, a lease that runs out does too. Finished commands and other
/// workflows' commands are left alone.
pub fn cancelled_commands_are_never_delivered<H: Harness>(h: &mut H) {
    let mut store = h.open();
    let engine = Engine::new(Order);
    for n in 1..=4 {
        engine
            .handle(
                &mut store,
                &wid(&format!("o{n}")),
                Event::new("placed", json!({})),
                T0,
            )
            .unwrap();
    }
    // o1: nothing delivered yet. o2: hotel and notice leased. o3: hotel leased, then its lease runs
    // out. o4: hotel done before the cancel.
    let strict = |worker: &str| {
        ClaimRequest::new(worker)
            .limit(100)
            .lease_ttl(Duration::from_millis(1_000))
    };
    let all = store.claim(&strict("w1"), T0).unwrap();
    let held = |workflow: &str, index: u32| {
        all.iter()
            .find(|d| d.command_id == cid(&format!("{workflow}:1:{index}")))
            .cloned()
            .expect("claimed")
    };
    for d in all
        .iter()
        .filter(|d| d.command_id.workflow_id().as_str() == "o1")
    {
        store.release(&d.command_id, d.token, T0).unwrap();
    }
    let o4_hotel = held("o4", 1);
    store
        .complete(&o4_hotel.command_id, o4_hotel.token, None, at(10))
        .unwrap();

    for n in 1..=4 {
        engine
            .handle(
                &mut store,
                &wid(&format!("o{n}")),
                Event::new("cancel", json!({})),
                at(20),
            )
            .unwrap();
    }
    let mut store = h.reopen(store);
    for id in ["o1:1:1", "o1:1:2"] {
        assert_eq!(status(&store, id), Status::Cancelled, "{id}");
    }
    assert_eq!(status(&store, "o1:1:0"), Status::Pending, "not cancelled");
    assert_eq!(
        status(&store, "o4:1:1"),
        Status::Done,
        "finished: left alone"
    );
    assert_eq!(status(&store, "o4:1:2"), Status::Leased);
    let row = store.command(&cid("o2:1:1")).unwrap().unwrap();
    assert!(row.cancel_requested && row.status == Status::Leased);
    assert!(!pending_ids(&store).contains(&"o1:1:1".to_owned()));

    // The heartbeat tells the holder; its completion is still recorded and fed back.
    let o2_hotel = held("o2", 1);
    let extended = store
        .extend(
            &o2_hotel.command_id,
            o2_hotel.token,
            Duration::from_millis(1_000),
            at(30),
        )
        .unwrap();
    assert!(extended.cancel_requested);
    let o2_notice = held("o2", 2);
    let not_cancelled = store
        .extend(
            &held("o2", 0).command_id,
            held("o2", 0).token,
            Duration::from_millis(1_000),
            at(30),
        )
        .unwrap();
    assert!(!not_cancelled.cancel_requested);
    store
        .complete(
            &o2_hotel.command_id,
            o2_hotel.token,
            Some(&json!("booked anyway")),
            at(40),
        )
        .unwrap();
    // A retryable failure of a cancelled command leaves it cancelled; a permanent one is dead.
    let settled = store
        .fail(
            &o2_notice.command_id,
            o2_notice.token,
            &Failure::retryable("503"),
            &policy(),
            at(40),
        )
        .unwrap();
    assert_eq!(settled, Settled::Cancelled);
    let o3_notice = held("o3", 2);
    let settled = store
        .fail(
            &o3_notice.command_id,
            o3_notice.token,
            &Failure::permanent("422"),
            &policy(),
            at(40),
        )
        .unwrap();
    assert_eq!(settled, Settled::Dead);
    // o3's hotel: its lease runs out; the next claim withdraws it instead of delivering it.
    let later = store.claim(&strict("w2"), at(5_000)).unwrap();
    let again: Vec<String> = later.iter().map(|d| d.command_id.to_string()).collect();
    assert!(
        !again
            .iter()
            .any(|id| id.ends_with(":1:1") || id.ends_with(":1:2")),
        "{again:?}"
    );
    assert_eq!(status(&store, "o3:1:1"), Status::Cancelled);
    assert_eq!(status(&store, "o2:1:1"), Status::Done);
    assert_eq!(status(&store, "o2:1:2"), Status::Cancelled);
    assert_eq!(status(&store, "o3:1:2"), Status::Dead);
    assert!(matches!(
        store.mark_done(&cid("o1:1:1"), at(6_000)),
        Err(Error::InvalidState { .. })
    ));
    // The completion of the cancelled hotel comes back to o2, though it did not ask for it.
    let mut store = h.reopen(store);
    fire_feedback(&mut store, at(6_000));
    let kinds = kinds(&store, "o2");
    assert_eq!(kinds, ["placed", "cancel", COMMAND_COMPLETED]);
    let done = store.load(&wid("o2")).unwrap()[2]
        .decode::<CommandCompleted>()
        .unwrap()
        .unwrap();
    assert_eq!(
        (done.kind.as_str(), done.result),
        ("book_hotel", json!("booked anyway"))
    );
    // Cancelled rows are final: retention removes them like done rows.
    assert!(store.purge_done(Duration::ZERO, at(7_000), 100).unwrap() >= 3);
    assert!(store.command(&cid("o1:1:1")).unwrap().is_none());
    // A decision cancels only its own workflow's commands.
    let err = Commit::new(
        wid("o1"),
        Seq::new(2).unwrap(),
        Event::new("e", json!({})),
        Decision::new().cancel_command(cid("o2:1:0")),
        at(8_000),
    )
    .unwrap_err();
    assert_eq!(err.code(), "INVALID_INPUT", "{err}");
}

/// Expands to one `#[test]` per conformance case for the [`Harness`] built by `$harness`. A second
/// argument replaces the test attribute, e.g. `#[wasm_bindgen_test::wasm_bindgen_test]` on wasm32.
#[macro_export]
macro_rules! store_conformance_tests {
    ($harness:expr) => {
        $crate::store_conformance_tests!($harness, #[test]);
    };
    ($harness:expr, #[$test:meta]) => {
        $crate::store_conformance_tests!(@cases $harness; $test;
            seqs_are_gapless_from_one,
            failed_commit_writes_nothing,
            stale_expected_seq_conflicts,
            engine_retries_a_conflict_at_the_next_seq,
            rejected_events_write_nothing,
            command_ids_match_the_vectors,
            timer_ids_match_the_vectors,
            pending_order_matches_the_vectors,
            outbox_rows_start_pending_with_every_column,
            mark_done_is_idempotent_and_unknown_ids_are_errors,
            replay_folds_and_never_dispatches,
            claims_are_exclusive_and_due_only,
            expired_leases_are_fenced,
            late_ack_without_takeover_completes_and_extend_works,
            backoff_follows_the_policy_then_dead,
            permanent_failures_and_exhausted_leases_are_dead,
            burials_do_not_use_up_the_claim_limit,
            retry_and_resolve_dead_commands,
            strict_order_holds_back_later_commands,
            complete_all_settles_each_ack,
            release_gives_a_command_back_unattempted,
            purge_done_removes_only_old_done_rows,
            timers_are_scheduled_in_the_commit,
            timers_fire_once_not_before_their_time,
            cancelled_timers_never_fire,
            racing_firers_commit_one_event,
            failure_feedback_is_committed_exactly_once,
            payloads_over_the_limits_are_refused_naming_their_path,
            extend_never_shortens_a_lease,
            rejected_timers_end_rejected_and_are_not_taken_again,
            completions_feed_results_back_exactly_once,
            cancelled_commands_are_never_delivered,
        );
    };
    (@cases $harness:expr; $test:meta; $($case:ident),* $(,)?) => {
        $(
            #[$test]
            fn $case() {
                let mut harness = $harness;
                $crate::conformance::$case(&mut harness);
            }
        )*
    };
}

// ----------------------------------------------------------------------------------------------------
// Receiver idempotency (rule 10)

/// How the suite drives one idempotency store backend.
pub trait IdempotencyHarness {
    /// The store under test.
    type Store: IdempotencyStore;

    /// A new, empty store with `policy`.
    fn open(&mut self, policy: IdempotencyPolicy) -> Self::Store;

    /// Closes `store` and opens the same records again.
    fn reopen(&mut self, store: Self::Store) -> Self::Store;
}

fn key(text: &str) -> IdempotencyKey {
    IdempotencyKey::new(text).expect("valid key in test")
}

fn receiver_policy() -> IdempotencyPolicy {
    IdempotencyPolicy {
        retention: Duration::from_millis(10_000),
        reservation_timeout: Duration::from_millis(1_000),
    }
}

fn booking(traveller: &str) -> Digest {
    let request = json!({ "flight": "CA1405", "traveller": traveller, "sent_at": 1, "trace": "x" });
    Digest::of_intent(&request, &["flight", "traveller"])
}

/// The reservation token of a `Fresh` answer; panics on any other answer.
fn fresh(answer: Begin) -> u64 {
    match answer {
        Begin::Fresh { token } => token,
        other => panic!("expected Fresh, got {other:?}"),
    }
}

/// Fresh once; the same key and digest then get the stored result, with no new reservation.
pub fn first_begin_is_fresh_and_repeats_get_the_result<H: IdempotencyHarness>(h: &mut H) {
    let mut store = h.open(receiver_policy());
    let k = key("trip-001:1:0");
    let token = fresh(store.begin(&k, booking("Li Lei"), T0).unwrap());
    assert!(matches!(
        store.finish(&key("never-begun"), 1, &json!(1), T0),
        Err(Error::UnknownKey { .. })
    ));
    store
        .finish(
            &k,
            token,
            &json!({ "reference": "BK-1", "seats": [1, 2] }),
            at(5),
        )
        .unwrap();
    assert!(
        matches!(
            store.finish(&k, token, &json!({ "reference": "BK-2" }), at(6)),
            Err(Error::StaleReservation { .. })
        ),
        "finished twice"
    );
    let mut store = h.reopen(store);
    for later in [at(6), at(9_000)] {
        assert_eq!(
            store.begin(&k, booking("Li Lei"), later).unwrap(),
            Begin::Completed {
                result: json!({ "reference": "BK-1", "seats": [1, 2] })
            }
        );
    }
    // Another operation (another key) with the same parameters is another effect.
    fresh(
        store
            .begin(&key("trip-002:1:0"), booking("Li Lei"), at(7))
            .unwrap(),
    );
}

/// The same key with another digest is a conflict naming both digests, before and after completion;
/// the stored result is never handed out for it.
pub fn a_changed_digest_is_a_conflict<H: IdempotencyHarness>(h: &mut H) {
    let mut store = h.open(receiver_policy());
    let k = key("trip-001:1:0");
    let token = fresh(store.begin(&k, booking("Li Lei"), T0).unwrap());
    let conflict = Begin::Conflict {
        key: k.clone(),
        stored_digest: booking("Li Lei"),
        new_digest: booking("Han Meimei"),
    };
    assert_eq!(
        store.begin(&k, booking("Han Meimei"), at(1)).unwrap(),
        conflict,
        "while in progress"
    );
    store
        .finish(&k, token, &json!({ "reference": "BK-1" }), at(2))
        .unwrap();
    assert_eq!(
        store.begin(&k, booking("Han Meimei"), at(3)).unwrap(),
        conflict,
        "after completion"
    );
    let record = store.record(&k).unwrap().unwrap();
    assert_eq!(
        record.digest,
        booking("Li Lei"),
        "a conflict changes nothing"
    );
}

/// A held key answers `InProgress` until its reservation times out; then another caller takes it over.
/// `abandon` releases it at once.
pub fn reservations_block_then_can_be_taken_over<H: IdempotencyHarness>(h: &mut H) {
    let mut store = h.open(receiver_policy());
    let k = key("k");
    let first = fresh(store.begin(&k, booking("a"), T0).unwrap());
    assert_eq!(
        store.begin(&k, booking("a"), T0).unwrap(),
        Begin::InProgress { since: T0 },
        "a concurrent second caller waits"
    );
    assert_eq!(
        store.begin(&k, booking("a"), at(999)).unwrap(),
        Begin::InProgress { since: T0 }
    );
    let second = fresh(store.begin(&k, booking("a"), at(1_000)).unwrap());
    assert!(second > first, "a takeover gets a greater token");
    assert_eq!(
        store.begin(&k, booking("a"), at(1_001)).unwrap(),
        Begin::InProgress { since: at(1_000) }
    );
    store.abandon(&k, second).unwrap();
    assert!(
        matches!(
            store.abandon(&k, second),
            Err(Error::StaleReservation { .. })
        ),
        "abandoned once"
    );
    store.abandon(&key("never-begun"), 7).unwrap();
    let third = fresh(store.begin(&k, booking("a"), at(1_002)).unwrap());
    assert!(third > second, "tokens keep growing across an abandon");
    store.finish(&k, third, &json!("ok"), at(1_003)).unwrap();
    assert!(
        matches!(
            store.abandon(&k, third),
            Err(Error::StaleReservation { .. })
        ),
        "a finished effect cannot be abandoned"
    );
}

/// A holder whose reservation was taken over is fenced off (DESIGN rule 14): its `abandon` does not
/// release the new holder's reservation, its `finish` is refused and stores nothing, and the new
/// holder finishes as usual — so a third caller never gets `Fresh`.
pub fn stale_holders_are_fenced<H: IdempotencyHarness>(h: &mut H) {
    let mut store = h.open(receiver_policy());
    let k = key("trip-001:1:0");
    let stale = fresh(store.begin(&k, booking("a"), T0).unwrap());
    let current = fresh(store.begin(&k, booking("a"), at(1_000)).unwrap());

    let err = store.abandon(&k, stale).unwrap_err();
    assert_eq!(err.code(), "STALE_RESERVATION");
    assert!(err.to_string().contains(&stale.to_string()), "{err}");
    assert_eq!(
        store.begin(&k, booking("a"), at(1_001)).unwrap(),
        Begin::InProgress { since: at(1_000) },
        "the stale abandon released nothing: a third caller waits"
    );
    assert!(matches!(
        store.finish(&k, stale, &json!("stale"), at(1_002)),
        Err(Error::StaleReservation { .. })
    ));
    let mut store = h.reopen(store);
    assert_eq!(
        store.record(&k).unwrap().unwrap().state,
        RecordState::Reserved,
        "the stale finish stored nothing"
    );
    store
        .finish(&k, current, &json!({ "reference": "BK-2" }), at(1_003))
        .unwrap();
    assert_eq!(
        store.begin(&k, booking("a"), at(1_004)).unwrap(),
        Begin::Completed {
            result: json!({ "reference": "BK-2" })
        }
    );
    // A late finish without a takeover is still the holder's.
    let late = fresh(store.begin(&key("slow"), booking("a"), at(2_000)).unwrap());
    store
        .finish(&key("slow"), late, &json!("late"), at(9_000))
        .unwrap();
}

/// A token never comes back: not after an abandon, nor after the record expired or was purged.
pub fn reservation_tokens_never_repeat<H: IdempotencyHarness>(h: &mut H) {
    let mut store = h.open(receiver_policy());
    let k = key("k");
    let mut seen = vec![fresh(store.begin(&k, booking("a"), T0).unwrap())];
    store.abandon(&k, seen[0]).unwrap();
    seen.push(fresh(store.begin(&k, booking("a"), T0).unwrap()));
    // Past retention, the expired reservation is replaced.
    seen.push(fresh(store.begin(&k, booking("a"), at(20_000)).unwrap()));
    assert_eq!(store.purge(at(40_000), 10).unwrap(), 1);
    seen.push(fresh(store.begin(&k, booking("a"), at(40_000)).unwrap()));
    for pair in seen.windows(2) {
        assert!(pair[1] > pair[0], "tokens {seen:?} must grow");
    }
    for old in &seen[..3] {
        assert!(matches!(
            store.finish(&k, *old, &json!(1), at(40_001)),
            Err(Error::StaleReservation { .. })
        ));
    }
}

/// A result over the JSON limits is refused naming `result`, and the reservation stays, so the holder
/// can still finish with a smaller result or abandon.
pub fn oversized_results_are_refused_and_the_reservation_stays<H: IdempotencyHarness>(h: &mut H) {
    let mut store = h.open(receiver_policy());
    let k = key("k");
    let token = fresh(store.begin(&k, booking("a"), T0).unwrap());
    let mut deep = json!(1);
    for _ in 0..65 {
        deep = json!([deep]);
    }
    let err = store.finish(&k, token, &deep, at(1)).unwrap_err();
    assert_eq!(err.code(), "INVALID_INPUT");
    assert!(err.to_string().contains("result"), "{err}");
    let mut store = h.reopen(store);
    assert_eq!(
        store.record(&k).unwrap().unwrap().state,
        RecordState::Reserved
    );
    store.finish(&k, token, &json!("small"), at(2)).unwrap();
}

/// Records are kept for the retention period and not a moment less; `purge` forgets only older ones,
/// in bounded batches.
pub fn records_expire_after_retention_and_not_before<H: IdempotencyHarness>(h: &mut H) {
    let mut store = h.open(receiver_policy());
    for n in 0..5 {
        let k = key(&format!("k{n}"));
        let token = fresh(store.begin(&k, booking("a"), T0).unwrap());
        store.finish(&k, token, &json!(n), at(100)).unwrap();
    }
    let token = fresh(store.begin(&key("fresh"), booking("a"), at(5_000)).unwrap());
    store
        .finish(&key("fresh"), token, &json!("x"), at(5_000))
        .unwrap();
    assert_eq!(
        store.purge(at(10_099), 10).unwrap(),
        0,
        "kept for the whole retention"
    );
    assert_eq!(
        store.begin(&key("k0"), booking("a"), at(10_099)).unwrap(),
        Begin::Completed { result: json!(0) }
    );
    assert_eq!(store.purge(at(10_100), 2).unwrap(), 2, "bounded batch");
    assert_eq!(store.purge(at(10_100), 2).unwrap(), 2);
    assert_eq!(store.purge(at(10_100), 2).unwrap(), 1);
    assert_eq!(store.purge(at(10_100), 2).unwrap(), 0);
    let store_after = h.reopen(store);
    assert!(store_after.record(&key("k3")).unwrap().is_none());
    assert!(
        store_after.record(&key("fresh")).unwrap().is_some(),
        "a younger record stays"
    );
    let mut store = store_after;
    // Once retention has passed, the key is forgotten even before a purge: a new effect would follow.
    let token = fresh(store.begin(&key("old"), booking("a"), T0).unwrap());
    store.finish(&key("old"), token, &json!(1), T0).unwrap();
    fresh(store.begin(&key("old"), booking("a"), at(10_000)).unwrap());
    // Near the epoch too: a record finished at time 0 is kept until the retention has passed.
    let mut early = h.open(receiver_policy());
    let token = fresh(
        early
            .begin(&key("k"), booking("a"), Timestamp::EPOCH)
            .unwrap(),
    );
    early
        .finish(&key("k"), token, &json!(1), Timestamp::EPOCH)
        .unwrap();
    assert_eq!(early.purge(Timestamp::from_millis(9_999), 10).unwrap(), 0);
    assert_eq!(early.purge(Timestamp::from_millis(10_000), 10).unwrap(), 1);
}

/// Expands to one `#[test]` per idempotency conformance case for the [`IdempotencyHarness`] built by
/// `$harness`. A second argument replaces the test attribute, as for
/// [`store_conformance_tests!`](crate::store_conformance_tests).
#[macro_export]
macro_rules! idempotency_conformance_tests {
    ($harness:expr) => {
        $crate::idempotency_conformance_tests!($harness, #[test]);
    };
    ($harness:expr, #[$test:meta]) => {
        $crate::store_conformance_tests!(@cases $harness; $test;
            first_begin_is_fresh_and_repeats_get_the_result,
            a_changed_digest_is_a_conflict,
            reservations_block_then_can_be_taken_over,
            stale_holders_are_fenced,
            reservation_tokens_never_repeat,
            oversized_results_are_refused_and_the_reservation_stays,
            records_expire_after_retention_and_not_before,
        );
    };
}
