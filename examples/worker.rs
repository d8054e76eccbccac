//! Delivery with retries and dead letters: the trip workflow decides `lock_budget` and `book_hotel`.
//! The budget service fails twice, then does the work but its answer times out, then answers the
//! replay with the same reference. The hotel refuses the booking for good, so that command ends dead.
//!
//! Run with `cargo run --example worker`. Time is a manual clock, so the backoffs are exact and the
//! run is instant.
//!
//! The store is a SQLite file in a temporary directory, or a PostgreSQL database when a URL is given:
//! `cargo run --example worker --features postgres -- --database-url postgresql://user@host/db` (or
//! `MINIFLOW_DATABASE_URL=… cargo run --example worker --features postgres`), delivered by
//! `Dispatcher::postgres`. Give it a database of its own: the dispatcher delivers every command it
//! finds there. The database keeps what the run wrote, so there the trip's ID carries the time of
//! the run, to meet no earlier one.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use miniflow::prelude::*;
use miniflow::{
    json, Clock, Command, CommandId, Decision, Delivery, Dispatcher, Engine, Error, Event,
    EventRecord, ManualClock, Outcome, RetryPolicy, SqliteStore, Status, Timestamp, Workflow,
    WorkflowId,
};

struct Trip;

impl Workflow for Trip {
    type State = ();

    fn evolve(&self, _: &mut (), _: &EventRecord) {}

    fn decide(&self, _: &(), event: &EventRecord) -> Decision {
        match event.kind.as_str() {
            "trip_requested" => Decision::new()
                .command(Command::new(
                    "lock_budget",
                    json!({ "trip_id": event.workflow_id, "amount": 1200 }),
                ))
                .command(Command::new(
                    "book_hotel",
                    json!({ "trip_id": event.workflow_id, "hotel": "Atlantis" }),
                )),
            _ => Decision::none(),
        }
    }
}

/// Suppliers that honour idempotency keys, with a flaky budget service and a hotel that does not exist.
#[derive(Default)]
struct Suppliers {
    calls: HashMap<CommandId, u32>,
    results: HashMap<CommandId, String>,
    side_effects: usize,
}

impl Suppliers {
    fn call(&mut self, delivery: &Delivery) -> Outcome {
        let id = &delivery.command_id;
        let call = {
            let calls = self.calls.entry(id.clone()).or_default();
            *calls += 1;
            *calls
        };
        if delivery.kind == "book_hotel" {
            return Outcome::permanent("422 hotel Atlantis does not exist");
        }
        if call <= 2 {
            return Outcome::retry("503 budget service unavailable");
        }
        match self.results.get(id) {
            Some(reference) => {
                println!("    budget service: {id} seen before, replays {reference}")
            }
            None => {
                self.side_effects += 1;
                let reference = format!("BUDGET-{}", self.side_effects);
                println!("    budget service: locks the budget as {reference} for {id}");
                self.results.insert(id.clone(), reference);
            }
        }
        if call == 3 {
            // The budget was locked, but the answer never arrived: the result is unknown.
            return Outcome::retry("timed out after 5s: result unknown");
        }
        Outcome::Done
    }
}

fn seconds(d: Duration) -> String {
    format!("{:.3}s", d.as_secs_f64())
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
    let suppliers = Arc::new(Mutex::new(Suppliers::default()));
    let calls = suppliers.clone();
    let handler = move |d: &Delivery| calls.lock().unwrap().call(d);
    match database_url() {
        None => {
            let dir = tempfile::tempdir()?;
            let path = dir.path().join("flow.db");
            let store = SqliteStore::open(&path)?;
            let dispatcher = Dispatcher::sqlite(&path, handler);
            deliver(store, dispatcher, WorkflowId::new("trip-001")?, &suppliers)
        }
        #[cfg(feature = "postgres")]
        Some(url) => {
            use miniflow::{PostgresDispatcher, PostgresStore};
            let store = PostgresStore::connect(&url)?;
            let dispatcher = Dispatcher::postgres(&store, handler)?;
            let started = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?;
            let trip = WorkflowId::new(format!("trip-{}", started.as_micros()))?;
            deliver(store, dispatcher, trip, &suppliers)
        }
        #[cfg(not(feature = "postgres"))]
        Some(_) => Err("a database URL needs the postgres feature: \
             cargo run --example worker --features postgres -- --database-url URL"
            .into()),
    }
}

/// The trip's commands that are not finished yet (a database may hold other workflows).
fn unfinished(store: &impl Outbox, trip: &WorkflowId) -> Result<Vec<miniflow::OutboxRow>, Error> {
    let mut rows = store.commands(trip)?;
    rows.retain(|row| matches!(row.status, Status::Pending | Status::Leased));
    Ok(rows)
}

/// Commits the trip into `store` and delivers its commands with `dispatcher`, moving the manual
/// clock from one retry to the next.
fn deliver<S: Store + 'static>(
    mut store: S,
    dispatcher: Dispatcher<S>,
    trip: WorkflowId,
    suppliers: &Mutex<Suppliers>,
) -> Result<(), Box<dyn std::error::Error>> {
    let start = Timestamp::from_millis(1_700_000_000_000);
    let clock = Arc::new(ManualClock::new(start));
    Engine::new(Trip).handle(
        &mut store,
        &trip,
        Event::new("trip_requested", json!({ "city": "成都" })),
        clock.now(),
    )?;

    let policy = RetryPolicy::default()
        .initial_delay(Duration::from_secs(1))
        .multiplier(2.0)
        .max_delay(Duration::from_secs(60))
        .max_attempts(5)
        .jitter(0.2);
    let t0 = start;
    let report_clock = clock.clone();
    let dispatcher = dispatcher
        .retry_policy(policy)
        .clock(clock.clone())
        .on_settled(move |d, settlement| {
            let at = seconds(report_clock.now().saturating_since(t0));
            println!(
                "t+{at:>7}  {} {:<11} attempt {}: {settlement}",
                d.command_id, d.kind, d.attempt
            );
        });

    // Deliver what is due, then move the clock to the next retry, until nothing is left to deliver.
    loop {
        dispatcher.run_until_idle()?;
        let Some(next) = unfinished(&store, &trip)?
            .iter()
            .map(|row| row.available_at)
            .min()
        else {
            break;
        };
        clock.set(next);
    }

    println!();
    println!("final states:");
    for row in store.commands(&trip)? {
        let error = row.last_error.as_deref().unwrap_or("-");
        println!(
            "  {} {:<11} {:<4} attempts={} last_error={error}",
            row.command_id,
            row.kind,
            row.status.to_string(),
            row.attempts
        );
    }
    let mut dead = store.commands(&trip)?;
    dead.retain(|row| row.status == Status::Dead);
    println!("dead letters: {}", dead.len());
    println!(
        "real side effects: {}",
        suppliers.lock().unwrap().side_effects
    );
    assert!(dead.iter().all(|row| row.status == Status::Dead));
    Ok(())
}
