//! miniflow inside the application's own transaction, on SQLite.
//!
//! - The outbox joins the caller's transaction (`SqliteStore::append_in`,
//!   `SqliteStore::handle_in`): the application's rows and the workflow's event and commands commit
//!   together or not at all, and a commit that fails leaves nothing of itself while the caller's
//!   earlier writes stay (DESIGN rule 3).
//! - The receiver's effect and its idempotency record commit together
//!   (`SqliteIdempotencyStore::finish_in`): a holder whose reservation was taken over finds its
//!   token stale, rolls back, and its effect goes with it — exactly one effect (DESIGN rule 14).

use std::path::{Path, PathBuf};
use std::time::Duration;

use miniflow::backend::RecordState;
use miniflow::prelude::*;
use miniflow::rusqlite::{Connection, TransactionBehavior};
use miniflow::{
    json, Begin, Command, Commit, Decision, Digest, Engine, Error, Event, EventRecord,
    IdempotencyKey, IdempotencyPolicy, IdempotencyStore, Seq, SqliteIdempotencyStore, SqliteStore,
    Timestamp, Workflow, WorkflowId,
};

/// A shop: `order_placed` charges the card (asking for the result) and reserves the stock;
/// `order_refused` is refused by the workflow.
struct Shop;

impl Workflow for Shop {
    type State = ();

    fn evolve(&self, _: &mut (), _: &EventRecord) {}

    fn decide(&self, _: &(), event: &EventRecord) -> Decision {
        match event.kind.as_str() {
            "order_placed" => Decision::new()
                .command(Command::new("charge_card", event.payload.clone()).report_result())
                .command(Command::new("reserve_stock", event.payload.clone())),
            "order_refused" => Decision::reject("the shop is closed"),
            _ => Decision::none(),
        }
    }
}

fn at(millis: u64) -> Timestamp {
    Timestamp::from_millis(millis)
}

fn order(n: u32) -> WorkflowId {
    WorkflowId::new(format!("order-{n}")).unwrap()
}

/// The shop's file: miniflow's tables (through the store, opened first) and the shop's `orders`,
/// and the shop's own connection to it.
fn shop(dir: &Path) -> (PathBuf, SqliteStore, Connection) {
    let path = dir.join("shop.db");
    let store = SqliteStore::open(&path).unwrap();
    let conn = Connection::open(&path).unwrap();
    conn.execute_batch(
        "PRAGMA synchronous = FULL;
         CREATE TABLE orders (id TEXT PRIMARY KEY, total INTEGER NOT NULL);",
    )
    .unwrap();
    (path, store, conn)
}

fn orders(conn: &Connection) -> Vec<String> {
    conn.prepare("SELECT id FROM orders ORDER BY id")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

fn placed(total: u32) -> Event {
    Event::new("order_placed", json!({ "total": total }))
}

/// Nothing of `id`'s workflow is in the store: no event, no command, no timer.
fn assert_no_trace(store: &SqliteStore, id: &WorkflowId, context: &str) {
    assert!(store.load(id).unwrap().is_empty(), "{context}: events");
    assert!(
        store.commands(id).unwrap().is_empty(),
        "{context}: commands"
    );
    assert!(store.timers(id).unwrap().is_empty(), "{context}: timers");
}

#[test]
fn an_order_row_and_its_workflow_commit_together() {
    let dir = tempfile::tempdir().unwrap();
    let (_, store, mut conn) = shop(dir.path());
    let engine = Engine::new(Shop);

    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .unwrap();
    tx.execute("INSERT INTO orders VALUES ('order-1', 1200)", [])
        .unwrap();
    let handled = SqliteStore::handle_in(&tx, &engine, &order(1), placed(1200), at(1_000)).unwrap();
    assert_eq!(handled.seq, Seq::new(1).unwrap());
    let ids: Vec<String> = handled.command_ids.iter().map(|c| c.to_string()).collect();
    assert_eq!(ids, ["order-1:1:0", "order-1:1:1"]);
    // Not committed yet: other connections see nothing of it, and no worker can claim it.
    assert_no_trace(&store, &order(1), "before the commit");
    assert!(store.pending(10).unwrap().is_empty());
    tx.commit().unwrap();

    assert_eq!(orders(&conn), ["order-1"]);
    let events = store.load(&order(1)).unwrap();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].kind, "order_placed");
    let commands = store.commands(&order(1)).unwrap();
    assert_eq!(commands.len(), 2);
    assert!(commands[0].report_result && !commands[1].report_result);
    assert_eq!(store.pending(10).unwrap().len(), 2, "deliverable like any");

    // The next event of the workflow, in another transaction of the caller's, follows seq 1.
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .unwrap();
    tx.execute("UPDATE orders SET total = 1300 WHERE id = 'order-1'", [])
        .unwrap();
    let handled = SqliteStore::handle_in(
        &tx,
        &engine,
        &order(1),
        Event::new("order_amended", json!({ "total": 1300 })),
        at(2_000),
    )
    .unwrap();
    assert_eq!(handled.seq, Seq::new(2).unwrap());
    assert!(handled.command_ids.is_empty());
    tx.commit().unwrap();
    assert_eq!(store.load(&order(1)).unwrap().len(), 2);
}

#[test]
fn a_rolled_back_transaction_leaves_neither_the_row_nor_the_commit() {
    let dir = tempfile::tempdir().unwrap();
    let (_, store, mut conn) = shop(dir.path());
    let engine = Engine::new(Shop);

    // Rolled back explicitly, after the commit was written into it.
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .unwrap();
    tx.execute("INSERT INTO orders VALUES ('order-1', 1200)", [])
        .unwrap();
    SqliteStore::handle_in(&tx, &engine, &order(1), placed(1200), at(1_000)).unwrap();
    tx.rollback().unwrap();
    assert!(orders(&conn).is_empty());
    assert_no_trace(&store, &order(1), "after a rollback");

    // Dropped without a commit (the caller returned early with an error, say): the same.
    {
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .unwrap();
        tx.execute("INSERT INTO orders VALUES ('order-1', 1200)", [])
            .unwrap();
        let commit = Commit::new(
            order(1),
            Seq::ZERO,
            placed(1200),
            Decision::new().command(Command::new("charge_card", json!({ "total": 1200 }))),
            at(1_000),
        )
        .unwrap();
        SqliteStore::append_in(&tx, &commit).unwrap();
    }
    assert!(orders(&conn).is_empty());
    assert_no_trace(&store, &order(1), "after a dropped transaction");

    // The workflow starts afresh: seq 1 and the same command IDs, as if nothing had happened.
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .unwrap();
    tx.execute("INSERT INTO orders VALUES ('order-1', 1200)", [])
        .unwrap();
    let handled = SqliteStore::handle_in(&tx, &engine, &order(1), placed(1200), at(3_000)).unwrap();
    tx.commit().unwrap();
    assert_eq!(handled.seq, Seq::new(1).unwrap());
    assert_eq!(handled.command_ids[0].to_string(), "order-1:1:0");
    assert_eq!(store.commands(&order(1)).unwrap().len(), 2);
}

#[test]
fn a_stale_commit_leaves_nothing_of_itself_and_the_caller_keeps_its_own_writes() {
    let dir = tempfile::tempdir().unwrap();
    let (_, mut store, mut conn) = shop(dir.path());
    let engine = Engine::new(Shop);
    engine
        .handle(&mut store, &order(1), placed(1200), at(1_000))
        .unwrap();
    let before = store.commands(&order(1)).unwrap();

    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .unwrap();
    tx.execute("INSERT INTO orders VALUES ('order-1', 1200)", [])
        .unwrap();
    // Decided on a stale view: the workflow is at seq 1, the commit expects 0.
    let stale = Commit::new(
        order(1),
        Seq::ZERO,
        placed(999),
        Decision::new().command(Command::new("charge_card", json!({ "total": 999 }))),
        at(2_000),
    )
    .unwrap();
    match SqliteStore::append_in(&tx, &stale) {
        Err(Error::Conflict {
            expected, actual, ..
        }) => {
            assert_eq!((expected, actual), (Seq::ZERO, Seq::new(1).unwrap()));
        }
        other => panic!("a stale expected seq was written: {other:?}"),
    }
    // The transaction is still the caller's: it goes on and commits its own rows.
    tx.execute("INSERT INTO orders VALUES ('order-2', 50)", [])
        .unwrap();
    tx.commit().unwrap();

    assert_eq!(orders(&conn), ["order-1", "order-2"]);
    let events = store.load(&order(1)).unwrap();
    assert_eq!(events.len(), 1, "only the first event");
    assert_eq!(events[0].payload["total"], 1200);
    assert_eq!(store.commands(&order(1)).unwrap(), before);
}

#[test]
fn a_rejected_event_leaves_nothing_and_the_caller_keeps_its_own_writes() {
    let dir = tempfile::tempdir().unwrap();
    let (_, store, mut conn) = shop(dir.path());
    let engine = Engine::new(Shop);

    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .unwrap();
    tx.execute("INSERT INTO orders VALUES ('order-1', 1200)", [])
        .unwrap();
    let refused = Event::new("order_refused", json!({ "total": 1200 }));
    match SqliteStore::handle_in(&tx, &engine, &order(1), refused, at(1_000)) {
        Err(Error::Rejected { reason, .. }) => assert_eq!(reason, "the shop is closed"),
        other => panic!("a rejected event was handled: {other:?}"),
    }
    tx.commit().unwrap();

    assert_eq!(orders(&conn), ["order-1"], "the caller's row is kept");
    assert_no_trace(&store, &order(1), "after a rejection");
}

#[test]
fn a_commit_failing_half_way_is_undone_to_its_savepoint_and_the_caller_keeps_its_own_writes() {
    let dir = tempfile::tempdir().unwrap();
    let (_, store, mut conn) = shop(dir.path());
    // The second command of the commit cannot be written: by then its event and first command are.
    conn.execute_batch(
        "CREATE TRIGGER no_poison BEFORE INSERT ON outbox WHEN NEW.kind = 'poison' \
         BEGIN SELECT RAISE(ABORT, 'poison refused'); END;",
    )
    .unwrap();
    let commit = |now| {
        Commit::new(
            order(1),
            Seq::ZERO,
            placed(1200),
            Decision::new()
                .command(Command::new("charge_card", json!({ "total": 1200 })))
                .command(Command::new("poison", json!({}))),
            at(now),
        )
        .unwrap()
    };

    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .unwrap();
    tx.execute("INSERT INTO orders VALUES ('order-1', 1200)", [])
        .unwrap();
    let err = SqliteStore::append_in(&tx, &commit(1_000)).unwrap_err();
    assert!(
        matches!(err, Error::Storage(_)) && err.to_string().contains("poison refused"),
        "{err}"
    );
    // Inside the still-open transaction, nothing of the commit is left: not its event, not its
    // first command.
    let written: i64 = tx
        .query_row(
            "SELECT (SELECT COUNT(*) FROM events) + (SELECT COUNT(*) FROM outbox)",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(
        written, 0,
        "a half-written commit stayed in the transaction"
    );
    tx.execute("INSERT INTO orders VALUES ('order-2', 50)", [])
        .unwrap();
    tx.commit().unwrap();
    assert_eq!(orders(&conn), ["order-1", "order-2"]);
    assert_no_trace(&store, &order(1), "after a failed commit");

    // Nothing of it is in the way of the same commit, once it can be written.
    conn.execute_batch("DROP TRIGGER no_poison").unwrap();
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .unwrap();
    SqliteStore::append_in(&tx, &commit(2_000)).unwrap();
    tx.commit().unwrap();
    assert_eq!(store.load(&order(1)).unwrap().len(), 1);
    assert_eq!(store.commands(&order(1)).unwrap().len(), 2);
}

/// The supplier's file: its idempotency records (opened first) and its `bookings`, on its own
/// connection. Reservations hold 1 s.
fn supplier(dir: &Path) -> (SqliteIdempotencyStore, Connection) {
    let path = dir.join("supplier.db");
    let policy = IdempotencyPolicy {
        retention: Duration::from_secs(24 * 3600),
        reservation_timeout: Duration::from_secs(1),
    };
    let keys = SqliteIdempotencyStore::open(&path, policy).unwrap();
    let conn = Connection::open(&path).unwrap();
    conn.execute_batch("CREATE TABLE bookings (key TEXT NOT NULL, holder TEXT NOT NULL)")
        .unwrap();
    (keys, conn)
}

/// Books as `holder` and records it under `token`, in one transaction: committed when `finish_in`
/// accepts the token, rolled back (booking and all) when it does not.
fn book(
    keys: &SqliteIdempotencyStore,
    conn: &mut Connection,
    key: &IdempotencyKey,
    token: u64,
    holder: &str,
    now: Timestamp,
) -> Result<(), Error> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .unwrap();
    tx.execute(
        "INSERT INTO bookings VALUES (?1, ?2)",
        [key.as_str(), holder],
    )
    .unwrap();
    match keys.finish_in(&tx, key, token, &json!({ "booked_by": holder }), now) {
        Ok(()) => {
            tx.commit().unwrap();
            Ok(())
        }
        Err(e) => {
            tx.rollback().unwrap();
            Err(e)
        }
    }
}

fn bookings(conn: &Connection) -> Vec<(String, String)> {
    conn.prepare("SELECT key, holder FROM bookings ORDER BY rowid")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

fn fresh(begun: Begin) -> u64 {
    match begun {
        Begin::Fresh { token } => token,
        other => panic!("expected a fresh reservation, got {other:?}"),
    }
}

#[test]
fn a_stale_holders_effect_rolls_back_with_its_record_and_the_current_holders_effect_stays() {
    // Whichever of the two finishes first, one booking stays: the current holder's.
    for stale_finishes_first in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let (mut keys, mut conn) = supplier(dir.path());
        let key = IdempotencyKey::new("trip-001:1:0").unwrap();
        let digest = Digest::of(&json!({ "flight": "CA1405" }));

        let first = fresh(keys.begin(&key, digest, at(0)).unwrap());
        // The first holder is slow; its reservation times out and a redelivery takes the key over.
        assert!(matches!(
            keys.begin(&key, digest, at(999)).unwrap(),
            Begin::InProgress { .. }
        ));
        let second = fresh(keys.begin(&key, digest, at(1_000)).unwrap());
        assert!(second > first);

        let stale = |keys: &SqliteIdempotencyStore, conn: &mut Connection| {
            match book(keys, conn, &key, first, "first", at(1_500)) {
                Err(Error::StaleReservation { token, .. }) => assert_eq!(token, first),
                other => panic!("a stale holder finished: {other:?}"),
            }
            let booked = bookings(conn);
            assert!(
                booked.iter().all(|(_, holder)| holder != "first"),
                "the stale holder's booking outlived its rollback: {booked:?}"
            );
        };
        if stale_finishes_first {
            stale(&keys, &mut conn);
            assert!(bookings(&conn).is_empty());
        }
        book(&keys, &mut conn, &key, second, "second", at(1_200)).unwrap();
        if !stale_finishes_first {
            stale(&keys, &mut conn);
        }

        assert_eq!(
            bookings(&conn),
            [(key.to_string(), "second".to_owned())],
            "exactly one booking, the current holder's (stale first: {stale_finishes_first})"
        );
        assert_eq!(
            keys.begin(&key, digest, at(2_000)).unwrap(),
            Begin::Completed {
                result: json!({ "booked_by": "second" })
            }
        );
    }
}

#[test]
fn a_receiver_transaction_that_never_commits_leaves_no_effect_and_the_key_reserved() {
    let dir = tempfile::tempdir().unwrap();
    let (mut keys, mut conn) = supplier(dir.path());
    let key = IdempotencyKey::new("trip-001:1:0").unwrap();
    let digest = Digest::of(&json!({ "flight": "CA1405" }));
    let token = fresh(keys.begin(&key, digest, at(0)).unwrap());

    // The effect and its record are written, and the transaction ends without a commit (the
    // process died, say): neither is there.
    {
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .unwrap();
        tx.execute("INSERT INTO bookings VALUES (?1, 'lost')", [key.as_str()])
            .unwrap();
        keys.finish_in(&tx, &key, token, &json!({ "booked_by": "lost" }), at(10))
            .unwrap();
    }
    assert!(bookings(&conn).is_empty());
    let record = keys.record(&key).unwrap().unwrap();
    assert_eq!(
        (record.state, record.token),
        (RecordState::Reserved, token),
        "the key is still reserved, not completed"
    );

    // A redelivery waits for the reservation to time out, then books once.
    assert!(matches!(
        keys.begin(&key, digest, at(500)).unwrap(),
        Begin::InProgress { .. }
    ));
    let again = fresh(keys.begin(&key, digest, at(1_000)).unwrap());
    book(&keys, &mut conn, &key, again, "redelivery", at(1_100)).unwrap();
    assert_eq!(
        bookings(&conn),
        [(key.to_string(), "redelivery".to_owned())]
    );
    assert_eq!(
        keys.begin(&key, digest, at(1_200)).unwrap(),
        Begin::Completed {
            result: json!({ "booked_by": "redelivery" })
        }
    );
}
