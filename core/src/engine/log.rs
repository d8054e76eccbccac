//! [`AsyncEventLog`]: the log of an async store, as the engine's loop (`super::looped`, written once
//! for both kinds of log) reads and commits on it. The core has no runtime, no clock and no threads:
//! waiting before a retry is the store's ([`AsyncEventLog::before_retry`]).

use std::future::Future;

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
