//! Retention of finished workflows on PostgreSQL: the contract the SQLite store keeps, and commits
//! that race a retirement from other connections.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::TestDatabase;
use crate::retention::{assert_retired, at, retention_retires_only_finished_workflows, wid};
use miniflow::prelude::*;
use miniflow::{json, Command, Commit, Decision, Event, PostgresStore, Seq};

const WEEK: Duration = Duration::from_secs(7 * 24 * 3600);
const DAY: u64 = 24 * 3600 * 1000;

#[test]
fn retention_retires_only_workflows_finished_long_enough_and_refuses_their_ids_afterwards() {
    let database = TestDatabase::new();
    let mut store = PostgresStore::connect(&database.url()).unwrap();
    retention_retires_only_finished_workflows(&mut store, |store, older_than, now, batch| {
        store.purge_finished(older_than, now, batch)
    });
}

/// Commits event `seq` of `workflow` (with one command if `command`), after `seq - 1`.
fn commit(workflow: &str, seq: u64, command: bool, now: u64) -> Commit {
    let decision = if command {
        Decision::new().command(Command::new("work", json!({})))
    } else {
        Decision::none()
    };
    Commit::new(
        wid(workflow),
        Seq::new(seq - 1).unwrap(),
        Event::new("noted", json!({})),
        decision,
        at(now),
    )
    .unwrap()
}

/// A transaction that committed into a workflow holds it until it ends: retention skips it at once,
/// without waiting, and retires it by a later run once it is finished.
#[test]
fn retention_skips_a_workflow_an_open_transaction_committed_into() {
    let database = TestDatabase::new();
    let mut store = PostgresStore::connect(&database.url()).unwrap();
    store
        .append_with_commands(&commit("held", 1, false, 0))
        .unwrap();
    store
        .append_with_commands(&commit("free", 1, false, 0))
        .unwrap();
    let mut client = store.client().unwrap();
    let mut tx = client.transaction().unwrap();
    store
        .append_in(&mut tx, &commit("held", 2, false, 1))
        .unwrap();

    let now = at(10 * DAY);
    assert_eq!(
        store.count_finished(WEEK, now).unwrap(),
        2,
        "both look finished"
    );
    let (answer, answered) = mpsc::channel();
    let mut purger = store.clone();
    std::thread::spawn(move || answer.send(purger.purge_finished(WEEK, now, 10)).unwrap());
    let retired = answered
        .recv_timeout(Duration::from_secs(20))
        .expect("retention waited for the open transaction");
    assert_eq!(retired.unwrap(), 1, "only the workflow nothing holds");
    assert!(store.load(&wid("free")).unwrap().is_empty());

    tx.commit().unwrap();
    assert_eq!(
        store.load(&wid("held")).unwrap().len(),
        2,
        "its commit stands"
    );
    assert_eq!(
        store.purge_finished(WEEK, now, 10).unwrap(),
        1,
        "retired later"
    );
    assert!(store.load(&wid("held")).unwrap().is_empty());
}

/// A commit that waits behind a retirement holding its workflow's last event finds the event gone
/// once the retirement commits: it writes nothing (no history starting over after a deleted one)
/// and is told that the workflow is retired.
#[test]
fn a_commit_waiting_behind_a_retirement_writes_nothing_and_is_told_it_is_retired() {
    let database = TestDatabase::new();
    let mut store = PostgresStore::connect(&database.url()).unwrap();
    store
        .append_with_commands(&commit("w", 1, false, 0))
        .unwrap();

    // A retirement as `purge_finished` runs it, held open at its lock.
    let mut retiring = database.client();
    let mut retirement = retiring.transaction().unwrap();
    let locked = retirement
        .query(
            "SELECT seq FROM events WHERE workflow_id = 'w' \
             ORDER BY seq DESC LIMIT 1 FOR UPDATE SKIP LOCKED",
            &[],
        )
        .unwrap();
    assert_eq!(locked.len(), 1);

    let (answer, answered) = mpsc::channel();
    let mut committer = store.clone();
    std::thread::spawn(move || {
        let result = committer.append_with_commands(&commit("w", 2, true, 1));
        answer.send(result).unwrap();
    });
    // Wait until the commit waits for the lock.
    let mut watcher = database.client();
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let waiting: i64 = watcher
            .query_one(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE datname = current_database() AND wait_event_type = 'Lock'",
                &[],
            )
            .unwrap()
            .get(0);
        if waiting > 0 {
            break;
        }
        assert!(
            answered.try_recv().is_err(),
            "the commit did not wait for the retirement's lock"
        );
        assert!(Instant::now() < until, "the commit never waited");
        std::thread::sleep(Duration::from_millis(10));
    }
    retirement
        .batch_execute(
            "DELETE FROM events WHERE workflow_id = 'w'; \
             INSERT INTO retired_workflows (workflow_id, last_seq, retired_at) VALUES ('w', 1, 5)",
        )
        .unwrap();
    retirement.commit().unwrap();

    let result = answered.recv_timeout(Duration::from_secs(20)).unwrap();
    assert_retired(result);
    assert!(
        store.load(&wid("w")).unwrap().is_empty(),
        "no history begun after the deleted one"
    );
    assert!(store.commands(&wid("w")).unwrap().is_empty());
}

fn repeatable(client: &mut miniflow::postgres::Client) -> miniflow::postgres::Transaction<'_> {
    client
        .build_transaction()
        .isolation_level(miniflow::postgres::IsolationLevel::RepeatableRead)
        .start()
        .unwrap()
}

/// A `REPEATABLE READ` transaction whose snapshot was taken before a workflow existed cannot see its
/// retirement: its first commit to the retired ID fails (a serialization error, `Busy`) instead of
/// starting the ID again, and run again in a new transaction it is told the workflow is retired.
/// A first commit of such a transaction with no retirement since its snapshot goes through.
#[test]
fn a_repeatable_read_snapshot_older_than_a_retirement_cannot_start_the_retired_id_again() {
    let database = TestDatabase::new();
    let mut store = PostgresStore::connect(&database.url()).unwrap();
    let mut client = store.client().unwrap();
    store
        .append_with_commands(&commit("old", 1, false, 0))
        .unwrap();
    let mut tx = repeatable(&mut client);
    tx.query("SELECT count(*) FROM events", &[]).unwrap(); // the snapshot
    store
        .append_in(&mut tx, &commit("new", 1, true, 0))
        .unwrap();
    // Retention does not wait for the transaction that holds the `retirements` row.
    let (answer, answered) = mpsc::channel();
    let mut purger = store.clone();
    std::thread::spawn(move || {
        answer
            .send(purger.purge_finished(WEEK, at(10 * DAY), 10))
            .unwrap()
    });
    let retired = answered
        .recv_timeout(Duration::from_secs(20))
        .expect("retention waited for a first commit of a repeatable-read transaction");
    assert_eq!(retired.unwrap(), 0, "skipped while the row is held");
    tx.commit().unwrap();
    assert_eq!(
        store.load(&wid("new")).unwrap().len(),
        1,
        "no retirement since its snapshot"
    );
    assert_eq!(
        store.purge_finished(WEEK, at(10 * DAY), 10).unwrap(),
        1,
        "old, later"
    );

    let mut tx = repeatable(&mut client);
    tx.query("SELECT count(*) FROM events", &[]).unwrap(); // the snapshot, before `w` exists
    store
        .append_with_commands(&commit("w", 1, false, 0))
        .unwrap();
    assert_eq!(store.purge_finished(WEEK, at(10 * DAY), 10).unwrap(), 1);
    let refused = store.append_in(&mut tx, &commit("w", 1, true, 1));
    assert_eq!(refused.unwrap_err().code(), "BUSY");
    drop(tx);
    assert!(store.load(&wid("w")).unwrap().is_empty());
    let mut tx = repeatable(&mut client);
    assert_retired(store.append_in(&mut tx, &commit("w", 1, true, 1)));
    drop(tx);
    assert!(store.commands(&wid("w")).unwrap().is_empty());
}

/// On a server whose default isolation is `REPEATABLE READ`, the store's own commits do not wait
/// for a retention in progress: its sessions run `READ COMMITTED`, which needs no fence.
#[test]
fn the_stores_own_commits_do_not_wait_for_retention_on_a_repeatable_read_server() {
    let database = TestDatabase::new();
    let mut admin = database.client();
    let name: String = admin
        .query_one("SELECT current_database()", &[])
        .unwrap()
        .get(0);
    admin
        .batch_execute(&format!(
            "ALTER DATABASE {name} SET default_transaction_isolation = 'repeatable read'"
        ))
        .unwrap();
    let store = PostgresStore::connect(&database.url()).unwrap();
    // A retention batch in progress: it holds the `retirements` row.
    let mut retention = database.client();
    let mut batch = retention.transaction().unwrap();
    batch
        .execute(
            "UPDATE retirements SET retired = retired + 1 WHERE id = 1",
            &[],
        )
        .unwrap();
    let (answer, answered) = mpsc::channel();
    let mut committer = store.clone();
    std::thread::spawn(move || {
        let plain = committer.append_with_commands(&commit("plain", 1, true, 0));
        // A commit with a timer runs in a transaction of the store's own.
        let decision = Decision::new().timer(miniflow::Timer::after(
            "later",
            Duration::from_secs(60),
            json!({}),
        ));
        let timed = Commit::new(
            wid("timed"),
            Seq::ZERO,
            Event::new("noted", json!({})),
            decision,
            at(0),
        )
        .unwrap();
        answer
            .send((plain, committer.append_with_commands(&timed)))
            .unwrap();
    });
    let (plain, timed) = answered
        .recv_timeout(Duration::from_secs(20))
        .expect("a commit of the store waited for the retention batch");
    plain.unwrap();
    timed.unwrap();
    batch.commit().unwrap();
    assert_eq!(store.load(&wid("plain")).unwrap().len(), 1);
    assert_eq!(store.timers(&wid("timed")).unwrap().len(), 1);
}
