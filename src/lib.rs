#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub use miniflow_core::*;

#[cfg(feature = "sqlite")]
pub use miniflow_native::{
    cancellation_requested, Dispatcher, Handler, Listing, Outcome, RunningDispatcher, Settlement,
    Shutdown, SqliteIdempotencyStore, SqliteOptions, SqliteStore, Stats, Synchronous, SystemClock,
    UnreadableCommand, SCHEMA_VERSION,
};

/// The SQLite driver the `sqlite` feature is built on (see `SqliteStore::append_in`).
#[cfg(feature = "sqlite")]
pub use miniflow_native::rusqlite;
