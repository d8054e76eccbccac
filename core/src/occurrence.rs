//! A schedule's occurrences as timer rows: the first, which the commit that starts the schedule
//! arms ([`Schedule::start`]), and what firing a due timer commits ([`Firing`]): its event and, for
//! an occurrence, the next one, armed in the same commit. When occurrences fall, and which late ones
//! a firing folds in, is the schedule's own arithmetic (`schedule.rs`); this module turns it into
//! rows and events.

use std::time::Duration;

use serde_json::Value;

use crate::builtin::{to_payload, ScheduleFired, SCHEDULE_FIRED};
use crate::error::Error;
use crate::id::{Seq, WorkflowId};
use crate::model::Event;
use crate::schedule::{Missed, Recurrence, Rule, Schedule};
use crate::time::Timestamp;
use crate::timer::{TimerId, TimerRow, TimerSource};

impl Schedule {
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
            missed_at_least: false,
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
    armed.missed_at_least = false;
    armed.next_at = rule.next_after(armed.scheduled_at);
    let name = armed.name.clone();
    let at = armed.scheduled_at;
    TimerRow::new(id, name, SCHEDULE_FIRED, to_payload(&armed), at, now)
}

/// What firing a due timer commits: its event, and for an occurrence of a schedule the next
/// occurrence, armed in the same commit.
#[derive(Debug, Clone)]
pub(crate) struct Firing {
    timer_id: TimerId,
    next: Option<TimerRow>,
}

impl Firing {
    /// The event `timer` commits when it fires at `now`, and the firing that commit is
    /// made the commit of (`Commit::fired_by`).
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
        let armed = read_armed(&timer.event_payload)
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
            missed_at_least: caught.at_least,
            next_at: caught.next,
            ..armed
        };
        let firing = Self {
            timer_id: timer.timer_id.clone(),
            next,
        };
        Ok((Event::new(SCHEDULE_FIRED, to_payload(&fired)), firing))
    }

    /// The timer it fires.
    pub(crate) fn timer_id(&self) -> &TimerId {
        &self.timer_id
    }

    /// The next occurrence it arms, for an occurrence of a schedule that recurs.
    pub(crate) fn next(&self) -> Option<&TimerRow> {
        self.next.as_ref()
    }
}

/// The [`ScheduleFired`] an occurrence's timer carries, read field by field as its `Deserialize`
/// reads it: a firer then needs no deserializer of JSON values (which, with the error messages it
/// formats, is a tenth of the web module). `None` when a field is missing or of another shape.
fn read_armed(payload: &Value) -> Option<ScheduleFired> {
    let time = |value: &Value| value.as_u64().map(Timestamp::from_millis);
    let recurrence = payload.get("recurrence")?;
    let recurrence = match (recurrence.get("every_ms"), recurrence.get("cron")) {
        (Some(ms), None) => Recurrence::Every(Duration::from_millis(ms.as_u64()?)),
        (None, Some(expression)) => Recurrence::Cron(expression.as_str()?.to_owned()),
        _ => return None,
    };
    let on_missed = match payload.get("on_missed")? {
        Value::String(policy) if policy == "fire_once" => Missed::FireOnce,
        policy => {
            let max = policy.get("fire_all")?.get("max")?.as_u64()?;
            Missed::FireAll {
                max: u32::try_from(max).ok()?,
            }
        }
    };
    let next_at = match payload.get("next_at")? {
        Value::Null => None,
        next => Some(time(next)?),
    };
    Some(ScheduleFired {
        timer_id: payload.get("timer_id")?.as_str()?.to_owned(),
        name: payload.get("name")?.as_str()?.to_owned(),
        payload: payload.get("payload")?.clone(),
        scheduled_at: time(payload.get("scheduled_at")?)?,
        missed: payload.get("missed")?.as_u64()?,
        missed_at_least: match payload.get("missed_at_least") {
            None => false,
            Some(flag) => flag.as_bool()?,
        },
        next_at,
        recurrence,
        on_missed,
    })
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::*;

    const SECOND: u64 = 1_000;

    fn at(ms: u64) -> Timestamp {
        Timestamp::from_millis(ms)
    }

    #[test]
    fn an_armed_occurrence_reads_back_as_serde_reads_it() {
        for (recurrence, on_missed, next_at) in [
            (
                Recurrence::Every(Duration::from_secs(60)),
                Missed::FireOnce,
                Some(at(120 * SECOND)),
            ),
            (
                Recurrence::Cron("0 9 * * *".into()),
                Missed::FireAll { max: 7 },
                None,
            ),
        ] {
            let fired = ScheduleFired {
                timer_id: "w:1:s0@60000".into(),
                name: "reading".into(),
                payload: serde_json::json!({ "unit": "kWh", "n": [1, 2.5] }),
                scheduled_at: at(60 * SECOND),
                missed: 3,
                missed_at_least: next_at.is_none(),
                next_at,
                recurrence,
                on_missed,
            };
            let payload = to_payload(&fired);
            assert_eq!(read_armed(&payload), Some(fired.clone()));
            assert_eq!(
                read_armed(&payload),
                ScheduleFired::deserialize(&payload).ok()
            );
        }
        let good = to_payload(&ScheduleFired {
            timer_id: "w:1:s0@60000".into(),
            name: "reading".into(),
            payload: Value::Null,
            scheduled_at: at(60 * SECOND),
            missed: 0,
            missed_at_least: false,
            next_at: None,
            recurrence: Recurrence::Every(Duration::from_secs(60)),
            on_missed: Missed::FireOnce,
        });
        for (field, bad) in [
            (
                "recurrence",
                serde_json::json!({ "every_ms": 1, "cron": "@daily" }),
            ),
            ("recurrence", serde_json::json!({ "every_ms": -1 })),
            ("on_missed", serde_json::json!("fire_twice")),
            (
                "on_missed",
                serde_json::json!({ "fire_all": { "max": 5_000_000_000_u64 } }),
            ),
            ("next_at", serde_json::json!("soon")),
            ("missed", serde_json::json!(1.5)),
            ("missed_at_least", serde_json::json!("yes")),
            ("timer_id", Value::Null),
        ] {
            let mut payload = good.clone();
            payload[field] = bad;
            assert_eq!(read_armed(&payload), None, "{field}: {}", payload[field]);
            assert!(ScheduleFired::deserialize(&payload).is_err(), "{field}");
        }
        let mut missing = good;
        missing.as_object_mut().unwrap().remove("scheduled_at");
        assert_eq!(read_armed(&missing), None);
    }
}
