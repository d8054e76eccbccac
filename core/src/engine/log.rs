//! The log the engine's loop runs on. The loop (read, decide, commit, retry a lost race, the state
//! cache's protocol) is written once, as `async` code over [`AsyncEventLog`]: an async store's
//! handle implements it and awaits [`Engine::handle_on`]; a synchronous [`EventLog`] runs the same
//! loop through [`Blocking`], whose every call is answered before its future is polled, so the loop
//! completes in one poll without a runtime. The core has no runtime, no clock and no threads either
//! way: waiting before a retry is the store's ([`AsyncEventLog::before_retry`]).

use std::future::Future;
use std::task::{Context, Poll, Waker};

use super::*;

/// What [`Engine::handle_on`], [`Engine::start_on`] and [`Engine::fire_on`] need of an async store:
/// the reads and commits of [`EventLog`] (and [`Timers::reject_timer`]), awaited. For store authors
/// (`miniflow_core::backend`); the methods mean what their [`EventLog`] namesakes mean.
///
/// Futures that are dropped before they finish must leave the store as if the call never
/// happened, or as if it had finished: a commit is one transaction, not half of one.
pub trait AsyncEventLog {
    /// As [`EventLog::history_id`].
    fn history_id(&self) -> Option<HistoryId> {
        None
    }

    /// As [`EventLog::load_after`]: the events of `workflow_id` after `after`, in seq order.
    fn load_after(
        &mut self,
        workflow_id: &WorkflowId,
        after: Seq,
    ) -> impl Future<Output = Result<Vec<EventRecord>, Error>>;

    /// As [`EventLog::append_with_commands`].
    fn append_with_commands(&mut self, commit: &Commit) -> impl Future<Output = Result<(), Error>>;

    /// As [`EventLog::append_after`]; the default checks nothing.
    fn append_after(
        &mut self,
        last: &EventRecord,
        commit: &Commit,
    ) -> impl Future<Output = Result<AppendedAfter, Error>> {
        let _ = (last, commit);
        async { Ok(AppendedAfter::Unchecked) }
    }

    /// As [`EventLog::before_retry`]: an async store waits here (on its runtime's timer) before
    /// the engine tries a commit again; the default returns at once.
    fn before_retry(&mut self, conflicts: u32) -> impl Future<Output = ()> {
        let _ = conflicts;
        async {}
    }

    /// As [`Timers::reject_timer`], for [`Engine::fire_on`].
    fn reject_timer(
        &mut self,
        timer_id: &TimerId,
        reason: &str,
        now: Timestamp,
    ) -> impl Future<Output = Result<(), Error>>;
}

/// A synchronous [`EventLog`] as an [`AsyncEventLog`] whose futures are ready when first polled: the
/// engine's synchronous methods run the async loop on it with [`now`].
pub(super) struct Blocking<'a, S: ?Sized> {
    store: &'a mut S,
    /// [`Timers::reject_timer`], when the store has timers (for [`Engine::fire`]).
    reject: Option<RejectTimer<S>>,
}

type RejectTimer<S> = fn(&mut S, &TimerId, &str, Timestamp) -> Result<(), Error>;

impl<'a, S: EventLog + ?Sized> Blocking<'a, S> {
    pub(super) fn new(store: &'a mut S) -> Self {
        Self {
            store,
            reject: None,
        }
    }
}

impl<'a, S: EventLog + Timers + ?Sized> Blocking<'a, S> {
    pub(super) fn with_timers(store: &'a mut S) -> Self {
        Self {
            store,
            reject: Some(|store, id, reason, now| store.reject_timer(id, reason, now)),
        }
    }
}

impl<S: EventLog + ?Sized> AsyncEventLog for Blocking<'_, S> {
    fn history_id(&self) -> Option<HistoryId> {
        self.store.history_id()
    }
    async fn load_after(
        &mut self,
        workflow_id: &WorkflowId,
        after: Seq,
    ) -> Result<Vec<EventRecord>, Error> {
        self.store.load_after(workflow_id, after)
    }
    async fn append_with_commands(&mut self, commit: &Commit) -> Result<(), Error> {
        self.store.append_with_commands(commit)
    }
    async fn append_after(
        &mut self,
        last: &EventRecord,
        commit: &Commit,
    ) -> Result<AppendedAfter, Error> {
        self.store.append_after(last, commit)
    }
    async fn before_retry(&mut self, conflicts: u32) {
        self.store.before_retry(conflicts);
    }
    async fn reject_timer(
        &mut self,
        timer_id: &TimerId,
        reason: &str,
        now: Timestamp,
    ) -> Result<(), Error> {
        match self.reject {
            Some(reject) => reject(self.store, timer_id, reason, now),
            None => Err(Error::invalid(
                "timer",
                timer_id,
                "cannot be rejected by a log without timers",
            )),
        }
    }
}

/// The events a host reads inside its own transaction, given as a function (for
/// [`Engine::plan_in`]): a log that only reads.
pub(super) struct Reader<F>(pub(super) F);

impl<F: FnMut(Seq) -> Result<Vec<EventRecord>, Error>> AsyncEventLog for Reader<F> {
    async fn load_after(&mut self, _: &WorkflowId, after: Seq) -> Result<Vec<EventRecord>, Error> {
        (self.0)(after)
    }
    async fn append_with_commands(&mut self, commit: &Commit) -> Result<(), Error> {
        Err(Error::invalid(
            "commit",
            commit.workflow_id(),
            "cannot be written by a log that only reads",
        ))
    }
    async fn reject_timer(
        &mut self,
        timer_id: &TimerId,
        _: &str,
        _: Timestamp,
    ) -> Result<(), Error> {
        Err(Error::invalid(
            "timer",
            timer_id,
            "cannot be rejected by a log that only reads",
        ))
    }
}

/// Runs `future`, whose every await is answered before it is polled (a [`Blocking`] log's): it
/// completes in one poll. Polled again should it ever not, it would still complete.
pub(super) fn now<F: Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    let mut context = Context::from_waker(Waker::noop());
    loop {
        if let Poll::Ready(out) = future.as_mut().poll(&mut context) {
            return out;
        }
    }
}
