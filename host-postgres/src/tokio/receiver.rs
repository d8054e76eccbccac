//! [`AsyncPostgresIdempotencyStore`]: a receiver's idempotency records for tokio services.

use miniflow_core::backend::IdempotencyRecord;
use miniflow_core::{Begin, Digest, Error, IdempotencyKey, IdempotencyPolicy};
use serde_json::Value;
use tokio_postgres::Transaction;

use super::caller::CallerTransaction;
use super::AsyncPostgresStore;
use crate::errors::storage;
use crate::idempotency::{
    abandon_locked, begin_in, begin_on, finish_in, finish_locked, purge, select, Received,
};
use crate::migrations::Track;

/// A receiver's idempotency records (DESIGN rules 10 and 14) on the database of an
/// [`AsyncPostgresStore`], the async twin of [`crate::PostgresIdempotencyStore`]: the same records,
/// the same fenced reservations, the same statements. Clones share the store's pool.
///
/// A receiver whose effect is rows of its own is at most once in every interleaving when it
/// finishes the record in the transaction of its effect ([`AsyncPostgresIdempotencyStore::finish_in`]):
/// a reservation taken over meanwhile makes `finish_in` refuse, and the caller rolls its effect back.
///
/// ```no_run
/// use miniflow_core::{json, Begin, Digest, IdempotencyKey, IdempotencyPolicy};
/// use miniflow_postgres::tokio::{AsyncPostgresIdempotencyStore, AsyncPostgresStore};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let store = AsyncPostgresStore::connect("postgresql://supplier@db.internal/bookings").await?;
/// let keys = AsyncPostgresIdempotencyStore::new(store.clone(), IdempotencyPolicy::default())?;
/// let key = IdempotencyKey::new("trip-001:1:0")?;
/// match keys.begin(&key, Digest::of(&json!({ "seat": "12A" }))).await? {
///     Begin::Fresh { token } => {
///         let mut client = store.client().await?;
///         let tx = client.transaction().await?;
///         tx.execute("INSERT INTO bookings VALUES ($1)", &[&key.as_str()]).await?; // the effect
///         keys.finish_in(&tx, &key, token, &json!({ "booking": 1 })).await?;     // its record
///         tx.commit().await?;
///     }
///     Begin::Completed { result } => println!("a repeat: {result}"),
///     other => println!("not now: {other:?}"),
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct AsyncPostgresIdempotencyStore {
    store: AsyncPostgresStore,
    policy: IdempotencyPolicy,
}

impl AsyncPostgresIdempotencyStore {
    /// Connects to a receiver's database at `url` with the default [`crate::PostgresOptions`]
    /// and brings its idempotency table up to date, and only that: a supplier's database gets no
    /// outbox (see [`crate::PostgresIdempotencyStore::connect`]).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a policy out of bounds ([`IdempotencyPolicy::validate`]), and as
    /// [`AsyncPostgresStore::connect`].
    pub async fn connect(url: &str, policy: IdempotencyPolicy) -> Result<Self, Error> {
        Self::connect_with(url, policy, &crate::PostgresOptions::default()).await
    }

    /// As [`AsyncPostgresIdempotencyStore::connect`], with `options`.
    ///
    /// # Errors
    ///
    /// As [`AsyncPostgresIdempotencyStore::connect`].
    pub async fn connect_with(
        url: &str,
        policy: IdempotencyPolicy,
        options: &crate::PostgresOptions,
    ) -> Result<Self, Error> {
        policy.validate()?;
        let store = AsyncPostgresStore::connect_for(url, options, Track::Receiver).await?;
        Ok(Self { store, policy })
    }

    /// The records on `store`'s database, kept by `policy`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a policy out of bounds ([`IdempotencyPolicy::validate`]).
    pub fn new(store: AsyncPostgresStore, policy: IdempotencyPolicy) -> Result<Self, Error> {
        policy.validate()?;
        Ok(Self { store, policy })
    }

    /// A connection from the records' pool, for the caller's own transactions (the effect's, with
    /// [`AsyncPostgresIdempotencyStore::begin_in`] and [`AsyncPostgresIdempotencyStore::finish_in`]).
    ///
    /// # Errors
    ///
    /// [`Error::Storage`] when no connection can be had within the connect timeout.
    pub async fn client(&self) -> Result<super::PooledAsyncClient, Error> {
        self.store.client().await
    }

    /// The policy the records are kept by.
    pub fn policy(&self) -> &IdempotencyPolicy {
        &self.policy
    }

    /// Reserves `key` for a request whose business intent digests to `digest` (as
    /// [`miniflow_core::IdempotencyStore::begin`]), in one transaction holding the key's lock.
    ///
    /// A dropped call may leave the key reserved by nobody: the reservation runs out after the
    /// policy's time for one, and a later `begin` takes it over.
    ///
    /// # Errors
    ///
    /// As [`miniflow_core::IdempotencyStore::begin`].
    pub async fn begin(&self, key: &IdempotencyKey, digest: Digest) -> Result<Begin, Error> {
        let now = self.store.clock().now();
        let mut connection = self.store.connection().await?;
        begin_on(
            &mut connection.db(),
            self.store.options(),
            &self.policy,
            key,
            digest,
            now,
        )
        .await
    }

    /// Records `result` for the reservation `token` of `key` (as
    /// [`miniflow_core::IdempotencyStore::finish`]).
    ///
    /// A dropped call is written whole or not at all, possibly just after the drop; finishing again
    /// answers [`Error::StaleReservation`] once the first got through.
    ///
    /// # Errors
    ///
    /// As [`miniflow_core::IdempotencyStore::finish`].
    pub async fn finish(
        &self,
        key: &IdempotencyKey,
        token: u64,
        result: &Value,
    ) -> Result<(), Error> {
        let now = self.store.clock().now();
        let mut connection = self.store.connection().await?;
        finish_locked(
            &mut connection.db(),
            self.store.options(),
            key,
            token,
            result,
            now,
        )
        .await
    }

    /// [`AsyncPostgresIdempotencyStore::finish`] inside the caller's own transaction `tx`, so that
    /// the effect and its record commit together or not at all; the store never commits `tx`. A
    /// reservation taken over is [`Error::StaleReservation`] and writes nothing (nor leaves `tx`
    /// aborted): roll `tx` back, and the effect is undone with it.
    ///
    /// A dropped call may leave its rows in `tx`: roll `tx` back, never commit it after a dropped
    /// call.
    ///
    /// # Errors
    ///
    /// As [`miniflow_core::IdempotencyStore::finish`].
    pub async fn finish_in(
        &self,
        tx: impl Into<CallerTransaction<'_>>,
        key: &IdempotencyKey,
        token: u64,
        result: &Value,
    ) -> Result<(), Error> {
        let now = self.store.clock().now();
        finish_in(
            &mut tx.into(),
            self.store.options(),
            key,
            token,
            result,
            now,
        )
        .await
    }

    /// [`AsyncPostgresIdempotencyStore::begin`] inside the caller's own transaction `tx` (as
    /// [`crate::PostgresIdempotencyStore::begin_in`]): the reservation commits with `tx`, and the
    /// key's lock is held until `tx` ends.
    ///
    /// A dropped call may leave its rows in `tx`: roll `tx` back, never commit it after a dropped
    /// call.
    ///
    /// # Errors
    ///
    /// As [`miniflow_core::IdempotencyStore::begin`].
    pub async fn begin_in(
        &self,
        tx: impl Into<CallerTransaction<'_>>,
        key: &IdempotencyKey,
        digest: Digest,
    ) -> Result<Begin, Error> {
        let now = self.store.clock().now();
        begin_in(
            &mut tx.into(),
            self.store.options(),
            &self.policy,
            key,
            digest,
            now,
        )
        .await
    }

    /// A delivery's local effect, at most once, in ONE transaction (as
    /// [`crate::PostgresIdempotencyStore::run`]): reserves `key`, awaits `effect` in the same
    /// transaction, records its result and commits; a repeat returns the stored result without
    /// running `effect`. When `effect` fails — or the call is dropped — the transaction rolls back,
    /// the reservation with it: there is nothing to abandon, whatever path the request took.
    ///
    /// ```no_run
    /// use miniflow_core::{json, Digest, IdempotencyKey, IdempotencyPolicy};
    /// use miniflow_postgres::tokio::{AsyncPostgresIdempotencyStore, AsyncPostgresStore};
    /// use miniflow_postgres::Received;
    ///
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = AsyncPostgresStore::connect("postgresql://supplier@db.internal/bookings").await?;
    /// let keys = AsyncPostgresIdempotencyStore::new(store, Default::default())?;
    /// let key = IdempotencyKey::new("trip-001:1:0")?;
    /// let received = keys
    ///     .run(&key, Digest::of(&json!({ "seat": "12A" })), async |tx| {
    ///         tx.execute("INSERT INTO bookings VALUES ($1)", &[&key.as_str()])
    ///             .await
    ///             .map_err(|e| miniflow_core::Error::Storage(Box::new(e)))?;
    ///         Ok::<_, miniflow_core::Error>(json!({ "booking": 1 }))
    ///     })
    ///     .await?;
    /// assert!(matches!(received, Received::Done { .. } | Received::Repeated { .. }));
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// `effect`'s error, or the store's as `E`.
    pub async fn run<E, F>(
        &self,
        key: &IdempotencyKey,
        digest: Digest,
        effect: F,
    ) -> Result<Received, E>
    where
        E: From<Error>,
        F: AsyncFnOnce(&Transaction<'_>) -> Result<Value, E>,
    {
        let mut client = self.store.client().await?;
        let tx = client.transaction().await.map_err(storage)?;
        let token = match Received::unless_fresh(self.begin_in(&tx, key, digest).await?) {
            Ok(token) => token,
            Err(received) => return Ok(received),
        };
        let result = effect(&tx).await?;
        self.finish_in(&tx, key, token, &result).await?;
        tx.commit().await.map_err(storage)?;
        Ok(Received::Done { result })
    }

    /// Releases the reservation `token` of `key` without an effect (as
    /// [`miniflow_core::IdempotencyStore::abandon`]).
    ///
    /// A dropped call leaves the reservation held or released; one held by nobody runs out.
    ///
    /// # Errors
    ///
    /// As [`miniflow_core::IdempotencyStore::abandon`].
    pub async fn abandon(&self, key: &IdempotencyKey, token: u64) -> Result<(), Error> {
        let mut connection = self.store.connection().await?;
        abandon_locked(&mut connection.db(), key, token).await
    }

    /// The record of `key`, if any.
    ///
    /// # Errors
    ///
    /// [`Error::Storage`] when the database cannot be read; [`Error::Corrupt`] for a record that
    /// cannot be read.
    pub async fn record(&self, key: &IdempotencyKey) -> Result<Option<IdempotencyRecord>, Error> {
        let mut connection = self.store.connection().await?;
        select(&mut connection.db(), key).await
    }

    /// Deletes up to `batch` records whose retention has passed (as
    /// [`miniflow_core::IdempotencyStore::purge`]); returns how many.
    ///
    /// # Errors
    ///
    /// As [`miniflow_core::IdempotencyStore::purge`].
    pub async fn purge(&self, batch: usize) -> Result<usize, Error> {
        let now = self.store.clock().now();
        let mut connection = self.store.connection().await?;
        purge(
            &mut connection.db(),
            self.store.options(),
            &self.policy,
            now,
            batch,
        )
        .await
    }
}
