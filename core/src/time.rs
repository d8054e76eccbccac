//! Time as an input. The core never reads a clock: hosts pass `now` in.

use std::fmt;
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
