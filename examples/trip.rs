//! The design article's demo: a trip workflow, a supplier that folds duplicates by command ID, and a
//! crash between the supplier's success and `mark_done`.
//!
//! Run with `cargo run --example trip`. It prints exactly:
//!
//! ```text
//! first delivery: REF-1
//! retry delivery: REF-1
//! real side effects: 1
//! pending: 0
//! ```

use std::collections::HashMap;

use miniflow::prelude::*;
use miniflow::{
    json, Clock, Command, CommandId, Decision, Engine, Event, EventRecord, SqliteStore,
    SystemClock, Workflow, WorkflowId,
};

/// What a trip knows so far.
#[derive(Default)]
struct Trip {
    city: Option<String>,
}

/// `trip_requested` locks a budget for the trip.
struct TripWorkflow;

impl Workflow for TripWorkflow {
    type State = Trip;

    fn evolve(&self, trip: &mut Trip, event: &EventRecord) {
        if event.kind == "trip_requested" {
            trip.city = event.payload["city"].as_str().map(str::to_owned);
        }
    }

    fn decide(&self, trip: &Trip, event: &EventRecord) -> Decision {
        match event.kind.as_str() {
            "trip_requested" if trip.city.is_none() => Decision::new().command(Command::new(
                "lock_budget",
                json!({ "trip_id": event.workflow_id }),
            )),
            _ => Decision::none(),
        }
    }
}

/// A supplier that honours idempotency keys: a repeated command ID gets the first result back.
#[derive(Default)]
struct FakeSupplier {
    results: HashMap<CommandId, String>,
    side_effects: usize,
}

impl FakeSupplier {
    fn execute(&mut self, command_id: &CommandId) -> String {
        if let Some(result) = self.results.get(command_id) {
            return result.clone();
        }
        self.side_effects += 1;
        let result = format!("REF-{}", self.side_effects);
        self.results.insert(command_id.clone(), result.clone());
        result
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("flow.db");
    let clock = SystemClock;
    let engine = Engine::new(TripWorkflow);
    let mut supplier = FakeSupplier::default();
    let trip = WorkflowId::new("trip-001")?;

    let mut store = SqliteStore::open(&path)?;
    engine.handle(
        &mut store,
        &trip,
        Event::new("trip_requested", json!({ "city": "成都" })),
        clock.now(),
    )?;

    let first = store.pending(1)?.remove(0);
    println!("first delivery: {}", supplier.execute(&first.command_id));
    // The process dies here: the supplier did the work, but `mark_done` never ran.
    drop(store);

    let mut store = SqliteStore::open(&path)?;
    let again = store.pending(1)?.remove(0);
    println!("retry delivery: {}", supplier.execute(&again.command_id));
    store.mark_done(&again.command_id, clock.now())?;

    println!("real side effects: {}", supplier.side_effects);
    println!("pending: {}", store.pending(usize::MAX)?.len());
    Ok(())
}
