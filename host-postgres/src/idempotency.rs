//! [`PostgresIdempotencyStore`]: a receiver's idempotency records in PostgreSQL.

use miniflow_core::backend::{IdempotencyRecord, RecordState};
use miniflow_core::{
    canonical_json, Begin, Digest, Error, IdempotencyKey, IdempotencyPolicy, IdempotencyStore,
    Timestamp,
};
use postgres::Transaction;

use crate::clock::Clock;
use crate::connect::Shared;
use crate::db::{
    block, in_schema, savepoint, transaction, Columns, Db, Exec, Isolation, Own, Statements,
};
use crate::errors::{storage, DbError};
use crate::migrations::{Track, KEY_LOCK_CLASS};
use crate::options::PostgresOptions;
use crate::rows::to_sql_time;
use crate::PostgresStore;

/// The receiver's [`IdempotencyStore`] on PostgreSQL: the same database as a
/// [`PostgresStore`] or another one. Every `begin`, `finish` and `abandon` is one transaction that
/// first takes a transaction-scoped advisory lock on the key, so of two processes beginning the same
/// key at once one gets [`Begin::Fresh`] and the other [`Begin::InProgress`].
///
/// ```no_run
/// use miniflow_core::{json, Begin, Digest, IdempotencyKey, IdempotencyPolicy, IdempotencyStore, Timestamp};
/// use miniflow_postgres::PostgresIdempotencyStore;
///
/// let mut keys = PostgresIdempotencyStore::connect("postgresql://supplier@db.internal/bookings", IdempotencyPolicy::default())?;
/// let key = IdempotencyKey::new("trip-001:1:0")?;
/// let digest = Digest::of_intent(&json!({ "trip_id": "trip-001", "amount": 1200 }), &["trip_id", "amount"]);
/// let now = Timestamp::from_millis(0);
/// let Begin::Fresh { token } = keys.begin(&key, digest, now)? else { panic!("a new key is fresh") };
/// keys.finish(&key, token, &json!({ "reference": "REF-1" }), now)?; // after the effect
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct PostgresIdempotencyStore {
    shared: Shared,
    policy: IdempotencyPolicy,
}

/// What [`PostgresIdempotencyStore::run`] (and its async twin) did with a delivery.
#[derive(Debug, Clone, PartialEq)]
pub enum Received {
    /// The key was new: the effect ran and committed with its record, whose result this is.
    Done {
        /// What the effect returned, as stored.
        result: serde_json::Value,
    },
    /// A repeat: the effect ran before (the stored result); it did not run again.
    Repeated {
        /// The result stored the first time.
        result: serde_json::Value,
    },
    /// Another caller holds the key (a reservation of [`IdempotencyStore::begin`] outside any
    /// transaction of the effect's) and may still be doing the effect: try again later.
    InProgress {
        /// When that caller reserved it.
        since: Timestamp,
    },
    /// The key came back with other parameters: a caller's bug; the effect did not run.
    Conflict {
        /// The digest stored with the key.
        stored_digest: Digest,
        /// The digest of this request.
        new_digest: Digest,
    },
}

impl Received {
    /// The token of a fresh reservation, or what a `begin` that reserved nothing means here.
    pub(crate) fn unless_fresh(begun: Begin) -> Result<u64, Self> {
        match begun {
            Begin::Fresh { token } => Ok(token),
            Begin::Completed { result } => Err(Received::Repeated { result }),
            Begin::InProgress { since } => Err(Received::InProgress { since }),
            Begin::Conflict {
                stored_digest,
                new_digest,
                ..
            } => Err(Received::Conflict {
                stored_digest,
                new_digest,
            }),
        }
    }
}

impl PostgresIdempotencyStore {
    /// Connects to a receiver's database at `url` with the default [`PostgresOptions`] and brings
    /// its idempotency table up to date, and only that: a supplier's database gets the
    /// `idempotency` table (and `miniflow_receiver_schema`, its version), no outbox. On a database
    /// that holds miniflow's outbox already the records are its `idempotency` table; an outbox
    /// store connected later migrates around the records, keeping them. A receiver on the same
    /// database as its outbox shares that store's pool with [`PostgresIdempotencyStore::on`].
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a policy out of bounds ([`IdempotencyPolicy::validate`]), and as
    /// [`PostgresStore::connect`].
    pub fn connect(url: &str, policy: IdempotencyPolicy) -> Result<Self, Error> {
        Self::connect_with(url, policy, &PostgresOptions::default())
    }

    /// As [`PostgresIdempotencyStore::connect`], with `options`; with
    /// [`PostgresOptions::database_clock`], reservation times come from the database's clock.
    ///
    /// # Errors
    ///
    /// As [`PostgresIdempotencyStore::connect`].
    pub fn connect_with(
        url: &str,
        policy: IdempotencyPolicy,
        options: &PostgresOptions,
    ) -> Result<Self, Error> {
        policy.validate()?;
        Ok(Self {
            shared: Shared::connect(url, options, Track::Receiver)?,
            policy,
        })
    }

    /// Records on the database of `store`, sharing its pool and options.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a policy out of bounds.
    pub fn on(store: &PostgresStore, policy: IdempotencyPolicy) -> Result<Self, Error> {
        policy.validate()?;
        Ok(Self {
            shared: store.shared().clone(),
            policy,
        })
    }

    /// A connection from the store's pool, for diagnostics, tests and the caller's own transactions
    /// ([`PostgresIdempotencyStore::finish_in`]).
    ///
    /// # Errors
    ///
    /// [`Error::Storage`] when no connection can be had within the connect timeout.
    pub fn client(&self) -> Result<crate::PooledClient, Error> {
        self.shared.client()
    }

    /// [`IdempotencyStore::begin`] inside the caller's own transaction `tx`: the reservation commits
    /// with `tx`, or not at all, and the key's lock is held until `tx` ends, so a second delivery
    /// of the key waits for the first's transaction and then finds its record. With the effect and
    /// [`PostgresIdempotencyStore::finish_in`] in the same `tx`, a local effect costs one
    /// transaction, and a failure anywhere (rolled back) leaves no reservation to abandon.
    /// [`PostgresIdempotencyStore::run`] does all of it.
    ///
    /// # Errors
    ///
    /// As [`IdempotencyStore::begin`].
    pub fn begin_in(
        &self,
        tx: &mut Transaction<'_>,
        key: &IdempotencyKey,
        digest: Digest,
        now: Timestamp,
    ) -> Result<Begin, Error> {
        let mut statements = Statements::default();
        let mut db = Db::new(tx, &mut statements, None);
        block(begin_in(
            &mut db,
            &self.shared.options,
            &self.policy,
            key,
            digest,
            now,
        ))
    }

    /// A delivery's local effect, at most once, in ONE transaction: reserves `key`
    /// ([`PostgresIdempotencyStore::begin_in`]), runs `effect` in the same transaction, records its
    /// result ([`PostgresIdempotencyStore::finish_in`]) and commits. A repeat of the key returns the
    /// stored result without running `effect`. When `effect` fails (or anything after it), the
    /// transaction rolls back — its rows, the reservation and all — and the error is returned:
    /// nothing is left to abandon, and the next delivery starts afresh.
    ///
    /// ```no_run
    /// use miniflow_core::{json, Digest, IdempotencyKey, IdempotencyPolicy, Timestamp};
    /// use miniflow_postgres::{PostgresIdempotencyStore, Received};
    ///
    /// let keys = PostgresIdempotencyStore::connect("postgresql://supplier@db.internal/bookings", IdempotencyPolicy::default())?;
    /// let key = IdempotencyKey::new("trip-001:1:0")?;
    /// let received = keys.run(&key, Digest::of(&json!({ "seat": "12A" })), Timestamp::from_millis(0), |tx| {
    ///     tx.execute("INSERT INTO bookings VALUES ($1)", &[&key.as_str()])
    ///         .map_err(|e| miniflow_core::Error::Storage(Box::new(e)))?;
    ///     Ok::<_, miniflow_core::Error>(json!({ "booking": 1 }))
    /// })?;
    /// assert!(matches!(received, Received::Done { .. } | Received::Repeated { .. }));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// `effect`'s error, or the store's ([`Error::Storage`], [`Error::Busy`], …) as `E`.
    pub fn run<E: From<Error>>(
        &self,
        key: &IdempotencyKey,
        digest: Digest,
        now: Timestamp,
        effect: impl FnOnce(&mut Transaction<'_>) -> Result<serde_json::Value, E>,
    ) -> Result<Received, E> {
        let mut client = self.shared.client()?;
        let mut tx = client.transaction().map_err(storage)?;
        let token = match Received::unless_fresh(self.begin_in(&mut tx, key, digest, now)?) {
            Ok(token) => token,
            Err(received) => return Ok(received),
        };
        let result = effect(&mut tx)?;
        self.finish_in(&mut tx, key, token, &result, now)?;
        tx.commit().map_err(storage)?;
        Ok(Received::Done { result })
    }

    /// [`IdempotencyStore::finish`] inside the caller's own transaction `tx` (on the same database),
    /// so that the receiver's effect and the record of it commit together or not at all. The store
    /// never commits `tx`. When the reservation was taken over, `finish_in` returns
    /// [`Error::StaleReservation`] and writes nothing: roll `tx` back, and the effect is undone with
    /// it — such a receiver is at most once whatever the timing (DESIGN rule 14).
    ///
    /// # Errors
    ///
    /// As [`IdempotencyStore::finish`].
    pub fn finish_in(
        &self,
        tx: &mut Transaction<'_>,
        key: &IdempotencyKey,
        token: u64,
        result: &serde_json::Value,
        now: Timestamp,
    ) -> Result<(), Error> {
        // The caller's connection may not be one of the pool's: statements prepared for this call.
        let mut statements = Statements::default();
        let mut db = Db::new(tx, &mut statements, None);
        block(finish_in(
            &mut db,
            &self.shared.options,
            key,
            token,
            result,
            now,
        ))
    }
}

/// [`PostgresIdempotencyStore::finish_in`] on the caller's transaction `db`, in a savepoint: a
/// refused finish leaves nothing in it, and does not leave it aborted.
pub(crate) async fn finish_in(
    db: &mut impl Exec,
    options: &PostgresOptions,
    key: &IdempotencyKey,
    token: u64,
    result: &serde_json::Value,
    now: Timestamp,
) -> Result<(), Error> {
    in_schema!(db, options, {
        savepoint!(db, {
            lock_key(db, key).await?;
            let clock = Clock::read(options, db, now).await?;
            finish_on(db, key, token, result, clock.now).await
        })
    })
}

/// [`IdempotencyStore::begin`] on the caller's transaction `db`, in a savepoint: the reservation
/// (or nothing) commits with the caller's transaction, and the key's lock is held until it ends.
pub(crate) async fn begin_in(
    db: &mut impl Exec,
    options: &PostgresOptions,
    policy: &IdempotencyPolicy,
    key: &IdempotencyKey,
    digest: Digest,
    now: Timestamp,
) -> Result<Begin, Error> {
    in_schema!(db, options, {
        savepoint!(db, {
            lock_key(db, key).await?;
            let now = Clock::read(options, db, now).await?.now;
            reserve(db, policy, key, digest, now).await
        })
    })
}

/// The core's rule for a `begin` ([`IdempotencyRecord::begin`]) on the record read `FOR UPDATE`,
/// under the key's lock: what to answer, and the record to write, if any.
async fn reserve(
    db: &mut impl Exec,
    policy: &IdempotencyPolicy,
    key: &IdempotencyKey,
    digest: Digest,
    now: Timestamp,
) -> Result<Begin, Error> {
    let existing = select_for_update(db, key).await?;
    let (answer, record) = IdempotencyRecord::begin(existing.as_ref(), key, digest, policy, now);
    if let Some(record) = record {
        write(db, &record).await?;
    }
    Ok(answer)
}

/// [`IdempotencyStore::begin`] in one transaction of the store's holding the key's advisory lock.
pub(crate) async fn begin_on(
    db: &mut impl Own,
    options: &PostgresOptions,
    policy: &IdempotencyPolicy,
    key: &IdempotencyKey,
    digest: Digest,
    now: Timestamp,
) -> Result<Begin, Error> {
    transaction!(db, Isolation::ReadCommitted, {
        lock_key(db, key).await?;
        let now = Clock::read(options, db, now).await?.now;
        reserve(db, policy, key, digest, now).await
    })
}

/// [`IdempotencyStore::finish`] in one transaction of the store's holding the key's advisory lock.
pub(crate) async fn finish_locked(
    db: &mut impl Own,
    options: &PostgresOptions,
    key: &IdempotencyKey,
    token: u64,
    result: &serde_json::Value,
    now: Timestamp,
) -> Result<(), Error> {
    transaction!(db, Isolation::ReadCommitted, {
        lock_key(db, key).await?;
        let now = Clock::read(options, db, now).await?.now;
        finish_on(db, key, token, result, now).await
    })
}

/// [`IdempotencyStore::abandon`] in one transaction of the store's holding the key's advisory lock.
pub(crate) async fn abandon_locked(
    db: &mut impl Own,
    key: &IdempotencyKey,
    token: u64,
) -> Result<(), Error> {
    transaction!(db, Isolation::ReadCommitted, {
        lock_key(db, key).await?;
        if let Some(mut record) = select_for_update(db, key).await? {
            record.abandon(token)?;
            write(db, &record).await?;
        }
        Ok::<_, Error>(())
    })
}

/// Takes the advisory lock of `key` until the transaction ends: the record's row may not exist yet.
async fn lock_key(db: &mut impl Exec, key: &IdempotencyKey) -> Result<(), Error> {
    db.execute(
        "SELECT pg_advisory_xact_lock($1, hashtext($2))",
        &[&KEY_LOCK_CLASS, &key.as_str()],
    )
    .await
    .map_err(storage)?;
    Ok(())
}

pub(crate) async fn select(
    db: &mut impl Exec,
    key: &IdempotencyKey,
) -> Result<Option<IdempotencyRecord>, Error> {
    let Some(row) = db
        .query_opt(
            "SELECT digest, reserved_at, result, completed_at, token, abandoned \
             FROM idempotency WHERE key = $1",
            &[&key.as_str()],
        )
        .await
        .map_err(storage)?
    else {
        return Ok(None);
    };
    let corrupt = |what: String| Error::Corrupt(format!("idempotency key {key}: {what}"));
    let column = |e: DbError| corrupt(e.to_string());
    let time = |millis: i64| {
        u64::try_from(millis)
            .map(Timestamp::from_millis)
            .map_err(|_| corrupt(format!("negative time {millis}")))
    };
    let digest: String = row.try_get("digest").map_err(column)?;
    let result: Option<String> = row.try_get("result").map_err(column)?;
    let completed_at: Option<i64> = row.try_get("completed_at").map_err(column)?;
    let abandoned: bool = row.try_get("abandoned").map_err(column)?;
    let token: i64 = row.try_get("token").map_err(column)?;
    let state = match (result, completed_at, abandoned) {
        (Some(result), Some(completed_at), _) => RecordState::Completed {
            result: serde_json::from_str(&result)
                .map_err(|e| corrupt(format!("the result is not JSON: {e}")))?,
            completed_at: time(completed_at)?,
        },
        (_, _, true) => RecordState::Abandoned,
        _ => RecordState::Reserved,
    };
    Ok(Some(IdempotencyRecord {
        key: key.clone(),
        digest: digest
            .parse()
            .map_err(|e| corrupt(format!("digest: {e}")))?,
        reserved_at: time(row.try_get("reserved_at").map_err(column)?)?,
        token: u64::try_from(token).map_err(|_| corrupt(format!("negative token {token}")))?,
        state,
    }))
}

async fn write(db: &mut impl Exec, record: &IdempotencyRecord) -> Result<(), Error> {
    let (result, completed_at, abandoned) = match &record.state {
        RecordState::Completed {
            result,
            completed_at,
        } => (
            Some(canonical_json(result)),
            Some(to_sql_time("completed_at", *completed_at)?),
            false,
        ),
        RecordState::Reserved => (None, None, false),
        RecordState::Abandoned => (None, None, true),
    };
    let token = i64::try_from(record.token)
        .map_err(|_| Error::invalid("token", record.token, "is past i64::MAX"))?;
    db.execute(
        "INSERT INTO idempotency \
             (key, digest, reserved_at, result, completed_at, settled_at, token, abandoned) \
             VALUES ($1, $2, $3::bigint, $4, $5::bigint, COALESCE($5::bigint, $3::bigint), $6, $7) \
             ON CONFLICT (key) DO UPDATE SET digest = EXCLUDED.digest, \
             reserved_at = EXCLUDED.reserved_at, result = EXCLUDED.result, \
             completed_at = EXCLUDED.completed_at, settled_at = EXCLUDED.settled_at, \
             token = EXCLUDED.token, abandoned = EXCLUDED.abandoned",
        &[
            &record.key.as_str(),
            &record.digest.to_string(),
            &to_sql_time("now", record.reserved_at)?,
            &result,
            &completed_at,
            &token,
            &abandoned,
        ],
    )
    .await
    .map_err(storage)?;
    Ok(())
}

async fn finish_on(
    db: &mut impl Exec,
    key: &IdempotencyKey,
    token: u64,
    result: &serde_json::Value,
    now: Timestamp,
) -> Result<(), Error> {
    let mut record = select_for_update(db, key)
        .await?
        .ok_or_else(|| Error::UnknownKey {
            key: key.to_string(),
        })?;
    record.finish(token, result.clone(), now)?;
    write(db, &record).await
}

/// The record of `key`, locked until the transaction ends.
async fn select_for_update(
    db: &mut impl Exec,
    key: &IdempotencyKey,
) -> Result<Option<IdempotencyRecord>, Error> {
    db.execute(
        "SELECT 1 FROM idempotency WHERE key = $1 FOR UPDATE",
        &[&key.as_str()],
    )
    .await
    .map_err(storage)?;
    select(db, key).await
}

impl IdempotencyStore for PostgresIdempotencyStore {
    fn policy(&self) -> &IdempotencyPolicy {
        &self.policy
    }

    fn begin(
        &mut self,
        key: &IdempotencyKey,
        digest: Digest,
        now: Timestamp,
    ) -> Result<Begin, Error> {
        let mut connection = self.shared.connection()?;
        block(begin_on(
            &mut connection.db(),
            &self.shared.options,
            &self.policy,
            key,
            digest,
            now,
        ))
    }

    fn finish(
        &mut self,
        key: &IdempotencyKey,
        token: u64,
        result: &serde_json::Value,
        now: Timestamp,
    ) -> Result<(), Error> {
        let mut connection = self.shared.connection()?;
        block(finish_locked(
            &mut connection.db(),
            &self.shared.options,
            key,
            token,
            result,
            now,
        ))
    }

    fn abandon(&mut self, key: &IdempotencyKey, token: u64) -> Result<(), Error> {
        let mut connection = self.shared.connection()?;
        block(abandon_locked(&mut connection.db(), key, token))
    }

    fn record(&self, key: &IdempotencyKey) -> Result<Option<IdempotencyRecord>, Error> {
        block(select(&mut self.shared.connection()?.db(), key))
    }

    fn purge(&mut self, now: Timestamp, batch: usize) -> Result<usize, Error> {
        let mut connection = self.shared.connection()?;
        block(purge(
            &mut connection.db(),
            &self.shared.options,
            &self.policy,
            now,
            batch,
        ))
    }
}

/// Deletes up to `batch` records settled at least the policy's retention before `now`, oldest
/// first, skipping keys another transaction holds; returns how many.
pub(crate) async fn purge(
    db: &mut impl Own,
    options: &PostgresOptions,
    policy: &IdempotencyPolicy,
    now: Timestamp,
    batch: usize,
) -> Result<usize, Error> {
    miniflow_core::backend::check_purge_batch(batch)?;
    let clock = Clock::read(options, db, now).await?;
    // A record expires when settled_at + retention <= now, i.e. settled_at <= now - retention.
    let Some(cutoff) = miniflow_core::purge_cutoff(clock.now, policy.retention) else {
        return Ok(0);
    };
    let deleted = db
        .execute(
            "DELETE FROM idempotency WHERE key IN \
                 (SELECT key FROM idempotency WHERE settled_at <= $1 ORDER BY settled_at \
                  LIMIT $2 FOR UPDATE SKIP LOCKED)",
            &[
                &to_sql_time("now", cutoff)?,
                &i64::try_from(batch).unwrap_or(i64::MAX),
            ],
        )
        .await
        .map_err(storage)?;
    Ok(usize::try_from(deleted).unwrap_or(usize::MAX))
}
