//! What the PostgreSQL store adds to the conformance suite.

use super::TestDatabase;
use miniflow::{PostgresStore, Store};

#[test]
fn a_store_connects_and_migrates_a_fresh_database() {
    let database = TestDatabase::new();
    let store = PostgresStore::connect(&database.url()).unwrap();
    assert!(store.pending(10).unwrap().is_empty());
    let version: i64 = database
        .client()
        .query_one("SELECT max(version) FROM miniflow_schema", &[])
        .unwrap()
        .get(0);
    assert_eq!(version, miniflow::POSTGRES_SCHEMA_VERSION);
}
