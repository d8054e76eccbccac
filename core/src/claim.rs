//! The claim walk: the loop every store's claim runs, as a state machine the store drives with its
//! queries (DESIGN, "Where the rules live").
//!
//! A claim goes through the commands claimable when it began, in claim order
//! ([`OutboxRow::claim_order`]): the highest priority first, a page of what it still needs at a
//! time, after the last candidate it looked at, then the next lower priority. The walk owns every
//! decision on the way — which page to read next, whether a candidate was seen before, what the
//! operators' controls admit ([`Admission`]), the limit accounting, and the burial of what cannot
//! be claimed, which does not count towards the limit. A store only reads pages and writes rows:
//!
//! ```
//! use miniflow_core::backend::{Admission, ClaimStep, ClaimWalk, Offer};
//! use miniflow_core::{json, ClaimRequest, Command, CommandId, OutboxRow, Timestamp};
//!
//! // A store with two pending commands at priority 0, as a list in claim order.
//! let now = Timestamp::from_millis(10);
//! let mut rows: Vec<OutboxRow> = ["w:1:0", "w:1:1"]
//!     .iter()
//!     .map(|id| OutboxRow::pending(id.parse().unwrap(), Command::new("book", json!({})), Timestamp::EPOCH))
//!     .collect();
//!
//! let request = ClaimRequest::new("worker-1").limit(10);
//! let mut walk: ClaimWalk<usize, CommandId> = ClaimWalk::new(&request, Admission::default(), now);
//! let mut deliveries = Vec::new();
//! loop {
//!     match walk.next_step() {
//!         ClaimStep::FindPriority { below } => {
//!             // SELECT max(priority) … WHERE priority < below
//!             let level = rows.iter().map(|r| i64::from(r.priority)).filter(|p| *p < below).max();
//!             walk.at_priority(level);
//!         }
//!         ClaimStep::ReadPage(page) => {
//!             // SELECT … WHERE due AND priority = page.priority AND key > page.after LIMIT page.limit
//!             let from = page.after.map_or(0, |at| at + 1);
//!             let keys: Vec<usize> = (from..rows.len()).take(page.limit).collect();
//!             for &key in &keys {
//!                 let id = rows[key].command_id.clone();
//!                 let offer = walk.offer(key, &id, "w", Some(&rows[key]));
//!                 if offer == Offer::Claim {
//!                     deliveries.extend(walk.claim(&mut rows[key]));
//!                 }
//!             }
//!             walk.page_read(keys.len());
//!         }
//!         ClaimStep::Done => break,
//!     }
//! }
//! assert_eq!(deliveries.len(), 2);
//! ```
//!
//! In debug builds the walk checks each row a page returned against the core's predicate
//! ([`OutboxRow::is_claimable`], the page's priority, no row twice), so a store whose SQL filter
//! says something else fails loudly in its tests. The kinds a page excludes
//! ([`ClaimPage::excluded`]) are an optimisation: a store may offer them, and the walk skips them.

use crate::control::Admission;
use crate::error::Error;
use crate::limits::bounded_error;
use crate::outbox::{Changed, ClaimOrder, ClaimRequest, Delivery, OutboxRow};
use crate::status::Status;
use crate::time::Timestamp;
use crate::timer::TimerRow;

/// What the store does next for a claim ([`ClaimWalk::next_step`]).
#[derive(Debug)]
pub enum ClaimStep<'w, K> {
    /// Find the highest priority of an unfinished command below `below` (`i64::MAX` at first) and
    /// pass it to [`ClaimWalk::at_priority`] (`None` when there is none).
    FindPriority {
        /// The priority the level must be below.
        below: i64,
    },
    /// Read a page of candidates and offer each ([`ClaimWalk::offer`]), in claim order, then say
    /// how many the page held ([`ClaimWalk::page_read`]).
    ReadPage(ClaimPage<'w, K>),
    /// The claim is over: the limit is reached, or no priority is left.
    Done,
}

/// The page a claim reads next: up to `limit` claimable commands of `priority` whose key in claim
/// order comes after `after` (from the first when `None`), leaving out the kinds of
/// [`ClaimPage::excluded`] if the store can; in strict order, only the first unfinished command of
/// each workflow.
#[derive(Debug)]
pub struct ClaimPage<'w, K> {
    /// The priority of every command on the page.
    pub priority: i64,
    /// The key of the last candidate looked at, at this priority.
    pub after: Option<&'w K>,
    /// How many candidates to read at most: what the claim still needs.
    pub limit: usize,
    /// Strict per-workflow order ([`ClaimOrder::StrictPerWorkflow`]).
    pub strict: bool,
    admission: &'w Admission,
}

impl<K> ClaimPage<'_, K> {
    /// The kinds the claim takes nothing of now (paused, or no slot left), sorted: what a query
    /// leaves out.
    pub fn excluded(&self) -> Vec<&str> {
        self.admission.excluded()
    }
}

/// What to do with a candidate ([`ClaimWalk::offer`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offer {
    /// Leave it: seen before in this claim, or its kind ran out of slots within the page.
    Skip,
    /// Claim it with [`ClaimWalk::claim`] (a row changed in place) or [`ClaimWalk::claim_owned`]
    /// (a row read only to be claimed), and write what the rule made of it.
    Claim,
    /// It cannot be read: bury it ([`ClaimWalk::bury`]).
    Bury,
}

/// A claim in progress (see the module's documentation). `K` is the store's key of a candidate in
/// claim order (what its next page reads after), `I` what identifies a stored row (a row ID, or
/// the command's ID columns as stored).
#[derive(Debug)]
pub struct ClaimWalk<'r, K, I> {
    request: &'r ClaimRequest,
    now: Timestamp,
    admission: Admission,
    level: Level,
    after: Option<K>,
    /// The rows looked at, sorted, in debug builds: no page may offer a row twice. (A claimed row's
    /// lease runs at least a millisecond, [`ClaimRequest::MIN_LEASE_TTL`], so it is not due again
    /// within its claim; a buried one is finished.) Sorted vectors, not sets, spare the WebAssembly
    /// module a hash or B-tree instance.
    #[cfg(debug_assertions)]
    seen: Vec<I>,
    #[cfg(not(debug_assertions))]
    seen: std::marker::PhantomData<I>,
    /// The workflows looked at (strict order), sorted: a burial lets the next command of its
    /// workflow qualify, which was no candidate when the claim began.
    seen_workflows: Vec<String>,
    taken: usize,
    /// What the last page asked for.
    page_limit: usize,
}

/// Where the walk is among the priorities.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Level {
    /// The next level is the highest priority below this one.
    Find(i64),
    /// Reading pages at this priority.
    At(i64),
    /// No priority left.
    Done,
}

/// How a store writes the burial of a row it cannot read ([`ClaimWalk::bury`]): the columns that
/// change (the others stay as they are, for whoever repairs it), and the `command_failed` feedback
/// to insert unless a timer of that ID exists.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Burial {
    /// `dead`.
    pub status: Status,
    /// Why, naming the command and what could not be read.
    pub last_error: String,
    /// When.
    pub processed_at: Timestamp,
    /// The feedback its workflow is told by, when the row's key columns read.
    pub feedback: Option<TimerRow>,
}

/// A candidate that cannot be read: which command (its ID as stored), why (naming the column), and
/// what could be read of it ([`OutboxRow`] with the columns that read; `None` when its key columns
/// do not spell a command ID, and so no workflow can be told).
#[derive(Debug, Clone, PartialEq)]
pub struct Unclaimable {
    /// The command's ID as stored (`workflow_id:event_seq:idx`).
    pub name: String,
    /// Why it cannot be read.
    pub why: String,
    /// What could be read of it.
    pub salvaged: Option<OutboxRow>,
}

impl<'r, K, I: Ord + Clone> ClaimWalk<'r, K, I> {
    /// A claim of `request` at `now` under `admission` (the controls of kinds, with the leases of
    /// each limited kind counted). The store has validated `request` ([`ClaimRequest::validate`]).
    #[inline(always)]
    pub fn new(request: &'r ClaimRequest, admission: Admission, now: Timestamp) -> Self {
        Self {
            request,
            now,
            admission,
            level: Level::Find(i64::MAX),
            after: None,
            seen: Default::default(),
            seen_workflows: Vec::new(),
            taken: 0,
            page_limit: 0,
        }
    }

    /// What the store does next.
    #[inline(always)]
    pub fn next_step(&mut self) -> ClaimStep<'_, K> {
        if self.taken >= self.request.limit {
            return ClaimStep::Done;
        }
        self.page_limit = self.request.limit - self.taken;
        match self.level {
            Level::Find(below) => ClaimStep::FindPriority { below },
            Level::At(priority) => ClaimStep::ReadPage(ClaimPage {
                priority,
                after: self.after.as_ref(),
                limit: self.page_limit,
                strict: self.request.order == ClaimOrder::StrictPerWorkflow,
                admission: &self.admission,
            }),
            Level::Done => ClaimStep::Done,
        }
    }

    /// The highest priority of an unfinished command below the one asked for, if any.
    #[inline(always)]
    pub fn at_priority(&mut self, level: Option<i64>) {
        self.level = level.map_or(Level::Done, Level::At);
        self.after = None;
    }

    /// A candidate of the page, in claim order: its key (the page after it starts there), its row's
    /// identity, its workflow as stored, and the row if it reads (`None`: it cannot be read).
    #[inline(always)]
    pub fn offer(&mut self, key: K, id: &I, workflow: &str, row: Option<&OutboxRow>) -> Offer {
        self.after = Some(key);
        #[cfg(debug_assertions)]
        debug_assert!(
            insert_sorted(&mut self.seen, id.clone()),
            "the store's claim query offered a row twice in one claim"
        );
        #[cfg(not(debug_assertions))]
        let _ = id;
        let first_look = match self.request.order {
            ClaimOrder::DueFirst => true,
            ClaimOrder::StrictPerWorkflow => match self
                .seen_workflows
                .binary_search_by(|seen| seen.as_str().cmp(workflow))
            {
                Ok(_) => false,
                Err(at) => {
                    self.seen_workflows.insert(at, workflow.to_owned());
                    true
                }
            },
        };
        if !first_look {
            return Offer::Skip;
        }
        let Some(row) = row else {
            return Offer::Bury;
        };
        self.check_candidate(row);
        if self.admission.admits(row) {
            Offer::Claim
        } else {
            // Its kind ran out of slots earlier in this page.
            Offer::Skip
        }
    }

    /// In debug builds: the row a store's query returned is one the core's rule claims.
    fn check_candidate(&self, row: &OutboxRow) {
        debug_assert!(
            row.is_claimable(self.now),
            "the store's claim query returned {} ({:?}, due at {}), which is not claimable at {}",
            row.command_id,
            row.status,
            row.available_at,
            self.now
        );
        debug_assert!(
            self.level == Level::At(i64::from(row.priority)),
            "the store's claim query returned {} of priority {} on a page of {:?}",
            row.command_id,
            row.priority,
            self.level
        );
    }

    /// Claims a candidate offered as [`Offer::Claim`], in place ([`OutboxRow::claim`]): the
    /// delivery, or `None` when the rule buried it instead (its lease ran out on its last attempt,
    /// or its workflow cancelled it) — a burial does not count towards the limit.
    #[inline(always)]
    pub fn claim(&mut self, row: &mut OutboxRow) -> Option<Delivery> {
        let delivery = row.claim(self.request, self.now)?;
        self.took(&delivery.kind);
        Some(delivery)
    }

    /// As [`ClaimWalk::claim`], for a row the store read only to claim it: the change to write
    /// (its feedback included), the payload moved into the delivery instead of copied (a claim
    /// never writes the payload).
    ///
    /// # Errors
    ///
    /// None today; a rule's error if one is added.
    pub fn claim_owned(&mut self, mut row: OutboxRow) -> Result<Changed<Option<Delivery>>, Error> {
        let payload = std::mem::take(&mut row.payload);
        let (request, now) = (self.request, self.now);
        let mut changed = row.into_change(now, |row| Ok(row.claim(request, now)))?;
        if let Some(delivery) = &mut changed.value {
            delivery.payload = payload;
            let kind = delivery.kind.clone();
            self.took(&kind);
        }
        Ok(changed)
    }

    #[inline(always)]
    fn took(&mut self, kind: &str) {
        self.admission.took(kind);
        self.taken += 1;
    }

    /// Whether a lease of `kind` counts towards a concurrency limit (a store that marks counted
    /// leases writes the mark).
    pub fn is_limited(&self, kind: &str) -> bool {
        self.admission.is_limited(kind)
    }

    /// How to bury a candidate offered as [`Offer::Bury`] (DESIGN rule 13): dead, its last error
    /// naming the command and what could not be read, processed now, and the `command_failed`
    /// feedback of a dead command when its key columns read. It stops no other delivery, and does
    /// not count towards the limit.
    ///
    /// # Errors
    ///
    /// None today; a rule's error if one is added.
    pub fn bury(&self, unclaimable: Unclaimable) -> Result<Burial, Error> {
        let reason = format!(
            "the stored command could not be read: command {}: {}",
            unclaimable.name, unclaimable.why
        );
        let now = self.now;
        Ok(match unclaimable.salvaged {
            Some(row) => {
                let changed = row.into_change(now, |row| {
                    row.bury(reason, now);
                    Ok(())
                })?;
                Burial {
                    status: changed.row.status,
                    last_error: changed.row.last_error.unwrap_or_default(),
                    processed_at: now,
                    feedback: changed.feedback,
                }
            }
            None => Burial {
                status: Status::Dead,
                last_error: bounded_error(&reason),
                processed_at: now,
                feedback: None,
            },
        })
    }

    /// The page just offered held `rows` candidates: a page shorter than it was asked to be ends
    /// the priority; a full one may have more behind it.
    #[inline(always)]
    pub fn page_read(&mut self, rows: usize) {
        if let Level::At(priority) = self.level {
            if rows < self.page_limit {
                self.level = Level::Find(priority);
                self.after = None;
            }
        }
    }

    /// How many commands the claim has leased.
    pub fn taken(&self) -> usize {
        self.taken
    }
}

/// Inserts `value` into the sorted `values`; false when it was there.
#[cfg(debug_assertions)]
fn insert_sorted<T: Ord>(values: &mut Vec<T>, value: T) -> bool {
    match values.binary_search(&value) {
        Ok(_) => false,
        Err(at) => {
            values.insert(at, value);
            true
        }
    }
}

/// A claim of due timers ([`crate::prelude::Timers::claim_timers`]), as a state machine the store
/// drives: it reads up to [`TimerClaim::wanted`] due timers in due order
/// ([`TimerRow::due_order`]), offers each ([`TimerClaim::offer`]), and reads again while the last
/// page was full and the claim still wants some. A timer that cannot be read is buried
/// (`rejected`, with why: DESIGN rule 13) and does not count towards the limit.
///
/// ```
/// use std::time::Duration;
/// use miniflow_core::backend::{TimerClaim, TimerOffer};
/// use miniflow_core::Timestamp;
///
/// let mut claim = TimerClaim::new(10, Duration::from_secs(30), Timestamp::from_millis(5));
/// assert_eq!(claim.wanted(), Some(10));
/// // A row whose payload does not read:
/// let offer = claim.offer("w:1:t0", Err("column payload is not JSON".to_owned()));
/// let TimerOffer::Reject { last_error, .. } = offer else { panic!("buried") };
/// assert_eq!(last_error, "the stored timer could not be read: timer w:1:t0: column payload is not JSON");
/// claim.page_read(1);
/// assert_eq!(claim.wanted(), None, "a short page: nothing more is due");
/// ```
#[derive(Debug)]
pub struct TimerClaim {
    limit: usize,
    lease_ttl: std::time::Duration,
    now: Timestamp,
    taken: usize,
    page_limit: usize,
    /// Timers the current page took or buried: a page of nothing but timers seen before (taken
    /// for no time at all, so still due) ends the claim instead of reading them again forever.
    moved: usize,
    more: bool,
    seen: Vec<String>,
}

/// What to do with a timer a claim read ([`TimerClaim::offer`]).
#[derive(Debug, Clone, PartialEq)]
pub enum TimerOffer {
    /// Taken: write its `available_at` (the take's end); hand it to the firer.
    Take(TimerRow),
    /// It cannot be read: end it `rejected`, processed at `processed_at`, with `last_error` (only
    /// while it is unprocessed).
    Reject {
        /// Why, naming the timer and what could not be read.
        last_error: String,
        /// When.
        processed_at: Timestamp,
    },
    /// Seen before in this claim: leave it.
    Skip,
}

impl TimerClaim {
    /// A claim of up to `limit` timers due at `now`, each taken for `lease_ttl`.
    pub fn new(limit: usize, lease_ttl: std::time::Duration, now: Timestamp) -> Self {
        Self {
            limit,
            lease_ttl,
            now,
            taken: 0,
            page_limit: 0,
            moved: 0,
            more: limit > 0,
            seen: Vec::new(),
        }
    }

    /// How many due timers to read next, or `None` when the claim is over.
    pub fn wanted(&mut self) -> Option<usize> {
        self.page_limit = self.limit.saturating_sub(self.taken);
        self.moved = 0;
        (self.more && self.page_limit > 0).then_some(self.page_limit)
    }

    /// A timer the page returned, in due order: `timer_id` as stored, and the row or why it cannot
    /// be read.
    pub fn offer(&mut self, timer_id: &str, timer: Result<TimerRow, String>) -> TimerOffer {
        match self
            .seen
            .binary_search_by(|seen| seen.as_str().cmp(timer_id))
        {
            Ok(_) => return TimerOffer::Skip,
            Err(at) => self.seen.insert(at, timer_id.to_owned()),
        }
        self.moved += 1;
        match timer {
            Ok(mut timer) => {
                debug_assert!(
                    timer.is_due(self.now),
                    "the store's timer query returned {}, which is not due at {}",
                    timer.timer_id,
                    self.now
                );
                timer.take(self.lease_ttl, self.now);
                self.taken += 1;
                TimerOffer::Take(timer)
            }
            Err(why) => TimerOffer::Reject {
                last_error: bounded_error(&format!(
                    "the stored timer could not be read: timer {timer_id}: {why}"
                )),
                processed_at: self.now,
            },
        }
    }

    /// The page just offered held `rows` timers: a short page ends the claim, and so does one that
    /// took and buried nothing.
    pub fn page_read(&mut self, rows: usize) {
        self.more = rows >= self.page_limit && self.moved > 0;
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{json, Command, CommandId, KindControl, Timer, TimerId};

    const NOW: Timestamp = Timestamp::from_millis(100);

    fn row(id: &str, kind: &str, priority: i32) -> OutboxRow {
        let command = Command::new(kind, json!({})).priority(priority);
        OutboxRow::pending(id.parse().unwrap(), command, Timestamp::EPOCH)
    }

    /// Drives a walk over `rows` (each priority's rows in claim order), as a store would: what it
    /// claimed, and the pages it read as `(priority, limit)`.
    fn drive(
        request: &ClaimRequest,
        admission: Admission,
        rows: &mut [OutboxRow],
    ) -> (Vec<String>, Vec<(i64, usize)>) {
        let mut walk: ClaimWalk<usize, CommandId> = ClaimWalk::new(request, admission, NOW);
        let (mut claimed, mut pages) = (Vec::new(), Vec::new());
        loop {
            match walk.next_step() {
                ClaimStep::Done => return (claimed, pages),
                ClaimStep::FindPriority { below } => {
                    let level = rows
                        .iter()
                        .map(|r| i64::from(r.priority))
                        .filter(|p| *p < below);
                    walk.at_priority(level.max());
                }
                ClaimStep::ReadPage(page) => {
                    pages.push((page.priority, page.limit));
                    let (priority, from) = (page.priority, page.after.map_or(0, |at| at + 1));
                    let keys: Vec<usize> = (from..rows.len())
                        .filter(|k| i64::from(rows[*k].priority) == priority)
                        .filter(|k| rows[*k].is_claimable(NOW))
                        .take(page.limit)
                        .collect();
                    for &key in &keys {
                        let id = rows[key].command_id.clone();
                        let workflow = id.workflow_id().as_str().to_owned();
                        if walk.offer(key, &id, &workflow, Some(&rows[key])) == Offer::Claim {
                            claimed.extend(
                                walk.claim(&mut rows[key]).map(|d| d.command_id.to_string()),
                            );
                        }
                    }
                    walk.page_read(keys.len());
                }
            }
        }
    }

    #[test]
    fn the_walk_takes_the_highest_priority_first_and_reads_on_past_what_it_cannot_take() {
        let mut rows = vec![
            row("a:1:0", "mail", 5),
            row("b:1:0", "book", 5),
            row("c:1:0", "book", 0),
        ];
        let controls = [KindControl {
            kind: "mail".into(),
            paused: true,
            concurrency_limit: None,
            changed_by: "ops".into(),
            changed_at: Timestamp::EPOCH,
        }];
        let request = ClaimRequest::new("w").limit(2);
        let (claimed, pages) = drive(&request, Admission::new(&controls), &mut rows);
        assert_eq!(
            claimed,
            ["b:1:0", "c:1:0"],
            "the paused kind is skipped, not counted"
        );
        assert_eq!(
            pages,
            [(5, 2), (5, 1), (0, 1)],
            "a full page reads on after its last key; a short one ends its priority"
        );
    }

    #[test]
    fn in_strict_order_a_workflow_looked_at_is_not_taken_again_in_the_same_claim() {
        let mut rows = vec![row("a:1:0", "book", 0), row("a:1:1", "book", 0)];
        let request = ClaimRequest::new("w")
            .limit(5)
            .order(ClaimOrder::StrictPerWorkflow);
        let (claimed, _) = drive(&request, Admission::default(), &mut rows);
        assert_eq!(claimed, ["a:1:0"]);
    }

    #[test]
    fn a_burial_does_not_use_up_the_limit() {
        let request = ClaimRequest::new("w").limit(1);
        let mut walk: ClaimWalk<usize, CommandId> =
            ClaimWalk::new(&request, Admission::default(), NOW);
        walk.at_priority(Some(0));
        let id: CommandId = "w:1:0".parse().unwrap();
        assert_eq!(walk.offer(0, &id, "w", None), Offer::Bury);
        let burial = walk
            .bury(Unclaimable {
                name: "w:1:0".into(),
                why: "column payload is not JSON".into(),
                salvaged: Some(row("w:1:0", "book", 0)),
            })
            .unwrap();
        assert_eq!(burial.status, Status::Dead);
        assert_eq!(
            burial.last_error,
            "the stored command could not be read: command w:1:0: column payload is not JSON"
        );
        assert_eq!(
            burial.feedback.map(|t| t.timer_id.to_string()).as_deref(),
            Some("w:1:0:failed1")
        );
        assert!(matches!(walk.next_step(), ClaimStep::ReadPage(page) if page.limit == 1));
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "not claimable")]
    fn a_store_whose_query_returns_a_row_not_yet_due_fails_loudly() {
        let request = ClaimRequest::new("w");
        let mut walk: ClaimWalk<usize, CommandId> =
            ClaimWalk::new(&request, Admission::default(), NOW);
        walk.at_priority(Some(0));
        let mut later = row("w:1:0", "book", 0);
        later.available_at = Timestamp::from_millis(200);
        walk.offer(0, &later.command_id.clone(), "w", Some(&later));
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "of priority 3 on a page of At(0)")]
    fn a_store_whose_query_returns_another_priority_fails_loudly() {
        let request = ClaimRequest::new("w");
        let mut walk: ClaimWalk<usize, CommandId> =
            ClaimWalk::new(&request, Admission::default(), NOW);
        walk.at_priority(Some(0));
        let other = row("w:1:0", "book", 3);
        walk.offer(0, &other.command_id.clone(), "w", Some(&other));
    }

    #[test]
    fn a_timer_page_of_nothing_but_timers_seen_before_ends_the_claim() {
        let mut claim = TimerClaim::new(3, Duration::ZERO, NOW);
        let timer = |id: &str| {
            let timer_id: TimerId = id.parse().unwrap();
            TimerRow::scheduled(
                timer_id,
                Timer::at("t", Timestamp::EPOCH, json!({})),
                Timestamp::EPOCH,
            )
        };
        assert_eq!(claim.wanted(), Some(3));
        // One taken, one unreadable, and a third the page holds.
        assert!(matches!(
            claim.offer("w:1:t0", Ok(timer("w:1:t0"))),
            TimerOffer::Take(_)
        ));
        assert!(matches!(
            claim.offer("w:1:t1", Err("bad".into())),
            TimerOffer::Reject { .. }
        ));
        assert!(matches!(
            claim.offer("w:1:t2", Ok(timer("w:1:t2"))),
            TimerOffer::Take(_)
        ));
        claim.page_read(3);
        // Taken for no time at all, the two are due still, and the store reads them again.
        assert_eq!(claim.wanted(), Some(1));
        assert_eq!(claim.offer("w:1:t0", Ok(timer("w:1:t0"))), TimerOffer::Skip);
        claim.page_read(1);
        assert_eq!(claim.wanted(), None, "nothing moved: the claim ends");
    }
}
