//! The storage contract: what every backend must do, by concern (`EventLog`, `Outbox`, `Timers`,
//! `Operations`); the commit it writes atomically is [`crate::Commit`] (`commit.rs`).

use std::time::Duration;

use serde_json::Value;

pub use crate::commit::Commit;
use crate::control::{KindChange, KindControl};
use crate::error::Error;
use crate::id::{CommandId, Seq, WorkflowId};
use crate::model::EventRecord;
use crate::outbox::{ClaimRequest, Delivery, Extended, Failure, OutboxRow, Settled};
use crate::retry::RetryPolicy;
use crate::stats::OutboxStats;
use crate::time::Timestamp;
use crate::timer::{TimerId, TimerRow};

/// One acknowledgement in a batch: the command, the token of its lease, and the handler's result.
#[derive(Debug, Clone, PartialEq)]
pub struct Ack {
    /// The delivered command.
    pub command_id: CommandId,
    /// The token of the lease it was delivered under.
    pub token: u64,
    /// What the handler completed it with, if anything.
    pub result: Option<Value>,
}

impl Ack {
    /// An acknowledgement of `command_id` under `token`, without a result.
    pub fn new(command_id: CommandId, token: u64) -> Self {
        Self {
            command_id,
            token,
            result: None,
        }
    }

    /// With the handler's `result`.
    #[must_use]
    pub fn with_result(mut self, result: Value) -> Self {
        self.result = Some(result);
        self
    }
}

/// What [`Outbox::complete_all_and_claim`] did: the acks' results, and the next batch or why it
/// could not be claimed.
#[derive(Debug)]
pub struct Handover {
    /// One result per ack, in order: `Ok` once durably done, or why not (e.g.
    /// [`Error::StaleLease`]).
    pub completed: Vec<Result<(), Error>>,
    /// The claimed deliveries, or the claim's error (the acks' results stand either way).
    pub claimed: Result<Vec<Delivery>, Error>,
}

/// Which event history an [`EventLog`] reads, for the engine's state cache
/// ([`crate::Engine::state_cache`]): a state folded from one log's events is used again only with a
/// log of the same `HistoryId`, and only after the event it was folded up to is found again, unchanged,
/// at its seq.
///
/// An ID names one history in this process: a store instance (and its clones, when they share their
/// data), never a file name or URL, which a new store could take over. Two IDs from
/// [`HistoryId::unique`] are never equal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HistoryId(u64);

impl HistoryId {
    /// An ID no other call in this process returns.
    pub fn unique() -> Self {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Self(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

/// How a store answered [`EventLog::append_after`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum AppendedAfter {
    /// The workflow's last event was still the one given: the commit is written.
    Written,
    /// The store cannot check the last event inside its commit: nothing was written, and the
    /// caller reads the workflow and commits as usual.
    Unchecked,
}

/// The event log of every workflow: all that [`crate::Engine::handle`] needs.
///
/// A store is synchronous and row-shaped: it stores JSON payloads and knows nothing of workflow types.
pub trait EventLog {
    /// The events of `workflow_id` in seq order (empty for a new workflow).
    fn load(&self, workflow_id: &WorkflowId) -> Result<Vec<EventRecord>, Error>;

    /// The events of `workflow_id` after `after`, in seq order: `load` without the first `after`
    /// events (empty when the workflow has none past it). [`crate::Engine::handle`] reads only what
    /// its cached state has not folded yet. A store should override this with a query that reads only
    /// those rows; the default loads every event and drops the first ones.
    fn load_after(&self, workflow_id: &WorkflowId, after: Seq) -> Result<Vec<EventRecord>, Error> {
        let mut events = self.load(workflow_id)?;
        events.retain(|event| event.seq > after);
        Ok(events)
    }

    /// The history this log reads, when the engine may keep states folded from it between calls;
    /// `None` (the default) makes the engine replay every workflow from its first event each time.
    ///
    /// A store returns `Some` only when every read of [`EventLog::load_after`] sees committed events
    /// alone (never a transaction's own uncommitted writes) and the ID is its own (see
    /// [`HistoryId`]). Even then the engine trusts a cached state only after finding the event it was
    /// folded up to again, unchanged, at its seq. What that cannot see, and what miniflow never does,
    /// is a history whose events are replaced by others and then grow back to an equal event at that
    /// seq: events are appended, never rewritten, and a workflow ID is never used for a second workflow.
    fn history_id(&self) -> Option<HistoryId> {
        None
    }

    /// Writes `commit` atomically, in one transaction, if and only if the workflow's last seq is still
    /// `commit.expected_seq()` (DESIGN rule 3): its events, the workflow's unfinished commands it
    /// cancels ([`Commit::cancels`], [`OutboxRow::cancel`]), one outbox row per command, the timer it
    /// fires marked fired, the workflow's timers it cancels by name cancelled, then its new timers.
    ///
    /// # Errors
    ///
    /// [`Error::Conflict`] when the workflow moved on; [`Error::TimerNotScheduled`] when the timer it
    /// fires is no longer scheduled; any error means nothing of the commit was written.
    fn append_with_commands(&mut self, commit: &Commit) -> Result<(), Error>;

    /// Writes `commit` as [`EventLog::append_with_commands`] does if and only if the workflow's last
    /// event is still `last`, equal in every field (its seq is `commit.expected_seq()`), checked
    /// inside the commit's transaction: the engine's commit on a cached state, decided without
    /// reading the workflow first. [`AppendedAfter::Written`] when it wrote the commit;
    /// [`AppendedAfter::Unchecked`] (the default) when the store cannot check that in its commit:
    /// nothing is written then, and the engine reads the workflow first, as it always can.
    ///
    /// A store that answers should keep a commit's events exactly as the commit holds them (no time
    /// or payload rewritten): the engine then keeps the last of them as the event its state was
    /// folded up to. Correctness does not rest on it (a state whose last event is not found again
    /// as it was is never used), only the saved read does.
    ///
    /// # Errors
    ///
    /// [`Error::Conflict`] when the workflow's last event is not `last` (it moved on, or its history
    /// is not the one `last` came from); [`Error::InvalidInput`] when `last` is not of the commit's
    /// workflow at its expected seq; otherwise as [`EventLog::append_with_commands`]. Any error
    /// means nothing of the commit was written.
    fn append_after(
        &mut self,
        last: &EventRecord,
        commit: &Commit,
    ) -> Result<AppendedAfter, Error> {
        let _ = (last, commit);
        Ok(AppendedAfter::Unchecked)
    }

    /// Called by [`crate::Engine::handle`] and [`crate::Engine::fire`] after a commit decided on a
    /// state just read lost its race for the `conflicts`-th time (1 for the first), before it reads
    /// the workflow and tries again (not after a commit on a cached state that was out of date:
    /// there was no race to wait out). A store that threads or processes share should wait here for
    /// [`conflict_backoff`] with a jitter of its own, so that the writers of one workflow do not try
    /// again in lockstep and run out of tries together. The default returns at once: the core has no clock, and a store only one caller
    /// holds (`&mut`) loses no race to another. A store that wraps another should forward it.
    fn before_retry(&mut self, conflicts: u32) {
        let _ = conflicts;
    }
}

/// How long a writer waits before it tries again after the `conflicts`-th lost race on one
/// workflow: 1 ms, doubling with each conflict up to 32 ms, times `jitter` (a number the host draws
/// at random, from 0.5 to 1.5; values outside are clamped), so that racing writers spread out. What
/// hosts wait in [`EventLog::before_retry`]; with the engine's default of 8 retries, at most about
/// 190 ms in all.
///
/// ```
/// use std::time::Duration;
/// use miniflow_core::backend::conflict_backoff;
///
/// assert_eq!(conflict_backoff(1, 1.0), Duration::from_millis(1));
/// assert_eq!(conflict_backoff(3, 0.5), Duration::from_millis(2));
/// assert_eq!(conflict_backoff(20, 1.5), Duration::from_millis(48));
/// ```
pub fn conflict_backoff(conflicts: u32, jitter: f64) -> Duration {
    const FIRST_MS: f64 = 1.0;
    const MOST_MS: f64 = 32.0;
    let doubled = FIRST_MS * 2f64.powi(conflicts.saturating_sub(1).min(16) as i32);
    let jitter = if jitter.is_nan() {
        1.0
    } else {
        jitter.clamp(0.5, 1.5)
    };
    Duration::from_secs_f64(doubled.min(MOST_MS) * jitter / 1_000.0)
}

/// The outbox: what a worker needs to take, extend and settle deliveries (DESIGN rules 5–9, 15). The
/// rules a store keeps are stated once, in [`OutboxRow`]'s methods.
pub trait Outbox {
    /// Up to `limit` unfinished (pending or leased) commands, ordered by `(workflow_id, event_seq, index)`.
    fn pending(&self, limit: usize) -> Result<Vec<OutboxRow>, Error>;

    /// One outbox row, whatever its status.
    fn command(&self, command_id: &CommandId) -> Result<Option<OutboxRow>, Error>;

    /// Every outbox row of `workflow_id`, in command ID order.
    fn commands(&self, workflow_id: &WorkflowId) -> Result<Vec<OutboxRow>, Error>;

    /// Marks a command done without a lease (see [`OutboxRow::mark_done`]). Harmless when repeated.
    ///
    /// # Errors
    ///
    /// [`Error::UnknownCommand`], or [`Error::InvalidState`] for a dead command.
    fn mark_done(&mut self, command_id: &CommandId, now: Timestamp) -> Result<(), Error>;

    /// Atomically leases up to `request.limit` claimable commands (see [`OutboxRow::claim`]) in
    /// `request.order` (DESIGN rules 6–7).
    fn claim(&mut self, request: &ClaimRequest, now: Timestamp) -> Result<Vec<Delivery>, Error>;

    /// Extends the lease of `token` on `command_id` to `now + ttl` (never shortening it); returns the
    /// new expiry and whether the workflow cancelled the command meanwhile (see
    /// [`OutboxRow::extend`]).
    ///
    /// # Errors
    ///
    /// [`Error::StaleLease`] when `token` is not the current lease.
    fn extend(
        &mut self,
        command_id: &CommandId,
        token: u64,
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Extended, Error>;

    /// Extends many leases, each `(command_id, token)` as [`Outbox::extend`] extends one, to
    /// `now + ttl` in one durable write: what a heartbeat does for all the leases of a worker. One
    /// answer per lease, in order, each the one [`Outbox::extend`] gives for it: the new expiry
    /// and whether the workflow cancelled the command, or why not ([`Error::StaleLease`] for a lost
    /// lease, [`Error::UnknownCommand`]). A store should override this with a single transaction
    /// that applies [`OutboxRow::extend`] to each row; the default extends them one by one.
    ///
    /// # Errors
    ///
    /// When the write failed as a whole (a storage error): no lease was extended then.
    fn extend_all(
        &mut self,
        leases: &[(CommandId, u64)],
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Vec<Result<Extended, Error>>, Error> {
        Ok(leases
            .iter()
            .map(|(command_id, token)| self.extend(command_id, *token, ttl, now))
            .collect())
    }

    /// Gives back a claimed command whose delivery was not started (see [`OutboxRow::release`]).
    ///
    /// # Errors
    ///
    /// [`Error::StaleLease`] when `token` is not the current lease.
    fn release(&mut self, command_id: &CommandId, token: u64, now: Timestamp) -> Result<(), Error>;

    /// Marks the delivery under `token` done, with the handler's `result` if it gave one (DESIGN
    /// rules 8 and 15). A command that reports its completion ([`OutboxRow::reports_completion`])
    /// schedules its `command_completed` feedback in the same transaction (see [`crate::backend::feedback`]).
    ///
    /// # Errors
    ///
    /// [`Error::StaleLease`] when another worker took the command over; [`Error::InvalidInput`] for a
    /// result over the JSON limits. Nothing changes then.
    fn complete(
        &mut self,
        command_id: &CommandId,
        token: u64,
        result: Option<&Value>,
        now: Timestamp,
    ) -> Result<(), Error>;

    /// Completes many deliveries in one durable write; one result per ack, in order. A store should
    /// override this with a single transaction; the default completes them one by one. It takes
    /// the acks, as [`Outbox::complete_all_and_claim`] does: a store that hands them to another
    /// thread (SQLite's writer) moves them instead of copying their results.
    fn complete_all(
        &mut self,
        acks: Vec<Ack>,
        now: Timestamp,
    ) -> Result<Vec<Result<(), Error>>, Error> {
        Ok(acks
            .iter()
            .map(|ack| self.complete(&ack.command_id, ack.token, ack.result.as_ref(), now))
            .collect())
    }

    /// Completes `acks` and claims the next batch, as a worker does between two batches: one result
    /// per ack, in order, and the claimed deliveries (DESIGN rules 7–8). A store with transactions
    /// should override it to write both in one durable transaction, so a worker pays one commit per
    /// batch instead of two; the default calls [`Outbox::complete_all`], then [`Outbox::claim`] (with
    /// no acks, only the claim).
    ///
    /// # Errors
    ///
    /// When the acks could not be written at all (nothing was then written). A claim that fails
    /// after the acks were written is [`Handover::claimed`]'s error: the acks' results stand.
    fn complete_all_and_claim(
        &mut self,
        acks: Vec<Ack>,
        request: &ClaimRequest,
        now: Timestamp,
    ) -> Result<Handover, Error> {
        let completed = if acks.is_empty() {
            Vec::new()
        } else {
            self.complete_all(acks, now)?
        };
        Ok(Handover {
            completed,
            claimed: self.claim(request, now),
        })
    }

    /// Settles a failed delivery under `token` (see [`OutboxRow::fail`], DESIGN rule 9). A command that
    /// becomes dead schedules its `command_failed` feedback in the same transaction (see
    /// [`crate::backend::feedback`]); so does a claim that buries a command whose lease ran out on its last
    /// attempt, and `resolve` schedules `command_resolved`.
    fn fail(
        &mut self,
        command_id: &CommandId,
        token: u64,
        failure: &Failure,
        policy: &RetryPolicy,
        now: Timestamp,
    ) -> Result<Settled, Error>;
}

/// Durable timers, and the feedback that travels through them (DESIGN rules 11–12).
pub trait Timers {
    /// Takes up to `limit` due timers (scheduled, `available_at <= now`) for `lease_ttl`, the longest
    /// due first: other firers leave them alone until then (see [`TimerRow::take`]).
    fn claim_timers(
        &mut self,
        limit: usize,
        lease_ttl: Duration,
        now: Timestamp,
    ) -> Result<Vec<TimerRow>, Error>;

    /// Ends a scheduled timer whose event its workflow refused (see [`TimerRow::reject`]): it becomes
    /// `rejected` with `reason`, terminal, and is never taken again. [`crate::Engine::fire`] calls it
    /// when the decision rejects the timer's event.
    ///
    /// # Errors
    ///
    /// [`Error::TimerNotScheduled`] when the timer is not scheduled (or unknown); nothing changes.
    fn reject_timer(
        &mut self,
        timer_id: &TimerId,
        reason: &str,
        now: Timestamp,
    ) -> Result<(), Error>;

    /// Every timer of `workflow_id` (scheduled, fired, cancelled and rejected), by ID.
    fn timers(&self, workflow_id: &WorkflowId) -> Result<Vec<TimerRow>, Error>;

    /// Whether a timer is due at `now` ([`TimerRow::is_due`]), a read that takes nothing: what a
    /// dispatcher that fires no timers looks at once, to say that they wait. The default answers
    /// `false` (a store that cannot tell cheaply says nothing).
    ///
    /// # Errors
    ///
    /// The store's errors.
    fn any_timer_due(&self, now: Timestamp) -> Result<bool, Error> {
        let _ = now;
        Ok(false)
    }
}

/// What operators do by hand and what they look at: dead letters, retries, resolutions, retention,
/// stats and the controls of each kind.
pub trait Operations {
    /// Retention: deletes up to `batch` done rows processed at least `older_than` before `now` (see
    /// [`OutboxRow::is_purgeable`]) and returns how many. Pending, leased and dead rows stay. Call it
    /// until it returns less than `batch`: each call is one short write.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a `batch` of 0 ([`crate::backend::check_purge_batch`]); the store's errors.
    fn purge_done(
        &mut self,
        older_than: Duration,
        now: Timestamp,
        batch: usize,
    ) -> Result<usize, Error>;

    /// Up to `limit` dead commands, in command ID order.
    fn dead_letters(&self, limit: usize) -> Result<Vec<OutboxRow>, Error>;

    /// Puts a dead command back to pending (see [`OutboxRow::retry`]).
    fn retry(&mut self, command_id: &CommandId, now: Timestamp) -> Result<(), Error>;

    /// Closes a dead command by hand with a note (see [`OutboxRow::resolve`]).
    fn resolve(&mut self, command_id: &CommandId, note: &str, now: Timestamp) -> Result<(), Error>;

    /// The outbox at `now` (see [`OutboxStats`]): pending, leased, claimable and dead commands by
    /// kind, the oldest claimable one (the lag), and the active controls. A read: it changes
    /// nothing, and a store reads its unfinished and dead rows from their indexes, never its done
    /// rows.
    fn stats(&self, now: Timestamp) -> Result<OutboxStats, Error>;

    /// The stored controls of every kind an operator ever changed (active or not), by kind.
    fn kind_controls(&self) -> Result<Vec<KindControl>, Error>;

    /// Changes the controls of `kind` as `by` at `now` ([`KindControl::change`]: pause, resume, set
    /// or remove a concurrency limit) and returns them. They are stored: every claim that begins
    /// after this returns, in any process, applies them ([`crate::backend::Admission`]). Commands of the kind
    /// are not changed.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] as [`KindControl::change`]; nothing changes then.
    fn control_kind(
        &mut self,
        kind: &str,
        change: KindChange,
        by: &str,
        now: Timestamp,
    ) -> Result<KindControl, Error>;

    /// Up to `limit` dead commands of `kind`, in command ID order.
    fn dead_letters_of_kind(&self, kind: &str, limit: usize) -> Result<Vec<OutboxRow>, Error>;

    /// Puts up to `batch` dead commands of `kind` back to pending, the first ones in command ID
    /// order, in one transaction, each as [`Operations::retry`] does one (recorded in its
    /// `manual_retries`); returns their IDs. Call it until it returns fewer than `batch`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] as [`crate::backend::check_bulk`]; nothing changes then.
    fn retry_dead_of_kind(
        &mut self,
        kind: &str,
        batch: usize,
        now: Timestamp,
    ) -> Result<Vec<CommandId>, Error>;

    /// Closes up to `batch` dead commands of `kind` by hand with `note`, the first ones in command ID
    /// order, in one transaction, each as [`Operations::resolve`] does one (its note kept, its
    /// `command_resolved` feedback scheduled); returns their IDs. Call it until it returns fewer
    /// than `batch`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] as [`crate::backend::check_bulk`]; nothing changes then.
    fn resolve_dead_of_kind(
        &mut self,
        kind: &str,
        note: &str,
        batch: usize,
        now: Timestamp,
    ) -> Result<Vec<CommandId>, Error>;
}

/// A miniflow store: the event log, the outbox, the timers and the operators' actions. Every type that
/// implements the four is a `Store`. A backend that passes the conformance suite
/// (`miniflow_core::conformance`, feature `conformance`) is a miniflow store.
///
/// Bring the traits into scope with `use miniflow_core::prelude::*` to call their methods.
pub trait Store: EventLog + Outbox + Timers + Operations {}

impl<T: EventLog + Outbox + Timers + Operations + ?Sized> Store for T {}
