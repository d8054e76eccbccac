//! The engine's side of the state-cache protocol: a decision made on a cached state is the decision
//! replay from the first event gives. A state is used only with its history, only after its last
//! event is found again unchanged (`EventLog::append_after`), and kept only once the events it
//! came from are committed (`remember`), or forgotten when the transaction fails (`forget`).

use std::cell::RefCell;

use super::*;

/// The events a host reads inside its own transaction, given as a function (for
/// [`Engine::plan_in`]): a log that only reads.
struct Reader<F>(RefCell<F>);

impl<F: FnMut(Seq) -> Result<Vec<EventRecord>, Error>> EventLog for &Reader<F> {
    fn load(&self, _: &WorkflowId) -> Result<Vec<EventRecord>, Error> {
        (self.0.borrow_mut())(Seq::ZERO)
    }
    fn load_after(&self, _: &WorkflowId, after: Seq) -> Result<Vec<EventRecord>, Error> {
        (self.0.borrow_mut())(after)
    }
    fn append_with_commands(&mut self, commit: &Commit) -> Result<(), Error> {
        Err(Error::invalid(
            "commit",
            commit.workflow_id(),
            "cannot be written by a log that only reads",
        ))
    }
}

impl<W: Workflow> Engine<W> {
    /// [`Engine::plan`] with the state cache, for a host that writes the commit inside a transaction
    /// of its own: folds the cached state of `workflow_id` in `history` with the events
    /// `load_after(seq)` returns after it (or, without a usable cached state, every event from
    /// `load_after(Seq::ZERO)`), decides on `event`, and returns the commit with the state.
    ///
    /// `load_after` reads the workflow's events after a seq, in seq order, as
    /// [`EventLog::load_after`] does, from the transaction the commit will be written in. Once that
    /// transaction has committed, give the result to [`Engine::remember`]; if it rolled back, drop it
    /// (the events it read may have been the transaction's own). A host that runs many plans in one
    /// transaction may remember each at once, so the next plan on the workflow folds on from it, and
    /// then must [`Engine::forget`] the workflow if the transaction fails.
    ///
    /// # Errors
    ///
    /// As [`Engine::plan`], and `load_after`'s errors.
    pub fn plan_in(
        &self,
        history: HistoryId,
        workflow_id: &WorkflowId,
        event: Event,
        now: Timestamp,
        load_after: impl FnMut(Seq) -> Result<Vec<EventRecord>, Error>,
    ) -> Result<Planned<W::State>, Error> {
        let event = self.callers(event)?;
        let reader = Reader(RefCell::new(load_after));
        let (commit, folded) =
            self.plan_sync(Some(history), workflow_id, event, now, &mut &reader)?;
        Ok(Planned {
            commit: commit?,
            folded: folded.into_entry(),
        })
    }

    /// Keeps the state a [`Planned`] was decided on, for the next call on its workflow: once the
    /// transaction its events were read in has committed; or at once, for later plans in the same
    /// transaction to fold on from it, if the host calls [`Engine::forget`] for the workflow when that
    /// transaction fails.
    pub fn remember(&self, planned: Planned<W::State>) {
        if let Some((key, entry)) = planned.folded {
            self.states.put(key, entry);
        }
    }

    /// Drops the cached state of `workflow_id` in `history`, if any: for a host that remembered a
    /// state folded in a transaction that then failed.
    pub fn forget(&self, history: HistoryId, workflow_id: &WorkflowId) {
        drop(self.states.take(&(history, workflow_id.clone())));
    }

    /// Keeps a state folded from committed events (the store's reads are committed:
    /// [`EventLog::history_id`]), whatever became of the commit planned on it.
    pub(super) fn keep(&self, folded: Folded<W::State>) {
        if let Some((key, entry)) = folded.into_entry() {
            self.states.put(key, entry);
        }
    }

    /// Keeps the state with `commit`'s events, just written, to fold when it is next used, when the
    /// store of `history` keeps a commit's events as they are ([`EventLog::append_after`] answers),
    /// so the next call can commit on it without reading; else keeps it as it was folded.
    pub(super) fn keep_through(
        &self,
        folded: Folded<W::State>,
        commit: &Commit,
        history: Option<HistoryId>,
    ) {
        let as_written = history.is_some_and(|h| self.states.checks_last(h) == Some(true));
        match folded {
            Folded {
                state,
                key: Some(key),
                last: Some(last),
                ..
            } if as_written => self.states.put(
                key,
                Entry {
                    last,
                    state,
                    unfolded: commit.events().to_vec(),
                },
            ),
            folded => self.keep(folded),
        }
    }

    /// `entry` with the events the engine committed after its last one folded in.
    ///
    /// # Errors
    ///
    /// [`Error::Corrupt`] for events out of seq order.
    pub(super) fn catch_up(&self, mut entry: Entry<W::State>) -> Result<Entry<W::State>, Error> {
        let unfolded = std::mem::take(&mut entry.unfolded);
        fold(&self.workflow, &mut entry.state, entry.last.seq, &unfolded)?;
        if let Some(last) = unfolded.into_iter().last() {
            entry.last = last;
        }
        Ok(entry)
    }
}
