//! The operators' controls of a kind of command — pause and a concurrency limit — and the rule that
//! decides which commands a claim may take under them.
//!
//! **The rule** (stated once, here; every store applies it inside its claim, see [`Admission`]):
//! a claim takes a claimable command only if its kind is not paused and, for a kind with a
//! concurrency limit of N, fewer than N commands of that kind hold an unexpired lease
//! ([`OutboxRow::holds_lease`]) — counting the ones the claim itself has just leased. A command a
//! claim may not take is left as it is: not leased, not buried, its attempts not counted. Controls
//! are stored in the store, so they hold across processes from the next claim on.
//!
//! In strict per-workflow order a command of a paused or full kind still holds back the later
//! commands of its workflow: order within a workflow comes before the controls.
//!
//! A lease that runs out frees its slot, whether or not its holder is still at work (as it lets
//! another worker take the command over). A holder whose lease ran out and was not taken over may
//! still extend it with a late heartbeat: a heartbeat never fails for a limit, so the kind can then
//! hold one lease more than N until a delivery settles. Give limited kinds a lease TTL their
//! heartbeats keep up with.
//!
//! What it costs: the claim order is one global order, so a claim walks past the due commands of
//! the kinds it may not take that come before the ones it takes (an index walk on SQL stores, no
//! row read); a paused kind with a large due backlog makes every claim walk it (see
//! `benches/controls.rs`).

use serde::{Deserialize, Serialize};

use crate::error::Error;
use crate::model::check_kind;
use crate::outbox::OutboxRow;
use crate::time::Timestamp;

/// What an operator changes about a kind of command ([`KindControl::change`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KindChange {
    /// Claims skip the kind until it is resumed. Commands of the kind keep being committed.
    Pause,
    /// Claims take the kind again.
    Resume,
    /// At most this many commands of the kind hold an unexpired lease at once, across every worker
    /// and process (1 to [`KindControl::MAX_CONCURRENCY_LIMIT`]).
    Limit(u32),
    /// No concurrency limit for the kind.
    RemoveLimit,
}

/// The operators' controls of one kind, as stored, with who made the last change and when.
///
/// ```
/// use miniflow_core::{KindChange, KindControl, Timestamp};
///
/// let now = Timestamp::from_millis(1_000);
/// let paused = KindControl::change(None, "book_hotel", KindChange::Pause, "alice", now)?;
/// assert!(paused.paused && paused.is_active());
/// let limited = KindControl::change(Some(&paused), "book_hotel", KindChange::Limit(2), "bob", now)?;
/// assert_eq!((limited.paused, limited.concurrency_limit), (true, Some(2)));
/// assert_eq!(limited.changed_by, "bob");
/// assert!(KindControl::change(None, "book_hotel", KindChange::Limit(0), "bob", now).is_err());
/// # Ok::<(), miniflow_core::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KindControl {
    /// The command kind.
    pub kind: String,
    /// Claims skip the kind.
    pub paused: bool,
    /// At most this many commands of the kind hold an unexpired lease at once.
    pub concurrency_limit: Option<u32>,
    /// Who made the last change (a pause, a resume, a limit set or removed).
    pub changed_by: String,
    /// When.
    pub changed_at: Timestamp,
}

impl KindControl {
    /// The highest concurrency limit: 100,000 (far above any claim; a higher one limits nothing).
    pub const MAX_CONCURRENCY_LIMIT: u32 = 100_000;

    /// The controls of `kind` after `change` by `by` at `now`, from its `current` ones (`None` for a
    /// kind never controlled). Repeating a change is harmless; it is recorded again.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] naming the field and its value for a kind that is empty, longer than
    /// [`crate::MAX_KIND_LEN`] or holds a control character; a `by` that is empty, longer than 128 bytes
    /// or holds a control character; a limit of 0 (pause the kind instead) or above
    /// [`KindControl::MAX_CONCURRENCY_LIMIT`].
    pub fn change(
        current: Option<&KindControl>,
        kind: &str,
        change: KindChange,
        by: &str,
        now: Timestamp,
    ) -> Result<KindControl, Error> {
        check_kind("kind", kind)?;
        check_operator(by)?;
        let mut control = current.cloned().unwrap_or_else(|| KindControl {
            kind: kind.to_owned(),
            paused: false,
            concurrency_limit: None,
            changed_by: String::new(),
            changed_at: now,
        });
        match change {
            KindChange::Pause => control.paused = true,
            KindChange::Resume => control.paused = false,
            KindChange::Limit(0) => {
                return Err(Error::invalid(
                    "concurrency_limit",
                    0,
                    "must be at least 1; pause the kind to stop its deliveries",
                ))
            }
            KindChange::Limit(n) if n > Self::MAX_CONCURRENCY_LIMIT => {
                return Err(Error::invalid(
                    "concurrency_limit",
                    n,
                    format!("must be at most {}", Self::MAX_CONCURRENCY_LIMIT),
                ))
            }
            KindChange::Limit(n) => control.concurrency_limit = Some(n),
            KindChange::RemoveLimit => control.concurrency_limit = None,
        }
        control.changed_by = by.to_owned();
        control.changed_at = now;
        Ok(control)
    }

    /// Whether the controls restrict claims at all: paused, or limited.
    pub fn is_active(&self) -> bool {
        self.paused || self.concurrency_limit.is_some()
    }
}

/// The most dead commands one bulk retry or resolution changes in one transaction
/// ([`crate::Operations::retry_dead_of_kind`], [`crate::Operations::resolve_dead_of_kind`]): 1,000.
pub const MAX_BULK_BATCH: usize = 1_000;

/// Checks the arguments of a bulk action on the dead commands of `kind`. Every store calls it before
/// it writes, so bad arguments fail the same way on every backend and change nothing.
///
/// # Errors
///
/// [`Error::InvalidInput`] naming the field for a malformed kind (as for a command's kind) or a
/// batch of 0 or above [`MAX_BULK_BATCH`].
pub fn check_bulk(kind: &str, batch: usize) -> Result<(), Error> {
    check_kind("kind", kind)?;
    if !(1..=MAX_BULK_BATCH).contains(&batch) {
        return Err(Error::invalid(
            "batch",
            batch,
            format!("must be 1 to {MAX_BULK_BATCH}"),
        ));
    }
    Ok(())
}

/// Checks the `batch` of a retention call ([`crate::Operations::purge_done`],
/// [`crate::IdempotencyStore::purge`]): at least 1. A batch of 0 would purge nothing and return 0,
/// which the documented loop ("call it until it returns less than `batch`") never leaves.
///
/// # Errors
///
/// [`Error::InvalidInput`] naming `batch` for 0.
pub fn check_purge_batch(batch: usize) -> Result<(), Error> {
    if batch == 0 {
        return Err(Error::invalid("batch", batch, "must be at least 1"));
    }
    Ok(())
}

/// Checks the name of the person or tool that changes a control: 1 to 128 bytes, no control
/// characters.
fn check_operator(by: &str) -> Result<(), Error> {
    if by.is_empty() || by.len() > 128 {
        return Err(Error::invalid("by", by, "must be 1 to 128 bytes"));
    }
    if by.chars().any(char::is_control) {
        return Err(Error::invalid(
            "by",
            by,
            "must not contain control characters",
        ));
    }
    Ok(())
}

/// What the operators' controls let one claim take: the rule of this module, as a claim applies it.
///
/// A store builds it from the active controls at the start of a claim (inside the claim's
/// transaction), tells it how many unexpired leases each limited kind holds
/// ([`Admission::leased`]; a SQL store counts `status = 'leased' AND available_at > now`, see
/// [`OutboxRow::holds_lease`]), then asks [`Admission::admits`] of each candidate in claim order and
/// reports each lease it takes ([`Admission::took`]). [`Admission::excluded`] names the kinds a
/// claim query may leave out (paused, or without a slot left).
///
/// ```
/// use miniflow_core::{KindChange, KindControl, Timestamp};
/// use miniflow_core::backend::{Admission};
///
/// let now = Timestamp::from_millis(0);
/// let limit = KindControl::change(None, "mail", KindChange::Limit(2), "ops", now)?;
/// let pause = KindControl::change(None, "pay", KindChange::Pause, "ops", now)?;
/// let mut admission = Admission::new([&limit, &pause]);
/// admission.leased("mail", 1);
/// assert!(admission.admits_kind("mail") && !admission.admits_kind("pay") && admission.admits_kind("book"));
/// admission.took("mail");
/// assert!(!admission.admits_kind("mail"));
/// assert_eq!(admission.excluded(), ["mail", "pay"]);
/// # Ok::<(), miniflow_core::Error>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Admission {
    paused: ByKind<()>,
    /// The slots left for each limited kind: its limit less its unexpired leases.
    slots: ByKind<u32>,
}

/// Values by kind in a vector sorted by kind: few kinds carry controls, and a vector spares the
/// WebAssembly module two more B-tree instances (and a sort).
#[derive(Debug, Clone, PartialEq, Eq)]
struct ByKind<T>(Vec<(String, T)>);

impl<T> Default for ByKind<T> {
    fn default() -> Self {
        Self(Vec::new())
    }
}

impl<T> ByKind<T> {
    fn find(&self, kind: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|(k, _)| k.as_str().cmp(kind))
    }

    fn insert(&mut self, kind: &str, value: T) {
        match self.find(kind) {
            Ok(index) => self.0[index].1 = value,
            Err(index) => self.0.insert(index, (kind.to_owned(), value)),
        }
    }

    fn get(&self, kind: &str) -> Option<&T> {
        self.find(kind).ok().map(|index| &self.0[index].1)
    }

    fn get_mut(&mut self, kind: &str) -> Option<&mut T> {
        self.find(kind).ok().map(|index| &mut self.0[index].1)
    }

    fn contains(&self, kind: &str) -> bool {
        self.find(kind).is_ok()
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn iter(&self) -> impl Iterator<Item = (&String, &T)> {
        self.0.iter().map(|(kind, value)| (kind, value))
    }
}

impl Admission {
    /// The admission `controls` give a claim before counting leases: paused kinds are refused, each
    /// limited kind has its whole limit left.
    pub fn new<'a>(controls: impl IntoIterator<Item = &'a KindControl>) -> Self {
        let mut admission = Self::default();
        for control in controls {
            if control.paused {
                admission.paused.insert(&control.kind, ());
            } else if let Some(limit) = control.concurrency_limit {
                admission.slots.insert(&control.kind, limit);
            }
        }
        admission
    }

    /// Whether no control restricts this claim (the common case: nothing to count or filter).
    pub fn is_open(&self) -> bool {
        self.paused.is_empty() && self.slots.is_empty()
    }

    /// The limited kinds (not paused) whose unexpired leases the store must count, by kind.
    pub fn limited_kinds(&self) -> impl Iterator<Item = &str> {
        self.slots.iter().map(|(kind, _)| kind.as_str())
    }

    /// `kind` holds `leases` unexpired leases: its slots shrink by as many.
    pub fn leased(&mut self, kind: &str, leases: u64) {
        if let Some(slots) = self.slots.get_mut(kind) {
            *slots = slots.saturating_sub(u32::try_from(leases).unwrap_or(u32::MAX));
        }
    }

    /// This claim may not take `kind` at all (another claim is counting its leases): no slot left.
    pub fn withhold(&mut self, kind: &str) {
        if let Some(slots) = self.slots.get_mut(kind) {
            *slots = 0;
        }
    }

    /// Whether `kind` has a concurrency limit: its leases count towards it.
    pub fn is_limited(&self, kind: &str) -> bool {
        self.slots.contains(kind)
    }

    /// Whether a claim may take a command of `kind` now.
    pub fn admits_kind(&self, kind: &str) -> bool {
        !self.paused.contains(kind) && self.slots.get(kind).is_none_or(|slots| *slots > 0)
    }

    /// Whether a claim may take `row` now (see the module's rule).
    pub fn admits(&self, row: &OutboxRow) -> bool {
        self.admits_kind(&row.kind)
    }

    /// The claim leased a command of `kind`: one slot less.
    pub fn took(&mut self, kind: &str) {
        if let Some(slots) = self.slots.get_mut(kind) {
            *slots = slots.saturating_sub(1);
        }
    }

    /// The kinds a claim takes nothing of now (paused, or no slot left), by kind: what a claim query
    /// may leave out.
    pub fn excluded(&self) -> Vec<&str> {
        let full = self
            .slots
            .iter()
            .filter(|(_, slots)| **slots == 0)
            .map(|(kind, _)| kind);
        let paused = self.paused.iter().map(|(kind, _)| kind);
        let mut kinds: Vec<&str> = paused.chain(full).map(String::as_str).collect();
        kinds.sort_unstable();
        kinds
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(result: Result<KindControl, Error>) -> &'static str {
        match result {
            Err(Error::InvalidInput { field, .. }) => field,
            other => panic!("not InvalidInput: {other:?}"),
        }
    }

    #[test]
    fn changes_out_of_bounds_are_refused_naming_the_field() {
        let now = Timestamp::from_millis(5);
        let change =
            |kind: &str, change, by: &str| KindControl::change(None, kind, change, by, now);
        assert_eq!(field(change("", KindChange::Pause, "ops")), "kind");
        assert_eq!(field(change("a\nb", KindChange::Pause, "ops")), "kind");
        assert_eq!(
            field(change(&"k".repeat(129), KindChange::Pause, "ops")),
            "kind"
        );
        assert_eq!(field(change("k", KindChange::Pause, "")), "by");
        assert_eq!(field(change("k", KindChange::Pause, "a\u{1b}")), "by");
        assert_eq!(
            field(change("k", KindChange::Pause, &"o".repeat(129))),
            "by"
        );
        assert_eq!(
            field(change("k", KindChange::Limit(0), "ops")),
            "concurrency_limit"
        );
        let over = KindControl::MAX_CONCURRENCY_LIMIT + 1;
        assert_eq!(
            field(change("k", KindChange::Limit(over), "ops")),
            "concurrency_limit"
        );
        let max = change(
            "k",
            KindChange::Limit(KindControl::MAX_CONCURRENCY_LIMIT),
            "ops",
        );
        assert_eq!(
            max.unwrap().concurrency_limit,
            Some(KindControl::MAX_CONCURRENCY_LIMIT)
        );
    }

    #[test]
    fn each_change_keeps_the_other_control_and_records_who_and_when() {
        let at = Timestamp::from_millis;
        let paused = KindControl::change(None, "k", KindChange::Pause, "a", at(1)).unwrap();
        let limited =
            KindControl::change(Some(&paused), "k", KindChange::Limit(3), "b", at(2)).unwrap();
        assert_eq!((limited.paused, limited.concurrency_limit), (true, Some(3)));
        let resumed =
            KindControl::change(Some(&limited), "k", KindChange::Resume, "c", at(3)).unwrap();
        assert_eq!(
            (resumed.paused, resumed.concurrency_limit),
            (false, Some(3))
        );
        let open =
            KindControl::change(Some(&resumed), "k", KindChange::RemoveLimit, "d", at(4)).unwrap();
        assert!(!open.is_active());
        assert_eq!((open.changed_by.as_str(), open.changed_at), ("d", at(4)));
    }

    #[test]
    fn a_paused_kind_is_refused_whatever_its_limit_and_slots_run_out() {
        let now = Timestamp::from_millis(0);
        let both = KindControl {
            kind: "k".into(),
            paused: true,
            concurrency_limit: Some(5),
            changed_by: "ops".into(),
            changed_at: now,
        };
        let admission = Admission::new([&both]);
        assert!(!admission.admits_kind("k"));
        assert_eq!(admission.limited_kinds().count(), 0, "nothing to count");
        let limited = KindControl {
            paused: false,
            ..both
        };
        let mut admission = Admission::new([&limited]);
        admission.leased("k", 4);
        assert!(admission.admits_kind("k"));
        admission.took("k");
        assert!(!admission.admits_kind("k"));
        admission.took("k");
        assert_eq!(admission.excluded(), ["k"]);
        let mut admission = Admission::new([&limited]);
        admission.leased("k", u64::MAX);
        assert!(!admission.admits_kind("k"));
        let mut admission = Admission::new([&limited]);
        admission.withhold("k");
        assert!(!admission.admits_kind("k"));
        assert!(Admission::new([]).is_open());
    }
}
