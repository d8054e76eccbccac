//! Cases on trace contexts and due times handed to deliveries.

use super::*;
use crate::TraceContext;

const PRODUCER: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// The trace context a commit carries is stored with each of its commands (after a reopen too) and
/// handed to every delivery of them, retries and takeovers included; a commit without one stores
/// none. Each delivery says when its command became due: its creation, its retry time, or the
/// expiry of the lease it took over.
pub fn trace_contexts_and_due_times_reach_every_delivery<H: Harness>(h: &mut H) {
    let mut store = h.open();
    let context = TraceContext::parse(PRODUCER, Some("vendor=abc,other=1")).expect("valid context");
    let commit = Commit::new(
        wid("traced"),
        Seq::ZERO,
        Event::new("happened", json!({})),
        commands(&["a", "b"]),
        T0,
    )
    .expect("valid commit")
    .traced(context.clone());
    store.append_with_commands(&commit).expect("commit");
    append(&mut store, "plain", &["c"]);
    let mut store = h.reopen(store);

    for row in store.commands(&wid("traced")).unwrap() {
        assert_eq!(
            row.trace_context.as_ref(),
            Some(&context),
            "{}",
            row.command_id
        );
    }
    assert_eq!(
        store.commands(&wid("plain")).unwrap()[0].trace_context,
        None
    );

    let first = claim(&mut store, "w1", 10, 1_000, at(5));
    assert_eq!(first.len(), 3);
    for delivery in &first {
        assert_eq!(
            delivery.due_at, T0,
            "due since its commit: {}",
            delivery.command_id
        );
        let expected = (delivery.command_id.workflow_id().as_str() == "traced").then_some(&context);
        assert_eq!(
            delivery.trace_context.as_ref(),
            expected,
            "{}",
            delivery.command_id
        );
    }
    let a = first
        .iter()
        .find(|d| d.command_id.to_string() == "traced:1:0")
        .expect("a delivered");
    let settled = store
        .fail(
            &a.command_id,
            a.token,
            &Failure::retryable("503"),
            &policy(),
            at(10),
        )
        .unwrap();
    let Settled::RetryAt { at: retry_at, .. } = settled else {
        panic!("a retry, not {settled:?}");
    };
    // `b` (traced:1:1) and `c` keep their leases until at(1005); `a` comes back at its retry time.
    let again = claim(&mut store, "w2", 10, 100, retry_at);
    assert_eq!(again.len(), 1, "only the retry: {again:?}");
    assert_eq!(again[0].due_at, retry_at);
    assert_eq!(
        again[0].trace_context.as_ref(),
        Some(&context),
        "a retry keeps the trace"
    );
    let taken_over = claim(&mut store, "w3", 10, 100, at(2_000));
    let b = taken_over
        .iter()
        .find(|d| d.command_id.to_string() == "traced:1:1")
        .expect("b taken over");
    assert_eq!(
        b.due_at,
        at(1_005),
        "due when the lease it took over ran out"
    );
    assert_eq!(
        b.trace_context.as_ref(),
        Some(&context),
        "a takeover keeps the trace"
    );
}
