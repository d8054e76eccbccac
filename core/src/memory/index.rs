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
//! keys in due order, and [`ClaimIndex::next`] walks the buckets from the highest and the due range
//! `..=now` of each, as a SQL store reads one priority at a time: a claim still reads only what it
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

/// One priority's keys in due order.
type Bucket = BTreeSet<(Timestamp, CommandId)>;

/// Keys in claim order: a bucket per priority, the highest first. Empty buckets are removed.
#[derive(Debug, Clone, Default)]
struct Buckets(BTreeMap<Reverse<i32>, Bucket>);

impl Buckets {
    fn insert(&mut self, (priority, at, id): ClaimKey) {
        self.0.entry(priority).or_default().insert((at, id));
    }

    fn remove(&mut self, (priority, at, id): &ClaimKey) {
        if let Some(bucket) = self.0.get_mut(priority) {
            bucket.remove(&(*at, id.clone()));
            if bucket.is_empty() {
                self.0.remove(priority);
            }
        }
    }

    /// The first key after `after` (from the start when `None`) that is due at `now`: in each
    /// priority from `after`'s, the first key after it, if it is due.
    fn next(&self, after: Option<&ClaimKey>, now: Timestamp) -> Option<ClaimKey> {
        let start = after.map_or(Bound::Unbounded, |(priority, _, _)| {
            Bound::Included(*priority)
        });
        for (priority, bucket) in self.0.range((start, Bound::Unbounded)) {
            let from = match after {
                Some((p, at, id)) if p == priority => Bound::Excluded((*at, id.clone())),
                _ => Bound::Unbounded,
            };
            if let Some((at, id)) = bucket.range((from, Bound::Unbounded)).next() {
                if *at <= now {
                    return Some((*priority, *at, id.clone()));
                }
            }
        }
        None
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
    /// Every unfinished row by command ID with its priority and `available_at`: `pending` reads it in
    /// order, a decision's cancellations read one workflow's range, and the first of a workflow is
    /// its head.
    by_id: BTreeMap<CommandId, (Reverse<i32>, Timestamp)>,
    /// Every unfinished row in claim order: the candidates of a [`ClaimOrder::DueFirst`] claim.
    due: Buckets,
    /// The first unfinished row of each workflow in claim order: the candidates of a
    /// [`ClaimOrder::StrictPerWorkflow`] claim.
    heads: Buckets,
}

impl ClaimIndex {
    /// Records `row` as it now stands (new, changed or finished). O(log n).
    pub(super) fn put(&mut self, row: &OutboxRow) {
        let id = &row.command_id;
        let (priority, at, _) = row.claim_order();
        let now_at = row.status.is_unfinished().then_some((priority, at));
        let was_at = self.by_id.get(id).copied();
        if was_at == now_at {
            return;
        }
        let workflow = id.workflow_id();
        let head_before = self.head(workflow);
        if let Some((priority, at)) = was_at {
            self.by_id.remove(id);
            self.due.remove(&(priority, at, id.clone()));
        }
        if let Some((priority, at)) = now_at {
            self.by_id.insert(id.clone(), (priority, at));
            self.due.insert((priority, at, id.clone()));
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
    /// claimable at `now`. O(priorities · log n).
    pub(super) fn next(
        &self,
        order: ClaimOrder,
        after: Option<&ClaimKey>,
        now: Timestamp,
    ) -> Option<ClaimKey> {
        match order {
            ClaimOrder::DueFirst => self.due.next(after, now),
            ClaimOrder::StrictPerWorkflow => self.heads.next(after, now),
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

    /// The key of the first unfinished command of `workflow`.
    fn head(&self, workflow: &WorkflowId) -> Option<ClaimKey> {
        self.of_workflow(workflow).next().map(|id| {
            let (priority, at) = self.by_id[id];
            (priority, at, id.clone())
        })
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
