//! The in-memory twins of a SQL store's partial indexes: the rows a claim may take and the timers a
//! firer may take, each in the order the core's rules give, so that neither scans nor sorts.
//!
//! Which rows belong and under which key come from the core's statements of the rules:
//! [`OutboxRow::is_claimable`] and [`OutboxRow::claim_order`] for commands, [`TimerRow::is_due`] and
//! [`TimerRow::due_order`] for timers. A row belongs while it can become claimable (its status is
//! unfinished; a timer: scheduled), keyed by its order; claimable at `now` are then exactly the keys
//! up to `now`. `MemoryStore`'s tests check that against the rules on random operations.
//!
//! A per-command priority (higher first, then due time) fits as a leading bucket: both sets become
//! `BTreeMap<Priority, BTreeSet<ClaimKey>>`, and [`ClaimIndex::next`] walks the buckets from the
//! highest and the due range `..=now` of each, so a claim still reads only what it takes.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;
use std::sync::Arc;

use crate::id::{CommandId, Seq, WorkflowId};
use crate::outbox::{ClaimOrder, OutboxRow};
use crate::time::Timestamp;
use crate::timer::{TimerRow, TimerStatus};

/// A command's place in claim order: [`OutboxRow::claim_order`], owned.
pub(super) type ClaimKey = (Timestamp, CommandId);

/// The unfinished outbox rows, for claims, `pending` and cancellations.
#[derive(Debug, Clone, Default)]
pub(super) struct ClaimIndex {
    /// Every unfinished row by command ID: `pending` reads it in order, a decision's cancellations
    /// read one workflow's range, and the first of a workflow is its head.
    by_id: BTreeMap<CommandId, Entry>,
    /// Every unfinished row in claim order: the candidates of a [`ClaimOrder::DueFirst`] claim.
    due: BTreeSet<ClaimKey>,
    /// The first unfinished row of each workflow in claim order: the candidates of a
    /// [`ClaimOrder::StrictPerWorkflow`] claim.
    heads: BTreeSet<ClaimKey>,
}

/// What the index knows of an unfinished row.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Entry {
    /// Its `available_at`, the first part of its claim key.
    at: Timestamp,
    /// Whether it is the first unfinished row of its workflow (and so in `heads`).
    head: bool,
}

impl ClaimIndex {
    /// Records `row` as it now stands (new, changed or finished): a handful of O(log n) steps.
    pub(super) fn put(&mut self, row: &OutboxRow) {
        let id = &row.command_id;
        let (at, _) = row.claim_order();
        let unfinished = row.status.is_unfinished();
        match (self.by_id.get_mut(id), unfinished) {
            (None, false) => {}
            (Some(entry), true) => {
                let was = std::mem::replace(&mut entry.at, at);
                if was != at {
                    let head = entry.head;
                    self.move_key(&(was, id.clone()), at, head);
                }
            }
            (Some(&mut entry), false) => {
                self.by_id.remove(id);
                self.due.remove(&(entry.at, id.clone()));
                if entry.head {
                    self.heads.remove(&(entry.at, id.clone()));
                    self.promote_after(id);
                }
            }
            (None, true) => {
                let head = !self.has_unfinished_before(id);
                if head {
                    // It comes before the workflow's old head, if there is one (a retried dead row).
                    self.demote_after(id);
                    self.heads.insert((at, id.clone()));
                }
                self.by_id.insert(id.clone(), Entry { at, head });
                self.due.insert((at, id.clone()));
            }
        }
    }

    /// Moves `was` to the time `at` in the claim order (and in the heads, for a head).
    fn move_key(&mut self, was: &ClaimKey, at: Timestamp, head: bool) {
        self.due.remove(was);
        self.due.insert((at, was.1.clone()));
        if head {
            self.heads.remove(was);
            self.heads.insert((at, was.1.clone()));
        }
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
            let key = (entry.at, next.clone());
            self.heads.insert(key);
        }
    }

    /// The row after `id` in its workflow (if any) is no longer the head: `id` came back before it.
    fn demote_after(&mut self, id: &CommandId) {
        if let Some((next, entry)) = self.next_of_workflow(id) {
            entry.head = false;
            let key = (entry.at, next.clone());
            self.heads.remove(&key);
        }
    }

    /// The first candidate of an `order` claim after `after` (from the start when `None`) that is
    /// claimable at `now`.
    pub(super) fn next(
        &self,
        order: ClaimOrder,
        after: Option<&ClaimKey>,
        now: Timestamp,
    ) -> Option<ClaimKey> {
        let candidates = match order {
            ClaimOrder::DueFirst => &self.due,
            ClaimOrder::StrictPerWorkflow => &self.heads,
        };
        let from = after.map_or(Bound::Unbounded, Bound::Excluded);
        candidates
            .range((from, Bound::Unbounded))
            .next()
            .filter(|(at, _)| *at <= now)
            .cloned()
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
            ClaimOrder::DueFirst => self.due.iter().cloned().collect(),
            ClaimOrder::StrictPerWorkflow => self.heads.iter().cloned().collect(),
        }
    }
}

/// A timer's ID as text: the key timers are stored and ordered by (timer IDs order as their text),
/// made once per timer instead of once per comparison.
pub(super) type TimerKey = Arc<str>;

/// The scheduled timers, for firers and for cancellations.
#[derive(Debug, Clone, Default)]
pub(super) struct TimerIndex {
    /// In due order ([`TimerRow::due_order`]).
    due: BTreeSet<(Timestamp, TimerKey)>,
    /// By workflow, for a decision that cancels its timers by name.
    by_workflow: BTreeSet<(WorkflowId, TimerKey)>,
}

impl TimerIndex {
    /// Records that the timer under `key` went from `before` (absent when new) to `after`. O(log n).
    pub(super) fn put(&mut self, key: &TimerKey, before: Option<&TimerRow>, after: &TimerRow) {
        let scheduled = |timer: &TimerRow| timer.status == TimerStatus::Scheduled;
        if let Some(before) = before.filter(|t| scheduled(t)) {
            if scheduled(after) && before.available_at == after.available_at {
                return;
            }
            self.due.remove(&(before.available_at, key.clone()));
            self.by_workflow
                .remove(&(before.timer_id.workflow_id().clone(), key.clone()));
        }
        if scheduled(after) {
            self.due.insert((after.available_at, key.clone()));
            self.by_workflow
                .insert((after.timer_id.workflow_id().clone(), key.clone()));
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

    /// The scheduled timers of `workflow`.
    pub(super) fn of_workflow<'a>(
        &'a self,
        workflow: &'a WorkflowId,
    ) -> impl Iterator<Item = &'a TimerKey> + 'a {
        self.by_workflow
            .range((workflow.clone(), TimerKey::from(""))..)
            .take_while(move |(of, _)| of == workflow)
            .map(|(_, key)| key)
    }

    /// Every key in due order, for the tests' comparison with the rules.
    #[cfg(test)]
    pub(super) fn keys(&self) -> Vec<(Timestamp, TimerKey)> {
        self.due.iter().cloned().collect()
    }
}
