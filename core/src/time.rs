//! Time as an input. The core never reads a clock: hosts pass `now` in.

use std::fmt::{self, Write};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// A point in time: milliseconds since the Unix epoch, as given by the host's clock.
///
/// ```
/// use std::time::Duration;
/// use miniflow_core::Timestamp;
///
/// let now = Timestamp::from_millis(1_000);
/// assert_eq!(now + Duration::from_secs(2), Timestamp::from_millis(3_000));
/// ```
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Timestamp(u64);

impl Timestamp {
    /// The Unix epoch.
    pub const EPOCH: Timestamp = Timestamp(0);

    /// `millis` milliseconds after the Unix epoch.
    pub const fn from_millis(millis: u64) -> Self {
        Self(millis)
    }

    /// Milliseconds since the Unix epoch.
    pub const fn as_millis(self) -> u64 {
        self.0
    }

    /// This time minus `d`, or `None` before the epoch: "everything settled at or before this" for a
    /// retention period `d` (nothing is old enough when `None`).
    pub fn checked_sub(self, d: Duration) -> Option<Timestamp> {
        self.0.checked_sub(millis(d)).map(Timestamp)
    }

    /// How long after `earlier` this is (zero when it is not after it).
    pub fn saturating_since(self, earlier: Timestamp) -> Duration {
        Duration::from_millis(self.0.saturating_sub(earlier.0))
    }
}

/// Whole milliseconds of `d`, saturating.
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A duration as whole milliseconds in JSON (`#[serde(with = "crate::time::duration_millis")]`).
pub(crate) mod duration_millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(super::millis(*d))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_millis)
    }
}

impl std::ops::Add<Duration> for Timestamp {
    type Output = Timestamp;

    /// Saturating: a time past the end of `u64` milliseconds stays at the end.
    fn add(self, rhs: Duration) -> Timestamp {
        Timestamp(self.0.saturating_add(millis(rhs)))
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}ms", self.0)
    }
}

/// A source of `now`, for hosts and tests. The core itself never calls one.
pub trait Clock {
    /// The current time.
    fn now(&self) -> Timestamp;
}

/// A clock that moves only when told to: for tests and simulations.
///
/// ```
/// use std::time::Duration;
/// use miniflow_core::{Clock, ManualClock, Timestamp};
///
/// let clock = ManualClock::new(Timestamp::from_millis(5));
/// clock.advance(Duration::from_millis(10));
/// assert_eq!(clock.now(), Timestamp::from_millis(15));
/// ```
#[derive(Debug, Default)]
pub struct ManualClock(std::sync::atomic::AtomicU64);

impl ManualClock {
    /// A clock standing at `start`.
    pub fn new(start: Timestamp) -> Self {
        Self(std::sync::atomic::AtomicU64::new(start.0))
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        let by = millis(by);
        let _ = self.0.fetch_update(
            std::sync::atomic::Ordering::SeqCst,
            std::sync::atomic::Ordering::SeqCst,
            |t| Some(t.saturating_add(by)),
        );
    }

    /// Sets the clock to `to`.
    pub fn set(&self, to: Timestamp) {
        self.0.store(to.0, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.0.load(std::sync::atomic::Ordering::SeqCst))
    }
}

/// A duration in messages, written exactly as its `Debug` does (`100ms`, `1.5s`, `86400s`: the
/// largest unit under the whole duration, then every significant digit), without the decimal
/// routine of `Debug`, which the WebAssembly module would otherwise carry for these messages alone.
pub(crate) struct Shown(pub(crate) Duration);

impl fmt::Display for Shown {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (secs, nanos) = (self.0.as_secs(), self.0.subsec_nanos());
        let (whole, fraction, digits, unit) = if secs > 0 {
            (secs, nanos, 9, "s")
        } else if nanos >= 1_000_000 {
            (u64::from(nanos / 1_000_000), nanos % 1_000_000, 6, "ms")
        } else if nanos >= 1_000 {
            (u64::from(nanos / 1_000), nanos % 1_000, 3, "µs")
        } else {
            (u64::from(nanos), 0, 0, "ns")
        };
        write!(f, "{whole}")?;
        if fraction > 0 {
            let mut text = [b'0'; 9];
            let mut rest = fraction;
            for digit in text[..digits].iter_mut().rev() {
                *digit = b'0' + (rest % 10) as u8;
                rest /= 10;
            }
            let end = text.iter().rposition(|&d| d != b'0').map_or(0, |i| i + 1);
            f.write_str(".")?;
            for &digit in &text[..end] {
                f.write_char(char::from(digit))?;
            }
        }
        f.write_str(unit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_shown_as_debug_shows_them() {
        let mut durations = vec![
            Duration::ZERO,
            Duration::from_nanos(1),
            Duration::from_nanos(999),
            Duration::from_nanos(1_000),
            Duration::from_nanos(1_500),
            Duration::from_nanos(999_999),
            Duration::from_millis(1),
            Duration::from_nanos(1_000_001),
            Duration::from_millis(100),
            Duration::from_millis(1_500),
            Duration::new(1, 1),
            Duration::from_secs(86_400),
            Duration::from_secs(30 * 86_400),
            Duration::new(u64::MAX, 999_999_999),
        ];
        let mut rng = fastrand::Rng::with_seed(7);
        for _ in 0..10_000 {
            let secs = [0, 1, rng.u64(..100_000), rng.u64(..)][rng.usize(..4)];
            let nanos = [
                0,
                rng.u32(..1_000),
                rng.u32(..1_000_000),
                rng.u32(..1_000_000_000),
            ][rng.usize(..4)];
            durations.push(Duration::new(secs, nanos));
            durations.push(Duration::from_millis(rng.u64(..100_000_000)));
        }
        for duration in durations {
            assert_eq!(Shown(duration).to_string(), format!("{duration:?}"));
        }
    }
}
