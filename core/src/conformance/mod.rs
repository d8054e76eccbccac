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

use crate::backend::RecordState;
use crate::prelude::*;
use crate::{
    Ack, Begin, ClaimOrder, ClaimRequest, Command, CommandCompleted, CommandId, Commit, Decision,
    Digest, Engine, Error, Event, EventRecord, Failure, IdempotencyKey, IdempotencyPolicy,
    IdempotencyStore, JsonLimits, RetryPolicy, Seq, Settled, Status, Store, Timer, TimerId,
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
pub const COMMAND_ID_VECTORS: &str = include_str!("../../tests/vectors/command_ids.json");

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
    pub at: Option<u64>,
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
            Ok(self.command_id.as_deref().unwrap_or_default().parse()?)
        };
        match self.source.as_str() {
            "scheduled" => TimerId::scheduled(
                WorkflowId::new(self.workflow_id.clone())?,
                Seq::new(self.event_seq.unwrap_or_default())?,
                self.index.unwrap_or_default(),
            ),
            "occurrence" => TimerId::occurrence(
                WorkflowId::new(self.workflow_id.clone())?,
                Seq::new(self.event_seq.unwrap_or_default())?,
                self.index.unwrap_or_default(),
                Timestamp::from_millis(self.at.unwrap_or_default()),
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

mod cached;
mod commit;
mod controls;
mod edges;
mod leases;
mod receivers;
mod results;
mod schedules;
mod timers;
mod trace;

pub use self::cached::*;
pub use self::commit::*;
pub use self::controls::*;
pub use self::edges::*;
pub use self::leases::*;
pub use self::receivers::*;
pub use self::results::*;
pub use self::schedules::*;
pub use self::timers::*;
pub use self::trace::*;

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

/// `levels` nested arrays around `1`.
fn nested(levels: usize) -> serde_json::Value {
    (0..levels).fold(json!(1), |inner, _| json!([inner]))
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
            a_retry_withdraws_the_failure_not_yet_fed_back,
            payloads_over_the_limits_are_refused_naming_their_path,
            extend_never_shortens_a_lease,
            extend_all_answers_each_lease_as_extend_does,
            rejected_timers_end_rejected_and_are_not_taken_again,
            completions_feed_results_back_exactly_once,
            cancelled_commands_are_never_delivered,
            schedules_fire_each_occurrence_once_rearming_in_the_same_commit,
            a_failed_occurrence_commit_neither_fires_nor_rearms,
            missed_occurrences_follow_the_schedules_policy,
            stopped_schedules_never_fire_again,
            cron_schedules_fire_at_their_matches_in_utc,
            bad_schedules_are_refused_before_anything_is_written,
            stats_count_depth_by_kind_and_the_lag,
            stats_count_unfired_timers_and_feedback_until_everything_is_done,
            trace_contexts_and_due_times_reach_every_delivery,
            priorities_come_first_then_due_time,
            paused_kinds_are_skipped_until_resumed,
            a_concurrency_limit_caps_unexpired_leases_of_its_kind,
            a_limit_counts_the_leases_taken_before_it,
            bulk_retry_and_resolve_dead_commands_of_a_kind,
            load_after_returns_the_events_after_a_seq,
            a_commit_after_an_event_is_written_only_while_it_is_the_last,
            cached_states_decide_as_replay_does,
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
// Receiver idempotency (rules 10, 14)

/// How the suite drives one idempotency store backend.
pub trait IdempotencyHarness {
    /// The store under test.
    type Store: IdempotencyStore;

    /// A new, empty store with `policy`.
    fn open(&mut self, policy: IdempotencyPolicy) -> Self::Store;

    /// Closes `store` and opens the same records again.
    fn reopen(&mut self, store: Self::Store) -> Self::Store;
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
