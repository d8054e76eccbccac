//! The engine's side of the state-cache protocol: a decision made on a cached state is the decision
//! replay from the first event gives. A state is used only with its history, only after its last
//! event is found again unchanged (`EventLog::append_after`), and kept only once the events it
//! came from are committed (`remember`), or forgotten when the transaction fails (`forget`).

use super::log::{self, AsyncEventLog};
use super::*;

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
        let (commit, folded) = log::now(self.plan_cached(
            Some(history),
            workflow_id,
            event,
            now,
            &mut log::Reader(load_after),
        ))?;
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

    /// Folds the workflow (from its cached state when there is a usable one), decides on `event`, and
    /// returns the commit (or why there is none) beside the folded state.
    #[allow(clippy::type_complexity)]
    pub(super) async fn plan_cached<L: AsyncEventLog + ?Sized>(
        &self,
        history: Option<HistoryId>,
        workflow_id: &WorkflowId,
        event: Event,
        now: Timestamp,
        log: &mut L,
    ) -> Result<(Result<Commit, Error>, Folded<W::State>), Error> {
        let event = self.checked(event)?;
        let folded = self.fold_cached(history, workflow_id, log).await?;
        let commit = self.decide_commit(&folded.state, folded.last_seq, workflow_id, event, now);
        Ok((commit, folded))
    }

    /// The state of `workflow_id`: its cached state with the newer events folded in, when the store
    /// still holds the cached state's last event unchanged; else replayed from the first event.
    pub(super) async fn fold_cached<L: AsyncEventLog + ?Sized>(
        &self,
        history: Option<HistoryId>,
        workflow_id: &WorkflowId,
        log: &mut L,
    ) -> Result<Folded<W::State>, Error> {
        let key = history
            .filter(|_| self.states.capacity() > 0)
            .map(|history| (history, workflow_id.clone()));
        if let Some(key) = &key {
            let cached = self.states.take(key).map(|entry| self.catch_up(entry));
            if let Some(entry) = cached {
                let entry = entry?;
                // Read from the cached last event on, to find it again as it was.
                let events = log
                    .load_after(workflow_id, Seq::new(entry.last.seq.get() - 1)?)
                    .await?;
                let found = events.first() == Some(&entry.last);
                self.states.count(Some(found));
                if found {
                    let mut state = entry.state;
                    let last_seq = fold(&self.workflow, &mut state, entry.last.seq, &events[1..])?;
                    return Ok(Folded {
                        state,
                        last_seq,
                        key: Some(key.clone()),
                        last: events.into_iter().last(),
                    });
                }
            } else {
                self.states.count(None);
            }
        }
        let events = log.load_after(workflow_id, Seq::ZERO).await?;
        let replayed = replay(&self.workflow, &events)?;
        Ok(Folded {
            state: replayed.state,
            last_seq: replayed.last_seq,
            key,
            last: events.into_iter().last(),
        })
    }

    /// The commit of `event` decided on the cached state of `workflow_id`, without reading the
    /// workflow first: the store checks in its commit that the cached state's last event is still
    /// the workflow's last ([`EventLog::append_after`]). On success the state is kept with the new
    /// event, folded when the state is next used (the workflow's code runs before a commit, never
    /// after it). Tried only with a cached state and a store known to check (a commit through the
    /// reading path finds that out); a conflict leaves the cached state to the reading path, which
    /// folds what came after it.
    pub(super) async fn commit_on_cached<L: AsyncEventLog + ?Sized>(
        &self,
        store: &mut L,
        workflow_id: &WorkflowId,
        event: &Event,
        now: Timestamp,
        fires: Option<&Firing>,
        context: Option<&TraceContext>,
    ) -> Result<OnCached, Error> {
        let Some(history) = store.history_id() else {
            return Ok(OnCached::NotTried);
        };
        if self.states.capacity() == 0 || self.states.checks_last(history) != Some(true) {
            return Ok(OnCached::NotTried);
        }
        let key = (history, workflow_id.clone());
        let Some(entry) = self.states.take(&key) else {
            return Ok(OnCached::NotTried);
        };
        let entry = self.catch_up(entry)?;
        let planned = self.plan_on(&entry, workflow_id, event, now, fires, context);
        let commit = match planned {
            Ok(commit) => commit,
            Err(e) => {
                self.states.put(key, entry);
                return Err(e);
            }
        };
        match store.append_after(&entry.last, &commit).await {
            Ok(AppendedAfter::Written) => {
                self.states.count(Some(true));
                let handled = Handled::of(&commit, 0);
                self.states.put(
                    key,
                    Entry {
                        unfolded: commit.into_rows().1,
                        ..entry
                    },
                );
                Ok(OnCached::Committed(handled))
            }
            Err(e @ Error::Conflict { .. }) => {
                self.states.put(key, entry);
                Ok(OnCached::Conflict(e))
            }
            Err(e) => {
                self.states.put(key, entry);
                Err(e)
            }
            Ok(AppendedAfter::Unchecked) => {
                self.states.put(key, entry);
                Ok(OnCached::NotTried)
            }
        }
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
