//! The writer thread: requests that arrive together commit in one transaction, each in a savepoint of
//! its own; answers come after the COMMIT, in arrival order; stores of one file share one writer.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use miniflow::prelude::*;
use miniflow::rusqlite::Transaction;
use miniflow::{
    json, Command, Commit, Decision, Error, Event, Seq, SqliteOptions, SqliteStore, Synchronous,
    Timestamp, WorkflowId, Writer,
};

fn storage(e: rusqlite::Error) -> Error {
    Error::Storage(Box::new(e))
}

/// A writer on a fresh file with a `notes` table and a count of its commits.
fn writer_with_notes(dir: &Path) -> (Writer, Arc<AtomicU64>) {
    let writer = Writer::open(dir.join("flow.db")).unwrap();
    let commits = Arc::new(AtomicU64::new(0));
    let counted = commits.clone();
    writer
        .run(move |tx| {
            tx.execute_batch(
                "CREATE TABLE notes (n INTEGER PRIMARY KEY);
                 CREATE TABLE parents (id INTEGER PRIMARY KEY);
                 CREATE TABLE children (parent INTEGER REFERENCES parents (id)
                     DEFERRABLE INITIALLY DEFERRED);",
            )
            .map_err(storage)?;
            tx.commit_hook(Some(move || {
                counted.fetch_add(1, Ordering::SeqCst);
                false
            }))
            .map_err(storage)
        })
        .unwrap();
    (writer, commits)
}

fn note(n: i64) -> impl FnOnce(&Transaction<'_>) -> Result<i64, Error> + Send + 'static {
    move |tx| {
        tx.execute("INSERT INTO notes VALUES (?1)", [n])
            .map_err(storage)?;
        Ok(n)
    }
}

fn notes(writer: &Writer) -> Vec<i64> {
    writer
        .run(|tx| {
            let mut stmt = tx
                .prepare("SELECT n FROM notes ORDER BY n")
                .map_err(storage)?;
            let rows = stmt.query_map([], |r| r.get(0)).map_err(storage)?;
            rows.collect::<Result<Vec<i64>, _>>().map_err(storage)
        })
        .unwrap()
}

/// Holds the writer inside a request until the returned sender is used, so that what is submitted
/// meanwhile queues up behind it and forms the next group.
fn hold(writer: &Writer) -> mpsc::Sender<()> {
    let (release, held) = mpsc::channel::<()>();
    let (entered, inside) = mpsc::channel::<()>();
    writer.submit(
        move |_| {
            entered.send(()).unwrap();
            held.recv().unwrap();
            Ok(())
        },
        |_| {},
    );
    inside.recv().unwrap();
    release
}

type Answers = Arc<Mutex<Vec<(i64, Result<i64, String>)>>>;

fn submit_note(
    writer: &Writer,
    n: i64,
    answers: &Answers,
    work: impl FnOnce(&Transaction<'_>) -> Result<i64, Error> + Send + 'static,
) {
    let answers = answers.clone();
    writer.submit(work, move |answer| {
        answers
            .lock()
            .unwrap()
            .push((n, answer.map_err(|e| format!("{} {e}", e.code()))));
    });
}

/// Waits until `count` answers are in.
fn answered(answers: &Answers, count: usize) -> Vec<(i64, Result<i64, String>)> {
    for _ in 0..2_000 {
        if answers.lock().unwrap().len() >= count {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    answers.lock().unwrap().clone()
}

#[test]
fn a_failing_request_rolls_back_alone_and_the_rest_of_its_group_commits_together() {
    let dir = tempfile::tempdir().unwrap();
    let (writer, commits) = writer_with_notes(dir.path());
    let answers = Answers::default();
    let release = hold(&writer);
    let before = commits.load(Ordering::SeqCst);
    submit_note(&writer, 1, &answers, note(1));
    submit_note(&writer, 2, &answers, |tx| {
        note(2)(tx)?;
        Err(Error::invalid("n", 2, "refused after writing"))
    });
    submit_note(&writer, 3, &answers, |_| panic!("a bug in a request"));
    submit_note(&writer, 4, &answers, note(4));
    submit_note(&writer, 5, &answers, note(1)); // a duplicate key: a statement that fails
    release.send(()).unwrap();

    let answers = answered(&answers, 5);
    assert_eq!(answers.len(), 5, "{answers:?}");
    assert_eq!(answers[0], (1, Ok(1)));
    assert!(
        matches!(&answers[1], (2, Err(e)) if e.starts_with("INVALID_INPUT")),
        "{answers:?}"
    );
    assert!(
        matches!(&answers[2], (3, Err(e)) if e.contains("panicked") && e.contains("a bug in a request")),
        "{answers:?}"
    );
    assert_eq!(answers[3], (4, Ok(4)));
    assert!(
        matches!(&answers[4], (5, Err(e)) if e.contains("UNIQUE")),
        "{answers:?}"
    );
    assert_eq!(
        notes(&writer),
        [1, 4],
        "only the failed requests were rolled back"
    );
    assert_eq!(
        commits.load(Ordering::SeqCst) - before,
        3,
        "the holding request, the group of five, the read"
    );
}

#[test]
fn a_failed_commit_fails_every_request_of_its_group_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (writer, _) = writer_with_notes(dir.path());
    let answers = Answers::default();
    let release = hold(&writer);
    submit_note(&writer, 1, &answers, note(1));
    // A deferred foreign key is only checked at COMMIT, which then fails.
    submit_note(&writer, 2, &answers, |tx| {
        tx.execute("INSERT INTO children VALUES (99)", [])
            .map_err(storage)?;
        Ok(2)
    });
    submit_note(&writer, 3, &answers, note(3));
    release.send(()).unwrap();

    let answers = answered(&answers, 3);
    assert_eq!(answers.len(), 3);
    for (n, answer) in &answers {
        assert!(
            matches!(answer, Err(e) if e.starts_with("STORAGE") && e.contains("FOREIGN KEY")),
            "request {n}: {answer:?}"
        );
    }
    assert!(
        notes(&writer).is_empty(),
        "nothing of the group was written"
    );
    writer.run(note(7)).unwrap();
    assert_eq!(notes(&writer), [7], "the writer goes on");
}

#[test]
fn answers_come_in_arrival_order_across_groups() {
    let dir = tempfile::tempdir().unwrap();
    let (writer, commits) = writer_with_notes(dir.path());
    let answers = Answers::default();
    for n in 0..300 {
        submit_note(&writer, n, &answers, note(n));
    }
    let answers = answered(&answers, 300);
    let order: Vec<i64> = answers.iter().map(|(n, _)| *n).collect();
    assert_eq!(order, (0..300).collect::<Vec<_>>());
    assert!(answers.iter().all(|(n, a)| a == &Ok(*n)));
    assert!(
        commits.load(Ordering::SeqCst) < 300,
        "requests that arrived together were grouped"
    );
}

#[test]
fn a_request_cannot_wait_for_its_own_writer() {
    let dir = tempfile::tempdir().unwrap();
    let writer = Writer::open(dir.path().join("flow.db")).unwrap();
    let inner = writer.clone();
    let answer = writer.run(move |_| inner.run(|_| Ok(())));
    match answer {
        Err(Error::InvalidInput { reason, .. }) => {
            assert!(reason.contains("wait for itself"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn stores_of_one_file_share_one_writer_which_closes_with_the_last_of_them() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flow.db");
    let first = SqliteStore::open(&path).unwrap();
    let second = SqliteStore::open(dir.path().join(".").join("flow.db")).unwrap();
    let writer = Writer::open(&path).unwrap();
    assert!(first.writer().unwrap().same_thread_as(&writer));
    assert!(second.writer().unwrap().same_thread_as(&writer));
    let relaxed = SqliteOptions {
        synchronous: Synchronous::Normal,
        ..SqliteOptions::default()
    };
    let other = SqliteStore::open_with(&path, &relaxed).unwrap();
    assert!(
        !other.writer().unwrap().same_thread_as(&writer),
        "other options, another writer: a NORMAL commit never shares a FULL one's transaction"
    );
    assert!(SqliteStore::open_read_only(&path)
        .unwrap()
        .writer()
        .is_none());

    drop((first, second, writer, other));
    assert!(
        !dir.path().join("flow.db-wal").exists(),
        "the last connection closed the file cleanly"
    );
}

#[test]
fn idle_waiters_wake_when_a_commit_makes_commands_claimable() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = SqliteStore::open(dir.path().join("flow.db")).unwrap();
    let writer = store.writer().unwrap().clone();
    let mark = writer.work_mark();
    let waiter = std::thread::spawn(move || writer.wait_for_work(mark, Duration::from_secs(30)));
    let commit = |n: u64, decision: Decision| {
        Commit::new(
            WorkflowId::new(format!("w-{n}")).unwrap(),
            Seq::ZERO,
            Event::new("e", json!({})),
            decision,
            Timestamp::from_millis(1),
        )
        .unwrap()
    };
    store
        .append_with_commands(&commit(0, Decision::none()))
        .unwrap();
    std::thread::sleep(Duration::from_millis(50));
    assert!(
        !waiter.is_finished(),
        "a commit without commands wakes nobody"
    );
    let decision = Decision::new().command(Command::new("c", json!({})));
    store.append_with_commands(&commit(1, decision)).unwrap();
    let woken = waiter.join().unwrap();
    assert_eq!(woken, mark + 1);
    let writer = store.writer().unwrap();
    assert_eq!(
        writer.wait_for_work(woken, Duration::from_millis(20)),
        woken,
        "no new work: the wait times out"
    );
}

#[test]
fn under_a_flood_of_commits_deliveries_keep_pace_and_every_producer_progresses() {
    use miniflow::{Delivery, Dispatcher, Outcome};
    use std::sync::atomic::AtomicBool;

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flow.db");
    let delivered = Arc::new(AtomicU64::new(0));
    let count = delivered.clone();
    let running = Dispatcher::sqlite(&path, move |_: &Delivery| {
        count.fetch_add(1, Ordering::SeqCst);
        Outcome::Done
    })
    .workers(2)
    .batch_size(64)
    .start()
    .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let producers: Vec<_> = (0..16)
        .map(|p| {
            let (path, stop) = (path.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut store = SqliteStore::open(&path).unwrap();
                let mut commits = 0u64;
                while !stop.load(Ordering::SeqCst) {
                    let commit = Commit::new(
                        WorkflowId::new(format!("p{p}-{commits}")).unwrap(),
                        Seq::ZERO,
                        Event::new("e", json!({})),
                        Decision::new().command(Command::new("c", json!({}))),
                        Timestamp::from_millis(1),
                    )
                    .unwrap();
                    store.append_with_commands(&commit).unwrap();
                    commits += 1;
                }
                commits
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(2));
    let delivered_while_flooded = delivered.load(Ordering::SeqCst);
    stop.store(true, Ordering::SeqCst);
    let commits: Vec<u64> = producers.into_iter().map(|p| p.join().unwrap()).collect();
    let committed: u64 = commits.iter().sum();
    let shutdown = running.shutdown(Duration::from_secs(10));
    assert!(shutdown.errors.is_empty(), "{:?}", shutdown.errors);
    // First come, first served: producers do not starve one another, and the workers' claims and
    // acks queue with the commits instead of losing every race for the lock to them (with a
    // connection each and SQLite's busy handler, some producers committed once in two seconds
    // and the workers delivered 0–40% of what was committed meanwhile).
    let fair_share = committed / commits.len() as u64;
    assert!(
        commits.iter().all(|&n| n * 10 >= fair_share),
        "every producer got its turn: {commits:?}"
    );
    assert!(
        delivered_while_flooded * 10 >= committed * 8,
        "{delivered_while_flooded} of {committed} commands delivered while producers ran"
    );
}

#[test]
fn a_commit_after_the_wal_was_deleted_under_the_store_is_an_error_not_an_acknowledgement() {
    for synchronous in [Synchronous::Full, Synchronous::Normal] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("flow.db");
        let options = SqliteOptions {
            synchronous,
            ..SqliteOptions::default()
        };
        let mut store = SqliteStore::open_with(&path, &options).unwrap();
        let commit = |seq: u64| {
            Commit::new(
                WorkflowId::new("w").unwrap(),
                Seq::new(seq).unwrap(),
                Event::new("e", json!({})),
                Decision::new().command(Command::new("send", json!({}))),
                Timestamp::from_millis(7),
            )
            .unwrap()
        };
        store.append_with_commands(&commit(0)).unwrap();
        for suffix in ["-wal", "-shm"] {
            let mut beside = path.clone().into_os_string();
            beside.push(suffix);
            std::fs::remove_file(beside).unwrap();
        }
        match store.append_with_commands(&commit(1)) {
            Err(Error::Storage(why)) => {
                let why = why.to_string();
                assert!(
                    why.contains("removed or replaced while the store was open"),
                    "{synchronous:?}: {why}"
                );
            }
            other => panic!("{synchronous:?}: a commit that cannot be durable gave {other:?}"),
        }
        // And every write after it: the writer stopped.
        assert!(
            store.append_with_commands(&commit(1)).is_err(),
            "{synchronous:?}"
        );
    }
}
