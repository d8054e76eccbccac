//! The engine's loop — read, decide, commit, retry a lost race, the state cache's protocol —
//! written once and expanded twice by [`engine_loop!`]: over a synchronous [`EventLog`] (the
//! engine's `handle`, `start`, `fire`) and over an [`AsyncEventLog`] (`handle_on`, `start_on`,
//! `fire_on`). The two traits name their methods alike, so the one text reads both; each await
//! point is written `step!(mode, …)`, nothing at all in the synchronous expansion.

use super::log::AsyncEventLog;
use super::*;

/// `$e`, awaited in the `async` expansion.
macro_rules! step {
    (sync, $e:expr) => {
        $e
    };
    (async, $e:expr) => {
        $e.await
    };
}

/// The loop's functions for one kind of log: `$mode` is `sync` or `async`, `[$($asyncness)*]` is
/// empty or `async`, `[$($log)+]` the bound of a log, `[$($firer)+]` that of a log timers fire on.
macro_rules! engine_loop {
    (
        $mode:tt, [$($asyncness:tt)*], [$($log:tt)+], [$($firer:tt)+],
        $fire:ident, $start_event:ident, $commit_event:ident, $append:ident,
        $plan_cached:ident, $fold_cached:ident, $commit_on_cached:ident
    ) => {
        impl<W: Workflow> Engine<W> {
            /// Fires `timer` through the loop; a rejected one ends `rejected` (see [`Engine::fire`]).
            pub(super) $($asyncness)* fn $fire<L: $($firer)+ + ?Sized>(
                &self,
                log: &mut L,
                timer: &TimerRow,
                now: Timestamp,
            ) -> Result<Option<Handled>, Error> {
                if timer.fire_at > now {
                    return Err(Error::invalid(
                        "timer",
                        &timer.timer_id,
                        format!("is due at {}, not yet at {now}", timer.fire_at),
                    ));
                }
                let (event, firing) = Firing::of(timer, now)?;
                let workflow_id = timer.timer_id.workflow_id();
                let committed =
                    step!($mode, self.$commit_event(log, workflow_id, event, now, Some(&firing), None));
                match committed {
                    Ok(handled) => Ok(Some(handled)),
                    Err(Error::TimerNotScheduled { .. }) => Ok(None),
                    Err(Error::Rejected {
                        workflow_id,
                        reason,
                    }) => match step!($mode, log.reject_timer(&timer.timer_id, &reason, now)) {
                        Ok(()) | Err(Error::TimerNotScheduled { .. }) => Err(Error::Rejected {
                            workflow_id,
                            reason,
                        }),
                        Err(e) => Err(e),
                    },
                    Err(e) => Err(e),
                }
            }

            /// A workflow's first event, written without reading first.
            pub(super) $($asyncness)* fn $start_event<L: $($log)+ + ?Sized>(
                &self,
                store: &mut L,
                workflow_id: &WorkflowId,
                event: Event,
                now: Timestamp,
                context: Option<&TraceContext>,
            ) -> Result<Handled, Error> {
                // No history: the store's check of the expected seq (0) refuses it if the workflow
                // has events.
                let mut commit = self.plan(&[], workflow_id, event, now)?;
                if let Some(context) = context {
                    commit = commit.traced(context.clone());
                }
                step!($mode, store.append_with_commands(&commit))?;
                Ok(Handled::of(&commit, 0))
            }

            /// Commits `event` (marking `fires` fired), on the cached state first when it can, then
            /// by reading; a lost race tried again up to the engine's bound.
            pub(super) $($asyncness)* fn $commit_event<L: $($log)+ + ?Sized>(
                &self,
                store: &mut L,
                workflow_id: &WorkflowId,
                event: Event,
                now: Timestamp,
                fires: Option<&Firing>,
                context: Option<&TraceContext>,
            ) -> Result<Handled, Error> {
                // Checked before the event is copied for each try: a payload past the limits may
                // nest deeper than a recursive copy survives.
                let event = self.checked(event)?;
                let mut conflicts = 0;
                match step!($mode, self.$commit_on_cached(store, workflow_id, &event, now, fires, context))? {
                    OnCached::Committed(handled) => return Ok(handled),
                    OnCached::Conflict(e) if self.max_conflict_retries == 0 => return Err(e),
                    // The cached state was out of date (another engine wrote since): the next try
                    // reads the workflow, and there is no race to wait out.
                    OnCached::Conflict(_) => conflicts += 1,
                    OnCached::NotTried => {}
                }
                // Races lost on states just read: the store may wait before each new try.
                let mut raced = 0;
                loop {
                    let history = store.history_id();
                    let (planned, folded) =
                        step!($mode, self.$plan_cached(history, workflow_id, event.clone(), now, store))?;
                    let commit = match planned.and_then(|commit| finish(commit, fires, context)) {
                        Ok(commit) => commit,
                        Err(e) => {
                            self.keep(folded);
                            return Err(e);
                        }
                    };
                    match step!($mode, self.$append(store, history, folded.last.as_ref(), &commit)) {
                        Ok(()) => {
                            self.keep_through(folded, &commit, history);
                            return Ok(Handled::of(&commit, conflicts));
                        }
                        Err(Error::Conflict { .. }) if conflicts < self.max_conflict_retries => {
                            self.keep(folded);
                            conflicts += 1;
                            raced += 1;
                            step!($mode, store.before_retry(raced));
                        }
                        Err(e) => {
                            self.keep(folded);
                            return Err(e);
                        }
                    }
                }
            }

            /// Writes `commit`, decided on a state folded up to `last` (none for a new workflow).
            /// While it is not known whether the store of `history` checks the last event itself,
            /// through `append_after`, whose answer tells (then later calls commit on their cached
            /// states without reading); else as a plain commit, whose seq check is all a state just
            /// read needs.
            $($asyncness)* fn $append<L: $($log)+ + ?Sized>(
                &self,
                store: &mut L,
                history: Option<HistoryId>,
                last: Option<&EventRecord>,
                commit: &Commit,
            ) -> Result<(), Error> {
                let unknown = history
                    .filter(|h| self.states.capacity() > 0 && self.states.checks_last(*h).is_none());
                let (Some(history), Some(last)) = (unknown, last) else {
                    return step!($mode, store.append_with_commands(commit));
                };
                let answer = step!($mode, store.append_after(last, commit));
                let checks = !matches!(answer, Ok(AppendedAfter::Unchecked));
                self.states.learn_checks_last(history, checks);
                match answer {
                    Ok(AppendedAfter::Unchecked) => step!($mode, store.append_with_commands(commit)),
                    answer => answer.map(|_| ()),
                }
            }

            /// Folds the workflow (from its cached state when there is a usable one), decides on
            /// `event`, and returns the commit (or why there is none) beside the folded state.
            #[allow(clippy::type_complexity)]
            pub(super) $($asyncness)* fn $plan_cached<L: $($log)+ + ?Sized>(
                &self,
                history: Option<HistoryId>,
                workflow_id: &WorkflowId,
                event: Event,
                now: Timestamp,
                log: &mut L,
            ) -> Result<(Result<Commit, Error>, Folded<W::State>), Error> {
                let event = self.checked(event)?;
                let folded = step!($mode, self.$fold_cached(history, workflow_id, log))?;
                let commit =
                    self.decide_commit(&folded.state, folded.last_seq, workflow_id, event, now);
                Ok((commit, folded))
            }

            /// The state of `workflow_id`: its cached state with the newer events folded in, when
            /// the store still holds the cached state's last event unchanged; else replayed from
            /// the first event.
            $($asyncness)* fn $fold_cached<L: $($log)+ + ?Sized>(
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
                        let from = Seq::new(entry.last.seq.get() - 1)?;
                        let events = step!($mode, log.load_after(workflow_id, from))?;
                        let found = events.first() == Some(&entry.last);
                        self.states.count(Some(found));
                        if found {
                            let mut state = entry.state;
                            let last_seq =
                                fold(&self.workflow, &mut state, entry.last.seq, &events[1..])?;
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
                let events = step!($mode, log.load_after(workflow_id, Seq::ZERO))?;
                let replayed = replay(&self.workflow, &events)?;
                Ok(Folded {
                    state: replayed.state,
                    last_seq: replayed.last_seq,
                    key,
                    last: events.into_iter().last(),
                })
            }

            /// The commit of `event` decided on the cached state of `workflow_id`, without reading
            /// the workflow first: the store checks in its commit that the cached state's last
            /// event is still the workflow's last (`append_after`). On success the state is kept
            /// with the new event, folded when the state is next used (the workflow's code runs
            /// before a commit, never after it). Tried only with a cached state and a store known
            /// to check (a commit through the reading path finds that out); a conflict leaves the
            /// cached state to the reading path, which folds what came after it.
            $($asyncness)* fn $commit_on_cached<L: $($log)+ + ?Sized>(
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
                match step!($mode, store.append_after(&entry.last, &commit)) {
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
        }
    };
}

engine_loop!(
    sync,
    [],
    [EventLog],
    [EventLog + Timers],
    fire_sync,
    start_sync,
    commit_sync,
    append_sync,
    plan_sync,
    fold_sync,
    commit_on_cached_sync
);
engine_loop!(
    async, [async], [AsyncEventLog], [AsyncEventLog],
    fire_async, start_async, commit_async, append_async, plan_async, fold_async,
    commit_on_cached_async
);
