//! The engine's state cache against replay from the first event, on random histories.
//!
//! Each step does one of: a commit through the engine (checked: it decided on the state replay from
//! the first event gives), a rival's commit, a race (a rival commits between the engine's read and its
//! write, so the engine's commit conflicts), a transaction through `Engine::plan_in` that commits or
//! rolls back (with up to three plans on one workflow, each reading the uncommitted events of those before),
//! switching to a second store that holds other histories under the same workflow IDs, and removing
//! a workflow's last events (what a restore or retention would do). Events come from a small alphabet
//! with a coarse clock, so different histories often end in equal events.
//!
//! `MINIFLOW_CACHE_SEED=n` replays one seed; `MINIFLOW_CACHE_RUNS=n` runs more.

use miniflow_core::backend::HistoryId;
use miniflow_core::prelude::*;
use miniflow_core::AppendedAfter;
use miniflow_core::{
    json, replay, Commit, Decision, Engine, Error, Event, EventRecord, MemoryStore, Seq, Timestamp,
    Workflow, WorkflowId,
};

/// Keeps the whole history it saw, so any state folded from other events shows.
struct Recorder;

impl Workflow for Recorder {
    type State = Vec<String>;

    fn evolve(&self, seen: &mut Vec<String>, event: &EventRecord) {
        seen.push(format!(
            "{}:{}:{}@{}",
            event.seq, event.kind, event.payload, event.recorded_at
        ));
    }

    fn decide(&self, seen: &Vec<String>, _: &EventRecord) -> Decision {
        Decision::new().command(miniflow_core::Command::new("saw", json!(seen)))
    }
}

/// A store under one history ID, which may lose its last events, and may let a rival commit just
/// before the next commit. One that `checks_last` checks a commit's last event itself
/// ([`EventLog::append_after`]), so the engine commits on its cached states without reading; the
/// other cannot, so the engine reads first.
struct Log {
    store: MemoryStore,
    history: HistoryId,
    race: Option<Event>,
    checks_last: bool,
}

impl EventLog for Log {
    fn load(&self, w: &WorkflowId) -> Result<Vec<EventRecord>, Error> {
        self.store.load(w)
    }
    fn load_after(&self, w: &WorkflowId, after: Seq) -> Result<Vec<EventRecord>, Error> {
        self.store.load_after(w, after)
    }
    fn history_id(&self) -> Option<HistoryId> {
        Some(self.history)
    }
    fn append_with_commands(&mut self, commit: &Commit) -> Result<(), Error> {
        self.rival_first(commit);
        self.store.append_with_commands(commit)
    }
    fn append_after(
        &mut self,
        last: &EventRecord,
        commit: &Commit,
    ) -> Result<AppendedAfter, Error> {
        if !self.checks_last {
            return Ok(AppendedAfter::Unchecked);
        }
        self.rival_first(commit);
        self.store.append_after(last, commit)
    }
}

impl Log {
    fn new(checks_last: bool) -> Self {
        Self {
            store: MemoryStore::new(),
            history: HistoryId::unique(),
            race: None,
            checks_last,
        }
    }

    /// The rival's commit, if one is to race `commit`.
    fn rival_first(&mut self, commit: &Commit) {
        if let Some(event) = self.race.take() {
            let w = commit.workflow_id().clone();
            let last = last_seq(&self.store, &w);
            let rival = Commit::new(w, last, event, Decision::none(), commit.now()).unwrap();
            self.store.append_with_commands(&rival).unwrap();
        }
    }

    /// The store without the last `n` events of `w` (and so without their commands).
    fn truncate(&mut self, w: &WorkflowId, n: usize) {
        let snapshot: serde_json::Value =
            serde_json::from_str(&self.store.export_snapshot()).unwrap();
        let keep = self.store.load(w).unwrap().len().saturating_sub(n) as u64;
        let mut snapshot = snapshot;
        let drop_event = |e: &serde_json::Value| {
            e["workflow_id"] == json!(w.as_str()) && e["seq"].as_u64().unwrap() > keep
        };
        snapshot["events"]
            .as_array_mut()
            .unwrap()
            .retain(|e| !drop_event(e));
        let prefix = format!("{w}:");
        snapshot["outbox"].as_array_mut().unwrap().retain(|row| {
            let id = row["command_id"].as_str().unwrap();
            let seq: u64 = id.rsplit(':').nth(1).unwrap().parse().unwrap();
            !(id.starts_with(&prefix) && seq > keep)
        });
        self.store = MemoryStore::from_snapshot(&snapshot.to_string()).unwrap();
    }
}

fn last_seq(store: &MemoryStore, w: &WorkflowId) -> Seq {
    store.load(w).unwrap().last().map_or(Seq::ZERO, |e| e.seq)
}

/// splitmix64: enough randomness for choosing steps, with no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

struct Run {
    seed: u64,
    rng: Rng,
    engine: Engine<Recorder>,
    logs: [Log; 2],
    /// Which log the steps use now.
    current: usize,
    /// Bumped when events are removed, so the removed events are never written again as they were.
    epoch: u64,
    log: Vec<String>,
}

const WORKFLOWS: [&str; 4] = ["a", "b", "c", "d"];

impl Run {
    fn new(seed: u64) -> Self {
        Self {
            seed,
            rng: Rng(seed),
            engine: Engine::new(Recorder).state_cache(3),
            logs: [Log::new(true), Log::new(false)],
            current: 0,
            epoch: 0,
            log: Vec::new(),
        }
    }

    fn workflow(&mut self) -> WorkflowId {
        WorkflowId::new(WORKFLOWS[self.rng.below(4) as usize]).unwrap()
    }

    /// One of a few kinds and payloads, at one of a few times: equal events are common.
    fn event(&mut self) -> (Event, Timestamp) {
        let kind = ["x", "y"][self.rng.below(2) as usize];
        let payload = json!({ "n": self.rng.below(2), "epoch": self.epoch });
        (
            Event::new(kind, payload),
            Timestamp::from_millis(self.rng.below(2)),
        )
    }

    fn fail(&self, what: &str) -> ! {
        let recent = self.log.len().saturating_sub(25);
        panic!(
            "seed {seed}: {what}\nreplay: MINIFLOW_CACHE_SEED={seed} cargo test -p miniflow-core \
             --test state_cache\nthe last steps:\n{steps}",
            seed = self.seed,
            steps = self.log[recent..].join("\n")
        );
    }

    /// The command decided at `seq` carries the state replay of the events before it gives.
    fn check(&self, w: &WorkflowId, seq: Seq, store: &MemoryStore) {
        let events = store.load(w).unwrap();
        let before = &events[..usize::try_from(seq.get() - 1).unwrap()];
        let expected = json!(replay(&Recorder, before).unwrap().state);
        let id = miniflow_core::CommandId::new(w.clone(), seq, 0).unwrap();
        let decided = store.command(&id).unwrap().unwrap().payload;
        if decided != expected {
            self.fail(&format!(
                "{id} was decided on\n  {decided}\nbut replay from the first event gives\n  {expected}"
            ));
        }
    }

    fn step(&mut self) {
        let w = self.workflow();
        match self.rng.below(100) {
            0..=44 => self.handle(&w, false),
            45..=54 => self.handle(&w, true),
            55..=69 => self.rival(&w),
            70..=84 => self.transaction(&w),
            85..=93 => {
                self.current = 1 - self.current;
                self.log.push(format!("switch to log {}", self.current));
            }
            _ => {
                let n = 1 + self.rng.below(3) as usize;
                self.logs[self.current].truncate(&w, n);
                self.epoch += 1;
                self.log.push(format!("remove the last {n} events of {w}"));
            }
        }
    }

    fn handle(&mut self, w: &WorkflowId, race: bool) {
        let (event, now) = self.event();
        if race {
            self.logs[self.current].race = Some(self.event().0);
        }
        self.log.push(format!(
            "handle {w} {} {} @{now}{}",
            event.kind,
            event.payload,
            if race { " (a rival commits first)" } else { "" }
        ));
        let log = &mut self.logs[self.current];
        let handled = self.engine.handle(log, w, event, now).unwrap();
        if race && handled.conflicts == 0 {
            self.fail("the rival's commit did not conflict");
        }
        self.check(w, handled.seq, &self.logs[self.current].store);
    }

    fn rival(&mut self, w: &WorkflowId) {
        let (event, now) = self.event();
        self.log
            .push(format!("rival {w} {} {} @{now}", event.kind, event.payload));
        let store = &mut self.logs[self.current].store;
        let commit = Commit::new(w.clone(), last_seq(store, w), event, Decision::none(), now);
        store.append_with_commands(&commit.unwrap()).unwrap();
    }

    /// One or two plans in a copy of the store (the transaction), then commit it or roll it back.
    fn transaction(&mut self, w: &WorkflowId) {
        let mut tx = self.logs[self.current].store.clone();
        let history = self.logs[self.current].history;
        let plans = 1 + self.rng.below(3);
        // Either each plan is remembered once the transaction committed, or at once (later plans
        // fold on from it) and forgotten if the transaction rolls back.
        let at_once = self.rng.below(2) == 0;
        let mut planned = Vec::new();
        let mut seqs = Vec::new();
        let mut events = Vec::new();
        for _ in 0..plans {
            let (event, now) = self.event();
            events.push((event.clone(), now));
            let plan = self
                .engine
                .plan_in(history, w, event, now, |after| tx.load_after(w, after))
                .unwrap();
            tx.append_with_commands(plan.commit()).unwrap();
            seqs.push(plan.commit().last_seq());
            if at_once {
                self.engine.remember(plan);
            } else {
                planned.push(plan);
            }
        }
        let commit = self.rng.below(2) == 0;
        self.log.push(format!(
            "transaction on {w}: {plans} plan(s) remembered {}, {}",
            if at_once {
                "at once"
            } else {
                "after the commit"
            },
            if commit { "committed" } else { "rolled back" }
        ));
        if !commit && at_once {
            self.engine.forget(history, w);
        }
        for seq in seqs {
            self.check(w, seq, &tx);
        }
        if commit {
            self.logs[self.current].store = tx;
            for plan in planned {
                self.engine.remember(plan);
            }
        } else if self.rng.below(2) == 0 {
            // Another writer commits what the rolled-back transaction did, but for its first event:
            // the history then holds the transaction's later events after a different one.
            let (first, _) = &mut events[0];
            first.payload["n"] = json!(1 - first.payload["n"].as_u64().unwrap());
            self.log.push(format!(
                "a rival commits the same events but the first, on {w}"
            ));
            let store = &mut self.logs[self.current].store;
            for (event, now) in events {
                let commit =
                    Commit::new(w.clone(), last_seq(store, w), event, Decision::none(), now);
                store.append_with_commands(&commit.unwrap()).unwrap();
            }
        }
    }
}

fn seeds() -> Vec<u64> {
    if let Ok(seed) = std::env::var("MINIFLOW_CACHE_SEED") {
        return vec![seed.parse().expect("MINIFLOW_CACHE_SEED is a number")];
    }
    let runs = std::env::var("MINIFLOW_CACHE_RUNS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(20);
    (1..=runs).collect()
}

#[test]
fn cached_states_decide_as_replay_from_the_first_event_does() {
    let mut totals = miniflow_core::StateCacheStats::default();
    for seed in seeds() {
        let mut run = Run::new(seed);
        for _ in 0..200 {
            run.step();
        }
        let stats = run.engine.state_cache_stats();
        totals.hits += stats.hits;
        totals.misses += stats.misses;
        totals.stale += stats.stale;
        totals.evicted += stats.evicted;
    }
    // The runs went through every path: folded on a cached state, replayed, found a state stale,
    // evicted one.
    assert!(totals.hits > 0, "{totals:?}");
    assert!(totals.misses > 0, "{totals:?}");
    assert!(totals.stale > 0, "{totals:?}");
    assert!(totals.evicted > 0, "{totals:?}");
}
