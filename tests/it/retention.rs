//! Retention on SQLite: purged commands and retired workflows give their space back to the file
//! system, and only finished workflows are retired — after which their IDs take no new event.

use std::path::Path;
use std::time::Duration;

use miniflow::prelude::*;
use miniflow::{
    json, ClaimRequest, Command, Commit, Decision, Engine, Error, Event, EventRecord, Failure,
    RetryPolicy, Seq, SqliteStore, Status, Store, Timer, Timestamp, Workflow, WorkflowId,
};

pub fn at(millis: u64) -> Timestamp {
    Timestamp::from_millis(millis)
}

pub fn wid(text: &str) -> WorkflowId {
    WorkflowId::new(text).unwrap()
}

/// The file's size once the write-ahead log is checkpointed into it and emptied.
fn checkpointed_size(path: &Path) -> u64 {
    let conn = rusqlite::Connection::open(path).unwrap();
    let busy: i64 = conn
        .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |row| row.get(0))
        .unwrap();
    assert_eq!(busy, 0, "the checkpoint ran to the end");
    std::fs::metadata(path).unwrap().len()
}

#[test]
fn purging_done_commands_gives_their_pages_back_to_the_file_system() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flow.db");
    let mut store = SqliteStore::open(&path).unwrap();
    let padding = "x".repeat(400);
    for n in 0..200 {
        let commands: Vec<Command> = (0..20)
            .map(|i| Command::new("notify", json!({ "i": i, "padding": padding })))
            .collect();
        let event = Event::new("e", json!({}));
        let commit = Commit::new(
            wid(&format!("w-{n:03}")),
            Seq::ZERO,
            event,
            commands.into(),
            at(1),
        );
        store.append_with_commands(&commit.unwrap()).unwrap();
    }
    // Settle them in bulk (set-up only).
    store
        .connection()
        .execute_batch("UPDATE outbox SET status = 'done', processed_at = 2")
        .unwrap();
    let full = checkpointed_size(&path);

    let mut purged = 0;
    loop {
        let n = store
            .purge_done(Duration::from_secs(1), at(10_000), 500)
            .unwrap();
        purged += n;
        if n < 500 {
            break;
        }
    }
    assert_eq!(purged, 4_000);
    let free: i64 = store
        .connection()
        .query_row("PRAGMA freelist_count", [], |row| row.get(0))
        .unwrap();
    assert_eq!(free, 0, "no free page kept in the file");
    let after = checkpointed_size(&path);
    assert!(
        after * 3 < full,
        "the file shrank from {full} to {after} bytes, not to a third"
    );
    assert_eq!(store.load(&wid("w-000")).unwrap().len(), 1, "events stay");
}

/// Decides a `work` command for `start`, a `later` timer for `wait`, the cancellation of its `work`
/// for `stop`, nothing for anything else.
struct Chores;

impl Workflow for Chores {
    type State = ();
    fn evolve(&self, _: &mut (), _: &EventRecord) {}
    fn decide(&self, _: &(), event: &EventRecord) -> Decision {
        match event.kind.as_str() {
            "start" => Decision::new().command(Command::new("work", json!({}))),
            "wait" => {
                Decision::new().timer(Timer::after("later", Duration::from_secs(60), json!({})))
            }
            "stop" => Decision::new().cancel_commands_of_kind("work"),
            _ => Decision::none(),
        }
    }
}

fn send<S: Store>(store: &mut S, id: &str, kind: &str, now: u64) {
    Engine::new(Chores)
        .handle(store, &wid(id), Event::new(kind, json!({})), at(now))
        .unwrap();
}

fn command(id: &str) -> miniflow::CommandId {
    format!("{id}:1:0").parse().unwrap()
}

/// Retention of finished workflows on any store that has it (`purge` is its `purge_finished`): only
/// workflows finished at least the period ago are retired, wholly, and their IDs take no new event.
pub fn retention_retires_only_finished_workflows<S: Store>(
    store: &mut S,
    mut purge: impl FnMut(&mut S, Duration, Timestamp, usize) -> Result<usize, Error>,
) {
    let day = 24 * 3600 * 1000;
    // Finished: its command done on day 1.
    send(store, "done", "start", 0);
    store.mark_done(&command("done"), at(day)).unwrap();
    // Finished: nothing decided.
    send(store, "noted", "note", 0);
    // Finished: its command cancelled, its timer fired.
    send(store, "fired", "start", 0);
    send(store, "fired", "wait", 10);
    send(store, "fired", "stop", 20);
    let timer = store.timers(&wid("fired")).unwrap().remove(0);
    assert!(Engine::new(Chores)
        .fire(store, &timer, at(60_010))
        .unwrap()
        .is_some());
    assert_eq!(
        store.command(&command("fired")).unwrap().unwrap().status,
        Status::Cancelled
    );
    // Unfinished: a pending command, a dead one, a scheduled timer.
    send(store, "pending", "start", 0);
    send(store, "dead", "start", 0);
    let request = ClaimRequest::new("w").limit(10);
    let claimed = store.claim(&request, at(1)).unwrap();
    let dead = claimed
        .iter()
        .find(|d| d.command_id == command("dead"))
        .unwrap();
    let failure = Failure::permanent("refused");
    store
        .fail(
            &dead.command_id,
            dead.token,
            &failure,
            &RetryPolicy::default(),
            at(2),
        )
        .unwrap();
    for delivery in claimed.iter().filter(|d| d.command_id != command("dead")) {
        store
            .release(&delivery.command_id, delivery.token, at(2))
            .unwrap();
    }
    assert_eq!(
        store.command(&command("dead")).unwrap().unwrap().status,
        Status::Dead
    );
    send(store, "waiting", "wait", 0);
    // Finished, but on day 9: not long enough ago.
    send(store, "recent", "start", 0);
    store.mark_done(&command("recent"), at(9 * day)).unwrap();
    // The `command_failed` feedback of the dead command is a scheduled timer too.
    let before: Vec<(String, usize)> = ["pending", "dead", "waiting", "recent"]
        .iter()
        .map(|id| (id.to_string(), store.load(&wid(id)).unwrap().len()))
        .collect();

    let week = Duration::from_secs(7 * 24 * 3600);
    let now = at(10 * day);
    assert_eq!(purge(store, week, now, 2).unwrap(), 3, "done, noted, fired");
    assert_eq!(
        purge(store, week, now, 2).unwrap(),
        0,
        "nothing left to retire"
    );
    for id in ["done", "noted", "fired"] {
        assert!(store.load(&wid(id)).unwrap().is_empty(), "{id}: events");
        assert!(
            store.commands(&wid(id)).unwrap().is_empty(),
            "{id}: commands"
        );
        assert!(store.timers(&wid(id)).unwrap().is_empty(), "{id}: timers");
    }
    let after: Vec<(String, usize)> = ["pending", "dead", "waiting", "recent"]
        .iter()
        .map(|id| (id.to_string(), store.load(&wid(id)).unwrap().len()))
        .collect();
    assert_eq!(
        after, before,
        "unfinished and recent workflows keep their history"
    );
    assert_eq!(store.commands(&wid("dead")).unwrap().len(), 1);

    // A retired ID takes no new event: its command IDs would repeat.
    let again =
        Engine::new(Chores).handle(store, &wid("done"), Event::new("start", json!({})), now);
    assert_retired(again.map(drop));
    assert!(store.load(&wid("done")).unwrap().is_empty());
    send(store, "fresh", "start", 10 * day);
    assert_eq!(
        store.commands(&wid("fresh")).unwrap().len(),
        1,
        "new IDs are welcome"
    );
    assert_eq!(
        purge(store, week, now, 0).unwrap_err().code(),
        "INVALID_INPUT",
        "a batch of 0"
    );
}

/// `result` is the refusal of an event to a retired workflow.
pub fn assert_retired(result: Result<(), Error>) {
    match result {
        Err(Error::InvalidInput { field, reason, .. }) => {
            assert_eq!(field, "workflow_id");
            assert!(reason.contains("retired"), "{reason}");
        }
        other => panic!("a retired workflow took an event: {other:?}"),
    }
}

#[test]
fn retention_retires_only_workflows_finished_long_enough_and_refuses_their_ids_afterwards() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = SqliteStore::open(dir.path().join("flow.db")).unwrap();
    retention_retires_only_finished_workflows(&mut store, |store, older_than, now, batch| {
        store.purge_finished(older_than, now, batch)
    });
}
