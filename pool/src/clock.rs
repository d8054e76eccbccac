//! The host's real clock.

use std::time::{SystemTime, UNIX_EPOCH};

use miniflow_core::{Clock, Timestamp};

/// The system's wall clock, in milliseconds since the Unix epoch.
///
/// ```
/// use miniflow_core::Clock;
/// use miniflow_pool::SystemClock;
///
/// assert!(SystemClock.now().as_millis() > 1_600_000_000_000);
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        let since_epoch = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        Timestamp::from_millis(u64::try_from(since_epoch.as_millis()).unwrap_or(u64::MAX))
    }
}
