//! An in-memory [`Store`](crate::Store): for tests, simulations and the browser.

mod index;
#[cfg(test)]
mod index_tests;

use serde_json::Value;
use std::collections::BTreeMap;
use std::time::Duration;

use index::{ClaimIndex, TimerIndex, TimerKey};

use crate::claim::{ClaimStep, ClaimWalk, Offer};
use crate::control::{check_bulk, Admission, KindChange, KindControl};
use crate::error::Error;
use crate::id::{CommandId, Seq, WorkflowId};
use crate::memory::index::PageKey;
use crate::model::EventRecord;
use crate::outbox::{feedback, withdrawn_feedback};
use crate::outbox::{Cancelled, ClaimRequest, Delivery, Extended, Failure, OutboxRow, Settled};
use crate::retry::RetryPolicy;
use crate::stats::OutboxStats;
use crate::status::Status;
use crate::store::{AppendedAfter, Commit, EventLog, HistoryId, Operations, Outbox, Timers};
use crate::time::Timestamp;
use crate::timer::{TimerId, TimerRow};

/// A [`Store`](crate::Store) in memory. Every operation applies completely or not at all, like a transaction.
///
/// Claims read an index of the unfinished commands in claim order, as a SQL store reads its partial
/// index: a claim of `limit` commands costs O(limit · log n) however long the backlog, in strict
/// per-workflow order too (the first unfinished command of each workflow is indexed apart). Due timers
/// are indexed the same way.
///
/// ```
/// use miniflow_core::prelude::*;
/// use miniflow_core::{Command, Commit, Decision, Event, MemoryStore, Seq, Timestamp, WorkflowId};
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
    /// The unfinished (pending or leased) rows in claim order: the in-memory twin of a partial index.
    unfinished: ClaimIndex,
    /// Every timer, by the text of its ID (the order timer IDs sort in).
    timers: BTreeMap<TimerKey, TimerRow>,
    /// The scheduled timers, in due order.
    scheduled: TimerIndex,
    /// The operators' controls, sorted by kind (few kinds have one; a vector spares the web module
    /// a map's code).
    controls: Vec<KindControl>,
    poisoned_kinds: Vec<String>,
    history: OwnHistory,
}

/// The [`HistoryId`] of one store: a clone goes its own way from the moment it is made, so it gets
/// an ID of its own.
#[derive(Debug)]
struct OwnHistory(HistoryId);

impl Default for OwnHistory {
    fn default() -> Self {
        Self(HistoryId::unique())
    }
}

impl Clone for OwnHistory {
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// The whole store as versioned JSON text, to keep it across restarts (e.g. in a browser's
    /// `localStorage`). [`MemoryStore::from_snapshot`] reads it back.
    pub fn export_snapshot(&self) -> String {
        let snapshot = SnapshotRef {
            format: SNAPSHOT_FORMAT,
            version: SNAPSHOT_VERSION,
            events: self.events.values().flatten().collect(),
            outbox: self.outbox.values().collect(),
            timers: self.timers.values().collect(),
            controls: self.controls.iter().collect(),
        };
        serde_json::to_string(&snapshot).unwrap_or_default()
    }

    /// A store from [`MemoryStore::export_snapshot`]'s text.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] (field `snapshot`) when the text is not a miniflow snapshot, comes from a
    /// newer version, or breaks an invariant (a seq gap, a command without its event).
    ///
    /// ```
    /// use miniflow_core::MemoryStore;
    ///
    /// let copy = MemoryStore::from_snapshot(&MemoryStore::new().export_snapshot())?;
    /// assert!(MemoryStore::from_snapshot(r#"{"format":"miniflow.memory-store","version":99}"#).is_err());
    /// # Ok::<(), miniflow_core::Error>(())
    /// ```
    pub fn from_snapshot(text: &str) -> Result<Self, Error> {
        let invalid = |reason: String| Error::invalid("snapshot", abbreviate(text), reason);
        let header: SnapshotHeader = serde_json::from_str(text)
            .map_err(|e| invalid(format!("is not a miniflow snapshot: {e}")))?;
        Self::check_snapshot_header(&header.format, u64::from(header.version)).map_err(invalid)?;
        let snapshot: Snapshot =
            serde_json::from_str(text).map_err(|e| invalid(format!("is malformed: {e}")))?;
        Self::from_rows(
            snapshot.events,
            snapshot.outbox,
            snapshot.timers,
            snapshot.controls,
        )
        .map_err(invalid)
    }

    /// Why a snapshot with this `format` and `version` cannot be read, if it cannot: for a host that
    /// reads a snapshot's JSON itself (the JS package, with `JSON.parse`) before
    /// [`MemoryStore::from_snapshot_rows`].
    ///
    /// # Errors
    ///
    /// The reason, for an `InvalidInput` error naming the snapshot: another format, or a version newer
    /// than this miniflow reads.
    pub fn check_snapshot_header(format: &str, version: u64) -> Result<(), String> {
        if format != SNAPSHOT_FORMAT {
            return Err(format!(
                "has format {format:?}, expected {SNAPSHOT_FORMAT:?}"
            ));
        }
        if version > u64::from(SNAPSHOT_VERSION) {
            return Err(format!(
                "has version {version}, newer than this miniflow reads ({SNAPSHOT_VERSION}): upgrade miniflow"
            ));
        }
        Ok(())
    }

    /// A store from the rows and the operators' controls of a snapshot a host read itself (after
    /// [`MemoryStore::check_snapshot_header`]; a version 1 snapshot has no controls), checked as
    /// [`MemoryStore::from_snapshot`] checks them.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] (field `snapshot`) when the rows break an invariant (a seq gap, a
    /// command without its event).
    pub fn from_snapshot_rows(
        events: Vec<EventRecord>,
        outbox: Vec<OutboxRow>,
        timers: Vec<TimerRow>,
        controls: Vec<KindControl>,
    ) -> Result<Self, Error> {
        Self::from_rows(events, outbox, timers, controls)
            .map_err(|reason| Error::invalid("snapshot", "(rows)", reason))
    }

    fn from_rows(
        events: Vec<EventRecord>,
        outbox: Vec<OutboxRow>,
        timers: Vec<TimerRow>,
        controls: Vec<KindControl>,
    ) -> Result<Self, String> {
        let mut store = MemoryStore::new();
        for event in events {
            if event.seq.get() != store.last_seq(&event.workflow_id).get() + 1 {
                return Err(format!(
                    "event {} of {} is out of order",
                    event.seq, event.workflow_id
                ));
            }
            match store.events.get_mut(&event.workflow_id) {
                Some(events) => events.push(event),
                None => {
                    store.events.insert(event.workflow_id.clone(), vec![event]);
                }
            }
        }
        for row in outbox {
            let id = &row.command_id;
            if store.last_seq(id.workflow_id()) < id.event_seq() {
                return Err(format!("command {id} has no event"));
            }
            store.unfinished.put(&row);
            store.outbox.insert(id.clone(), row);
        }
        for timer in timers {
            store.put_timer(timer);
        }
        for control in controls {
            store.put_control(control);
        }
        Ok(store)
    }

    /// The timer `timer_id`, if this store has it.
    pub fn timer(&self, timer_id: &TimerId) -> Option<&TimerRow> {
        self.timers.get(timer_id.to_string().as_str())
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

    /// Applies `change` (one of [`OutboxRow`]'s rules) at `now` to one row in place, keeps the
    /// indexes true and schedules the row's feedback ([`feedback`], as [`OutboxRow::change`] does).
    ///
    /// The rules check before they change anything, so a failed change leaves the row as it was
    /// (debug builds check it); this spares a copy of the row, payload and all, on every change.
    fn update<T>(
        &mut self,
        command_id: &CommandId,
        now: Timestamp,
        change: impl FnOnce(&mut OutboxRow) -> Result<T, Error>,
    ) -> Result<T, Error> {
        let row = self
            .outbox
            .get_mut(command_id)
            .ok_or_else(|| Error::UnknownCommand {
                command_id: command_id.clone(),
            })?;
        let before = row.status;
        #[cfg(debug_assertions)]
        let original = row.clone();
        let value = match change(row) {
            Ok(value) => value,
            Err(error) => {
                #[cfg(debug_assertions)]
                assert_eq!(*row, original, "a rule changed a row, then failed: {error}");
                return Err(error);
            }
        };
        self.changed(command_id, before, now);
        Ok(value)
    }

    /// What follows a change of the row `command_id` from status `before` at `now`: the indexes
    /// kept true, its feedback scheduled and the feedback it withdraws cancelled. Not generic, so
    /// that it is compiled once rather than with every rule (the web module's size).
    #[inline(never)]
    fn changed(&mut self, command_id: &CommandId, before: Status, now: Timestamp) {
        let Some(row) = self.outbox.get(command_id) else {
            return;
        };
        let feedback = feedback(before, row, now);
        let withdrawn = withdrawn_feedback(before, row);
        self.unfinished.put(row);
        if let Some(timer) = feedback {
            self.put_timer(timer);
        }
        if let Some(timer_id) = withdrawn {
            self.cancel_timer(&timer_id, now);
        }
    }

    /// Cancels the timer `timer_id` at `now` if it is still scheduled.
    fn cancel_timer(&mut self, timer_id: &TimerId, now: Timestamp) {
        let key: TimerKey = timer_id.to_string().into();
        if let Some(mut timer) = self.timers.get(&key).cloned() {
            if timer.cancel(now) {
                self.put_timer(timer);
            }
        }
    }

    /// Writes a timer row, new or changed, and keeps the timer index true.
    fn put_timer(&mut self, timer: TimerRow) {
        let key: TimerKey = timer.timer_id.to_string().into();
        let before = self.timers.get(&key);
        self.scheduled.put(&key, before, &timer);
        self.timers.insert(key, timer);
    }

    /// The timer rows `commit` changes or adds: the one it fires, the ones it cancels, the new ones.
    fn stage_timers(&self, commit: &Commit) -> Result<Vec<TimerRow>, Error> {
        let mut staged = Vec::new();
        if let Some(id) = commit.fires() {
            let mut timer = self
                .timers
                .get(id.to_string().as_str())
                .cloned()
                .ok_or_else(|| Error::TimerNotScheduled {
                    timer_id: id.to_string(),
                    status: "unknown",
                })?;
            timer.fire(commit.now())?;
            staged.push(timer);
        }
        if !commit.cancel_timers().is_empty() {
            // The timer this commit fires is fired, not cancelled, even if its decision cancels its name.
            // Every timer ID of a workflow starts with `{workflow_id}:` (some of another workflow
            // whose ID starts so too: the filter drops them).
            let prefix: TimerKey = format!("{}:", commit.workflow_id()).into();
            let cancelled = self
                .timers
                .range(prefix.clone()..)
                .take_while(|(key, _)| key.starts_with(&*prefix))
                .map(|(_, timer)| timer)
                .filter(|timer| {
                    timer.timer_id.workflow_id() == commit.workflow_id()
                        && commit.fires() != Some(&timer.timer_id)
                        && commit.cancel_timers().contains(&timer.name)
                });
            for timer in cancelled {
                let mut timer = timer.clone();
                if timer.cancel(commit.now()) {
                    staged.push(timer);
                }
            }
        }
        for timer in commit.timers() {
            if self
                .timers
                .contains_key(timer.timer_id.to_string().as_str())
            {
                return Err(Error::Corrupt(format!(
                    "timer {} exists without its event",
                    timer.timer_id
                )));
            }
            staged.push(timer.clone());
        }
        Ok(staged)
    }

    /// The unfinished rows of the commit's workflow that it cancels, with the cancellation applied.
    fn stage_cancels(&self, commit: &Commit) -> Vec<OutboxRow> {
        if commit.cancel_commands().is_empty() {
            return Vec::new();
        }
        self.unfinished
            .of_workflow(commit.workflow_id())
            .filter_map(|id| self.outbox.get(id))
            .filter(|row| commit.cancels(row))
            .filter_map(|row| {
                let mut row = row.clone();
                (row.cancel(commit.now()) != Cancelled::Unchanged).then_some(row)
            })
            .collect()
    }

    /// Where the control of `kind` is in `controls`, or where it would go.
    fn control_index(&self, kind: &str) -> Result<usize, usize> {
        self.controls
            .binary_search_by(|control| control.kind.as_str().cmp(kind))
    }

    /// Writes a control, replacing the kind's earlier one.
    fn put_control(&mut self, control: KindControl) {
        match self.control_index(&control.kind) {
            Ok(index) => self.controls[index] = control,
            Err(index) => self.controls.insert(index, control),
        }
    }

    /// What the operators' controls let a claim at `now` take: the active controls, with the
    /// unexpired leases of each limited kind counted ([`OutboxRow::holds_lease`]). Counting reads
    /// the unfinished rows, only when a kind is limited.
    fn admission(&self, now: Timestamp) -> Admission {
        let mut admission = Admission::new(&self.controls);
        if admission.limited_kinds().next().is_none() {
            return admission;
        }
        // The limited kinds come sorted, each once: a vector searched by kind (a map would add a
        // B-tree instance to the wasm module).
        let mut leases: Vec<(String, u64)> = admission
            .limited_kinds()
            .map(|kind| (kind.to_owned(), 0))
            .collect();
        for row in self.unfinished.ids().filter_map(|id| self.outbox.get(id)) {
            if let Ok(index) = leases.binary_search_by(|(kind, _)| kind.as_str().cmp(&row.kind)) {
                leases[index].1 += u64::from(row.holds_lease(now));
            }
        }
        for (kind, count) in &leases {
            admission.leased(kind, *count);
        }
        admission
    }

    /// The first `batch` dead commands of `kind`, in command ID order.
    fn dead_ids(&self, kind: &str, batch: usize) -> Vec<CommandId> {
        self.outbox
            .values()
            .filter(|row| row.status == Status::Dead && row.kind == kind)
            .take(batch)
            .map(|row| row.command_id.clone())
            .collect()
    }
}

const SNAPSHOT_FORMAT: &str = "miniflow.memory-store";
/// 2: rows carry their priority, and the operators' controls are kept. Version 1 still reads.
const SNAPSHOT_VERSION: u32 = 2;

#[derive(serde::Serialize)]
struct SnapshotRef<'a> {
    format: &'static str,
    version: u32,
    events: Vec<&'a EventRecord>,
    outbox: Vec<&'a OutboxRow>,
    timers: Vec<&'a TimerRow>,
    controls: Vec<&'a KindControl>,
}

#[derive(serde::Deserialize)]
struct SnapshotHeader {
    format: String,
    version: u32,
}

#[derive(serde::Deserialize)]
struct Snapshot {
    events: Vec<EventRecord>,
    outbox: Vec<OutboxRow>,
    timers: Vec<TimerRow>,
    #[serde(default)]
    controls: Vec<KindControl>,
}

/// The start of a long text, for error messages.
fn abbreviate(text: &str) -> String {
    match text.char_indices().nth(60) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_owned(),
    }
}

impl EventLog for MemoryStore {
    fn load(&self, workflow_id: &WorkflowId) -> Result<Vec<EventRecord>, Error> {
        Ok(self.events.get(workflow_id).cloned().unwrap_or_default())
    }
    fn load_after(&self, workflow_id: &WorkflowId, after: Seq) -> Result<Vec<EventRecord>, Error> {
        // Events are kept gapless from seq 1, so event `n` is at index `n - 1`.
        let events = self.events.get(workflow_id).map_or(&[][..], Vec::as_slice);
        let from = usize::try_from(after.get()).unwrap_or(usize::MAX);
        Ok(events.get(from..).map(<[_]>::to_vec).unwrap_or_default())
    }
    fn history_id(&self) -> Option<HistoryId> {
        Some(self.history.0)
    }
    fn append_with_commands(&mut self, commit: &Commit) -> Result<(), Error> {
        let staged = self.stage(commit)?;
        self.apply(
            staged,
            commit.workflow_id(),
            commit.events().to_vec(),
            commit.commands().to_vec(),
        );
        Ok(())
    }
    fn append_after(
        &mut self,
        last: &EventRecord,
        commit: &Commit,
    ) -> Result<AppendedAfter, Error> {
        commit.check_follows(last)?;
        let found = self.events.get(commit.workflow_id()).and_then(|e| e.last());
        if found != Some(last) {
            return Err(commit.conflict(self.last_seq(commit.workflow_id())));
        }
        self.append_with_commands(commit)?;
        Ok(AppendedAfter::Written)
    }
}

/// What a commit changes besides its own events and commands, staged before anything is written.
struct Staged {
    timers: Vec<TimerRow>,
    cancels: Vec<OutboxRow>,
}

impl MemoryStore {
    /// Writes `commit` as [`EventLog::append_with_commands`] does, moving its rows into the store
    /// instead of copying them (payloads and all).
    ///
    /// # Errors
    ///
    /// As [`EventLog::append_with_commands`]; nothing is written.
    pub fn append(&mut self, commit: Commit) -> Result<(), Error> {
        let staged = self.stage(&commit)?;
        let (workflow_id, events, commands) = commit.into_rows();
        self.apply(staged, &workflow_id, events, commands);
        Ok(())
    }

    /// Checks `commit` against the store and stages what it changes besides its own rows; the
    /// store changes only once nothing can fail any more.
    fn stage(&self, commit: &Commit) -> Result<Staged, Error> {
        let actual = self.last_seq(commit.workflow_id());
        if actual != commit.expected_seq() {
            return Err(commit.conflict(actual));
        }
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
        }
        Ok(Staged {
            timers: self.stage_timers(commit)?,
            cancels: self.stage_cancels(commit),
        })
    }

    /// Writes a staged commit: its events, its commands, the rows it cancels, its timers.
    fn apply(
        &mut self,
        staged: Staged,
        workflow_id: &WorkflowId,
        events: Vec<EventRecord>,
        commands: Vec<OutboxRow>,
    ) {
        match self.events.get_mut(workflow_id) {
            Some(log) => log.extend(events),
            None => {
                self.events.insert(workflow_id.clone(), events);
            }
        }
        for row in staged.cancels.into_iter().chain(commands) {
            self.unfinished.put(&row);
            self.outbox.insert(row.command_id.clone(), row);
        }
        for timer in staged.timers {
            self.put_timer(timer);
        }
    }
}

impl Outbox for MemoryStore {
    fn pending(&self, limit: usize) -> Result<Vec<OutboxRow>, Error> {
        Ok(self
            .unfinished
            .ids()
            .filter_map(|id| self.outbox.get(id).cloned())
            .take(limit)
            .collect())
    }
    fn command(&self, command_id: &CommandId) -> Result<Option<OutboxRow>, Error> {
        Ok(self.outbox.get(command_id).cloned())
    }
    fn commands(&self, workflow_id: &WorkflowId) -> Result<Vec<OutboxRow>, Error> {
        let Ok(first) = CommandId::new(workflow_id.clone(), Seq::ONE, 0) else {
            return Ok(Vec::new());
        };
        Ok(self
            .outbox
            .range(first..)
            .map(|(_, row)| row)
            .take_while(|row| row.command_id.workflow_id() == workflow_id)
            .cloned()
            .collect())
    }
    fn mark_done(&mut self, command_id: &CommandId, now: Timestamp) -> Result<(), Error> {
        self.update(command_id, now, |row| row.mark_done(now))
    }
    /// The core's claim walk ([`ClaimWalk`]) over the claim index's pages, like every store: what
    /// the claim buries on the way (a lease that ran out on its last attempt, a cancelled command)
    /// does not count towards the limit, and in strict order the next command of its workflow
    /// waits for the next claim.
    fn claim(&mut self, request: &ClaimRequest, now: Timestamp) -> Result<Vec<Delivery>, Error> {
        request.validate()?;
        let mut walk: ClaimWalk<'_, PageKey, CommandId> =
            ClaimWalk::new(request, self.admission(now), now);
        let mut deliveries = Vec::new();
        loop {
            let page = match walk.next_step() {
                ClaimStep::Done => return Ok(deliveries),
                ClaimStep::FindPriority { below } => {
                    let level = self.unfinished.priority_below(below);
                    walk.at_priority(level);
                    continue;
                }
                // The kinds the controls exclude are offered too, and the walk skips them: a
                // lookup per row, where a SQL store filters in its query.
                ClaimStep::ReadPage(page) => {
                    self.unfinished
                        .page(request.order, page.priority, page.after, now, page.limit)
                }
            };
            let rows = page.len();
            for key in &page {
                let id = &key.1;
                let Some(row) = self.outbox.get_mut(id) else {
                    continue;
                };
                if walk.offer(key.clone(), id, id.workflow_id().as_str(), Some(row)) == Offer::Claim
                {
                    // The rule changes the row in place; its indexes and feedback follow.
                    let before = row.status;
                    if let Some(delivery) = walk.claim(row) {
                        deliveries.push(delivery);
                    }
                    self.changed(id, before, now);
                }
            }
            walk.page_read(rows);
        }
    }
    fn extend(
        &mut self,
        command_id: &CommandId,
        token: u64,
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Extended, Error> {
        self.update(command_id, now, |row| row.extend(token, ttl, now))
    }
    /// Every lease by the core's rule, in one call that no other operation interleaves with.
    fn extend_all(
        &mut self,
        leases: &[(CommandId, u64)],
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Vec<Result<Extended, Error>>, Error> {
        Ok(leases
            .iter()
            .map(|(id, token)| self.update(id, now, |row| row.extend(*token, ttl, now)))
            .collect())
    }
    fn release(&mut self, command_id: &CommandId, token: u64, now: Timestamp) -> Result<(), Error> {
        self.update(command_id, now, |row| row.release(token, now))
    }
    fn complete(
        &mut self,
        command_id: &CommandId,
        token: u64,
        result: Option<&Value>,
        now: Timestamp,
    ) -> Result<(), Error> {
        self.update(command_id, now, |row| row.complete(token, result, now))
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
}

impl Timers for MemoryStore {
    fn claim_timers(
        &mut self,
        limit: usize,
        lease_ttl: Duration,
        now: Timestamp,
    ) -> Result<Vec<TimerRow>, Error> {
        let due = self.scheduled.due(now, limit);
        let mut taken = Vec::with_capacity(due.len());
        for key in due {
            if let Some(mut timer) = self.timers.get(&key).cloned() {
                timer.take(lease_ttl, now);
                taken.push(timer.clone());
                self.put_timer(timer);
            }
        }
        Ok(taken)
    }
    fn any_timer_due(&self, now: Timestamp) -> Result<bool, Error> {
        Ok(self.scheduled.any_due(now))
    }
    fn reject_timer(
        &mut self,
        timer_id: &TimerId,
        reason: &str,
        now: Timestamp,
    ) -> Result<(), Error> {
        let mut timer = self
            .timers
            .get(timer_id.to_string().as_str())
            .cloned()
            .ok_or_else(|| Error::TimerNotScheduled {
                timer_id: timer_id.to_string(),
                status: "unknown",
            })?;
        timer.reject(reason, now)?;
        self.put_timer(timer);
        Ok(())
    }
    fn timers(&self, workflow_id: &WorkflowId) -> Result<Vec<TimerRow>, Error> {
        Ok(self
            .timers
            .values()
            .filter(|t| t.timer_id.workflow_id() == workflow_id)
            .cloned()
            .collect())
    }
}

impl Operations for MemoryStore {
    fn purge_done(
        &mut self,
        older_than: Duration,
        now: Timestamp,
        batch: usize,
    ) -> Result<usize, Error> {
        crate::backend::check_purge_batch(batch)?;
        // The oldest first, then by command ID: the order a store indexed on `processed_at` reads.
        // Only the first `batch` in that order are kept, sorted, as the rows go by.
        let mut oldest: Vec<(Option<Timestamp>, &CommandId)> = Vec::new();
        for row in self.outbox.values() {
            if !row.is_purgeable(older_than, now) {
                continue;
            }
            let key = row.purge_order();
            if oldest.len() == batch && oldest.last().is_none_or(|last| key >= *last) {
                continue;
            }
            let at = oldest.binary_search(&key).unwrap_or_else(|at| at);
            oldest.insert(at, key);
            oldest.truncate(batch);
        }
        let purgeable: Vec<CommandId> = oldest.into_iter().map(|(_, id)| id.clone()).collect();
        for id in &purgeable {
            self.outbox.remove(id);
        }
        Ok(purgeable.len())
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
    fn stats(&self, now: Timestamp) -> Result<OutboxStats, Error> {
        let mut stats = OutboxStats::new(now);
        let unfinished = self.unfinished.ids().filter_map(|id| self.outbox.get(id));
        let dead = self
            .outbox
            .values()
            .filter(|row| row.status == Status::Dead);
        for row in unfinished.chain(dead) {
            stats.count(row);
        }
        for timer in self.scheduled.iter().filter_map(|key| self.timers.get(key)) {
            stats.timers.count(timer, now);
        }
        Ok(stats.with_controls(self.controls.iter().cloned()))
    }
    fn kind_controls(&self) -> Result<Vec<KindControl>, Error> {
        Ok(self.controls.clone())
    }
    fn control_kind(
        &mut self,
        kind: &str,
        change: KindChange,
        by: &str,
        now: Timestamp,
    ) -> Result<KindControl, Error> {
        let current = self.control_index(kind).ok().map(|i| &self.controls[i]);
        let control = KindControl::change(current, kind, change, by, now)?;
        self.put_control(control.clone());
        Ok(control)
    }
    fn dead_letters_of_kind(&self, kind: &str, limit: usize) -> Result<Vec<OutboxRow>, Error> {
        crate::check_kind("kind", kind)?;
        Ok(self
            .outbox
            .values()
            .filter(|row| row.status == Status::Dead && row.kind == kind)
            .take(limit)
            .cloned()
            .collect())
    }
    fn retry_dead_of_kind(
        &mut self,
        kind: &str,
        batch: usize,
        now: Timestamp,
    ) -> Result<Vec<CommandId>, Error> {
        check_bulk(kind, batch)?;
        let ids = self.dead_ids(kind, batch);
        for id in &ids {
            self.update(id, now, |row| row.retry(now))?;
        }
        Ok(ids)
    }
    fn resolve_dead_of_kind(
        &mut self,
        kind: &str,
        note: &str,
        batch: usize,
        now: Timestamp,
    ) -> Result<Vec<CommandId>, Error> {
        check_bulk(kind, batch)?;
        let ids = self.dead_ids(kind, batch);
        for id in &ids {
            self.update(id, now, |row| row.resolve(note, now))?;
        }
        Ok(ids)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Command, Decision, Engine, Event, Seq, Timer, Workflow};
    use serde_json::json;

    struct Busy;

    impl Workflow for Busy {
        type State = ();
        fn evolve(&self, _: &mut (), _: &EventRecord) {}
        fn decide(&self, _: &(), _: &EventRecord) -> Decision {
            Decision::new()
                .command(Command::new("a", json!({ "x": [1, 2] })))
                .command(Command::new("b", json!(null)))
                .timer(Timer::after(
                    "t",
                    std::time::Duration::from_secs(5),
                    json!({}),
                ))
        }
    }

    #[test]
    fn snapshots_of_values_at_the_limits_read_back() {
        let deepest = (0..crate::JsonLimits::default().max_depth)
            .fold(json!(1), |inner, _| json!({ "k": inner }));
        let one_less = deepest["k"].clone();
        let decision = Decision::new()
            .command(Command::new("c", deepest.clone()))
            .timer(Timer::after("t", std::time::Duration::ZERO, one_less));
        let now = Timestamp::from_millis(10);
        let workflow = WorkflowId::new("deep").unwrap();
        let commit = Commit::new(
            workflow.clone(),
            Seq::ZERO,
            Event::new("e", deepest.clone()),
            decision,
            now,
        )
        .unwrap();
        let mut store = MemoryStore::new();
        store.append_with_commands(&commit).unwrap();
        let copy = MemoryStore::from_snapshot(&store.export_snapshot()).unwrap();
        assert_eq!(copy.load(&workflow).unwrap()[0].payload, deepest);
        assert_eq!(copy.commands(&workflow).unwrap()[0].payload, deepest);
        assert_eq!(
            copy.timers(&workflow).unwrap(),
            store.timers(&workflow).unwrap()
        );
    }

    #[test]
    fn snapshots_round_trip_every_row_and_keep_working() {
        let mut store = MemoryStore::new();
        let engine = Engine::new(Busy);
        let now = Timestamp::from_millis(10);
        for w in ["w1", "w2"] {
            for _ in 0..2 {
                engine
                    .handle(
                        &mut store,
                        &WorkflowId::new(w).unwrap(),
                        Event::new("e", json!({ "w": w })),
                        now,
                    )
                    .unwrap();
            }
        }
        let claimed = store
            .claim(&crate::ClaimRequest::new("x").limit(2), now)
            .unwrap();
        store
            .complete(&claimed[0].command_id, claimed[0].token, None, now)
            .unwrap();
        let text = store.export_snapshot();
        let mut copy = MemoryStore::from_snapshot(&text).unwrap();
        assert_eq!(copy.export_snapshot(), text);
        assert_eq!(copy.pending(100).unwrap(), store.pending(100).unwrap());
        let w1 = WorkflowId::new("w1").unwrap();
        assert_eq!(copy.timers(&w1).unwrap(), store.timers(&w1).unwrap());
        // The copy goes on: the leased command is still fenced, new commits get the next seq.
        assert!(copy
            .complete(&claimed[1].command_id, claimed[1].token + 1, None, now)
            .is_err());
        copy.complete(&claimed[1].command_id, claimed[1].token, None, now)
            .unwrap();
        assert_eq!(
            engine
                .handle(&mut copy, &w1, Event::new("e", json!({})), now)
                .unwrap()
                .seq,
            Seq::new(3).unwrap()
        );
    }

    #[test]
    fn snapshots_keep_priorities_and_controls_and_version_1_still_reads() {
        let mut store = MemoryStore::new();
        let now = Timestamp::from_millis(10);
        let decision = Decision::new().command(Command::new("mail", json!({})).priority(7));
        let commit = Commit::new(
            WorkflowId::new("w").unwrap(),
            Seq::ZERO,
            Event::new("e", json!({})),
            decision,
            now,
        )
        .unwrap();
        store.append_with_commands(&commit).unwrap();
        store
            .control_kind("mail", crate::KindChange::Limit(2), "ops", now)
            .unwrap();
        let copy = MemoryStore::from_snapshot(&store.export_snapshot()).unwrap();
        assert_eq!(
            copy.kind_controls().unwrap(),
            store.kind_controls().unwrap()
        );
        assert_eq!(copy.pending(10).unwrap()[0].priority, 7);

        let version_1 = r#"{"format":"miniflow.memory-store","version":1,
            "events":[{"workflow_id":"w","seq":1,"kind":"e","payload":null,"recorded_at":0}],
            "outbox":[{"command_id":"w:1:0","kind":"k","payload":null,"status":"pending",
                "attempts":0,"last_error":null,"available_at":0,"lease":null,"created_at":0,
                "processed_at":null,"manual_retries":0,"resolution":null}],
            "timers":[]}"#;
        let old = MemoryStore::from_snapshot(version_1).unwrap();
        assert_eq!(old.pending(10).unwrap()[0].priority, 0);
        assert!(old.kind_controls().unwrap().is_empty());
    }

    #[test]
    fn bad_snapshots_are_refused_with_a_reason() {
        for (text, reason) in [
            ("not json", "not a miniflow snapshot"),
            (
                r#"{"format":"other","version":1}"#,
                "expected \"miniflow.memory-store\"",
            ),
            (
                r#"{"format":"miniflow.memory-store","version":3,"events":[]}"#,
                "newer than this miniflow reads (2)",
            ),
            (
                r#"{"format":"miniflow.memory-store","version":1,"events":[]}"#,
                "malformed",
            ),
            (
                r#"{"format":"miniflow.memory-store","version":1,"events":[{"workflow_id":"w","seq":2,"kind":"e","payload":null,"recorded_at":0}],"outbox":[],"timers":[]}"#,
                "out of order",
            ),
        ] {
            match MemoryStore::from_snapshot(text) {
                Err(Error::InvalidInput {
                    field: "snapshot",
                    reason: got,
                    ..
                }) => {
                    assert!(got.contains(reason), "{text}: {got}")
                }
                other => panic!("{text} gave {other:?}"),
            }
        }
    }
}
