//! Wake-ups: a connection that `LISTEN`s on the channel committing transactions notify, so idle
//! workers start early and otherwise leave the database alone. Polling stays the fallback.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use miniflow_core::Error;
use postgres::fallible_iterator::FallibleIterator;
use postgres::Client;

use crate::connect::Shared;
use crate::errors::storage;
use crate::notifier::NOTIFY_CHANNEL;
use crate::PostgresStore;

/// How long the listener waits for a notification before it looks at whether to stop.
pub(crate) const LISTEN_TICK: Duration = Duration::from_millis(100);
/// The longest pause between two attempts to reconnect a lost listener.
pub(crate) const MAX_RECONNECT_PAUSE: Duration = Duration::from_secs(5);

/// A background thread holding one connection of its own that `LISTEN`s on `miniflow_outbox`
/// (see [`crate::PostgresOptions::notify`]), counting what it hears. Stores woken by it
/// ([`PostgresStore::woken_by`]) skip idle polls until the count moves.
///
/// Clones share the thread; it stops, and closes its connection, soon after the last clone (and every
/// store woken by it) is dropped. A lost connection is reconnected with a growing pause (up to 5 s);
/// each reconnection counts as a notification, since notifications sent meanwhile were lost.
///
/// ```no_run
/// use std::time::Duration;
/// use miniflow_postgres::{PostgresStore, Wakeups};
///
/// let store = PostgresStore::connect("postgresql://app@db.internal/flow")?;
/// let wakeups = Wakeups::listen(&store)?;
/// let worker_store = store.clone().woken_by(&wakeups, Duration::from_secs(1));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct Wakeups {
    guard: Arc<Guard>,
}

/// What a listener (a thread here, a task of the async store's) counts, and its stop flag.
#[derive(Debug, Default)]
pub(crate) struct State {
    pub(crate) generation: AtomicU64,
    pub(crate) listening: AtomicBool,
    pub(crate) stop: AtomicBool,
}

/// Stops the listener when the last [`Wakeups`] goes.
#[derive(Debug)]
struct Guard {
    state: Arc<State>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::SeqCst);
    }
}

impl Wakeups {
    /// Opens a connection of its own to `store`'s database (outside its pool), `LISTEN`s on
    /// `miniflow_outbox`, and starts the thread that counts notifications.
    ///
    /// # Errors
    ///
    /// [`Error::Storage`] when the connection cannot be opened or the `LISTEN` fails.
    pub fn listen(store: &PostgresStore) -> Result<Self, Error> {
        let shared = store.shared().clone();
        let client = listening_client(&shared)?;
        let state = Arc::new(State {
            listening: AtomicBool::new(true),
            ..State::default()
        });
        let thread_state = state.clone();
        std::thread::Builder::new()
            .name("miniflow-listen".into())
            .spawn(move || listen_until_stopped(&shared, client, &thread_state))
            .map_err(|e| Error::Storage(Box::new(e)))?;
        Ok(Self {
            guard: Arc::new(Guard { state }),
        })
    }

    /// Wake-ups whose listener is not started yet (the async store's task): it counts into the
    /// returned state and stops when it sees the state's stop flag.
    #[cfg(feature = "tokio")]
    pub(crate) fn unstarted() -> (Self, Arc<State>) {
        let state = Arc::new(State::default());
        let wakeups = Self {
            guard: Arc::new(Guard {
                state: state.clone(),
            }),
        };
        (wakeups, state)
    }

    /// How many notifications (and reconnections) the listener has heard so far.
    pub fn generation(&self) -> u64 {
        self.guard.state.generation.load(Ordering::SeqCst)
    }

    /// Whether the listener's connection is up; while it is not, woken stores fall back to polling.
    pub fn is_listening(&self) -> bool {
        self.guard.state.listening.load(Ordering::SeqCst)
    }

    /// Waits until the count passes `generation` or `timeout` runs out; says whether it passed. For
    /// callers that block on work instead of polling.
    pub fn wait_past(&self, generation: u64, timeout: Duration) -> bool {
        let until = Instant::now() + timeout;
        loop {
            if self.generation() > generation {
                return true;
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            std::thread::sleep(left.min(Duration::from_millis(2)));
        }
    }
}

/// The dispatchers' wake-up: a notification (or a reconnection) since the mark.
impl miniflow_pool::Wakeup for Wakeups {
    fn mark(&self) -> u64 {
        self.generation()
    }
    fn wait(&self, mark: u64, timeout: Duration, stop: &AtomicBool) {
        let until = Instant::now() + timeout;
        while self.generation() <= mark && !stop.load(Ordering::SeqCst) {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            std::thread::sleep(left.min(Duration::from_millis(2)));
        }
    }
}

fn listening_client(shared: &Shared) -> Result<Client, Error> {
    let mut client = shared.dedicated()?;
    client
        .batch_execute(&format!("LISTEN {NOTIFY_CHANNEL}"))
        .map_err(storage)?;
    Ok(client)
}

fn listen_until_stopped(shared: &Shared, client: Client, state: &State) {
    let mut client = Some(client);
    let mut failures: u32 = 0;
    while !state.stop.load(Ordering::SeqCst) {
        let Some(listening) = client.as_mut() else {
            let pause =
                (LISTEN_TICK * 2u32.saturating_pow(failures.min(10))).min(MAX_RECONNECT_PAUSE);
            sleep_unless(&state.stop, pause);
            match listening_client(shared) {
                Ok(reconnected) => {
                    client = Some(reconnected);
                    failures = 0;
                    state.listening.store(true, Ordering::SeqCst);
                    // Whatever was notified while the connection was down is lost: look again.
                    state.generation.fetch_add(1, Ordering::SeqCst);
                }
                Err(_) => failures = failures.saturating_add(1),
            }
            continue;
        };
        let heard = listening
            .notifications()
            .timeout_iter(LISTEN_TICK)
            .next()
            .map(|notification| notification.is_some());
        match heard {
            Ok(true) => {
                state.generation.fetch_add(1, Ordering::SeqCst);
            }
            Ok(false) => {}
            Err(_) => {
                client = None;
                state.listening.store(false, Ordering::SeqCst);
                state.generation.fetch_add(1, Ordering::SeqCst);
            }
        }
    }
}

/// Sleeps `total`, waking early when `stop` is set.
fn sleep_unless(stop: &AtomicBool, total: Duration) {
    let until = Instant::now() + total;
    while !stop.load(Ordering::SeqCst) {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        std::thread::sleep(left.min(Duration::from_millis(20)));
    }
}

pub use dispatcher::{PostgresDispatcher, DEFAULT_FALLBACK_POLL};

mod dispatcher {
    use std::time::Duration;

    use miniflow_core::Error;
    use miniflow_pool::{Dispatcher, Handler};

    use super::Wakeups;
    use crate::PostgresStore;

    /// How often an idle worker of [`PostgresDispatcher::postgres`] asks the database when no
    /// notification came.
    pub const DEFAULT_FALLBACK_POLL: Duration = Duration::from_secs(1);

    /// `Dispatcher::postgres`: the worker pool ([`Dispatcher`]) over a [`PostgresStore`], woken by
    /// notifications. In `miniflow::prelude`.
    pub trait PostgresDispatcher: Sized {
        /// A dispatcher whose workers share `store`'s pool (and its options: use
        /// [`crate::PostgresOptions::database_clock`] when workers run on several machines). One
        /// [`Wakeups`] listener wakes them: an idle worker looks at its own flag every 10 ms (the
        /// dispatcher's poll interval), and asks the database only after a notification, at the next
        /// due time it saw, or every [`DEFAULT_FALLBACK_POLL`]. The builder methods of
        /// [`Dispatcher`] apply as usual; a longer `poll_interval` delays wake-ups by as much.
        ///
        /// ```no_run
        /// use miniflow_core::Delivery;
        /// use miniflow_pool::{Dispatcher, Outcome};
        /// use miniflow_postgres::{PostgresDispatcher, PostgresOptions, PostgresStore};
        ///
        /// let options = PostgresOptions::new().database_clock(true);
        /// let store = PostgresStore::connect_with("postgresql://app@db.internal/flow", &options)?;
        /// let running = Dispatcher::postgres(&store, |delivery: &Delivery| {
        ///     // call the receiver with delivery.command_id as the idempotency key
        ///     Outcome::Done
        /// })?
        /// .workers(4)
        /// .start()?;
        /// # Ok::<(), Box<dyn std::error::Error>>(())
        /// ```
        ///
        /// # Errors
        ///
        /// [`Error::Storage`] when the listener cannot connect or `LISTEN`.
        fn postgres(store: &PostgresStore, handler: impl Handler) -> Result<Self, Error>;
    }

    impl PostgresDispatcher for Dispatcher<PostgresStore> {
        fn postgres(store: &PostgresStore, handler: impl Handler) -> Result<Self, Error> {
            let wakeups = Wakeups::listen(store)?;
            let store = store.clone().woken_by(&wakeups, DEFAULT_FALLBACK_POLL);
            Ok(Dispatcher::new(move || Ok(store.clone()), handler)
                .poll_interval(Duration::from_millis(10)))
        }
    }
}
