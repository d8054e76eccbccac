//! miniflow for JavaScript and TypeScript: the core's engine and in-memory stores behind a thin
//! wasm-bindgen layer. The core does the work; this crate only converts.
//!
//! - `MemoryStore`: the whole store API (`appendWithCommands`, `load`, `pending`, `markDone`, `claim`,
//!   `extend`, `complete`, `fail`, `deadLetters`, `retry`, `resolve`, …) plus `exportSnapshot` /
//!   `MemoryStore.fromSnapshot`.
//! - `Engine`: workflows written in JS (`{ init?, evolve, decide }`), replay → decide → commit with
//!   deterministic command IDs.
//! - `IdempotencyStore` and `digest`: the receiver's side (feature `receiver`, on by default; without
//!   it both throw `INVALID_INPUT` naming the feature).
//! - `commandId`, `parseCommandId`, `backoff`, `retryHorizon`, `checkRetention`.
//!
//! Every failure is a thrown JS `Error` with a stable `code` (`CONFLICT`, `STALE_LEASE`,
//! `INVALID_INPUT`, `NOT_FOUND`, `IDEMPOTENCY_CONFLICT`, …); bad arguments never abort the module, and
//! after an error the store is unchanged. Time comes from the caller (`now` in ms) or `Date.now()`.
//!
//! ```
//! // On native targets the bindings compile but need a JS host to run; see `js/` for the JS usage.
//! let _ = miniflow_wasm::MemoryStore::new();
//! ```
#![forbid(unsafe_code)]

mod convert;
mod engine;
mod error;
mod ids;
mod receiver;
mod snapshot;
mod store;
mod types;

pub use engine::JsEngine as Engine;
pub use receiver::{digest, JsIdempotencyStore as IdempotencyStore};
pub use store::JsMemoryStore as MemoryStore;
