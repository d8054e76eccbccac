//! The wake-up hint (`NOTIFY miniflow_outbox`) after operations that made work claimable, sent by a
//! thread of the store's own on a connection of its own, so that committing never waits for it.
//!
//! PostgreSQL serialises the commits of notifying transactions (a global lock taken before the commit
//! record and held until the commit is flushed), so a `NOTIFY` inside every committing transaction
//! would put every commit's WAL flush in one queue, one after the other. Here the commits flush as
//! they would without notifications, and the hint follows them:
//!
//! - it is sent after the operation committed, so whoever it wakes finds the work already visible;
//! - operations committing while a hint is on its way share the next one: at most one hint per
//!   [`COALESCE`], however many commits there are (a listener needs one to wake up, not one each);
//! - it is a transaction of its own that does not wait for its WAL flush (`synchronous_commit` off
//!   for it alone): a hint lost in a crash costs an idle worker its fallback poll, and nothing else.
//!
//! When the store's last handle goes, a hint still pending is sent before the thread ends.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use postgres::{Client, Statement};

use crate::db::Connections;

/// The channel commits that make work claimable notify (see [`crate::Wakeups`]).
pub const NOTIFY_CHANNEL: &str = "miniflow_outbox";

/// The shortest time between two hints of one store.
pub(crate) const COALESCE: Duration = Duration::from_millis(1);

/// The hint sender of one store (shared by its clones).
pub(crate) struct Notifier {
    inner: Arc<Inner>,
    connections: Arc<dyn Connections>,
    started: AtomicBool,
    thread: Mutex<Option<JoinHandle<()>>>,
}

#[derive(Default)]
struct Inner {
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Default)]
struct State {
    /// An operation committed work since the last hint went out.
    pending: bool,
    /// The store's last handle went.
    stop: bool,
    /// The thread waits for a hint to send (not for the coalescing pause to end).
    idle: bool,
}

impl Notifier {
    pub(crate) fn new(connections: Arc<dyn Connections>) -> Self {
        Self {
            inner: Arc::default(),
            connections,
            started: AtomicBool::new(false),
            thread: Mutex::new(None),
        }
    }

    /// Asks for a hint: an operation that made work claimable has committed. Starts the sending
    /// thread on first use; never blocks on the database.
    pub(crate) fn raise(&self) {
        let wake = {
            let mut state = self.inner.lock();
            state.pending = true;
            state.idle
        };
        // A thread in its coalescing pause takes the hint when the pause ends.
        if wake {
            self.inner.changed.notify_one();
        }
        if !self.started.load(Ordering::Acquire) {
            self.start();
        }
    }

    fn start(&self) {
        let mut thread = self.thread.lock().unwrap_or_else(PoisonError::into_inner);
        if thread.is_none() {
            let inner = self.inner.clone();
            let connections = self.connections.clone();
            // Without a thread the hint is lost, which costs listeners their fallback poll only.
            *thread = std::thread::Builder::new()
                .name("miniflow-notify".into())
                .spawn(move || send_until_stopped(&inner, &*connections))
                .ok();
        }
        self.started.store(true, Ordering::Release);
    }
}

impl Drop for Notifier {
    fn drop(&mut self) {
        self.inner.lock().stop = true;
        self.inner.changed.notify_one();
        let thread = self
            .thread
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(thread) = thread {
            let _ = thread.join();
        }
    }
}

impl std::fmt::Debug for Notifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Notifier").finish_non_exhaustive()
    }
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The connection hints go out on, opened when first needed and again after it failed.
struct Sender {
    client: Option<(Client, Statement)>,
}

impl Sender {
    /// Sends one hint; a connection that fails is replaced once.
    fn send(&mut self, connections: &dyn Connections) {
        for _ in 0..2 {
            if self.client.is_none() {
                self.client = connections.dedicated().ok().and_then(|mut client| {
                    let statement = client
                        .prepare(
                            "SELECT set_config('synchronous_commit', 'off', true), \
                             pg_notify($1, '')",
                        )
                        .ok()?;
                    Some((client, statement))
                });
            }
            let Some((client, statement)) = &mut self.client else {
                return;
            };
            if client.execute(&*statement, &[&NOTIFY_CHANNEL]).is_ok() {
                return;
            }
            self.client = None;
        }
    }
}

fn send_until_stopped(inner: &Inner, connections: &dyn Connections) {
    let mut sender = Sender { client: None };
    loop {
        {
            let mut state = inner.lock();
            state.idle = true;
            while !state.pending && !state.stop {
                state = inner
                    .changed
                    .wait(state)
                    .unwrap_or_else(PoisonError::into_inner);
            }
            state.idle = false;
            if !state.pending {
                return;
            }
            state.pending = false;
        }
        sender.send(connections);
        // Commits meanwhile wait for the next hint, at most `COALESCE` away.
        let until = Instant::now() + COALESCE;
        let mut state = inner.lock();
        while !state.stop {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            state = inner
                .changed
                .wait_timeout(state, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}
