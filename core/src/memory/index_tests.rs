//! The indexes against the rules: random operations on a `MemoryStore`, and after every step the
//! indexes must hold exactly what the core's rules admit, in the rules' order; every claim must hand
//! out what a claim that scans and sorts every row by those rules hands out. A failure names the seed;
//! `MINIFLOW_INDEX_SEED=n` replays it.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::json;

use super::*;
use crate::outbox::ClaimOrder;
use crate::{Command, Decision, Event, Timer};

const WORKFLOWS: [&str; 5] = ["a", "a:1", "b-10", "b-9", "c"];
const KINDS: [&str; 2] = ["book", "pay"];
const NAMES: [&str; 2] = ["deadline", "reminder"];
const STEPS: usize = 300;

#[test]
fn claims_and_due_timers_agree_with_the_rules_on_random_operations() {
    let seeds: Vec<u64> = match std::env::var("MINIFLOW_INDEX_SEED") {
        Ok(seed) => vec![seed.parse().expect("MINIFLOW_INDEX_SEED is a number")],
        Err(_) => (0..16).collect(),
    };
    for seed in seeds {
        let mut run = Run {
            rng: fastrand::Rng::with_seed(seed),
            store: MemoryStore::new(),
            now: 1_000,
            deliveries: Vec::new(),
            seed,
        };
        for step in 0..STEPS {
            run.step(step);
            run.check_indexes(step);
        }
    }
}

struct Run {
    rng: fastrand::Rng,
    store: MemoryStore,
    now: u64,
    deliveries: Vec<Delivery>,
    seed: u64,
}

impl Run {
    fn now(&self) -> Timestamp {
        Timestamp::from_millis(self.now)
    }

    fn workflow(&mut self) -> WorkflowId {
        WorkflowId::new(WORKFLOWS[self.rng.usize(..WORKFLOWS.len())]).unwrap()
    }

    fn step(&mut self, step: usize) {
        let now = self.now();
        match self.rng.u8(..12) {
            0..=2 => self.commit(None),
            3 | 4 => self.claim(step),
            5 => {
                if let Some(d) = self.remembered() {
                    let _ = self.store.complete(&d.command_id, d.token, None, now);
                }
            }
            6 => {
                if let Some(d) = self.remembered() {
                    let failure = if self.rng.bool() {
                        Failure::retryable("503")
                    } else {
                        Failure::permanent("422")
                    };
                    let policy = RetryPolicy::default().max_attempts(self.rng.u32(1..4));
                    let _ = self
                        .store
                        .fail(&d.command_id, d.token, &failure, &policy, now);
                }
            }
            7 => {
                if let Some(d) = self.remembered() {
                    let ttl = Duration::from_millis(self.rng.u64(1..200));
                    if self.rng.bool() {
                        let _ = self.store.extend(&d.command_id, d.token, ttl, now);
                    } else {
                        let _ = self.store.release(&d.command_id, d.token, now);
                    }
                }
            }
            8 => {
                let rows: Vec<CommandId> = self.store.outbox.keys().cloned().collect();
                if !rows.is_empty() {
                    let id = rows[self.rng.usize(..rows.len())].clone();
                    let _ = match self.rng.u8(..3) {
                        0 => self.store.mark_done(&id, now),
                        1 => self.store.retry(&id, now),
                        _ => self.store.resolve(&id, "by hand", now),
                    };
                }
            }
            9 => self.fire_timers(step),
            // The operators pause, resume and limit kinds now and then.
            10 if self.rng.u8(..3) == 0 => {
                let kind = KINDS[self.rng.usize(..KINDS.len())];
                let change = match self.rng.u8(..4) {
                    0 => crate::KindChange::Pause,
                    1 => crate::KindChange::Resume,
                    2 => crate::KindChange::Limit(self.rng.u32(1..3)),
                    _ => crate::KindChange::RemoveLimit,
                };
                self.store.control_kind(kind, change, "ops", now).unwrap();
            }
            // The clock goes forwards, mostly, and sometimes back.
            _ => {
                if self.rng.u8(..4) == 0 {
                    self.now = self.now.saturating_sub(self.rng.u64(..300));
                } else {
                    self.now += self.rng.u64(..400);
                }
            }
        }
    }

    fn remembered(&mut self) -> Option<Delivery> {
        (!self.deliveries.is_empty())
            .then(|| self.deliveries[self.rng.usize(..self.deliveries.len())].clone())
    }

    /// A commit with up to three commands and two timers, maybe cancelling commands and timers, maybe
    /// firing `fires`.
    fn commit(&mut self, fires: Option<&TimerRow>) {
        let workflow = match fires {
            Some(timer) => timer.timer_id.workflow_id().clone(),
            None => self.workflow(),
        };
        let mut decision = Decision::new();
        for _ in 0..self.rng.usize(..4) {
            let kind = KINDS[self.rng.usize(..KINDS.len())];
            let priority = [-1, 0, 0, 0, 3][self.rng.usize(..5)];
            decision = decision
                .command(Command::new(kind, json!({ "n": self.rng.u8(..) })).priority(priority));
        }
        for _ in 0..self.rng.usize(..3) {
            let name = NAMES[self.rng.usize(..NAMES.len())];
            let delay = Duration::from_millis(self.rng.u64(..500));
            decision = decision.timer(Timer::after(name, delay, json!(null)));
        }
        if self.rng.u8(..4) == 0 {
            decision = decision.cancel_commands_of_kind(KINDS[self.rng.usize(..KINDS.len())]);
        }
        if self.rng.u8(..4) == 0 {
            decision = decision.cancel_timer(NAMES[self.rng.usize(..NAMES.len())]);
        }
        let seq = self.store.last_seq(&workflow);
        let event = Event::new("e", json!({}));
        let mut commit = Commit::new(workflow, seq, event, decision, self.now()).unwrap();
        if let Some(timer) = fires {
            commit = commit.firing(timer.timer_id.clone()).unwrap();
        }
        let _ = self.store.append_with_commands(&commit);
    }

    /// A claim, checked against a claim that scans every row and sorts by the rules.
    fn claim(&mut self, step: usize) {
        let order = if self.rng.bool() {
            ClaimOrder::DueFirst
        } else {
            ClaimOrder::StrictPerWorkflow
        };
        let request = ClaimRequest::new("w")
            .limit(self.rng.usize(1..6))
            .lease_ttl(Duration::from_millis(self.rng.u64(1..300)))
            .order(order)
            .retry_policy(&RetryPolicy::default().max_attempts(self.rng.u32(1..4)));
        let now = self.now();
        let mut scanned = self.store.clone();
        let expected = claim_by_scanning(&mut scanned, &request, now);
        let claimed = self.store.claim(&request, now).unwrap();
        assert_eq!(claimed, expected, "seed {} step {step}: claim", self.seed);
        assert_eq!(
            self.store.export_snapshot(),
            scanned.export_snapshot(),
            "seed {} step {step}: the store after the claim",
            self.seed
        );
        self.deliveries.extend(claimed);
        let excess = self.deliveries.len().saturating_sub(30);
        self.deliveries.drain(..excess);
    }

    /// Takes due timers, checked against a scan of every timer sorted by the rules, and fires some.
    fn fire_timers(&mut self, step: usize) {
        let now = self.now();
        let limit = self.rng.usize(1..5);
        let mut due: Vec<&TimerRow> = self
            .store
            .timers
            .values()
            .filter(|t| t.is_due(now))
            .collect();
        due.sort_by(|a, b| a.due_order().cmp(&b.due_order()));
        let expected: Vec<TimerId> = due.iter().take(limit).map(|t| t.timer_id.clone()).collect();
        let lease = Duration::from_millis(self.rng.u64(..100));
        let taken = self.store.claim_timers(limit, lease, now).unwrap();
        let taken_ids: Vec<TimerId> = taken.iter().map(|t| t.timer_id.clone()).collect();
        assert_eq!(
            taken_ids, expected,
            "seed {} step {step}: due timers",
            self.seed
        );
        for timer in taken {
            match self.rng.u8(..3) {
                0 => self.commit(Some(&timer)),
                1 => {
                    let _ = self.store.reject_timer(&timer.timer_id, "no", now);
                }
                _ => {}
            }
        }
    }

    /// The indexes hold exactly what the rules admit, in the rules' order, and claimable at any
    /// time are exactly the keys up to it.
    fn check_indexes(&self, step: usize) {
        let at = |what: &str| format!("seed {} step {step}: {what}", self.seed);
        let mut unfinished: Vec<&OutboxRow> = self
            .store
            .outbox
            .values()
            .filter(|row| row.status.is_unfinished())
            .collect();
        let mut heads: Vec<&OutboxRow> = Vec::new();
        for row in &unfinished {
            if heads.last().map(|h| h.command_id.workflow_id())
                != Some(row.command_id.workflow_id())
            {
                heads.push(row);
            }
        }
        let keys = |rows: &mut Vec<&OutboxRow>| {
            rows.sort_by(|a, b| a.claim_order().cmp(&b.claim_order()));
            rows.iter()
                .map(|row| {
                    let (priority, at, id) = row.claim_order();
                    (priority, at, id.clone())
                })
                .collect::<Vec<_>>()
        };
        let index = &self.store.unfinished;
        assert_eq!(
            index.keys(ClaimOrder::DueFirst),
            keys(&mut unfinished),
            "{}",
            at("the claim index")
        );
        assert_eq!(
            index.keys(ClaimOrder::StrictPerWorkflow),
            keys(&mut heads),
            "{}",
            at("the index of each workflow's first unfinished command")
        );
        for probe in [0, self.now.saturating_sub(100), self.now, self.now + 250] {
            let probe = Timestamp::from_millis(probe);
            let claimable: Vec<&CommandId> = self
                .store
                .outbox
                .values()
                .filter(|row| row.is_claimable(probe))
                .map(|row| &row.command_id)
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect();
            let indexed: Vec<&CommandId> = index
                .keys(ClaimOrder::DueFirst)
                .iter()
                .filter(|(_, at, _)| *at <= probe)
                .map(|(_, _, id)| self.store.outbox.get_key_value(id).unwrap().0)
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect();
            assert_eq!(indexed, claimable, "{}", at("claimable rows"));
        }
        let mut scheduled: Vec<&TimerRow> = self
            .store
            .timers
            .values()
            .filter(|t| t.status == crate::TimerStatus::Scheduled)
            .collect();
        scheduled.sort_by(|a, b| a.due_order().cmp(&b.due_order()));
        let expected: Vec<(Timestamp, String)> = scheduled
            .iter()
            .map(|t| (t.available_at, t.timer_id.to_string()))
            .collect();
        let indexed: Vec<(Timestamp, String)> = self
            .store
            .scheduled
            .keys()
            .into_iter()
            .map(|(at, key)| (at, key.to_string()))
            .collect();
        assert_eq!(indexed, expected, "{}", at("the due timer index"));
        for (key, timer) in &self.store.timers {
            assert_eq!(**key, timer.timer_id.to_string(), "{}", at("timer keys"));
        }
    }
}

/// A claim as the rules state it, without an index: every row that [`OutboxRow::is_claimable`], in
/// strict order only each workflow's first unfinished one, sorted by [`OutboxRow::claim_order`], taken
/// in that order, as the operators' controls admit ([`crate::backend::Admission`]), until `limit` deliveries.
fn claim_by_scanning(
    store: &mut MemoryStore,
    request: &ClaimRequest,
    now: Timestamp,
) -> Vec<Delivery> {
    let mut candidates: Vec<&OutboxRow> = Vec::new();
    let mut previous: Option<&WorkflowId> = None;
    for row in store.outbox.values().filter(|r| r.status.is_unfinished()) {
        let first_of_workflow = previous != Some(row.command_id.workflow_id());
        previous = Some(row.command_id.workflow_id());
        let strict = request.order == ClaimOrder::StrictPerWorkflow;
        if (!strict || first_of_workflow) && row.is_claimable(now) {
            candidates.push(row);
        }
    }
    candidates.sort_by(|a, b| a.claim_order().cmp(&b.claim_order()));
    let ids: Vec<CommandId> = candidates.iter().map(|r| r.command_id.clone()).collect();
    let mut admission = store.admission(now);
    let mut deliveries = Vec::new();
    for id in ids {
        if deliveries.len() == request.limit {
            break;
        }
        if !admission.admits(&store.outbox[&id]) {
            continue;
        }
        let changed = store.outbox[&id]
            .change(now, |row| Ok(row.claim(request, now)))
            .unwrap();
        store.unfinished.put(&changed.row);
        store.outbox.insert(id, changed.row);
        if let Some(timer) = changed.feedback {
            store.put_timer(timer);
        }
        if let Some(delivery) = changed.value {
            admission.took(&delivery.kind);
            deliveries.push(delivery);
        }
    }
    deliveries
}
