//! Recurring schedules: a durable timer that re-arms itself, once per occurrence (DESIGN rule 11).
//! See [`Schedule`]. Here is what a schedule is and when it recurs (the occurrence arithmetic, cron
//! in UTC); its occurrences as timer rows, and what firing one commits, are in `occurrence.rs`.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::Error;
use crate::time::{millis, Shown, Timestamp};

/// The most missed matches of a cron schedule a firing counts, one by one (so that its cost stays
/// bounded); `ScheduleFired::MAX_MISSED` to users.
pub(crate) const MAX_MISSED: u64 = 100_000;

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
/// says which of them get an event. No occurrence fires twice, and none is lost: each has an event
/// of its own or is folded into the `missed` of the event that stands for it. For an interval
/// schedule `missed` is the exact number folded in, whatever the length of the outage; a cron
/// schedule counts its matches one by one up to [`ScheduleFired::MAX_MISSED`], and past that says
/// so (`missed_at_least: true`, `missed` a lower bound).
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
///
/// [`Decision::schedule`]: crate::Decision::schedule
/// [`Decision::cancel_schedule`]: crate::Decision::cancel_schedule
/// [`Decision::reject`]: crate::Decision::reject
/// [`SCHEDULE_FIRED`]: crate::SCHEDULE_FIRED
/// [`ScheduleFired`]: crate::ScheduleFired
/// [`ScheduleFired::MAX_MISSED`]: crate::ScheduleFired::MAX_MISSED
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Schedule {
    /// A name the workflow recognises it by, and stops it by. Schedules share names with timers:
    /// one name, one schedule (starting it again replaces it).
    pub name: String,
    /// When it recurs.
    pub recurrence: Recurrence,
    /// Handed back in every [`ScheduleFired`](crate::ScheduleFired) event, one level inside its
    /// payload (so it may nest one level less than the [`crate::JsonLimits`] allow).
    #[serde(default)]
    pub payload: Value,
    /// What happens to occurrences missed while no firer ran.
    #[serde(default)]
    pub on_missed: Missed,
}

/// When a [`Schedule`] recurs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Recurrence {
    /// Every interval, from the commit that starts the schedule (`{ "every_ms": 60000 }`).
    #[serde(rename = "every_ms", with = "crate::time::duration_millis")]
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
    pub(crate) fn cap(self) -> u32 {
        match self {
            Missed::FireOnce => 1,
            Missed::FireAll { max } => max.max(1),
        }
    }

    pub(crate) fn check(self) -> Result<(), Error> {
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
}

impl Recurrence {
    /// The rule this recurrence stands for, checked.
    pub(crate) fn rule(&self) -> Result<Rule, Error> {
        match self {
            Recurrence::Every(interval) => {
                let in_bounds =
                    (Schedule::MIN_INTERVAL..=Schedule::MAX_INTERVAL).contains(interval);
                if !in_bounds || interval.subsec_nanos() % 1_000_000 != 0 {
                    return Err(Error::invalid(
                        "schedule.every",
                        Shown(*interval).to_string(),
                        format!(
                            "must be whole milliseconds from {} to {}",
                            Shown(Schedule::MIN_INTERVAL),
                            Shown(Schedule::MAX_INTERVAL)
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
pub(crate) enum Rule {
    /// Every this many milliseconds.
    Every(u64),
    /// The matches of a parsed cron expression.
    #[cfg(feature = "cron")]
    Cron(Box<croner::Cron>),
}

/// Which late occurrence a firing commits, how many it folds in (at least, when `at_least`), and
/// the next one to arm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CatchUp {
    pub(crate) fire_at: Timestamp,
    pub(crate) missed: u64,
    pub(crate) at_least: bool,
    pub(crate) next: Option<Timestamp>,
}

impl Rule {
    /// The first occurrence of a schedule started at `now`.
    pub(crate) fn first_after(
        &self,
        recurrence: &Recurrence,
        now: Timestamp,
    ) -> Result<Timestamp, Error> {
        self.next_after(now).ok_or_else(|| match recurrence {
            Recurrence::Cron(expression) => Error::invalid(
                "schedule.cron",
                expression,
                format!("matches no time after {now} (UTC)"),
            ),
            Recurrence::Every(interval) => Error::invalid(
                "schedule.every",
                Shown(*interval).to_string(),
                format!("its first occurrence after {now} is past the end of time"),
            ),
        })
    }

    /// The first occurrence strictly after `t`; `None` when there is none (a cron expression with
    /// no later match, or past the end of time).
    pub(crate) fn next_after(&self, t: Timestamp) -> Option<Timestamp> {
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
    /// when `L <= cap`), folding in the ones before it. An interval computes `L` in O(1), exactly;
    /// a cron expression counts at most [`MAX_MISSED`] matches (`at_least` past that).
    pub(crate) fn catch_up(&self, t0: Timestamp, now: Timestamp, cap: u32) -> CatchUp {
        let (fire_at, missed, at_least) = match self {
            Rule::Every(interval) => {
                let late = now.as_millis().saturating_sub(t0.as_millis()) / interval + 1;
                let skip = late.saturating_sub(u64::from(cap));
                // `skip * interval` is at most `now - t0`: it cannot overflow.
                let fire_at = Timestamp::from_millis(t0.as_millis() + skip * interval);
                (fire_at, skip, false)
            }
            #[cfg(feature = "cron")]
            Rule::Cron(cron) => cron::catch_up(cron, t0, now, cap),
        };
        CatchUp {
            fire_at,
            missed,
            at_least,
            next: self.next_after(fire_at),
        }
    }
}

/// Cron expressions, through `croner`, on whole seconds in UTC.
#[cfg(feature = "cron")]
mod cron {
    use std::str::FromStr;

    use chrono::{DateTime, Utc};
    use croner::Cron;

    use super::{Rule, Schedule, MAX_MISSED};
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
    /// [`MAX_MISSED`] steps). Returns the match to fire, the count, and whether the
    /// count stopped short (a lower bound).
    pub(super) fn catch_up(
        cron: &Cron,
        t0: Timestamp,
        now: Timestamp,
        cap: u32,
    ) -> (Timestamp, u64, bool) {
        let mut fire_at = None;
        let mut until = Some(now);
        for _ in 0..cap {
            match until.and_then(|t| latest_until(cron, t)) {
                Some(at) if at > t0 => {
                    fire_at = Some(at);
                    until = at.as_millis().checked_sub(1).map(Timestamp::from_millis);
                }
                // Fewer than `cap` matches after `t0`: every late occurrence fires, `t0` first.
                _ => return (t0, 0, false),
            }
        }
        let Some(fire_at) = fire_at else {
            return (t0, 0, false);
        };
        let folded = |at| next_after(cron, at).filter(|next| *next < fire_at);
        let mut missed = 1; // `t0` itself
        let mut at = t0;
        while missed < MAX_MISSED {
            match folded(at) {
                Some(next) => {
                    missed += 1;
                    at = next;
                }
                None => return (fire_at, missed, false),
            }
        }
        (fire_at, missed, folded(at).is_some())
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
            "cron expressions need the `cron` feature of miniflow-core, which this build leaves out",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prelude::*;
    use crate::{
        Decision, Engine, Event, EventRecord, MemoryStore, ScheduleFired, TimerRow, Workflow,
        WorkflowId,
    };

    const SECOND: u64 = 1_000;

    fn at(ms: u64) -> Timestamp {
        Timestamp::from_millis(ms)
    }

    fn every(secs: u64) -> Rule {
        Recurrence::Every(Duration::from_secs(secs)).rule().unwrap()
    }

    fn caught(fire_at: u64, missed: u64, next: Option<u64>) -> CatchUp {
        CatchUp {
            fire_at: at(fire_at),
            missed,
            at_least: false,
            next: next.map(at),
        }
    }

    #[test]
    fn an_interval_fires_on_time_late_or_after_an_outage_by_its_policy() {
        let rule = every(10);
        let t0 = 100 * SECOND;
        // On time, and late but before the next occurrence: nothing is missed.
        assert_eq!(
            rule.catch_up(at(t0), at(t0), 1),
            caught(t0, 0, Some(t0 + 10 * SECOND))
        );
        assert_eq!(
            rule.catch_up(at(t0), at(t0 + 9_999), 1),
            caught(t0, 0, Some(t0 + 10 * SECOND))
        );
        // At the next occurrence's very millisecond it is due too: fire once for it.
        assert_eq!(
            rule.catch_up(at(t0), at(t0 + 10 * SECOND), 1),
            caught(t0 + 10 * SECOND, 1, Some(t0 + 20 * SECOND))
        );
        // Down for 55 s: t0 … t0+50 are due (6); fire once for t0+50, five missed.
        assert_eq!(
            rule.catch_up(at(t0), at(t0 + 55 * SECOND), 1),
            caught(t0 + 50 * SECOND, 5, Some(t0 + 60 * SECOND))
        );
        // Fire all, at most 4: t0+20 (folding t0, t0+10), then t0+30 (due already), …
        assert_eq!(
            rule.catch_up(at(t0), at(t0 + 55 * SECOND), 4),
            caught(t0 + 20 * SECOND, 2, Some(t0 + 30 * SECOND))
        );
        // … and within the cap every late occurrence fires, oldest first.
        assert_eq!(
            rule.catch_up(at(t0), at(t0 + 55 * SECOND), 6),
            caught(t0, 0, Some(t0 + 10 * SECOND))
        );
        // A stored policy of 0 still fires one.
        assert_eq!(Missed::FireAll { max: 0 }.cap(), 1);
        // The count is exact, however long the outage.
        let long = rule.catch_up(at(t0), at(t0 + 10 * SECOND * 1_000_000), 1);
        assert_eq!(long.missed, 1_000_000);
        assert!(!long.at_least);
        assert_eq!(long.fire_at, at(t0 + 10 * SECOND * 1_000_000));
        // Past the end of time there is no next occurrence: the schedule ends.
        assert_eq!(rule.next_after(at(u64::MAX - 5)), None);
    }

    #[test]
    fn intervals_and_policies_out_of_bounds_are_refused_naming_them() {
        let refused = |recurrence: Recurrence, missed: Missed| {
            let schedule = Schedule {
                name: "s".into(),
                recurrence,
                payload: Value::Null,
                on_missed: missed,
            };
            match schedule.check(at(0)) {
                Err(Error::InvalidInput { field, value, .. }) => format!("{field} {value}"),
                other => panic!("expected InvalidInput, got {other:?}"),
            }
        };
        let every = |d| Recurrence::Every(d);
        let once = Missed::FireOnce;
        assert_eq!(refused(every(Duration::ZERO), once), "schedule.every 0ns");
        assert_eq!(
            refused(every(Duration::from_millis(999)), once),
            "schedule.every 999ms"
        );
        assert_eq!(
            refused(every(Duration::from_micros(1_000_500)), once),
            "schedule.every 1.0005s"
        );
        assert_eq!(
            refused(every(Schedule::MAX_INTERVAL + Duration::from_secs(1)), once),
            format!(
                "schedule.every {:?}",
                Schedule::MAX_INTERVAL + Duration::from_secs(1)
            )
        );
        let ok = every(Duration::from_secs(1));
        assert_eq!(
            refused(ok.clone(), Missed::FireAll { max: 0 }),
            "schedule.on_missed fire_all { max: 0 }"
        );
        assert_eq!(
            refused(ok, Missed::FireAll { max: 1_001 }),
            "schedule.on_missed fire_all { max: 1001 }"
        );
        let bounds = Schedule::every("s", Schedule::MAX_INTERVAL).on_missed(Missed::FireAll {
            max: Missed::MAX_FIRE_ALL,
        });
        assert!(bounds.check(at(0)).is_ok());
    }

    #[test]
    fn schedules_serialize_as_their_documented_json() {
        let schedule = Schedule::every("s", Duration::from_secs(60))
            .on_missed(Missed::FireAll { max: 12 })
            .payload(serde_json::json!({ "a": 1 }));
        assert_eq!(
            serde_json::to_value(&schedule).unwrap(),
            serde_json::json!({
                "name": "s", "recurrence": { "every_ms": 60000 }, "payload": { "a": 1 },
                "on_missed": { "fire_all": { "max": 12 } }
            })
        );
        assert_eq!(
            serde_json::to_value(Missed::FireOnce).unwrap(),
            serde_json::json!("fire_once")
        );
        assert_eq!(
            serde_json::to_value(Recurrence::Cron("@daily".into())).unwrap(),
            serde_json::json!({ "cron": "@daily" })
        );
    }

    #[cfg(not(feature = "cron"))]
    #[test]
    fn without_the_cron_feature_a_cron_schedule_is_refused_naming_the_feature() {
        match Schedule::cron("s", "@daily").check(at(0)) {
            Err(Error::InvalidInput {
                field: "schedule.cron",
                value,
                reason,
            }) => {
                assert_eq!(value, "@daily");
                assert!(reason.contains("`cron` feature"), "{reason}");
            }
            other => panic!("expected InvalidInput, got {other:?}"),
        }
    }

    #[cfg(feature = "cron")]
    mod cron {
        use super::*;
        use chrono::{TimeZone, Utc};

        fn utc(y: i32, mo: u32, d: u32, h: u32, mi: u32, s: u32) -> u64 {
            let t = Utc.with_ymd_and_hms(y, mo, d, h, mi, s).unwrap();
            u64::try_from(t.timestamp_millis()).unwrap()
        }

        fn rule(expression: &str) -> Rule {
            Recurrence::Cron(expression.into()).rule().unwrap()
        }

        fn next(expression: &str, from: u64) -> Option<u64> {
            rule(expression)
                .next_after(at(from))
                .map(Timestamp::as_millis)
        }

        #[test]
        fn next_occurrences_cross_month_year_and_leap_day_boundaries_in_utc() {
            let cases = [
                // (expression, from, next)
                (
                    "0 0 1 * *",
                    utc(2024, 1, 31, 12, 0, 0),
                    utc(2024, 2, 1, 0, 0, 0),
                ),
                (
                    "0 0 1 * *",
                    utc(2024, 2, 1, 0, 0, 0),
                    utc(2024, 3, 1, 0, 0, 0),
                ),
                (
                    "0 0 31 * *",
                    utc(2024, 1, 31, 0, 0, 1),
                    utc(2024, 3, 31, 0, 0, 0),
                ),
                (
                    "0 0 29 2 *",
                    utc(2023, 3, 1, 0, 0, 0),
                    utc(2024, 2, 29, 0, 0, 0),
                ),
                (
                    "0 0 L * *",
                    utc(2024, 2, 10, 0, 0, 0),
                    utc(2024, 2, 29, 0, 0, 0),
                ),
                (
                    "0 0 L * *",
                    utc(2023, 2, 10, 0, 0, 0),
                    utc(2023, 2, 28, 0, 0, 0),
                ),
                (
                    "59 23 31 12 *",
                    utc(2024, 6, 1, 0, 0, 0),
                    utc(2024, 12, 31, 23, 59, 0),
                ),
                (
                    "0 0 * * *",
                    utc(2024, 12, 31, 23, 59, 59),
                    utc(2025, 1, 1, 0, 0, 0),
                ),
                (
                    "@hourly",
                    utc(2024, 3, 31, 23, 30, 0),
                    utc(2024, 4, 1, 0, 0, 0),
                ),
                (
                    "0 9 * * MON",
                    utc(2024, 6, 1, 0, 0, 0),
                    utc(2024, 6, 3, 9, 0, 0),
                ),
                (
                    "*/15 * * * * *",
                    utc(2024, 1, 1, 0, 0, 44),
                    utc(2024, 1, 1, 0, 0, 45),
                ),
                // Both day fields restricted: either matches (1 June 2024 is a Saturday).
                (
                    "0 0 1 * MON",
                    utc(2024, 5, 28, 0, 0, 0),
                    utc(2024, 6, 1, 0, 0, 0),
                ),
                // The last Friday of the month.
                (
                    "0 12 * * FRI#L",
                    utc(2024, 2, 1, 0, 0, 0),
                    utc(2024, 2, 23, 12, 0, 0),
                ),
            ];
            for (expression, from, expected) in cases {
                assert_eq!(
                    next(expression, from),
                    Some(expected),
                    "{expression} after {from}"
                );
                // Strictly after: from the match itself, and a millisecond before it.
                assert!(
                    next(expression, expected).unwrap() > expected,
                    "{expression}"
                );
                assert_eq!(
                    next(expression, expected - 1),
                    Some(expected),
                    "{expression}"
                );
            }
            // Times in the middle of a second.
            assert_eq!(next("* * * * * *", 1_500), Some(2_000));
        }

        #[test]
        fn bad_and_never_matching_expressions_are_refused_naming_them() {
            for expression in [
                "",
                "bad",
                "60 * * * *",
                "*/0 * * * *",
                "0 0 31 2 *",
                "0 0 1 1 * 2020",
            ] {
                let schedule = Schedule::cron("s", expression);
                match schedule.check(at(utc(2024, 1, 1, 0, 0, 0))) {
                    Err(Error::InvalidInput {
                        field,
                        value,
                        reason,
                    }) => {
                        assert_eq!(
                            (field, value.as_str()),
                            ("schedule.cron", expression),
                            "{reason}"
                        );
                    }
                    other => panic!("{expression:?}: expected InvalidInput, got {other:?}"),
                }
            }
            let long = format!("0 {} * * *", vec!["0"; 300].join(","));
            assert!(long.len() > Schedule::MAX_CRON_LEN);
            assert!(matches!(
                Schedule::cron("s", long).check(at(0)),
                Err(Error::InvalidInput {
                    field: "schedule.cron",
                    ..
                })
            ));
            // A seven-field expression whose year is still to come ends after its last match.
            let rule = rule("0 0 0 1 1 * 2030");
            let last = utc(2030, 1, 1, 0, 0, 0);
            assert_eq!(
                rule.next_after(at(utc(2024, 1, 1, 0, 0, 0))),
                Some(at(last))
            );
            assert_eq!(rule.next_after(at(last)), None);
        }

        #[test]
        fn cron_catch_up_folds_missed_matches_by_the_policy() {
            // Every day at 09:00; armed for 1 March, the host comes back on 5 March at 10:00.
            let rule = rule("0 9 * * *");
            let day = |d| utc(2024, 3, d, 9, 0, 0);
            let now = at(utc(2024, 3, 5, 10, 0, 0));
            assert_eq!(
                rule.catch_up(at(day(1)), now, 1),
                caught(day(5), 4, Some(day(6)))
            );
            assert_eq!(
                rule.catch_up(at(day(1)), now, 3),
                caught(day(3), 2, Some(day(4)))
            );
            assert_eq!(
                rule.catch_up(at(day(1)), now, 5),
                caught(day(1), 0, Some(day(2)))
            );
            assert_eq!(
                rule.catch_up(at(day(1)), now, 1_000),
                caught(day(1), 0, Some(day(2)))
            );
            // Late but before the next match: on time as far as the policy goes.
            let late = at(utc(2024, 3, 1, 23, 0, 0));
            assert_eq!(
                rule.catch_up(at(day(1)), late, 1),
                caught(day(1), 0, Some(day(2)))
            );
            // Every second, down for two days: the count stops at its maximum.
            let rule = self::rule("* * * * * *");
            let t0 = utc(2024, 1, 1, 0, 0, 0);
            let back = t0 + 2 * 86_400 * SECOND;
            assert_eq!(
                rule.catch_up(at(t0), at(back), 1),
                CatchUp {
                    at_least: true,
                    ..caught(back, ScheduleFired::MAX_MISSED, Some(back + SECOND))
                }
            );
            // Exactly the maximum is exact.
            let back = t0 + ScheduleFired::MAX_MISSED * SECOND;
            assert_eq!(
                rule.catch_up(at(t0), at(back), 1),
                caught(back, ScheduleFired::MAX_MISSED, Some(back + SECOND))
            );
        }

        #[test]
        fn a_cron_count_past_its_maximum_says_it_is_a_lower_bound() {
            let start = at(utc(2024, 1, 1, 0, 0, 0));
            let two_days = Duration::from_secs(2 * 86_400);
            let every_second = Schedule::cron("tick", "* * * * * *");
            let fired = super::fired_after_an_outage(every_second, start, two_days);
            assert_eq!(fired["missed"], ScheduleFired::MAX_MISSED, "{fired}");
            assert_eq!(fired["missed_at_least"], true, "{fired}");
            // Counted to the end: exact, and the payload has no such field.
            let daily = Schedule::cron("report", "0 9 * * *");
            let fired = super::fired_after_an_outage(daily, start, two_days);
            assert_eq!(fired["missed"], 2, "{fired}");
            assert_eq!(fired.get("missed_at_least"), None, "{fired}");
        }
    }

    /// The payload of the event that the first occurrence of `schedule`, started at `start`,
    /// commits when it fires `down` after it was due.
    fn fired_after_an_outage(schedule: Schedule, start: Timestamp, down: Duration) -> Value {
        let engine = Engine::new(Ticks(schedule));
        let mut store = MemoryStore::new();
        let wf = WorkflowId::new("w").unwrap();
        engine
            .handle(&mut store, &wf, Event::new("start", Value::Null), start)
            .unwrap();
        let first = store.timers(&wf).unwrap()[0].fire_at;
        let now = first + down;
        let due = store.claim_timers(10, Duration::ZERO, now).unwrap();
        engine
            .fire(&mut store, &due[0], now)
            .unwrap()
            .expect("fires");
        store.load(&wf).unwrap().remove(1).payload
    }

    #[test]
    fn a_one_second_schedule_missed_for_a_year_counts_every_missed_occurrence() {
        let year = Duration::from_secs(365 * 86_400);
        let start = at(1_704_067_200_000);
        let every_second = Schedule::every("tick", Duration::from_secs(1));
        let fired = fired_after_an_outage(every_second.clone(), start, year);
        // Due: the armed occurrence and one every second for a year; the latest has the event.
        assert_eq!(fired["missed"], 31_536_000);
        assert_eq!(
            fired["scheduled_at"],
            start.as_millis() + SECOND + 31_536_000 * SECOND
        );
        assert_eq!(fired.get("missed_at_least"), None, "exact: {fired}");
        // Catching up oldest first, the first event folds in all but the newest 1,000.
        let all = every_second.on_missed(Missed::FireAll { max: 1_000 });
        let fired = fired_after_an_outage(all, start, year);
        assert_eq!(fired["missed"], 31_536_001 - 1_000);
        assert_eq!(fired.get("missed_at_least"), None, "exact: {fired}");
    }

    /// A workflow that records the schedule events it sees and starts `schedule` on `start`.
    struct Ticks(Schedule);

    impl Workflow for Ticks {
        type State = ();
        fn evolve(&self, _: &mut (), _: &EventRecord) {}
        fn decide(&self, _: &(), event: &EventRecord) -> Decision {
            match event.kind.as_str() {
                "start" => Decision::new().schedule(self.0.clone()),
                _ => Decision::none(),
            }
        }
    }

    /// A small deterministic generator, so a failing seed replays.
    struct XorShift(u64);

    impl XorShift {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n
        }
    }

    /// Fires a schedule at random times (on time, late, after outages of many occurrences, with
    /// firers racing) and checks that every occurrence up to the last fired one is accounted for
    /// exactly once, in order, with one armed occurrence left that is the one the last event named.
    fn random_clocks(schedule: Schedule, occurrences: impl Fn(u64, u64) -> u64, seeds: u64) {
        let cap = u64::from(schedule.on_missed.cap());
        for seed in 1..=seeds {
            let mut rng = XorShift(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
            let engine = Engine::new(Ticks(schedule.clone()));
            let mut store = MemoryStore::new();
            let wf = WorkflowId::new("w").unwrap();
            let start = at(1_704_067_200_000 + rng.below(60 * SECOND));
            engine
                .handle(&mut store, &wf, Event::new("start", Value::Null), start)
                .unwrap();
            let mut now = start;
            for _ in 0..60 {
                now = now + Duration::from_millis(rng.below(8) * rng.below(40 * SECOND));
                let due = store.claim_timers(10, Duration::ZERO, now).unwrap();
                assert!(
                    due.len() <= 1,
                    "seed {seed}: one armed occurrence at a time"
                );
                for timer in &due {
                    let fired = engine.fire(&mut store, timer, now).unwrap();
                    assert!(fired.is_some(), "seed {seed}");
                    // A second firer with the same row commits nothing.
                    assert_eq!(
                        engine.fire(&mut store, timer, now).unwrap(),
                        None,
                        "seed {seed}"
                    );
                }
            }
            let events: Vec<ScheduleFired> = store
                .load(&wf)
                .unwrap()
                .iter()
                .filter_map(|e| e.decode::<ScheduleFired>())
                .map(Result::unwrap)
                .collect();
            let Some(last) = events.last() else { continue };
            let first_at = events[0]
                .timer_id
                .rsplit_once('@')
                .unwrap()
                .1
                .parse()
                .unwrap();
            let accounted: u64 = events.iter().map(|e| 1 + e.missed).sum();
            assert_eq!(
                accounted,
                occurrences(first_at, last.scheduled_at.as_millis()),
                "seed {seed}: every occurrence accounted for once"
            );
            assert!(
                events
                    .windows(2)
                    .all(|w| w[0].scheduled_at < w[1].scheduled_at),
                "seed {seed}: in order"
            );
            let armed: Vec<TimerRow> = store
                .timers(&wf)
                .unwrap()
                .into_iter()
                .filter(|t| t.status == crate::TimerStatus::Scheduled)
                .collect();
            assert_eq!(armed.len(), 1, "seed {seed}");
            assert_eq!(Some(armed[0].fire_at), last.next_at, "seed {seed}");
            // Between two firings no more than `cap` events: a catch-up is bounded by the policy.
            if cap == 1 {
                assert!(
                    armed[0].fire_at > now,
                    "seed {seed}: nothing due is left behind"
                );
            }
        }
    }

    #[test]
    fn random_clocks_account_for_every_occurrence_of_an_interval_once() {
        let n = 7 * SECOND;
        let count = move |from: u64, to: u64| (to - from) / n + 1;
        random_clocks(Schedule::every("tick", Duration::from_millis(n)), count, 40);
        random_clocks(
            Schedule::every("tick", Duration::from_millis(n)).on_missed(Missed::FireAll { max: 3 }),
            count,
            40,
        );
    }

    #[cfg(feature = "cron")]
    #[test]
    fn random_clocks_account_for_every_match_of_a_cron_expression_once() {
        let expression = "*/5 * * * * *";
        let count = |from: u64, to: u64| {
            let rule = Recurrence::Cron(expression.into()).rule().unwrap();
            let mut n = 1;
            let mut t = at(from);
            while let Some(next) = rule.next_after(t).filter(|next| next.as_millis() <= to) {
                n += 1;
                t = next;
            }
            n
        };
        random_clocks(Schedule::cron("tick", expression), count, 30);
        random_clocks(
            Schedule::cron("tick", expression).on_missed(Missed::FireAll { max: 4 }),
            count,
            30,
        );
    }
}
