//! [`SqliteIdempotencyStore`]: a receiver's idempotency records in a SQLite file.

use std::path::{Path, PathBuf};

use miniflow_core::backend::{IdempotencyRecord, RecordState};
use miniflow_core::{
    canonical_json, Begin, Digest, Error, IdempotencyKey, IdempotencyPolicy, IdempotencyStore,
    Timestamp,
};
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use crate::connect::{open_connection, SqliteOptions};
use crate::errors::storage;
use crate::sqlite::{in_savepoint, limit, to_sql_time};

/// The receiver's [`IdempotencyStore`] on a SQLite file: the same file as a [`crate::SqliteStore`] or
/// another one. Every `begin` is one `BEGIN IMMEDIATE` transaction, so of two processes beginning the
/// same key at once one gets [`Begin::Fresh`] and the other [`Begin::InProgress`].
///
/// ```
/// use miniflow_core::{json, Begin, Digest, IdempotencyKey, IdempotencyPolicy, IdempotencyStore, Timestamp};
/// use miniflow_native::SqliteIdempotencyStore;
///
/// let dir = tempfile::tempdir()?;
/// let mut keys = SqliteIdempotencyStore::open(dir.path().join("supplier.db"), IdempotencyPolicy::default())?;
/// let key = IdempotencyKey::new("trip-001:1:0")?;
/// let request = json!({ "trip_id": "trip-001", "amount": 1200, "sent_at": "09:00" });
/// let digest = Digest::of_intent(&request, &["trip_id", "amount"]);
/// let now = Timestamp::from_millis(0);
///
/// let Begin::Fresh { token } = keys.begin(&key, digest, now)? else { panic!("a new key is fresh") };
/// keys.finish(&key, token, &json!({ "reference": "REF-1" }), now)?; // after the effect
/// assert_eq!(keys.begin(&key, digest, now)?, Begin::Completed { result: json!({ "reference": "REF-1" }) });
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct SqliteIdempotencyStore {
    conn: Connection,
    policy: IdempotencyPolicy,
    path: PathBuf,
}

impl SqliteIdempotencyStore {
    /// Opens (or creates) the records at `path` with the durable defaults.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a policy out of bounds ([`IdempotencyPolicy::validate`]), and as
    /// [`crate::SqliteStore::open`].
    pub fn open(path: impl AsRef<Path>, policy: IdempotencyPolicy) -> Result<Self, Error> {
        Self::open_with(path, policy, &SqliteOptions::default())
    }

    /// Opens (or creates) the records at `path` with `options`.
    ///
    /// # Errors
    ///
    /// As [`SqliteIdempotencyStore::open`].
    pub fn open_with(
        path: impl AsRef<Path>,
        policy: IdempotencyPolicy,
        options: &SqliteOptions,
    ) -> Result<Self, Error> {
        policy.validate()?;
        let path = path.as_ref().to_path_buf();
        let conn = open_connection(&path, options)?;
        Ok(Self { conn, policy, path })
    }

    /// The file the records live in.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

fn select(conn: &Connection, key: &IdempotencyKey) -> Result<Option<IdempotencyRecord>, Error> {
    let row = conn
        .prepare_cached(
            "SELECT digest, reserved_at, result, completed_at, token, abandoned \
             FROM idempotency WHERE key = ?1",
        )
        .and_then(|mut stmt| {
            stmt.query_row([key.as_str()], |row| {
                Ok((
                    row.get::<_, String>(0)?,
                    row.get::<_, i64>(1)?,
                    row.get::<_, Option<String>>(2)?,
                    row.get::<_, Option<i64>>(3)?,
                    row.get::<_, i64>(4)?,
                    row.get::<_, bool>(5)?,
                ))
            })
            .optional()
        })
        .map_err(storage)?;
    let Some((digest, reserved_at, result, completed_at, token, abandoned)) = row else {
        return Ok(None);
    };
    let time = |millis: i64| {
        u64::try_from(millis)
            .map(Timestamp::from_millis)
            .map_err(|_| Error::Corrupt(format!("negative time {millis} for key {key}")))
    };
    let state = match (result, completed_at, abandoned) {
        (Some(result), Some(completed_at), _) => RecordState::Completed {
            result: serde_json::from_str(&result)
                .map_err(|e| Error::Corrupt(format!("result of key {key} is not JSON: {e}")))?,
            completed_at: time(completed_at)?,
        },
        (_, _, true) => RecordState::Abandoned,
        _ => RecordState::Reserved,
    };
    Ok(Some(IdempotencyRecord {
        key: key.clone(),
        digest: digest
            .parse()
            .map_err(|e| Error::Corrupt(format!("digest of key {key}: {e}")))?,
        reserved_at: time(reserved_at)?,
        token: u64::try_from(token)
            .map_err(|_| Error::Corrupt(format!("negative token {token} for key {key}")))?,
        state,
    }))
}

fn write(conn: &Connection, record: &IdempotencyRecord) -> Result<(), Error> {
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
    let reserved_at = to_sql_time("now", record.reserved_at)?;
    let token = i64::try_from(record.token)
        .map_err(|_| Error::invalid("token", record.token, "is past i64::MAX"))?;
    conn.prepare_cached(
        "INSERT OR REPLACE INTO idempotency \
         (key, digest, reserved_at, result, completed_at, settled_at, token, abandoned) \
         VALUES (?1, ?2, ?3, ?4, ?5, COALESCE(?5, ?3), ?6, ?7)",
    )
    .and_then(|mut stmt| {
        stmt.execute(params![
            record.key.as_str(),
            record.digest.to_string(),
            reserved_at,
            result,
            completed_at,
            token,
            abandoned
        ])
    })
    .map_err(storage)?;
    Ok(())
}

pub(crate) fn begin_on(
    conn: &Connection,
    policy: &IdempotencyPolicy,
    key: &IdempotencyKey,
    digest: Digest,
    now: Timestamp,
) -> Result<Begin, Error> {
    let existing = select(conn, key)?;
    let (answer, record) = IdempotencyRecord::begin(existing.as_ref(), key, digest, policy, now);
    if let Some(record) = record {
        write(conn, &record)?;
    }
    Ok(answer)
}

pub(crate) fn finish_on(
    conn: &Connection,
    key: &IdempotencyKey,
    token: u64,
    result: &serde_json::Value,
    now: Timestamp,
) -> Result<(), Error> {
    let mut record = select(conn, key)?.ok_or_else(|| Error::UnknownKey {
        key: key.to_string(),
    })?;
    record.finish(token, result.clone(), now)?;
    write(conn, &record)
}

pub(crate) fn abandon_on(conn: &Connection, key: &IdempotencyKey, token: u64) -> Result<(), Error> {
    if let Some(mut record) = select(conn, key)? {
        record.abandon(token)?;
        write(conn, &record)?;
    }
    Ok(())
}

impl SqliteIdempotencyStore {
    fn write(&mut self) -> Result<rusqlite::Transaction<'_>, Error> {
        self.conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(storage)
    }

    /// [`IdempotencyStore::begin`] inside the caller's own transaction `tx` (on the same file, begun
    /// with `BEGIN IMMEDIATE`). Usually `begin` runs in its own short transaction, so a concurrent
    /// caller sees the reservation at once; this is for a receiver that reads its own rows first.
    ///
    /// # Errors
    ///
    /// As [`IdempotencyStore::begin`].
    pub fn begin_in(
        &self,
        tx: &rusqlite::Transaction<'_>,
        key: &IdempotencyKey,
        digest: Digest,
        now: Timestamp,
    ) -> Result<Begin, Error> {
        in_savepoint(tx, |conn| begin_on(conn, &self.policy, key, digest, now))
    }

    /// [`IdempotencyStore::finish`] inside the caller's own transaction `tx`, so that the receiver's
    /// effect (its own rows) and the record of it commit together or not at all. The store never
    /// commits `tx`. When the reservation was taken over, `finish_in` returns
    /// [`Error::StaleReservation`] and writes nothing: roll `tx` back, and the effect is undone with
    /// it — such a receiver is at most once whatever the timing (DESIGN rule 14).
    ///
    /// The caller guarantees: `tx` is on the file of this store (opened after it, so the schema is
    /// current) and began with `BEGIN IMMEDIATE`, and it commits `tx` only when `finish_in` succeeded.
    ///
    /// ```
    /// use miniflow_core::{json, Begin, Digest, IdempotencyKey, IdempotencyPolicy, IdempotencyStore, Timestamp};
    /// use miniflow_native::SqliteIdempotencyStore;
    /// use rusqlite::{Connection, TransactionBehavior};
    ///
    /// let dir = tempfile::tempdir()?;
    /// let path = dir.path().join("supplier.db");
    /// let mut keys = SqliteIdempotencyStore::open(&path, IdempotencyPolicy::default())?;
    /// let mut conn = Connection::open(&path)?;
    /// conn.execute_batch("CREATE TABLE bookings (key TEXT PRIMARY KEY, seat TEXT)")?;
    ///
    /// let key = IdempotencyKey::new("trip-001:1:0")?;
    /// let now = Timestamp::from_millis(0);
    /// let Begin::Fresh { token } = keys.begin(&key, Digest::of(&json!({ "seat": "12A" })), now)? else {
    ///     unreachable!("a new key is fresh")
    /// };
    /// let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    /// tx.execute("INSERT INTO bookings VALUES (?1, '12A')", [key.as_str()])?; // the effect
    /// keys.finish_in(&tx, &key, token, &json!({ "booking": 1 }), now)?;      // its record
    /// tx.commit()?;                                                          // both, or neither
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`IdempotencyStore::finish`].
    pub fn finish_in(
        &self,
        tx: &rusqlite::Transaction<'_>,
        key: &IdempotencyKey,
        token: u64,
        result: &serde_json::Value,
        now: Timestamp,
    ) -> Result<(), Error> {
        in_savepoint(tx, |conn| finish_on(conn, key, token, result, now))
    }

    /// [`IdempotencyStore::abandon`] inside the caller's own transaction `tx`.
    ///
    /// # Errors
    ///
    /// As [`IdempotencyStore::abandon`].
    pub fn abandon_in(
        &self,
        tx: &rusqlite::Transaction<'_>,
        key: &IdempotencyKey,
        token: u64,
    ) -> Result<(), Error> {
        in_savepoint(tx, |conn| abandon_on(conn, key, token))
    }
}

impl IdempotencyStore for SqliteIdempotencyStore {
    fn policy(&self) -> &IdempotencyPolicy {
        &self.policy
    }

    fn begin(
        &mut self,
        key: &IdempotencyKey,
        digest: Digest,
        now: Timestamp,
    ) -> Result<Begin, Error> {
        let policy = self.policy;
        let tx = self.write()?;
        let answer = begin_on(&tx, &policy, key, digest, now)?;
        tx.commit().map_err(storage)?;
        Ok(answer)
    }

    fn finish(
        &mut self,
        key: &IdempotencyKey,
        token: u64,
        result: &serde_json::Value,
        now: Timestamp,
    ) -> Result<(), Error> {
        let tx = self.write()?;
        finish_on(&tx, key, token, result, now)?;
        tx.commit().map_err(storage)
    }

    fn abandon(&mut self, key: &IdempotencyKey, token: u64) -> Result<(), Error> {
        let tx = self.write()?;
        abandon_on(&tx, key, token)?;
        tx.commit().map_err(storage)
    }

    fn record(&self, key: &IdempotencyKey) -> Result<Option<IdempotencyRecord>, Error> {
        select(&self.conn, key)
    }

    fn purge(&mut self, now: Timestamp, batch: usize) -> Result<usize, Error> {
        miniflow_core::backend::check_purge_batch(batch)?;
        // A record expires when settled_at + retention <= now, i.e. settled_at <= now - retention.
        let Some(cutoff) = miniflow_core::purge_cutoff(now, self.policy.retention) else {
            return Ok(0);
        };
        let cutoff = to_sql_time("now", cutoff)?;
        self.conn
            .prepare_cached(
                "DELETE FROM idempotency WHERE key IN \
                 (SELECT key FROM idempotency WHERE settled_at <= ?1 LIMIT ?2 + 0)",
            )
            .and_then(|mut stmt| stmt.execute(params![cutoff, limit(batch)]))
            .map_err(storage)
    }
}
