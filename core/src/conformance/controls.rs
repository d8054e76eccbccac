//! Cases on what operators read and control: stats, priorities, paused kinds, concurrency limits and
//! bulk actions on dead commands.

use super::*;
use crate::{KindChange, KindControl, KindStats};

/// `(pending, leased, due, dead, oldest_due)` of `kind`, zeros when the stats do not list it.
fn counts(stats: &crate::OutboxStats, kind: &str) -> (u64, u64, u64, u64, Option<Timestamp>) {
    let k = stats.kind(kind).cloned().unwrap_or_else(|| KindStats {
        kind: kind.to_owned(),
        ..KindStats::default()
    });
    (k.pending, k.leased, k.due, k.dead, k.oldest_due)
}

/// Stats count pending, leased, claimable and dead commands by kind (done ones not at all), the
/// oldest claimable one gives the lag, and an expired lease counts as claimable again.
pub fn stats_count_depth_by_kind_and_the_lag<H: Harness>(h: &mut H) {
    let mut store = h.open();
    let empty = store.stats(T0).unwrap();
    assert!(empty.kinds.is_empty() && empty.controls.is_empty());
    assert_eq!((empty.oldest_due(), empty.lag()), (None, Duration::ZERO));

    append(&mut store, "w1", &["book", "book", "mail"]);
    append(&mut store, "w2", &["pay"]);
    append(&mut store, "w3", &["book"]);
    store.mark_done(&cid("w3:1:0"), T0).unwrap();
    let later = Commit::new(
        wid("w4"),
        Seq::ZERO,
        Event::new("e", json!({})),
        commands(&["mail"]),
        at(5_000),
    )
    .unwrap();
    store.append_with_commands(&later).unwrap();
    let claimed = claim(&mut store, "w", 2, 1_000, T0);
    assert_eq!(claimed.len(), 2, "w1:1:0 and w1:1:1");
    store
        .fail(
            &claimed[1].command_id,
            claimed[1].token,
            &Failure::permanent("no"),
            &policy(),
            T0,
        )
        .unwrap();

    let stats = store.stats(at(100)).unwrap();
    assert_eq!(stats.now, at(100));
    let kinds: Vec<&str> = stats.kinds.iter().map(|k| k.kind.as_str()).collect();
    assert_eq!(
        kinds,
        ["book", "mail", "pay"],
        "by kind; done rows not counted"
    );
    assert_eq!(counts(&stats, "book"), (0, 1, 0, 1, None));
    assert_eq!(counts(&stats, "mail"), (2, 0, 1, 0, Some(T0)));
    assert_eq!(counts(&stats, "pay"), (1, 0, 1, 0, Some(T0)));
    assert_eq!(
        (stats.pending(), stats.leased(), stats.due(), stats.dead()),
        (3, 1, 2, 1)
    );
    assert_eq!(stats.lag(), Duration::from_millis(100));

    // The lease of w1:1:0 runs out at +1 s: claimable again, due since then.
    let stats = store.stats(at(1_000)).unwrap();
    assert_eq!(counts(&stats, "book"), (0, 1, 1, 1, Some(at(1_000))));
    assert_eq!(stats.lag(), Duration::from_millis(1_000));
    // w4's mail falls due at +5 s.
    let stats = store.stats(at(5_000)).unwrap();
    assert_eq!(counts(&stats, "mail"), (2, 0, 2, 0, Some(T0)));
    assert_eq!(stats.due(), 4);
    // Before everything: nothing claimable, no lag.
    let stats = store.stats(Timestamp::EPOCH).unwrap();
    assert_eq!((stats.due(), stats.lag()), (0, Duration::ZERO));
    assert_eq!(stats.pending(), 3);

    let store = h.reopen(store);
    assert_eq!(store.stats(at(100)).unwrap().kinds.len(), 3);
    assert!(store.kind_controls().unwrap().is_empty());
}

/// Commits one event of `workflow` at `now` with one command per `(kind, priority)`.
fn append_prioritised<S: Store>(
    store: &mut S,
    workflow: &str,
    commands: &[(&str, i32)],
    now: Timestamp,
) {
    let id = wid(workflow);
    let last = store
        .load(&id)
        .expect("load")
        .last()
        .map_or(Seq::ZERO, |e| e.seq);
    let decision: Decision = commands
        .iter()
        .map(|(kind, priority)| Command::new(*kind, json!({})).priority(*priority))
        .collect::<Vec<_>>()
        .into();
    let commit = Commit::new(id, last, Event::new("e", json!({})), decision, now).unwrap();
    store.append_with_commands(&commit).expect("commit");
}

fn ids(deliveries: &[crate::Delivery]) -> Vec<String> {
    deliveries
        .iter()
        .map(|d| d.command_id.to_string())
        .collect()
}

/// Claims take the highest priority first, then the longest due, then by command ID, across pages
/// and priorities; a command not yet due, whatever its priority, holds nothing back; in strict order
/// a command of a high priority still waits for the earlier commands of its workflow.
pub fn priorities_come_first_then_due_time<H: Harness>(h: &mut H) {
    let mut store = h.open();
    append_prioritised(&mut store, "a", &[("x", 0), ("x", 0)], T0);
    append_prioritised(&mut store, "b", &[("x", 5)], at(100));
    append_prioritised(&mut store, "c", &[("x", -1)], T0);
    append_prioritised(&mut store, "d", &[("x", 5)], at(50));
    append_prioritised(&mut store, "e", &[("x", 9)], at(10_000));
    let row = store.command(&cid("b:1:0")).unwrap().unwrap();
    assert_eq!(row.priority, 5);
    // Pages of two run across the priorities 5, 0 and -1; the not yet due 9 is passed over.
    let mut order = Vec::new();
    loop {
        let got = claim(&mut store, "w", 2, 60_000, at(200));
        if got.is_empty() {
            break;
        }
        order.extend(ids(&got));
    }
    assert_eq!(order, ["d:1:0", "b:1:0", "a:1:0", "a:1:1", "c:1:0"]);
    let store = h.reopen(store);
    assert_eq!(store.command(&cid("e:1:0")).unwrap().unwrap().priority, 9);

    // One claim across priorities: an expired lease of priority 5 comes before a pending 0.
    let mut store = h.open();
    append_prioritised(&mut store, "a", &[("x", 0)], T0);
    append_prioritised(&mut store, "b", &[("x", 5)], T0);
    let first = claim(&mut store, "w", 1, 100, T0);
    assert_eq!(ids(&first), ["b:1:0"]);
    let again = claim(&mut store, "w", 5, 100, at(100));
    assert_eq!(ids(&again), ["b:1:0", "a:1:0"], "the expired lease first");
    assert_eq!(again[0].attempt, 2);

    // Strict order: the head of a workflow goes first, whatever the priorities behind it.
    let mut store = h.open();
    append_prioritised(&mut store, "s", &[("x", 0), ("x", 9)], T0);
    append_prioritised(&mut store, "t", &[("x", 1)], T0);
    let strict = ClaimRequest::new("w")
        .limit(10)
        .lease_ttl(Duration::from_millis(1_000))
        .order(ClaimOrder::StrictPerWorkflow);
    assert_eq!(ids(&store.claim(&strict, T0).unwrap()), ["t:1:0", "s:1:0"]);
    assert!(store.claim(&strict, T0).unwrap().is_empty(), "s:1:1 waits");
    // Without strict order the high priority goes first.
    let mut store = h.open();
    append_prioritised(&mut store, "s", &[("x", 0), ("x", 9)], T0);
    assert_eq!(
        ids(&claim(&mut store, "w", 10, 1_000, T0)),
        ["s:1:1", "s:1:0"]
    );
}

/// A paused kind is not claimed — pending or with an expired lease, not even buried — until it is
/// resumed; other kinds go on; in strict order its command holds its workflow back. The pause is
/// stored (it survives a reopen), recorded with who and when, shown in the stats, and bad input
/// changes nothing.
pub fn paused_kinds_are_skipped_until_resumed<H: Harness>(h: &mut H) {
    let mut store = h.open();
    append(&mut store, "w1", &["book", "mail"]);
    append(&mut store, "w2", &["book"]);
    append(&mut store, "w3", &["book", "mail"]);
    // w2's book is leased, on its only allowed attempt, when the kind is paused.
    let once = RetryPolicy::default().max_attempts(1);
    let request = |limit: usize| {
        ClaimRequest::new("w")
            .limit(limit)
            .lease_ttl(Duration::from_millis(100))
            .retry_policy(&once)
    };
    let held = store
        .claim(
            &ClaimRequest::new("w")
                .limit(10)
                .lease_ttl(Duration::from_millis(100)),
            T0,
        )
        .unwrap();
    assert_eq!(held.len(), 5);
    for d in &held {
        if d.command_id != cid("w2:1:0") {
            store.release(&d.command_id, d.token, T0).unwrap();
        }
    }
    let paused = store
        .control_kind("book", KindChange::Pause, "alice", at(1))
        .unwrap();
    assert!(paused.paused && paused.concurrency_limit.is_none());
    assert_eq!(
        (paused.changed_by.as_str(), paused.changed_at),
        ("alice", at(1))
    );
    assert_eq!(
        store.kind_controls().unwrap(),
        std::slice::from_ref(&paused)
    );

    // Past w2's lease: only the mails; w2:1:0 is neither taken over nor buried.
    let got = store.claim(&request(10), at(200)).unwrap();
    assert_eq!(ids(&got), ["w1:1:1", "w3:1:1"]);
    let w2 = store.command(&cid("w2:1:0")).unwrap().unwrap();
    assert_eq!(
        (w2.status, w2.attempts, w2.token()),
        (Status::Leased, 1, held[2].token)
    );
    for d in &got {
        store
            .complete(&d.command_id, d.token, None, at(200))
            .unwrap();
    }
    // Strict order: a mail behind a paused book waits.
    append(&mut store, "w4", &["book", "mail"]);
    let strict = ClaimRequest::new("w")
        .limit(10)
        .lease_ttl(Duration::from_millis(100))
        .order(ClaimOrder::StrictPerWorkflow);
    assert!(store.claim(&strict, at(200)).unwrap().is_empty());
    let stats = store.stats(at(200)).unwrap();
    assert!(stats.kind("book").unwrap().paused);
    assert_eq!(stats.paused_kinds().collect::<Vec<_>>(), ["book"]);
    assert_eq!(stats.controls, std::slice::from_ref(&paused));

    // Bad input is refused and changes nothing.
    for (kind, change, by) in [
        ("", KindChange::Resume, "bob"),
        ("b\0ok", KindChange::Pause, "bob"),
        ("book", KindChange::Resume, ""),
        ("book", KindChange::Limit(0), "bob"),
    ] {
        assert!(
            matches!(
                store.control_kind(kind, change, by, at(300)),
                Err(Error::InvalidInput { .. })
            ),
            "{kind:?} {change:?} {by:?}"
        );
    }
    let mut store = h.reopen(store);
    assert_eq!(store.kind_controls().unwrap(), [paused]);
    let got = store.claim(&request(10), at(300)).unwrap();
    assert_eq!(
        ids(&got),
        ["w4:1:1"],
        "no book, paused since before the reopen"
    );

    let resumed = store
        .control_kind("book", KindChange::Resume, "bob", at(400))
        .unwrap();
    assert!(!resumed.is_active());
    assert_eq!(
        store.kind_controls().unwrap(),
        [resumed],
        "the resume is recorded"
    );
    assert!(store.stats(at(400)).unwrap().controls.is_empty());
    // Resumed: w2's exhausted lease is buried now, the others are claimed.
    let got = store.claim(&request(10), at(400)).unwrap();
    assert_eq!(ids(&got), ["w1:1:0", "w3:1:0", "w4:1:0"]);
    assert_eq!(status(&store, "w2:1:0"), Status::Dead);
}

/// A limit set while commands of its kind are leased counts those leases: the kind gets no more
/// until enough of them settle or run out.
pub fn a_limit_counts_the_leases_taken_before_it<H: Harness>(h: &mut H) {
    let mut store = h.open();
    append(&mut store, "m", &["mail", "mail", "mail", "mail"]);
    let before = claim(&mut store, "w1", 3, 1_000, T0);
    assert_eq!(ids(&before), ["m:1:0", "m:1:1", "m:1:2"]);
    store
        .control_kind("mail", KindChange::Limit(2), "ops", at(1))
        .unwrap();
    assert!(
        claim(&mut store, "w2", 10, 1_000, at(2)).is_empty(),
        "three leases already held, against a limit of two"
    );
    store
        .complete(&before[0].command_id, before[0].token, None, at(3))
        .unwrap();
    assert!(claim(&mut store, "w2", 10, 1_000, at(4)).is_empty());
    store
        .complete(&before[1].command_id, before[1].token, None, at(5))
        .unwrap();
    assert_eq!(ids(&claim(&mut store, "w2", 10, 1_000, at(6))), ["m:1:3"]);
    // Without a limit a lease is taken; a new limit counts it with the two still held.
    store
        .control_kind("mail", KindChange::RemoveLimit, "ops", at(7))
        .unwrap();
    append(&mut store, "n", &["mail"]);
    assert_eq!(ids(&claim(&mut store, "w3", 10, 1_000, at(8))), ["n:1:0"]);
    store
        .control_kind("mail", KindChange::Limit(3), "ops", at(9))
        .unwrap();
    let mut store = h.reopen(store);
    append(&mut store, "o", &["mail"]);
    assert!(claim(&mut store, "w4", 10, 1_000, at(10)).is_empty());
    store
        .complete(&before[2].command_id, before[2].token, None, at(11))
        .unwrap();
    assert_eq!(ids(&claim(&mut store, "w4", 10, 1_000, at(12))), ["o:1:0"]);
}

/// A kind limited to N never has more than N commands holding an unexpired lease: with 5 due and a
/// limit of 2, a claim gets 2 and the next claim none, until one settles, is given back or its lease
/// runs out; other kinds are not held back; removing the limit lets the rest go.
pub fn a_concurrency_limit_caps_unexpired_leases_of_its_kind<H: Harness>(h: &mut H) {
    let mut store = h.open();
    append(&mut store, "m", &["mail", "mail", "mail", "mail", "mail"]);
    append(&mut store, "p", &["pay", "pay"]);
    let limit = store
        .control_kind("mail", KindChange::Limit(2), "ops", T0)
        .unwrap();
    assert_eq!(limit.concurrency_limit, Some(2));
    let first = claim(&mut store, "w1", 10, 1_000, T0);
    assert_eq!(ids(&first), ["m:1:0", "m:1:1", "p:1:0", "p:1:1"]);
    assert!(claim(&mut store, "w2", 10, 1_000, T0).is_empty());
    let stats = store.stats(T0).unwrap();
    let mail = stats.kind("mail").unwrap();
    assert_eq!(
        (mail.leased, mail.pending, mail.concurrency_limit),
        (2, 3, Some(2))
    );

    // One settles: one more.
    store
        .complete(&first[0].command_id, first[0].token, None, at(10))
        .unwrap();
    let next = claim(&mut store, "w2", 10, 1_000, at(10));
    assert_eq!(ids(&next), ["m:1:2"]);
    assert!(claim(&mut store, "w3", 10, 1_000, at(10)).is_empty());
    // One is given back, one fails to retry later: two slots, one command due.
    store
        .release(&next[0].command_id, next[0].token, at(20))
        .unwrap();
    store
        .fail(
            &first[1].command_id,
            first[1].token,
            &Failure::retryable("503"),
            &policy(),
            at(20),
        )
        .unwrap();
    let again = claim(&mut store, "w3", 10, 1_000, at(20));
    assert_eq!(ids(&again), ["m:1:3", "m:1:4"], "the longest due first");
    assert!(claim(&mut store, "w3", 10, 1_000, at(500)).is_empty());
    // At +1,020 the leases of m:1:3 and m:1:4 have run out: their slots are free, though their
    // holders may still be at work; the longest due mails take them, the pays' expired leases are
    // taken over.
    let expired = claim(&mut store, "w4", 10, 1_000, at(1_020));
    assert_eq!(ids(&expired), ["m:1:2", "m:1:1", "p:1:0", "p:1:1"]);

    // Limits hold after a reopen; removing one lets the rest go.
    let mut store = h.reopen(store);
    assert!(claim(&mut store, "w5", 10, 1_000, at(1_030)).is_empty());
    store
        .control_kind("mail", KindChange::RemoveLimit, "ops", at(1_040))
        .unwrap();
    let rest = claim(&mut store, "w5", 10, 1_000, at(1_040));
    assert_eq!(ids(&rest), ["m:1:3", "m:1:4"]);
    assert!(store.stats(at(3_000)).unwrap().controls.is_empty());
    assert!(matches!(
        store.control_kind(
            "mail",
            KindChange::Limit(KindControl::MAX_CONCURRENCY_LIMIT + 1),
            "ops",
            at(3_000)
        ),
        Err(Error::InvalidInput {
            field: "concurrency_limit",
            ..
        })
    ));
}

/// Bulk actions on the dead commands of one kind: each retried as `retry` does one (recorded in
/// `manual_retries`) or resolved as `resolve` does one (its note kept, `command_resolved` scheduled),
/// in batches, in command ID order; other kinds and live commands are untouched; bad arguments change
/// nothing.
pub fn bulk_retry_and_resolve_dead_commands_of_a_kind<H: Harness>(h: &mut H) {
    let mut store = h.open();
    append(&mut store, "w1", &["book", "book", "mail", "book"]);
    append(&mut store, "w2", &["book"]);
    let claimed = claim(&mut store, "w", 10, 1_000, T0);
    for d in claimed.iter().filter(|d| d.command_id != cid("w1:1:3")) {
        store
            .fail(
                &d.command_id,
                d.token,
                &Failure::permanent("no"),
                &policy(),
                T0,
            )
            .unwrap();
    }
    let dead = |store: &H::Store, kind: &str| -> Vec<String> {
        store
            .dead_letters_of_kind(kind, 10)
            .unwrap()
            .iter()
            .map(|r| r.command_id.to_string())
            .collect()
    };
    assert_eq!(dead(&store, "book"), ["w1:1:0", "w1:1:1", "w2:1:0"]);
    assert_eq!(dead(&store, "mail"), ["w1:1:2"]);
    assert!(dead(&store, "none").is_empty());
    assert_eq!(store.dead_letters_of_kind("book", 1).unwrap().len(), 1);
    for bad in ["", "b\0ok"] {
        assert!(
            matches!(
                store.dead_letters_of_kind(bad, 10),
                Err(Error::InvalidInput { field: "kind", .. })
            ),
            "{bad:?}"
        );
    }

    for (kind, batch, field) in [
        ("", 10, "kind"),
        ("book", 0, "batch"),
        ("book", crate::MAX_BULK_BATCH + 1, "batch"),
    ] {
        for result in [
            store.retry_dead_of_kind(kind, batch, at(5)),
            store.resolve_dead_of_kind(kind, "x", batch, at(5)),
        ] {
            assert!(
                matches!(result, Err(Error::InvalidInput { field: f, .. }) if f == field),
                "{kind:?} {batch}: {result:?}"
            );
        }
    }
    assert_eq!(dead(&store, "book").len(), 3, "nothing changed");

    let shown = |ids: Vec<CommandId>| ids.iter().map(ToString::to_string).collect::<Vec<_>>();
    assert_eq!(
        shown(store.retry_dead_of_kind("book", 2, at(10)).unwrap()),
        ["w1:1:0", "w1:1:1"]
    );
    assert_eq!(
        shown(store.retry_dead_of_kind("book", 2, at(10)).unwrap()),
        ["w2:1:0"]
    );
    assert!(store
        .retry_dead_of_kind("book", 2, at(10))
        .unwrap()
        .is_empty());
    let row = store.command(&cid("w1:1:0")).unwrap().unwrap();
    assert_eq!(
        (
            row.status,
            row.attempts,
            row.manual_retries,
            row.available_at
        ),
        (Status::Pending, 0, 1, at(10))
    );
    assert_eq!(status(&store, "w1:1:2"), Status::Dead, "another kind");
    assert_eq!(status(&store, "w1:1:3"), Status::Leased, "a live command");

    assert_eq!(
        shown(
            store
                .resolve_dead_of_kind("mail", "refunded by phone", 10, at(20))
                .unwrap()
        ),
        ["w1:1:2"]
    );
    let store = h.reopen(store);
    let row = store.command(&cid("w1:1:2")).unwrap().unwrap();
    assert_eq!(
        (row.status, row.resolution.as_deref(), row.processed_at),
        (Status::Done, Some("refunded by phone"), Some(at(20)))
    );
    let feedback: Vec<String> = store
        .timers(&wid("w1"))
        .unwrap()
        .into_iter()
        .filter(|t| t.event_kind == crate::COMMAND_RESOLVED)
        .map(|t| t.timer_id.to_string())
        .collect();
    assert_eq!(feedback, ["w1:1:2:resolved"]);
    assert!(store.dead_letters(10).unwrap().is_empty());
}
