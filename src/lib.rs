#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub use miniflow_core::*;

#[cfg(feature = "sqlite")]
pub use miniflow_native::{SqliteOptions, SqliteStore, Synchronous, SystemClock, SCHEMA_VERSION};
