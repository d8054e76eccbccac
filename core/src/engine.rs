//! Workflows and the engine that runs them: replay → decide → commit.

use std::fmt;

use crate::builtin::BUILT_IN_KINDS;
use crate::cache::{Entry, Key, StateCache, StateCacheStats};
use crate::error::Error;
use crate::id::{CommandId, Seq, WorkflowId};
use crate::limits::JsonLimits;
use crate::model::{Decision, Event, EventRecord};
use crate::occurrence::Firing;
use crate::store::{AppendedAfter, Commit, EventLog, HistoryId, Timers};
use crate::time::Timestamp;
use crate::timer::{TimerId, TimerRow};
use crate::trace::TraceContext;

/// A workflow: how its events fold into state, and what it decides when a new event arrives.
///
/// Both functions must be deterministic (no clock, no randomness, no I/O): replay runs `evolve` over the
/// recorded events again and again and must reach the same state each time. Time is in the event
/// record (`recorded_at`). The engine keeps folded states between calls ([`Engine::state_cache`]) and
/// folds only the newer events into them, so folding the events one call at a time must reach the
/// same state as folding them all at once — which a deterministic `evolve` does.
///
/// ```
/// use miniflow_core::{Command, Decision, EventRecord, Workflow};
/// use serde_json::json;
///
/// #[derive(Default)]
/// struct Trip { requested: bool }
///
/// struct TripWorkflow;
///
/// impl Workflow for TripWorkflow {
///     type State = Trip;
///
///     fn evolve(&self, state: &mut Trip, event: &EventRecord) {
///         if event.kind == "trip_requested" {
///             state.requested = true;
///         }
///     }
///
///     fn decide(&self, state: &Trip, event: &EventRecord) -> Decision {
///         match event.kind.as_str() {
///             "trip_requested" if !state.requested => Decision::new().command(Command::new(
///                 "lock_budget",
///                 json!({ "trip_id": event.workflow_id }),
///             )),
///             _ => Decision::none(),
///         }
///     }
/// }
/// ```
pub trait Workflow {
    /// What the workflow knows, folded from its events.
    type State: Default;

    /// Folds one recorded event into the state.
    fn evolve(&self, state: &mut Self::State, event: &EventRecord);

    /// Decides the commands for an incoming `event`, given the state before it. `event` carries the seq
    /// it will be recorded at, so the decision knows the IDs its commands will get.
    fn decide(&self, state: &Self::State, event: &EventRecord) -> Decision;
}

/// A workflow's state rebuilt from its events (DESIGN rule 2). It holds no commands: what is pending
/// lives only in the outbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayResult<S> {
    /// The folded state.
    pub state: S,
    /// The seq of the last event, 0 for a workflow with none. The next commit expects it.
    pub last_seq: Seq,
}

/// Folds `events` (in seq order) into a state.
///
/// # Errors
///
/// [`Error::Corrupt`] when the seqs are not 1, 2, 3… as a store must return them.
pub fn replay<W: Workflow + ?Sized>(
    workflow: &W,
    events: &[EventRecord],
) -> Result<ReplayResult<W::State>, Error> {
    let mut state = W::State::default();
    let last_seq = fold(workflow, &mut state, Seq::ZERO, events)?;
    Ok(ReplayResult { state, last_seq })
}

/// Folds `events`, which must follow `last_seq` without a gap, into `state`; returns the new last seq.
fn fold<W: Workflow + ?Sized>(
    workflow: &W,
    state: &mut W::State,
    mut last_seq: Seq,
    events: &[EventRecord],
) -> Result<Seq, Error> {
    for event in events {
        if event.seq.get() != last_seq.get() + 1 {
            return Err(Error::Corrupt(format!(
                "workflow {} has event seq {} after {}",
                event.workflow_id, event.seq, last_seq
            )));
        }
        workflow.evolve(state, event);
        last_seq = event.seq;
    }
    Ok(last_seq)
}

/// `commit` marking `fires` fired, and carrying `context`.
fn finish(
    mut commit: Commit,
    fires: Option<&Firing>,
    context: Option<&TraceContext>,
) -> Result<Commit, Error> {
    if let Some(firing) = fires {
        commit = commit.fired_by(firing)?;
    }
    if let Some(context) = context {
        commit = commit.traced(context.clone());
    }
    Ok(commit)
}

/// A workflow's state folded for one call, with where it may be cached afterwards.
struct Folded<S> {
    state: S,
    last_seq: Seq,
    /// The cache key, when the log names its history and the cache is on.
    key: Option<Key>,
    /// The last event folded (none for a new workflow).
    last: Option<EventRecord>,
}

impl<S> Folded<S> {
    fn into_entry(self) -> Option<(Key, Entry<S>)> {
        let (key, last) = (self.key?, self.last?);
        Some((
            key,
            Entry {
                last,
                state: self.state,
                unfolded: Vec::new(),
            },
        ))
    }
}

/// What became of a commit tried on a cached state ([`Engine::commit_on_cached`]).
enum OnCached {
    /// Written: what it handled.
    Committed(Handled),
    /// Refused: the workflow's last event is not the cached state's (a rival's commit came after it,
    /// or another history): the workflow is read, unless no retry is allowed.
    Conflict(Error),
    /// Not tried: no cached state, or a store that cannot check the last event in its commit.
    NotTried,
}

/// A commit planned by [`Engine::plan_in`], with the state it was decided on: write
/// [`Planned::commit`], and once the transaction it was read and written in has committed, hand it
/// back with [`Engine::remember`] so the next call on the workflow folds only newer events. Dropping
/// it instead is always safe: the workflow is then replayed from its first event next time.
pub struct Planned<S> {
    commit: Commit,
    folded: Option<(Key, Entry<S>)>,
}

impl<S> Planned<S> {
    /// The commit to write.
    pub fn commit(&self) -> &Commit {
        &self.commit
    }
}

impl<S> fmt::Debug for Planned<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Planned")
            .field("commit", &self.commit)
            .field("keeps_state", &self.folded.is_some())
            .finish()
    }
}

/// What [`Engine::handle`] committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handled {
    /// The seq the event was recorded at.
    pub seq: Seq,
    /// The IDs of the commands it decided, in decision order.
    pub command_ids: Vec<CommandId>,
    /// The IDs of the timers it scheduled, in decision order.
    pub timer_ids: Vec<TimerId>,
    /// How many times the commit lost a race and was replayed and decided again.
    pub conflicts: u32,
}

impl Handled {
    /// What writing `commit` handled, after `conflicts` lost races.
    pub fn of(commit: &Commit, conflicts: u32) -> Self {
        Self {
            seq: commit.last_seq(),
            command_ids: commit
                .commands()
                .iter()
                .map(|row| row.command_id.clone())
                .collect(),
            timer_ids: commit.timers().iter().map(|t| t.timer_id.clone()).collect(),
            conflicts,
        }
    }
}

/// Runs a [`Workflow`] against an [`EventLog`] (any store): replay → decide → commit, retrying on conflict.
///
/// ```
/// # use miniflow_core::{Command, Decision, EventRecord, Workflow};
/// # use serde_json::json;
/// # #[derive(Default)] struct Trip;
/// # struct TripWorkflow;
/// # impl Workflow for TripWorkflow {
/// #     type State = Trip;
/// #     fn evolve(&self, _: &mut Trip, _: &EventRecord) {}
/// #     fn decide(&self, _: &Trip, event: &EventRecord) -> Decision {
/// #         Decision::new().command(Command::new("lock_budget", json!({ "trip_id": event.workflow_id })))
/// #     }
/// # }
/// use miniflow_core::prelude::*;
/// use miniflow_core::{Engine, Event, MemoryStore, Timestamp, WorkflowId};
///
/// let engine = Engine::new(TripWorkflow);
/// let mut store = MemoryStore::new();
/// let trip = WorkflowId::new("trip-001")?;
/// let handled = engine.handle(
///     &mut store,
///     &trip,
///     Event::new("trip_requested", json!({ "city": "成都" })),
///     Timestamp::from_millis(0),
/// )?;
/// assert_eq!(handled.command_ids[0].to_string(), "trip-001:1:0");
/// assert_eq!(store.pending(10)?.len(), 1);
/// # Ok::<(), miniflow_core::Error>(())
/// ```
///
/// # The state cache
///
/// The engine keeps the states it folded, for up to [`Engine::DEFAULT_STATE_CACHE`] workflows by
/// default ([`Engine::state_cache`]), least recently used first out. A call on a cached workflow reads
/// from its store only the events after the cached state ([`EventLog::load_after`]), so the cost of
/// [`Engine::handle`] does not grow with the workflow's history; with a store that checks, inside the
/// commit, that the cached state's last event is still the workflow's last
/// ([`EventLog::append_after`]), it reads nothing and decides on the cached state at once. Replay from the first event stays the
/// definition: a state is cached only once the events it was folded from are committed, it is used
/// only with the history it was folded from ([`EventLog::history_id`]), and only after the store is
/// found to hold, unchanged, the last event it was folded from; newer events (a rival's commits too)
/// are folded into it. Otherwise (another store, events removed) it is dropped unused and the workflow
/// replayed from its first event.
///
/// The engine may be shared between threads (`&Engine` is all a call needs; the cache is behind a
/// lock held only to take or put a state, never while the workflow's code runs). Then `W::State`
/// must be `Send`.
pub struct Engine<W: Workflow> {
    workflow: W,
    max_conflict_retries: u32,
    limits: JsonLimits,
    states: StateCache<W::State>,
}

impl<W: Workflow + fmt::Debug> fmt::Debug for Engine<W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Engine")
            .field("workflow", &self.workflow)
            .field("max_conflict_retries", &self.max_conflict_retries)
            .field("limits", &self.limits)
            .field("state_cache", &self.states.capacity())
            .finish()
    }
}

/// A clone starts with an empty state cache of the same capacity.
impl<W: Workflow + Clone> Clone for Engine<W> {
    fn clone(&self) -> Self {
        Self {
            workflow: self.workflow.clone(),
            max_conflict_retries: self.max_conflict_retries,
            limits: self.limits,
            states: StateCache::new(self.states.capacity()),
        }
    }
}

impl<W: Workflow> Engine<W> {
    /// How many workflows' states an engine keeps unless told otherwise ([`Engine::state_cache`]).
    pub const DEFAULT_STATE_CACHE: usize = 1024;

    /// An engine for `workflow` that retries a conflicting commit up to 8 times and keeps the states of
    /// up to [`Engine::DEFAULT_STATE_CACHE`] workflows.
    pub fn new(workflow: W) -> Self {
        Self {
            workflow,
            max_conflict_retries: 8,
            limits: JsonLimits::default(),
            states: StateCache::new(Self::DEFAULT_STATE_CACHE),
        }
    }

    /// Sets how many workflows' states the engine keeps between calls (least recently used out first);
    /// 0 keeps none, so every call replays its workflow from the first event. The cache starts empty.
    /// Size it to the workflows that receive events often: each entry holds one state and the last
    /// event it folded.
    #[must_use]
    pub fn state_cache(mut self, capacity: usize) -> Self {
        self.states = StateCache::new(capacity);
        self
    }

    /// How the state cache has done since the engine was built (hits, misses, stale states dropped,
    /// evictions, size).
    pub fn state_cache_stats(&self) -> StateCacheStats {
        self.states.stats()
    }

    /// Drops every cached state, e.g. after the workflow's code changed how it folds events.
    pub fn clear_state_cache(&self) {
        self.states.clear();
    }

    /// Sets the limits the payloads of events, commands and timers are checked against (default
    /// [`JsonLimits::default`]); limits out of bounds are refused at the first commit.
    #[must_use]
    pub fn json_limits(mut self, limits: JsonLimits) -> Self {
        self.limits = limits;
        self
    }

    /// Sets how many times a commit that lost a race is replayed, decided and tried again.
    #[must_use]
    pub fn max_conflict_retries(mut self, retries: u32) -> Self {
        self.max_conflict_retries = retries;
        self
    }

    /// The workflow.
    pub fn workflow(&self) -> &W {
        &self.workflow
    }

    /// Rebuilds the state of `workflow_id` from its events. Decides nothing and dispatches nothing.
    pub fn replay<S: EventLog + ?Sized>(
        &self,
        store: &S,
        workflow_id: &WorkflowId,
    ) -> Result<ReplayResult<W::State>, Error> {
        replay(&self.workflow, &store.load(workflow_id)?)
    }

    /// Records `event` in `workflow_id` with the commands the workflow decides for it, in one commit
    /// (DESIGN rule 3). On [`Error::Conflict`] it replays and decides again, a bounded number of times.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a malformed event or command; [`Error::Rejected`] when the workflow
    /// rejects the event; [`Error::Conflict`] when every retry lost its race; the store's errors. In
    /// every case nothing of this event was written.
    pub fn handle<S: EventLog + ?Sized>(
        &self,
        store: &mut S,
        workflow_id: &WorkflowId,
        event: Event,
        now: Timestamp,
    ) -> Result<Handled, Error> {
        let event = self.callers(event)?;
        self.commit_sync(store, workflow_id, event, now, None, None)
    }

    /// As [`Engine::handle`], storing `context` (the W3C trace context of the caller's span, e.g.
    /// from an incoming `traceparent` header) with every command decided, so that each delivery
    /// continues the trace ([`Commit::traced`]).
    ///
    /// # Errors
    ///
    /// As [`Engine::handle`].
    pub fn handle_traced<S: EventLog + ?Sized>(
        &self,
        store: &mut S,
        workflow_id: &WorkflowId,
        event: Event,
        context: &TraceContext,
        now: Timestamp,
    ) -> Result<Handled, Error> {
        let event = self.callers(event)?;
        self.commit_sync(store, workflow_id, event, now, None, Some(context))
    }

    /// Starts `workflow_id` with `event` as its first event and the commands the workflow decides for
    /// it, in one commit (DESIGN rule 3): [`Engine::handle`] on a workflow that has no events yet,
    /// without reading the store first. The workflow decides from its initial state, and the commit
    /// itself checks that the workflow is new (as it checks every commit's seq), so nothing is read
    /// before the write.
    ///
    /// For a caller that creates the workflow (an order, a trip, under an ID it has just made): it
    /// costs one read less than [`Engine::handle`], and a retried request that would start the same
    /// workflow twice is refused instead of recording a second first event.
    ///
    /// ```
    /// # use miniflow_core::prelude::*;
    /// # use miniflow_core::{json, Command, Decision, EventRecord, Workflow};
    /// # use miniflow_core::{Engine, Error, Event, MemoryStore, Timestamp, WorkflowId};
    /// # struct Orders;
    /// # impl Workflow for Orders {
    /// #     type State = ();
    /// #     fn evolve(&self, _: &mut (), _: &EventRecord) {}
    /// #     fn decide(&self, _: &(), _: &EventRecord) -> Decision {
    /// #         Decision::new().command(Command::new("reserve_stock", json!({ "sku": "A-1" })))
    /// #     }
    /// # }
    /// let engine = Engine::new(Orders);
    /// let mut store = MemoryStore::new();
    /// let order = WorkflowId::new("order-7")?;
    /// let placed = Event::new("order_placed", json!({ "sku": "A-1" }));
    /// let started = engine.start(&mut store, &order, placed.clone(), Timestamp::from_millis(0))?;
    /// assert_eq!(started.command_ids[0].to_string(), "order-7:1:0");
    ///
    /// // The same request again: the order exists, so nothing is written.
    /// let again = engine.start(&mut store, &order, placed, Timestamp::from_millis(1));
    /// assert!(matches!(again, Err(Error::Conflict { .. })));
    /// assert_eq!(store.pending(10)?.len(), 1);
    /// # Ok::<(), Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Conflict`] when the workflow already has events (its `actual` seq), not retried: an
    /// event for an existing workflow goes through [`Engine::handle`]. Otherwise as
    /// [`Engine::handle`]. In every case nothing of this event was written.
    pub fn start<S: EventLog + ?Sized>(
        &self,
        store: &mut S,
        workflow_id: &WorkflowId,
        event: Event,
        now: Timestamp,
    ) -> Result<Handled, Error> {
        let event = self.callers(event)?;
        self.start_sync(store, workflow_id, event, now, None)
    }

    /// As [`Engine::start`], storing `context` with every command decided, as
    /// [`Engine::handle_traced`] does.
    ///
    /// # Errors
    ///
    /// As [`Engine::start`].
    pub fn start_traced<S: EventLog + ?Sized>(
        &self,
        store: &mut S,
        workflow_id: &WorkflowId,
        event: Event,
        context: &TraceContext,
        now: Timestamp,
    ) -> Result<Handled, Error> {
        let event = self.callers(event)?;
        self.start_sync(store, workflow_id, event, now, Some(context))
    }

    /// Replays `events` (the workflow's whole history, in seq order), decides on `event`, and returns
    /// the commit to write, without writing it: the pure half of [`Engine::handle`], for a host that
    /// writes the commit itself (e.g. inside its caller's own transaction).
    ///
    /// # Errors
    ///
    /// As [`replay`] and [`Commit::new`] (a rejecting decision is [`Error::Rejected`]).
    pub fn plan(
        &self,
        events: &[EventRecord],
        workflow_id: &WorkflowId,
        event: Event,
        now: Timestamp,
    ) -> Result<Commit, Error> {
        let event = self.callers(event)?;
        let event = self.checked(event)?;
        let replayed = replay(&self.workflow, events)?;
        self.decide_commit(&replayed.state, replayed.last_seq, workflow_id, event, now)
    }

    /// A caller's `event`, if its kind is not one miniflow writes itself ([`BUILT_IN_KINDS`]): those
    /// come from timers and feedback, through [`Engine::fire`].
    fn callers(&self, event: Event) -> Result<Event, Error> {
        if BUILT_IN_KINDS.contains(&event.kind.as_str()) {
            let reason = "is a kind of miniflow's own events (timers, feedback)";
            return Err(Error::invalid("event.kind", &event.kind, reason));
        }
        Ok(event)
    }

    /// `event`, if its payload is within the engine's limits (themselves checked first: limits out
    /// of bounds are refused naming the limit); one past them is taken apart without recursion (it
    /// may nest deeper than a recursive copy or drop survives).
    fn checked(&self, event: Event) -> Result<Event, Error> {
        let checked = self
            .limits
            .validate()
            .and_then(|()| self.limits.check("event.payload", &event.payload));
        match checked {
            Ok(()) => Ok(event),
            Err(e) => {
                crate::limits::drop_deep(event.payload);
                Err(e)
            }
        }
    }

    /// Decides on `event` as the event after `last_seq` of `workflow_id`, whose state is `state`,
    /// and builds the commit of the decision.
    fn decide_commit(
        &self,
        state: &W::State,
        last_seq: Seq,
        workflow_id: &WorkflowId,
        event: Event,
        now: Timestamp,
    ) -> Result<Commit, Error> {
        let record = EventRecord {
            workflow_id: workflow_id.clone(),
            seq: last_seq.next()?,
            kind: event.kind.clone(),
            payload: event.payload.clone(),
            recorded_at: now,
        };
        let decision = self.workflow.decide(state, &record);
        Commit::with_limits(
            workflow_id.clone(),
            last_seq,
            event,
            decision,
            now,
            self.limits,
        )
    }

    /// Fires a due `timer` (from [`Timers::claim_timers`]): commits its event into its workflow through
    /// replay → decide → commit, marking the timer fired in the same transaction (DESIGN rule 11).
    /// Returns `None` when it is no longer scheduled: another firer won, or a decision cancelled it.
    ///
    /// An occurrence of a recurring schedule ([`crate::Schedule`]) commits a `schedule_fired` event
    /// for the occurrence its missed-occurrence policy picks, and arms the schedule's next occurrence
    /// in the same transaction.
    ///
    /// When the workflow rejects the timer's event ([`crate::Decision::reject`]), the timer ends
    /// `rejected` with the reason ([`Timers::reject_timer`]) and the [`Error::Rejected`] is returned:
    /// a refused timer is not taken again and again.
    ///
    /// # Errors
    ///
    /// As [`Engine::handle`]; [`Error::InvalidInput`] for a timer that is not due at `now`.
    pub fn fire<S: EventLog + Timers + ?Sized>(
        &self,
        store: &mut S,
        timer: &TimerRow,
        now: Timestamp,
    ) -> Result<Option<Handled>, Error> {
        self.fire_sync(store, timer, now)
    }

    /// [`Engine::handle`] on an async store's log: the same loop (its reads, its decision, its
    /// retries after a lost race, the state cache), awaited. For async hosts; a synchronous caller
    /// uses [`Engine::handle`].
    ///
    /// # Errors
    ///
    /// As [`Engine::handle`].
    pub async fn handle_on<L: AsyncEventLog + ?Sized>(
        &self,
        log: &mut L,
        workflow_id: &WorkflowId,
        event: Event,
        context: Option<&TraceContext>,
        now: Timestamp,
    ) -> Result<Handled, Error> {
        let event = self.callers(event)?;
        self.commit_async(log, workflow_id, event, now, None, context)
            .await
    }

    /// [`Engine::start`] on an async store's log, awaited.
    ///
    /// # Errors
    ///
    /// As [`Engine::start`].
    pub async fn start_on<L: AsyncEventLog + ?Sized>(
        &self,
        log: &mut L,
        workflow_id: &WorkflowId,
        event: Event,
        context: Option<&TraceContext>,
        now: Timestamp,
    ) -> Result<Handled, Error> {
        let event = self.callers(event)?;
        self.start_async(log, workflow_id, event, now, context)
            .await
    }

    /// [`Engine::fire`] on an async store's log, awaited.
    ///
    /// # Errors
    ///
    /// As [`Engine::fire`].
    pub async fn fire_on<L: AsyncEventLog + ?Sized>(
        &self,
        log: &mut L,
        timer: &TimerRow,
        now: Timestamp,
    ) -> Result<Option<Handled>, Error> {
        self.fire_async(log, timer, now).await
    }

    /// The commit of `event` decided on `entry`'s state, as the next event after its last one.
    fn plan_on(
        &self,
        entry: &Entry<W::State>,
        workflow_id: &WorkflowId,
        event: &Event,
        now: Timestamp,
        fires: Option<&Firing>,
        context: Option<&TraceContext>,
    ) -> Result<Commit, Error> {
        let commit = self.decide_commit(
            &entry.state,
            entry.last.seq,
            workflow_id,
            event.clone(),
            now,
        )?;
        finish(commit, fires, context)
    }
}

mod cached;
mod log;
mod looped;

pub use log::AsyncEventLog;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryStore;

    /// A store whose every commit loses its race, counting the attempts and the waits before retries.
    struct AlwaysBehind {
        inner: MemoryStore,
        commits: u32,
        waits: Vec<u32>,
    }

    impl EventLog for AlwaysBehind {
        fn load(&self, id: &WorkflowId) -> Result<Vec<EventRecord>, Error> {
            self.inner.load(id)
        }
        fn append_with_commands(&mut self, commit: &Commit) -> Result<(), Error> {
            self.commits += 1;
            Err(commit.conflict(Seq::new(commit.expected_seq().get() + 1)?))
        }
        fn before_retry(&mut self, conflicts: u32) {
            self.waits.push(conflicts);
        }
    }

    struct Nothing;

    impl Workflow for Nothing {
        type State = ();
        fn evolve(&self, _: &mut (), _: &EventRecord) {}
        fn decide(&self, _: &(), _: &EventRecord) -> Decision {
            Decision::none()
        }
    }

    #[test]
    fn conflict_retries_are_bounded() {
        let mut store = AlwaysBehind {
            inner: MemoryStore::new(),
            commits: 0,
            waits: Vec::new(),
        };
        let engine = Engine::new(Nothing).max_conflict_retries(3);
        let w = WorkflowId::new("w").unwrap();
        let result = engine.handle(
            &mut store,
            &w,
            Event::new("e", serde_json::json!({})),
            Timestamp::EPOCH,
        );
        assert!(matches!(result, Err(Error::Conflict { .. })), "{result:?}");
        assert_eq!(
            store.commits, 4,
            "one try and three retries, then the conflict is returned"
        );
        assert_eq!(
            store.waits,
            [1, 2, 3],
            "the store may wait before each retry, told how many races were lost"
        );
    }

    /// A store that counts its reads and commits, passing both to a memory store; it checks a
    /// commit's last event itself (`append_after`) when `checks_last`.
    #[derive(Default)]
    struct Counting {
        inner: MemoryStore,
        reads: std::cell::Cell<u32>,
        commits: u32,
        checks_last: bool,
        asked_after: u32,
        waits: u32,
    }

    impl EventLog for Counting {
        fn load(&self, id: &WorkflowId) -> Result<Vec<EventRecord>, Error> {
            self.reads.set(self.reads.get() + 1);
            self.inner.load(id)
        }
        fn load_after(&self, id: &WorkflowId, after: Seq) -> Result<Vec<EventRecord>, Error> {
            self.reads.set(self.reads.get() + 1);
            self.inner.load_after(id, after)
        }
        fn append_with_commands(&mut self, commit: &Commit) -> Result<(), Error> {
            self.commits += 1;
            self.inner.append_with_commands(commit)
        }
        fn history_id(&self) -> Option<HistoryId> {
            self.inner.history_id()
        }
        fn append_after(
            &mut self,
            last: &EventRecord,
            commit: &Commit,
        ) -> Result<AppendedAfter, Error> {
            self.asked_after += 1;
            if !self.checks_last {
                return Ok(AppendedAfter::Unchecked);
            }
            self.commits += 1;
            self.inner.append_after(last, commit)
        }
        fn before_retry(&mut self, _: u32) {
            self.waits += 1;
        }
    }

    /// Decides one command naming the state it decided from: how many events it had folded. It
    /// cannot fold a `poison` event.
    struct Counter;

    impl Workflow for Counter {
        type State = u64;
        fn evolve(&self, state: &mut u64, event: &EventRecord) {
            assert!(event.kind != "poison", "cannot fold poison");
            *state += 1;
        }
        fn decide(&self, state: &u64, _: &EventRecord) -> Decision {
            Decision::new().command(crate::Command::new(
                "count",
                serde_json::json!({ "folded": state }),
            ))
        }
    }

    #[test]
    fn a_callers_event_of_a_kind_miniflow_writes_itself_is_refused_naming_it() {
        let engine = Engine::new(Counter);
        let mut store = MemoryStore::new();
        let w = WorkflowId::new("w").unwrap();
        for kind in crate::BUILT_IN_KINDS {
            let event = || Event::new(kind, serde_json::json!({ "spoof": true }));
            let refused = [
                engine.handle(&mut store, &w, event(), Timestamp::EPOCH),
                engine.start(&mut store, &w, event(), Timestamp::EPOCH),
            ];
            for err in refused.into_iter().map(Result::unwrap_err) {
                assert_eq!(err.code(), "INVALID_INPUT", "{err}");
                assert!(err.to_string().contains("event.kind"), "{err}");
                assert!(err.to_string().contains(kind), "{err}");
            }
            assert!(engine.plan(&[], &w, event(), Timestamp::EPOCH).is_err());
        }
        assert!(store.load(&w).unwrap().is_empty(), "nothing written");
    }

    #[test]
    fn limits_out_of_bounds_are_refused_naming_the_limit_before_any_payload() {
        let mut store = MemoryStore::new();
        let w = WorkflowId::new("w").unwrap();
        for (limits, named) in [
            (
                JsonLimits {
                    max_depth: 0,
                    max_bytes: 0,
                },
                "max_depth",
            ),
            (
                JsonLimits {
                    max_depth: 8,
                    max_bytes: 0,
                },
                "max_bytes",
            ),
        ] {
            let engine = Engine::new(Counter).json_limits(limits);
            let err = engine
                .handle(
                    &mut store,
                    &w,
                    Event::new("a", serde_json::json!({})),
                    Timestamp::EPOCH,
                )
                .unwrap_err();
            assert!(err.to_string().contains(named), "{err}");
        }
    }

    #[test]
    fn start_commits_a_first_event_and_refuses_a_second_start() {
        let engine = Engine::new(Counter);
        let mut store = Counting::default();
        let w = WorkflowId::new("w").unwrap();
        let started = engine
            .start(
                &mut store,
                &w,
                Event::new("a", serde_json::json!({})),
                Timestamp::EPOCH,
            )
            .unwrap();
        assert_eq!(started.seq, Seq::new(1).unwrap());
        assert_eq!(started.command_ids[0].to_string(), "w:1:0");
        assert_eq!(store.reads.get(), 0, "a start reads nothing");
        engine
            .handle(
                &mut store,
                &w,
                Event::new("b", serde_json::json!({})),
                Timestamp::EPOCH,
            )
            .unwrap();

        let again = engine.start(
            &mut store,
            &w,
            Event::new("a", serde_json::json!({})),
            Timestamp::EPOCH,
        );
        match again {
            Err(Error::Conflict {
                expected, actual, ..
            }) => {
                assert_eq!((expected, actual), (Seq::ZERO, Seq::new(2).unwrap()));
            }
            other => panic!("a second start must be refused: {other:?}"),
        }
        assert_eq!(
            store.commits, 3,
            "the refused start was tried once, not retried"
        );
        assert_eq!(store.reads.get(), 1, "only the handle read");
        let events = store.inner.load(&w).unwrap();
        assert_eq!(events.len(), 2, "nothing of the refused start was written");
        let pending = crate::store::Outbox::pending(&store.inner, 10).unwrap();
        let folded: Vec<_> = pending
            .iter()
            .map(|row| row.payload["folded"].clone())
            .collect();
        assert_eq!(folded, [serde_json::json!(0), serde_json::json!(1)]);
    }

    /// Handles `n` events on `w`, checking each command was decided on the events before it, and
    /// returns how many reads each call made.
    fn handle_counting(
        engine: &Engine<Counter>,
        store: &mut Counting,
        w: &str,
        n: u64,
    ) -> Vec<u32> {
        let w = WorkflowId::new(w).unwrap();
        (0..n)
            .map(|_| {
                let before = store.reads.get();
                let handled = engine
                    .handle(
                        store,
                        &w,
                        Event::new("tick", serde_json::json!({})),
                        Timestamp::EPOCH,
                    )
                    .unwrap();
                let row = crate::store::Outbox::command(&store.inner, &handled.command_ids[0])
                    .unwrap()
                    .unwrap();
                assert_eq!(
                    row.payload["folded"],
                    serde_json::json!(handled.seq.get() - 1)
                );
                store.reads.get() - before
            })
            .collect()
    }

    #[test]
    fn a_cached_workflow_is_committed_on_without_a_read_when_the_store_checks_its_last_event() {
        let engine = Engine::new(Counter);
        let mut store = Counting {
            checks_last: true,
            ..Counting::default()
        };
        let reads = handle_counting(&engine, &mut store, "w", 8);
        // The first calls read (nothing cached yet; then the store is found to check), the rest not.
        assert_eq!(reads[3..], [0; 5], "{reads:?}");
        // A rival's commit: the cached state's last event is no longer the last, so the next call
        // conflicts once, reads, and decides on the rival's event too.
        let w = WorkflowId::new("w").unwrap();
        let rival = Commit::new(
            w.clone(),
            Seq::new(8).unwrap(),
            Event::new("rival", serde_json::json!({})),
            Decision::none(),
            Timestamp::EPOCH,
        )
        .unwrap();
        store.inner.append_with_commands(&rival).unwrap();
        let handled = engine
            .handle(
                &mut store,
                &w,
                Event::new("tick", serde_json::json!({})),
                Timestamp::EPOCH,
            )
            .unwrap();
        assert_eq!((handled.seq.get(), handled.conflicts), (10, 1));
        assert_eq!(
            store.waits, 0,
            "an out-of-date cached state is no race to wait out"
        );
        let row = crate::store::Outbox::command(&store.inner, &handled.command_ids[0])
            .unwrap()
            .unwrap();
        assert_eq!(row.payload["folded"], serde_json::json!(9));
        assert_eq!(handle_counting(&engine, &mut store, "w", 3), [0, 0, 0]);

        // Without retries, a commit on a cached state that finds a rival's event is the conflict.
        let strict = Engine::new(Counter).max_conflict_retries(0);
        handle_counting(&strict, &mut store, "w", 3);
        let last = store.inner.load(&w).unwrap().len() as u64;
        let rival = Commit::new(
            w.clone(),
            Seq::new(last).unwrap(),
            Event::new("rival", serde_json::json!({})),
            Decision::none(),
            Timestamp::EPOCH,
        )
        .unwrap();
        store.inner.append_with_commands(&rival).unwrap();
        let refused = strict.handle(
            &mut store,
            &w,
            Event::new("tick", serde_json::json!({})),
            Timestamp::EPOCH,
        );
        assert!(
            matches!(refused, Err(Error::Conflict { .. })),
            "{refused:?}"
        );
        assert_eq!(store.inner.load(&w).unwrap().len() as u64, last + 1);
    }

    #[test]
    fn a_store_that_cannot_check_its_last_event_is_read_first_and_asked_once() {
        let engine = Engine::new(Counter);
        let mut store = Counting::default();
        let reads = handle_counting(&engine, &mut store, "w", 6);
        assert!(reads.iter().all(|r| *r == 1), "{reads:?}");
        assert_eq!(store.asked_after, 1, "asked once, then read first");
    }

    /// A store that keeps its own time for each event (as a store on a database's clock does) and
    /// cannot check a commit's last event itself.
    #[derive(Default)]
    struct OwnClock {
        inner: MemoryStore,
    }

    impl EventLog for OwnClock {
        fn load(&self, id: &WorkflowId) -> Result<Vec<EventRecord>, Error> {
            self.inner.load(id)
        }
        fn history_id(&self) -> Option<HistoryId> {
            self.inner.history_id()
        }
        fn append_with_commands(&mut self, commit: &Commit) -> Result<(), Error> {
            let event = &commit.events()[0];
            let stored = Commit::new(
                commit.workflow_id().clone(),
                commit.expected_seq(),
                Event::new(event.kind.clone(), event.payload.clone()),
                Decision::none(),
                Timestamp::from_millis(event.recorded_at.as_millis() + 1_000),
            )?;
            self.inner.append_with_commands(&stored)
        }
    }

    #[test]
    fn a_state_is_kept_as_the_store_holds_its_events_when_the_store_may_rewrite_them() {
        let engine = Engine::new(Counter);
        let mut store = OwnClock::default();
        let w = WorkflowId::new("w").unwrap();
        for _ in 0..6 {
            engine
                .handle(
                    &mut store,
                    &w,
                    Event::new("tick", serde_json::json!({})),
                    Timestamp::EPOCH,
                )
                .unwrap();
        }
        let stats = engine.state_cache_stats();
        assert_eq!((stats.stale, stats.hits), (0, 4), "{stats:?}");
    }

    #[test]
    fn the_workflows_code_runs_before_a_commit_never_after_it() {
        let engine = Engine::new(Counter);
        let mut store = Counting {
            checks_last: true,
            ..Counting::default()
        };
        let w = WorkflowId::new("w").unwrap();
        let handle = |store: &mut Counting, kind: &str| {
            engine.handle(
                store,
                &w,
                Event::new(kind, serde_json::json!({})),
                Timestamp::EPOCH,
            )
        };
        for _ in 0..4 {
            handle(&mut store, "tick").unwrap();
        }
        // Deciding on a poison event needs no fold of it: the call commits and returns.
        assert_eq!(handle(&mut store, "poison").unwrap().seq.get(), 5);
        // The next call folds it first, and fails before writing anything.
        let next =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| handle(&mut store, "tick")));
        assert!(next.is_err(), "folding the poison event panics");
        assert_eq!(
            store.inner.load(&w).unwrap().len(),
            5,
            "nothing written after it"
        );
    }
}
