//! [`Commit`]: everything one commit writes — the event(s) and one outbox row per decided command,
//! their timers, schedules and cancellations — built only by the core, written by a store in one
//! transaction.

use crate::error::Error;
use crate::id::{CommandId, Seq, WorkflowId};
use crate::limits::JsonLimits;
use crate::model::{check_kind, CancelCommand, Decision, Event, EventRecord};
use crate::occurrence::Firing;
use crate::outbox::OutboxRow;
use crate::time::Timestamp;
use crate::timer::{TimerId, TimerRow};
use crate::trace::TraceContext;

/// Everything one commit writes: the event(s) at `expected_seq + 1…` and one outbox row per decided
/// command, with its deterministic ID (DESIGN rules 2–4).
///
/// Only the core builds a `Commit`, so a store cannot be handed an event without its commands or a
/// command whose ID does not match its event. A store writes all of it in one transaction, or nothing.
///
/// ```
/// use miniflow_core::{Command, Commit, Decision, Event, Seq, Timestamp, WorkflowId};
/// use serde_json::json;
///
/// let trip = WorkflowId::new("trip-001")?;
/// let decision = Decision::new().command(Command::new("lock_budget", json!({ "trip_id": "trip-001" })));
/// let commit = Commit::new(
///     trip,
///     Seq::ZERO,
///     Event::new("trip_requested", json!({ "city": "成都" })),
///     decision,
///     Timestamp::from_millis(1_000),
/// )?;
/// assert_eq!(commit.events()[0].seq, Seq::new(1)?);
/// assert_eq!(commit.commands()[0].command_id.to_string(), "trip-001:1:0");
/// # Ok::<(), miniflow_core::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Commit {
    workflow_id: WorkflowId,
    expected_seq: Seq,
    now: Timestamp,
    events: Vec<EventRecord>,
    commands: Vec<OutboxRow>,
    timers: Vec<TimerRow>,
    cancel_timers: Vec<String>,
    cancel_commands: Vec<CancelCommand>,
    fires: Option<TimerId>,
    limits: JsonLimits,
    trace_context: Option<TraceContext>,
}

impl Commit {
    /// A commit of `event` and the commands of its `decision`, on top of `expected_seq`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for an empty or malformed event or command kind, a payload over the
    /// default [`JsonLimits`] (naming its path, e.g. `commands[1].payload`), more than `u32::MAX`
    /// commands, or a seq past [`Seq::MAX`]; [`Error::Rejected`] for a rejecting decision.
    pub fn new(
        workflow_id: WorkflowId,
        expected_seq: Seq,
        event: Event,
        decision: Decision,
        now: Timestamp,
    ) -> Result<Self, Error> {
        Self::with_limits(
            workflow_id,
            expected_seq,
            event,
            decision,
            now,
            JsonLimits::default(),
        )
    }

    /// As [`Commit::new`], checking payloads against `limits`.
    ///
    /// # Errors
    ///
    /// As [`Commit::new`], and [`Error::InvalidInput`] for limits out of bounds.
    pub fn with_limits(
        workflow_id: WorkflowId,
        expected_seq: Seq,
        event: Event,
        decision: Decision,
        now: Timestamp,
        limits: JsonLimits,
    ) -> Result<Self, Error> {
        limits.validate()?;
        let mut commit = Self {
            workflow_id,
            expected_seq,
            now,
            events: Vec::new(),
            commands: Vec::new(),
            timers: Vec::new(),
            cancel_timers: Vec::new(),
            cancel_commands: Vec::new(),
            fires: None,
            limits,
            trace_context: None,
        };
        commit.push(event, decision)?;
        Ok(commit)
    }

    /// Adds one more event, at the next seq, with the commands of its decision.
    ///
    /// # Errors
    ///
    /// As [`Commit::new`].
    pub fn push(&mut self, event: Event, decision: Decision) -> Result<Seq, Error> {
        if let Err(e) = self.validate(&event, &decision) {
            // A refused payload may nest deeper than a recursive drop survives: take it apart.
            discard(event, decision);
            return Err(e);
        }
        let seq = self.last_seq().next()?;
        let mut commands = Vec::with_capacity(decision.commands.len());
        for (index, command) in decision.commands.into_iter().enumerate() {
            let index = u32::try_from(index).map_err(|_| {
                Error::invalid("decision.commands", index, "more than u32::MAX commands")
            })?;
            let id = CommandId::new(self.workflow_id.clone(), seq, index)?;
            let mut row = OutboxRow::pending(id, command, self.now);
            row.trace_context.clone_from(&self.trace_context);
            commands.push(row);
        }
        let mut timers = Vec::with_capacity(decision.timers.len());
        for (index, timer) in decision.timers.into_iter().enumerate() {
            let path = format!("timers[{index}].payload");
            let index = u32::try_from(index).map_err(|_| {
                Error::invalid("decision.timers", index, "more than u32::MAX timers")
            })?;
            let id = TimerId::scheduled(self.workflow_id.clone(), seq, index)?;
            let row = TimerRow::scheduled(id, timer, self.now);
            // What is stored, and fired, is the `timer_fired` payload around the timer's own.
            self.limits.check(&path, &row.event_payload)?;
            timers.push(row);
        }
        let mut started = Vec::with_capacity(decision.schedules.len());
        for (index, schedule) in decision.schedules.into_iter().enumerate() {
            let path = format!("schedules[{index}].payload");
            let index = u32::try_from(index).map_err(|_| {
                Error::invalid("decision.schedules", index, "more than u32::MAX schedules")
            })?;
            started.push(schedule.name.clone());
            let row = schedule.start(self.workflow_id.clone(), seq, index, self.now)?;
            // What is stored, and fired, is the `schedule_fired` payload around the schedule's own.
            self.limits.check(&path, &row.event_payload)?;
            timers.push(row);
        }
        self.events.push(EventRecord {
            workflow_id: self.workflow_id.clone(),
            seq,
            kind: event.kind,
            payload: event.payload,
            recorded_at: self.now,
        });
        self.commands.extend(commands);
        self.timers.extend(timers);
        self.cancel_timers.extend(decision.cancel_timers);
        // Starting a schedule replaces one running under its name.
        self.cancel_timers.extend(started);
        self.cancel_commands.extend(decision.cancel_commands);
        Ok(seq)
    }

    /// Every check of [`Commit::push`] that needs nothing moved: the rejection, kinds, payload limits
    /// (a timer's payload one level less deep, as its `timer_fired` event wraps it) and cancellations.
    fn validate(&self, event: &Event, decision: &Decision) -> Result<(), Error> {
        if let Some(reason) = &decision.rejection {
            return Err(Error::Rejected {
                workflow_id: self.workflow_id.clone(),
                reason: reason.clone(),
            });
        }
        check_kind("event.kind", &event.kind)?;
        self.limits.check("event.payload", &event.payload)?;
        for (i, command) in decision.commands.iter().enumerate() {
            check_kind("command.kind", &command.kind)?;
            self.limits
                .check(&format!("commands[{i}].payload"), &command.payload)?;
        }
        let inside_its_event = JsonLimits {
            max_depth: self.limits.max_depth.saturating_sub(1).max(1),
            ..self.limits
        };
        for (i, timer) in decision.timers.iter().enumerate() {
            inside_its_event.check(&format!("timers[{i}].payload"), &timer.payload)?;
        }
        for (i, schedule) in decision.schedules.iter().enumerate() {
            inside_its_event.check(&format!("schedules[{i}].payload"), &schedule.payload)?;
            check_kind("schedule.name", &schedule.name)?;
            schedule.check(self.now)?;
            // A name is one schedule: two of one name in a decision would both run.
            if decision.schedules[..i]
                .iter()
                .any(|s| s.name == schedule.name)
            {
                return Err(Error::invalid(
                    "schedule.name",
                    &schedule.name,
                    "is started twice by one decision",
                ));
            }
        }
        for name in decision
            .timers
            .iter()
            .map(|t| &t.name)
            .chain(&decision.cancel_timers)
        {
            check_kind("timer.name", name)?;
        }
        for cancel in &decision.cancel_commands {
            match cancel {
                CancelCommand::Id(id) if id.workflow_id() != &self.workflow_id => {
                    return Err(Error::invalid(
                        "cancel_command",
                        id,
                        format!(
                            "belongs to workflow {}: a decision of {} cancels only its own commands",
                            id.workflow_id(),
                            self.workflow_id
                        ),
                    ))
                }
                CancelCommand::Id(_) => {}
                CancelCommand::Kind(kind) => check_kind("cancel_commands_of_kind", kind)?,
            }
        }
        Ok(())
    }

    /// Makes this the commit that fires `timer_id`: it applies only if the timer is still scheduled,
    /// and marks it fired in the same transaction, so a timer fires once.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] when the timer belongs to another workflow.
    pub fn firing(mut self, timer_id: TimerId) -> Result<Self, Error> {
        if timer_id.workflow_id() != &self.workflow_id {
            return Err(Error::invalid(
                "timer_id",
                &timer_id,
                format!(
                    "fires into workflow {}, not {}",
                    timer_id.workflow_id(),
                    self.workflow_id
                ),
            ));
        }
        self.fires = Some(timer_id);
        Ok(self)
    }

    /// Makes this the commit of `firing`: it fires the timer ([`Commit::firing`]), and arms the next
    /// occurrence in it unless its decision cancels (stops or restarts) the schedule's name.
    pub(crate) fn fired_by(self, firing: &Firing) -> Result<Self, Error> {
        let mut commit = self.firing(firing.timer_id().clone())?;
        if let Some(next) = firing.next() {
            commit.arm(next.clone());
        }
        Ok(commit)
    }

    /// Arms the next occurrence of the schedule whose occurrence this commit fires, unless its
    /// decision cancels the schedule's name (stops or restarts it).
    fn arm(&mut self, next: TimerRow) {
        if !self.cancel_timers.contains(&next.name) {
            self.timers.push(next);
        }
    }

    /// Stores `context` (the W3C trace context of the span that commits) with every command of this
    /// commit, the ones pushed later included, so that each delivery continues the producer's trace
    /// ([`crate::Delivery::trace_context`]).
    ///
    /// ```
    /// use miniflow_core::{json, Command, Commit, Decision, Event, Seq, Timestamp, TraceContext, WorkflowId};
    ///
    /// let context: TraceContext = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".parse()?;
    /// let decision = Decision::new().command(Command::new("lock_budget", json!({})));
    /// let event = Event::new("trip_requested", json!({}));
    /// let commit = Commit::new(WorkflowId::new("trip-001")?, Seq::ZERO, event, decision, Timestamp::EPOCH)?
    ///     .traced(context.clone());
    /// assert_eq!(commit.commands()[0].trace_context, Some(context));
    /// # Ok::<(), miniflow_core::Error>(())
    /// ```
    #[must_use]
    pub fn traced(mut self, context: TraceContext) -> Self {
        for row in &mut self.commands {
            row.trace_context = Some(context.clone());
        }
        self.trace_context = Some(context);
        self
    }

    /// The trace context stored with this commit's commands, if any ([`Commit::traced`]).
    pub fn trace_context(&self) -> Option<&TraceContext> {
        self.trace_context.as_ref()
    }

    /// The workflow, events and commands, for a store that moves them instead of copying them.
    pub(crate) fn into_rows(self) -> (WorkflowId, Vec<EventRecord>, Vec<OutboxRow>) {
        (self.workflow_id, self.events, self.commands)
    }

    /// The workflow written to.
    pub fn workflow_id(&self) -> &WorkflowId {
        &self.workflow_id
    }

    /// The last seq the commit is based on: it applies only if the workflow is still there.
    pub fn expected_seq(&self) -> Seq {
        self.expected_seq
    }

    /// The workflow's last seq once the commit is applied.
    pub fn last_seq(&self) -> Seq {
        self.events.last().map_or(self.expected_seq, |e| e.seq)
    }

    /// Checks that `last` is an event this commit can follow (see [`crate::EventLog::append_after`]): of
    /// its workflow, at its expected seq.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] naming what differs.
    pub fn check_follows(&self, last: &EventRecord) -> Result<(), Error> {
        if last.workflow_id != self.workflow_id || last.seq != self.expected_seq {
            return Err(Error::invalid(
                "last",
                format!("{}:{}", last.workflow_id, last.seq),
                format!(
                    "is not the event a commit on {} at seq {} follows",
                    self.workflow_id, self.expected_seq
                ),
            ));
        }
        Ok(())
    }

    /// When the commit was made.
    pub fn now(&self) -> Timestamp {
        self.now
    }

    /// The events to write, in seq order (never empty).
    pub fn events(&self) -> &[EventRecord] {
        &self.events
    }

    /// The outbox rows to write, all pending and due at [`Commit::now`].
    pub fn commands(&self) -> &[OutboxRow] {
        &self.commands
    }

    /// The timers to schedule: the decision's timers, the first occurrences of the schedules it
    /// starts, and the next occurrence of the schedule whose occurrence this commit fires.
    pub fn timers(&self) -> &[TimerRow] {
        &self.timers
    }

    /// Names of the workflow's scheduled timers to cancel, before the new ones are scheduled.
    pub fn cancel_timers(&self) -> &[String] {
        &self.cancel_timers
    }

    /// Earlier commands of the workflow this commit withdraws (see [`OutboxRow::cancel`]), applied
    /// before its own commands are written.
    pub fn cancel_commands(&self) -> &[CancelCommand] {
        &self.cancel_commands
    }

    /// Whether `row` (an unfinished command of this workflow) is one this commit cancels.
    pub fn cancels(&self, row: &OutboxRow) -> bool {
        row.command_id.workflow_id() == &self.workflow_id
            && self.cancel_commands.iter().any(|cancel| match cancel {
                CancelCommand::Id(id) => id == &row.command_id,
                CancelCommand::Kind(kind) => kind == &row.kind,
            })
    }

    /// The timer this commit fires, if any.
    pub fn fires(&self) -> Option<&TimerId> {
        self.fires.as_ref()
    }

    /// The [`Error::Conflict`] for a workflow whose last seq is `actual`.
    pub fn conflict(&self, actual: Seq) -> Error {
        Error::Conflict {
            workflow_id: self.workflow_id.clone(),
            expected: self.expected_seq,
            actual,
        }
    }
}

/// Drops a refused event and decision without recursing through their payloads.
fn discard(event: Event, decision: Decision) {
    crate::limits::drop_deep(event.payload);
    for command in decision.commands {
        crate::limits::drop_deep(command.payload);
    }
    for timer in decision.timers {
        crate::limits::drop_deep(timer.payload);
    }
    for schedule in decision.schedules {
        crate::limits::drop_deep(schedule.payload);
    }
}
