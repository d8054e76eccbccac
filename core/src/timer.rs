//! Durable timers and failure feedback (DESIGN rules 11–12).
//!
//! A timer is an event scheduled for a workflow: a decision schedules it in the same commit as its
//! event, and when it is due a firer commits its event through the normal replay → decide → commit,
//! marking the timer fired in that same transaction — so it fires exactly once per timer ID, also when
//! two firers race or a firer dies half-way.
//!
//! Failure feedback uses the same machinery: when a command becomes dead, the store schedules a
//! `command_failed` event for its workflow, due at once, in the transaction that buried the command;
//! resolving it by hand schedules `command_resolved`. The workflow's `decide` sees them like any event
//! and may answer with compensating commands. Which row change schedules which feedback timer is an
//! outbox rule, beside the changes themselves ([`crate::backend::feedback`]).
//!
//! # Timer IDs
//!
//! Deterministic, like command IDs, and parsed from the right:
//!
//! | timer | ID |
//! |---|---|
//! | the `index`-th timer scheduled by event `event_seq` | `{workflow_id}:{event_seq}:t{index}` |
//! | the occurrence at `at` (ms since the epoch) of the `index`-th schedule started by event `event_seq` ([`crate::Schedule`]) | `{workflow_id}:{event_seq}:s{index}@{at}` |
//! | the `n`-th failure of a command | `{command_id}:failed{n}` |
//! | the resolution of a dead command | `{command_id}:resolved` |
//! | the completion of a command whose result goes back to its workflow | `{command_id}:completed` |

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

use crate::builtin::{to_payload, TimerFired, TIMER_FIRED};
use crate::error::Error;
use crate::id::{CommandId, Seq, WorkflowId};
use crate::limits::bounded_error;
use crate::time::Timestamp;

/// When a timer fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FireAt {
    /// This long after the commit that schedules it.
    After(#[serde(with = "crate::time::duration_millis")] Duration),
    /// At this time (at once if it is past).
    At(Timestamp),
}

/// A timer a decision schedules: when it is due, its workflow receives a `timer_fired` event with
/// `{ "timer_id", "name", "payload" }`.
///
/// ```
/// use std::time::Duration;
/// use miniflow_core::{json, Decision, Timer};
///
/// let decision = Decision::new()
///     .timer(Timer::after("hotel_deadline", Duration::from_secs(30 * 60), json!({ "hotel": "Atlantis" })));
/// assert_eq!(decision.timers.len(), 1);
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Timer {
    /// A name the workflow recognises it by, and cancels it by.
    pub name: String,
    /// When it fires.
    pub fire_at: FireAt,
    /// Handed back in the `timer_fired` event, one level inside its payload (so it may nest one level
    /// less than the [`crate::JsonLimits`] allow).
    pub payload: Value,
}

impl Timer {
    /// A timer firing `delay` after its commit.
    pub fn after(name: impl Into<String>, delay: Duration, payload: Value) -> Self {
        Self {
            name: name.into(),
            fire_at: FireAt::After(delay),
            payload,
        }
    }

    /// A timer firing at `at`.
    pub fn at(name: impl Into<String>, at: Timestamp, payload: Value) -> Self {
        Self {
            name: name.into(),
            fire_at: FireAt::At(at),
            payload,
        }
    }
}

/// What a [`TimerId`] names.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum TimerSource {
    /// Scheduled by event `event_seq` of the workflow, `index`-th in its decision.
    Scheduled {
        /// The workflow.
        workflow_id: WorkflowId,
        /// The event whose decision scheduled it.
        event_seq: Seq,
        /// Its position among that decision's timers.
        index: u32,
    },
    /// The occurrence at `at` of the `index`-th recurring schedule started by event `event_seq` of
    /// the workflow ([`crate::Schedule`]).
    Occurrence {
        /// The workflow.
        workflow_id: WorkflowId,
        /// The event whose decision started the schedule.
        event_seq: Seq,
        /// The schedule's position among that decision's schedules.
        index: u32,
        /// When the occurrence is due.
        at: Timestamp,
    },
    /// The `n`-th time `command_id` became dead.
    Failure {
        /// The dead command.
        command_id: CommandId,
        /// Which failure (1 for the first; each retry by hand can lead to one more).
        n: u32,
    },
    /// `command_id` was resolved by hand.
    Resolution {
        /// The resolved command.
        command_id: CommandId,
    },
    /// `command_id` completed, and its result goes back to its workflow.
    Completion {
        /// The completed command.
        command_id: CommandId,
    },
}

/// The deterministic identity of a timer (see the module docs for the format).
///
/// ```
/// use miniflow_core::{Seq, TimerId, WorkflowId};
///
/// let id = TimerId::scheduled(WorkflowId::new("trip-001")?, Seq::new(1)?, 0)?;
/// assert_eq!(id.to_string(), "trip-001:1:t0");
/// assert_eq!("order:42:3:t1".parse::<TimerId>()?.workflow_id().as_str(), "order:42");
/// let failed: TimerId = "trip-001:1:2:failed1".parse()?;
/// assert_eq!(failed.workflow_id().as_str(), "trip-001");
/// # Ok::<(), miniflow_core::Error>(())
/// ```
///
/// Timer IDs order as their text, as stores sort them.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TimerId(TimerSource);

impl Ord for TimerId {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.to_string().cmp(&other.to_string())
    }
}

impl PartialOrd for TimerId {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl TimerId {
    /// The ID of the `index`-th timer scheduled by event `event_seq` of `workflow_id`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] when `event_seq` is 0.
    pub fn scheduled(workflow_id: WorkflowId, event_seq: Seq, index: u32) -> Result<Self, Error> {
        if event_seq == Seq::ZERO {
            return Err(Error::invalid(
                "event_seq",
                0,
                "timers are scheduled by events, which start at 1",
            ));
        }
        Ok(Self(TimerSource::Scheduled {
            workflow_id,
            event_seq,
            index,
        }))
    }

    /// The ID of the occurrence at `at` of the `index`-th schedule started by event `event_seq` of
    /// `workflow_id`.
    ///
    /// ```
    /// use miniflow_core::{Seq, TimerId, Timestamp, WorkflowId};
    ///
    /// let at = Timestamp::from_millis(1_700_000_060_000);
    /// let id = TimerId::occurrence(WorkflowId::new("meter-7")?, Seq::new(1)?, 0, at)?;
    /// assert_eq!(id.to_string(), "meter-7:1:s0@1700000060000");
    /// assert_eq!(id.to_string().parse::<TimerId>()?, id);
    /// # Ok::<(), miniflow_core::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] when `event_seq` is 0.
    pub fn occurrence(
        workflow_id: WorkflowId,
        event_seq: Seq,
        index: u32,
        at: Timestamp,
    ) -> Result<Self, Error> {
        if event_seq == Seq::ZERO {
            return Err(Error::invalid(
                "event_seq",
                0,
                "schedules are started by events, which start at 1",
            ));
        }
        Ok(Self(TimerSource::Occurrence {
            workflow_id,
            event_seq,
            index,
            at,
        }))
    }

    /// The ID of the `n`-th failure feedback of `command_id`.
    pub fn failure(command_id: CommandId, n: u32) -> Self {
        Self(TimerSource::Failure { command_id, n })
    }

    /// The ID of the resolution feedback of `command_id`.
    pub fn resolution(command_id: CommandId) -> Self {
        Self(TimerSource::Resolution { command_id })
    }

    /// The ID of the completion feedback of `command_id`.
    pub fn completion(command_id: CommandId) -> Self {
        Self(TimerSource::Completion { command_id })
    }

    /// What the ID names.
    pub fn source(&self) -> &TimerSource {
        &self.0
    }

    /// The workflow the timer fires into.
    pub fn workflow_id(&self) -> &WorkflowId {
        match &self.0 {
            TimerSource::Scheduled { workflow_id, .. }
            | TimerSource::Occurrence { workflow_id, .. } => workflow_id,
            TimerSource::Failure { command_id, .. }
            | TimerSource::Resolution { command_id }
            | TimerSource::Completion { command_id } => command_id.workflow_id(),
        }
    }
}

impl fmt::Display for TimerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            TimerSource::Scheduled {
                workflow_id,
                event_seq,
                index,
            } => write!(f, "{workflow_id}:{event_seq}:t{index}"),
            TimerSource::Occurrence {
                workflow_id,
                event_seq,
                index,
                at,
            } => write!(f, "{workflow_id}:{event_seq}:s{index}@{}", at.as_millis()),
            TimerSource::Failure { command_id, n } => write!(f, "{command_id}:failed{n}"),
            TimerSource::Resolution { command_id } => write!(f, "{command_id}:resolved"),
            TimerSource::Completion { command_id } => write!(f, "{command_id}:completed"),
        }
    }
}

impl FromStr for TimerId {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        let invalid = |reason: &str| Error::invalid("timer_id", s, reason);
        let (rest, last) = s
            .rsplit_once(':')
            .ok_or_else(|| invalid("expected \"{workflow_id}:{event_seq}:t{index}\", \"{workflow_id}:{event_seq}:s{index}@{at}\" or a command ID with :failed{n}, :resolved or :completed"))?;
        let canonical = |digits: &str| {
            !digits.is_empty()
                && digits.bytes().all(|b| b.is_ascii_digit())
                && (digits == "0" || !digits.starts_with('0'))
        };
        let number = |digits: &str| {
            canonical(digits)
                .then(|| digits.parse::<u32>().ok())
                .flatten()
        };
        if let Some(n) = last.strip_prefix("failed").and_then(number) {
            let command_id = rest
                .parse()
                .map_err(|e| invalid(&format!("its command ID is invalid: {e}")))?;
            return Ok(Self::failure(command_id, n));
        }
        if last == "resolved" || last == "completed" {
            let command_id = rest
                .parse()
                .map_err(|e| invalid(&format!("its command ID is invalid: {e}")))?;
            return Ok(if last == "resolved" {
                Self::resolution(command_id)
            } else {
                Self::completion(command_id)
            });
        }
        // `{workflow_id}:{event_seq}` reads like a command ID without its index: reuse its parser.
        let before = |part: &str| -> Result<CommandId, Error> {
            format!("{rest}:0").parse().map_err(|e| {
                invalid(&format!(
                    "expected {{workflow_id}}:{{event_seq}} before :{part}: {e}"
                ))
            })
        };
        if let Some((index, at)) = last.strip_prefix('s').and_then(|tail| tail.split_once('@')) {
            let index = number(index)
                .ok_or_else(|| invalid("the schedule index after :s must be a number"))?;
            let at = canonical(at)
                .then(|| at.parse::<u64>().ok())
                .flatten()
                .ok_or_else(|| invalid("the occurrence time after @ must be a number"))?;
            let command_id = before(last)?;
            return Self::occurrence(
                command_id.workflow_id().clone(),
                command_id.event_seq(),
                index,
                Timestamp::from_millis(at),
            );
        }
        let index = last.strip_prefix('t').and_then(number).ok_or_else(|| {
            invalid(
                "the last part must be t{index}, s{index}@{at}, failed{n}, resolved or completed",
            )
        })?;
        let command_id = before(last)?;
        Self::scheduled(
            command_id.workflow_id().clone(),
            command_id.event_seq(),
            index,
        )
    }
}

impl Serialize for TimerId {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for TimerId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// Where a timer is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TimerStatus {
    /// Waiting for `fire_at`, or due and not fired yet.
    Scheduled,
    /// Its event was committed.
    Fired,
    /// Cancelled by a later decision; it never fires.
    Cancelled,
    /// Its workflow refused its event ([`crate::Decision::reject`]); it never fires. `last_error` says
    /// why. Terminal, so a refused timer is not taken again every lease.
    Rejected,
}

impl TimerStatus {
    /// The lowercase name used in storage and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            TimerStatus::Scheduled => "scheduled",
            TimerStatus::Fired => "fired",
            TimerStatus::Cancelled => "cancelled",
            TimerStatus::Rejected => "rejected",
        }
    }
}

impl fmt::Display for TimerStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for TimerStatus {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        match s {
            "scheduled" => Ok(TimerStatus::Scheduled),
            "fired" => Ok(TimerStatus::Fired),
            "cancelled" => Ok(TimerStatus::Cancelled),
            "rejected" => Ok(TimerStatus::Rejected),
            other => Err(Error::invalid(
                "timer status",
                other,
                "expected scheduled, fired, cancelled or rejected",
            )),
        }
    }
}

/// A stored timer: the event it will commit into its workflow, and when.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TimerRow {
    /// Its deterministic ID.
    pub timer_id: TimerId,
    /// The timer's name (`command_failed` / `command_resolved` for feedback).
    pub name: String,
    /// The kind of the event it commits.
    pub event_kind: String,
    /// The payload of the event it commits.
    pub event_payload: Value,
    /// When it is due.
    pub fire_at: Timestamp,
    /// When a firer may next take it: `fire_at`, or the end of a firer's lease.
    pub available_at: Timestamp,
    /// Scheduled, fired, cancelled or rejected.
    pub status: TimerStatus,
    /// When it was scheduled.
    pub created_at: Timestamp,
    /// When it fired, was cancelled or was rejected.
    pub processed_at: Option<Timestamp>,
    /// Why its workflow refused it, for a rejected timer.
    #[serde(default)]
    pub last_error: Option<String>,
}

impl TimerRow {
    /// A user timer scheduled at `now` by a decision.
    pub(crate) fn scheduled(id: TimerId, timer: Timer, now: Timestamp) -> Self {
        let fire_at = match timer.fire_at {
            FireAt::After(delay) => now + delay,
            FireAt::At(at) => at,
        };
        let event_payload = to_payload(&TimerFired {
            timer_id: id.to_string(),
            name: timer.name.clone(),
            payload: timer.payload,
        });
        Self::new(id, timer.name, TIMER_FIRED, event_payload, fire_at, now)
    }

    pub(crate) fn new(
        id: TimerId,
        name: String,
        kind: &str,
        payload: Value,
        fire_at: Timestamp,
        now: Timestamp,
    ) -> Self {
        Self {
            timer_id: id,
            name,
            event_kind: kind.to_owned(),
            event_payload: payload,
            fire_at,
            available_at: fire_at,
            status: TimerStatus::Scheduled,
            created_at: now,
            processed_at: None,
            last_error: None,
        }
    }

    /// Whether a firer may take it at `now`.
    pub fn is_due(&self, now: Timestamp) -> bool {
        self.status == TimerStatus::Scheduled && self.available_at <= now
    }

    /// The order firers take due timers in: the longest due first, then by ID. A SQL store says
    /// `ORDER BY available_at, timer_id` over the rows [`Self::is_due`] admits
    /// (`processed_at IS NULL AND available_at <= now`).
    pub fn due_order(&self) -> (Timestamp, &TimerId) {
        (self.available_at, &self.timer_id)
    }

    /// A firer takes it at `now` for `lease_ttl`: others leave it alone until then. (Firing itself is
    /// guarded by the commit, not by this lease.)
    pub fn take(&mut self, lease_ttl: Duration, now: Timestamp) {
        self.available_at = now + lease_ttl;
    }

    /// Marks it fired by the commit of its event at `now`.
    ///
    /// # Errors
    ///
    /// [`Error::TimerNotScheduled`] when it already fired or was cancelled: the commit must not happen.
    pub fn fire(&mut self, now: Timestamp) -> Result<(), Error> {
        if self.status != TimerStatus::Scheduled {
            return Err(Error::TimerNotScheduled {
                timer_id: self.timer_id.to_string(),
                status: self.status.as_str(),
            });
        }
        self.status = TimerStatus::Fired;
        self.processed_at = Some(now);
        Ok(())
    }

    /// Ends it at `now` because its workflow refused its event with `reason`.
    ///
    /// # Errors
    ///
    /// [`Error::TimerNotScheduled`] when it already fired, was cancelled or was rejected.
    pub fn reject(&mut self, reason: &str, now: Timestamp) -> Result<(), Error> {
        if self.status != TimerStatus::Scheduled {
            return Err(Error::TimerNotScheduled {
                timer_id: self.timer_id.to_string(),
                status: self.status.as_str(),
            });
        }
        self.status = TimerStatus::Rejected;
        self.processed_at = Some(now);
        self.last_error = Some(bounded_error(reason));
        Ok(())
    }

    /// Cancels it at `now` if it is still scheduled; says whether it was.
    pub fn cancel(&mut self, now: Timestamp) -> bool {
        if self.status != TimerStatus::Scheduled {
            return false;
        }
        self.status = TimerStatus::Cancelled;
        self.processed_at = Some(now);
        true
    }
}
