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

/// A heartbeat's `extend_all` answers each lease, in order, as `extend` answers it alone: a live
/// lease is extended (a longer one kept, never shortened), a cancelled command's holder is told, a
/// lost lease (a token that is not the current one), an unknown command and a finished command are
/// refused; the rows end as `extend` one by one leaves them, and a refused lease is not extended.
pub fn extend_all_answers_each_lease_as_extend_does<H: Harness>(h: &mut H) {
    let mut store = h.open();
    // Two workflows alike: `a`'s leases are extended in one call, `b`'s one by one.
    let kinds = ["short", "long", "lost", "done", "withdrawn"];
    for w in ["a", "b"] {
        let seq = append(&mut store, w, &kinds);
        let claimed = claim(&mut store, "w1", 10, 1_000, T0);
        let token = |index: u32| {
            claimed
                .iter()
                .find(|d| d.command_id == cid(&format!("{w}:1:{index}")))
                .map(|d| d.token)
                .expect("claimed")
        };
        let long = store
            .extend(
                &cid(&format!("{w}:1:1")),
                token(1),
                Duration::from_millis(60_000),
                T0,
            )
            .unwrap();
        assert_eq!(long.expires_at, at(60_000));
        store
            .complete(&cid(&format!("{w}:1:3")), token(3), None, T0)
            .unwrap();
        // The workflow withdraws the last one while it is leased: its holder is to be told.
        let withdraw = Decision::new().cancel_command(cid(&format!("{w}:1:4")));
        let commit = Commit::new(wid(w), seq, Event::new("withdraw", json!({})), withdraw, T0);
        store.append_with_commands(&commit.unwrap()).unwrap();
    }
    assert!(store
        .extend_all(&[], Duration::from_millis(2_000), at(500))
        .unwrap()
        .is_empty());
    let token = |id: &str| store.command(&cid(id)).unwrap().expect("row").token();
    // Out of claim order, with one command twice, so that an answer in the wrong place shows.
    let leases = |w: &str| {
        let id = |index: u32| cid(&format!("{w}:1:{index}"));
        vec![
            (id(1), token(&format!("{w}:1:1"))),
            (id(9), 1),
            (id(0), token(&format!("{w}:1:0"))),
            (id(2), token(&format!("{w}:1:2")) + 1),
            (id(3), token(&format!("{w}:1:3"))),
            (id(4), token(&format!("{w}:1:4"))),
            (id(0), token(&format!("{w}:1:0"))),
        ]
    };
    let (a, b) = (leases("a"), leases("b"));
    let ttl = Duration::from_millis(2_000);
    let answer = |result: Result<crate::Extended, Error>| match result {
        Ok(extended) => Ok((extended.expires_at, extended.cancel_requested)),
        Err(error) => Err(error.code()),
    };
    let together: Vec<_> = store
        .extend_all(&a, ttl, at(500))
        .expect("the write succeeds")
        .into_iter()
        .map(answer)
        .collect();
    let one_by_one: Vec<_> = b
        .iter()
        .map(|(id, token)| answer(store.extend(id, *token, ttl, at(500))))
        .collect();
    assert_eq!(together, one_by_one, "each answer as extend gives it");
    assert_eq!(
        together,
        [
            Ok((at(60_000), false)),
            Err("NOT_FOUND"),
            Ok((at(2_500), false)),
            Err("STALE_LEASE"),
            Err("STALE_LEASE"),
            Ok((at(2_500), true)),
            Ok((at(2_500), false)),
        ]
    );
    let row = |id: &str| {
        let row = store.command(&cid(id)).unwrap().expect("row");
        let expires = row.lease.as_ref().map(|lease| lease.expires_at);
        (
            row.status,
            row.token(),
            row.attempts,
            row.available_at,
            expires,
            row.cancel_requested,
        )
    };
    for index in 0..5 {
        let (in_a, in_b) = (format!("a:1:{index}"), format!("b:1:{index}"));
        assert_eq!(row(&in_a), row(&in_b), "{in_a} as {in_b}");
    }
    assert_eq!(row("a:1:1").4, Some(at(60_000)), "the longer lease is kept");
    assert_eq!(
        row("a:1:2").4,
        Some(at(1_000)),
        "the lost lease is not extended"
    );
    assert_eq!(
        row("a:1:3").0,
        Status::Done,
        "the finished command is left alone"
    );
    // Only the commands whose lease was not extended are free for another worker.
    let rival: Vec<String> = claim(&mut store, "w2", 10, 1_000, at(2_499))
        .iter()
        .map(|d| d.command_id.to_string())
        .collect();
    assert_eq!(rival, ["a:1:2", "b:1:2"]);
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
