//! The PostgreSQL store: the conformance suite, what PostgreSQL adds (several connections claiming at
//! once, migrations racing, one clock for leases, wake-ups) and the dispatcher over it.
//!
//! Each test gets a database of its own on a server [`cluster`] provides: `MINIFLOW_TEST_DATABASE_URL`,
//! or a throwaway cluster the tests start and stop themselves.

mod async_processes;
mod asynchronous;
mod blocking;
mod cluster;
mod crash;
mod delivery;
mod dropped;
mod failover;
mod inspect;
mod restart;
mod retention;
mod store;
mod throwaway;

use miniflow::conformance::{Harness, IdempotencyHarness};
use miniflow::{
    IdempotencyPolicy, IdempotencyStore, PostgresIdempotencyStore, PostgresOptions, PostgresStore,
};

pub use blocking::Blocking;
pub use cluster::TestDatabase;

/// [`PostgresStore`] on databases of its own; reopening connects a new pool to the same database.
pub struct PostgresHarness {
    databases: Vec<TestDatabase>,
    options: PostgresOptions,
}

impl PostgresHarness {
    pub fn new() -> Self {
        Self {
            databases: Vec::new(),
            options: PostgresOptions::new(),
        }
    }

    /// Stores whose tables are in the schema `name` ([`PostgresOptions::schema`]).
    pub fn in_schema(name: &str) -> Self {
        Self {
            databases: Vec::new(),
            options: PostgresOptions::new().schema(name),
        }
    }

    fn new_database(&mut self) -> String {
        let database = TestDatabase::new();
        let url = database.url();
        self.databases.push(database);
        url
    }

    /// The URL of the database `client` is connected to.
    fn url_of(&self, client: &mut miniflow::postgres::Client) -> String {
        let name: String = client
            .query_one("SELECT current_database()", &[])
            .and_then(|row| row.try_get(0))
            .expect("the store's database");
        let database = self
            .databases
            .iter()
            .find(|database| database.url().ends_with(&format!("/{name}")))
            .expect("a database of this harness");
        database.url()
    }
}

impl Harness for PostgresHarness {
    type Store = PostgresStore;

    fn open(&mut self) -> PostgresStore {
        PostgresStore::connect_with(&self.new_database(), &self.options).expect("connect")
    }

    fn reopen(&mut self, store: PostgresStore) -> PostgresStore {
        let url = self.url_of(&mut store.client().expect("a connection"));
        drop(store);
        PostgresStore::connect_with(&url, &self.options).expect("reconnect")
    }

    /// A trigger aborts the insert of such a command: the event row and the commands before it are
    /// already written in the transaction, which must then roll back as a whole.
    fn fail_commits_with_command_kind(&mut self, store: &mut PostgresStore, kind: &str) {
        store
            .client()
            .expect("a connection")
            .batch_execute(&format!(
                "CREATE OR REPLACE FUNCTION miniflow_test_fail() RETURNS trigger \
                     LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'injected failure'; END $$;
                 CREATE TRIGGER \"fail_{kind}\" BEFORE INSERT ON outbox FOR EACH ROW \
                     WHEN (NEW.kind = '{kind}') EXECUTE FUNCTION miniflow_test_fail();"
            ))
            .expect("install the failing trigger");
    }
}

impl IdempotencyHarness for PostgresHarness {
    type Store = PostgresIdempotencyStore;

    fn open(&mut self, policy: IdempotencyPolicy) -> PostgresIdempotencyStore {
        PostgresIdempotencyStore::connect_with(&self.new_database(), policy, &self.options)
            .expect("connect")
    }

    fn reopen(&mut self, store: PostgresIdempotencyStore) -> PostgresIdempotencyStore {
        let policy = *store.policy();
        let url = self.url_of(&mut store.client().expect("a connection"));
        drop(store);
        PostgresIdempotencyStore::connect_with(&url, policy, &self.options).expect("reconnect")
    }
}

mod conformance {
    miniflow::store_conformance_tests!(super::PostgresHarness::new());
}

mod idempotency_conformance {
    miniflow::idempotency_conformance_tests!(super::PostgresHarness::new());
}

/// The suites again on stores whose tables are in a schema of their own.
mod conformance_in_a_schema {
    miniflow::store_conformance_tests!(super::PostgresHarness::in_schema("miniflow"));
}

mod idempotency_conformance_in_a_schema {
    miniflow::idempotency_conformance_tests!(super::PostgresHarness::in_schema("miniflow"));
}
