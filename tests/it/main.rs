//! miniflow's integration tests, in one binary: the conformance suite on every store, the SQLite
//! host's own guarantees, and the examples.

#[cfg(feature = "tokio")]
mod asynchronous;
mod child;
mod cli;
mod conformance;
mod crash;
mod delivery;
mod differential;
mod dispatcher;
mod examples;
#[cfg(feature = "postgres")]
mod postgres;
mod receiver;
mod retention;
mod simulation;
mod sqlite;
mod telemetry;
mod transactions;
mod unreadable;
mod writer;
