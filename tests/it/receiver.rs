//! The receiver's side on SQLite: concurrent `begin` across processes, and retention configuration.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use miniflow::{
    check_retention, json, Begin, Clock, Digest, Error, IdempotencyKey, IdempotencyPolicy,
    IdempotencyStore, RetryPolicy, SqliteIdempotencyStore, SystemClock,
};

use crate::child;

const KEYS: usize = 25;

/// Child process: waits for the start file, then begins keys `k0…` and prints each answer.
#[test]
fn child_beginner() {
    if child::role().as_deref() != Some("beginner") {
        return;
    }
    let db = PathBuf::from(child::setting("MINIFLOW_DB"));
    let mut store = SqliteIdempotencyStore::open(&db, IdempotencyPolicy::default()).unwrap();
    let go = db.with_extension("go");
    while !go.exists() {
        std::thread::sleep(Duration::from_millis(1));
    }
    let digest = Digest::of(&json!({ "flight": "CA1405" }));
    for n in 0..KEYS {
        let key = IdempotencyKey::new(format!("k{n}")).unwrap();
        let answer = match store.begin(&key, digest, SystemClock.now()).unwrap() {
            Begin::Fresh { .. } => "fresh",
            Begin::InProgress { .. } => "in_progress",
            other => panic!("unexpected {other:?}"),
        };
        println!("answer=k{n}:{answer}");
    }
}

#[test]
fn two_processes_beginning_one_key_get_one_fresh_and_one_in_progress() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("receiver.db");
    drop(SqliteIdempotencyStore::open(&db, IdempotencyPolicy::default()).unwrap());
    let settings = [("MINIFLOW_DB", db.display().to_string())];
    let children: Vec<_> = (0..2)
        .map(|_| child::spawn("receiver::child_beginner", "beginner", &settings))
        .collect();
    std::fs::write(db.with_extension("go"), b"").unwrap();
    let mut answers: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for process in children {
        let stdout = child::wait_ok(process, "beginner");
        for line in stdout.lines().filter_map(|l| l.split("answer=").nth(1)) {
            let (key, answer) = line.trim().split_once(':').unwrap();
            answers
                .entry(key.to_owned())
                .or_default()
                .push(answer.to_owned());
        }
    }
    assert_eq!(answers.len(), KEYS);
    for (key, mut got) in answers {
        got.sort();
        assert_eq!(got, ["fresh", "in_progress"], "key {key}");
    }
}

#[test]
fn a_receiver_that_forgets_before_the_producer_stops_retrying_is_rejected() {
    let producer = RetryPolicy::default()
        .initial_delay(Duration::from_secs(1))
        .max_delay(Duration::from_secs(3600))
        .max_attempts(12);
    let lease = Duration::from_secs(30);
    let margin = Duration::from_secs(24 * 3600);
    let receiver = IdempotencyPolicy {
        retention: Duration::from_secs(24 * 3600),
        ..IdempotencyPolicy::default()
    };
    match check_retention(receiver.retention, &producer, lease, margin) {
        Err(Error::RetentionTooShort {
            retention,
            required,
        }) => {
            assert_eq!(retention, receiver.retention);
            assert_eq!(required, producer.horizon(lease) + margin);
        }
        other => panic!(
            "a 24 h retention against a day-long horizon plus a day of margin passed: {other:?}"
        ),
    }
    assert!(check_retention(
        IdempotencyPolicy::default().retention,
        &producer,
        lease,
        margin
    )
    .is_ok());
}
