//! Cases on what operators read and control: stats, priorities, paused kinds, concurrency limits and
//! bulk actions on dead commands.

use super::*;
use crate::KindStats;

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
