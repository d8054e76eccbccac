//! [`AsyncIdempotencyStore`]: a receiver's idempotency records for async code.

use miniflow_core::{Begin, Digest, Error, IdempotencyKey, IdempotencyPolicy};
use serde_json::Value;

use super::{AsyncStore, Tx};
use crate::idempotency::{abandon_on, begin_on, finish_on};
use crate::sqlite::in_savepoint;

/// A receiver's idempotency records (DESIGN rules 10 and 14) in the file of an [`AsyncStore`], the
/// async twin of [`crate::SqliteIdempotencyStore`]: the same records, the same fenced reservations.
///
/// A receiver whose effect is rows of its own is at most once in every interleaving when it
/// reserves the key, writes its effect and finishes the record in ONE transaction
/// ([`AsyncStore::transaction`] with [`AsyncIdempotencyStore::begin_in`] and
/// [`AsyncIdempotencyStore::finish_in`]): the effect commits with its record under the token check,
/// or not at all. A receiver whose effect lies elsewhere (another service) reserves with
/// [`AsyncIdempotencyStore::begin`], acts, then records with [`AsyncIdempotencyStore::finish`], and
/// must keep the reservation timeout above its slowest effect.
///
/// ```
/// use miniflow_core::{json, Begin, Digest, IdempotencyKey, IdempotencyPolicy};
/// use miniflow_native::tokio::{AsyncIdempotencyStore, AsyncStore};
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
/// let dir = tempfile::tempdir()?;
/// let store = AsyncStore::open(dir.path().join("supplier.db")).await?;
/// let keys = AsyncIdempotencyStore::new(store.clone(), IdempotencyPolicy::default())?;
/// store.transaction(|tx| tx.execute("CREATE TABLE bookings (key TEXT PRIMARY KEY)", [])).await?;
///
/// let book = |key: &'static str| {
///     let keys = keys.clone();
///     store.transaction(move |tx| {
///         let key = IdempotencyKey::new(key)?;
///         match keys.begin_in(tx, &key, Digest::of(&json!({ "seat": "12A" })))? {
///             Begin::Fresh { token } => {
///                 tx.execute("INSERT INTO bookings VALUES (?1)", [key.as_str()])?; // the effect
///                 keys.finish_in(tx, &key, token, &json!({ "booking": 1 }))?;       // its record
///                 Ok(json!({ "booking": 1 }))
///             }
///             Begin::Completed { result } => Ok(result), // a repeat: no new effect
///             other => Err(miniflow_core::Error::invalid("key", key, format!("{other:?}"))),
///         }
///     })
/// };
/// assert_eq!(book("trip-001:1:0").await?, book("trip-001:1:0").await?);
/// let bookings: i64 = store.transaction(|tx| {
///     tx.sql().query_row("SELECT count(*) FROM bookings", [], |row| row.get(0))
///         .map_err(|e| miniflow_core::Error::Storage(Box::new(e)))
/// }).await?;
/// assert_eq!(bookings, 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct AsyncIdempotencyStore {
    store: AsyncStore,
    policy: IdempotencyPolicy,
}

impl AsyncIdempotencyStore {
    /// The records in `store`'s file, kept by `policy`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a policy out of bounds ([`IdempotencyPolicy::validate`]).
    pub fn new(store: AsyncStore, policy: IdempotencyPolicy) -> Result<Self, Error> {
        policy.validate()?;
        Ok(Self { store, policy })
    }

    /// The policy the records are kept by.
    pub fn policy(&self) -> &IdempotencyPolicy {
        &self.policy
    }

    /// [`miniflow_core::IdempotencyStore::begin`] in a transaction of its own.
    ///
    /// # Errors
    ///
    /// As [`miniflow_core::IdempotencyStore::begin`].
    pub async fn begin(&self, key: &IdempotencyKey, digest: Digest) -> Result<Begin, Error> {
        let (policy, key, now) = (self.policy, key.clone(), self.store.clock().now());
        self.store
            .write(move |tx| begin_on(tx, &policy, &key, digest, now))
            .await
    }

    /// [`miniflow_core::IdempotencyStore::finish`] in a transaction of its own.
    ///
    /// # Errors
    ///
    /// As [`miniflow_core::IdempotencyStore::finish`]: [`Error::StaleReservation`] when the
    /// reservation was taken over.
    pub async fn finish(
        &self,
        key: &IdempotencyKey,
        token: u64,
        result: Value,
    ) -> Result<(), Error> {
        let (key, now) = (key.clone(), self.store.clock().now());
        self.store
            .write(move |tx| finish_on(tx, &key, token, &result, now))
            .await
    }

    /// [`miniflow_core::IdempotencyStore::abandon`] in a transaction of its own.
    ///
    /// # Errors
    ///
    /// As [`miniflow_core::IdempotencyStore::abandon`].
    pub async fn abandon(&self, key: &IdempotencyKey, token: u64) -> Result<(), Error> {
        let key = key.clone();
        self.store
            .write(move |tx| abandon_on(tx, &key, token))
            .await
    }

    /// `begin` inside an [`AsyncStore::transaction`] closure (in a savepoint of its own), at the
    /// transaction's time.
    ///
    /// # Errors
    ///
    /// As [`miniflow_core::IdempotencyStore::begin`].
    pub fn begin_in(
        &self,
        tx: &Tx<'_>,
        key: &IdempotencyKey,
        digest: Digest,
    ) -> Result<Begin, Error> {
        in_savepoint(tx.sql(), |conn| {
            begin_on(conn, &self.policy, key, digest, tx.now())
        })
    }

    /// `finish` inside an [`AsyncStore::transaction`] closure, so the receiver's effect and its
    /// record commit together. When the reservation was taken over it returns
    /// [`Error::StaleReservation`] and writes nothing: return that error from the closure, and the
    /// effect is rolled back with it.
    ///
    /// # Errors
    ///
    /// As [`miniflow_core::IdempotencyStore::finish`].
    pub fn finish_in(
        &self,
        tx: &Tx<'_>,
        key: &IdempotencyKey,
        token: u64,
        result: &Value,
    ) -> Result<(), Error> {
        in_savepoint(tx.sql(), |conn| {
            finish_on(conn, key, token, result, tx.now())
        })
    }

    /// `abandon` inside an [`AsyncStore::transaction`] closure.
    ///
    /// # Errors
    ///
    /// As [`miniflow_core::IdempotencyStore::abandon`].
    pub fn abandon_in(&self, tx: &Tx<'_>, key: &IdempotencyKey, token: u64) -> Result<(), Error> {
        in_savepoint(tx.sql(), |conn| abandon_on(conn, key, token))
    }
}
