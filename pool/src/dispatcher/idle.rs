//! What an idle worker waits on: a store's signal that a commit made work, or its poll interval.

use super::*;

/// Tells idle workers that work may have arrived, so that they need not sleep through their poll
/// interval: for store authors, whose store knows when one of its commits made commands or timers
/// claimable (SQLite's writer thread, PostgreSQL's `LISTEN`). Polling stays the fallback: a wake-up
/// is a hint, and a worker that misses one finds the work at its next poll.
///
/// ```
/// use std::sync::atomic::AtomicBool;
/// use std::time::Duration;
/// use miniflow_pool::Wakeup;
///
/// /// Never wakes anyone early: workers poll.
/// struct Polling;
///
/// impl Wakeup for Polling {
///     fn mark(&self) -> u64 {
///         0
///     }
///     fn wait(&self, _mark: u64, timeout: Duration, _stop: &AtomicBool) {
///         std::thread::sleep(timeout.min(Duration::from_millis(5)));
///     }
/// }
/// # Polling.wait(Polling.mark(), Duration::from_millis(1), &AtomicBool::new(false));
/// ```
pub trait Wakeup: Send + Sync {
    /// A mark of the work seen so far, taken before a claim.
    fn mark(&self) -> u64;
    /// Waits until work arrived after `mark`, `timeout` passed, or `stop` was set (look at it
    /// every few milliseconds). Returning early is harmless: the worker claims, and waits again.
    fn wait(&self, mark: u64, timeout: Duration, stop: &AtomicBool);
}
