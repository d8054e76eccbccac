//! A call of the async PostgreSQL store whose future is dropped at any of its await points — a
//! request cancelled, a `select!` that took another branch, a timeout — neither loses nor doubles
//! what it commits: each case drops the call after its first, second, third… `Pending`, on a pool
//! of one connection (so the next call reuses the connection the dropped one was using), checks
//! that the call committed all of itself or nothing, calls it again as a caller would, and checks
//! that the outcome is the one a call that was never dropped has. The last round is the call
//! polled to its end.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use super::TestDatabase;
use miniflow::tokio::AsyncPostgresStore;
use miniflow::{
    json, ClaimRequest, Command, CommandId, Decision, Delivery, Engine, Error, Event, EventRecord,
    Failure, ManualClock, PostgresOptions, RetryPolicy, Status, Timestamp, Workflow, WorkflowId,
};

const T0: Timestamp = Timestamp::from_millis(1_700_000_000_000);
const LEASE: Duration = Duration::from_secs(30);
/// More rounds than any call has await points: a call still pending after them is a hang.
const ROUNDS: usize = 200;

/// Polls `future` until it has returned `Pending` `pendings` times, then drops it; its output if
/// it finished first.
async fn drop_after<F: Future>(future: F, pendings: usize) -> Option<F::Output> {
    let mut future = pin!(future);
    let mut seen = 0;
    std::future::poll_fn(|cx| match future.as_mut().poll(cx) {
        Poll::Ready(out) => Poll::Ready(Some(out)),
        Poll::Pending if seen == pendings => Poll::Ready(None),
        Poll::Pending => {
            seen += 1;
            Poll::Pending
        }
    })
    .await
}

/// An order charges a card that answers with a receipt, and arms a reminder.
struct Orders;

impl Workflow for Orders {
    type State = ();
    fn evolve(&self, _: &mut (), _: &EventRecord) {}
    fn decide(&self, _: &(), event: &EventRecord) -> Decision {
        match event.kind.as_str() {
            "placed" => Decision::new()
                .command(Command::new("charge", json!({})).report_result())
                .timer(miniflow::Timer::after("remind", LEASE, json!({}))),
            "paid" => Decision::new().command(Command::new("ship", json!({}))),
            _ => Decision::none(),
        }
    }
}

fn wid(text: String) -> WorkflowId {
    WorkflowId::new(text).unwrap()
}

/// A store on a pool of one connection, and a session of the test's own to look with.
struct Case {
    store: AsyncPostgresStore,
    clock: Arc<ManualClock>,
    observer: miniflow::tokio::tokio_postgres::Client,
    engine: Engine<Orders>,
}

impl Case {
    async fn new(url: &str) -> Self {
        let clock = Arc::new(ManualClock::new(T0));
        let store = AsyncPostgresStore::connect_with(url, &PostgresOptions::new().pool_size(1))
            .await
            .unwrap()
            .with_clock(clock.clone());
        let (observer, connection) =
            miniflow::tokio::tokio_postgres::connect(url, miniflow::tokio::tokio_postgres::NoTls)
                .await
                .unwrap();
        tokio::spawn(connection);
        Self {
            store,
            clock,
            observer,
            engine: Engine::new(Orders),
        }
    }

    /// Waits until what a dropped call sent has been done: a connection given back inside a
    /// transaction is closed, and its session ends once the server has read what was sent on it
    /// (a `COMMIT` or not); a statement sent outside one runs before the next statement on the
    /// same connection, which [`Case::rows`] is (the pool has one).
    async fn settle(&self) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let busy: i64 = self
                .observer
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
                     AND pid <> pg_backend_pid() AND state <> 'idle'",
                    &[],
                )
                .await
                .unwrap()
                .get(0);
            if busy == 0 {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "a session stays busy or in a transaction: a dropped call's connection holds its locks"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// `(events, commands, timers)` of `workflow`, once what a dropped call sent has been done.
    async fn rows(&self, workflow: &WorkflowId) -> (i64, i64, i64) {
        self.settle().await;
        let row = self
            .store
            .client()
            .await
            .unwrap()
            .query_one(
                "SELECT (SELECT count(*) FROM events WHERE workflow_id = $1), \
                        (SELECT count(*) FROM outbox WHERE workflow_id = $1), \
                        (SELECT count(*) FROM timers WHERE workflow_id = $1)",
                &[&workflow.as_str()],
            )
            .await
            .unwrap();
        (row.get(0), row.get(1), row.get(2))
    }

    /// No session of the database is left inside a transaction.
    async fn none_in_transaction(&self, round: usize) {
        let open: i64 = self
            .observer
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
                 AND state LIKE 'idle in transaction%'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(
            open, 0,
            "round {round}: a connection was left in a transaction"
        );
    }

    async fn place(&self, workflow: &WorkflowId) {
        self.store
            .start(&self.engine, workflow, Event::new("placed", json!({})))
            .await
            .unwrap();
    }

    /// Places `workflow` and claims its charge.
    async fn claimed(&self, workflow: &WorkflowId) -> Delivery {
        self.place(workflow).await;
        let mut claimed = self
            .store
            .claim(ClaimRequest::new("worker").limit(1).lease_ttl(LEASE))
            .await
            .unwrap();
        assert_eq!(claimed.len(), 1, "the charge of {workflow}");
        let delivery = claimed.remove(0);
        assert_eq!(delivery.command_id.workflow_id(), workflow);
        delivery
    }

    async fn status(&self, command_id: &CommandId) -> (Status, u32) {
        self.settle().await;
        let row = self.store.command(command_id).await.unwrap().unwrap();
        (row.status, row.attempts)
    }

    /// The `command_completed` feedback timers of `workflow`.
    async fn completions(&self, workflow: &WorkflowId) -> usize {
        self.settle().await;
        self.store
            .timers(workflow)
            .await
            .unwrap()
            .iter()
            .filter(|timer| timer.name == miniflow::COMMAND_COMPLETED)
            .count()
    }
}

/// Runs `case` on a database of its own (made and dropped outside the runtime: its client is the
/// synchronous one).
fn run<F: Future<Output = ()>>(case: impl FnOnce(String) -> F) {
    let database = TestDatabase::new();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(case(database.url()));
    drop(runtime);
    drop(database);
}

/// `start`: the event, its command and its timer commit together or not at all; starting again
/// commits them once, or is a `Conflict` when the dropped call had committed.
#[test]
fn a_dropped_start_commits_all_of_itself_or_nothing() {
    run(|url| async move {
        let case = Case::new(&url).await;
        for round in 0..ROUNDS {
            let order = wid(format!("start-{round}"));
            let call = case
                .store
                .start(&case.engine, &order, Event::new("placed", json!({})));
            let finished = drop_after(call, round).await;
            let rows = case.rows(&order).await;
            assert!(
                rows == (0, 0, 0) || rows == (1, 1, 1),
                "round {round}: a part of the commit: {rows:?}"
            );
            let again = case
                .store
                .start(&case.engine, &order, Event::new("placed", json!({})))
                .await;
            match rows.0 {
                0 => assert!(again.is_ok(), "round {round}: {again:?}"),
                _ => assert!(
                    matches!(again, Err(Error::Conflict { .. })),
                    "round {round}: {again:?}"
                ),
            }
            assert_eq!(case.rows(&order).await, (1, 1, 1), "round {round}");
            case.none_in_transaction(round).await;
            if let Some(out) = finished {
                out.unwrap();
                return;
            }
        }
        panic!("start was still pending after {ROUNDS} polls");
    });
}

/// `handle`: the second event and its command commit together or not at all, once.
#[test]
fn a_dropped_handle_commits_all_of_itself_or_nothing() {
    run(|url| async move {
        let case = Case::new(&url).await;
        for round in 0..ROUNDS {
            let order = wid(format!("handle-{round}"));
            case.place(&order).await;
            let call = case
                .store
                .handle(&case.engine, &order, Event::new("paid", json!({})));
            let finished = drop_after(call, round).await;
            let rows = case.rows(&order).await;
            assert!(
                rows == (1, 1, 1) || rows == (2, 2, 1),
                "round {round}: a part of the commit: {rows:?}"
            );
            if rows.0 == 1 {
                case.store
                    .handle(&case.engine, &order, Event::new("paid", json!({})))
                    .await
                    .unwrap();
            }
            assert_eq!(case.rows(&order).await, (2, 2, 1), "round {round}");
            case.none_in_transaction(round).await;
            if let Some(out) = finished {
                out.unwrap();
                return;
            }
        }
        panic!("handle was still pending after {ROUNDS} polls");
    });
}

/// `complete`: the ack and the `command_completed` feedback it schedules commit together or not
/// at all; acking again after a dropped ack that committed is a stale lease, and the result is
/// fed back once.
#[test]
fn a_dropped_ack_is_done_with_its_feedback_once_or_not_at_all() {
    run(|url| async move {
        let case = Case::new(&url).await;
        for round in 0..ROUNDS {
            let order = wid(format!("ack-{round}"));
            let delivery = case.claimed(&order).await;
            let receipt = json!({ "receipt": round });
            let call =
                case.store
                    .complete(&delivery.command_id, delivery.token, Some(receipt.clone()));
            let finished = drop_after(call, round).await;
            let (status, _) = case.status(&delivery.command_id).await;
            let completions = case.completions(&order).await;
            match status {
                Status::Leased => {
                    assert_eq!(completions, 0, "round {round}: feedback without its ack");
                    case.store
                        .complete(&delivery.command_id, delivery.token, Some(receipt.clone()))
                        .await
                        .unwrap();
                }
                Status::Done => {
                    assert_eq!(completions, 1, "round {round}: an ack without its feedback");
                    let again = case
                        .store
                        .complete(&delivery.command_id, delivery.token, Some(receipt.clone()))
                        .await;
                    assert!(
                        matches!(again, Err(Error::StaleLease { .. })),
                        "round {round}: {again:?}"
                    );
                }
                other => panic!("round {round}: the ack left {other:?}"),
            }
            assert_eq!(case.completions(&order).await, 1, "round {round}");
            let row = case.store.command(&delivery.command_id).await.unwrap();
            assert_eq!(row.and_then(|row| row.result), Some(receipt));
            case.none_in_transaction(round).await;
            if let Some(out) = finished {
                out.unwrap();
                return;
            }
        }
        panic!("complete was still pending after {ROUNDS} polls");
    });
}

/// `fail`: a failure is counted once or not at all; failing again after a dropped failure that
/// committed is a stale lease.
#[test]
fn a_dropped_failure_is_counted_once_or_not_at_all() {
    run(|url| async move {
        let case = Case::new(&url).await;
        let policy = RetryPolicy::default();
        for round in 0..ROUNDS {
            let order = wid(format!("fail-{round}"));
            let delivery = case.claimed(&order).await;
            let call = case.store.fail(
                &delivery.command_id,
                delivery.token,
                Failure::retryable("card declined"),
                policy.clone(),
            );
            let finished = drop_after(call, round).await;
            let again = case
                .store
                .fail(
                    &delivery.command_id,
                    delivery.token,
                    Failure::retryable("card declined"),
                    policy.clone(),
                )
                .await;
            let (status, attempts) = case.status(&delivery.command_id).await;
            assert_eq!(
                (status, attempts),
                (Status::Pending, 1),
                "round {round}: one failure, waiting for its retry ({again:?})"
            );
            case.none_in_transaction(round).await;
            if let Some(out) = finished {
                out.unwrap();
                assert!(matches!(again, Err(Error::StaleLease { .. })), "{again:?}");
                return;
            }
        }
        panic!("fail was still pending after {ROUNDS} polls");
    });
}

/// `claim`: a dropped claim either took nothing or took a lease nobody holds, which runs out: the
/// command is claimed again then, never lost.
#[test]
fn a_dropped_claim_leaves_the_command_pending_or_leased_until_its_lease_runs_out() {
    run(|url| async move {
        let case = Case::new(&url).await;
        for round in 0..ROUNDS {
            let order = wid(format!("claim-{round}"));
            case.place(&order).await;
            let request = ClaimRequest::new("worker").limit(1).lease_ttl(LEASE);
            let finished = drop_after(case.store.claim(request.clone()), round).await;
            let last_round = finished.is_some();
            let charge: CommandId = format!("{order}:1:0").parse().unwrap();
            let delivery = match finished {
                Some(out) => out.unwrap().pop(),
                None => {
                    let (status, _) = case.status(&charge).await;
                    assert!(
                        matches!(status, Status::Pending | Status::Leased),
                        "round {round}: {status:?}"
                    );
                    if status == Status::Leased {
                        case.clock.advance(LEASE);
                    }
                    case.store.claim(request).await.unwrap().pop()
                }
            };
            let delivery = delivery.unwrap_or_else(|| panic!("round {round}: the charge is lost"));
            assert_eq!(delivery.command_id, charge, "round {round}");
            case.store
                .complete(&delivery.command_id, delivery.token, Some(json!({})))
                .await
                .unwrap();
            case.none_in_transaction(round).await;
            if last_round {
                return;
            }
        }
        panic!("claim was still pending after {ROUNDS} polls");
    });
}
