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
    /// Every unfinished row by command ID with its `available_at`: `pending` reads it in order, a
    /// decision's cancellations read one workflow's range, and the first of a workflow is its head.
    by_id: BTreeMap<CommandId, Timestamp>,
    /// Every unfinished row in claim order: the candidates of a [`ClaimOrder::DueFirst`] claim.
    due: BTreeSet<ClaimKey>,
    /// The first unfinished row of each workflow in claim order: the candidates of a
    /// [`ClaimOrder::StrictPerWorkflow`] claim.
    heads: BTreeSet<ClaimKey>,
}

impl ClaimIndex {
    /// Records `row` as it now stands (new, changed or finished). O(log n).
    pub(super) fn put(&mut self, row: &OutboxRow) {
        let id = &row.command_id;
        let (at, _) = row.claim_order();
        let now_at = row.status.is_unfinished().then_some(at);
        let was_at = self.by_id.get(id).copied();
        if was_at == now_at {
            return;
        }
        let workflow = id.workflow_id();
        let head_before = self.head(workflow);
        if let Some(was_at) = was_at {
            self.by_id.remove(id);
            self.due.remove(&(was_at, id.clone()));
        }
        if let Some(at) = now_at {
            self.by_id.insert(id.clone(), at);
            self.due.insert((at, id.clone()));
        }
        let head_after = self.head(workflow);
        if head_before != head_after {
            if let Some(key) = head_before {
                self.heads.remove(&key);
            }
            if let Some(key) = head_after {
                self.heads.insert(key);
            }
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

    /// The key of the first unfinished command of `workflow`.
    fn head(&self, workflow: &WorkflowId) -> Option<ClaimKey> {
        self.of_workflow(workflow)
            .next()
            .map(|id| (self.by_id[id], id.clone()))
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
