//! Cases on limits, heartbeats and refused timers (DESIGN rules 7, 11, 13).

use super::*;

/// Every JSON value a commit writes is checked against the limits (DESIGN rule 13): an event, command
/// or timer payload past them is refused naming its path, and nothing is written; a value at the
/// limits is written and reads back, after a reopen too.
pub fn payloads_over_the_limits_are_refused_naming_their_path<H: Harness>(h: &mut H) {
    let mut store = h.open();
    let deepest = nested(64);
    let over = nested(65);
    let cases = [
        (
            Event::new("e", over.clone()),
            Decision::none(),
            "event.payload",
        ),
        (
            Event::new("e", json!({})),
            Decision::new()
                .command(Command::new("a", json!({})))
                .command(Command::new("b", over.clone())),
            "commands[1].payload",
        ),
        (
            Event::new("e", json!({})),
            Decision::new().timer(Timer::after("t", Duration::ZERO, over.clone())),
            "timers[0].payload",
        ),
        (
            Event::new("e", json!("x".repeat(1 << 20))),
            Decision::none(),
            "event.payload",
        ),
    ];
    for (event, decision, path) in cases {
        let err = Commit::new(wid("w"), Seq::ZERO, event, decision, T0).unwrap_err();
        assert_eq!(err.code(), "INVALID_INPUT", "{path}: {err}");
        assert!(err.to_string().contains(path), "{path}: {err}");
    }
    let engine = Engine::new(Saga);
    let err = engine
        .handle(&mut store, &wid("w"), Event::new("start", over), T0)
        .unwrap_err();
    assert!(err.to_string().contains("event.payload"), "{err}");
    assert!(store.load(&wid("w")).unwrap().is_empty(), "nothing written");
    assert!(store.pending(10).unwrap().is_empty());

    // A timer's payload is stored inside its `timer_fired` event's payload, one level down.
    let err = Commit::new(
        wid("w"),
        Seq::ZERO,
        Event::new("e", json!({})),
        Decision::new().timer(Timer::after("t", Duration::ZERO, deepest.clone())),
        T0,
    )
    .unwrap_err();
    assert!(err.to_string().contains("timers[0].payload"), "{err}");
    let decision = Decision::new()
        .command(Command::new("deep", deepest.clone()))
        .timer(Timer::after("deep", Duration::ZERO, nested(63)));
    let commit = Commit::new(
        wid("w"),
        Seq::ZERO,
        Event::new("e", deepest.clone()),
        decision,
        T0,
    )
    .unwrap();
    store.append_with_commands(&commit).unwrap();
    let mut store = h.reopen(store);
    assert_eq!(store.load(&wid("w")).unwrap()[0].payload, deepest);
    let claimed = claim(&mut store, "w1", 10, 1_000, T0);
    assert_eq!(claimed[0].payload, deepest, "claims read what was written");
    let timers = store.claim_timers(10, Duration::from_secs(1), T0).unwrap();
    assert_eq!(timers[0].event_payload["payload"], nested(63));
    let fired = Engine::new(Saga)
        .fire(&mut store, &timers[0], T0)
        .unwrap()
        .expect("a timer at the limit fires");
    assert_eq!(fired.seq.get(), 2);
}

/// A heartbeat never shortens a lease: an `extend` from a clock behind the one that set the lease
/// keeps the later expiry.
pub fn extend_never_shortens_a_lease<H: Harness>(h: &mut H) {
    let mut store = h.open();
    append(&mut store, "w", &["x"]);
    let d = claim(&mut store, "w1", 1, 10_000, T0);
    let until = store
        .extend(
            &d[0].command_id,
            d[0].token,
            Duration::from_millis(1_000),
            T0,
        )
        .unwrap();
    assert_eq!(
        until.expires_at,
        at(10_000),
        "a shorter extension keeps the lease"
    );
    let until = store
        .extend(
            &d[0].command_id,
            d[0].token,
            Duration::from_millis(1_000),
            Timestamp::from_millis(0),
        )
        .unwrap();
    assert_eq!(
        until.expires_at,
        at(10_000),
        "a lagging clock keeps the lease"
    );
    assert!(claim(&mut store, "w2", 1, 1_000, at(9_999)).is_empty());
    let until = store
        .extend(
            &d[0].command_id,
            d[0].token,
            Duration::from_millis(20_000),
            T0,
        )
        .unwrap();
    assert_eq!(until.expires_at, at(20_000));
}

/// A workflow that refuses a timer's event ends the timer `rejected` with the reason: it is not taken
/// again, its event is not written, and the firer gets the rejection. A timer is not fired before its
/// time.
pub fn rejected_timers_end_rejected_and_are_not_taken_again<H: Harness>(h: &mut H) {
    struct Refuses;
    impl Workflow for Refuses {
        type State = ();
        fn evolve(&self, _: &mut (), _: &EventRecord) {}
        fn decide(&self, _: &(), event: &EventRecord) -> Decision {
            match event.kind.as_str() {
                "start" => Decision::new()
                    .timer(Timer::after("late", Duration::from_millis(100), json!({})))
                    .timer(Timer::after("ok", Duration::from_millis(100), json!({}))),
                TIMER_FIRED if event.payload["name"] == "late" => {
                    Decision::reject("the order is already closed")
                }
                _ => Decision::none(),
            }
        }
    }
    let mut store = h.open();
    let engine = Engine::new(Refuses);
    engine
        .handle(&mut store, &wid("o"), Event::new("start", json!({})), T0)
        .unwrap();
    let scheduled = store.timers(&wid("o")).unwrap();
    let err = engine.fire(&mut store, &scheduled[0], at(99)).unwrap_err();
    assert_eq!(err.code(), "INVALID_INPUT", "not due yet: {err}");
    assert_eq!(kinds(&store, "o"), ["start"]);

    let due = store
        .claim_timers(10, Duration::from_millis(50), at(100))
        .unwrap();
    assert_eq!(due.len(), 2);
    let err = engine.fire(&mut store, &due[0], at(100)).unwrap_err();
    assert_eq!(err.code(), "REJECTED");
    engine
        .fire(&mut store, &due[1], at(100))
        .unwrap()
        .expect("the other timer fires");
    let store = h.reopen(store);
    let timers = store.timers(&wid("o")).unwrap();
    assert_eq!(timers[0].status, TimerStatus::Rejected);
    assert_eq!(
        timers[0].last_error.as_deref(),
        Some("the order is already closed")
    );
    assert_eq!(timers[0].processed_at, Some(at(100)));
    assert_eq!(timers[1].status, TimerStatus::Fired);
    let mut store = store;
    assert!(
        store
            .claim_timers(10, Duration::from_millis(50), at(1_000_000))
            .unwrap()
            .is_empty(),
        "a rejected timer is not taken again"
    );
    assert_eq!(kinds(&store, "o"), ["start", TIMER_FIRED]);
    assert!(matches!(
        store.reject_timer(&timers[1].timer_id, "again", at(200)),
        Err(Error::TimerNotScheduled { .. })
    ));
}
