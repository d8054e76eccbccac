//! When a failed command is tried again: exponential backoff with a cap and deterministic jitter.

use std::time::Duration;

use crate::error::Error;
use crate::id::CommandId;
use crate::time::{millis, Shown};

/// How failed deliveries are retried (DESIGN rule 9).
///
/// The delay before attempt `n + 1` is `initial_delay × multiplier^(n − 1)`, capped at `max_delay`, then
/// shortened by up to `jitter` (a fraction from 0 to 1) by an amount derived from the command ID and
/// the attempt, so every host computes the same delay and the delay never exceeds the cap.
///
/// The builders keep what they are given; [`RetryPolicy::validate`] refuses values out of bounds
/// (`initial_delay ≤ max_delay ≤` [`RetryPolicy::MAX_DELAY`], a finite `multiplier ≥ 1`, a `jitter`
/// from 0 to 1), and the dispatcher refuses to start with such a policy. The arithmetic never trusts
/// them either: a multiplier below 1 or NaN counts as 1, a jitter outside 0..=1 is clamped.
///
/// ```
/// use std::time::Duration;
/// use miniflow_core::{CommandId, RetryPolicy};
///
/// let policy = RetryPolicy::default()
///     .initial_delay(Duration::from_secs(1))
///     .multiplier(2.0)
///     .max_delay(Duration::from_secs(60))
///     .max_attempts(5)
///     .jitter(0.0);
/// let id: CommandId = "trip-001:1:0".parse()?;
/// assert_eq!(policy.backoff(&id, 1), Duration::from_secs(1));
/// assert_eq!(policy.backoff(&id, 3), Duration::from_secs(4));
/// assert_eq!(policy.backoff(&id, 30), Duration::from_secs(60));
/// # Ok::<(), miniflow_core::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    initial_delay: Duration,
    multiplier: f64,
    max_delay: Duration,
    max_attempts: u32,
    jitter: f64,
}

impl Default for RetryPolicy {
    /// 1 s, doubling, capped at 5 min, 10 attempts, up to 20 % jitter.
    fn default() -> Self {
        Self {
            initial_delay: Duration::from_secs(1),
            multiplier: 2.0,
            max_delay: Duration::from_secs(300),
            max_attempts: 10,
            jitter: 0.2,
        }
    }
}

impl RetryPolicy {
    /// The longest `max_delay` (and so `initial_delay`) [`RetryPolicy::validate`] accepts: 30 days. A
    /// longer pause between two attempts is no retry policy, and a receiver would have to keep its
    /// idempotency records for longer still (DESIGN rule 10).
    pub const MAX_DELAY: Duration = Duration::from_secs(30 * 24 * 60 * 60);

    /// The delay after the first failed attempt (0 to `max_delay`; 0 retries at once).
    #[must_use]
    pub fn initial_delay(mut self, delay: Duration) -> Self {
        self.initial_delay = delay;
        self
    }

    /// The growth of the delay per attempt: a finite number, at least 1 ([`RetryPolicy::validate`]
    /// refuses anything else; until then it counts as 1).
    #[must_use]
    pub fn multiplier(mut self, multiplier: f64) -> Self {
        self.multiplier = multiplier;
        self
    }

    /// The longest delay (`initial_delay` to [`RetryPolicy::MAX_DELAY`]).
    #[must_use]
    pub fn max_delay(mut self, delay: Duration) -> Self {
        self.max_delay = delay;
        self
    }

    /// How many deliveries a command gets before it is dead (at least 1).
    #[must_use]
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts.max(1);
        self
    }

    /// The largest fraction (0 to 1) by which a delay is shortened at random; 0 turns jitter off.
    /// [`RetryPolicy::validate`] refuses other values; until then they are clamped (NaN counts as 0).
    #[must_use]
    pub fn jitter(mut self, fraction: f64) -> Self {
        self.jitter = fraction;
        self
    }

    /// How many deliveries a command gets before it is dead.
    pub fn attempts_allowed(&self) -> u32 {
        self.max_attempts
    }

    /// Checks the policy for values no caller means.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] naming the field and its value when `initial_delay` or `max_delay` is
    /// longer than [`RetryPolicy::MAX_DELAY`] (30 days), `max_delay` is shorter than `initial_delay`, the
    /// multiplier is NaN, infinite or below 1, or the jitter is not a fraction from 0 to 1.
    pub fn validate(&self) -> Result<(), Error> {
        for (field, delay) in [
            ("retry_policy.initial_delay", self.initial_delay),
            ("retry_policy.max_delay", self.max_delay),
        ] {
            if delay > Self::MAX_DELAY {
                return Err(Error::invalid(
                    field,
                    Shown(delay).to_string(),
                    format!("must be at most {} (30 days)", Shown(Self::MAX_DELAY)),
                ));
            }
        }
        if self.max_delay < self.initial_delay {
            return Err(Error::invalid(
                "retry_policy.max_delay",
                Shown(self.max_delay).to_string(),
                format!(
                    "is shorter than initial_delay {}",
                    Shown(self.initial_delay)
                ),
            ));
        }
        if !(self.multiplier.is_finite() && self.multiplier >= 1.0) {
            return Err(Error::invalid(
                "retry_policy.multiplier",
                number_text(self.multiplier),
                "must be a finite number of at least 1",
            ));
        }
        if !(0.0..=1.0).contains(&self.jitter) {
            return Err(Error::invalid(
                "retry_policy.jitter",
                number_text(self.jitter),
                "must be a fraction from 0 to 1",
            ));
        }
        Ok(())
    }

    /// The multiplier as the arithmetic uses it: below 1, NaN or infinite counts as 1.
    fn growth(&self) -> f64 {
        if self.multiplier.is_finite() && self.multiplier >= 1.0 {
            self.multiplier
        } else {
            1.0
        }
    }

    /// The jitter as the arithmetic uses it: clamped to 0..=1, NaN counts as 0.
    fn jitter_fraction(&self) -> f64 {
        if self.jitter.is_nan() {
            0.0
        } else {
            self.jitter.clamp(0.0, 1.0)
        }
    }

    /// The delay before the next attempt after attempt number `attempt` (from 1) failed, without jitter.
    fn base_backoff(&self, attempt: u32) -> Duration {
        let cap = millis(self.max_delay) as f64;
        let mut delay = millis(self.initial_delay) as f64;
        for _ in 1..attempt {
            if delay >= cap {
                break;
            }
            delay *= self.growth();
        }
        Duration::from_millis(delay.min(cap) as u64)
    }

    /// The delay before the next attempt after attempt number `attempt` (from 1) of `command_id` failed.
    /// Deterministic: the same command and attempt give the same delay on every host.
    pub fn backoff(&self, command_id: &CommandId, attempt: u32) -> Duration {
        let base = millis(self.base_backoff(attempt));
        let unit = jitter_unit(command_id, attempt);
        let cut = (base as f64 * self.jitter_fraction() * unit) as u64;
        Duration::from_millis(base - cut.min(base))
    }

    /// The longest time from a command's first claim to its becoming dead, when every attempt holds its
    /// lease for the full `lease_ttl` and waits the longest backoff. A receiver must keep its idempotency
    /// records at least this long (plus a margin for retries by hand).
    pub fn horizon(&self, lease_ttl: Duration) -> Duration {
        let leases = lease_ttl.saturating_mul(self.max_attempts);
        (1..self.max_attempts)
            .map(|attempt| self.base_backoff(attempt))
            .fold(leases, Duration::saturating_add)
    }
}

/// A number in `[0, 1)` derived from `(command_id, attempt)` by FNV-1a, the same on every host.
fn jitter_unit(command_id: &CommandId, attempt: u32) -> f64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let id = command_id.to_string();
    for byte in id.bytes().chain(attempt.to_le_bytes()) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    (hash >> 11) as f64 / (1u64 << 53) as f64
}

/// `number` as JSON writes it (`1.5`, `0.25`), or `NaN`, `inf`, `-inf`: without `core::fmt`'s float
/// formatting, which the WebAssembly build leaves out (it is a tenth of the module).
pub(crate) fn number_text(number: f64) -> String {
    match serde_json::Number::from_f64(number) {
        Some(number) => number.to_string(),
        None if number.is_nan() => "NaN".to_owned(),
        None if number > 0.0 => "inf".to_owned(),
        None => "-inf".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(text: &str) -> CommandId {
        text.parse().unwrap()
    }

    #[test]
    fn jitter_only_shortens_and_is_deterministic() {
        let policy = RetryPolicy::default()
            .initial_delay(Duration::from_millis(100))
            .max_delay(Duration::from_secs(10))
            .jitter(0.5);
        for attempt in 1..20 {
            let d = policy.backoff(&id("w:1:0"), attempt);
            assert_eq!(d, policy.backoff(&id("w:1:0"), attempt));
            assert!(d <= policy.base_backoff(attempt));
            assert!(d >= policy.base_backoff(attempt) / 2);
            assert!(d <= Duration::from_secs(10));
        }
        let spread: std::collections::BTreeSet<_> = (0..50)
            .map(|i| policy.backoff(&id(&format!("w:1:{i}")), 3))
            .collect();
        assert!(
            spread.len() > 10,
            "jitter should vary by command: {spread:?}"
        );
    }

    #[test]
    fn horizon_adds_every_lease_and_backoff() {
        let policy = RetryPolicy::default()
            .initial_delay(Duration::from_secs(1))
            .multiplier(2.0)
            .max_delay(Duration::from_secs(5))
            .max_attempts(4)
            .jitter(0.3);
        // leases 4 × 10 s, backoffs after attempts 1..3: 1 + 2 + 4 s.
        assert_eq!(
            policy.horizon(Duration::from_secs(10)),
            Duration::from_secs(47)
        );
    }

    #[test]
    fn silly_values_are_tamed() {
        let p = RetryPolicy::default()
            .multiplier(f64::NAN)
            .jitter(7.0)
            .max_attempts(0);
        assert_eq!(p.attempts_allowed(), 1);
        assert!(p.backoff(&id("w:1:0"), 1) <= p.base_backoff(1));
        assert_eq!(p.base_backoff(5), p.base_backoff(1), "NaN grows like 1");
        let shrinking = RetryPolicy::default().multiplier(0.5).jitter(f64::NAN);
        assert_eq!(shrinking.backoff(&id("w:1:0"), 4), Duration::from_secs(1));
        let bad = RetryPolicy::default()
            .initial_delay(Duration::from_secs(10))
            .max_delay(Duration::from_secs(1));
        assert!(bad
            .validate()
            .unwrap_err()
            .to_string()
            .contains("initial_delay"));
    }

    /// The field `validate` names for `policy`, or `None` when it passes.
    fn refused_field(policy: &RetryPolicy) -> Option<&'static str> {
        match policy.validate() {
            Ok(()) => None,
            Err(Error::InvalidInput { field, .. }) => Some(field),
            Err(other) => panic!("not InvalidInput: {other}"),
        }
    }

    #[test]
    fn validate_refuses_delays_multipliers_and_jitter_out_of_bounds() {
        let ok = RetryPolicy::default();
        assert_eq!(refused_field(&ok), None);
        assert_eq!(
            refused_field(&ok.clone().initial_delay(Duration::ZERO)),
            None
        );
        let longest = ok
            .clone()
            .initial_delay(RetryPolicy::MAX_DELAY)
            .max_delay(RetryPolicy::MAX_DELAY)
            .multiplier(1.0)
            .jitter(1.0);
        assert_eq!(refused_field(&longest), None);
        let cases = [
            (
                ok.clone().max_delay(Duration::MAX),
                "retry_policy.max_delay",
            ),
            (
                ok.clone()
                    .max_delay(RetryPolicy::MAX_DELAY + Duration::from_millis(1)),
                "retry_policy.max_delay",
            ),
            (
                ok.clone().initial_delay(Duration::MAX),
                "retry_policy.initial_delay",
            ),
            (ok.clone().multiplier(0.5), "retry_policy.multiplier"),
            (ok.clone().multiplier(-2.0), "retry_policy.multiplier"),
            (ok.clone().multiplier(f64::NAN), "retry_policy.multiplier"),
            (
                ok.clone().multiplier(f64::INFINITY),
                "retry_policy.multiplier",
            ),
            (ok.clone().jitter(1.5), "retry_policy.jitter"),
            (ok.clone().jitter(-0.1), "retry_policy.jitter"),
            (ok.clone().jitter(f64::NAN), "retry_policy.jitter"),
        ];
        for (policy, field) in cases {
            assert_eq!(refused_field(&policy), Some(field), "{policy:?}");
        }
        let message = ok.multiplier(0.5).validate().unwrap_err().to_string();
        assert!(message.contains("0.5"), "names the value: {message}");
    }
}
