//! Recurring schedules: a durable timer that re-arms itself, once per occurrence (DESIGN rule 11).
//! See [`Schedule`].

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::builtin::{to_payload, ScheduleFired, SCHEDULE_FIRED};
use crate::error::Error;
use crate::id::{Seq, WorkflowId};
use crate::model::Event;
use crate::store::Commit;
use crate::time::{millis, Timestamp};
use crate::timer::{TimerId, TimerRow, TimerSource};

#[cfg(doc)]
use crate::model::Decision;

/// A recurring schedule: a durable timer that re-arms itself. A decision starts one with
/// [`Decision::schedule`] — every fixed interval ([`Schedule::every`]) or whenever a cron expression
/// matches, in UTC ([`Schedule::cron`]) — and stops it with [`Decision::cancel_schedule`]. Its
/// workflow receives one [`SCHEDULE_FIRED`] event ([`ScheduleFired`]) per occurrence.
///
/// Each occurrence is a timer row with its own deterministic ID,
/// `{workflow_id}:{event_seq}:s{index}@{at}`. When it fires, one commit records its event, marks it
/// fired *and* arms the next occurrence: a crash leaves all three or none, so on every store no
/// occurrence is lost and none fires twice, also across restarts.
///
/// ```
/// use std::time::Duration;
/// use miniflow_core::prelude::*;
/// use miniflow_core::{
///     json, Command, Decision, Engine, Event, EventRecord, MemoryStore, Schedule, ScheduleFired,
///     Timestamp, Workflow, WorkflowId,
/// };
///
/// /// A meter is read every minute until it is removed.
/// struct Meter;
///
/// impl Workflow for Meter {
///     type State = ();
///
///     fn evolve(&self, _: &mut (), _: &EventRecord) {}
///
///     fn decide(&self, _: &(), event: &EventRecord) -> Decision {
///         if let Some(Ok(tick)) = event.decode::<ScheduleFired>() {
///             return Decision::new().command(Command::new(
///                 "read_meter",
///                 json!({ "meter": event.workflow_id, "at": tick.scheduled_at }),
///             ));
///         }
///         match event.kind.as_str() {
///             "installed" => Decision::new()
///                 .schedule(Schedule::every("reading", Duration::from_secs(60))),
///             "removed" => Decision::new().cancel_schedule("reading"),
///             _ => Decision::none(),
///         }
///     }
/// }
///
/// let engine = Engine::new(Meter);
/// let mut store = MemoryStore::new();
/// let meter = WorkflowId::new("meter-7")?;
/// let t0 = Timestamp::from_millis(1_700_000_000_000);
/// engine.handle(&mut store, &meter, Event::new("installed", json!({})), t0)?;
///
/// // A minute later the first occurrence is due; firing it arms the second in the same commit.
/// let now = t0 + Duration::from_secs(60);
/// let due = store.claim_timers(10, Duration::from_secs(30), now)?;
/// let fired = engine.fire(&mut store, &due[0], now)?.expect("fires once");
/// assert_eq!(fired.timer_ids[0].to_string(), "meter-7:1:s0@1700000120000");
/// assert_eq!(store.pending(10)?[0].kind, "read_meter");
///
/// engine.handle(&mut store, &meter, Event::new("removed", json!({})), now)?;
/// let later = now + Duration::from_secs(3_600);
/// assert!(store.claim_timers(10, Duration::from_secs(30), later)?.is_empty(), "stopped");
/// # Ok::<(), miniflow_core::Error>(())
/// ```
///
/// A schedule with a payload, a cron expression and a catch-up policy:
///
/// ```
/// use std::time::Duration;
/// use miniflow_core::{json, Decision, Missed, Schedule};
///
/// let decision = Decision::new()
///     .schedule(Schedule::every("heartbeat", Duration::from_secs(30)))
///     .schedule(
///         Schedule::cron("invoice", "0 9 1 * *") // 09:00 UTC on the first of each month
///             .payload(json!({ "plan": "pro" }))
///             .on_missed(Missed::FireAll { max: 12 }),
///     );
/// assert_eq!(decision.schedules.len(), 2);
/// ```
///
/// A bad schedule — an interval out of [`Schedule::MIN_INTERVAL`]..=[`Schedule::MAX_INTERVAL`], a
/// cron expression that does not parse or never matches again, a [`Missed::FireAll`] cap out of
/// bounds — makes the commit [`Error::InvalidInput`] naming the value, before anything is written.
///
/// # Occurrences
///
/// - **Every `interval`**: the first occurrence is `interval` after the commit that starts the
///   schedule, then one every `interval` from there (a fixed rate: a late firing does not shift the
///   occurrences after it).
/// - **Cron**: every time the expression matches, evaluated in UTC, to the second. Five fields
///   (`minute hour day-of-month month day-of-week`), six with seconds first, seven with a year last;
///   names (`MON`, `JAN`), ranges, lists, steps, `L`, `W`, `#` and the nicknames `@hourly`,
///   `@daily`, `@weekly`, `@monthly`, `@yearly`. When both day fields are restricted, a day matching
///   either one matches (as in Vixie cron). The first occurrence is the first match after the
///   starting commit. An expression with no later match (a year that is over) ends the schedule
///   after its last occurrence (`next_at` is `null`). Needs the `cron` feature (on by default in
///   `miniflow`).
///
/// # Missed occurrences
///
/// Occurrences come due while no firer runs (the host was down, or firing fell behind). When the
/// armed occurrence finally fires, every occurrence due by then is *late*; the [`Missed`] policy
/// says which of them get an event. Each occurrence is accounted for exactly once: it has an event
/// of its own, or it is counted in the `missed` of the event that stands for it.
///
/// | policy | after an outage across occurrences | as in |
/// |---|---|---|
/// | [`Missed::FireOnce`] (default) | one event, for the latest late occurrence; `missed` counts the others | Kubernetes `CronJob`, systemd `Persistent=true`, Quartz "fire once now" |
/// | [`Missed::FireAll`] `{ max }` | one event per late occurrence, oldest first, at most `max`: the oldest beyond `max` are counted in the `missed` of the first | anacron-style catch-up, with a cap |
///
/// An occurrence merely late (fired before the next one was due) is not missed: its event has
/// `missed: 0`. A workflow that would rather skip stale occurrences compares the event's
/// `scheduled_at` with its `recorded_at` and decides nothing.
///
/// # Stopping
///
/// [`Decision::cancel_schedule`] cancels the armed occurrence. Starting a schedule under a name
/// that already runs replaces it. A decision that rejects an occurrence's event
/// ([`Decision::reject`]) ends the schedule too: the occurrence ends `rejected` and nothing is
/// armed after it.
///
/// # Costs
///
/// Every occurrence is an event in its workflow's history, and each firing replays that history, so
/// a workflow grows with its schedules (one every minute adds 1,440 events a day): schedules suit
/// intervals of seconds and more, in workflows that keep little else.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Schedule {
    /// A name the workflow recognises it by, and stops it by. Schedules share names with timers:
    /// one name, one schedule (starting it again replaces it).
    pub name: String,
    /// When it recurs.
    pub recurrence: Recurrence,
    /// Handed back in every [`ScheduleFired`] event, one level inside its payload (so it may nest
    /// one level less than the [`crate::JsonLimits`] allow).
    pub payload: Value,
    /// What happens to occurrences missed while no firer ran.
    pub on_missed: Missed,
}

/// When a [`Schedule`] recurs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Recurrence {
    /// Every interval, from the commit that starts the schedule (`{ "every_ms": 60000 }`).
    #[serde(rename = "every_ms", with = "crate::outbox::duration_millis")]
    Every(Duration),
    /// Whenever the cron expression matches, in UTC (`{ "cron": "0 9 * * MON-FRI" }`).
    Cron(String),
}

/// Which late occurrences of a [`Schedule`] get an event of their own (see
/// [missed occurrences](Schedule#missed-occurrences)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Missed {
    /// One event, for the latest late occurrence, whose `missed` counts the others (`"fire_once"`).
    #[default]
    FireOnce,
    /// One event per late occurrence, oldest first, at most `max` of them; the oldest beyond `max`
    /// are counted in the `missed` of the first (`{ "fire_all": { "max": 12 } }`). `max` is 1 to
    /// [`Missed::MAX_FIRE_ALL`].
    FireAll {
        /// The most events one catch-up commits.
        max: u32,
    },
}

impl Missed {
    /// The largest cap [`Missed::FireAll`] takes.
    pub const MAX_FIRE_ALL: u32 = 1_000;

    /// How many late occurrences get an event of their own (at least one, whatever a stored
    /// policy says).
    fn cap(self) -> u32 {
        match self {
            Missed::FireOnce => 1,
            Missed::FireAll { max } => max.max(1),
        }
    }

    fn check(self) -> Result<(), Error> {
        match self {
            Missed::FireAll { max } if max == 0 || max > Self::MAX_FIRE_ALL => Err(Error::invalid(
                "schedule.on_missed",
                format!("fire_all {{ max: {max} }}"),
                format!("max must be 1 to {}", Self::MAX_FIRE_ALL),
            )),
            _ => Ok(()),
        }
    }
}

impl Schedule {
    /// The shortest interval of [`Schedule::every`]: every occurrence is a durable commit and an
    /// event in the workflow's history.
    pub const MIN_INTERVAL: Duration = Duration::from_secs(1);
    /// The longest interval of [`Schedule::every`]: 100 years.
    pub const MAX_INTERVAL: Duration = Duration::from_secs(36_525 * 24 * 60 * 60);
    /// The longest cron expression, in bytes.
    pub const MAX_CRON_LEN: usize = 512;

    /// A schedule whose first occurrence is `interval` after the commit that starts it, then one
    /// every `interval`. `interval` is whole milliseconds, from [`Schedule::MIN_INTERVAL`] to
    /// [`Schedule::MAX_INTERVAL`].
    pub fn every(name: impl Into<String>, interval: Duration) -> Self {
        Self::new(name, Recurrence::Every(interval))
    }

    /// A schedule with an occurrence whenever the cron `expression` matches, in UTC (see
    /// [occurrences](Schedule#occurrences) for the syntax). Needs the `cron` feature; without it
    /// the commit is [`Error::InvalidInput`].
    pub fn cron(name: impl Into<String>, expression: impl Into<String>) -> Self {
        Self::new(name, Recurrence::Cron(expression.into()))
    }

    fn new(name: impl Into<String>, recurrence: Recurrence) -> Self {
        Self {
            name: name.into(),
            recurrence,
            payload: Value::Null,
            on_missed: Missed::FireOnce,
        }
    }

    /// Hands `payload` back in every occurrence's event (default `null`).
    #[must_use]
    pub fn payload(mut self, payload: Value) -> Self {
        self.payload = payload;
        self
    }

    /// Sets the missed-occurrence policy (default [`Missed::FireOnce`]).
    #[must_use]
    pub fn on_missed(mut self, missed: Missed) -> Self {
        self.on_missed = missed;
        self
    }

    /// Checks the recurrence and the policy of a schedule started at `now`: what the commit that
    /// starts it refuses.
    pub(crate) fn check(&self, now: Timestamp) -> Result<(), Error> {
        self.on_missed.check()?;
        self.recurrence.rule()?.first_after(&self.recurrence, now)?;
        Ok(())
    }

    /// The timer row of the first occurrence of this schedule, the `index`-th started by event
    /// `event_seq` of `workflow_id` at `now`.
    pub(crate) fn start(
        self,
        workflow_id: WorkflowId,
        event_seq: Seq,
        index: u32,
        now: Timestamp,
    ) -> Result<TimerRow, Error> {
        self.on_missed.check()?;
        let rule = self.recurrence.rule()?;
        let first = rule.first_after(&self.recurrence, now)?;
        let id = TimerId::occurrence(workflow_id, event_seq, index, first)?;
        let armed = ScheduleFired {
            timer_id: String::new(),
            name: self.name,
            payload: self.payload,
            scheduled_at: first,
            missed: 0,
            next_at: None,
            recurrence: self.recurrence,
            on_missed: self.on_missed,
        };
        Ok(arm(id, armed, &rule, now))
    }
}

/// The row of the occurrence `id` (at `armed.scheduled_at`): its stored event is the one it commits
/// when it fires on time.
fn arm(id: TimerId, mut armed: ScheduleFired, rule: &Rule, now: Timestamp) -> TimerRow {
    armed.timer_id = id.to_string();
    armed.missed = 0;
    armed.next_at = rule.next_after(armed.scheduled_at);
    let name = armed.name.clone();
    let at = armed.scheduled_at;
    TimerRow::new(id, name, SCHEDULE_FIRED, to_payload(&armed), at, now)
}

impl Recurrence {
    /// The rule this recurrence stands for, checked.
    fn rule(&self) -> Result<Rule, Error> {
        match self {
            Recurrence::Every(interval) => {
                let in_bounds =
                    (Schedule::MIN_INTERVAL..=Schedule::MAX_INTERVAL).contains(interval);
                if !in_bounds || interval.subsec_nanos() % 1_000_000 != 0 {
                    return Err(Error::invalid(
                        "schedule.every",
                        format!("{interval:?}"),
                        format!(
                            "must be whole milliseconds from {:?} to {:?}",
                            Schedule::MIN_INTERVAL,
                            Schedule::MAX_INTERVAL
                        ),
                    ));
                }
                Ok(Rule::Every(millis(*interval)))
            }
            Recurrence::Cron(expression) => cron::parse(expression),
        }
    }
}

/// A checked recurrence, ready to compute occurrences.
enum Rule {
    /// Every this many milliseconds.
    Every(u64),
    /// The matches of a parsed cron expression.
    #[cfg(feature = "cron")]
    Cron(Box<croner::Cron>),
}

/// Which late occurrence a firing commits, how many it folds in, and the next one to arm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct CatchUp {
    fire_at: Timestamp,
    missed: u64,
    next: Option<Timestamp>,
}

impl Rule {
    /// The first occurrence of a schedule started at `now`.
    fn first_after(&self, recurrence: &Recurrence, now: Timestamp) -> Result<Timestamp, Error> {
        self.next_after(now).ok_or_else(|| match recurrence {
            Recurrence::Cron(expression) => Error::invalid(
                "schedule.cron",
                expression,
                format!("matches no time after {now} (UTC)"),
            ),
            Recurrence::Every(interval) => Error::invalid(
                "schedule.every",
                format!("{interval:?}"),
                format!("its first occurrence after {now} is past the end of time"),
            ),
        })
    }

    /// The first occurrence strictly after `t`; `None` when there is none (a cron expression with
    /// no later match, or past the end of time).
    fn next_after(&self, t: Timestamp) -> Option<Timestamp> {
        match self {
            Rule::Every(interval) => t
                .as_millis()
                .checked_add(*interval)
                .map(Timestamp::from_millis),
            #[cfg(feature = "cron")]
            Rule::Cron(cron) => cron::next_after(cron, t),
        }
    }

    /// Firing the armed occurrence `t0` at `now` with at most `cap` events for late occurrences:
    /// with `L` occurrences due in `[t0, now]`, the event stands for the `(L - cap)`-th (the first
    /// when `L <= cap`), folding in the ones before it.
    fn catch_up(&self, t0: Timestamp, now: Timestamp, cap: u32) -> CatchUp {
        let (fire_at, missed) = match self {
            Rule::Every(interval) => {
                let late = now.as_millis().saturating_sub(t0.as_millis()) / interval + 1;
                let skip = late.saturating_sub(u64::from(cap));
                // `skip * interval` is at most `now - t0`: it cannot overflow.
                let fire_at = Timestamp::from_millis(t0.as_millis() + skip * interval);
                (fire_at, skip.min(ScheduleFired::MAX_MISSED))
            }
            #[cfg(feature = "cron")]
            Rule::Cron(cron) => cron::catch_up(cron, t0, now, cap),
        };
        CatchUp {
            fire_at,
            missed,
            next: self.next_after(fire_at),
        }
    }
}

/// What firing a due timer commits: its event, and for an occurrence of a schedule the next
/// occurrence, armed in the same commit.
#[derive(Debug, Clone)]
pub(crate) struct Firing {
    timer_id: TimerId,
    next: Option<TimerRow>,
}

impl Firing {
    /// The event `timer` commits when it fires at `now`, and the firing to apply to that commit.
    ///
    /// # Errors
    ///
    /// [`Error::Corrupt`] for an occurrence whose stored event is not a [`ScheduleFired`];
    /// [`Error::InvalidInput`] for a cron schedule where the `cron` feature is off.
    pub(crate) fn of(timer: &TimerRow, now: Timestamp) -> Result<(Event, Self), Error> {
        let TimerSource::Occurrence {
            workflow_id,
            event_seq,
            index,
            at,
        } = timer.timer_id.source()
        else {
            let event = Event::new(timer.event_kind.clone(), timer.event_payload.clone());
            let firing = Self {
                timer_id: timer.timer_id.clone(),
                next: None,
            };
            return Ok((event, firing));
        };
        let armed = ScheduleFired::deserialize(&timer.event_payload)
            .ok()
            .filter(|_| timer.event_kind == SCHEDULE_FIRED)
            .ok_or_else(|| {
                Error::Corrupt(format!(
                    "timer {} is an occurrence of a schedule without a {SCHEDULE_FIRED} event",
                    timer.timer_id
                ))
            })?;
        let rule = armed.recurrence.rule()?;
        let caught = rule.catch_up(*at, now, armed.on_missed.cap());
        let next = caught
            .next
            .map(|next_at| {
                let id = TimerId::occurrence(workflow_id.clone(), *event_seq, *index, next_at)?;
                let next = ScheduleFired {
                    scheduled_at: next_at,
                    ..armed.clone()
                };
                Ok::<_, Error>(arm(id, next, &rule, now))
            })
            .transpose()?;
        let fired = ScheduleFired {
            timer_id: timer.timer_id.to_string(),
            scheduled_at: caught.fire_at,
            missed: caught.missed,
            next_at: caught.next,
            ..armed
        };
        let firing = Self {
            timer_id: timer.timer_id.clone(),
            next,
        };
        Ok((Event::new(SCHEDULE_FIRED, to_payload(&fired)), firing))
    }

    /// Makes `commit` the one that fires the timer, and arms the next occurrence in it unless its
    /// decision cancels (stops or restarts) the schedule's name.
    pub(crate) fn apply(&self, commit: Commit) -> Result<Commit, Error> {
        let mut commit = commit.firing(self.timer_id.clone())?;
        if let Some(next) = &self.next {
            commit.arm(next.clone());
        }
        Ok(commit)
    }
}

/// Cron expressions, through `croner`, on whole seconds in UTC.
#[cfg(feature = "cron")]
mod cron {
    use std::str::FromStr;

    use chrono::{DateTime, Utc};
    use croner::Cron;

    use super::{Rule, Schedule};
    use crate::builtin::ScheduleFired;
    use crate::error::Error;
    use crate::time::Timestamp;

    pub(super) fn parse(expression: &str) -> Result<Rule, Error> {
        if expression.len() > Schedule::MAX_CRON_LEN {
            return Err(Error::invalid(
                "schedule.cron",
                expression,
                format!(
                    "is {} bytes, the limit is {}",
                    expression.len(),
                    Schedule::MAX_CRON_LEN
                ),
            ));
        }
        Cron::from_str(expression)
            .map(|cron| Rule::Cron(Box::new(cron)))
            .map_err(|e| {
                Error::invalid(
                    "schedule.cron",
                    expression,
                    format!("is not a cron expression: {e}"),
                )
            })
    }

    /// `t` as a UTC date-time, cut to its second.
    fn utc(t: Timestamp) -> Option<DateTime<Utc>> {
        DateTime::from_timestamp(i64::try_from(t.as_millis() / 1_000).ok()?, 0)
    }

    fn timestamp(t: DateTime<Utc>) -> Option<Timestamp> {
        let seconds = u64::try_from(t.timestamp()).ok()?;
        seconds.checked_mul(1_000).map(Timestamp::from_millis)
    }

    /// The first match strictly after `t`. (Matches are whole seconds: after `t`'s second is after
    /// `t`.)
    pub(super) fn next_after(cron: &Cron, t: Timestamp) -> Option<Timestamp> {
        timestamp(cron.find_next_occurrence(&utc(t)?, false).ok()?)
    }

    /// The latest match at or before `t`.
    fn latest_until(cron: &Cron, t: Timestamp) -> Option<Timestamp> {
        timestamp(cron.find_previous_occurrence(&utc(t)?, true).ok()?)
    }

    /// See [`Rule::catch_up`]: walks back from `now` to the `cap`-th latest match after `t0` (at
    /// most `cap` steps), then counts what it folds in from `t0` (at most
    /// [`ScheduleFired::MAX_MISSED`] steps).
    pub(super) fn catch_up(
        cron: &Cron,
        t0: Timestamp,
        now: Timestamp,
        cap: u32,
    ) -> (Timestamp, u64) {
        let mut fire_at = None;
        let mut until = Some(now);
        for _ in 0..cap {
            match until.and_then(|t| latest_until(cron, t)) {
                Some(at) if at > t0 => {
                    fire_at = Some(at);
                    until = at.as_millis().checked_sub(1).map(Timestamp::from_millis);
                }
                // Fewer than `cap` matches after `t0`: every late occurrence fires, `t0` first.
                _ => return (t0, 0),
            }
        }
        let Some(fire_at) = fire_at else {
            return (t0, 0);
        };
        let mut missed = 1; // `t0` itself
        let mut at = t0;
        while missed < ScheduleFired::MAX_MISSED {
            match next_after(cron, at) {
                Some(next) if next < fire_at => {
                    missed += 1;
                    at = next;
                }
                _ => break,
            }
        }
        (fire_at, missed)
    }
}

/// Without the `cron` feature a cron schedule is refused, naming the feature.
#[cfg(not(feature = "cron"))]
mod cron {
    use super::Rule;
    use crate::error::Error;

    pub(super) fn parse(expression: &str) -> Result<Rule, Error> {
        Err(Error::invalid(
            "schedule.cron",
            expression,
            "cron expressions need the `cron` feature of miniflow-core (on by default in miniflow)",
        ))
    }
}
