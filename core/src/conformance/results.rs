//! Cases on results fed back and withdrawn commands (DESIGN rules 15–16).

use super::*;

/// An order: placing it books a flight (asking for its reference) and a hotel, and sends a plain
/// notice; a `cancel` event withdraws the hotel by kind and the notice by ID; the flight's result is
/// kept in state.
struct Order;

#[derive(Default)]
struct OrderState {
    reference: Option<Value>,
    completions: u32,
}

impl Workflow for Order {
    type State = OrderState;

    fn evolve(&self, state: &mut OrderState, event: &EventRecord) {
        if let Some(Ok(done)) = event.decode::<CommandCompleted>() {
            state.completions += 1;
            if done.kind == "book_flight" {
                state.reference = Some(done.result);
            }
        }
    }

    fn decide(&self, _: &OrderState, event: &EventRecord) -> Decision {
        match event.kind.as_str() {
            "placed" => Decision::new()
                .command(Command::new("book_flight", json!({ "to": "成都" })).report_result())
                .command(Command::new("book_hotel", json!({})))
                .command(Command::new("notify", json!({}))),
            "cancel" => Decision::new()
                .cancel_commands_of_kind("book_hotel")
                .cancel_command(cid(&format!("{}:1:2", event.workflow_id))),
            _ => Decision::none(),
        }
    }
}

/// Fires every due `command_completed` feedback of `store` at `now`; returns how many fired.
fn fire_feedback<S: Store>(store: &mut S, now: Timestamp) -> usize {
    let engine = Engine::new(Order);
    let due = store
        .claim_timers(100, Duration::from_secs(1), now)
        .unwrap();
    due.iter()
        .filter(|timer| engine.fire(store, timer, now).unwrap().is_some())
        .count()
}

/// A command that asks for its result feeds exactly one `command_completed` event — command ID,
/// kind, result, attempts — back into its workflow, scheduled in the transaction of its ack; a plain
/// command's ack feeds nothing back; a stale or repeated ack records nothing (DESIGN rule 15).
pub fn completions_feed_results_back_exactly_once<H: Harness>(h: &mut H) {
    let mut store = h.open();
    let engine = Engine::new(Order);
    let order = wid("order-1");
    engine
        .handle(&mut store, &order, Event::new("placed", json!({})), T0)
        .unwrap();
    let first = claim(&mut store, "w1", 3, 100, T0);
    assert!(store.commands(&order).unwrap()[0].report_result);
    // The first lease runs out; a second worker delivers and acks with the reference.
    let second = claim(&mut store, "w2", 1, 100, at(100));
    assert_eq!(second[0].command_id, cid("order-1:1:0"));
    let reference = json!({ "reference": "REF-1" });
    store
        .complete(
            &second[0].command_id,
            second[0].token,
            Some(&reference),
            at(150),
        )
        .unwrap();
    let late = store.complete(
        &first[0].command_id,
        first[0].token,
        Some(&json!("late")),
        at(160),
    );
    assert!(matches!(late, Err(Error::StaleLease { .. })), "{late:?}");
    assert!(store
        .complete(
            &second[0].command_id,
            second[0].token,
            Some(&reference),
            at(170)
        )
        .is_err());
    // Plain commands: completed with or without a result, nothing is fed back.
    store
        .complete(
            &first[1].command_id,
            first[1].token,
            Some(&json!({ "room": 7 })),
            at(180),
        )
        .unwrap();
    store
        .complete(&first[2].command_id, first[2].token, None, at(180))
        .unwrap();

    let mut store = h.reopen(store);
    let rows = store.commands(&order).unwrap();
    assert_eq!(rows[0].result, Some(reference.clone()));
    assert_eq!(rows[1].result, Some(json!({ "room": 7 })));
    let feedback: Vec<String> = store
        .timers(&order)
        .unwrap()
        .iter()
        .map(|t| format!("{} {}", t.timer_id, t.event_kind))
        .collect();
    assert_eq!(feedback, ["order-1:1:0:completed command_completed"]);
    assert_eq!(fire_feedback(&mut store, at(200)), 1);
    assert_eq!(fire_feedback(&mut store, at(300)), 0, "exactly once");
    let events = store.load(&order).unwrap();
    assert_eq!(events.len(), 2);
    let done = events[1].decode::<CommandCompleted>().unwrap().unwrap();
    assert_eq!(
        done,
        CommandCompleted {
            command_id: cid("order-1:1:0"),
            kind: "book_flight".into(),
            result: reference.clone(),
            attempts: 2,
        }
    );
    let state = engine.replay(&store, &order).unwrap().state;
    assert_eq!(state.reference, Some(reference));
    assert_eq!(state.completions, 1);
    // A result past the JSON limits is refused, and the command stays leased.
    engine
        .handle(
            &mut store,
            &wid("order-2"),
            Event::new("placed", json!({})),
            T0,
        )
        .unwrap();
    let d = claim(&mut store, "w3", 1, 1_000, at(400));
    let deep = nested(65);
    let err = store
        .complete(&d[0].command_id, d[0].token, Some(&deep), at(401))
        .unwrap_err();
    assert_eq!(err.code(), "INVALID_INPUT", "{err}");
    assert_eq!(status(&store, "order-2:1:0"), Status::Leased);
    // So is one within the limits that leaves no room for the `command_completed` event around it;
    // one at the limits of a value fed back is kept, and its event fires.
    let limits = JsonLimits::fed_back();
    let no_room = json!("x".repeat(limits.max_bytes));
    let err = store
        .complete(&d[0].command_id, d[0].token, Some(&no_room), at(401))
        .unwrap_err();
    assert!(
        err.code() == "INVALID_INPUT" && err.to_string().contains("result"),
        "{err}"
    );
    let fits = json!("x".repeat(limits.max_bytes - 2));
    store
        .complete(&d[0].command_id, d[0].token, Some(&fits), at(402))
        .unwrap();
    assert_eq!(fire_feedback(&mut store, at(403)), 1);
    let completed = store.load(&wid("order-2")).unwrap().pop().unwrap();
    let completed = completed.decode::<CommandCompleted>().unwrap().unwrap();
    assert_eq!(completed.result, fits);
}

/// A decision withdraws earlier commands of its workflow (DESIGN rule 16): not yet delivered, they
/// become `cancelled` and are never handed out; being delivered, they are marked, the holder's
/// heartbeat learns it, and the real outcome is still recorded — a completion is fed back, a
/// retryable failure leaves it cancelled (on its last attempt too), a lease that runs out does too. Finished commands and other
/// workflows' commands are left alone.
pub fn cancelled_commands_are_never_delivered<H: Harness>(h: &mut H) {
    let mut store = h.open();
    let engine = Engine::new(Order);
    for n in 1..=4 {
        engine
            .handle(
                &mut store,
                &wid(&format!("o{n}")),
                Event::new("placed", json!({})),
                T0,
            )
            .unwrap();
    }
    // o1: nothing delivered yet. o2: hotel and notice leased. o3: hotel leased, then its lease runs
    // out. o4: hotel done before the cancel.
    let strict = |worker: &str| {
        ClaimRequest::new(worker)
            .limit(100)
            .lease_ttl(Duration::from_millis(1_000))
    };
    let all = store.claim(&strict("w1"), T0).unwrap();
    let held = |workflow: &str, index: u32| {
        all.iter()
            .find(|d| d.command_id == cid(&format!("{workflow}:1:{index}")))
            .cloned()
            .expect("claimed")
    };
    for d in all
        .iter()
        .filter(|d| d.command_id.workflow_id().as_str() == "o1")
    {
        store.release(&d.command_id, d.token, T0).unwrap();
    }
    let o4_hotel = held("o4", 1);
    store
        .complete(&o4_hotel.command_id, o4_hotel.token, None, at(10))
        .unwrap();

    for n in 1..=4 {
        engine
            .handle(
                &mut store,
                &wid(&format!("o{n}")),
                Event::new("cancel", json!({})),
                at(20),
            )
            .unwrap();
    }
    let mut store = h.reopen(store);
    for id in ["o1:1:1", "o1:1:2"] {
        assert_eq!(status(&store, id), Status::Cancelled, "{id}");
    }
    assert_eq!(status(&store, "o1:1:0"), Status::Pending, "not cancelled");
    assert_eq!(
        status(&store, "o4:1:1"),
        Status::Done,
        "finished: left alone"
    );
    assert_eq!(status(&store, "o4:1:2"), Status::Leased);
    let row = store.command(&cid("o2:1:1")).unwrap().unwrap();
    assert!(row.cancel_requested && row.status == Status::Leased);
    assert!(!pending_ids(&store).contains(&"o1:1:1".to_owned()));

    // The heartbeat tells the holder; its completion is still recorded and fed back.
    let o2_hotel = held("o2", 1);
    let extended = store
        .extend(
            &o2_hotel.command_id,
            o2_hotel.token,
            Duration::from_millis(1_000),
            at(30),
        )
        .unwrap();
    assert!(extended.cancel_requested);
    let o2_notice = held("o2", 2);
    let not_cancelled = store
        .extend(
            &held("o2", 0).command_id,
            held("o2", 0).token,
            Duration::from_millis(1_000),
            at(30),
        )
        .unwrap();
    assert!(!not_cancelled.cancel_requested);
    store
        .complete(
            &o2_hotel.command_id,
            o2_hotel.token,
            Some(&json!("booked anyway")),
            at(40),
        )
        .unwrap();
    // A retryable failure of a cancelled command leaves it cancelled, on its last allowed attempt
    // too (nothing fed back); a permanent one is dead.
    let settled = store
        .fail(
            &o2_notice.command_id,
            o2_notice.token,
            &Failure::retryable("503"),
            &policy().max_attempts(1),
            at(40),
        )
        .unwrap();
    assert_eq!(settled, Settled::Cancelled);
    let o3_notice = held("o3", 2);
    let settled = store
        .fail(
            &o3_notice.command_id,
            o3_notice.token,
            &Failure::permanent("422"),
            &policy(),
            at(40),
        )
        .unwrap();
    assert_eq!(settled, Settled::Dead);
    // o3's hotel: its lease runs out; the next claim withdraws it instead of delivering it.
    let later = store.claim(&strict("w2"), at(5_000)).unwrap();
    let again: Vec<String> = later.iter().map(|d| d.command_id.to_string()).collect();
    assert!(
        !again
            .iter()
            .any(|id| id.ends_with(":1:1") || id.ends_with(":1:2")),
        "{again:?}"
    );
    assert_eq!(status(&store, "o3:1:1"), Status::Cancelled);
    assert_eq!(status(&store, "o2:1:1"), Status::Done);
    assert_eq!(status(&store, "o2:1:2"), Status::Cancelled);
    assert_eq!(status(&store, "o3:1:2"), Status::Dead);
    assert!(matches!(
        store.mark_done(&cid("o1:1:1"), at(6_000)),
        Err(Error::InvalidState { .. })
    ));
    // The completion of the cancelled hotel comes back to o2, though it did not ask for it.
    let mut store = h.reopen(store);
    fire_feedback(&mut store, at(6_000));
    let kinds = kinds(&store, "o2");
    assert_eq!(kinds, ["placed", "cancel", COMMAND_COMPLETED]);
    let done = store.load(&wid("o2")).unwrap()[2]
        .decode::<CommandCompleted>()
        .unwrap()
        .unwrap();
    assert_eq!(
        (done.kind.as_str(), done.result),
        ("book_hotel", json!("booked anyway"))
    );
    // Cancelled rows are final: retention removes them like done rows.
    assert!(store.purge_done(Duration::ZERO, at(7_000), 100).unwrap() >= 3);
    assert!(store.command(&cid("o1:1:1")).unwrap().is_none());
    // A decision cancels only its own workflow's commands.
    let err = Commit::new(
        wid("o1"),
        Seq::new(2).unwrap(),
        Event::new("e", json!({})),
        Decision::new().cancel_command(cid("o2:1:0")),
        at(8_000),
    )
    .unwrap_err();
    assert_eq!(err.code(), "INVALID_INPUT", "{err}");
}

/// Stats count the timers not fired yet, feedback among them: a store whose commands are all done
/// is not idle while a `command_completed` is still to be recorded in its workflow, nor while a
/// workflow's own timer waits; it is idle once they fired.
pub fn stats_count_unfired_timers_and_feedback_until_everything_is_done<H: Harness>(h: &mut H) {
    let mut store = h.open();
    assert!(store.stats(T0).unwrap().is_idle(), "an empty store");
    let engine = Engine::new(Order);
    let order = wid("order-1");
    engine
        .handle(&mut store, &order, Event::new("placed", json!({})), T0)
        .unwrap();
    let reminder = Commit::new(
        wid("reminder"),
        Seq::ZERO,
        Event::new("set", json!({})),
        Decision::new().timer(Timer::at("ring", at(10_000), json!({}))),
        T0,
    )
    .unwrap();
    store.append_with_commands(&reminder).unwrap();
    let stats = store.stats(at(50)).unwrap();
    assert_eq!((stats.pending(), stats.timers.scheduled), (3, 1));
    assert!(!stats.is_idle());

    for delivery in claim(&mut store, "w", 3, 1_000, at(50)) {
        let result = json!({ "reference": "REF-1" });
        store
            .complete(&delivery.command_id, delivery.token, Some(&result), at(100))
            .unwrap();
    }
    let store = h.reopen(store);
    let stats = store.stats(at(200)).unwrap();
    assert_eq!((stats.pending(), stats.leased(), stats.dead()), (0, 0, 0));
    let timers = &stats.timers;
    assert_eq!(
        (timers.scheduled, timers.feedback, timers.due),
        (2, 1, 1),
        "book_flight's result and the reminder: {timers:?}"
    );
    assert_eq!(
        timers.next_at,
        Some(at(100)),
        "the feedback, due at its ack"
    );
    assert!(!stats.is_idle(), "a result still to be recorded: {stats:?}");

    let mut store = store;
    assert_eq!(fire_feedback(&mut store, at(200)), 1);
    let stats = store.stats(at(300)).unwrap();
    assert_eq!(
        (
            stats.timers.scheduled,
            stats.timers.feedback,
            stats.timers.due
        ),
        (1, 0, 0)
    );
    assert_eq!(stats.timers.next_at, Some(at(10_000)));
    assert!(!stats.is_idle(), "the reminder waits");

    let ring = store
        .claim_timers(10, Duration::from_secs(1), at(10_000))
        .unwrap();
    assert_eq!(ring.len(), 1);
    assert!(Engine::new(Order)
        .fire(&mut store, &ring[0], at(10_000))
        .unwrap()
        .is_some());
    let stats = store.stats(at(10_001)).unwrap();
    assert_eq!(stats.timers, crate::TimerStats::default());
    assert!(stats.is_idle(), "{stats:?}");
}
