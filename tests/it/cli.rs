//! The `miniflow` command-line tool, run as an operator runs it.
#![cfg(feature = "cli")]

use std::path::Path;
use std::process::Command as Process;

use miniflow::{
    json, ClaimRequest, Command, Commit, Decision, Event, Failure, RetryPolicy, Seq, SqliteStore,
    Status, Store, Timestamp, WorkflowId,
};

fn miniflow(args: &[&str]) -> (bool, String, String) {
    let out = Process::new(env!("CARGO_BIN_EXE_miniflow"))
        .args(args)
        .output()
        .expect("run miniflow");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A store with `trip-001:1:0` done, `trip-001:1:1` dead and `trip-001:1:2` pending.
fn seeded(path: &Path) -> SqliteStore {
    let mut store = SqliteStore::open(path).unwrap();
    let decision = Decision::new()
        .command(Command::new("lock_budget", json!({})))
        .command(Command::new("book_hotel", json!({ "hotel": "Atlantis" })))
        .command(Command::new("book_flight", json!({})));
    let commit = Commit::new(
        WorkflowId::new("trip-001").unwrap(),
        Seq::ZERO,
        Event::new("trip_requested", json!({ "city": "成都" })),
        decision,
        Timestamp::from_millis(1),
    )
    .unwrap();
    store.append_with_commands(&commit).unwrap();
    let claimed = store
        .claim(&ClaimRequest::new("w").limit(2), Timestamp::from_millis(2))
        .unwrap();
    store
        .complete(
            &claimed[0].command_id,
            claimed[0].token,
            Timestamp::from_millis(3),
        )
        .unwrap();
    store
        .fail(
            &claimed[1].command_id,
            claimed[1].token,
            &Failure::permanent("422 no such hotel"),
            &RetryPolicy::default(),
            Timestamp::from_millis(3),
        )
        .unwrap();
    store
}

#[test]
fn operators_list_retry_and_resolve_dead_letters_from_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("flow.db");
    let store = seeded(&db);
    let db_arg = db.to_str().unwrap();

    let (ok, out, _) = miniflow(&["dead", db_arg]);
    assert!(ok);
    assert!(
        out.contains("trip-001:1:1")
            && out.contains("422 no such hotel")
            && out.contains("(1 command)"),
        "{out}"
    );

    let (ok, out, _) = miniflow(&["pending", db_arg, "--json"]);
    assert!(ok);
    let rows: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["command_id"], "trip-001:1:2");

    let (ok, _, err) = miniflow(&["resolve", db_arg, "trip-001:1:2", "--note", "oops"]);
    assert!(!ok, "a live command cannot be resolved by accident");
    assert!(
        err.contains("cannot resolve command trip-001:1:2: it is pending"),
        "{err}"
    );

    let (ok, out, _) = miniflow(&["retry", db_arg, "trip-001:1:1"]);
    assert!(ok, "{out}");
    assert_eq!(
        store
            .command(&"trip-001:1:1".parse().unwrap())
            .unwrap()
            .unwrap()
            .status,
        Status::Pending
    );

    // It dies again; this time a person closes it.
    // The tool stamps with the system clock: the retried command is due from now.
    let mut store = store;
    let now = miniflow::Clock::now(&miniflow::SystemClock);
    let again = store.claim(&ClaimRequest::new("w").limit(5), now).unwrap();
    let hotel = again.iter().find(|d| d.kind == "book_hotel").unwrap();
    store
        .fail(
            &hotel.command_id,
            hotel.token,
            &Failure::permanent("still no hotel"),
            &RetryPolicy::default(),
            now,
        )
        .unwrap();
    let (ok, out, _) = miniflow(&[
        "resolve",
        db_arg,
        "trip-001:1:1",
        "--note",
        "booked by phone",
    ]);
    assert!(ok, "{out}");
    let row = store
        .command(&"trip-001:1:1".parse().unwrap())
        .unwrap()
        .unwrap();
    assert_eq!(
        (row.status, row.resolution.as_deref()),
        (Status::Done, Some("booked by phone"))
    );

    let (ok, out, _) = miniflow(&["show", db_arg, "trip-001:1:1"]);
    assert!(
        ok && out.contains("\"resolution\": \"booked by phone\""),
        "{out}"
    );
    let (ok, out, _) = miniflow(&["events", db_arg, "trip-001"]);
    assert!(ok, "{out}");
    assert_eq!(out.trim(), "1 trip_requested           {\"city\":\"成都\"}");
}

#[test]
fn bad_input_gets_a_clear_error_and_a_failing_exit_code() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("flow.db");
    seeded(&db);
    let missing = dir.path().join("nope.db");
    for (args, says) in [
        (vec!["dead", missing.to_str().unwrap()], "no store at"),
        (
            vec!["show", db.to_str().unwrap(), "trip-001:x:0"],
            "invalid command_id \"trip-001:x:0\"",
        ),
        (
            vec!["show", db.to_str().unwrap(), "trip-001:9:0"],
            "unknown command trip-001:9:0",
        ),
        (
            vec!["retry", db.to_str().unwrap(), "trip-001:1:2"],
            "cannot retry command trip-001:1:2: it is pending",
        ),
    ] {
        let (ok, _, err) = miniflow(&args);
        assert!(!ok, "{args:?} succeeded");
        assert!(err.contains(says), "{args:?}: {err}");
    }
    assert!(
        !missing.exists(),
        "looking at a missing store must not create it"
    );
    let (ok, out, _) = miniflow(&["purge-done", db.to_str().unwrap(), "--older-than", "0s"]);
    assert!(ok && out.contains("purged 1 done command"), "{out}");
}
