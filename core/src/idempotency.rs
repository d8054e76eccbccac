//! The receiver's side: fold repeated deliveries of one operation into one effect (DESIGN rule 10).
//!
//! A receiver calls [`IdempotencyStore::begin`] with the request's idempotency key (a command ID) and a
//! [`Digest`] of the fields that define the business intent, before it does the effect:
//!
//! | answer | meaning | what the receiver does |
//! |---|---|---|
//! | [`Begin::Fresh`] | first time (or a stale reservation taken over) | do the effect, then `finish` with the reservation token (or `abandon` if it did not happen) |
//! | [`Begin::Completed`] | done before with the same parameters | return the stored result, no new effect |
//! | [`Begin::Conflict`] | the key came back with other parameters | refuse (HTTP 422): the caller has a bug |
//! | [`Begin::InProgress`] | another caller holds the key right now | refuse for now (HTTP 409); the caller retries |
//!
//! A `Fresh` answer carries a **reservation token**. `finish` and `abandon` need it: once a reservation
//! timed out and another caller took the key over, the first holder's token is stale and its `finish` or
//! `abandon` changes nothing ([`Error::StaleReservation`]). Tokens of a key only grow, also across
//! abandoned reservations, so a stale token never becomes current again (DESIGN rule 14).
//!
//! Fencing protects the *record*, not the *effect*: a holder that is merely slow past its reservation
//! timeout lets a second holder in, and both may act. A receiver that commits its effect in the same
//! transaction as `finish`, under the token check, is at most once in every interleaving; any other
//! receiver must keep [`IdempotencyPolicy::reservation_timeout`] above its slowest effect.
//!
//! The rules are stated once, in [`IdempotencyRecord::begin`], [`IdempotencyRecord::finish`] and
//! [`IdempotencyRecord::abandon`]; stores only load and write records.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest as _, Sha256};

use crate::error::Error;
use crate::model::canonical_json;
use crate::retry::RetryPolicy;
use crate::time::{Shown, Timestamp};

/// The identity of one business operation at a receiver, e.g. a miniflow command ID.
///
/// 1 to [`IdempotencyKey::MAX_LEN`] bytes of UTF-8 without control characters.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    /// The longest key, in bytes.
    pub const MAX_LEN: usize = 255;

    /// Checks and wraps `key`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] naming the key when it is empty, too long or has a control character.
    pub fn new(key: impl Into<String>) -> Result<Self, Error> {
        let key = key.into();
        let reason = if key.is_empty() {
            Some("must not be empty".to_owned())
        } else if key.len() > Self::MAX_LEN {
            Some(format!(
                "is {} bytes, the limit is {}",
                key.len(),
                Self::MAX_LEN
            ))
        } else if key.chars().any(char::is_control) {
            Some("has a control character".to_owned())
        } else {
            None
        };
        match reason {
            Some(reason) => Err(Error::invalid("idempotency_key", &key, reason)),
            None => Ok(Self(key)),
        }
    }

    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<String> for IdempotencyKey {
    type Error = Error;

    fn try_from(key: String) -> Result<Self, Error> {
        Self::new(key)
    }
}

impl From<IdempotencyKey> for String {
    fn from(key: IdempotencyKey) -> String {
        key.0
    }
}

impl From<&crate::CommandId> for IdempotencyKey {
    fn from(id: &crate::CommandId) -> Self {
        // A command ID is at most 128 + 1 + 16 + 1 + 10 bytes with no control characters.
        Self(id.to_string())
    }
}

/// SHA-256 of the canonical JSON of a request's business intent.
///
/// ```
/// use miniflow_core::{json, Digest};
///
/// let intent = ["traveller", "flight"];
/// let first = json!({ "traveller": "Li Lei", "flight": "CA1405", "sent_at": "09:00:01", "trace_id": "a1" });
/// let retry = json!({ "flight": "CA1405", "traveller": "Li Lei", "sent_at": "09:00:07", "trace_id": "b2" });
/// let other = json!({ "traveller": "Han Meimei", "flight": "CA1405" });
/// assert_eq!(Digest::of_intent(&first, &intent), Digest::of_intent(&retry, &intent));
/// assert_ne!(Digest::of_intent(&first, &intent), Digest::of_intent(&other, &intent));
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Digest([u8; 32]);

impl Digest {
    /// The digest of a whole JSON value (its canonical text).
    pub fn of(value: &Value) -> Self {
        Self(Sha256::digest(canonical_json(value).as_bytes()).into())
    }

    /// The digest of the `fields` of `request` that define its business intent; timestamps, trace IDs
    /// and other fields left out do not change it. A field is a top-level key, or a JSON Pointer when
    /// it starts with `/` (e.g. `/traveller/passport`). A missing field counts as `null`.
    pub fn of_intent(request: &Value, fields: &[&str]) -> Self {
        // Written as the canonical text of `{ field: value, … }` without copying the values, so a
        // field of any depth is hashed without recursion.
        let null = Value::Null;
        // Sorted by name, each name once (the same name names the same value).
        let mut intent: Vec<(&str, &Value)> = Vec::with_capacity(fields.len());
        for field in fields {
            if let Err(at) = intent.binary_search_by(|(name, _)| (*name).cmp(field)) {
                let value = if field.starts_with('/') {
                    request.pointer(field)
                } else {
                    request.get(field)
                };
                intent.insert(at, (field, value.unwrap_or(&null)));
            }
        }
        let mut text = String::from("{");
        for (i, (field, value)) in intent.into_iter().enumerate() {
            if i > 0 {
                text.push(',');
            }
            crate::model::write_json(field, &mut text);
            text.push(':');
            text.push_str(&canonical_json(value));
        }
        text.push('}');
        Self(Sha256::digest(text.as_bytes()).into())
    }

    /// The raw 32 bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// From raw bytes.
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest({self})")
    }
}

impl FromStr for Digest {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        let invalid = || Error::invalid("digest", s, "expected 64 hexadecimal digits");
        if s.len() != 64 || !s.is_ascii() {
            return Err(invalid());
        }
        let mut bytes = [0u8; 32];
        for (i, byte) in bytes.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|_| invalid())?;
        }
        Ok(Self(bytes))
    }
}

impl TryFrom<String> for Digest {
    type Error = Error;

    fn try_from(s: String) -> Result<Self, Error> {
        s.parse()
    }
}

impl From<Digest> for String {
    fn from(d: Digest) -> String {
        d.to_string()
    }
}

/// The answer of [`IdempotencyStore::begin`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Begin {
    /// Reserved for this caller: do the effect, then `finish` (or `abandon`) with `token`.
    Fresh {
        /// The reservation token: pass it to `finish` or `abandon`. A later holder of the key gets a
        /// greater one, which makes this one stale.
        token: u64,
    },
    /// Done before with the same parameters: here is the stored result. Do not repeat the effect.
    Completed {
        /// The result stored by `finish`.
        result: Value,
    },
    /// The key came back with other parameters: a caller bug. Never reuse the old result.
    Conflict {
        /// The key.
        key: IdempotencyKey,
        /// The digest stored with the key.
        stored_digest: Digest,
        /// The digest of this request.
        new_digest: Digest,
    },
    /// Another caller holds the key and may still be doing the effect.
    InProgress {
        /// When that caller reserved it.
        since: Timestamp,
    },
}

/// How long a receiver remembers keys, and when a reservation counts as abandoned.
///
/// Stores check it when they are built ([`IdempotencyPolicy::validate`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdempotencyPolicy {
    /// How long a record is kept (from its completion, or from its reservation if never finished).
    /// It must cover the producer's retry horizon (see [`check_retention`]) and be at least the
    /// reservation timeout.
    pub retention: Duration,
    /// How long a reservation blocks others; after it, another caller may take the key over (the first
    /// caller is presumed dead) and the first caller's token becomes stale.
    ///
    /// **Keep it above the slowest effect.** Fencing protects the record, not the effect: a holder that
    /// is still working when its reservation times out lets a second holder in, and both may act. Only a
    /// receiver that commits its effect in the same transaction as `finish`, under the token check, is
    /// at most once whatever the timing.
    pub reservation_timeout: Duration,
}

impl IdempotencyPolicy {
    /// Checks the policy: both durations longer than zero and at most 100 years, and the retention at
    /// least the reservation timeout (a record must not be forgotten while its reservation still holds).
    ///
    /// ```
    /// use std::time::Duration;
    /// use miniflow_core::IdempotencyPolicy;
    ///
    /// let policy = IdempotencyPolicy { retention: Duration::from_secs(10), reservation_timeout: Duration::from_secs(60) };
    /// let err = policy.validate().unwrap_err();
    /// assert!(err.to_string().contains("10s") && err.to_string().contains("60s"));
    /// assert!(IdempotencyPolicy::default().validate().is_ok());
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] naming the field and both durations.
    pub fn validate(&self) -> Result<(), Error> {
        const MAX: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
        for (field, value) in [
            ("retention", self.retention),
            ("reservation_timeout", self.reservation_timeout),
        ] {
            if value.is_zero() || value > MAX {
                return Err(Error::invalid(
                    field,
                    Shown(value).to_string(),
                    format!("must be longer than zero and at most {}", Shown(MAX)),
                ));
            }
        }
        if self.retention < self.reservation_timeout {
            return Err(Error::invalid(
                "retention",
                Shown(self.retention).to_string(),
                format!(
                    "is shorter than the reservation timeout {}: a reservation would be forgotten \
                     while it still holds, and a second caller would repeat the effect",
                    Shown(self.reservation_timeout)
                ),
            ));
        }
        Ok(())
    }
}

impl Default for IdempotencyPolicy {
    /// 7 days of retention, 60 s reservations.
    fn default() -> Self {
        Self {
            retention: Duration::from_secs(7 * 24 * 3600),
            reservation_timeout: Duration::from_secs(60),
        }
    }
}

/// Whether a key is reserved, completed or abandoned.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum RecordState {
    /// A caller is doing the effect.
    Reserved,
    /// The holder released the key without an effect; the next `begin` is fresh. The record stays, so
    /// its token keeps counting up.
    Abandoned,
    /// The effect is done; `result` is what every repeat gets.
    Completed {
        /// The stored result.
        result: Value,
        /// When it was finished.
        completed_at: Timestamp,
    },
}

/// What a receiver remembers of one key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IdempotencyRecord {
    /// The key.
    pub key: IdempotencyKey,
    /// The digest of the first request's intent.
    pub digest: Digest,
    /// When the current reservation was made.
    pub reserved_at: Timestamp,
    /// The token of the current (or last) reservation; only the holder of this token may finish or
    /// abandon it.
    pub token: u64,
    /// Reserved, completed or abandoned.
    #[serde(flatten)]
    pub state: RecordState,
}

impl IdempotencyRecord {
    /// When the record may be forgotten: `retention` after its completion (or its reservation).
    pub fn expires_at(&self, policy: &IdempotencyPolicy) -> Timestamp {
        match &self.state {
            RecordState::Completed { completed_at, .. } => *completed_at + policy.retention,
            RecordState::Reserved | RecordState::Abandoned => self.reserved_at + policy.retention,
        }
    }

    /// The next reservation token after `previous` at `now`: greater than every earlier token of the
    /// key, and at least `now` in milliseconds, so that a key whose record was purged (and a stale
    /// holder from before it) still never sees a token come back.
    fn next_token(previous: Option<&IdempotencyRecord>, now: Timestamp) -> u64 {
        let after = previous.map_or(0, |r| r.token).saturating_add(1);
        after.max(now.as_millis())
    }

    /// The rule of `begin`: the answer for a request with `digest` at `now` given the `existing` record,
    /// and the record to write, if any.
    pub fn begin(
        existing: Option<&IdempotencyRecord>,
        key: &IdempotencyKey,
        digest: Digest,
        policy: &IdempotencyPolicy,
        now: Timestamp,
    ) -> (Begin, Option<IdempotencyRecord>) {
        let reserve = || {
            let token = Self::next_token(existing, now);
            let record = IdempotencyRecord {
                key: key.clone(),
                digest,
                reserved_at: now,
                token,
                state: RecordState::Reserved,
            };
            (Begin::Fresh { token }, Some(record))
        };
        let Some(record) = existing
            .filter(|r| r.expires_at(policy) > now && !matches!(r.state, RecordState::Abandoned))
        else {
            return reserve();
        };
        if record.digest != digest {
            let conflict = Begin::Conflict {
                key: key.clone(),
                stored_digest: record.digest,
                new_digest: digest,
            };
            return (conflict, None);
        }
        match &record.state {
            RecordState::Completed { result, .. } => (
                Begin::Completed {
                    result: result.clone(),
                },
                None,
            ),
            RecordState::Reserved if record.reserved_at + policy.reservation_timeout <= now => {
                reserve()
            }
            RecordState::Reserved | RecordState::Abandoned => (
                Begin::InProgress {
                    since: record.reserved_at,
                },
                None,
            ),
        }
    }

    /// Checks that `token` holds the current reservation.
    ///
    /// # Errors
    ///
    /// [`Error::StaleReservation`] when another caller took the key over, or the reservation was
    /// finished or abandoned.
    pub fn check_reservation(&self, token: u64) -> Result<(), Error> {
        if self.state == RecordState::Reserved && self.token == token {
            return Ok(());
        }
        let current = match &self.state {
            RecordState::Reserved => format!("reserved with token {}", self.token),
            RecordState::Completed { .. } => format!("finished under token {}", self.token),
            RecordState::Abandoned => format!("abandoned under token {}", self.token),
        };
        Err(Error::StaleReservation {
            key: self.key.to_string(),
            token,
            current,
        })
    }

    /// The rule of `finish`: the reservation of `token` becomes completed with `result`.
    ///
    /// # Errors
    ///
    /// [`Error::StaleReservation`] when `token` is not the current reservation (nothing changes);
    /// [`Error::InvalidInput`] for a result over the JSON limits.
    pub fn finish(&mut self, token: u64, result: Value, now: Timestamp) -> Result<(), Error> {
        self.check_reservation(token)?;
        crate::limits::check_json("result", &result)?;
        self.state = RecordState::Completed {
            result,
            completed_at: now,
        };
        Ok(())
    }

    /// The rule of `abandon`: the reservation of `token` is released without an effect; the next
    /// `begin` is fresh (with a greater token).
    ///
    /// # Errors
    ///
    /// [`Error::StaleReservation`] when `token` is not the current reservation (nothing changes).
    pub fn abandon(&mut self, token: u64) -> Result<(), Error> {
        self.check_reservation(token)?;
        self.state = RecordState::Abandoned;
        Ok(())
    }
}

/// A receiver's memory of idempotency keys (DESIGN rule 10).
pub trait IdempotencyStore {
    /// The policy the store was opened with.
    fn policy(&self) -> &IdempotencyPolicy;

    /// Answers a request for `key` with `digest` at `now` (see the module docs), atomically: of two
    /// callers beginning the same key at once, one gets `Fresh` (with a reservation token) and the other
    /// `InProgress`.
    fn begin(
        &mut self,
        key: &IdempotencyKey,
        digest: Digest,
        now: Timestamp,
    ) -> Result<Begin, Error>;

    /// Stores the effect's `result` under the reservation `token` of `begin`; repeats of the key get
    /// it back.
    ///
    /// # Errors
    ///
    /// [`Error::UnknownKey`] when the key was never reserved; [`Error::StaleReservation`] when `token`
    /// is not the current reservation (taken over, finished or abandoned) — nothing changes;
    /// [`Error::InvalidInput`] for a result over the JSON limits.
    fn finish(
        &mut self,
        key: &IdempotencyKey,
        token: u64,
        result: &Value,
        now: Timestamp,
    ) -> Result<(), Error>;

    /// Releases the reservation `token` of a key whose effect did not happen: the next `begin` is
    /// fresh. Harmless for an unknown key (e.g. one already purged).
    ///
    /// # Errors
    ///
    /// [`Error::StaleReservation`] when `token` is not the current reservation — nothing changes.
    fn abandon(&mut self, key: &IdempotencyKey, token: u64) -> Result<(), Error>;

    /// The record of `key`, if remembered (expired records may still be here until purged).
    fn record(&self, key: &IdempotencyKey) -> Result<Option<IdempotencyRecord>, Error>;

    /// Forgets up to `batch` records whose retention ended at or before `now`; returns how many.
    /// Call it until it returns less than `batch`: each call is one short write.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a `batch` of 0 ([`crate::backend::check_purge_batch`]); the store's errors.
    fn purge(&mut self, now: Timestamp, batch: usize) -> Result<usize, Error>;
}

/// Checks that a receiver keeping records for `retention` outlives every retry of a producer with
/// `policy` and `lease_ttl`, plus `margin` for retries by hand.
///
/// The horizon counts leases and backoffs from a command's first delivery; it cannot know how long a
/// due command waits for a free worker. `margin` must also cover the longest backlog or worker outage
/// you plan for: a command delivered, then redelivered after the receiver forgot its key, repeats its
/// effect (the deterministic simulation in `tests/it/simulation.rs` shows it under a backlog).
///
/// ```
/// use std::time::Duration;
/// use miniflow_core::{check_retention, RetryPolicy};
///
/// let policy = RetryPolicy::default().max_attempts(10).max_delay(Duration::from_secs(3600));
/// let day = Duration::from_secs(24 * 3600);
/// assert!(check_retention(7 * day, &policy, Duration::from_secs(30), day).is_ok());
/// let err = check_retention(Duration::from_secs(3600), &policy, Duration::from_secs(30), day).unwrap_err();
/// assert!(err.to_string().contains("3600s"));
/// ```
///
/// # Errors
///
/// [`Error::RetentionTooShort`] naming both durations.
pub fn check_retention(
    retention: Duration,
    policy: &RetryPolicy,
    lease_ttl: Duration,
    margin: Duration,
) -> Result<(), Error> {
    let required = policy.horizon(lease_ttl).saturating_add(margin);
    if retention < required {
        return Err(Error::RetentionTooShort {
            retention,
            required,
        });
    }
    Ok(())
}

/// An in-memory [`IdempotencyStore`].
#[derive(Debug, Clone, Default)]
pub struct MemoryIdempotencyStore {
    policy: IdempotencyPolicy,
    records: std::collections::BTreeMap<IdempotencyKey, IdempotencyRecord>,
}

impl MemoryIdempotencyStore {
    /// An empty store with `policy`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] when the policy is out of bounds (see [`IdempotencyPolicy::validate`]).
    pub fn new(policy: IdempotencyPolicy) -> Result<Self, Error> {
        policy.validate()?;
        Ok(Self {
            policy,
            records: Default::default(),
        })
    }
}

impl IdempotencyStore for MemoryIdempotencyStore {
    fn policy(&self) -> &IdempotencyPolicy {
        &self.policy
    }

    fn begin(
        &mut self,
        key: &IdempotencyKey,
        digest: Digest,
        now: Timestamp,
    ) -> Result<Begin, Error> {
        let (answer, write) =
            IdempotencyRecord::begin(self.records.get(key), key, digest, &self.policy, now);
        if let Some(record) = write {
            self.records.insert(key.clone(), record);
        }
        Ok(answer)
    }

    fn finish(
        &mut self,
        key: &IdempotencyKey,
        token: u64,
        result: &Value,
        now: Timestamp,
    ) -> Result<(), Error> {
        let record = self.records.get_mut(key).ok_or_else(|| Error::UnknownKey {
            key: key.to_string(),
        })?;
        record.finish(token, result.clone(), now)
    }

    fn abandon(&mut self, key: &IdempotencyKey, token: u64) -> Result<(), Error> {
        match self.records.get_mut(key) {
            Some(record) => record.abandon(token),
            None => Ok(()),
        }
    }

    fn record(&self, key: &IdempotencyKey) -> Result<Option<IdempotencyRecord>, Error> {
        Ok(self.records.get(key).cloned())
    }

    fn purge(&mut self, now: Timestamp, batch: usize) -> Result<usize, Error> {
        crate::backend::check_purge_batch(batch)?;
        let expired: Vec<IdempotencyKey> = self
            .records
            .values()
            .filter(|r| r.expires_at(&self.policy) <= now)
            .take(batch)
            .map(|r| r.key.clone())
            .collect();
        for key in &expired {
            self.records.remove(key);
        }
        Ok(expired.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retention_shorter_than_the_horizon_is_refused_naming_both_durations() {
        let policy = RetryPolicy::default()
            .initial_delay(Duration::from_secs(1))
            .multiplier(2.0)
            .max_delay(Duration::from_secs(8))
            .max_attempts(5);
        let ttl = Duration::from_secs(10);
        // 5 leases of 10 s + backoffs 1 + 2 + 4 + 8 s = 65 s, plus a 35 s margin = 100 s.
        let margin = Duration::from_secs(35);
        assert!(check_retention(Duration::from_secs(100), &policy, ttl, margin).is_ok());
        match check_retention(Duration::from_secs(99), &policy, ttl, margin) {
            Err(e @ Error::RetentionTooShort { .. }) => {
                let text = e.to_string();
                assert!(text.contains("99s") && text.contains("100s"), "{text}");
                assert_eq!(e.code(), "RETENTION_TOO_SHORT");
            }
            other => panic!("expected RetentionTooShort, got {other:?}"),
        }
    }

    #[test]
    fn digests_print_and_parse_as_hex_and_ignore_key_order() {
        let a = Digest::of(&serde_json::json!({ "a": 1, "b": [true] }));
        let b = Digest::of(&serde_json::json!({ "b": [true], "a": 1 }));
        assert_eq!(a, b);
        assert_eq!(a.to_string().len(), 64);
        assert_eq!(a.to_string().parse::<Digest>().unwrap(), a);
        assert!("xyz".parse::<Digest>().is_err());
        // SHA-256 of the canonical text `{}`.
        assert_eq!(
            Digest::of(&serde_json::json!({})).to_string(),
            "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
        );
    }

    #[test]
    fn intent_fields_may_be_json_pointers_and_missing_fields_are_null() {
        let request = serde_json::json!({ "traveller": { "passport": "E1" }, "flight": "CA1" });
        let by_pointer = Digest::of_intent(&request, &["/traveller/passport", "flight"]);
        let other = serde_json::json!({ "traveller": { "passport": "E2" }, "flight": "CA1" });
        assert_ne!(
            by_pointer,
            Digest::of_intent(&other, &["/traveller/passport", "flight"])
        );
        assert_eq!(
            Digest::of_intent(&request, &["missing"]),
            Digest::of_intent(&serde_json::json!({ "missing": null }), &["missing"])
        );
    }

    #[test]
    fn keys_are_checked() {
        assert!(IdempotencyKey::new("").is_err());
        assert!(IdempotencyKey::new("a\r\nInjected: header").is_err());
        assert!(IdempotencyKey::new("k".repeat(256)).is_err());
        assert!(IdempotencyKey::new("成都-7:1:0").is_ok());
    }
}
