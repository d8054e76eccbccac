//! The async API on PostgreSQL for tokio services (feature `tokio`), on tokio-postgres: the
//! synchronous store's operations — the same statements, the same rules, written once — awaited
//! on connections of a pool of its own. No `spawn_blocking`, no second runtime, no blocking call.
//!
//! | piece | what it is |
//! |---|---|
//! | [`AsyncPostgresStore`] | a `Clone` handle on a pool: `handle`, `start`, `fire`, claims and acks, the caller's transaction (`append_in`, `handle_in`, `start_in`) |
//! | [`AsyncPostgresIdempotencyStore`] | a receiver's fenced reservations, `finish_in` inside the effect's transaction |
//! | [`PooledAsyncClient`] | a connection of the pool, for the caller's own transactions |
//! | [`CallerTransaction`] | the caller's open transaction, tokio-postgres's or (feature `sqlx`) sqlx's, which miniflow's rows join |
//!
//! The names and shapes are the SQLite host's (`miniflow::tokio::AsyncStore`): a service moves from
//! one to the other by how it opens the store.

mod caller;
mod listen;
mod pool;
mod receiver;
mod store;

pub use self::caller::CallerTransaction;
pub use self::receiver::AsyncPostgresIdempotencyStore;
pub use self::store::{AsyncPostgresStore, PooledAsyncClient};
/// The sqlx version whose transactions [`CallerTransaction`] takes (feature `sqlx`), re-exported
/// for a service that wants to name the same one.
#[cfg(feature = "sqlx")]
pub use sqlx;
/// The async PostgreSQL driver miniflow is built on, re-exported so that the caller's-transaction
/// entry points take a transaction of the same `tokio-postgres` version.
pub use tokio_postgres;
