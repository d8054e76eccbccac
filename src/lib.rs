//! Durable workflows that never lose a command and never repeat an effect.
//!
//! A workflow records what happened as events and decides commands for the outside world. miniflow
//! commits an event and its commands in **one local transaction** (a transactional outbox), gives
//! every command a **deterministic ID** (`workflow_id:event_seq:index`), delivers commands **at
//! least once** under leases with fencing tokens, retries and dead letters, and lets receivers
//! **fold duplicates** by that ID into one effect ([`IdempotencyStore`]).
//!
//! This crate is the façade: the sans-IO core (`miniflow-core`: [`Workflow`], [`Engine`], the store
//! traits, [`MemoryStore`]) and, by feature, the SQLite host, the PostgreSQL store and the async
//! API. The store traits' methods come into scope with `use miniflow::prelude::*` (naming
//! [`Store`] alone brings none of them).
//!
//! # Example
//!
//! A requested trip locks a budget; a dispatcher on the same SQLite file delivers the command until
//! nothing is left to do.
//!
#![cfg_attr(feature = "sqlite", doc = "```")]
#![cfg_attr(not(feature = "sqlite"), doc = "```ignore")]
//! use miniflow::prelude::*;
//! use miniflow::{
//!     json, Clock, Command, Decision, Delivery, Dispatcher, Engine, Event, EventRecord, Outcome,
//!     SqliteStore, SystemClock, Workflow, WorkflowId,
//! };
//!
//! struct Trip;
//!
//! impl Workflow for Trip {
//!     type State = bool; // budget asked for
//!
//!     fn evolve(&self, asked: &mut bool, event: &EventRecord) {
//!         *asked |= event.kind == "trip_requested";
//!     }
//!
//!     fn decide(&self, asked: &bool, event: &EventRecord) -> Decision {
//!         match event.kind.as_str() {
//!             "trip_requested" if !asked => Decision::new().command(Command::new(
//!                 "lock_budget",
//!                 json!({ "trip_id": event.workflow_id }),
//!             )),
//!             _ => Decision::none(),
//!         }
//!     }
//! }
//!
//! # let dir = tempfile::tempdir()?;
//! let path = dir.path().join("flow.db");
//! let mut store = SqliteStore::open(&path)?;
//! let trip = WorkflowId::new("trip-001")?;
//!
//! // Replay → decide → commit the event and its command in one transaction.
//! let event = Event::new("trip_requested", json!({ "city": "成都" }));
//! let handled = Engine::new(Trip).handle(&mut store, &trip, event, SystemClock.now())?;
//! assert_eq!(handled.command_ids[0].to_string(), "trip-001:1:0");
//!
//! // Deliver with the command ID as the idempotency key, until nothing is due.
//! let stats = Dispatcher::sqlite(&path, |delivery: &Delivery| {
//!     // POST delivery.payload with header `Idempotency-Key: {delivery.command_id}` …
//!     Outcome::Done
//! })
//! .run_until_idle()?;
//! assert_eq!(stats.completed, 1);
//! assert!(store.pending(10)?.is_empty());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Cargo features
//!
//! | feature | default | what it adds |
//! |---|---|---|
//! | `sqlite` | yes | the embedded SQLite host: `SqliteStore`, `Dispatcher::sqlite`, `SqliteIdempotencyStore` (the `Dispatcher` itself, `miniflow-pool`'s, is always there) |
//! | `cron` | yes | recurring schedules on cron expressions (`Schedule::cron`); `Schedule::every` needs nothing |
//! | `postgres` | no | `PostgresStore`, `PostgresIdempotencyStore`, `Wakeups`, `Dispatcher::postgres`; builds no SQLite |
//! | `tokio` | no | the async API (`miniflow::tokio`) of the stores whose features are on: `AsyncStore` and `AsyncIdempotencyStore` with `sqlite`, `AsyncPostgresStore` and `AsyncPostgresIdempotencyStore` with `postgres`, and `AsyncDispatcher`; builds no SQLite by itself |
//! | `conformance` | no | the conformance suite for a store of your own (`miniflow::conformance`, `store_conformance_tests!`, `idempotency_conformance_tests!`) |
//! | `cli` | no | the `miniflow` command-line tool for operators (`cargo install miniflow --features cli`; implies `sqlite` and `postgres`) |
//!
//! # Guides
//!
//! - [`guides::workflows`]: events, commands, the engine, timers, results, sagas, cancellation,
//!   recurring schedules.
//! - [`guides::delivery`]: the dispatcher, leases, retries, dead letters, ordering, priorities.
//! - [`guides::receivers`]: the idempotency store.
//! - [`guides::sqlite`], [`guides::postgres`], [`guides::asynchronous`] (tokio): the hosts.
//! - [`guides::operating`]: the `miniflow` tool, traces, metrics, operator controls, retention.
//! - [`guides::performance`], [`guides::testing`], [`guides::guarantees`], [`guides::js`].
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub use miniflow_core::*;

/// The worker pool (`miniflow-pool`): the dispatcher over any store, its outcomes and reports.
pub use miniflow_pool::{
    cancellation_requested, describe_metrics, new_trace_context, Dispatcher, DispatcherSettings,
    Handler, OutboxGauges, Outcome, RunningDispatcher, Settlement, Shutdown, Stats, SystemClock,
};

#[cfg(feature = "sqlite")]
pub use miniflow_native::{
    Listing, SqliteDispatcher, SqliteIdempotencyStore, SqliteOptions, SqliteStore, Synchronous,
    UnreadableCommand, Writer, SCHEMA_VERSION,
};

/// The async API for tokio services (feature `tokio`), on the stores whose features are on: the
/// same names and shapes on SQLite and PostgreSQL, so a service moves from one to the other by how
/// it opens the store.
///
/// | piece | on |
/// |---|---|
/// | `AsyncStore`, `Tx`, `AsyncIdempotencyStore` | SQLite (feature `sqlite`): writes run by the file's writer thread, awaited |
/// | `AsyncPostgresStore`, `AsyncPostgresIdempotencyStore`, `PooledAsyncClient` | PostgreSQL (feature `postgres`): tokio-postgres connections of a pool of its own |
/// | `CallerTransaction` | PostgreSQL: the service's open transaction (tokio-postgres's, or sqlx's with feature `sqlx`) that `append_in`, `handle_in`, `start_in`, `begin_in` and `finish_in` join |
/// | `AsyncDispatcher`, `RunningAsyncDispatcher`, `cancellation_requested` | any store |
#[cfg(feature = "tokio")]
pub mod tokio {
    #[cfg(feature = "sqlite")]
    pub use miniflow_native::tokio::{AsyncIdempotencyStore, AsyncStore, Tx};
    pub use miniflow_pool::tokio::{
        cancellation_requested, AsyncDispatcher, AsyncSource, RunningAsyncDispatcher,
    };
    #[cfg(feature = "sqlx")]
    pub use miniflow_postgres::tokio::sqlx;
    #[cfg(feature = "postgres")]
    pub use miniflow_postgres::tokio::{
        tokio_postgres, AsyncPostgresIdempotencyStore, AsyncPostgresStore, CallerTransaction,
        PooledAsyncClient,
    };
}

/// The SQLite driver the `sqlite` feature is built on (see `SqliteStore::append_in`).
#[cfg(feature = "sqlite")]
pub use miniflow_native::rusqlite;

#[cfg(feature = "postgres")]
pub use miniflow_postgres::{
    redact_password, PostgresIdempotencyStore, PostgresOptions, PostgresStore, Received, Wakeups,
    NOTIFY_CHANNEL, SCHEMA_VERSION as POSTGRES_SCHEMA_VERSION,
};

/// `Dispatcher::postgres`: the dispatcher over a [`PostgresStore`], woken by notifications.
#[cfg(feature = "postgres")]
pub use miniflow_postgres::{PostgresDispatcher, DEFAULT_FALLBACK_POLL};

/// The PostgreSQL driver the `postgres` feature is built on (see `PostgresStore::append_in`).
#[cfg(feature = "postgres")]
pub use miniflow_postgres::postgres;

/// The traits whose methods users call: the store traits (`use miniflow::prelude::*` before calling
/// `store.pending(…)`, `store.claim(…)`, …) and the dispatchers' constructors (`Dispatcher::sqlite`,
/// `Dispatcher::postgres`).
pub mod prelude {
    pub use miniflow_core::prelude::*;
    #[cfg(feature = "sqlite")]
    pub use miniflow_native::SqliteDispatcher;
    #[cfg(feature = "postgres")]
    pub use miniflow_postgres::PostgresDispatcher;
}

/// The guides, one module per topic (the same text as the repository's `docs/`). Their examples run
/// as doc tests.
pub mod guides {
    #[doc = include_str!("../docs/workflows.md")]
    pub mod workflows {}
    #[doc = include_str!("../docs/delivery.md")]
    pub mod delivery {}
    #[doc = include_str!("../docs/receivers.md")]
    pub mod receivers {}
    #[doc = include_str!("../docs/sqlite.md")]
    pub mod sqlite {}
    #[doc = include_str!("../docs/postgres.md")]
    pub mod postgres {}
    #[doc = include_str!("../docs/async.md")]
    pub mod asynchronous {}
    #[doc = include_str!("../docs/operating.md")]
    pub mod operating {}
    #[doc = include_str!("../docs/performance.md")]
    pub mod performance {}
    #[doc = include_str!("../docs/testing.md")]
    pub mod testing {}
    #[doc = include_str!("../docs/guarantees.md")]
    pub mod guarantees {}
    #[doc = include_str!("../docs/js.md")]
    pub mod js {}
    /// The repository's README, compiled as a doc test so that its example stays true.
    #[cfg(doctest)]
    #[doc = include_str!("../README.md")]
    pub mod readme {}
}
