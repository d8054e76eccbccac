//! The async dispatcher for tokio services (feature `tokio`): `async fn` handlers run as tasks on
//! the caller's runtime, at most `concurrency` at once, over any store that implements
//! [`AsyncSource`]. It keeps the synchronous [`crate::Dispatcher`]'s books ([`crate::Outcome`],
//! [`crate::Settlement`], [`crate::Stats`], its settings and their bounds, error backoff and
//! `on_error`): the store's steps are the synchronous worker's own, on tokio's blocking threads.

pub use crate::dispatcher::asynchronous::{
    cancellation_requested, AsyncDispatcher, AsyncSource, RunningAsyncDispatcher,
};
