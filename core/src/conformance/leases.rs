//! Cases on leases, acknowledgement and failure (DESIGN rules 6–9).

use super::*;

/// Two claimers never hold the same command; a claim takes due commands only, longest-due first.
pub fn claims_are_exclusive_and_due_only<H: Harness>(h: &mut H) {
    let mut store = h.open();
    for w in ["a", "b", "c"] {
        append(&mut store, w, &["x", "y"]);
    }
    let first = claim(&mut store, "w1", 4, 1_000, T0);
    let second = claim(&mut store, "w2", 4, 1_000, T0);
    assert_eq!(first.len(), 4);
    assert_eq!(second.len(), 2);
    let mut all: Vec<String> = first
        .iter()
        .chain(&second)
        .map(|d| d.command_id.to_string())
        .collect();
    assert_eq!(all[..4], ["a:1:0", "a:1:1", "b:1:0", "b:1:1"]);
    all.sort();
    all.dedup();
    assert_eq!(all.len(), 6, "no command is held twice");
    assert!(claim(&mut store, "w3", 10, 1_000, T0).is_empty());
    for d in &first {
        assert_eq!(d.attempt, 1);
        assert_eq!(d.lease_expires_at, at(1_000));
        let row = store.command(&d.command_id).unwrap().unwrap();
        assert_eq!(row.status, Status::Leased);
        let lease = row.lease.unwrap();
        assert_eq!((lease.owner.as_str(), lease.token), ("w1", d.token));
    }
    // Not yet due: a commit made later in time is not claimable before its time.
    let mut store = h.open();
    let commit = Commit::new(
        wid("future"),
        Seq::ZERO,
        Event::new("e", json!({})),
        commands(&["x"]),
        at(500),
    )
    .unwrap();
    store.append_with_commands(&commit).unwrap();
    assert!(claim(&mut store, "w1", 1, 1_000, at(499)).is_empty());
    assert_eq!(claim(&mut store, "w1", 1, 1_000, at(500)).len(), 1);
    assert!(
        store.claim(&ClaimRequest::new("").limit(1), T0).is_err(),
        "empty worker name refused"
    );
}

/// An expired lease is taken over with a new token; the old holder's complete, extend and fail get
/// `StaleLease` and change nothing; the new holder settles it.
pub fn expired_leases_are_fenced<H: Harness>(h: &mut H) {
    let mut store = h.open();
    append(&mut store, "w", &["x"]);
    let old = claim(&mut store, "slow", 1, 1_000, T0).remove(0);
    assert!(
        claim(&mut store, "fast", 1, 1_000, at(999)).is_empty(),
        "the lease holds until it expires"
    );
    let new = claim(&mut store, "fast", 1, 1_000, at(1_000)).remove(0);
    assert_eq!(new.command_id, old.command_id);
    assert!(new.token > old.token, "a takeover gets a fresh token");
    assert_eq!(new.attempt, 2);
    let before = store.command(&old.command_id).unwrap();
    let stale = |e: Result<(), Error>| {
        assert!(
            matches!(e, Err(Error::StaleLease { token, .. }) if token == old.token),
            "{e:?}"
        )
    };
    stale(store.complete(&old.command_id, old.token, None, at(1_001)));
    stale(
        store
            .extend(
                &old.command_id,
                old.token,
                Duration::from_secs(9),
                at(1_001),
            )
            .map(|_| ()),
    );
    stale(
        store
            .fail(
                &old.command_id,
                old.token,
                &Failure::retryable("late"),
                &policy(),
                at(1_001),
            )
            .map(|_| ()),
    );
    assert_eq!(
        store.command(&old.command_id).unwrap(),
        before,
        "a stale holder changed the row"
    );
    store
        .complete(&new.command_id, new.token, None, at(1_002))
        .unwrap();
    assert_eq!(status(&store, "w:1:0"), Status::Done);
    stale(store.complete(&old.command_id, old.token, None, at(1_003)));
}

/// A late ack while nobody took over still completes; a holder can extend its lease.
pub fn late_ack_without_takeover_completes_and_extend_works<H: Harness>(h: &mut H) {
    let mut store = h.open();
    append(&mut store, "w", &["x", "y"]);
    let d = claim(&mut store, "w1", 2, 1_000, T0);
    store
        .complete(&d[0].command_id, d[0].token, None, at(5_000))
        .unwrap();
    assert_eq!(status(&store, "w:1:0"), Status::Done);
    let until = store
        .extend(
            &d[1].command_id,
            d[1].token,
            Duration::from_millis(3_000),
            at(900),
        )
        .unwrap();
    assert_eq!(until.expires_at, at(3_900));
    assert!(
        claim(&mut store, "w2", 1, 1_000, at(3_899)).is_empty(),
        "the extended lease holds"
    );
    assert_eq!(claim(&mut store, "w2", 1, 1_000, at(3_900)).len(), 1);
}

/// A retryable failure waits the policy's backoff (never above the cap), then is claimable again; after
/// the last attempt the command is dead with its last error kept.
pub fn backoff_follows_the_policy_then_dead<H: Harness>(h: &mut H) {
    let mut store = h.open();
    append(&mut store, "w", &["flaky"]);
    let policy = policy();
    let id = cid("w:1:0");
    let mut now = T0;
    for attempt in 1..=4u32 {
        let d = claim(&mut store, "w1", 1, 1_000, now)
            .pop()
            .unwrap_or_else(|| panic!("attempt {attempt} claimable at {now}"));
        assert_eq!(d.attempt, attempt);
        let settled = store
            .fail(
                &id,
                d.token,
                &Failure::retryable(format!("boom {attempt}")),
                &policy,
                now,
            )
            .unwrap();
        if attempt == 4 {
            assert_eq!(settled, Settled::Dead);
            break;
        }
        let expected = policy.backoff(&id, attempt);
        assert!(
            expected <= Duration::from_millis(350),
            "backoff above the cap"
        );
        assert_eq!(
            settled,
            Settled::RetryAt {
                at: now + expected,
                backoff: expected
            }
        );
        let row = store.command(&id).unwrap().unwrap();
        assert_eq!(
            (row.status, row.available_at),
            (Status::Pending, now + expected)
        );
        if !expected.is_zero() {
            let just_before = Timestamp::from_millis((now + expected).as_millis() - 1);
            assert!(
                claim(&mut store, "w1", 1, 1_000, just_before).is_empty(),
                "claimed before its backoff"
            );
        }
        now = now + expected;
    }
    let row = store.command(&id).unwrap().unwrap();
    assert_eq!(row.status, Status::Dead);
    assert_eq!(row.last_error.as_deref(), Some("boom 4"));
    assert_eq!(row.attempts, 4);
    assert!(row.processed_at.is_some());
    assert!(
        claim(&mut store, "w1", 1, 1_000, at(10_000_000)).is_empty(),
        "a dead command is never claimed"
    );
    assert!(store.pending(10).unwrap().is_empty());
    assert_eq!(store.dead_letters(10).unwrap().len(), 1);
}

/// A permanent failure is dead at once; a lease that expires on the last attempt is dead, not claimed.
pub fn permanent_failures_and_exhausted_leases_are_dead<H: Harness>(h: &mut H) {
    let mut store = h.open();
    append(&mut store, "w", &["refused", "crashy"]);
    let d = claim(&mut store, "w1", 1, 1_000, T0).remove(0);
    assert_eq!(
        store
            .fail(
                &d.command_id,
                d.token,
                &Failure::permanent("422 unknown hotel"),
                &policy(),
                T0
            )
            .unwrap(),
        Settled::Dead
    );
    let row = store.command(&d.command_id).unwrap().unwrap();
    assert_eq!((row.status, row.attempts), (Status::Dead, 1));
    assert_eq!(row.last_error.as_deref(), Some("422 unknown hotel"));
    // The second command: every holder crashes. With max 2 attempts, the third claim buries it.
    let request = ClaimRequest::new("w1")
        .limit(5)
        .lease_ttl(Duration::from_millis(100))
        .retry_policy(&RetryPolicy::default().max_attempts(2));
    assert_eq!(store.claim(&request, T0).unwrap().len(), 1);
    assert_eq!(store.claim(&request, at(100)).unwrap().len(), 1);
    assert!(store.claim(&request, at(200)).unwrap().is_empty());
    let row = store.command(&cid("w:1:1")).unwrap().unwrap();
    assert_eq!(row.status, Status::Dead);
    assert!(row.last_error.unwrap().contains("lease expired"));
    let dead: Vec<String> = store
        .dead_letters(10)
        .unwrap()
        .iter()
        .map(|r| r.command_id.to_string())
        .collect();
    assert_eq!(dead, ["w:1:0", "w:1:1"]);
}

/// A claim buries the exhausted leases it meets on the way (each with its feedback) and still hands out
/// up to `limit` commands: the burials do not use up the limit, in either order.
pub fn burials_do_not_use_up_the_claim_limit<H: Harness>(h: &mut H) {
    for order in [ClaimOrder::DueFirst, ClaimOrder::StrictPerWorkflow] {
        let mut store = h.open();
        let last_attempt = RetryPolicy::default().max_attempts(1);
        // A worker that crashes on the first command of three workflows, on its only allowed attempt.
        for w in ["a", "b", "c"] {
            append(&mut store, w, &["crashy"]);
        }
        let crashing = ClaimRequest::new("crashing")
            .limit(3)
            .lease_ttl(Duration::from_millis(100))
            .order(order)
            .retry_policy(&last_attempt);
        assert_eq!(store.claim(&crashing, T0).unwrap().len(), 3);
        // Work due after those leases ran out, so the exhausted leases come first in claim order.
        let later = Commit::new(
            wid("d"),
            Seq::ZERO,
            Event::new("e", json!({})),
            commands(&["x", "y"]),
            at(200),
        )
        .unwrap();
        store.append_with_commands(&later).unwrap();
        let request = ClaimRequest::new("w")
            .limit(2)
            .lease_ttl(Duration::from_millis(1_000))
            .order(order)
            .retry_policy(&last_attempt);
        let got: Vec<String> = store
            .claim(&request, at(300))
            .unwrap()
            .iter()
            .map(|d| d.command_id.to_string())
            .collect();
        let expected: &[&str] = match order {
            ClaimOrder::DueFirst => &["d:1:0", "d:1:1"],
            // d:1:1 waits for d:1:0.
            ClaimOrder::StrictPerWorkflow => &["d:1:0"],
        };
        assert_eq!(got, expected, "{order:?}");
        let dead: Vec<String> = store
            .dead_letters(10)
            .unwrap()
            .iter()
            .map(|r| r.command_id.to_string())
            .collect();
        assert_eq!(dead, ["a:1:0", "b:1:0", "c:1:0"], "{order:?}");
        for w in ["a", "b", "c"] {
            let row = store.command(&cid(&format!("{w}:1:0"))).unwrap().unwrap();
            assert!(row.last_error.unwrap().contains("lease expired"));
            assert_eq!(row.processed_at, Some(at(300)));
            let feedback: Vec<String> = store
                .timers(&wid(w))
                .unwrap()
                .into_iter()
                .map(|t| t.event_kind)
                .collect();
            assert_eq!(
                feedback,
                [COMMAND_FAILED],
                "{order:?}: one feedback per burial"
            );
        }
    }
}

/// `retry` and `resolve` of a dead command are recorded; a live command can be neither retried nor
/// resolved; a dead command is never marked done as if it succeeded.
pub fn retry_and_resolve_dead_commands<H: Harness>(h: &mut H) {
    let mut store = h.open();
    append(&mut store, "w", &["a", "b", "c"]);
    let ds = claim(&mut store, "w1", 2, 1_000, T0);
    for d in &ds {
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
    let live = cid("w:1:2");
    for result in [
        store.resolve(&live, "oops", at(1)),
        store.retry(&live, at(1)),
    ] {
        assert!(
            matches!(
                result,
                Err(Error::InvalidState {
                    status: Status::Pending,
                    ..
                })
            ),
            "{result:?}"
        );
    }
    assert!(matches!(
        store.mark_done(&cid("w:1:0"), at(1)),
        Err(Error::InvalidState {
            status: Status::Dead,
            ..
        })
    ));
    store.retry(&cid("w:1:0"), at(10)).unwrap();
    let row = store.command(&cid("w:1:0")).unwrap().unwrap();
    assert_eq!(
        (
            row.status,
            row.attempts,
            row.manual_retries,
            row.available_at
        ),
        (Status::Pending, 0, 1, at(10))
    );
    assert_eq!(
        row.last_error.as_deref(),
        Some("no"),
        "the last error stays for the record"
    );
    // The note rides in the `command_resolved` event: one with no room for that event is refused.
    let long = "x".repeat(JsonLimits::fed_back().max_bytes);
    let err = store.resolve(&cid("w:1:1"), &long, at(11)).unwrap_err();
    assert!(
        err.code() == "INVALID_INPUT" && err.to_string().contains("note"),
        "{err}"
    );
    assert_eq!(status(&store, "w:1:1"), Status::Dead, "nothing changed");
    store
        .resolve(&cid("w:1:1"), "refunded by phone", at(11))
        .unwrap();
    let row = store.command(&cid("w:1:1")).unwrap().unwrap();
    assert_eq!(row.status, Status::Done);
    assert_eq!(row.resolution.as_deref(), Some("refunded by phone"));
    assert_eq!(row.processed_at, Some(at(11)));
    assert!(matches!(
        store.resolve(&cid("w:1:1"), "again", at(12)),
        Err(Error::InvalidState { .. })
    ));
    assert!(store.dead_letters(10).unwrap().is_empty());
    let store = h.reopen(store);
    assert_eq!(
        store
            .command(&cid("w:1:1"))
            .unwrap()
            .unwrap()
            .resolution
            .as_deref(),
        Some("refunded by phone")
    );
    assert_eq!(
        store
            .command(&cid("w:1:0"))
            .unwrap()
            .unwrap()
            .manual_retries,
        1
    );
}

/// With strict order, a command is not handed out while an earlier one of its workflow is pending or
/// leased; done and dead ones do not block.
pub fn strict_order_holds_back_later_commands<H: Harness>(h: &mut H) {
    let mut store = h.open();
    append(&mut store, "a", &["1", "2"]);
    append(&mut store, "a", &["3"]);
    append(&mut store, "b", &["1"]);
    let strict = |worker: &str| {
        ClaimRequest::new(worker)
            .limit(10)
            .lease_ttl(Duration::from_millis(1_000))
            .order(ClaimOrder::StrictPerWorkflow)
    };
    let ids = |ds: Vec<crate::Delivery>| {
        ds.into_iter()
            .map(|d| (d.command_id.to_string(), d.token))
            .collect::<Vec<_>>()
    };
    let first = ids(store.claim(&strict("w1"), T0).unwrap());
    assert_eq!(
        first.iter().map(|(id, _)| id.as_str()).collect::<Vec<_>>(),
        ["a:1:0", "b:1:0"]
    );
    assert!(
        store.claim(&strict("w2"), T0).unwrap().is_empty(),
        "a:1:1 waits for a:1:0"
    );
    // a:1:0 fails and waits for a retry: it still blocks.
    store
        .fail(
            &cid("a:1:0"),
            first[0].1,
            &Failure::retryable("later"),
            &policy(),
            T0,
        )
        .unwrap();
    assert!(store.claim(&strict("w2"), T0).unwrap().is_empty());
    let retry_at = store.command(&cid("a:1:0")).unwrap().unwrap().available_at;
    let again = ids(store.claim(&strict("w2"), retry_at).unwrap());
    assert_eq!(
        again.iter().map(|(id, _)| id.as_str()).collect::<Vec<_>>(),
        ["a:1:0"]
    );
    store
        .complete(&cid("a:1:0"), again[0].1, None, retry_at)
        .unwrap();
    let next = ids(store.claim(&strict("w2"), retry_at).unwrap());
    assert_eq!(
        next.iter().map(|(id, _)| id.as_str()).collect::<Vec<_>>(),
        ["a:1:1"]
    );
    store
        .fail(
            &cid("a:1:1"),
            next[0].1,
            &Failure::permanent("gone"),
            &policy(),
            retry_at,
        )
        .unwrap();
    let last = ids(store.claim(&strict("w2"), retry_at).unwrap());
    assert_eq!(
        last.iter().map(|(id, _)| id.as_str()).collect::<Vec<_>>(),
        ["a:2:0"],
        "a dead command does not block"
    );
    // Without strict order, later commands of a workflow go out beside earlier ones.
    let mut store = h.open();
    append(&mut store, "a", &["1", "2"]);
    assert_eq!(claim(&mut store, "w1", 10, 1_000, T0).len(), 2);
}

/// A released command is claimable again at once, its unstarted attempt not counted; a stale holder
/// cannot release.
pub fn release_gives_a_command_back_unattempted<H: Harness>(h: &mut H) {
    let mut store = h.open();
    append(&mut store, "w", &["x"]);
    let d = claim(&mut store, "w1", 1, 1_000, T0).remove(0);
    store.release(&d.command_id, d.token, at(10)).unwrap();
    let row = store.command(&d.command_id).unwrap().unwrap();
    assert_eq!(
        (row.status, row.attempts, row.available_at),
        (Status::Pending, 0, at(10))
    );
    let again = claim(&mut store, "w2", 1, 1_000, at(10)).remove(0);
    assert_eq!(again.attempt, 1);
    assert!(again.token > d.token);
    assert!(matches!(
        store.release(&d.command_id, d.token, at(11)),
        Err(Error::StaleLease { .. })
    ));
    assert_eq!(status(&store, "w:1:0"), Status::Leased);
}

/// A batch of acks completes the current leases and reports stale ones, one result per ack.
pub fn complete_all_settles_each_ack<H: Harness>(h: &mut H) {
    let mut store = h.open();
    append(&mut store, "w", &["a", "b", "c"]);
    let d = claim(&mut store, "w1", 3, 1_000, T0);
    let acks = vec![
        Ack::new(d[0].command_id.clone(), d[0].token),
        Ack::new(d[1].command_id.clone(), d[1].token + 1),
        Ack::new(d[2].command_id.clone(), d[2].token),
        Ack::new(cid("w:1:9"), 1),
    ];
    let results = store.complete_all(acks, at(1)).unwrap();
    assert_eq!(results.len(), 4);
    assert!(results[0].is_ok() && results[2].is_ok());
    assert!(matches!(results[1], Err(Error::StaleLease { .. })));
    assert!(matches!(results[3], Err(Error::UnknownCommand { .. })));
    assert_eq!(pending_ids(&store), ["w:1:1"]);
    assert_eq!(status(&store, "w:1:1"), Status::Leased);
}

/// Retention removes done rows older than the period, in bounded batches, and never a pending, leased
/// or dead one.
pub fn purge_done_removes_only_old_done_rows<H: Harness>(h: &mut H) {
    let mut store = h.open();
    append(
        &mut store,
        "w",
        &["done", "done", "done", "pending", "leased", "dead", "late"],
    );
    for n in 0..3 {
        store.mark_done(&cid(&format!("w:1:{n}")), at(0)).unwrap();
    }
    store.mark_done(&cid("w:1:6"), at(500)).unwrap();
    let leased = claim(&mut store, "w1", 3, 1_000_000, T0);
    assert_eq!(leased.len(), 3, "w:1:3, w:1:4, w:1:5");
    store.release(&cid("w:1:3"), leased[0].token, T0).unwrap();
    store
        .fail(
            &cid("w:1:5"),
            leased[2].token,
            &Failure::permanent("no"),
            &policy(),
            T0,
        )
        .unwrap();
    let keep = Duration::from_millis(1_000);
    // A batch of 0 would purge nothing and return 0: the loop "until it returns less than batch"
    // would never end.
    let err = store.purge_done(keep, at(1_000), 0).unwrap_err();
    assert!(
        err.code() == "INVALID_INPUT" && err.to_string().contains("batch"),
        "{err}"
    );
    assert_eq!(
        store.purge_done(keep, at(999), 10).unwrap(),
        0,
        "nothing is old enough yet"
    );
    assert_eq!(
        store.purge_done(keep, at(1_000), 2).unwrap(),
        2,
        "a batch is bounded"
    );
    assert_eq!(store.purge_done(keep, at(1_000), 2).unwrap(), 1);
    assert_eq!(store.purge_done(keep, at(1_000), 2).unwrap(), 0);
    let left: Vec<String> = store
        .commands(&wid("w"))
        .unwrap()
        .iter()
        .map(|r| format!("{} {}", r.command_id, r.status))
        .collect();
    assert_eq!(
        left,
        ["w:1:3 pending", "w:1:4 leased", "w:1:5 dead", "w:1:6 done"]
    );
    assert_eq!(store.purge_done(keep, at(1_500), 10).unwrap(), 1);
    assert_eq!(
        seqs(&store.load(&wid("w")).unwrap()),
        [1],
        "events are never purged"
    );
    let store = h.reopen(store);
    assert_eq!(store.commands(&wid("w")).unwrap().len(), 3);
    // Near the epoch too: a row done at time 0 is not older than 10 s at 5 s.
    let mut early = h.open();
    append(&mut early, "e", &["x"]);
    early.mark_done(&cid("e:1:0"), Timestamp::EPOCH).unwrap();
    let ten_s = Duration::from_secs(10);
    assert_eq!(
        early
            .purge_done(ten_s, Timestamp::from_millis(5_000), 10)
            .unwrap(),
        0
    );
    assert_eq!(
        early
            .purge_done(ten_s, Timestamp::from_millis(10_000), 10)
            .unwrap(),
        1
    );
}
