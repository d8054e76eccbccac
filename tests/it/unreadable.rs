//! Rows that cannot be read are isolated (DESIGN rule 13): a damaged or hand-edited payload, or one
//! nested deeper than the JSON reader allows, never stops other workflows' deliveries.

use std::time::Duration;

use miniflow::prelude::*;
use miniflow::{
    json, ClaimRequest, Command, Commit, Decision, Error, Event, Seq, SqliteStore, Status, Timer,
    Timestamp, WorkflowId, COMMAND_FAILED,
};
use tempfile::TempDir;

const T0: Timestamp = Timestamp::from_millis(1_000_000);

fn at(offset_ms: u64) -> Timestamp {
    Timestamp::from_millis(T0.as_millis() + offset_ms)
}

/// A store with one command in each of `broken` and `healthy`, due at `T0`: `broken`'s comes first in
/// claim order.
fn two_workflows() -> (TempDir, SqliteStore) {
    let dir = tempfile::tempdir().unwrap();
    let mut store = SqliteStore::open(dir.path().join("flow.db")).unwrap();
    for (workflow, kind) in [("broken", "book_hotel"), ("healthy", "book_flight")] {
        let decision = Decision::new().command(Command::new(kind, json!({ "to": "成都" })));
        let commit = Commit::new(
            WorkflowId::new(workflow).unwrap(),
            Seq::ZERO,
            Event::new("trip_requested", json!({})),
            decision,
            T0,
        )
        .unwrap();
        store.append_with_commands(&commit).unwrap();
    }
    (dir, store)
}

/// Writes `payload` into `broken:1:0` behind miniflow's back.
fn damage(store: &SqliteStore, payload: &str) {
    let changed = store
        .connection()
        .execute(
            "UPDATE outbox SET payload = ?1 WHERE workflow_id = 'broken' AND event_seq = 1",
            [payload],
        )
        .unwrap();
    assert_eq!(changed, 1);
}

/// `broken:1:0` as stored: status, last error, processed at.
fn stored(store: &SqliteStore) -> (String, String, Option<i64>) {
    store
        .connection()
        .query_row(
            "SELECT status, last_error, processed_at FROM outbox WHERE workflow_id = 'broken' AND event_seq = 1",
            [],
            |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
        )
        .unwrap()
}

/// Claims with limit 1: the unreadable row comes first, is buried, and `healthy`'s command is
/// delivered; the buried row has a clear last error and exactly one `command_failed` feedback.
fn claim_buries_the_unreadable_row_and_delivers_the_other(store: &mut SqliteStore, because: &str) {
    let request = ClaimRequest::new("worker").lease_ttl(Duration::from_secs(30));
    let delivered = store.claim(&request, at(10)).unwrap();
    assert_eq!(delivered.len(), 1, "the burial does not use up the limit");
    assert_eq!(delivered[0].command_id.to_string(), "healthy:1:0");
    assert_eq!(delivered[0].payload, json!({ "to": "成都" }));
    store
        .complete(&delivered[0].command_id, delivered[0].token, None, at(11))
        .unwrap();

    let (status, last_error, processed_at) = stored(store);
    assert_eq!(status, Status::Dead.as_str());
    assert_eq!(processed_at, Some(at(10).as_millis() as i64));
    assert!(
        last_error.contains("could not be read")
            && last_error.contains("column payload")
            && last_error.contains(because),
        "{last_error}"
    );
    let broken = WorkflowId::new("broken").unwrap();
    let feedback = store.timers(&broken).unwrap();
    assert_eq!(feedback.len(), 1, "{feedback:?}");
    assert_eq!(feedback[0].timer_id.to_string(), "broken:1:0:failed1");
    assert_eq!(feedback[0].event_kind, COMMAND_FAILED);
    assert_eq!(feedback[0].fire_at, at(10), "due at once");
    assert_eq!(
        feedback[0].event_payload,
        json!({ "command_id": "broken:1:0", "kind": "book_hotel", "error": last_error, "attempts": 0 })
    );
    let due = store
        .claim_timers(10, Duration::from_secs(5), at(12))
        .unwrap();
    assert_eq!(due.len(), 1, "the feedback can be fired");

    assert!(
        store.claim(&request, at(20)).unwrap().is_empty(),
        "a buried row is not looked at again"
    );
    assert_eq!(stored(store).0, "dead");
}

#[test]
fn a_payload_that_is_not_json_is_buried_and_other_workflows_are_still_delivered() {
    let (_dir, mut store) = two_workflows();
    damage(&store, "{\"to\": \"成");

    // The lists across workflows skip it; what names it says what is wrong, and where.
    let pending: Vec<String> = store
        .pending(10)
        .unwrap()
        .iter()
        .map(|row| row.command_id.to_string())
        .collect();
    assert_eq!(pending, ["healthy:1:0"]);
    let id = "broken:1:0".parse().unwrap();
    for answer in [
        store.command(&id).map(|_| ()),
        store
            .commands(&WorkflowId::new("broken").unwrap())
            .map(|_| ()),
    ] {
        match answer {
            Err(Error::Corrupt(message)) => assert!(
                message.contains("command broken:1:0") && message.contains("column payload"),
                "{message}"
            ),
            other => panic!("expected Corrupt, got {other:?}"),
        }
    }

    claim_buries_the_unreadable_row_and_delivers_the_other(&mut store, "EOF while parsing");
    assert!(
        store.dead_letters(10).unwrap().is_empty(),
        "dead letters skip what cannot be read"
    );
    assert!(store.pending(10).unwrap().is_empty());
}

#[test]
fn a_payload_nested_deeper_than_the_reader_allows_is_buried_too() {
    let (_dir, mut store) = two_workflows();
    // As an older version could have written it: 200 arrays deep, past serde_json's limit of 128.
    damage(&store, &format!("{}{}", "[".repeat(200), "]".repeat(200)));
    claim_buries_the_unreadable_row_and_delivers_the_other(&mut store, "recursion limit exceeded");
}

#[test]
fn an_unreadable_row_in_strict_order_is_buried_and_its_workflow_goes_on() {
    let (_dir, mut store) = two_workflows();
    let broken = WorkflowId::new("broken").unwrap();
    let next = Commit::new(
        broken.clone(),
        Seq::new(1).unwrap(),
        Event::new("more", json!({})),
        Decision::new().command(Command::new("book_taxi", json!({}))),
        T0,
    )
    .unwrap();
    store.append_with_commands(&next).unwrap();
    damage(&store, "not json");
    let strict = ClaimRequest::new("worker")
        .limit(10)
        .order(miniflow::ClaimOrder::StrictPerWorkflow);
    let ids = |deliveries: Vec<miniflow::Delivery>| -> Vec<String> {
        deliveries
            .iter()
            .map(|d| d.command_id.to_string())
            .collect()
    };
    // broken:2:0 was held back by broken:1:0 when the claim began; the next claim hands it out.
    assert_eq!(ids(store.claim(&strict, at(10)).unwrap()), ["healthy:1:0"]);
    assert_eq!(ids(store.claim(&strict, at(11)).unwrap()), ["broken:2:0"]);
    assert_eq!(stored(&store).0, "dead");
}

/// A timer whose stored event payload cannot be read ends `rejected` with the read error when a
/// firer comes to it; the other workflows' due timers are still taken, and the burial does not use
/// up the claim's limit (the core's timer claim reads on, as a command claim does).
#[test]
fn an_unreadable_timer_is_rejected_and_other_timers_are_still_taken() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = SqliteStore::open(dir.path().join("flow.db")).unwrap();
    for workflow in ["broken", "healthy"] {
        let decision = Decision::new().timer(Timer::after("t", Duration::ZERO, json!({})));
        let commit = Commit::new(
            WorkflowId::new(workflow).unwrap(),
            Seq::ZERO,
            Event::new("e", json!({})),
            decision,
            T0,
        )
        .unwrap();
        store.append_with_commands(&commit).unwrap();
    }
    store
        .connection()
        .execute(
            "UPDATE timers SET event_payload = '{\"payload\":' WHERE workflow_id = 'broken'",
            [],
        )
        .unwrap();
    // The broken timer comes first; buried, it leaves the one place to the healthy one.
    let taken = store.claim_timers(1, Duration::from_secs(1), T0).unwrap();
    assert_eq!(taken.len(), 1, "{taken:?}");
    assert_eq!(taken[0].timer_id.workflow_id().as_str(), "healthy");
    let (status, error): (String, String) = store
        .connection()
        .query_row(
            "SELECT status, last_error FROM timers WHERE workflow_id = 'broken'",
            [],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .unwrap();
    assert_eq!(status, "rejected");
    assert!(
        error.contains("could not be read") && error.contains("event_payload"),
        "{error}"
    );
    assert!(store
        .claim_timers(10, Duration::from_secs(1), at(10_000))
        .unwrap()
        .iter()
        .all(|t| t.timer_id.workflow_id().as_str() == "healthy"));
}
