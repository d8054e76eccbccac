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
//!
//! The store is a SQLite file in a temporary directory, or a PostgreSQL database when a URL is given:
//! `cargo run --example trip --features postgres -- --database-url postgresql://user@host/db` (or
//! `MINIFLOW_DATABASE_URL=… cargo run --example trip --features postgres`). The database keeps what
//! the run wrote, so there the trip's ID carries the time of the run, to meet no earlier one; the
//! "crash" drops the connection pool and connects a new one.

use std::collections::HashMap;

use miniflow::prelude::*;
use miniflow::{
    json, Clock, Command, CommandId, Decision, Engine, Error, Event, EventRecord, SqliteStore,
    Status, SystemClock, Workflow, WorkflowId,
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

/// The trip's unfinished commands, in delivery order (what `pending` lists, for this trip alone: a
/// database may hold other workflows).
fn pending(store: &impl Outbox, trip: &WorkflowId) -> Result<Vec<miniflow::OutboxRow>, Error> {
    let mut rows = store.commands(trip)?;
    rows.retain(|row| matches!(row.status, Status::Pending | Status::Leased));
    Ok(rows)
}

/// The demo on the store `open` opens; it opens it again after the "crash".
fn demo<S: Store>(
    open: impl Fn() -> Result<S, Error>,
    trip: &WorkflowId,
) -> Result<(), Box<dyn std::error::Error>> {
    let clock = SystemClock;
    let engine = Engine::new(TripWorkflow);
    let mut supplier = FakeSupplier::default();

    let mut store = open()?;
    engine.handle(
        &mut store,
        trip,
        Event::new("trip_requested", json!({ "city": "成都" })),
        clock.now(),
    )?;

    let first = pending(&store, trip)?.remove(0);
    println!("first delivery: {}", supplier.execute(&first.command_id));
    // The process dies here: the supplier did the work, but `mark_done` never ran.
    drop(store);

    let mut store = open()?;
    let again = pending(&store, trip)?.remove(0);
    println!("retry delivery: {}", supplier.execute(&again.command_id));
    store.mark_done(&again.command_id, clock.now())?;

    println!("real side effects: {}", supplier.side_effects);
    println!("pending: {}", pending(&store, trip)?.len());
    Ok(())
}

/// The database URL of `--database-url URL` (or `--database-url=URL`), else of
/// `MINIFLOW_DATABASE_URL`; `None` for SQLite.
fn database_url() -> Option<String> {
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        if arg == "--database-url" {
            return args.next();
        }
        if let Some(url) = arg.strip_prefix("--database-url=") {
            return Some(url.to_owned());
        }
    }
    std::env::var("MINIFLOW_DATABASE_URL")
        .ok()
        .filter(|url| !url.trim().is_empty())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    match database_url() {
        None => {
            let dir = tempfile::tempdir()?;
            let path = dir.path().join("flow.db");
            demo(|| SqliteStore::open(&path), &WorkflowId::new("trip-001")?)
        }
        #[cfg(feature = "postgres")]
        Some(url) => {
            let started = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?;
            let trip = WorkflowId::new(format!("trip-{}", started.as_micros()))?;
            demo(|| miniflow::PostgresStore::connect(&url), &trip)
        }
        #[cfg(not(feature = "postgres"))]
        Some(_) => Err("a database URL needs the postgres feature: \
             cargo run --example trip --features postgres -- --database-url URL"
            .into()),
    }
}
