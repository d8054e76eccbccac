//! Cases on timers and compensation (DESIGN rules 11–12).

use super::*;

/// A decision's timers are written in its commit, with deterministic IDs; a failed commit leaves none.
pub fn timers_are_scheduled_in_the_commit<H: Harness>(h: &mut H) {
    let mut store = h.open();
    let engine = Engine::new(Saga);
    let handled = engine
        .handle(&mut store, &wid("trip"), Event::new("start", json!({})), T0)
        .unwrap();
    let ids: Vec<String> = handled.timer_ids.iter().map(ToString::to_string).collect();
    assert_eq!(ids, ["trip:1:t0", "trip:1:t1"]);
    let store = h.reopen(store);
    let timers = store.timers(&wid("trip")).unwrap();
    assert_eq!(
        timer_states(&store, "trip"),
        [
            "trip:1:t0 deadline scheduled",
            "trip:1:t1 reminder scheduled"
        ]
    );
    assert_eq!((timers[0].fire_at, timers[1].fire_at), (at(1_000), at(500)));
    assert_eq!(timers[0].event_kind, TIMER_FIRED);
    assert_eq!(
        timers[0].event_payload,
        json!({ "timer_id": "trip:1:t0", "name": "deadline", "payload": { "why": "too slow" } })
    );
    let mut store = store;
    h.fail_commits_with_command_kind(&mut store, "explode");
    let decision = Decision::new()
        .command(Command::new("explode", json!({})))
        .timer(Timer::after("x", Duration::ZERO, json!({})));
    let commit = Commit::new(
        wid("trip"),
        Seq::new(1).unwrap(),
        Event::new("e", json!({})),
        decision,
        T0,
    )
    .unwrap();
    assert!(store.append_with_commands(&commit).is_err());
    assert_eq!(
        store.timers(&wid("trip")).unwrap().len(),
        2,
        "no timer of the failed commit"
    );
}

/// A timer is not taken before its time, fires its event through decide exactly once, also after a
/// restart, and firing it again writes nothing.
pub fn timers_fire_once_not_before_their_time<H: Harness>(h: &mut H) {
    let mut store = h.open();
    let engine = Engine::new(Saga);
    engine
        .handle(&mut store, &wid("trip"), Event::new("start", json!({})), T0)
        .unwrap();
    assert!(store
        .claim_timers(10, Duration::from_millis(100), at(499))
        .unwrap()
        .is_empty());
    // No limit at all is a limit too: every due timer, and nothing reserved for the rest.
    let due = store
        .claim_timers(usize::MAX, Duration::from_millis(100), at(500))
        .unwrap();
    assert_eq!(
        due.iter()
            .map(|t| t.timer_id.to_string())
            .collect::<Vec<_>>(),
        ["trip:1:t1"]
    );
    let fired = engine
        .fire(&mut store, &due[0], at(501))
        .unwrap()
        .expect("fires");
    assert_eq!(fired.seq.get(), 2);
    assert_eq!(
        fired.command_ids,
        [cid("trip:2:0")],
        "the fired event was decided on"
    );
    assert_eq!(
        engine.fire(&mut store, &due[0], at(502)).unwrap(),
        None,
        "a timer fires once"
    );
    let mut store = h.reopen(store);
    assert!(store
        .claim_timers(10, Duration::from_millis(100), at(999))
        .unwrap()
        .is_empty());
    let due = store
        .claim_timers(10, Duration::from_millis(100), at(1_000))
        .unwrap();
    assert_eq!(due.len(), 1, "after a restart the deadline is still there");
    assert!(
        store
            .claim_timers(10, Duration::from_millis(100), at(1_050))
            .unwrap()
            .is_empty(),
        "taken: others wait"
    );
    engine
        .fire(&mut store, &due[0], at(1_000))
        .unwrap()
        .expect("fires");
    assert!(store
        .claim_timers(10, Duration::from_millis(100), at(1_000_000))
        .unwrap()
        .is_empty());
    assert_eq!(kinds(&store, "trip"), ["start", TIMER_FIRED, TIMER_FIRED]);
    assert_eq!(
        timer_states(&store, "trip"),
        ["trip:1:t0 deadline fired", "trip:1:t1 reminder fired"]
    );
    let event = &store.load(&wid("trip")).unwrap()[2];
    assert_eq!(event.payload["timer_id"], "trip:1:t0");
}

/// A cancelled timer never fires; a decision can cancel a name and schedule it again.
pub fn cancelled_timers_never_fire<H: Harness>(h: &mut H) {
    let mut store = h.open();
    let engine = Engine::new(Saga);
    engine
        .handle(&mut store, &wid("trip"), Event::new("start", json!({})), T0)
        .unwrap();
    let stale = store
        .claim_timers(10, Duration::from_millis(1), at(1_000))
        .unwrap();
    engine
        .handle(
            &mut store,
            &wid("trip"),
            Event::new("reschedule", json!({})),
            at(10),
        )
        .unwrap();
    assert_eq!(
        timer_states(&store, "trip"),
        [
            "trip:1:t0 deadline cancelled",
            "trip:1:t1 reminder fired",
            "trip:2:t0 deadline scheduled"
        ]
        .map(|s| if s.contains("reminder") {
            "trip:1:t1 reminder scheduled"
        } else {
            s
        })
    );
    let deadline = stale.iter().find(|t| t.name == "deadline").unwrap();
    assert_eq!(
        engine.fire(&mut store, deadline, at(1_001)).unwrap(),
        None,
        "a cancelled timer does not fire"
    );
    let due: Vec<String> = store
        .claim_timers(10, Duration::from_millis(1), at(1_000_000))
        .unwrap()
        .iter()
        .map(|t| t.timer_id.to_string())
        .collect();
    assert_eq!(due, ["trip:1:t1", "trip:2:t0"]);
    assert_eq!(kinds(&store, "trip"), ["start", "reschedule"]);
}

/// Two firers racing on one timer commit one event: the loser's commit writes nothing.
pub fn racing_firers_commit_one_event<H: Harness>(h: &mut H) {
    let mut store = h.open();
    let engine = Engine::new(Saga);
    engine
        .handle(&mut store, &wid("trip"), Event::new("start", json!({})), T0)
        .unwrap();
    let first = store
        .claim_timers(1, Duration::from_millis(100), at(600))
        .unwrap()
        .remove(0);
    // The first firer stalls; its take runs out and a second firer takes the same timer.
    let second = store
        .claim_timers(1, Duration::from_millis(100), at(700))
        .unwrap()
        .remove(0);
    assert_eq!(first.timer_id, second.timer_id);
    // Both replayed before either committed: the first commit wins, the second is stale.
    let replayed = engine.replay(&store, &wid("trip")).unwrap();
    assert!(engine.fire(&mut store, &second, at(701)).unwrap().is_some());
    let stale = Commit::new(
        wid("trip"),
        replayed.last_seq,
        Event::new(TIMER_FIRED, first.event_payload.clone()),
        Decision::none(),
        at(702),
    )
    .unwrap()
    .firing(first.timer_id.clone())
    .unwrap();
    assert!(matches!(
        store.append_with_commands(&stale),
        Err(Error::Conflict { .. })
    ));
    let fresh = Commit::new(
        wid("trip"),
        Seq::new(2).unwrap(),
        Event::new(TIMER_FIRED, first.event_payload.clone()),
        Decision::none(),
        at(702),
    )
    .unwrap()
    .firing(first.timer_id.clone())
    .unwrap();
    assert!(matches!(
        store.append_with_commands(&fresh),
        Err(Error::TimerNotScheduled {
            status: "fired",
            ..
        })
    ));
    assert_eq!(engine.fire(&mut store, &first, at(703)).unwrap(), None);
    assert_eq!(kinds(&store, "trip"), ["start", TIMER_FIRED]);
    assert_eq!(
        store.commands(&wid("trip")).unwrap().len(),
        2,
        "book, and one on_timer"
    );
}

/// Starts the saga `trip` in `store` at `T0` and fails its booking for good at `at(1)` with `error`:
/// the booking is dead, its `command_failed` scheduled. Returns the booking's delivery.
fn a_dead_booking<S: Store>(store: &mut S, engine: &Engine<Saga>, error: &str) -> crate::Delivery {
    engine
        .handle(store, &wid("trip"), Event::new("start", json!({})), T0)
        .unwrap();
    let book = claim(store, "w1", 1, 1_000, T0).remove(0);
    store
        .fail(
            &book.command_id,
            book.token,
            &Failure::permanent(error),
            &policy(),
            at(1),
        )
        .unwrap();
    book
}

/// A dead command retried before its `command_failed` was fed back takes that feedback back: the
/// workflow never hears of the failure, so it compensates nothing, and the retried delivery's
/// success is the only outcome it learns. A death fed back already stays fed back.
pub fn a_retry_withdraws_the_failure_not_yet_fed_back<H: Harness>(h: &mut H) {
    let mut store = h.open();
    let engine = Engine::new(Saga);
    let book = a_dead_booking(&mut store, &engine, "503 for now");
    store.retry(&book.command_id, at(2)).unwrap();
    let mut store = h.reopen(store);
    assert_eq!(
        timer_states(&store, "trip")[0],
        "trip:1:0:failed1 command_failed cancelled"
    );
    let due = store
        .claim_timers(10, Duration::from_millis(100), at(3))
        .unwrap();
    assert!(due.is_empty(), "nothing to feed back: {due:?}");
    let again = claim(&mut store, "w1", 10, 1_000, at(3))
        .into_iter()
        .find(|d| d.command_id == book.command_id)
        .expect("retried");
    store
        .complete(&again.command_id, again.token, None, at(4))
        .unwrap();
    assert_eq!(kinds(&store, "trip"), ["start"], "no compensation");

    // Fed back before the retry: the workflow knew, and the retry leaves that as it was.
    let mut store = h.open();
    let book = a_dead_booking(&mut store, &engine, "422");
    let due = store
        .claim_timers(10, Duration::from_millis(100), at(2))
        .unwrap();
    engine.fire(&mut store, &due[0], at(2)).unwrap().unwrap();
    store.retry(&book.command_id, at(3)).unwrap();
    assert_eq!(
        timer_states(&store, "trip")[0],
        "trip:1:0:failed1 command_failed fired"
    );
    assert_eq!(kinds(&store, "trip"), ["start", COMMAND_FAILED]);
}

/// A command that becomes dead feeds one `command_failed` event back, whose decision compensates; a
/// second death after a retry feeds a second one; resolving by hand feeds `command_resolved`; a lease
/// that runs out on the last attempt counts as a death too.
pub fn failure_feedback_is_committed_exactly_once<H: Harness>(h: &mut H) {
    let mut store = h.open();
    let engine = Engine::new(Saga);
    let book = a_dead_booking(&mut store, &engine, "422 no rooms");
    let feedback: Vec<TimerRow> = store
        .timers(&wid("trip"))
        .unwrap()
        .into_iter()
        .filter(|t| t.event_kind == COMMAND_FAILED)
        .collect();
    assert_eq!(feedback.len(), 1);
    assert_eq!(feedback[0].timer_id.to_string(), "trip:1:0:failed1");
    assert_eq!(feedback[0].fire_at, at(1), "due at once");
    assert_eq!(
        feedback[0].event_payload,
        json!({ "command_id": "trip:1:0", "kind": "book", "error": "422 no rooms", "attempts": 1 })
    );
    let due = store
        .claim_timers(10, Duration::from_millis(100), at(2))
        .unwrap();
    assert_eq!(due.len(), 1, "the deadline is not due yet; the feedback is");
    let compensated = engine.fire(&mut store, &due[0], at(2)).unwrap().unwrap();
    assert_eq!(compensated.command_ids, [cid("trip:2:0")]);
    assert_eq!(
        store.command(&cid("trip:2:0")).unwrap().unwrap().kind,
        "compensate"
    );
    assert_eq!(
        engine.fire(&mut store, &due[0], at(3)).unwrap(),
        None,
        "exactly once"
    );
    assert_eq!(
        timer_states(&store, "trip")[..2],
        [
            "trip:1:0:failed1 command_failed fired".to_owned(),
            "trip:1:t0 deadline cancelled".to_owned()
        ]
    );

    store.retry(&book.command_id, at(10)).unwrap();
    let again = claim(&mut store, "w1", 10, 1_000, at(10))
        .into_iter()
        .find(|d| d.command_id == book.command_id)
        .expect("retried");
    assert_eq!(again.attempt, 1);
    store
        .fail(
            &again.command_id,
            again.token,
            &Failure::permanent("still no rooms"),
            &policy(),
            at(11),
        )
        .unwrap();
    store
        .resolve(&book.command_id, "refunded by phone", at(12))
        .unwrap();
    let ids: Vec<String> = store
        .timers(&wid("trip"))
        .unwrap()
        .iter()
        .map(|t| t.timer_id.to_string())
        .filter(|id| !id.contains(":t"))
        .collect();
    assert_eq!(
        ids,
        ["trip:1:0:failed1", "trip:1:0:failed2", "trip:1:0:resolved"]
    );

    // A worker that keeps dying on a command: the last lease runs out, the command is dead, with feedback.
    let mut store = h.open();
    append(&mut store, "crashy", &["x"]);
    let request = ClaimRequest::new("w")
        .lease_ttl(Duration::from_millis(10))
        .retry_policy(&RetryPolicy::default().max_attempts(1));
    store.claim(&request, T0).unwrap();
    assert!(store.claim(&request, at(10)).unwrap().is_empty());
    let timers = store.timers(&wid("crashy")).unwrap();
    assert_eq!(timers.len(), 1);
    assert_eq!(timers[0].event_kind, COMMAND_FAILED);
    assert!(timers[0].event_payload["error"]
        .as_str()
        .unwrap()
        .contains("lease expired"));
}
