//! The async dispatcher for tokio services (feature `tokio`): `async fn` handlers run as tasks on
//! the caller's runtime, at most `concurrency` at once, over any store that implements
//! [`AsyncSource`], whose steps (claims with their acks, failures, the heartbeat's extensions,
//! timers) are async methods. It keeps the synchronous [`crate::Dispatcher`]'s books
//! ([`crate::Outcome`], [`crate::Settlement`], [`crate::Stats`], its settings and their bounds,
//! error backoff and `on_error`): each answer of the store is settled by the same code.

pub use crate::dispatcher::asynchronous::{
    cancellation_requested, AsyncDispatcher, AsyncSource, RunningAsyncDispatcher,
};
