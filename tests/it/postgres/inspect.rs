//! What operators' tools read of a PostgreSQL database besides its rows, in read-only sessions: a
//! row as stored, a workflow's events one by one, and what a purge would delete.

use std::time::Duration;

use super::TestDatabase;
use miniflow::prelude::*;
use miniflow::{
    json, Command, Commit, Decision, Error, Event, PostgresStore, Seq, Timestamp, WorkflowId,
};

/// A database with `w:1:0` done at 10 ms, `w:1:1` cancelled at 20 ms, `w:1:2` pending, and the
/// events `w#1` (which decided them) and `w#2`.
fn seeded() -> (TestDatabase, PostgresStore) {
    let database = TestDatabase::new();
    let mut store = PostgresStore::connect(&database.url()).unwrap();
    let w = WorkflowId::new("w").unwrap();
    let decision = Decision::new()
        .command(Command::new("a", json!({})))
        .command(Command::new("b", json!({})))
        .command(Command::new("c", json!({})));
    let first = Event::new("started", json!({ "n": 1 }));
    let commit = Commit::new(w.clone(), Seq::ZERO, first, decision, Timestamp::EPOCH).unwrap();
    store.append_with_commands(&commit).unwrap();
    let second = Event::new("noted", json!({ "n": 2 }));
    let commit = Commit::new(
        w,
        Seq::new(1).unwrap(),
        second,
        Decision::none(),
        Timestamp::EPOCH,
    )
    .unwrap();
    store.append_with_commands(&commit).unwrap();
    database
        .client()
        .batch_execute(
            "UPDATE outbox SET status = 'done', processed_at = 10 WHERE idx = 0;
             UPDATE outbox SET status = 'cancelled', processed_at = 20 WHERE idx = 1;",
        )
        .unwrap();
    (database, store)
}

#[test]
fn a_raw_row_is_every_column_as_stored_also_when_it_cannot_be_read() {
    let (database, _store) = seeded();
    database
        .client()
        .batch_execute("UPDATE outbox SET payload = 'not json {' WHERE idx = 2")
        .unwrap();
    let reader = PostgresStore::connect_read_only(&database.url()).unwrap();
    assert!(matches!(
        reader.command(&"w:1:2".parse().unwrap()),
        Err(Error::Corrupt(_))
    ));
    let columns = reader.raw_command("w:1:2").unwrap().unwrap();
    let column = |name: &str| {
        columns
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, value)| value.clone())
            .unwrap_or_else(|| panic!("no column {name} in {columns:?}"))
    };
    assert_eq!(column("payload"), json!("not json {"));
    assert_eq!(column("status"), json!("pending"));
    assert_eq!(column("idx"), json!(2));
    assert_eq!(column("processed_at"), json!(null));
    assert_eq!(column("report_result"), json!(false));
    assert_eq!(columns[0].0, "workflow_id", "in the table's order");
    for unknown in ["w:9:0", "w:1", "", "w:x:y"] {
        assert_eq!(reader.raw_command(unknown).unwrap(), None, "{unknown:?}");
    }
}

#[test]
fn an_unreadable_event_is_listed_apart_and_the_others_still_read() {
    let (database, store) = seeded();
    let w = WorkflowId::new("w").unwrap();
    let reader = PostgresStore::connect_read_only(&database.url()).unwrap();
    let listing = reader.events_listing(&w).unwrap();
    assert_eq!(listing.events, store.load(&w).unwrap());
    assert!(listing.unreadable.is_empty());

    database
        .client()
        .batch_execute(
            "UPDATE events SET payload = '{' WHERE seq = 1;
             INSERT INTO events VALUES ('w', 3, 'noted', '{}', -4);",
        )
        .unwrap();
    assert!(matches!(store.load(&w), Err(Error::Corrupt(_))));
    let listing = reader.events_listing(&w).unwrap();
    let seqs: Vec<u64> = listing.events.iter().map(|e| e.seq.get()).collect();
    assert_eq!(seqs, [2]);
    let unreadable: Vec<(&str, &str)> = listing
        .unreadable
        .iter()
        .map(|e| (e.seq.as_str(), e.error.as_str()))
        .collect();
    assert_eq!(unreadable.len(), 2, "{unreadable:?}");
    assert_eq!(unreadable[0].0, "1");
    assert!(
        unreadable[0]
            .1
            .starts_with("column payload cannot be read as JSON"),
        "{unreadable:?}"
    );
    assert_eq!(
        unreadable[1],
        ("3", "column recorded_at holds the negative time -4")
    );
    let unknown = WorkflowId::new("nobody").unwrap();
    let listing = reader.events_listing(&unknown).unwrap();
    assert!(listing.events.is_empty() && listing.unreadable.is_empty());
}

#[test]
fn the_purgeable_count_is_what_purge_done_then_deletes() {
    let at = Timestamp::from_millis;
    for (older_than, now, purged) in [
        (Duration::ZERO, at(9), 0),
        (Duration::ZERO, at(10), 1),
        (Duration::from_millis(10), at(29), 1),
        (Duration::from_millis(10), at(30), 2),
        (Duration::from_millis(31), at(30), 0),
        (Duration::MAX, at(u64::MAX), 0),
    ] {
        let (database, mut store) = seeded();
        let reader = PostgresStore::connect_read_only(&database.url()).unwrap();
        let counted = reader.count_purgeable(older_than, now).unwrap();
        assert_eq!(counted, purged, "{older_than:?} at {now}");
        assert_eq!(store.purge_done(older_than, now, 100).unwrap(), purged);
    }
}
