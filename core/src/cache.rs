//! The engine's state cache: workflow states folded from their events, kept between calls so a
//! commit reads only the events it has not folded yet.
//!
//! An entry is *taken out* while a call folds and decides on it and put back afterwards, so no lock is
//! held while the workflow's code runs, two calls never share a state, and a call that fails or panics
//! half-way simply leaves the workflow uncached.

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, PoisonError};

use crate::id::WorkflowId;
use crate::model::EventRecord;
use crate::store::HistoryId;

/// How many stores' answers to [`crate::EventLog::append_after`] an engine keeps.
const KNOWN_STORES: usize = 64;

/// The key of a cached state: the history it was folded from and its workflow.
pub(crate) type Key = (HistoryId, WorkflowId);

/// A state folded from a history's events up to and including `last`, and the events the engine
/// committed after it, not folded yet.
pub(crate) struct Entry<S> {
    /// The last event folded, as the store returned it: the entry is used again only if the store
    /// still holds exactly this event at its seq (or, with `unfolded`, the last of those).
    pub(crate) last: EventRecord,
    pub(crate) state: S,
    /// Events the engine committed after `last` on this state, folded into it when it is next used:
    /// the workflow's code runs before a commit, never after it.
    pub(crate) unfolded: Vec<EventRecord>,
}

/// How the state cache has been doing since the engine was built.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StateCacheStats {
    /// Calls that found their workflow's state and folded only the newer events.
    pub hits: u64,
    /// Calls that found nothing cached and replayed the workflow from its first event.
    pub misses: u64,
    /// Calls that found a state whose last event the store no longer holds as it was (another
    /// history, or events rolled back or removed): the state was dropped unused and the workflow
    /// replayed from its first event.
    pub stale: u64,
    /// States dropped to stay within the capacity, least recently used first.
    pub evicted: u64,
    /// States cached now.
    pub len: usize,
}

/// Least-recently-used states, at most `capacity` of them, behind a mutex held only to take or put.
pub(crate) struct StateCache<S> {
    capacity: usize,
    inner: Mutex<Lru<S>>,
}

struct Lru<S> {
    /// The entries, each with the time it was put.
    entries: HashMap<Key, (u64, Entry<S>)>,
    /// Keys by the time they were put, oldest first; a key put again (or taken) leaves its older
    /// times behind, skipped when they come up and dropped when they outnumber the entries.
    order: VecDeque<(u64, Key)>,
    clock: u64,
    stats: StateCacheStats,
    /// What the store of each history answered to [`crate::EventLog::append_after`]: whether it
    /// checks a commit's last event itself (and so keeps a commit's events as they are).
    checks_last: Vec<(HistoryId, bool)>,
}

impl<S> StateCache<S> {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            capacity,
            inner: Mutex::new(Lru {
                entries: HashMap::new(),
                order: VecDeque::new(),
                clock: 0,
                stats: StateCacheStats::default(),
                checks_last: Vec::new(),
            }),
        }
    }

    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Lru<S>> {
        // No workflow code runs under the lock, so a poisoned lock still holds consistent entries.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Removes and returns the entry of `key`, if any. The caller counts what it made of it.
    pub(crate) fn take(&self, key: &Key) -> Option<Entry<S>> {
        if self.capacity == 0 {
            return None;
        }
        let mut lru = self.lock();
        lru.entries.remove(key).map(|(_, entry)| entry)
    }

    /// Counts one lookup: `Some(true)` a hit, `Some(false)` a stale entry, `None` a miss.
    pub(crate) fn count(&self, found: Option<bool>) {
        let mut lru = self.lock();
        match found {
            Some(true) => lru.stats.hits += 1,
            Some(false) => lru.stats.stale += 1,
            None => lru.stats.misses += 1,
        }
    }

    /// Puts `entry` in as the most recently used, replacing an entry of the same key and evicting
    /// the least recently used beyond the capacity.
    pub(crate) fn put(&self, key: Key, entry: Entry<S>) {
        if self.capacity == 0 {
            return;
        }
        let mut lru = self.lock();
        lru.clock += 1;
        let stamp = lru.clock;
        lru.entries.insert(key.clone(), (stamp, entry));
        lru.order.push_back((stamp, key));
        while lru.entries.len() > self.capacity {
            let Some((put, oldest)) = lru.order.pop_front() else {
                break;
            };
            if lru
                .entries
                .get(&oldest)
                .is_some_and(|(current, _)| *current == put)
            {
                lru.entries.remove(&oldest);
                lru.stats.evicted += 1;
            }
        }
        if lru.order.len() > 2 * lru.entries.len() + 64 {
            let Lru { entries, order, .. } = &mut *lru;
            order.retain(|(put, key)| entries.get(key).is_some_and(|(current, _)| current == put));
        }
    }

    /// Whether the store of `history` checks a commit's last event itself, if known yet.
    pub(crate) fn checks_last(&self, history: HistoryId) -> Option<bool> {
        let lru = self.lock();
        let known = lru.checks_last.iter().find(|(h, _)| *h == history);
        known.map(|(_, checks)| *checks)
    }

    /// Remembers whether the store of `history` checks a commit's last event itself, for the last
    /// [`KNOWN_STORES`] histories, so that an engine used with store after store does not grow (a
    /// store forgotten is asked again).
    pub(crate) fn learn_checks_last(&self, history: HistoryId, checks: bool) {
        let mut lru = self.lock();
        if !lru.checks_last.iter().any(|(h, _)| *h == history) {
            if lru.checks_last.len() >= KNOWN_STORES {
                lru.checks_last.remove(0);
            }
            lru.checks_last.push((history, checks));
        }
    }

    /// Drops every entry.
    pub(crate) fn clear(&self) {
        let mut lru = self.lock();
        lru.entries.clear();
        lru.order.clear();
    }

    pub(crate) fn stats(&self) -> StateCacheStats {
        let lru = self.lock();
        StateCacheStats {
            len: lru.entries.len(),
            ..lru.stats
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::id::Seq;
    use crate::time::Timestamp;

    fn key(history: HistoryId, id: &str) -> Key {
        (history, WorkflowId::new(id).unwrap())
    }

    fn entry(id: &str, state: u32) -> Entry<u32> {
        Entry {
            last: EventRecord {
                workflow_id: WorkflowId::new(id).unwrap(),
                seq: Seq::ONE,
                kind: "e".into(),
                payload: serde_json::json!(null),
                recorded_at: Timestamp::EPOCH,
            },
            state,
            unfolded: Vec::new(),
        }
    }

    #[test]
    fn the_least_recently_put_entry_is_evicted_first() {
        let h = HistoryId::unique();
        let cache = StateCache::new(2);
        cache.put(key(h, "a"), entry("a", 1));
        cache.put(key(h, "b"), entry("b", 2));
        // "a" is used again: taken and put back, so "b" is now the oldest.
        let a = cache.take(&key(h, "a")).unwrap();
        cache.put(key(h, "a"), a);
        cache.put(key(h, "c"), entry("c", 3));
        assert!(cache.take(&key(h, "b")).is_none(), "b was evicted");
        assert_eq!(cache.take(&key(h, "a")).unwrap().state, 1);
        assert_eq!(cache.take(&key(h, "c")).unwrap().state, 3);
        assert_eq!(cache.stats().evicted, 1);
        assert_eq!(cache.stats().len, 0, "taken entries are out of the cache");
    }

    #[test]
    fn a_key_put_again_is_as_recent_as_its_last_put_and_old_times_do_not_pile_up() {
        let h = HistoryId::unique();
        let cache = StateCache::new(2);
        cache.put(key(h, "a"), entry("a", 1));
        cache.put(key(h, "b"), entry("b", 2));
        cache.put(key(h, "a"), entry("a", 3)); // without being taken first
        cache.put(key(h, "c"), entry("c", 4));
        assert!(
            cache.take(&key(h, "b")).is_none(),
            "b, not a, was the oldest"
        );
        assert_eq!(cache.take(&key(h, "a")).unwrap().state, 3);
        for n in 0..10_000 {
            cache.put(key(h, "hot"), entry("hot", n));
        }
        let lru = cache.lock();
        assert!(
            lru.order.len() <= 2 * lru.entries.len() + 64,
            "{}",
            lru.order.len()
        );
    }

    #[test]
    fn entries_of_other_histories_are_apart_and_capacity_zero_keeps_nothing() {
        let (h1, h2) = (HistoryId::unique(), HistoryId::unique());
        assert_ne!(h1, h2);
        let cache = StateCache::new(8);
        cache.put(key(h1, "w"), entry("w", 1));
        assert!(cache.take(&key(h2, "w")).is_none());
        assert_eq!(cache.take(&key(h1, "w")).unwrap().state, 1);
        cache.put(key(h1, "w"), entry("w", 1));
        cache.put(key(h1, "w"), entry("w", 2));
        assert_eq!(cache.stats().len, 1, "a put replaces the entry of its key");
        assert_eq!(cache.take(&key(h1, "w")).unwrap().state, 2);

        let off = StateCache::new(0);
        off.put(key(h1, "w"), entry("w", 1));
        assert!(off.take(&key(h1, "w")).is_none());
        assert_eq!(off.stats().len, 0);
    }

    #[test]
    fn what_stores_answered_is_kept_for_the_last_histories_only() {
        let cache: StateCache<u32> = StateCache::new(2);
        let first = HistoryId::unique();
        cache.learn_checks_last(first, true);
        assert_eq!(cache.checks_last(first), Some(true));
        for _ in 0..KNOWN_STORES {
            cache.learn_checks_last(HistoryId::unique(), false);
        }
        assert_eq!(cache.checks_last(first), None, "the oldest is asked again");
        assert_eq!(cache.lock().checks_last.len(), KNOWN_STORES);
    }
}
