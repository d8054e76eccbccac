//! Retention of finished workflows: when a workflow's whole history (its events, commands and timers)
//! may be deleted, and what a store keeps of it afterwards.
//!
//! **The rule.** A workflow is *finished* when nothing of it is left to do and nothing can come back
//! into it on its own:
//!
//! - every command it decided is done or cancelled — none pending or leased (still to deliver), and
//!   none dead (a dead command waits for a person, whose `retry` or `resolve` feeds an event back);
//! - none of its timers is scheduled (a timer, or the feedback of a settled command, is still to
//!   fire into it).
//!
//! It is *retirable* at `now` when it is finished and has been for at least the retention period:
//! its last event, and the last settlement of any of its commands and timers, are at least
//! `older_than` before `now`. A retention run deletes a retirable workflow's events, commands and
//! timers together, in one transaction, and keeps only a record that the workflow ID was retired:
//! a retired workflow takes no new event ([`retired`]), since a new history would start again at
//! seq 1 and repeat the command IDs of the old one, which receivers fold into the old effects.
//!
//! An unfinished workflow is never retired, however old.
//!
//! A purge of finished commands (`purge_done`) deletes rows instead, at the same cutoff
//! ([`purge_cutoff`]): those [`OutboxRow::is_purgeable`] admits, in [`OutboxRow::purge_order`].

use std::time::Duration;

use crate::error::Error;
use crate::id::{CommandId, WorkflowId};
use crate::model::EventRecord;
use crate::outbox::OutboxRow;
use crate::status::Status;
use crate::time::Timestamp;
use crate::timer::{TimerRow, TimerStatus};

/// Whether this command leaves its workflow finished: done or cancelled.
pub fn command_is_settled(row: &OutboxRow) -> bool {
    matches!(row.status, Status::Done | Status::Cancelled)
}

/// Whether this timer leaves its workflow finished: fired, cancelled or rejected.
pub fn timer_is_settled(timer: &TimerRow) -> bool {
    timer.status != TimerStatus::Scheduled
}

/// The latest `recorded_at` of `events`: what [`finished_at`] takes of a workflow's events.
pub fn last_recorded_at(events: &[EventRecord]) -> Option<Timestamp> {
    events.iter().map(|event| event.recorded_at).max()
}

/// When a workflow finished, given the latest `recorded_at` of its events ([`last_recorded_at`]),
/// its commands and its timers: the latest of that and its commands' and timers' `processed_at`;
/// `None` while it is unfinished, or has no event.
///
/// **The rule.** A workflow is *finished* when nothing of it is left to do and nothing can come back
/// into it on its own: every command it decided is done or cancelled — none pending or leased (still
/// to deliver), and none dead (a dead command waits for a person, whose `retry` or `resolve` feeds
/// an event back) — and none of its timers is scheduled (a timer, or the feedback of a settled
/// command, is still to fire into it). Retention deletes only the history of workflows finished at
/// least its period ago ([`is_retirable`]); an unfinished workflow is never retired, however old. A
/// retired workflow takes no new event ([`retired`]).
///
/// ```
/// use miniflow_core::{finished_at, json, Command, Commit, Decision, Event, Seq, Timestamp, WorkflowId};
/// use miniflow_core::backend::{last_recorded_at};
///
/// let commit = Commit::new(
///     WorkflowId::new("trip-001")?,
///     Seq::ZERO,
///     Event::new("trip_requested", json!({})),
///     Decision::new().command(Command::new("lock_budget", json!({}))),
///     Timestamp::from_millis(1_000),
/// )?;
/// let last_event = last_recorded_at(commit.events());
/// let mut command = commit.commands()[0].clone();
/// assert_eq!(finished_at(last_event, &[command.clone()], &[]), None, "its command is pending");
/// command.mark_done(Timestamp::from_millis(5_000))?;
/// assert_eq!(finished_at(last_event, &[command], &[]), Some(Timestamp::from_millis(5_000)));
/// # Ok::<(), miniflow_core::Error>(())
/// ```
pub fn finished_at(
    last_event_at: Option<Timestamp>,
    commands: &[OutboxRow],
    timers: &[TimerRow],
) -> Option<Timestamp> {
    if !commands.iter().all(command_is_settled) || !timers.iter().all(timer_is_settled) {
        return None;
    }
    let settled = commands
        .iter()
        .filter_map(|row| row.processed_at)
        .chain(timers.iter().filter_map(|timer| timer.processed_at));
    Some(settled.fold(last_event_at?, Timestamp::max))
}

/// The cutoff of a retention run at `now` that keeps `older_than`: what was finished or processed at
/// or before it is old enough to go. `None` when nothing can be that old (`older_than` reaches back
/// past the Unix epoch), so that nothing goes. The one place the cutoff is computed: the core's
/// rules ([`is_retirable`], [`OutboxRow::is_purgeable`]) compare with it, a store binds it in its
/// `processed_at <= $cutoff`, and a dry run counts with it.
///
/// ```
/// use std::time::Duration;
/// use miniflow_core::{purge_cutoff, Timestamp};
///
/// let now = Timestamp::from_millis(86_400_000 * 31);
/// let day = Duration::from_secs(86_400);
/// assert_eq!(purge_cutoff(now, 30 * day), Some(Timestamp::from_millis(86_400_000)));
/// assert_eq!(purge_cutoff(now, Duration::ZERO), Some(now), "everything up to now");
/// assert_eq!(purge_cutoff(now, 32 * day), None, "nothing is 32 days old on day 31");
/// ```
pub fn purge_cutoff(now: Timestamp, older_than: Duration) -> Option<Timestamp> {
    // Whole milliseconds, and not saturated: a period past `u64::MAX` ms reaches past every time.
    let older_than = u64::try_from(older_than.as_millis()).ok()?;
    now.as_millis()
        .checked_sub(older_than)
        .map(Timestamp::from_millis)
}

/// The purge of finished commands (`purge_done`), which deletes rows, not workflows: which rows an
/// explicit run may delete, and in which order a bounded run takes them.
impl OutboxRow {
    /// Whether an explicit retention run at `now` may delete this row: done (or cancelled, which is
    /// as final), and processed at least `older_than` ago (at or before
    /// [`purge_cutoff`]). Pending, leased and dead rows are never purged (DESIGN rule 5).
    pub fn is_purgeable(&self, older_than: Duration, now: Timestamp) -> bool {
        matches!(self.status, Status::Done | Status::Cancelled)
            && purge_cutoff(now, older_than)
                .is_some_and(|cutoff| self.processed_at.is_some_and(|at| at <= cutoff))
    }

    /// The order a bounded retention run removes rows in: the oldest processed first, then by command
    /// ID. A SQL store says `ORDER BY processed_at, workflow_id, event_seq, idx` over the rows
    /// [`Self::is_purgeable`] admits.
    pub fn purge_order(&self) -> (Option<Timestamp>, &CommandId) {
        (self.processed_at, &self.command_id)
    }
}

/// Whether a retention run at `now` may delete a workflow's history: finished (see
/// [`finished_at`]) at least `older_than` before `now` (at or before [`purge_cutoff`]).
pub fn is_retirable(
    last_event_at: Option<Timestamp>,
    commands: &[OutboxRow],
    timers: &[TimerRow],
    older_than: Duration,
    now: Timestamp,
) -> bool {
    let Some(cutoff) = purge_cutoff(now, older_than) else {
        return false;
    };
    finished_at(last_event_at, commands, timers).is_some_and(|at| at <= cutoff)
}

/// What a store's retention run decides for one workflow from what it read of it: the time of its
/// last event (`last_event_millis`, as stored; `None` without events) and its commands and timers,
/// or the error reading them gave. `Ok(true)` when it may be retired ([`is_retirable`]). A workflow
/// with a row that cannot be read ([`Error::Corrupt`]) is not known to be finished, and stays
/// (`Ok(false)`); any other error is the store's, returned.
pub fn may_retire(
    last_event_millis: Option<i64>,
    rows: Result<(Vec<OutboxRow>, Vec<TimerRow>), Error>,
    older_than: Duration,
    now: Timestamp,
) -> Result<bool, Error> {
    let last_event_at = last_event_millis
        .and_then(|at| u64::try_from(at).ok())
        .map(Timestamp::from_millis);
    match rows {
        Ok((commands, timers)) => Ok(is_retirable(
            last_event_at,
            &commands,
            &timers,
            older_than,
            now,
        )),
        Err(Error::Corrupt(_)) => Ok(false),
        Err(e) => Err(e),
    }
}

/// How a store's retention run walks its workflows, once, in ID order: `find(state, after, limit)`
/// gives up to `limit` candidate IDs after `after` (the rule in SQL, to find them without reading
/// their rows), and `retire(state, ids)` retires a page of them (one transaction, each checked again
/// by [`may_retire`]) and says how many it retired. A page shorter than `batch` is the last; an ID
/// that is not a valid [`WorkflowId`] is no workflow of miniflow's, and is skipped. Returns how many
/// were retired.
///
/// # Errors
///
/// The first error of `find` or `retire` (the pages retired before it stay retired).
pub fn sweep_retirable<S>(
    state: &mut S,
    batch: usize,
    mut find: impl FnMut(&mut S, &str, usize) -> Result<Vec<String>, Error>,
    mut retire: impl FnMut(&mut S, Vec<WorkflowId>) -> Result<usize, Error>,
) -> Result<usize, Error> {
    let (mut after, mut retired) = (String::new(), 0);
    loop {
        let candidates = find(state, &after, batch)?;
        let Some(last) = candidates.last() else {
            return Ok(retired);
        };
        after.clone_from(last);
        let full_page = candidates.len() == batch;
        let workflows = candidates
            .into_iter()
            .filter_map(|id| WorkflowId::new(id).ok())
            .collect();
        retired += retire(state, workflows)?;
        if !full_page {
            return Ok(retired);
        }
    }
}

/// How many candidates `find` gives over all pages ([`sweep_retirable`] without retiring): what a
/// dry run of retention counts.
///
/// # Errors
///
/// The first error of `find`.
pub fn count_retirable(
    mut find: impl FnMut(&str, usize) -> Result<Vec<String>, Error>,
) -> Result<usize, Error> {
    const PAGE: usize = 10_000;
    let mut counted = 0;
    sweep_retirable(
        &mut (),
        PAGE,
        |_, after, limit| find(after, limit),
        |_, workflows| {
            counted += workflows.len();
            Ok(0)
        },
    )?;
    Ok(counted)
}

/// The error for a new event to a workflow that retention retired at `retired_at`: refused, and
/// nothing written.
pub fn retired(workflow_id: &WorkflowId, retired_at: Timestamp) -> Error {
    Error::invalid(
        "workflow_id",
        workflow_id,
        format!(
            "was retired by retention at {retired_at}: its history is deleted, and a new event \
             would start it again at seq 1, repeating its old command IDs; use a new workflow ID"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Command, Decision, Event};
    use crate::store::Commit;
    use crate::timer::Timer;
    use crate::{ClaimRequest, Failure, RetryPolicy, Seq};
    use serde_json::json;

    fn at(millis: u64) -> Timestamp {
        Timestamp::from_millis(millis)
    }

    /// A workflow's first commit at 1,000 ms with two commands and a timer due at 3,000 ms.
    fn first_commit() -> Commit {
        let decision = Decision::new()
            .command(Command::new("a", json!({})))
            .command(Command::new("b", json!({})))
            .timer(Timer::after("t", Duration::from_secs(2), json!({})));
        let event = Event::new("started", json!({}));
        Commit::new(
            WorkflowId::new("w").unwrap(),
            Seq::ZERO,
            event,
            decision,
            at(1_000),
        )
        .unwrap()
    }

    #[test]
    fn the_purge_cutoff_is_now_less_the_period_and_none_before_the_epoch() {
        let day = Duration::from_secs(86_400);
        assert_eq!(purge_cutoff(at(5_000), Duration::ZERO), Some(at(5_000)));
        assert_eq!(
            purge_cutoff(at(5_000), Duration::from_millis(1)),
            Some(at(4_999))
        );
        assert_eq!(
            purge_cutoff(at(5_000), Duration::from_millis(5_000)),
            Some(Timestamp::EPOCH)
        );
        assert_eq!(purge_cutoff(at(5_000), Duration::from_millis(5_001)), None);
        assert_eq!(
            purge_cutoff(Timestamp::EPOCH, Duration::ZERO),
            Some(Timestamp::EPOCH)
        );
        assert_eq!(
            purge_cutoff(at(u64::MAX), day),
            Some(at(u64::MAX - 86_400_000))
        );
        // Sub-millisecond parts of a period are dropped, as everywhere the core takes a duration.
        assert_eq!(
            purge_cutoff(at(5_000), Duration::from_micros(1_999)),
            Some(at(4_999))
        );
        // A period too long for milliseconds in a u64 reaches past every time.
        assert_eq!(purge_cutoff(at(u64::MAX), Duration::MAX), None);
    }

    #[test]
    fn what_is_old_enough_to_go_is_what_was_settled_at_or_before_the_cutoff() {
        let mut row = first_commit().commands()[0].clone();
        row.mark_done(at(u64::MAX - 10)).unwrap();
        let period = Duration::from_millis(20);
        // Settled 10 ms before the end of time: nothing is 20 ms old yet, however the sum rounds.
        assert!(!row.is_purgeable(period, at(u64::MAX)));
        assert!(!is_retirable(
            Some(at(0)),
            &[row.clone()],
            &[],
            period,
            at(u64::MAX)
        ));
        assert!(row.is_purgeable(Duration::from_millis(10), at(u64::MAX)));
        assert!(is_retirable(
            Some(at(0)),
            &[row],
            &[],
            Duration::from_millis(10),
            at(u64::MAX)
        ));
    }

    #[test]
    fn a_workflow_is_finished_only_when_every_command_and_timer_is_settled() {
        let commit = first_commit();
        let events = last_recorded_at(commit.events());
        let mut commands = commit.commands().to_vec();
        let mut timers = commit.timers().to_vec();
        assert_eq!(finished_at(events, &commands, &timers), None, "all open");

        commands[0].mark_done(at(2_000)).unwrap();
        let request = ClaimRequest::new("w");
        let token = commands[1].claim(&request, at(2_000)).unwrap().token;
        assert_eq!(
            finished_at(events, &commands, &timers),
            None,
            "one is leased"
        );
        let failure = Failure::permanent("refused");
        commands[1]
            .fail(token, &failure, &RetryPolicy::default(), at(2_500))
            .unwrap();
        assert_eq!(commands[1].status, Status::Dead);
        assert_eq!(
            finished_at(events, &commands, &timers),
            None,
            "a dead command waits for a person"
        );
        commands[1].resolve("refunded by hand", at(4_000)).unwrap();
        assert_eq!(
            finished_at(events, &commands, &timers),
            None,
            "its timer is scheduled"
        );
        timers[0].fire(at(3_500)).unwrap();
        assert_eq!(finished_at(events, &commands, &timers), Some(at(4_000)));

        assert!(!is_retirable(
            events,
            &commands,
            &timers,
            Duration::from_secs(10),
            at(13_999)
        ));
        assert!(is_retirable(
            events,
            &commands,
            &timers,
            Duration::from_secs(10),
            at(14_000)
        ));
    }

    #[test]
    fn a_sweep_pages_through_the_candidates_once_in_id_order_and_skips_invalid_ids() {
        let ids = ["", "a", "b", "c", "d", "e"];
        let find = |after: &str, limit: usize| -> Result<Vec<String>, Error> {
            Ok(ids
                .iter()
                .filter(|id| **id > after || (after.is_empty() && id.is_empty()))
                .take(limit)
                .map(|id| (*id).to_owned())
                .collect())
        };
        let mut pages: Vec<Vec<String>> = Vec::new();
        let retired = sweep_retirable(
            &mut pages,
            2,
            |_, after, limit| find(after, limit),
            |pages, workflows| {
                pages.push(workflows.iter().map(|w| w.as_str().to_owned()).collect());
                Ok(workflows.len() - 1)
            },
        )
        .unwrap();
        assert_eq!(pages, [vec!["a"], vec!["b", "c"], vec!["d", "e"]]);
        assert_eq!(retired, 2, "what each page said it retired");
        assert_eq!(count_retirable(find).unwrap(), 5);
        let failed = sweep_retirable(
            &mut (),
            2,
            |_, _, _| Err(Error::Storage("disk".into())),
            |_, _| Ok(0),
        );
        assert_eq!(failed.unwrap_err().code(), "STORAGE");
    }

    #[test]
    fn a_workflow_with_a_row_that_cannot_be_read_is_not_retired_and_store_errors_are_returned() {
        let week = Duration::from_secs(7 * 24 * 3600);
        let later = at(30 * 24 * 3600 * 1000);
        assert!(may_retire(Some(1_000), Ok((Vec::new(), Vec::new())), week, later).unwrap());
        assert!(
            !may_retire(None, Ok((Vec::new(), Vec::new())), week, later).unwrap(),
            "no event"
        );
        let unreadable = Err(Error::Corrupt("command w:1:0: status: bad".into()));
        assert!(!may_retire(Some(1_000), unreadable, week, later).unwrap());
        let failed = may_retire(Some(1_000), Err(Error::Storage("disk".into())), week, later);
        assert_eq!(failed.unwrap_err().code(), "STORAGE");
    }

    #[test]
    fn a_workflow_without_commands_finishes_at_its_last_event_and_one_without_events_never() {
        let commit = Commit::new(
            WorkflowId::new("w").unwrap(),
            Seq::ZERO,
            Event::new("noted", json!({})),
            Decision::none(),
            at(7),
        )
        .unwrap();
        let events = last_recorded_at(commit.events());
        assert_eq!(finished_at(events, &[], &[]), Some(at(7)));
        assert_eq!(finished_at(None, &[], &[]), None);
        let cancelled = {
            let mut row = first_commit().commands()[0].clone();
            row.cancel(at(9));
            row
        };
        assert_eq!(cancelled.status, Status::Cancelled);
        assert_eq!(finished_at(events, &[cancelled], &[]), Some(at(9)));
    }
}
