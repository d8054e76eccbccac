//! Cases on events and the commit (DESIGN rules 2–4).

use super::*;

/// Seqs are 1, 2, 3… with no gaps, also for several events in one commit.
pub fn seqs_are_gapless_from_one<H: Harness>(h: &mut H) {
    let mut store = h.open();
    let w = wid("w");
    assert!(store.load(&w).unwrap().is_empty());
    append(&mut store, "w", &[]);
    append(&mut store, "w", &["a"]);
    let mut commit = Commit::new(
        w.clone(),
        Seq::new(2).unwrap(),
        Event::new("x", json!(1)),
        commands(&["b"]),
        T0,
    )
    .unwrap();
    commit
        .push(Event::new("y", json!(2)), commands(&["c", "d"]))
        .unwrap();
    store.append_with_commands(&commit).unwrap();
    append(&mut store, "other", &[]);
    let events = store.load(&w).unwrap();
    assert_eq!(seqs(&events), [1, 2, 3, 4]);
    assert_eq!(events[2].kind, "x");
    assert_eq!(events[3].payload, json!(2));
    assert_eq!(events[0].recorded_at, T0);
    assert_eq!(pending_ids(&store), ["w:2:0", "w:3:0", "w:4:0", "w:4:1"]);
    let store = h.reopen(store);
    assert_eq!(seqs(&store.load(&w).unwrap()), [1, 2, 3, 4]);
    assert_eq!(seqs(&store.load(&wid("other")).unwrap()), [1]);
}

/// A commit that fails half-way leaves nothing behind, also after a restart.
pub fn failed_commit_writes_nothing<H: Harness>(h: &mut H) {
    let mut store = h.open();
    append(&mut store, "w", &["ok"]);
    h.fail_commits_with_command_kind(&mut store, "explode");
    let commit = Commit::new(
        wid("w"),
        Seq::new(1).unwrap(),
        Event::new("second", json!({})),
        commands(&["ok", "ok", "explode", "ok"]),
        T0,
    )
    .unwrap();
    let err = store.append_with_commands(&commit).unwrap_err();
    assert!(
        !matches!(err, Error::Conflict { .. }),
        "the injected failure is not a conflict: {err}"
    );
    let check = |store: &H::Store| {
        assert_eq!(
            seqs(&store.load(&wid("w")).unwrap()),
            [1],
            "no event of the failed commit"
        );
        assert_eq!(
            pending_ids(store),
            ["w:1:0"],
            "no command of the failed commit"
        );
        assert!(store.command(&cid("w:2:0")).unwrap().is_none());
    };
    check(&store);
    let mut store = h.reopen(store);
    check(&store);
    // The workflow goes on at the same seq.
    assert_eq!(append(&mut store, "w", &["ok"]), Seq::new(2).unwrap());
}

/// A commit on a stale `expected_seq` gets `Conflict { expected, actual }` and writes nothing.
pub fn stale_expected_seq_conflicts<H: Harness>(h: &mut H) {
    let mut store = h.open();
    append(&mut store, "w", &["a"]);
    append(&mut store, "w", &["b"]);
    for expected in [0, 1, 3, 7] {
        let commit = Commit::new(
            wid("w"),
            Seq::new(expected).unwrap(),
            Event::new("late", json!({})),
            commands(&["c"]),
            T0,
        )
        .unwrap();
        match store.append_with_commands(&commit) {
            Err(Error::Conflict {
                workflow_id,
                expected: e,
                actual,
            }) => {
                assert_eq!(workflow_id, wid("w"));
                assert_eq!(e.get(), expected);
                assert_eq!(actual.get(), 2);
            }
            other => panic!("expected a conflict for expected_seq {expected}, got {other:?}"),
        }
    }
    assert_eq!(seqs(&store.load(&wid("w")).unwrap()), [1, 2]);
    assert_eq!(pending_ids(&store), ["w:1:0", "w:2:0"]);
}

/// The engine replays, decides and commits, and on a conflict decides again at the next seq.
pub fn engine_retries_a_conflict_at_the_next_seq<H: Harness>(h: &mut H) {
    let mut store = h.open();
    let engine = Engine::new(Counter);
    let w = wid("race");
    // A rival commits between our replay and our commit: simulate by committing on the stale seq.
    let stale = engine.replay(&store, &w).unwrap();
    engine
        .handle(&mut store, &w, Event::new("first", json!({})), T0)
        .unwrap();
    let commit = Commit::new(
        w.clone(),
        stale.last_seq,
        Event::new("second", json!({})),
        Decision::none(),
        T0,
    )
    .unwrap();
    assert!(matches!(
        store.append_with_commands(&commit),
        Err(Error::Conflict { .. })
    ));
    let handled = engine
        .handle(&mut store, &w, Event::new("second", json!({})), T0)
        .unwrap();
    assert_eq!(handled.seq.get(), 2);
    assert_eq!(handled.command_ids, [cid("race:2:0")]);
    let row = store.command(&cid("race:2:0")).unwrap().unwrap();
    assert_eq!(
        row.payload,
        json!({ "seen": 1 }),
        "decided on the state after the rival's event"
    );
    assert_eq!(engine.replay(&store, &w).unwrap().state, 2);
}

/// A workflow that rejects an event gets `Rejected` and nothing is written.
pub fn rejected_events_write_nothing<H: Harness>(h: &mut H) {
    struct Picky;
    impl Workflow for Picky {
        type State = u64;
        fn evolve(&self, seen: &mut u64, _: &EventRecord) {
            *seen += 1;
        }
        fn decide(&self, seen: &u64, _: &EventRecord) -> Decision {
            if *seen >= 1 {
                Decision::reject("only one event allowed")
            } else {
                Decision::new().command(Command::new("once", json!({})))
            }
        }
    }
    let mut store = h.open();
    let engine = Engine::new(Picky);
    engine
        .handle(&mut store, &wid("w"), Event::new("first", json!({})), T0)
        .unwrap();
    match engine.handle(&mut store, &wid("w"), Event::new("second", json!({})), T0) {
        Err(Error::Rejected {
            workflow_id,
            reason,
        }) => {
            assert_eq!(
                (workflow_id, reason.as_str()),
                (wid("w"), "only one event allowed")
            );
        }
        other => panic!("expected a rejection, got {other:?}"),
    }
    assert_eq!(seqs(&store.load(&wid("w")).unwrap()), [1]);
    assert_eq!(pending_ids(&store), ["w:1:0"]);
}

/// Command IDs follow every case of the shared vectors: derived, stored, read back and parsed alike.
pub fn command_ids_match_the_vectors<H: Harness>(h: &mut H) {
    let vectors = command_id_vectors();
    let mut store = h.open();
    for case in &vectors.valid {
        let workflow_id = wid(&case.workflow_id);
        let seq = Seq::new(case.event_seq).unwrap();
        let derived = CommandId::new(workflow_id.clone(), seq, case.index).unwrap();
        assert_eq!(derived.to_string(), case.command_id);
        assert_eq!(case.command_id.parse::<CommandId>().unwrap(), derived);
        if case.event_seq > 3 {
            continue; // too many events to commit here; derivation and parsing are checked above
        }
        // Commit filler events up to the case's seq, then a decision with the case's index.
        while store.load(&workflow_id).unwrap().len() + 1 < case.event_seq as usize {
            append(&mut store, &case.workflow_id, &[]);
        }
        let kinds = vec!["cmd"; case.index as usize + 1];
        append(&mut store, &case.workflow_id, &kinds);
        let row = store
            .command(&derived)
            .unwrap()
            .unwrap_or_else(|| panic!("{} stored", case.command_id));
        assert_eq!(row.command_id.to_string(), case.command_id);
    }
    for case in &vectors.invalid_workflow_ids {
        match WorkflowId::new(case.workflow_id.clone()) {
            Err(refused) => {
                assert_eq!(refused.field(), "workflow_id");
                assert_eq!(
                    refused.value(),
                    case.workflow_id,
                    "the error names the value"
                );
            }
            other => panic!(
                "workflow id {:?} ({}) was not refused: {other:?}",
                case.workflow_id, case.why
            ),
        }
    }
    for case in &vectors.invalid_command_ids {
        let err = case.command_id.parse::<CommandId>().unwrap_err();
        assert!(
            err.to_string().contains(&case.command_id),
            "{} ({}): {err}",
            case.command_id,
            case.why
        );
    }
}

/// Timer IDs follow every case of the shared vectors; the ones a store derives match, also read back.
pub fn timer_ids_match_the_vectors<H: Harness>(h: &mut H) {
    let vectors = command_id_vectors().timer_ids;
    for case in &vectors.valid {
        let derived = case
            .derive()
            .unwrap_or_else(|e| panic!("{}: {e}", case.timer_id));
        assert_eq!(derived.to_string(), case.timer_id);
        let parsed: TimerId = case.timer_id.parse().unwrap();
        assert_eq!(parsed, derived);
        assert_eq!(parsed.workflow_id().as_str(), case.workflow_id);
    }
    for case in &vectors.invalid {
        let err = case.timer_id.parse::<TimerId>().expect_err(&case.why);
        assert!(
            err.to_string().contains(&case.timer_id),
            "{} ({}): {err}",
            case.timer_id,
            case.why
        );
    }
    // A store derives the same IDs for the scheduled cases with small seqs.
    let mut store = h.open();
    for case in vectors
        .valid
        .iter()
        .filter(|c| c.source == "scheduled" && c.event_seq.unwrap_or(0) <= 3)
    {
        let workflow_id = wid(&case.workflow_id);
        while store.load(&workflow_id).unwrap().len() + 1 < case.event_seq.unwrap() as usize {
            append(&mut store, &case.workflow_id, &[]);
        }
        let mut decision = Decision::new();
        for n in 0..=case.index.unwrap() {
            decision = decision.timer(Timer::after(
                format!("t{n}"),
                Duration::from_secs(1),
                json!(n),
            ));
        }
        let last = store.load(&workflow_id).unwrap().len() as u64;
        let commit = Commit::new(
            workflow_id.clone(),
            Seq::new(last).unwrap(),
            Event::new("e", json!({})),
            decision,
            T0,
        )
        .unwrap();
        store.append_with_commands(&commit).unwrap();
        let store_ids: Vec<String> = store
            .timers(&workflow_id)
            .unwrap()
            .iter()
            .map(|t| t.timer_id.to_string())
            .collect();
        assert!(
            store_ids.contains(&case.timer_id),
            "{} not in {store_ids:?}",
            case.timer_id
        );
    }
}

/// `pending` returns commands by `(workflow_id, event_seq, index)`, the index compared as a number.
pub fn pending_order_matches_the_vectors<H: Harness>(h: &mut H) {
    let vectors = command_id_vectors();
    let mut store = h.open();
    let w = &vectors.ordering.workflow_id;
    append(&mut store, "v", &["first workflow by name"]);
    append(&mut store, w, &["cmd"; 12]);
    append(&mut store, w, &["cmd"]);
    let order: Vec<String> = pending_ids(&store)
        .into_iter()
        .filter(|id| id.starts_with(&format!("{w}:")))
        .collect();
    assert_eq!(order, vectors.ordering.expected_pending_order);
    assert_eq!(
        pending_ids(&store)[0],
        "v:1:0",
        "workflows come out in ID order"
    );
    assert_eq!(store.pending(3).unwrap().len(), 3, "limit is kept");
    let rows = store.commands(&wid(w)).unwrap();
    let ids: Vec<String> = rows.iter().map(|r| r.command_id.to_string()).collect();
    assert_eq!(ids, vectors.ordering.expected_pending_order);
}

/// A new outbox row holds every column of rule 5 with its initial value, and the payload round-trips.
pub fn outbox_rows_start_pending_with_every_column<H: Harness>(h: &mut H) {
    let mut store = h.open();
    let payload = json!({ "city": "成都", "n": 1.5, "list": [1, "x", null], "nested": { "b": true, "a": {} } });
    let decision = Decision::new().command(Command::new("lock_budget", payload.clone()));
    let commit = Commit::new(
        wid("trip-001"),
        Seq::ZERO,
        Event::new("trip_requested", payload.clone()),
        decision,
        at(5),
    )
    .unwrap();
    store.append_with_commands(&commit).unwrap();
    let store = h.reopen(store);
    let row = store.command(&cid("trip-001:1:0")).unwrap().unwrap();
    assert_eq!(row.kind, "lock_budget");
    assert_eq!(row.payload, payload);
    assert_eq!(row.status, Status::Pending);
    assert_eq!(row.attempts, 0);
    assert_eq!(row.last_error, None);
    assert_eq!(row.available_at, at(5));
    assert_eq!(row.lease, None);
    assert_eq!(row.created_at, at(5));
    assert_eq!(row.processed_at, None);
    assert_eq!(store.load(&wid("trip-001")).unwrap()[0].payload, payload);
}

/// `mark_done` twice is harmless; an unknown command is a clear error.
pub fn mark_done_is_idempotent_and_unknown_ids_are_errors<H: Harness>(h: &mut H) {
    let mut store = h.open();
    append(&mut store, "w", &["a", "b"]);
    store.mark_done(&cid("w:1:0"), at(1)).unwrap();
    store.mark_done(&cid("w:1:0"), at(2)).unwrap();
    let row = store.command(&cid("w:1:0")).unwrap().unwrap();
    assert_eq!(row.status, Status::Done);
    assert_eq!(
        row.processed_at,
        Some(at(1)),
        "the second mark changes nothing"
    );
    assert_eq!(pending_ids(&store), ["w:1:1"]);
    for unknown in ["w:1:2", "w:9:0", "nobody:1:0"] {
        match store.mark_done(&cid(unknown), at(3)) {
            Err(Error::UnknownCommand { command_id }) => {
                assert_eq!(command_id.to_string(), unknown)
            }
            other => panic!("mark_done({unknown}) gave {other:?}"),
        }
    }
    assert!(matches!(
        store.complete(&cid("w:7:0"), 1, None, at(3)),
        Err(Error::UnknownCommand { .. })
    ));
    assert!(matches!(
        store.retry(&cid("w:7:0"), at(3)),
        Err(Error::UnknownCommand { .. })
    ));
}

/// Replay of a workflow with no events gives `last_seq` 0; replay folds events and never decides, so it
/// never produces or changes a command.
pub fn replay_folds_and_never_dispatches<H: Harness>(h: &mut H) {
    let mut store = h.open();
    let engine = Engine::new(Counter);
    let empty = engine.replay(&store, &wid("new")).unwrap();
    assert_eq!((empty.state, empty.last_seq), (0, Seq::ZERO));
    let w = wid("w");
    for _ in 0..3 {
        engine
            .handle(&mut store, &w, Event::new("tick", json!({})), T0)
            .unwrap();
    }
    let before = store.pending(usize::MAX).unwrap();
    let replayed = engine.replay(&store, &w).unwrap();
    assert_eq!((replayed.state, replayed.last_seq.get()), (3, 3));
    assert_eq!(
        store.pending(usize::MAX).unwrap(),
        before,
        "replay changed the outbox"
    );
    assert_eq!(before.len(), 3);
}
