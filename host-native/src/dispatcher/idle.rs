//! What an idle worker waits on: the writer's signal that a commit made work, or its poll interval.

use super::*;

use crate::Writer;

/// Tells idle workers that work may have arrived, so that they need not sleep through their poll
/// interval.
pub(super) trait Idle: Send + Sync {
    /// A mark of the work seen so far, taken before a claim.
    fn mark(&self) -> u64;
    /// Waits until work arrived after `mark`, `timeout` passed, or `stop` was set.
    fn wait(&self, mark: u64, timeout: Duration, stop: &AtomicBool);
}

/// The writer of a SQLite file: a commit in this process that makes commands or timers claimable
/// wakes the idle workers at once; commits of other processes are found by polling.
pub(super) struct WriterWakeups {
    path: PathBuf,
    /// Opened at the first mark, once the workers' stores have opened the file.
    writer: Mutex<Option<Writer>>,
}

impl WriterWakeups {
    pub(super) fn new(path: PathBuf) -> Self {
        Self {
            path,
            writer: Mutex::new(None),
        }
    }

    fn writer(&self) -> Option<Writer> {
        let mut writer = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        if writer.is_none() {
            *writer = Writer::open(&self.path).ok();
        }
        writer.clone()
    }
}

impl Idle for WriterWakeups {
    fn mark(&self) -> u64 {
        self.writer().map_or(0, |writer| writer.work_mark())
    }

    fn wait(&self, mark: u64, timeout: Duration, stop: &AtomicBool) {
        let Some(writer) = self.writer() else {
            return sleep_unless(stop, timeout);
        };
        let until = Instant::now() + timeout;
        while !stop.load(Ordering::SeqCst) {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() || writer.wait_for_work(mark, left.min(STOP_CHECK)) != mark {
                return;
            }
        }
    }
}

/// How often a waiting worker looks at the stop flag.
const STOP_CHECK: Duration = Duration::from_millis(5);
