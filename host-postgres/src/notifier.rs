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
    /// The callers' transactions that made work, to hint once they commit.
    watch: Watch,
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

    /// Asks for a hint once the caller's transaction `xid` commits (none if it rolls back): a
    /// commit inside the caller's transaction does not notify in it, which would make every
    /// notifying producer commit one at a time (PostgreSQL serialises the commits of
    /// transactions that `NOTIFY`).
    pub(crate) fn raise_after(&self, xid: i64) {
        let wake = {
            let mut state = self.inner.lock();
            state.watch.add(xid);
            state.idle
        };
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

/// The fate of each of `$1` (transaction IDs as `bigint`): `committed`, `aborted`, `in progress`,
/// or NULL for one too old to be known (taken as settled).
pub(crate) const XACT_STATUS: &str =
    "SELECT x, pg_xact_status(x::text::xid8) FROM unnest($1::bigint[]) AS x";

/// The hint's statement: `NOTIFY` in a transaction of its own that waits for no flush (the hint is
/// only a hint).
pub(crate) const SEND_HINT: &str =
    "SELECT set_config('synchronous_commit', 'off', true), pg_notify($1, '')";

/// The callers' transactions a store waits on before it hints (see [`Notifier::raise_after`]).
#[derive(Debug, Default)]
pub(crate) struct Watch {
    xids: Vec<i64>,
    /// How long to wait before asking again: doubles while nothing settles.
    pause: Duration,
}

/// The first and the longest pause between two questions about the watched transactions.
const FIRST_PAUSE: Duration = Duration::from_millis(1);
const LONGEST_PAUSE: Duration = Duration::from_millis(64);

impl Watch {
    pub(crate) fn add(&mut self, xid: i64) {
        if !self.xids.contains(&xid) {
            self.xids.push(xid);
        }
        self.pause = FIRST_PAUSE;
    }

    /// The transactions to ask about, if any.
    pub(crate) fn xids(&self) -> Option<&[i64]> {
        (!self.xids.is_empty()).then_some(&self.xids[..])
    }

    /// Takes the answers (`xid`, its status): forgets the settled ones; whether any committed
    /// (then a hint is due).
    pub(crate) fn settle(&mut self, answers: &[(i64, Option<String>)]) -> bool {
        let mut committed = false;
        for (xid, status) in answers {
            let settled = match status.as_deref() {
                Some("in progress") => false,
                Some("aborted") => true,
                _ => {
                    committed = true;
                    true
                }
            };
            if settled {
                self.xids.retain(|x| x != xid);
            }
        }
        self.pause = if committed {
            FIRST_PAUSE
        } else {
            (self.pause * 2).clamp(FIRST_PAUSE, LONGEST_PAUSE)
        };
        committed
    }

    /// How long to wait before asking again.
    pub(crate) fn pause(&self) -> Duration {
        self.pause.max(FIRST_PAUSE)
    }
}

impl Sender {
    /// Sends one hint; a connection that fails is replaced once.
    fn send(&mut self, connections: &dyn Connections) {
        for _ in 0..2 {
            if self.client.is_none() {
                self.client = connections.dedicated().ok().and_then(|mut client| {
                    let statement = client.prepare(SEND_HINT).ok()?;
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

    /// Asks about the watched transactions; `None` when the server cannot be asked (the watch is
    /// kept, and asked again later).
    fn ask(
        &mut self,
        connections: &dyn Connections,
        xids: &[i64],
    ) -> Option<Vec<(i64, Option<String>)>> {
        if self.client.is_none() {
            self.send_none(connections);
        }
        let (client, _) = self.client.as_mut()?;
        match client.query(XACT_STATUS, &[&xids]) {
            Ok(rows) => rows
                .iter()
                .map(|row| Some((row.try_get(0).ok()?, row.try_get(1).ok()?)))
                .collect(),
            Err(_) => {
                self.client = None;
                None
            }
        }
    }

    /// Opens the connection without sending a hint.
    fn send_none(&mut self, connections: &dyn Connections) {
        self.client = connections.dedicated().ok().and_then(|mut client| {
            let statement = client.prepare(SEND_HINT).ok()?;
            Some((client, statement))
        });
    }
}

fn send_until_stopped(inner: &Inner, connections: &dyn Connections) {
    let mut sender = Sender { client: None };
    loop {
        let watched = {
            let mut state = inner.lock();
            state.idle = true;
            while !state.pending && state.watch.xids().is_none() && !state.stop {
                state = inner
                    .changed
                    .wait(state)
                    .unwrap_or_else(PoisonError::into_inner);
            }
            state.idle = false;
            if state.stop && !state.pending {
                return;
            }
            state.watch.xids().map(<[i64]>::to_vec)
        };
        if let Some(xids) = watched {
            let answers = sender.ask(connections, &xids);
            let mut state = inner.lock();
            if let Some(answers) = answers {
                state.pending |= state.watch.settle(&answers);
            }
        }
        let send = std::mem::take(&mut inner.lock().pending);
        if send {
            sender.send(connections);
        }
        // Commits meanwhile wait for the next hint, at most `COALESCE` away; watched transactions
        // are asked about again after their pause.
        let pause = {
            let state = inner.lock();
            match state.watch.xids() {
                Some(_) => state.watch.pause().max(COALESCE),
                None => COALESCE,
            }
        };
        let until = Instant::now() + pause;
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
