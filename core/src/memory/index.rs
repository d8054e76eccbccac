//! The in-memory twins of a SQL store's partial indexes: the rows a claim may take and the timers a
//! firer may take, each in the order the core's rules give, so that neither scans nor sorts.
//!
//! Which rows belong and under which key come from the core's statements of the rules:
//! [`OutboxRow::is_claimable`] and [`OutboxRow::claim_order`] for commands, [`TimerRow::is_due`] and
//! [`TimerRow::due_order`] for timers. A row belongs while it can become claimable (its status is
//! unfinished; a timer: scheduled), keyed by its order; claimable at `now` are then exactly the keys
//! up to `now` in each priority. `MemoryStore`'s tests check that against the rules on random
//! operations.
//!
//! The priority leads the claim order, so each set is a bucket per priority (the highest first) of
//! keys in due order, and [`ClaimIndex::page`] reads a claim's page from one priority's due range
//! `..=now`, as a SQL store reads one priority at a time: a claim still reads only what it
//! takes, whatever is not yet due at a higher priority.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;
use std::sync::Arc;

use crate::id::{CommandId, Seq, WorkflowId};
use crate::outbox::{ClaimOrder, OutboxRow};
use crate::time::Timestamp;
use crate::timer::{TimerRow, TimerStatus};

/// A command's place in claim order: [`OutboxRow::claim_order`], owned.
pub(super) type ClaimKey = (Reverse<i32>, Timestamp, CommandId);

/// A command's place within its priority: `(available_at, command_id)`, what a claim's page reads
/// after.
pub(super) type PageKey = (Timestamp, CommandId);

/// One priority's keys in due order.
type Bucket = BTreeSet<(Timestamp, CommandId)>;

/// Keys in claim order: a bucket per priority, the highest first, in a vector sorted by priority
/// (a store holds few distinct priorities; a vector spares the module a map's code). Empty buckets
/// are removed.
#[derive(Debug, Clone, Default)]
struct Buckets(Vec<(Reverse<i32>, Bucket)>);

impl Buckets {
    /// Where `priority`'s bucket is, or where it would go.
    fn find(&self, priority: Reverse<i32>) -> Result<usize, usize> {
        self.0.binary_search_by(|(p, _)| p.cmp(&priority))
    }

    fn insert(&mut self, (priority, at, id): ClaimKey) {
        let at_index = match self.find(priority) {
            Ok(index) => index,
            Err(index) => {
                self.0.insert(index, (priority, Bucket::new()));
                index
            }
        };
        self.0[at_index].1.insert((at, id));
    }

    fn remove(&mut self, (priority, at, id): &ClaimKey) {
        if let Ok(index) = self.find(*priority) {
            let bucket = &mut self.0[index].1;
            bucket.remove(&(*at, id.clone()));
            if bucket.is_empty() {
                self.0.remove(index);
            }
        }
    }

    /// The highest priority below `below` that holds a key.
    fn below(&self, below: i64) -> Option<i64> {
        for (Reverse(priority), _) in &self.0 {
            if i64::from(*priority) < below {
                return Some(i64::from(*priority));
            }
        }
        None
    }

    /// Up to `limit` keys of `priority` after `after` (from its first when `None`) that are due at
    /// `now`, in due order: a claim's page.
    fn page(
        &self,
        priority: i64,
        after: Option<&PageKey>,
        now: Timestamp,
        limit: usize,
    ) -> Vec<PageKey> {
        let Ok(index) = i32::try_from(priority).map_or(Err(0), |p| self.find(Reverse(p))) else {
            return Vec::new();
        };
        let from = after.map_or(Bound::Unbounded, |(at, id)| {
            Bound::Excluded((*at, id.clone()))
        });
        // A plain loop: the iterator adapters' code would cost the WebAssembly module more.
        let mut page = Vec::new();
        for (at, id) in self.0[index].1.range((from, Bound::Unbounded)) {
            if *at > now || page.len() == limit {
                break;
            }
            page.push((*at, id.clone()));
        }
        page
    }

    #[cfg(test)]
    fn keys(&self) -> Vec<ClaimKey> {
        self.0
            .iter()
            .flat_map(|(priority, bucket)| {
                bucket.iter().map(|(at, id)| (*priority, *at, id.clone()))
            })
            .collect()
    }
}

/// The unfinished outbox rows, for claims, `pending` and cancellations.
#[derive(Debug, Clone, Default)]
pub(super) struct ClaimIndex {
    /// Every unfinished row by command ID: `pending` reads it in order, a decision's cancellations
    /// read one workflow's range, and the first of a workflow is its head.
    by_id: BTreeMap<CommandId, Entry>,
    /// Every unfinished row in claim order: the candidates of a [`ClaimOrder::DueFirst`] claim.
    due: Buckets,
    /// The first unfinished row of each workflow in claim order: the candidates of a
    /// [`ClaimOrder::StrictPerWorkflow`] claim.
    heads: Buckets,
}

/// What the index knows of an unfinished row.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Entry {
    /// Its priority, the first part of its claim key (the highest first).
    priority: Reverse<i32>,
    /// Its `available_at`, the second part of its claim key.
    at: Timestamp,
    /// Whether it is the first unfinished row of its workflow (and so in `heads`).
    head: bool,
}

impl Entry {
    /// The claim key of the row `id` with this entry.
    fn key(&self, id: &CommandId) -> ClaimKey {
        (self.priority, self.at, id.clone())
    }
}

impl ClaimIndex {
    /// Records `row` as it now stands (new, changed or finished): a handful of O(log n) steps.
    pub(super) fn put(&mut self, row: &OutboxRow) {
        let id = &row.command_id;
        let (priority, at, _) = row.claim_order();
        let unfinished = row.status.is_unfinished();
        match (self.by_id.get_mut(id), unfinished) {
            (None, false) => {}
            (Some(entry), true) => {
                if (entry.priority, entry.at) != (priority, at) {
                    let was = entry.key(id);
                    entry.priority = priority;
                    entry.at = at;
                    let now = entry.key(id);
                    let head = entry.head;
                    self.move_key(&was, now, head);
                }
            }
            (Some(&mut entry), false) => {
                self.by_id.remove(id);
                let key = entry.key(id);
                self.due.remove(&key);
                if entry.head {
                    self.heads.remove(&key);
                    self.promote_after(id);
                }
            }
            (None, true) => {
                let head = !self.has_unfinished_before(id);
                let entry = Entry { priority, at, head };
                if head {
                    // It comes before the workflow's old head, if there is one (a retried dead row).
                    self.demote_after(id);
                    self.heads.insert(entry.key(id));
                }
                self.due.insert(entry.key(id));
                self.by_id.insert(id.clone(), entry);
            }
        }
    }

    /// Moves the key `was` to `now` in the claim order (and in the heads, for a head).
    fn move_key(&mut self, was: &ClaimKey, now: ClaimKey, head: bool) {
        self.due.remove(was);
        if head {
            self.heads.remove(was);
            self.heads.insert(now.clone());
        }
        self.due.insert(now);
    }

    /// Whether an unfinished row of `id`'s workflow comes before `id`.
    fn has_unfinished_before(&self, id: &CommandId) -> bool {
        self.by_id
            .range(..id)
            .next_back()
            .is_some_and(|(before, _)| before.workflow_id() == id.workflow_id())
    }

    /// The next unfinished row of `id`'s workflow after `id`, with its entry.
    fn next_of_workflow(&mut self, id: &CommandId) -> Option<(&CommandId, &mut Entry)> {
        self.by_id
            .range_mut((Bound::Excluded(id), Bound::Unbounded))
            .next()
            .filter(|(next, _)| next.workflow_id() == id.workflow_id())
    }

    /// Makes the row after `id` in its workflow (if any) the head: `id` left the index.
    fn promote_after(&mut self, id: &CommandId) {
        if let Some((next, entry)) = self.next_of_workflow(id) {
            entry.head = true;
            let key = entry.key(next);
            self.heads.insert(key);
        }
    }

    /// The row after `id` in its workflow (if any) is no longer the head: `id` came back before it.
    fn demote_after(&mut self, id: &CommandId) {
        if let Some((next, entry)) = self.next_of_workflow(id) {
            entry.head = false;
            let key = entry.key(next);
            self.heads.remove(&key);
        }
    }

    /// The highest priority of an unfinished command below `below`.
    pub(super) fn priority_below(&self, below: i64) -> Option<i64> {
        self.due.below(below)
    }

    /// A claim's page (see [`crate::backend::ClaimPage`]): up to `limit` candidates of an `order`
    /// claim of `priority` after `after`, claimable at `now`.
    pub(super) fn page(
        &self,
        order: ClaimOrder,
        priority: i64,
        after: Option<&PageKey>,
        now: Timestamp,
        limit: usize,
    ) -> Vec<PageKey> {
        match order {
            ClaimOrder::DueFirst => self.due.page(priority, after, now, limit),
            ClaimOrder::StrictPerWorkflow => self.heads.page(priority, after, now, limit),
        }
    }

    /// The unfinished commands by ID.
    pub(super) fn ids(&self) -> impl Iterator<Item = &CommandId> {
        self.by_id.keys()
    }

    /// The unfinished commands of `workflow`, by ID.
    pub(super) fn of_workflow<'a>(
        &'a self,
        workflow: &'a WorkflowId,
    ) -> impl Iterator<Item = &'a CommandId> + 'a {
        let first = CommandId::new(workflow.clone(), Seq::ONE, 0).ok();
        first
            .into_iter()
            .flat_map(move |first| self.by_id.range(first..).map(|(id, _)| id))
            .take_while(move |id| id.workflow_id() == workflow)
    }

    /// Every key, each set in its order, for the tests' comparison with the rules.
    #[cfg(test)]
    pub(super) fn keys(&self, order: ClaimOrder) -> Vec<ClaimKey> {
        match order {
            ClaimOrder::DueFirst => self.due.keys(),
            ClaimOrder::StrictPerWorkflow => self.heads.keys(),
        }
    }
}

/// A timer's ID as text: the key timers are stored and ordered by (timer IDs order as their text),
/// made once per timer instead of once per comparison.
pub(super) type TimerKey = Arc<str>;

/// The scheduled timers, for firers. (A decision's cancellations read the timers whose ID starts
/// with the workflow's, a range of the timers by ID.)
#[derive(Debug, Clone, Default)]
pub(super) struct TimerIndex {
    /// In due order ([`TimerRow::due_order`]).
    due: BTreeSet<(Timestamp, TimerKey)>,
}

impl TimerIndex {
    /// Whether a timer is due at `now`.
    pub(super) fn any_due(&self, now: Timestamp) -> bool {
        self.due.first().is_some_and(|(at, _)| *at <= now)
    }

    /// Every scheduled timer, in due order.
    pub(super) fn iter(&self) -> impl Iterator<Item = &TimerKey> {
        self.due.iter().map(|(_, key)| key)
    }

    /// Records that the timer under `key` went from `before` (absent when new) to `after`. O(log n).
    pub(super) fn put(&mut self, key: &TimerKey, before: Option<&TimerRow>, after: &TimerRow) {
        let scheduled = |timer: &TimerRow| timer.status == TimerStatus::Scheduled;
        let was = before.filter(|t| scheduled(t)).map(|t| t.available_at);
        let now = scheduled(after).then_some(after.available_at);
        if was == now {
            return;
        }
        if let Some(at) = was {
            self.due.remove(&(at, key.clone()));
        }
        if let Some(at) = now {
            self.due.insert((at, key.clone()));
        }
    }

    /// Up to `limit` timers due at `now`, in due order.
    pub(super) fn due(&self, now: Timestamp, limit: usize) -> Vec<TimerKey> {
        self.due
            .iter()
            .take_while(|(at, _)| *at <= now)
            .take(limit)
            .map(|(_, key)| key.clone())
            .collect()
    }

    /// Every key in due order, for the tests' comparison with the rules.
    #[cfg(test)]
    pub(super) fn keys(&self) -> Vec<(Timestamp, TimerKey)> {
        self.due.iter().cloned().collect()
    }
}
