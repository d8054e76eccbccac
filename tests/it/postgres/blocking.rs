//! The async PostgreSQL store under the same conformance suites and differential test as every
//! other store: [`Blocking`] runs each of the suites' calls as one of [`AsyncPostgresStore`]'s
//! methods awaited on a tokio runtime, with the store's clock set to the call's `now`.
//!
//! What the adapter adds is only the waiting: every statement, transaction and rule is the async
//! store's own. It leaves [`EventLog::history_id`] at `None`, so the engine replays each workflow
//! before it decides; the async store's commits on a cached state are tested through its own
//! `handle` in `asynchronous.rs`.

use std::sync::Arc;
use std::time::Duration;

use miniflow::backend::IdempotencyRecord;
use miniflow::conformance::{Harness, IdempotencyHarness};
use miniflow::prelude::*;
use miniflow::tokio::{AsyncPostgresIdempotencyStore, AsyncPostgresStore};
use miniflow::{
    Ack, Begin, ClaimRequest, CommandId, Commit, Delivery, Digest, Error, EventRecord, Extended,
    Failure, Handover, IdempotencyKey, IdempotencyPolicy, IdempotencyStore, KindChange,
    KindControl, ManualClock, OutboxRow, OutboxStats, RetryPolicy, Seq, Settled, TimerId, TimerRow,
    Timestamp, Value, WorkflowId,
};
use tokio::runtime::Runtime;

use super::TestDatabase;

/// A runtime for the adapters: one worker, so the store's background tasks (the hint sender)
/// run between the calls.
fn runtime() -> Arc<Runtime> {
    Arc::new(
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a tokio runtime"),
    )
}

/// An [`AsyncPostgresStore`] driven through the synchronous store traits.
pub struct Blocking {
    // Dropped before the runtime its tasks run on.
    store: AsyncPostgresStore,
    clock: Arc<ManualClock>,
    runtime: Arc<Runtime>,
}

impl Blocking {
    /// Connects an async store to `url` on a runtime of its own.
    pub fn connect(url: &str) -> Self {
        let runtime = runtime();
        let clock = Arc::new(ManualClock::new(Timestamp::EPOCH));
        let store = runtime
            .block_on(AsyncPostgresStore::connect(url))
            .expect("connect the async store")
            .with_clock(clock.clone());
        Self {
            store,
            clock,
            runtime,
        }
    }

    /// Awaits `future` with the store's clock standing at `now`.
    fn at<T>(&self, now: Timestamp, future: impl std::future::Future<Output = T>) -> T {
        self.clock.set(now);
        self.wait(future)
    }

    fn wait<T>(&self, future: impl std::future::Future<Output = T>) -> T {
        self.runtime.block_on(future)
    }

    /// Runs `sql` on a connection of the store's pool.
    fn batch_execute(&self, sql: &str) {
        self.wait(async {
            let client = self.store.client().await.expect("a connection");
            client.batch_execute(sql).await.expect("the statements");
        });
    }

    fn database(&self) -> String {
        self.wait(async {
            let client = self.store.client().await.expect("a connection");
            let row = client
                .query_one("SELECT current_database()", &[])
                .await
                .expect("the store's database");
            row.get(0)
        })
    }
}

impl EventLog for Blocking {
    fn load(&self, workflow_id: &WorkflowId) -> Result<Vec<EventRecord>, Error> {
        self.wait(self.store.load(workflow_id))
    }
    fn load_after(&self, workflow_id: &WorkflowId, after: Seq) -> Result<Vec<EventRecord>, Error> {
        self.wait(self.store.load_after(workflow_id, after))
    }
    fn append_with_commands(&mut self, commit: &Commit) -> Result<(), Error> {
        self.wait(self.store.append(commit))
    }
}

impl Outbox for Blocking {
    fn pending(&self, limit: usize) -> Result<Vec<OutboxRow>, Error> {
        self.wait(self.store.pending(limit))
    }
    fn command(&self, command_id: &CommandId) -> Result<Option<OutboxRow>, Error> {
        self.wait(self.store.command(command_id))
    }
    fn commands(&self, workflow_id: &WorkflowId) -> Result<Vec<OutboxRow>, Error> {
        self.wait(self.store.commands(workflow_id))
    }
    fn mark_done(&mut self, command_id: &CommandId, now: Timestamp) -> Result<(), Error> {
        self.at(now, self.store.mark_done(command_id))
    }
    fn claim(&mut self, request: &ClaimRequest, now: Timestamp) -> Result<Vec<Delivery>, Error> {
        self.at(now, self.store.claim(request.clone()))
    }
    fn extend(
        &mut self,
        command_id: &CommandId,
        token: u64,
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Extended, Error> {
        self.at(now, self.store.extend(command_id, token, ttl))
    }
    fn extend_all(
        &mut self,
        leases: &[(CommandId, u64)],
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Vec<Result<Extended, Error>>, Error> {
        self.at(now, self.store.extend_all(leases, ttl))
    }
    fn release(&mut self, command_id: &CommandId, token: u64, now: Timestamp) -> Result<(), Error> {
        self.at(now, self.store.release(command_id, token))
    }
    fn complete(
        &mut self,
        command_id: &CommandId,
        token: u64,
        result: Option<&Value>,
        now: Timestamp,
    ) -> Result<(), Error> {
        self.at(now, self.store.complete(command_id, token, result.cloned()))
    }
    fn complete_all(
        &mut self,
        acks: Vec<Ack>,
        now: Timestamp,
    ) -> Result<Vec<Result<(), Error>>, Error> {
        self.at(now, self.store.complete_all(acks))
    }
    fn complete_all_and_claim(
        &mut self,
        acks: Vec<Ack>,
        request: &ClaimRequest,
        now: Timestamp,
    ) -> Result<Handover, Error> {
        self.at(
            now,
            self.store.complete_all_and_claim(acks, request.clone()),
        )
    }
    fn fail(
        &mut self,
        command_id: &CommandId,
        token: u64,
        failure: &Failure,
        policy: &RetryPolicy,
        now: Timestamp,
    ) -> Result<Settled, Error> {
        self.at(
            now,
            self.store
                .fail(command_id, token, failure.clone(), policy.clone()),
        )
    }
}

impl Timers for Blocking {
    fn claim_timers(
        &mut self,
        limit: usize,
        lease_ttl: Duration,
        now: Timestamp,
    ) -> Result<Vec<TimerRow>, Error> {
        self.at(now, self.store.claim_timers(limit, lease_ttl))
    }
    fn reject_timer(
        &mut self,
        timer_id: &TimerId,
        reason: &str,
        now: Timestamp,
    ) -> Result<(), Error> {
        self.at(now, self.store.reject_timer(timer_id, reason))
    }
    fn timers(&self, workflow_id: &WorkflowId) -> Result<Vec<TimerRow>, Error> {
        self.wait(self.store.timers(workflow_id))
    }
    fn any_timer_due(&self, now: Timestamp) -> Result<bool, Error> {
        self.at(now, self.store.any_timer_due())
    }
}

impl Operations for Blocking {
    fn purge_done(
        &mut self,
        older_than: Duration,
        now: Timestamp,
        batch: usize,
    ) -> Result<usize, Error> {
        self.at(now, self.store.purge_done(older_than, batch))
    }
    fn dead_letters(&self, limit: usize) -> Result<Vec<OutboxRow>, Error> {
        self.wait(self.store.dead_letters(limit))
    }
    fn retry(&mut self, command_id: &CommandId, now: Timestamp) -> Result<(), Error> {
        self.at(now, self.store.retry(command_id))
    }
    fn resolve(&mut self, command_id: &CommandId, note: &str, now: Timestamp) -> Result<(), Error> {
        self.at(now, self.store.resolve(command_id, note))
    }
    fn stats(&self, now: Timestamp) -> Result<OutboxStats, Error> {
        self.at(now, self.store.stats())
    }
    fn kind_controls(&self) -> Result<Vec<KindControl>, Error> {
        self.wait(self.store.kind_controls())
    }
    fn control_kind(
        &mut self,
        kind: &str,
        change: KindChange,
        by: &str,
        now: Timestamp,
    ) -> Result<KindControl, Error> {
        self.at(now, self.store.control_kind(kind, change, by))
    }
    fn dead_letters_of_kind(&self, kind: &str, limit: usize) -> Result<Vec<OutboxRow>, Error> {
        self.wait(self.store.dead_letters_of_kind(kind, limit))
    }
    fn retry_dead_of_kind(
        &mut self,
        kind: &str,
        batch: usize,
        now: Timestamp,
    ) -> Result<Vec<CommandId>, Error> {
        self.at(now, self.store.retry_dead_of_kind(kind, batch))
    }
    fn resolve_dead_of_kind(
        &mut self,
        kind: &str,
        note: &str,
        batch: usize,
        now: Timestamp,
    ) -> Result<Vec<CommandId>, Error> {
        self.at(now, self.store.resolve_dead_of_kind(kind, note, batch))
    }
}

/// An [`AsyncPostgresIdempotencyStore`] driven through [`IdempotencyStore`].
pub struct BlockingKeys {
    store: Blocking,
    keys: AsyncPostgresIdempotencyStore,
}

impl IdempotencyStore for BlockingKeys {
    fn policy(&self) -> &IdempotencyPolicy {
        self.keys.policy()
    }
    fn begin(
        &mut self,
        key: &IdempotencyKey,
        digest: Digest,
        now: Timestamp,
    ) -> Result<Begin, Error> {
        self.store.at(now, self.keys.begin(key, digest))
    }
    fn finish(
        &mut self,
        key: &IdempotencyKey,
        token: u64,
        result: &Value,
        now: Timestamp,
    ) -> Result<(), Error> {
        self.store.at(now, self.keys.finish(key, token, result))
    }
    fn abandon(&mut self, key: &IdempotencyKey, token: u64) -> Result<(), Error> {
        self.store.wait(self.keys.abandon(key, token))
    }
    fn record(&self, key: &IdempotencyKey) -> Result<Option<IdempotencyRecord>, Error> {
        self.store.wait(self.keys.record(key))
    }
    fn purge(&mut self, now: Timestamp, batch: usize) -> Result<usize, Error> {
        self.store.at(now, self.keys.purge(batch))
    }
}

/// Async stores on databases of their own; reopening connects a new store (a new pool and
/// runtime) to the same database.
pub struct AsyncHarness {
    databases: Vec<TestDatabase>,
}

impl AsyncHarness {
    pub fn new() -> Self {
        Self {
            databases: Vec::new(),
        }
    }

    fn new_database(&mut self) -> String {
        let database = TestDatabase::new();
        let url = database.url();
        self.databases.push(database);
        url
    }

    fn url_of(&self, store: &Blocking) -> String {
        let name = store.database();
        self.databases
            .iter()
            .map(TestDatabase::url)
            .find(|url| url.ends_with(&format!("/{name}")))
            .expect("a database of this harness")
    }
}

impl Harness for AsyncHarness {
    type Store = Blocking;

    fn open(&mut self) -> Blocking {
        Blocking::connect(&self.new_database())
    }

    fn reopen(&mut self, store: Blocking) -> Blocking {
        let url = self.url_of(&store);
        drop(store);
        Blocking::connect(&url)
    }

    /// A trigger aborts the insert of such a command, as for the synchronous store.
    fn fail_commits_with_command_kind(&mut self, store: &mut Blocking, kind: &str) {
        store.batch_execute(&format!(
            "CREATE OR REPLACE FUNCTION miniflow_test_fail() RETURNS trigger \
                 LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'injected failure'; END $$;
             CREATE TRIGGER \"fail_{kind}\" BEFORE INSERT ON outbox FOR EACH ROW \
                 WHEN (NEW.kind = '{kind}') EXECUTE FUNCTION miniflow_test_fail();"
        ));
    }
}

impl IdempotencyHarness for AsyncHarness {
    type Store = BlockingKeys;

    fn open(&mut self, policy: IdempotencyPolicy) -> BlockingKeys {
        let store = Blocking::connect(&self.new_database());
        let keys = AsyncPostgresIdempotencyStore::new(store.store.clone(), policy)
            .expect("a valid policy");
        BlockingKeys { store, keys }
    }

    fn reopen(&mut self, keys: BlockingKeys) -> BlockingKeys {
        let policy = *keys.policy();
        let url = self.url_of(&keys.store);
        drop(keys);
        let store = Blocking::connect(&url);
        let keys = AsyncPostgresIdempotencyStore::new(store.store.clone(), policy)
            .expect("a valid policy");
        BlockingKeys { store, keys }
    }
}

mod conformance {
    miniflow::store_conformance_tests!(super::AsyncHarness::new());
}

mod idempotency_conformance {
    miniflow::idempotency_conformance_tests!(super::AsyncHarness::new());
}
