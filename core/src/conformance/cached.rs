//! Cases on reading part of a history and on the engine's cached states (DESIGN rules 2–3).

use super::*;

/// `load_after` returns exactly the events after a seq, in seq order, as `load` does from there on.
pub fn load_after_returns_the_events_after_a_seq<H: Harness>(h: &mut H) {
    let mut store = h.open();
    let w = wid("w");
    append(&mut store, "w", &["a"]);
    append(&mut store, "other", &[]);
    let mut commit = Commit::new(
        w.clone(),
        Seq::ONE,
        Event::new("x", json!({ "n": 2 })),
        Decision::none(),
        at(1),
    )
    .unwrap();
    commit
        .push(Event::new("y", json!({ "n": 3 })), Decision::none())
        .unwrap();
    store.append_with_commands(&commit).unwrap();
    append(&mut store, "w", &[]);
    let check = |store: &H::Store| {
        let all = store.load(&w).unwrap();
        assert_eq!(seqs(&all), [1, 2, 3, 4]);
        for after in 0..=6 {
            let tail = store.load_after(&w, Seq::new(after).unwrap()).unwrap();
            let expected: Vec<EventRecord> = all
                .iter()
                .filter(|e| e.seq.get() > after)
                .cloned()
                .collect();
            assert_eq!(tail, expected, "load_after({w}, {after})");
        }
        assert_eq!(
            seqs(&store.load_after(&wid("other"), Seq::ZERO).unwrap()),
            [1]
        );
        assert!(store
            .load_after(&wid("nobody"), Seq::ZERO)
            .unwrap()
            .is_empty());
    };
    check(&store);
    let store = h.reopen(store);
    check(&store);
}

/// [`EventLog::append_after`], for a store that answers it: a commit after an event is written only
/// while that event, equal in every field, is its workflow's last, and then its events are kept as
/// the commit holds them; otherwise nothing is written. A store that does not answer writes nothing.
pub fn a_commit_after_an_event_is_written_only_while_it_is_the_last<H: Harness>(h: &mut H) {
    let mut store = h.open();
    let w = wid("w");
    append(&mut store, "w", &[]);
    let first = store.load(&w).unwrap().remove(0);
    let next = |expected: u64, n: i64| {
        Commit::new(
            w.clone(),
            Seq::new(expected).unwrap(),
            Event::new("next", json!({ "n": n, "x": 1.5 })),
            Decision::new().command(Command::new("c", json!({ "n": n }))),
            at(7),
        )
        .unwrap()
    };
    let commit = next(1, 1);
    let answer = store.append_after(&first, &commit);
    if matches!(answer, Ok(crate::AppendedAfter::Unchecked)) {
        assert_eq!(
            seqs(&store.load(&w).unwrap()),
            [1],
            "an unanswered call wrote"
        );
        return;
    }
    assert_eq!(answer.unwrap(), crate::AppendedAfter::Written);
    let events = store.load(&w).unwrap();
    assert_eq!(
        events[1..],
        commit.events()[..],
        "the events are kept as the commit holds them"
    );
    assert_eq!(store.commands(&w).unwrap().len(), 1);

    // `first` is no longer the last event.
    let refused = store.append_after(&first, &next(1, 2));
    assert!(
        matches!(refused, Err(Error::Conflict { .. })),
        "{refused:?}"
    );
    // An event at the last seq that differs from the stored one in any field.
    let second = events[1].clone();
    let mut others = vec![second.clone(), second.clone(), second.clone()];
    others[0].kind = "other".into();
    others[1].payload = json!({ "n": 1, "x": 2.5 });
    others[2].recorded_at = at(8);
    for other in &others {
        let refused = store.append_after(other, &next(2, 3));
        assert!(
            matches!(refused, Err(Error::Conflict { .. })),
            "{other:?}: {refused:?}"
        );
    }
    // An event of another workflow, or at another seq than the commit expects.
    let mut elsewhere = second.clone();
    elsewhere.workflow_id = wid("v");
    let refused = store.append_after(&elsewhere, &next(2, 3));
    assert!(
        matches!(refused, Err(Error::InvalidInput { .. })),
        "{refused:?}"
    );
    let refused = store.append_after(&first, &next(2, 3));
    assert!(
        matches!(refused, Err(Error::InvalidInput { .. })),
        "{refused:?}"
    );
    let store = h.reopen(store);
    assert_eq!(
        store.load(&w).unwrap(),
        events,
        "nothing refused was written"
    );
    assert_eq!(store.commands(&w).unwrap().len(), 1);
}

/// Sums the `n` of every event; decides one command carrying the sum and count it decided on.
struct Summer;

impl Workflow for Summer {
    type State = (i64, u64);

    fn evolve(&self, (sum, count): &mut (i64, u64), event: &EventRecord) {
        *sum += event.payload["n"].as_i64().unwrap_or(0);
        *count += 1;
    }

    fn decide(&self, (sum, count): &(i64, u64), _: &EventRecord) -> Decision {
        Decision::new().command(Command::new("sum", json!({ "sum": sum, "count": count })))
    }
}

/// Handles `n` on `w` and checks the decision was made on the state replay from the first event
/// gives.
fn handle_and_check<S: Store>(engine: &Engine<Summer>, store: &mut S, w: &str, n: i64) {
    let w = wid(w);
    let handled = engine
        .handle(store, &w, Event::new("add", json!({ "n": n })), T0)
        .unwrap();
    let events = store.load(&w).unwrap();
    let before = usize::try_from(handled.seq.get() - 1).unwrap();
    let (sum, count) = crate::replay(&Summer, &events[..before]).unwrap().state;
    let row = store.command(&handled.command_ids[0]).unwrap().unwrap();
    assert_eq!(
        row.payload,
        json!({ "sum": sum, "count": count }),
        "{} decided on another state than replay gives",
        handled.command_ids[0]
    );
}

/// Commits an event of `n` on `w` as a rival writer would, without the engine.
fn rival(store: &mut impl Store, w: &str, n: i64) {
    let last = store.load(&wid(w)).unwrap().len() as u64;
    let commit = Commit::new(
        wid(w),
        Seq::new(last).unwrap(),
        Event::new("add", json!({ "n": n })),
        Decision::none(),
        T0,
    )
    .unwrap();
    store.append_with_commands(&commit).unwrap();
}

/// The engine's cached states decide as replay from the first event does: after a rival's commits,
/// after evictions, after a restart, and with two stores that hold different histories under one
/// workflow ID ending in the same event (each store names a history of its own, or none).
pub fn cached_states_decide_as_replay_does<H: Harness>(h: &mut H) {
    let engine = Engine::new(Summer).state_cache(2);
    let mut store = h.open();
    let history = store.history_id();
    assert_eq!(
        history,
        store.history_id(),
        "a store names the same history each time"
    );
    for n in 1..=3 {
        handle_and_check(&engine, &mut store, "a", n);
    }
    rival(&mut store, "a", 10);
    rival(&mut store, "a", 20);
    handle_and_check(&engine, &mut store, "a", 4);
    // Three workflows through a cache of two: "a" is evicted and replayed.
    for (w, n) in [("b", 5), ("b", 6), ("c", 7), ("c", 8), ("a", 9)] {
        handle_and_check(&engine, &mut store, w, n);
    }
    if history.is_some() {
        let stats = engine.state_cache_stats();
        assert!(stats.hits >= 2, "the cache was used: {stats:?}");
        assert!(stats.evicted >= 1, "{stats:?}");
    }

    // Another store where "a" has another first event, and the same event at the seq the engine
    // keeps the state of (kind, payload and time alike).
    rival(&mut store, "a", 0);
    let cached_at = store.load(&wid("a")).unwrap().len();
    let mut other = h.open();
    assert!(
        history.is_none() || other.history_id() != history,
        "two stores name two histories"
    );
    rival(&mut other, "a", 100);
    while other.load(&wid("a")).unwrap().len() < cached_at {
        rival(&mut other, "a", 0);
    }
    handle_and_check(&engine, &mut store, "a", 0);
    assert_eq!(
        store.load(&wid("a")).unwrap()[cached_at - 1],
        other.load(&wid("a")).unwrap()[cached_at - 1],
        "both histories hold the same event where the engine keeps the state"
    );
    handle_and_check(&engine, &mut other, "a", 1);
    handle_and_check(&engine, &mut store, "a", 1);

    // After a restart the store holds the same events; the engine carries on.
    let mut store = h.reopen(store);
    handle_and_check(&engine, &mut store, "a", 2);
    handle_and_check(&engine, &mut store, "b", 2);
}
