//! Cases on recurring schedules (DESIGN rule 11, once per occurrence): every store gets them through
//! the commit it already writes.

use super::*;
use crate::{Handled, Missed, Schedule, ScheduleFired, SCHEDULE_FIRED};

/// Counts its occurrences. `start` starts a schedule called `tick` every second; the event's payload
/// may set `"all"` (fire all missed occurrences, at most 3), `"cron"` (an expression instead of the
/// interval), `"stop_after"` (stop it in the decision on that occurrence) and `"explode_until"` (the
/// decision on an occurrence recorded before that time decides an `explode` command). `stop` stops
/// it; `restart` starts it again every 2 s; `start_as_given` starts the schedule in its payload.
struct Ticker;

impl Workflow for Ticker {
    type State = u64;

    fn evolve(&self, ticks: &mut u64, event: &EventRecord) {
        if event.kind == SCHEDULE_FIRED {
            *ticks += 1;
        }
    }

    fn decide(&self, ticks: &u64, event: &EventRecord) -> Decision {
        let given = &event.payload;
        match event.kind.as_str() {
            "start" => {
                let mut schedule = match given["cron"].as_str() {
                    Some(expression) => Schedule::cron("tick", expression),
                    None => Schedule::every("tick", Duration::from_secs(1)),
                };
                if given["all"] == json!(true) {
                    schedule = schedule.on_missed(Missed::FireAll { max: 3 });
                }
                Decision::new().schedule(schedule.payload(given.clone()))
            }
            "start_as_given" => match Schedule::deserialize(given) {
                Ok(schedule) => Decision::new().schedule(schedule),
                Err(e) => Decision::reject(e.to_string()),
            },
            "stop" => Decision::new().cancel_schedule("tick"),
            "restart" => Decision::new().schedule(Schedule::every("tick", Duration::from_secs(2))),
            SCHEDULE_FIRED => {
                let fired = event
                    .decode::<ScheduleFired>()
                    .expect("a schedule_fired event")
                    .expect("its payload reads");
                let explode_until = fired.payload["explode_until"].as_u64().unwrap_or(0);
                let kind = if event.recorded_at.as_millis() < explode_until {
                    "explode"
                } else {
                    "on_tick"
                };
                let command = Command::new(
                    kind,
                    json!({ "scheduled_at": fired.scheduled_at, "missed": fired.missed }),
                );
                let decision = Decision::new().command(command);
                if fired.payload["stop_after"].as_u64() == Some(ticks + 1) {
                    decision.cancel_schedule("tick")
                } else {
                    decision
                }
            }
            _ => Decision::none(),
        }
    }
}

fn start<S: Store>(store: &mut S, workflow: &str, payload: Value, now: Timestamp) -> Handled {
    Engine::new(Ticker)
        .handle(store, &wid(workflow), Event::new("start", payload), now)
        .expect("the schedule starts")
}

/// The occurrences of `workflow` as `(scheduled_at offset from T0, missed, next_at offset)`.
fn occurrences<S: Store>(store: &S, workflow: &str) -> Vec<(u64, u64, Option<u64>)> {
    let offset = |t: Timestamp| t.as_millis() - T0.as_millis();
    store
        .load(&wid(workflow))
        .unwrap()
        .iter()
        .filter_map(|e| e.decode::<ScheduleFired>())
        .map(|fired| {
            let fired = fired.unwrap();
            (
                offset(fired.scheduled_at),
                fired.missed,
                fired.next_at.map(offset),
            )
        })
        .collect()
}

/// Takes and fires every due timer at `now`, again until none is due; returns how many fired.
fn fire_due<S: Store>(store: &mut S, now: Timestamp) -> usize {
    let engine = Engine::new(Ticker);
    let mut fired = 0;
    loop {
        let due = store
            .claim_timers(10, Duration::from_millis(100), now)
            .unwrap();
        if due.is_empty() {
            return fired;
        }
        for timer in &due {
            if engine.fire(store, timer, now).unwrap().is_some() {
                fired += 1;
            }
        }
    }
}

fn handled_timer_ids(handled: &Handled) -> Vec<String> {
    handled.timer_ids.iter().map(ToString::to_string).collect()
}

/// An every-second schedule: each occurrence fires once, not before its time, with its event; the
/// commit that fires it arms the next, with a deterministic ID; a late firing does not shift the
/// occurrences after it; a stale firer commits nothing; all of it survives restarts.
pub fn schedules_fire_each_occurrence_once_rearming_in_the_same_commit<H: Harness>(h: &mut H) {
    let mut store = h.open();
    let engine = Engine::new(Ticker);
    let started = start(&mut store, "s", json!({ "meter": 7 }), T0);
    assert_eq!(handled_timer_ids(&started), ["s:1:s0@1001000"]);
    let mut store = h.reopen(store);
    assert_eq!(timer_states(&store, "s"), ["s:1:s0@1001000 tick scheduled"]);
    assert!(store
        .claim_timers(10, Duration::from_millis(100), at(999))
        .unwrap()
        .is_empty());
    let due = store
        .claim_timers(10, Duration::from_millis(100), at(1_000))
        .unwrap();
    assert_eq!(due.len(), 1);
    assert_eq!(
        (due[0].event_kind.as_str(), due[0].fire_at),
        (SCHEDULE_FIRED, at(1_000))
    );
    let fired = engine
        .fire(&mut store, &due[0], at(1_000))
        .unwrap()
        .expect("fires");
    assert_eq!(fired.seq.get(), 2);
    assert_eq!(fired.command_ids, [cid("s:2:0")], "decided on");
    assert_eq!(
        handled_timer_ids(&fired),
        ["s:1:s0@1002000"],
        "the next occurrence, armed in the firing commit"
    );
    assert_eq!(
        store.load(&wid("s")).unwrap()[1].payload,
        json!({
            "timer_id": "s:1:s0@1001000", "name": "tick", "payload": { "meter": 7 },
            "scheduled_at": 1_001_000, "missed": 0, "next_at": 1_002_000,
            "recurrence": { "every_ms": 1000 }, "on_missed": "fire_once"
        })
    );
    assert_eq!(
        engine.fire(&mut store, &due[0], at(1_001)).unwrap(),
        None,
        "an occurrence fires once"
    );
    let mut store = h.reopen(store);
    assert_eq!(
        timer_states(&store, "s"),
        ["s:1:s0@1001000 tick fired", "s:1:s0@1002000 tick scheduled"]
    );
    // The armed row holds the event it commits when it fires on time.
    let armed = store.timers(&wid("s")).unwrap().remove(1);
    assert_eq!(armed.event_payload["scheduled_at"], 1_002_000);
    assert_eq!(armed.event_payload["next_at"], 1_003_000);
    // Late, but before the next occurrence: nothing missed, and the rate does not drift.
    assert_eq!(fire_due(&mut store, at(2_700)), 1);
    let mut store = h.reopen(store);
    assert_eq!(fire_due(&mut store, at(3_000)), 1);
    assert_eq!(fire_due(&mut store, at(3_999)), 0);
    assert_eq!(
        occurrences(&store, "s"),
        [
            (1_000, 0, Some(2_000)),
            (2_000, 0, Some(3_000)),
            (3_000, 0, Some(4_000))
        ]
    );
    assert_eq!(
        pending_ids(&store),
        ["s:2:0", "s:3:0", "s:4:0"],
        "one command per occurrence"
    );
    assert_eq!(
        timer_states(&store, "s").last().unwrap(),
        "s:1:s0@1004000 tick scheduled"
    );
}

/// A commit that fires an occurrence fails half-way: the occurrence is still armed, nothing of the
/// next is written, no event was recorded; the next firing, after a restart, fires it once (folding
/// in what it missed meanwhile) and arms the next once.
pub fn a_failed_occurrence_commit_neither_fires_nor_rearms<H: Harness>(h: &mut H) {
    let mut store = h.open();
    let engine = Engine::new(Ticker);
    start(&mut store, "x", json!({ "explode_until": at(5_000) }), T0);
    h.fail_commits_with_command_kind(&mut store, "explode");
    let due = store
        .claim_timers(10, Duration::from_millis(100), at(1_000))
        .unwrap();
    assert!(engine.fire(&mut store, &due[0], at(1_000)).is_err());
    let mut store = h.reopen(store);
    assert_eq!(timer_states(&store, "x"), ["x:1:s0@1001000 tick scheduled"]);
    assert_eq!(
        kinds(&store, "x"),
        ["start"],
        "no event of the failed commit"
    );
    assert!(pending_ids(&store).is_empty());
    // Five seconds later the firer is back.
    let fired = engine
        .fire(&mut store, &due[0], at(6_000))
        .unwrap()
        .expect("fires");
    assert_eq!(handled_timer_ids(&fired), ["x:1:s0@1007000"]);
    assert_eq!(engine.fire(&mut store, &due[0], at(6_000)).unwrap(), None);
    let store = h.reopen(store);
    assert_eq!(occurrences(&store, "x"), [(6_000, 5, Some(7_000))]);
    assert_eq!(
        timer_states(&store, "x"),
        ["x:1:s0@1001000 tick fired", "x:1:s0@1007000 tick scheduled"]
    );
    assert_eq!(pending_ids(&store), ["x:2:0"]);
    assert_eq!(status(&store, "x:2:0"), Status::Pending);
}

/// Down for 5.5 occurrences: by default one event stands for the latest, counting the five it
/// folds in; with "fire all, at most 3" the three latest fire in order, the first counting two.
/// Either way the next occurrence is the first one still to come.
pub fn missed_occurrences_follow_the_schedules_policy<H: Harness>(h: &mut H) {
    let mut store = h.open();
    start(&mut store, "once", json!({}), T0);
    start(&mut store, "all", json!({ "all": true }), T0);
    let mut store = h.reopen(store);
    assert_eq!(fire_due(&mut store, at(5_500)), 4);
    assert_eq!(occurrences(&store, "once"), [(5_000, 4, Some(6_000))]);
    assert_eq!(
        occurrences(&store, "all"),
        [
            (3_000, 2, Some(4_000)),
            (4_000, 0, Some(5_000)),
            (5_000, 0, Some(6_000))
        ]
    );
    for workflow in ["once", "all"] {
        let armed: Vec<String> = timer_states(&store, workflow)
            .into_iter()
            .filter(|t| t.ends_with("scheduled"))
            .collect();
        assert_eq!(armed, [format!("{workflow}:1:s0@1006000 tick scheduled")]);
    }
    let mut store = h.reopen(store);
    assert_eq!(fire_due(&mut store, at(5_999)), 0);
    assert_eq!(fire_due(&mut store, at(6_000)), 2);
    assert_eq!(
        occurrences(&store, "once").last(),
        Some(&(6_000, 0, Some(7_000)))
    );
    assert_eq!(
        occurrences(&store, "all").last(),
        Some(&(6_000, 0, Some(7_000)))
    );
}

/// A stopped schedule never fires again, also for a firer that took its occurrence before; a
/// decision on an occurrence can stop its own schedule (its event is recorded, nothing re-armed);
/// starting a schedule again under its name replaces it.
pub fn stopped_schedules_never_fire_again<H: Harness>(h: &mut H) {
    let mut store = h.open();
    let engine = Engine::new(Ticker);
    start(&mut store, "stop", json!({}), T0);
    let stale = store
        .claim_timers(10, Duration::from_millis(1), at(1_000))
        .unwrap();
    let stopped = engine
        .handle(
            &mut store,
            &wid("stop"),
            Event::new("stop", json!({})),
            at(900),
        )
        .unwrap();
    assert!(stopped.timer_ids.is_empty());
    assert_eq!(engine.fire(&mut store, &stale[0], at(1_000)).unwrap(), None);
    let mut store = h.reopen(store);
    assert_eq!(fire_due(&mut store, at(3_600_000)), 0);
    assert_eq!(
        timer_states(&store, "stop"),
        ["stop:1:s0@1001000 tick cancelled"]
    );

    start(&mut store, "own", json!({ "stop_after": 2 }), T0);
    assert_eq!(fire_due(&mut store, at(1_000)), 1);
    assert_eq!(fire_due(&mut store, at(2_000)), 1);
    let mut store = h.reopen(store);
    assert_eq!(fire_due(&mut store, at(3_600_000)), 0);
    assert_eq!(
        timer_states(&store, "own"),
        ["own:1:s0@1001000 tick fired", "own:1:s0@1002000 tick fired"]
    );
    assert_eq!(occurrences(&store, "own").len(), 2);

    start(&mut store, "again", json!({}), T0);
    let restarted = engine
        .handle(
            &mut store,
            &wid("again"),
            Event::new("restart", json!({})),
            at(500),
        )
        .unwrap();
    assert_eq!(handled_timer_ids(&restarted), ["again:2:s0@1002500"]);
    let mut store = h.reopen(store);
    assert_eq!(
        timer_states(&store, "again"),
        [
            "again:1:s0@1001000 tick cancelled",
            "again:2:s0@1002500 tick scheduled"
        ]
    );
    assert_eq!(fire_due(&mut store, at(2_500)), 1);
    assert_eq!(occurrences(&store, "again"), [(2_500, 0, Some(4_500))]);
}

/// `0 0 1 * *` from 31 January 2024, 12:00 UTC: the first occurrence is midnight on 1 February,
/// the next 1 March (over a leap day); firing on 15 May fires once for 1 May, counting March and
/// April, and arms 1 June. Without the `cron` feature the schedule is refused and nothing written.
pub fn cron_schedules_fire_at_their_matches_in_utc<H: Harness>(h: &mut H) {
    const JAN_31_NOON: u64 = 1_706_702_400_000;
    const FEB_1: u64 = 1_706_745_600_000;
    const MAR_1: u64 = 1_709_251_200_000;
    const MAY_1: u64 = 1_714_521_600_000;
    const MAY_15: u64 = 1_715_761_800_000;
    const JUN_1: u64 = 1_717_200_000_000;
    let mut store = h.open();
    let engine = Engine::new(Ticker);
    let monthly = Event::new("start", json!({ "cron": "0 0 1 * *" }));
    let started = engine.handle(
        &mut store,
        &wid("c"),
        monthly,
        Timestamp::from_millis(JAN_31_NOON),
    );
    if cfg!(not(feature = "cron")) {
        assert!(
            matches!(&started, Err(Error::InvalidInput { field: "schedule.cron", value, .. }) if value == "0 0 1 * *"),
            "{started:?}"
        );
        assert!(store.load(&wid("c")).unwrap().is_empty());
        return;
    }
    let started = started.unwrap();
    assert_eq!(handled_timer_ids(&started), [format!("c:1:s0@{FEB_1}")]);
    let mut store = h.reopen(store);
    assert_eq!(fire_due(&mut store, Timestamp::from_millis(FEB_1 - 1)), 0);
    assert_eq!(fire_due(&mut store, Timestamp::from_millis(FEB_1)), 1);
    let mut store = h.reopen(store);
    assert_eq!(fire_due(&mut store, Timestamp::from_millis(MAY_15)), 1);
    let fired: Vec<ScheduleFired> = store
        .load(&wid("c"))
        .unwrap()
        .iter()
        .filter_map(|e| e.decode::<ScheduleFired>())
        .map(Result::unwrap)
        .collect();
    let times = |f: &ScheduleFired| {
        (
            f.scheduled_at.as_millis(),
            f.missed,
            f.next_at.map(Timestamp::as_millis),
        )
    };
    assert_eq!(
        fired.iter().map(times).collect::<Vec<_>>(),
        [(FEB_1, 0, Some(MAR_1)), (MAY_1, 2, Some(JUN_1))]
    );
    assert_eq!(
        timer_states(&store, "c").last().unwrap(),
        &format!("c:1:s0@{JUN_1} tick scheduled")
    );
}

/// Zero, sub-second, sub-millisecond and over-long intervals, caps out of bounds, empty names, bad
/// cron expressions and payloads past the limits are `InvalidInput` naming the value, and nothing
/// of their commit is written.
pub fn bad_schedules_are_refused_before_anything_is_written<H: Harness>(h: &mut H) {
    let mut store = h.open();
    let engine = Engine::new(Ticker);
    let schedule = |name: &str, recurrence: Value, payload: Value, missed: Value| json!({ "name": name, "recurrence": recurrence, "payload": payload, "on_missed": missed });
    let every = |ms: u64| json!({ "every_ms": ms });
    let once = json!("fire_once");
    let cases = [
        (
            schedule("s", every(0), Value::Null, once.clone()),
            "schedule.every",
            "0ns",
        ),
        (
            schedule("s", every(999), Value::Null, once.clone()),
            "schedule.every",
            "999ms",
        ),
        (
            schedule("s", every(3_155_760_000_001), Value::Null, once.clone()),
            "schedule.every",
            "3155760000.001s",
        ),
        (
            schedule(
                "s",
                every(1_000),
                Value::Null,
                json!({ "fire_all": { "max": 0 } }),
            ),
            "schedule.on_missed",
            "fire_all { max: 0 }",
        ),
        (
            schedule(
                "s",
                every(1_000),
                Value::Null,
                json!({ "fire_all": { "max": 5000 } }),
            ),
            "schedule.on_missed",
            "fire_all { max: 5000 }",
        ),
        (
            schedule("", every(1_000), Value::Null, once.clone()),
            "schedule.name",
            "",
        ),
        (
            schedule(
                "s",
                json!({ "cron": "61 * * * *" }),
                Value::Null,
                once.clone(),
            ),
            "schedule.cron",
            "61 * * * *",
        ),
        (
            schedule(
                "s",
                json!({ "cron": "0 0 30 2 *" }),
                Value::Null,
                once.clone(),
            ),
            "schedule.cron",
            "0 0 30 2 *",
        ),
    ];
    for (given, field, value) in cases {
        let result = engine.handle(
            &mut store,
            &wid("bad"),
            Event::new("start_as_given", given.clone()),
            T0,
        );
        match result {
            Err(Error::InvalidInput {
                field: f, value: v, ..
            }) => assert_eq!((f, v.as_str()), (field, value), "{given}"),
            other => panic!("{given}: expected InvalidInput, got {other:?}"),
        }
    }
    // A schedule's payload is stored inside its `schedule_fired` event's payload, one level down.
    let deep = schedule("s", every(1_000), nested(64), once);
    let decision = Decision::new().schedule(Schedule::deserialize(&deep).unwrap());
    let err = Commit::new(
        wid("bad"),
        Seq::ZERO,
        Event::new("e", json!({})),
        decision,
        T0,
    )
    .unwrap_err();
    assert_eq!(err.code(), "INVALID_INPUT", "{err}");
    assert!(err.to_string().contains("schedules[0].payload"), "{err}");
    // A name is one schedule: one decision cannot start it twice (both would run).
    let twice = Decision::new()
        .schedule(Schedule::every("report", Duration::from_secs(60)))
        .schedule(Schedule::every("report", Duration::from_secs(90)));
    let err =
        Commit::new(wid("bad"), Seq::ZERO, Event::new("e", json!({})), twice, T0).unwrap_err();
    assert!(
        matches!(&err, Error::InvalidInput { field: "schedule.name", value, .. } if value == "report"),
        "{err}"
    );
    let store = h.reopen(store);
    assert!(store.load(&wid("bad")).unwrap().is_empty());
    assert!(store.timers(&wid("bad")).unwrap().is_empty());
}
