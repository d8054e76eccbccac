//! An in-memory [`Store`]: for tests, simulations and the browser.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::error::Error;
use crate::id::{CommandId, Seq, WorkflowId};
use crate::model::EventRecord;
use crate::outbox::{ClaimOrder, ClaimRequest, Delivery, Failure, OutboxRow, Settled, Status};
use crate::retry::RetryPolicy;
use crate::store::{Commit, Store};
use crate::time::Timestamp;
use crate::timer::{feedback, TimerId, TimerRow};

/// A [`Store`] in memory. Every operation applies completely or not at all, like a transaction.
///
/// ```
/// use miniflow_core::{Command, Commit, Decision, Event, MemoryStore, Seq, Store, Timestamp, WorkflowId};
/// use serde_json::json;
///
/// let mut store = MemoryStore::new();
/// let now = Timestamp::from_millis(0);
/// let trip = WorkflowId::new("trip-001")?;
/// let decision = Decision::new().command(Command::new("lock_budget", json!({})));
/// let event = Event::new("trip_requested", json!({}));
/// store.append_with_commands(&Commit::new(trip, Seq::ZERO, event, decision, now)?)?;
/// assert_eq!(store.pending(10)?.len(), 1);
/// # Ok::<(), miniflow_core::Error>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct MemoryStore {
    events: BTreeMap<WorkflowId, Vec<EventRecord>>,
    outbox: BTreeMap<CommandId, OutboxRow>,
    /// The unfinished (pending or leased) rows: the in-memory twin of a partial index.
    unfinished: BTreeSet<CommandId>,
    timers: BTreeMap<TimerId, TimerRow>,
    poisoned_kinds: Vec<String>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Fault injection for tests: every later commit that carries a command of `kind` fails after its
    /// events were staged, as a disk error would, so tests can prove that nothing of it is kept.
    pub fn fail_commits_with_command_kind(&mut self, kind: impl Into<String>) {
        self.poisoned_kinds.push(kind.into());
    }

    fn last_seq(&self, workflow_id: &WorkflowId) -> Seq {
        self.events
            .get(workflow_id)
            .and_then(|events| events.last())
            .map_or(Seq::ZERO, |e| e.seq)
    }

    fn row_mut(&mut self, command_id: &CommandId) -> Result<&mut OutboxRow, Error> {
        self.outbox
            .get_mut(command_id)
            .ok_or_else(|| Error::UnknownCommand {
                command_id: command_id.clone(),
            })
    }

    /// Applies `change` at `now` to one row, keeps the unfinished index true and schedules the
    /// row's failure feedback. A failed change leaves the row as it was.
    fn update<T>(
        &mut self,
        command_id: &CommandId,
        now: Timestamp,
        change: impl FnOnce(&mut OutboxRow) -> Result<T, Error>,
    ) -> Result<T, Error> {
        let row = self.row_mut(command_id)?;
        let mut next = row.clone();
        let out = change(&mut next)?;
        let unfinished = next.status.is_unfinished();
        let feedback = feedback(row, &next, now);
        *row = next;
        if let Some(timer) = feedback {
            self.timers.insert(timer.timer_id.clone(), timer);
        }
        if unfinished {
            self.unfinished.insert(command_id.clone());
        } else {
            self.unfinished.remove(command_id);
        }
        Ok(out)
    }

    /// The timer rows `commit` changes or adds: the one it fires, the ones it cancels, the new ones.
    fn stage_timers(&self, commit: &Commit) -> Result<Vec<TimerRow>, Error> {
        let mut staged = Vec::new();
        if let Some(id) = commit.fires() {
            let mut timer =
                self.timers
                    .get(id)
                    .cloned()
                    .ok_or_else(|| Error::TimerNotScheduled {
                        timer_id: id.to_string(),
                        status: "unknown",
                    })?;
            timer.fire(commit.now())?;
            staged.push(timer);
        }
        for timer in self.timers.values() {
            let cancels = timer.timer_id.workflow_id() == commit.workflow_id()
                && commit.cancel_timers().contains(&timer.name);
            let mut timer = timer.clone();
            if cancels && timer.cancel(commit.now()) {
                staged.push(timer);
            }
        }
        for timer in commit.timers() {
            if self.timers.contains_key(&timer.timer_id) {
                return Err(Error::Corrupt(format!(
                    "timer {} exists without its event",
                    timer.timer_id
                )));
            }
            staged.push(timer.clone());
        }
        Ok(staged)
    }

    /// The claimable rows for `request` at `now`, in claim order.
    fn claimable(&self, request: &ClaimRequest, now: Timestamp) -> Vec<CommandId> {
        let mut due: Vec<&OutboxRow> = Vec::new();
        let mut previous_workflow: Option<&WorkflowId> = None;
        for id in &self.unfinished {
            let first_of_workflow = previous_workflow != Some(id.workflow_id());
            previous_workflow = Some(id.workflow_id());
            if request.order == ClaimOrder::StrictPerWorkflow && !first_of_workflow {
                continue;
            }
            let row = &self.outbox[id];
            if row.is_claimable(now) {
                due.push(row);
            }
        }
        due.sort_by(|a, b| (a.available_at, &a.command_id).cmp(&(b.available_at, &b.command_id)));
        due.into_iter().map(|row| row.command_id.clone()).collect()
    }
}

impl Store for MemoryStore {
    fn load(&self, workflow_id: &WorkflowId) -> Result<Vec<EventRecord>, Error> {
        Ok(self.events.get(workflow_id).cloned().unwrap_or_default())
    }

    fn append_with_commands(&mut self, commit: &Commit) -> Result<(), Error> {
        let actual = self.last_seq(commit.workflow_id());
        if actual != commit.expected_seq() {
            return Err(commit.conflict(actual));
        }
        // Stage everything first; the store changes only once nothing can fail any more.
        let mut staged_events = self.load(commit.workflow_id())?;
        staged_events.extend_from_slice(commit.events());
        let mut staged_rows = Vec::with_capacity(commit.commands().len());
        for row in commit.commands() {
            if self.poisoned_kinds.contains(&row.kind) {
                return Err(Error::Storage(
                    format!("injected failure writing command {}", row.command_id).into(),
                ));
            }
            if self.outbox.contains_key(&row.command_id) {
                return Err(Error::Corrupt(format!(
                    "command {} exists without its event",
                    row.command_id
                )));
            }
            staged_rows.push(row.clone());
        }
        let staged_timers = self.stage_timers(commit)?;
        self.events
            .insert(commit.workflow_id().clone(), staged_events);
        for row in staged_rows {
            self.unfinished.insert(row.command_id.clone());
            self.outbox.insert(row.command_id.clone(), row);
        }
        for timer in staged_timers {
            self.timers.insert(timer.timer_id.clone(), timer);
        }
        Ok(())
    }

    fn pending(&self, limit: usize) -> Result<Vec<OutboxRow>, Error> {
        Ok(self
            .unfinished
            .iter()
            .take(limit)
            .map(|id| self.outbox[id].clone())
            .collect())
    }

    fn command(&self, command_id: &CommandId) -> Result<Option<OutboxRow>, Error> {
        Ok(self.outbox.get(command_id).cloned())
    }

    fn commands(&self, workflow_id: &WorkflowId) -> Result<Vec<OutboxRow>, Error> {
        Ok(self
            .outbox
            .values()
            .filter(|row| row.command_id.workflow_id() == workflow_id)
            .cloned()
            .collect())
    }

    fn mark_done(&mut self, command_id: &CommandId, now: Timestamp) -> Result<(), Error> {
        self.update(command_id, now, |row| row.mark_done(now))
    }

    fn claim(&mut self, request: &ClaimRequest, now: Timestamp) -> Result<Vec<Delivery>, Error> {
        request.validate()?;
        let mut deliveries = Vec::new();
        for id in self.claimable(request, now) {
            if deliveries.len() == request.limit {
                break;
            }
            if let Some(delivery) = self.update(&id, now, |row| Ok(row.claim(request, now)))? {
                deliveries.push(delivery);
            }
        }
        Ok(deliveries)
    }

    fn extend(
        &mut self,
        command_id: &CommandId,
        token: u64,
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Timestamp, Error> {
        self.update(command_id, now, |row| row.extend(token, ttl, now))
    }

    fn release(&mut self, command_id: &CommandId, token: u64, now: Timestamp) -> Result<(), Error> {
        self.update(command_id, now, |row| row.release(token, now))
    }

    fn complete(
        &mut self,
        command_id: &CommandId,
        token: u64,
        now: Timestamp,
    ) -> Result<(), Error> {
        self.update(command_id, now, |row| row.complete(token, now))
    }

    fn fail(
        &mut self,
        command_id: &CommandId,
        token: u64,
        failure: &Failure,
        policy: &RetryPolicy,
        now: Timestamp,
    ) -> Result<Settled, Error> {
        self.update(command_id, now, |row| row.fail(token, failure, policy, now))
    }

    fn purge_done(
        &mut self,
        older_than: Duration,
        now: Timestamp,
        batch: usize,
    ) -> Result<usize, Error> {
        let purgeable: Vec<CommandId> = self
            .outbox
            .values()
            .filter(|row| row.is_purgeable(older_than, now))
            .take(batch)
            .map(|row| row.command_id.clone())
            .collect();
        for id in &purgeable {
            self.outbox.remove(id);
        }
        Ok(purgeable.len())
    }

    fn claim_timers(
        &mut self,
        limit: usize,
        lease_ttl: Duration,
        now: Timestamp,
    ) -> Result<Vec<TimerRow>, Error> {
        let mut due: Vec<&TimerRow> = self.timers.values().filter(|t| t.is_due(now)).collect();
        due.sort_by(|a, b| (a.available_at, &a.timer_id).cmp(&(b.available_at, &b.timer_id)));
        let ids: Vec<TimerId> = due
            .into_iter()
            .take(limit)
            .map(|t| t.timer_id.clone())
            .collect();
        let mut taken = Vec::with_capacity(ids.len());
        for id in ids {
            if let Some(timer) = self.timers.get_mut(&id) {
                timer.take(lease_ttl, now);
                taken.push(timer.clone());
            }
        }
        Ok(taken)
    }

    fn timers(&self, workflow_id: &WorkflowId) -> Result<Vec<TimerRow>, Error> {
        Ok(self
            .timers
            .values()
            .filter(|t| t.timer_id.workflow_id() == workflow_id)
            .cloned()
            .collect())
    }

    fn dead_letters(&self, limit: usize) -> Result<Vec<OutboxRow>, Error> {
        Ok(self
            .outbox
            .values()
            .filter(|row| row.status == Status::Dead)
            .take(limit)
            .cloned()
            .collect())
    }

    fn retry(&mut self, command_id: &CommandId, now: Timestamp) -> Result<(), Error> {
        self.update(command_id, now, |row| row.retry(now))
    }

    fn resolve(&mut self, command_id: &CommandId, note: &str, now: Timestamp) -> Result<(), Error> {
        self.update(command_id, now, |row| row.resolve(note, now))
    }
}
