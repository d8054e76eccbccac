//! Workflows and the engine that runs them: replay → decide → commit.

use crate::error::Error;
use crate::id::{CommandId, Seq, WorkflowId};
use crate::limits::JsonLimits;
use crate::model::{Decision, Event, EventRecord};
use crate::schedule::Firing;
use crate::store::{Commit, EventLog, Timers};
use crate::time::Timestamp;
use crate::timer::{TimerId, TimerRow};
use crate::trace::TraceContext;

/// A workflow: how its events fold into state, and what it decides when a new event arrives.
///
/// Both functions must be deterministic (no clock, no randomness, no I/O): replay runs `evolve` over the
/// recorded events again and again and must reach the same state each time. Time is in the event
/// record (`recorded_at`).
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
    let mut last_seq = Seq::ZERO;
    for event in events {
        if event.seq.get() != last_seq.get() + 1 {
            return Err(Error::Corrupt(format!(
                "workflow {} has event seq {} after {}",
                event.workflow_id, event.seq, last_seq
            )));
        }
        workflow.evolve(&mut state, event);
        last_seq = event.seq;
    }
    Ok(ReplayResult { state, last_seq })
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
#[derive(Debug, Clone)]
pub struct Engine<W> {
    workflow: W,
    max_conflict_retries: u32,
    limits: JsonLimits,
}

impl<W: Workflow> Engine<W> {
    /// An engine for `workflow` that retries a conflicting commit up to 8 times.
    pub fn new(workflow: W) -> Self {
        Self {
            workflow,
            max_conflict_retries: 8,
            limits: JsonLimits::default(),
        }
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
        self.commit_event(store, workflow_id, event, now, None, None)
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
        self.commit_event(store, workflow_id, event, now, None, Some(context))
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
        if let Err(e) = self.limits.check("event.payload", &event.payload) {
            crate::limits::drop_deep(event.payload);
            return Err(e);
        }
        let replayed = replay(&self.workflow, events)?;
        let record = EventRecord {
            workflow_id: workflow_id.clone(),
            seq: replayed.last_seq.next()?,
            kind: event.kind.clone(),
            payload: event.payload.clone(),
            recorded_at: now,
        };
        let decision = self.workflow.decide(&replayed.state, &record);
        Commit::with_limits(
            workflow_id.clone(),
            replayed.last_seq,
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
        if timer.fire_at > now {
            return Err(Error::invalid(
                "timer",
                &timer.timer_id,
                format!("is due at {}, not yet at {now}", timer.fire_at),
            ));
        }
        let (event, firing) = Firing::of(timer, now)?;
        let workflow_id = timer.timer_id.workflow_id();
        match self.commit_event(store, workflow_id, event, now, Some(&firing), None) {
            Ok(handled) => Ok(Some(handled)),
            Err(Error::TimerNotScheduled { .. }) => Ok(None),
            Err(Error::Rejected {
                workflow_id,
                reason,
            }) => match store.reject_timer(&timer.timer_id, &reason, now) {
                Ok(()) | Err(Error::TimerNotScheduled { .. }) => Err(Error::Rejected {
                    workflow_id,
                    reason,
                }),
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        }
    }

    fn commit_event<S: EventLog + ?Sized>(
        &self,
        store: &mut S,
        workflow_id: &WorkflowId,
        event: Event,
        now: Timestamp,
        fires: Option<&Firing>,
        context: Option<&TraceContext>,
    ) -> Result<Handled, Error> {
        // Checked before the event is copied for each try: a payload past the limits may nest deeper
        // than a recursive copy survives.
        if let Err(e) = self.limits.check("event.payload", &event.payload) {
            crate::limits::drop_deep(event.payload);
            return Err(e);
        }
        let mut conflicts = 0;
        loop {
            let events = store.load(workflow_id)?;
            let mut commit = self.plan(&events, workflow_id, event.clone(), now)?;
            if let Some(firing) = fires {
                commit = firing.apply(commit)?;
            }
            if let Some(context) = context {
                commit = commit.traced(context.clone());
            }
            match store.append_with_commands(&commit) {
                Ok(()) => return Ok(Handled::of(&commit, conflicts)),
                Err(Error::Conflict { .. }) if conflicts < self.max_conflict_retries => {
                    conflicts += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryStore;

    /// A store whose every commit loses its race, counting the attempts.
    struct AlwaysBehind {
        inner: MemoryStore,
        commits: u32,
    }

    impl EventLog for AlwaysBehind {
        fn load(&self, id: &WorkflowId) -> Result<Vec<EventRecord>, Error> {
            self.inner.load(id)
        }
        fn append_with_commands(&mut self, commit: &Commit) -> Result<(), Error> {
            self.commits += 1;
            Err(commit.conflict(Seq::new(commit.expected_seq().get() + 1)?))
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
    }
}
