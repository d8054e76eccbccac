//! The miniflow store on PostgreSQL, for several processes and machines sharing one outbox.
//!
//! - [`PostgresStore`]: the [`miniflow_core::Store`] on a pooled set of connections. Commits,
//!   acknowledgements and failures are short `READ COMMITTED` transactions that read the rows they
//!   change `FOR UPDATE` and apply the core's rules; claims take the longest-due commands with
//!   `FOR UPDATE SKIP LOCKED`, so workers on many machines never wait for each other and never hold
//!   the same command. Each connection prepares each statement once; a commit without timers or
//!   cancellations is one statement (one round trip), a batch of acknowledgements one statement.
//! - [`PostgresIdempotencyStore`]: a receiver's idempotency records.
//! - [`Wakeups`]: a `LISTEN` on the hint (`NOTIFY`) that follows the commit of an operation that
//!   made work claimable, so idle workers start early and otherwise leave the database alone;
//!   polling stays the fallback.
//! - [`PostgresDispatcher`]: `Dispatcher::postgres(&store, handler)`, the worker pool
//!   (`miniflow-pool`) over a `PostgresStore`, woken by notifications. No SQLite is built.
//! - [`PostgresOptions::database_clock`]: one clock for leases (DESIGN rule 18), the database's, so
//!   workers whose clocks disagree still agree on when a lease ran out.
//! - Retention: [`PostgresStore::purge_done`](miniflow_core::Operations::purge_done) for old done
//!   commands, [`PostgresStore::purge_finished`] for the whole history of finished workflows (the
//!   core's rule), which never waits for a commit and never retires a workflow under one.
//!
//! The schema is migrated when a store connects: numbered SQL migrations applied in one transaction
//! under an advisory lock, the version kept in `miniflow_schema`. The tables are those of the SQLite
//! store (`events`, `outbox`, `timers`, `idempotency`, `retired_workflows`), keyed by workflow ID first.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod acks;
mod claim;
mod clock;
mod commit;
mod connect;
mod controls;
mod db;
mod errors;
mod idempotency;
mod inspect;
mod migrations;
mod notifier;
mod ops;
mod options;
mod pool;
mod queries;
mod retention;
mod rows;
mod store;
mod telemetry;
#[cfg(feature = "tokio")]
pub mod tokio;
mod wakeup;

pub use connect::redact_password;
pub use idempotency::{PostgresIdempotencyStore, Received};
pub use inspect::{EventListing, UnreadableEvent};
pub use migrations::SCHEMA_VERSION;
pub use notifier::NOTIFY_CHANNEL;
pub use options::PostgresOptions;
pub use pool::PooledClient;
/// The PostgreSQL driver miniflow is built on, re-exported so that the caller's-transaction entry
/// points ([`PostgresStore::append_in`], …) take a transaction of the same `postgres` version.
pub use postgres;
#[doc(hidden)]
pub use store::hot_queries;
pub use store::{Listing, PostgresStore, UnreadableCommand, MAX_FALLBACK};
pub use wakeup::Wakeups;
pub use wakeup::{PostgresDispatcher, DEFAULT_FALLBACK_POLL};
