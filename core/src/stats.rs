//! Outbox stats: how many commands wait, are held or are dead, by kind, how far behind delivery is,
//! how many timers and feedback events are still to fire, and which kinds the operators paused or
//! limited — what an operator reads, and what metrics gauges report.
//!
//! Which rows count where is stated here, once ([`OutboxStats::count`]); a SQL store computes the
//! same counts with `GROUP BY kind, status` over its unfinished rows and its dead rows (never its
//! done rows) and hands them to [`OutboxStats::add`].

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::control::KindControl;
use crate::outbox::OutboxRow;
use crate::status::Status;
use crate::time::Timestamp;
use crate::timer::{TimerRow, TimerStatus};
use crate::{COMMAND_COMPLETED, COMMAND_FAILED, COMMAND_RESOLVED};

/// The commands of one kind at one moment.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[non_exhaustive]
pub struct KindStats {
    /// The command kind.
    pub kind: String,
    /// Pending commands: due, or waiting for their time (a retry's backoff).
    pub pending: u64,
    /// Leased commands: held by a worker, or with a lease that ran out and may be taken over.
    pub leased: u64,
    /// Claimable now ([`OutboxRow::is_claimable`]): pending and due, or leased with an expired lease.
    /// Paused kinds count here too: their commands are due, claims just skip them.
    pub due: u64,
    /// Dead commands, waiting for a person to retry or resolve them.
    pub dead: u64,
    /// When the longest-waiting claimable command became claimable (its `available_at`).
    pub oldest_due: Option<Timestamp>,
    /// Claims skip the kind.
    pub paused: bool,
    /// At most this many commands of the kind hold an unexpired lease at once.
    pub concurrency_limit: Option<u32>,
}

impl KindStats {
    fn new(kind: &str) -> Self {
        Self {
            kind: kind.to_owned(),
            ..Self::default()
        }
    }
}

/// The timers not fired yet at a moment: the workflows' own timers, the next firings of their
/// schedules, and the feedback (`command_completed`, `command_failed`, `command_resolved`) still to
/// be recorded in its workflow, which travels as a timer (DESIGN rules 11–12).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[non_exhaustive]
pub struct TimerStats {
    /// Timers not fired, cancelled or rejected yet (waiting, due, or taken by a firer).
    pub scheduled: u64,
    /// Of those, the feedback events.
    pub feedback: u64,
    /// Of those, the ones due (or taken by a firer whose lease ran out).
    pub due: u64,
    /// When the first of them is (or was) due.
    pub next_at: Option<Timestamp>,
}

impl TimerStats {
    /// Adds `rows` unfired timers, `feedback` of them feedback and `due` of them due, the earliest
    /// due at `next_at`: what a SQL store counts with `count(*)`, `sum(name IN (…))`,
    /// `sum(available_at <= now)` and `min(available_at)` over its unfired timers.
    pub fn add(&mut self, rows: u64, feedback: u64, due: u64, next_at: Option<Timestamp>) {
        self.scheduled += rows;
        self.feedback += feedback;
        self.due += due;
        self.next_at = match (self.next_at, next_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }

    /// Counts one timer row at `now` if it has not fired, been cancelled or been rejected.
    pub fn count(&mut self, timer: &TimerRow, now: Timestamp) {
        if timer.status == TimerStatus::Scheduled {
            self.add(
                1,
                u64::from(is_feedback(&timer.name)),
                u64::from(timer.available_at <= now),
                Some(timer.available_at),
            );
        }
    }
}

/// Whether a timer of this name carries feedback rather than a workflow's own timer (SQL stores
/// write the same three names in their statements; the conformance suite holds them to it).
fn is_feedback(name: &str) -> bool {
    [COMMAND_COMPLETED, COMMAND_FAILED, COMMAND_RESOLVED].contains(&name)
}

/// The outbox at `now`: depth by kind and status, the lag, the timers still to fire and the
/// operators' controls.
///
/// Done and cancelled commands are not counted: a store keeps them until retention purges them, and
/// counting them would read every one.
///
/// "Is everything done?" is [`OutboxStats::is_idle`]: no command to deliver and no timer or
/// feedback to fire. A store with no unfinished command may still have results to record in their
/// workflows (`command_completed` feedback, counted in [`OutboxStats::timers`]), and those may
/// decide new commands.
///
/// ```
/// use miniflow_core::prelude::*;
/// use miniflow_core::{json, Command, Commit, Decision, Event, MemoryStore, Seq, Timestamp, WorkflowId};
///
/// let mut store = MemoryStore::new();
/// let decision = Decision::new()
///     .command(Command::new("book_hotel", json!({})))
///     .command(Command::new("mail", json!({})));
/// let commit = Commit::new(WorkflowId::new("trip-1")?, Seq::ZERO, Event::new("e", json!({})), decision, Timestamp::from_millis(1_000))?;
/// store.append_with_commands(&commit)?;
///
/// let stats = store.stats(Timestamp::from_millis(4_000))?;
/// assert_eq!((stats.pending(), stats.due()), (2, 2));
/// assert_eq!(stats.kind("mail").map(|k| k.pending), Some(1));
/// assert_eq!(stats.lag().as_millis(), 3_000);
/// # Ok::<(), miniflow_core::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct OutboxStats {
    /// The moment the stats describe.
    pub now: Timestamp,
    /// Every kind with a pending, leased or dead command, or an active control, by kind (byte order).
    pub kinds: Vec<KindStats>,
    /// The kinds paused or limited, with who made the last change and when, by kind.
    pub controls: Vec<KindControl>,
    /// The timers and feedback not fired yet.
    #[serde(default)]
    pub timers: TimerStats,
}

impl OutboxStats {
    /// Empty stats at `now`, for a store to fill.
    pub fn new(now: Timestamp) -> Self {
        Self {
            now,
            kinds: Vec::new(),
            controls: Vec::new(),
            timers: TimerStats::default(),
        }
    }

    fn entry(&mut self, kind: &str) -> &mut KindStats {
        let at = match self
            .kinds
            .binary_search_by(|k| k.kind.as_bytes().cmp(kind.as_bytes()))
        {
            Ok(at) => at,
            Err(at) => {
                self.kinds.insert(at, KindStats::new(kind));
                at
            }
        };
        &mut self.kinds[at]
    }

    /// Counts one outbox row: pending, leased and dead rows by their status, claimable ones
    /// ([`OutboxRow::is_claimable`]) as due with the earliest `available_at`; done and cancelled rows
    /// are not counted.
    pub fn count(&mut self, row: &OutboxRow) {
        let due = row.is_claimable(self.now);
        let since = due.then_some(row.available_at);
        self.add(&row.kind, row.status, 1, u64::from(due), since);
    }

    /// Adds `rows` commands of `kind` in `status`, `due` of them claimable, the earliest claimable
    /// since `oldest_due`: what a SQL store counts per `(kind, status)` with `count(*)`,
    /// `sum(available_at <= now)` and `min(available_at) FILTER (WHERE available_at <= now)` over its
    /// unfinished rows, and `count(*)` over its dead rows. Done and cancelled rows are ignored.
    pub fn add(
        &mut self,
        kind: &str,
        status: Status,
        rows: u64,
        due: u64,
        oldest_due: Option<Timestamp>,
    ) {
        if matches!(status, Status::Done | Status::Cancelled) || rows == 0 {
            return;
        }
        let entry = self.entry(kind);
        match status {
            Status::Pending => entry.pending += rows,
            Status::Leased => entry.leased += rows,
            _ => entry.dead += rows,
        }
        if status.is_unfinished() {
            entry.due += due;
            entry.oldest_due = match (entry.oldest_due, oldest_due) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
    }

    /// Adds the operators' controls: the active ones ([`KindControl::is_active`]) are kept, and
    /// marked on their kinds (listed even without a command).
    #[must_use]
    pub fn with_controls(mut self, controls: impl IntoIterator<Item = KindControl>) -> Self {
        for control in controls.into_iter().filter(KindControl::is_active) {
            let entry = self.entry(&control.kind);
            entry.paused = control.paused;
            entry.concurrency_limit = control.concurrency_limit;
            self.controls.push(control);
        }
        self.controls
            .sort_by(|a, b| a.kind.as_bytes().cmp(b.kind.as_bytes()));
        self
    }

    /// The stats of `kind`, if it has a pending, leased or dead command or an active control.
    pub fn kind(&self, kind: &str) -> Option<&KindStats> {
        self.kinds.iter().find(|k| k.kind == kind)
    }

    /// Pending commands of every kind.
    pub fn pending(&self) -> u64 {
        self.kinds.iter().map(|k| k.pending).sum()
    }

    /// Leased commands of every kind.
    pub fn leased(&self) -> u64 {
        self.kinds.iter().map(|k| k.leased).sum()
    }

    /// Claimable commands of every kind (paused kinds included).
    pub fn due(&self) -> u64 {
        self.kinds.iter().map(|k| k.due).sum()
    }

    /// Dead commands of every kind.
    pub fn dead(&self) -> u64 {
        self.kinds.iter().map(|k| k.dead).sum()
    }

    /// When the longest-waiting claimable command of any kind became claimable.
    pub fn oldest_due(&self) -> Option<Timestamp> {
        self.kinds.iter().filter_map(|k| k.oldest_due).min()
    }

    /// The lag: how long the longest-waiting claimable command has waited at `now` (zero when
    /// nothing is claimable). Paused kinds count: their commands wait too.
    pub fn lag(&self) -> Duration {
        self.oldest_due()
            .map_or(Duration::ZERO, |since| self.now.saturating_since(since))
    }

    /// Nothing left to do by itself: no pending or leased command, and no timer or feedback that has
    /// not fired. Dead commands do not count (they wait for a person: see [`OutboxStats::dead`]);
    /// a workflow with a schedule always has its next firing scheduled, so it is never idle.
    pub fn is_idle(&self) -> bool {
        self.pending() == 0 && self.leased() == 0 && self.timers.scheduled == 0
    }

    /// The paused kinds, by kind.
    pub fn paused_kinds(&self) -> impl Iterator<Item = &str> {
        self.controls
            .iter()
            .filter(|c| c.paused)
            .map(|c| c.kind.as_str())
    }
}
