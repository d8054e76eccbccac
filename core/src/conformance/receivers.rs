//! Cases on receivers folding duplicates, with fenced reservations (DESIGN rules 10, 14).

use super::*;

fn key(text: &str) -> IdempotencyKey {
    IdempotencyKey::new(text).expect("valid key in test")
}

fn receiver_policy() -> IdempotencyPolicy {
    IdempotencyPolicy {
        retention: Duration::from_millis(10_000),
        reservation_timeout: Duration::from_millis(1_000),
    }
}

fn booking(traveller: &str) -> Digest {
    let request = json!({ "flight": "CA1405", "traveller": traveller, "sent_at": 1, "trace": "x" });
    Digest::of_intent(&request, &["flight", "traveller"])
}

/// The reservation token of a `Fresh` answer; panics on any other answer.
fn fresh(answer: Begin) -> u64 {
    match answer {
        Begin::Fresh { token } => token,
        other => panic!("expected Fresh, got {other:?}"),
    }
}

/// Fresh once; the same key and digest then get the stored result, with no new reservation.
pub fn first_begin_is_fresh_and_repeats_get_the_result<H: IdempotencyHarness>(h: &mut H) {
    let mut store = h.open(receiver_policy());
    let k = key("trip-001:1:0");
    let token = fresh(store.begin(&k, booking("Li Lei"), T0).unwrap());
    assert!(matches!(
        store.finish(&key("never-begun"), 1, &json!(1), T0),
        Err(Error::UnknownKey { .. })
    ));
    store
        .finish(
            &k,
            token,
            &json!({ "reference": "BK-1", "seats": [1, 2] }),
            at(5),
        )
        .unwrap();
    assert!(
        matches!(
            store.finish(&k, token, &json!({ "reference": "BK-2" }), at(6)),
            Err(Error::StaleReservation { .. })
        ),
        "finished twice"
    );
    let mut store = h.reopen(store);
    for later in [at(6), at(9_000)] {
        assert_eq!(
            store.begin(&k, booking("Li Lei"), later).unwrap(),
            Begin::Completed {
                result: json!({ "reference": "BK-1", "seats": [1, 2] })
            }
        );
    }
    // Another operation (another key) with the same parameters is another effect.
    fresh(
        store
            .begin(&key("trip-002:1:0"), booking("Li Lei"), at(7))
            .unwrap(),
    );
}

/// The same key with another digest is a conflict naming both digests, before and after completion;
/// the stored result is never handed out for it.
pub fn a_changed_digest_is_a_conflict<H: IdempotencyHarness>(h: &mut H) {
    let mut store = h.open(receiver_policy());
    let k = key("trip-001:1:0");
    let token = fresh(store.begin(&k, booking("Li Lei"), T0).unwrap());
    let conflict = Begin::Conflict {
        key: k.clone(),
        stored_digest: booking("Li Lei"),
        new_digest: booking("Han Meimei"),
    };
    assert_eq!(
        store.begin(&k, booking("Han Meimei"), at(1)).unwrap(),
        conflict,
        "while in progress"
    );
    store
        .finish(&k, token, &json!({ "reference": "BK-1" }), at(2))
        .unwrap();
    assert_eq!(
        store.begin(&k, booking("Han Meimei"), at(3)).unwrap(),
        conflict,
        "after completion"
    );
    let record = store.record(&k).unwrap().unwrap();
    assert_eq!(
        record.digest,
        booking("Li Lei"),
        "a conflict changes nothing"
    );
}

/// A held key answers `InProgress` until its reservation times out; then another caller takes it over.
/// `abandon` releases it at once.
pub fn reservations_block_then_can_be_taken_over<H: IdempotencyHarness>(h: &mut H) {
    let mut store = h.open(receiver_policy());
    let k = key("k");
    let first = fresh(store.begin(&k, booking("a"), T0).unwrap());
    assert_eq!(
        store.begin(&k, booking("a"), T0).unwrap(),
        Begin::InProgress { since: T0 },
        "a concurrent second caller waits"
    );
    assert_eq!(
        store.begin(&k, booking("a"), at(999)).unwrap(),
        Begin::InProgress { since: T0 }
    );
    let second = fresh(store.begin(&k, booking("a"), at(1_000)).unwrap());
    assert!(second > first, "a takeover gets a greater token");
    assert_eq!(
        store.begin(&k, booking("a"), at(1_001)).unwrap(),
        Begin::InProgress { since: at(1_000) }
    );
    store.abandon(&k, second).unwrap();
    assert!(
        matches!(
            store.abandon(&k, second),
            Err(Error::StaleReservation { .. })
        ),
        "abandoned once"
    );
    store.abandon(&key("never-begun"), 7).unwrap();
    let third = fresh(store.begin(&k, booking("a"), at(1_002)).unwrap());
    assert!(third > second, "tokens keep growing across an abandon");
    store.finish(&k, third, &json!("ok"), at(1_003)).unwrap();
    assert!(
        matches!(
            store.abandon(&k, third),
            Err(Error::StaleReservation { .. })
        ),
        "a finished effect cannot be abandoned"
    );
}

/// A holder whose reservation was taken over is fenced off (DESIGN rule 14): its `abandon` does not
/// release the new holder's reservation, its `finish` is refused and stores nothing, and the new
/// holder finishes as usual — so a third caller never gets `Fresh`.
pub fn stale_holders_are_fenced<H: IdempotencyHarness>(h: &mut H) {
    let mut store = h.open(receiver_policy());
    let k = key("trip-001:1:0");
    let stale = fresh(store.begin(&k, booking("a"), T0).unwrap());
    let current = fresh(store.begin(&k, booking("a"), at(1_000)).unwrap());

    let err = store.abandon(&k, stale).unwrap_err();
    assert_eq!(err.code(), "STALE_RESERVATION");
    assert!(err.to_string().contains(&stale.to_string()), "{err}");
    assert_eq!(
        store.begin(&k, booking("a"), at(1_001)).unwrap(),
        Begin::InProgress { since: at(1_000) },
        "the stale abandon released nothing: a third caller waits"
    );
    assert!(matches!(
        store.finish(&k, stale, &json!("stale"), at(1_002)),
        Err(Error::StaleReservation { .. })
    ));
    let mut store = h.reopen(store);
    assert_eq!(
        store.record(&k).unwrap().unwrap().state,
        RecordState::Reserved,
        "the stale finish stored nothing"
    );
    store
        .finish(&k, current, &json!({ "reference": "BK-2" }), at(1_003))
        .unwrap();
    assert_eq!(
        store.begin(&k, booking("a"), at(1_004)).unwrap(),
        Begin::Completed {
            result: json!({ "reference": "BK-2" })
        }
    );
    // A late finish without a takeover is still the holder's.
    let late = fresh(store.begin(&key("slow"), booking("a"), at(2_000)).unwrap());
    store
        .finish(&key("slow"), late, &json!("late"), at(9_000))
        .unwrap();
}

/// A token never comes back: not after an abandon, nor after the record expired or was purged.
pub fn reservation_tokens_never_repeat<H: IdempotencyHarness>(h: &mut H) {
    let mut store = h.open(receiver_policy());
    let k = key("k");
    let mut seen = vec![fresh(store.begin(&k, booking("a"), T0).unwrap())];
    store.abandon(&k, seen[0]).unwrap();
    seen.push(fresh(store.begin(&k, booking("a"), T0).unwrap()));
    // Past retention, the expired reservation is replaced.
    seen.push(fresh(store.begin(&k, booking("a"), at(20_000)).unwrap()));
    assert_eq!(store.purge(at(40_000), 10).unwrap(), 1);
    seen.push(fresh(store.begin(&k, booking("a"), at(40_000)).unwrap()));
    for pair in seen.windows(2) {
        assert!(pair[1] > pair[0], "tokens {seen:?} must grow");
    }
    for old in &seen[..3] {
        assert!(matches!(
            store.finish(&k, *old, &json!(1), at(40_001)),
            Err(Error::StaleReservation { .. })
        ));
    }
}

/// A result over the JSON limits is refused naming `result`, and the reservation stays, so the holder
/// can still finish with a smaller result or abandon.
pub fn oversized_results_are_refused_and_the_reservation_stays<H: IdempotencyHarness>(h: &mut H) {
    let mut store = h.open(receiver_policy());
    let k = key("k");
    let token = fresh(store.begin(&k, booking("a"), T0).unwrap());
    let mut deep = json!(1);
    for _ in 0..65 {
        deep = json!([deep]);
    }
    let err = store.finish(&k, token, &deep, at(1)).unwrap_err();
    assert_eq!(err.code(), "INVALID_INPUT");
    assert!(err.to_string().contains("result"), "{err}");
    let mut store = h.reopen(store);
    assert_eq!(
        store.record(&k).unwrap().unwrap().state,
        RecordState::Reserved
    );
    store.finish(&k, token, &json!("small"), at(2)).unwrap();
}

/// Records are kept for the retention period and not a moment less; `purge` forgets only older ones,
/// in bounded batches.
pub fn records_expire_after_retention_and_not_before<H: IdempotencyHarness>(h: &mut H) {
    let mut store = h.open(receiver_policy());
    for n in 0..5 {
        let k = key(&format!("k{n}"));
        let token = fresh(store.begin(&k, booking("a"), T0).unwrap());
        store.finish(&k, token, &json!(n), at(100)).unwrap();
    }
    let token = fresh(store.begin(&key("fresh"), booking("a"), at(5_000)).unwrap());
    store
        .finish(&key("fresh"), token, &json!("x"), at(5_000))
        .unwrap();
    assert_eq!(
        store.purge(at(10_099), 10).unwrap(),
        0,
        "kept for the whole retention"
    );
    assert_eq!(
        store.begin(&key("k0"), booking("a"), at(10_099)).unwrap(),
        Begin::Completed { result: json!(0) }
    );
    let err = store.purge(at(10_100), 0).unwrap_err();
    assert!(
        err.code() == "INVALID_INPUT" && err.to_string().contains("batch"),
        "{err}"
    );
    assert_eq!(store.purge(at(10_100), 2).unwrap(), 2, "bounded batch");
    assert_eq!(store.purge(at(10_100), 2).unwrap(), 2);
    assert_eq!(store.purge(at(10_100), 2).unwrap(), 1);
    assert_eq!(store.purge(at(10_100), 2).unwrap(), 0);
    let store_after = h.reopen(store);
    assert!(store_after.record(&key("k3")).unwrap().is_none());
    assert!(
        store_after.record(&key("fresh")).unwrap().is_some(),
        "a younger record stays"
    );
    let mut store = store_after;
    // Once retention has passed, the key is forgotten even before a purge: a new effect would follow.
    let token = fresh(store.begin(&key("old"), booking("a"), T0).unwrap());
    store.finish(&key("old"), token, &json!(1), T0).unwrap();
    fresh(store.begin(&key("old"), booking("a"), at(10_000)).unwrap());
    // Near the epoch too: a record finished at time 0 is kept until the retention has passed.
    let mut early = h.open(receiver_policy());
    let token = fresh(
        early
            .begin(&key("k"), booking("a"), Timestamp::EPOCH)
            .unwrap(),
    );
    early
        .finish(&key("k"), token, &json!(1), Timestamp::EPOCH)
        .unwrap();
    assert_eq!(early.purge(Timestamp::from_millis(9_999), 10).unwrap(), 0);
    assert_eq!(early.purge(Timestamp::from_millis(10_000), 10).unwrap(), 1);
}
