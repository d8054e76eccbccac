//! The async API for tokio services (feature `tokio`): the same store, rules and guarantees as the
//! synchronous host, with calls that are awaited instead of blocking a thread.
//!
//! | piece | what it is |
//! |---|---|
//! | [`AsyncStore`] | a `Send + Sync + Clone` handle on a SQLite file whose writes the file's [`crate::Writer`] thread runs: `handle`, `fire`, claims and acks, and `transaction(\|tx\| …)` for your own rows together with events and commands |
//! | [`Tx`] | the writer's transaction as a `transaction` closure sees it |
//! | [`AsyncDispatcher`] | delivers commands to an `async fn(Delivery) -> Outcome` on your runtime, at most `concurrency` at a time, with heartbeats, timers and a graceful `shutdown` |
//! | [`AsyncIdempotencyStore`] | a receiver's fenced reservations, inside the same transactions |
//!
//! Nothing here restates a rule: the writes are the ones [`crate::SqliteStore`] runs in the writer's
//! transaction, the engine is [`miniflow_core::Engine`] (its state cache included), and the
//! dispatcher settles deliveries with the synchronous [`crate::Dispatcher`]'s own bookkeeping
//! ([`crate::Outcome`], [`crate::Settlement`], [`crate::Stats`], its configuration bounds, error
//! backoff and `on_error`).
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use miniflow_core::{json, Command, Decision, Delivery, Engine, Event, EventRecord, Workflow, WorkflowId};
//! use miniflow_native::tokio::{AsyncDispatcher, AsyncStore};
//! use miniflow_native::Outcome;
//!
//! struct Shop;
//! impl Workflow for Shop {
//!     type State = ();
//!     fn evolve(&self, _: &mut (), _: &EventRecord) {}
//!     fn decide(&self, _: &(), event: &EventRecord) -> Decision {
//!         Decision::new().command(Command::new("charge_card", event.payload.clone()))
//!     }
//! }
//!
//! async fn charge(delivery: Delivery) -> Outcome {
//!     // POST to the payment service with `Idempotency-Key: {delivery.command_id}` …
//!     Outcome::Done
//! }
//!
//! # tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(async {
//! let dir = tempfile::tempdir()?;
//! let store = AsyncStore::open(dir.path().join("shop.db")).await?;
//! store.transaction(|tx| tx.execute("CREATE TABLE orders (id TEXT PRIMARY KEY)", [])).await?;
//!
//! let engine = Arc::new(Engine::new(Shop));
//! store.transaction(move |tx| {
//!     tx.execute("INSERT INTO orders VALUES ('order-7')", [])?;
//!     tx.handle(&engine, &WorkflowId::new("order-7")?, Event::new("placed", json!({ "amount": 1200 })))
//! }).await?;
//!
//! let running = AsyncDispatcher::new(store.clone(), charge).concurrency(32).start()?;
//! // … serve requests …
//! let shutdown = running.shutdown(Duration::from_secs(5)).await;
//! assert!(shutdown.errors.is_empty());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # })?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod receiver;
mod store;
mod transaction;

pub use self::receiver::AsyncIdempotencyStore;
pub use self::store::AsyncStore;
pub use self::transaction::Tx;
pub use miniflow_pool::tokio::{
    cancellation_requested, AsyncDispatcher, AsyncSource, RunningAsyncDispatcher,
};
