//! The worker pool over a SQLite file: [`SqliteDispatcher::sqlite`], and the writer's wake-ups.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use miniflow_pool::{Dispatcher, Handler, Wakeup};

use crate::{SqliteStore, Writer};

/// `Dispatcher::sqlite`: the worker pool ([`Dispatcher`]) over a SQLite file. In
/// `miniflow::prelude`.
pub trait SqliteDispatcher: Sized {
    /// A dispatcher over the SQLite file at `path`: every worker opens a store of its own (a
    /// connection to read), and all write through the process's [`Writer`] of the file, so the acks
    /// of a batch and the claim of the next are one transaction, grouped with everything else the
    /// process writes. An idle worker is woken as soon as a commit of this process makes commands
    /// or timers claimable; commits of other processes it finds at its next poll.
    ///
    /// ```
    /// use miniflow_core::prelude::*;
    /// use miniflow_core::{json, Command, Commit, Decision, Delivery, Event, Seq, Timestamp, WorkflowId};
    /// use miniflow_native::{Dispatcher, Outcome, SqliteDispatcher, SqliteStore};
    ///
    /// let dir = tempfile::tempdir()?;
    /// let path = dir.path().join("flow.db");
    /// let mut store = SqliteStore::open(&path)?;
    /// let decision = Decision::new().command(Command::new("lock_budget", json!({ "amount": 1200 })));
    /// let event = Event::new("trip_requested", json!({}));
    /// store.append_with_commands(&Commit::new(WorkflowId::new("trip-001")?, Seq::ZERO, event, decision, Timestamp::EPOCH)?)?;
    ///
    /// let stats = Dispatcher::sqlite(&path, |delivery: &Delivery| {
    ///     // call the receiver with delivery.command_id as the idempotency key
    ///     Outcome::Done
    /// })
    /// .workers(2)
    /// .run_until_idle()?;
    /// assert_eq!(stats.completed, 1);
    /// assert!(store.pending(10)?.is_empty());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn sqlite(path: impl Into<PathBuf>, handler: impl Handler) -> Self;
}

impl SqliteDispatcher for Dispatcher<SqliteStore> {
    fn sqlite(path: impl Into<PathBuf>, handler: impl Handler) -> Self {
        let path = path.into();
        let wakeups = WriterWakeups::new(path.clone());
        Dispatcher::new(move || SqliteStore::open(&path), handler).woken_by(wakeups)
    }
}

/// The writer of a SQLite file as a [`Wakeup`]: a commit in this process that makes commands or
/// timers claimable wakes the idle workers at once; commits of other processes are found by polling.
impl Wakeup for Writer {
    fn mark(&self) -> u64 {
        self.work_mark()
    }

    fn wait(&self, mark: u64, timeout: Duration, stop: &AtomicBool) {
        let until = Instant::now() + timeout;
        while !stop.load(Ordering::SeqCst) {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() || self.wait_for_work(mark, left.min(STOP_CHECK)) != mark {
                return;
            }
        }
    }
}

/// How often a waiting worker looks at the stop flag.
const STOP_CHECK: Duration = Duration::from_millis(5);

/// The writer of a SQLite file, opened at the first mark, once the workers' stores have opened
/// the file.
struct WriterWakeups {
    path: PathBuf,
    writer: Mutex<Option<Writer>>,
}

impl WriterWakeups {
    fn new(path: PathBuf) -> Self {
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

impl Wakeup for WriterWakeups {
    fn mark(&self) -> u64 {
        self.writer().map_or(0, |writer| writer.work_mark())
    }

    fn wait(&self, mark: u64, timeout: Duration, stop: &AtomicBool) {
        match self.writer() {
            Some(writer) => writer.wait(mark, timeout, stop),
            None => {
                let until = Instant::now() + timeout;
                while !stop.load(Ordering::SeqCst) && Instant::now() < until {
                    std::thread::sleep(
                        STOP_CHECK.min(until.saturating_duration_since(Instant::now())),
                    );
                }
            }
        }
    }
}
