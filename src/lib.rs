#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub use miniflow_core::*;

/// The worker pool (`miniflow-pool`): the dispatcher over any store, its outcomes and reports.
pub use miniflow_pool::{
    cancellation_requested, describe_metrics, new_trace_context, Dispatcher, Handler, OutboxGauges,
    Outcome, RunningDispatcher, Settlement, Shutdown, Stats, SystemClock,
};

#[cfg(feature = "sqlite")]
pub use miniflow_native::{
    Listing, SqliteDispatcher, SqliteIdempotencyStore, SqliteOptions, SqliteStore, Synchronous,
    UnreadableCommand, Writer, SCHEMA_VERSION,
};

/// The async API for tokio services (feature `tokio`): `AsyncStore`, `AsyncDispatcher`,
/// `AsyncIdempotencyStore`.
#[cfg(feature = "tokio")]
pub use miniflow_native::tokio;

/// The SQLite driver the `sqlite` feature is built on (see `SqliteStore::append_in`).
#[cfg(feature = "sqlite")]
pub use miniflow_native::rusqlite;

#[cfg(feature = "postgres")]
pub use miniflow_postgres::{
    redact_password, PostgresIdempotencyStore, PostgresOptions, PostgresStore, Wakeups,
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
