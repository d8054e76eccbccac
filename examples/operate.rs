//! A small store to try the operators' tools on (`miniflow stats`, `pause`, `limit`, bulk `retry`):
//! five trips, each deciding four commands of different kinds and priorities, one worker pass
//! that completes some, leaves a flight in flight, retries a hotel later and buries two hotels
//! that refused for good.
//!
//! Run with `cargo run --example operate -- flow.db` (the file must not exist yet). Time is a manual
//! clock starting at 2025-01-01T00:00:00Z, so give the tool the same clock:
//! `miniflow stats flow.db --now 2025-01-01T00:01:00Z`.

use std::path::PathBuf;
use std::time::Duration;

use miniflow::prelude::*;
use miniflow::{
    json, ClaimRequest, Clock, Command, Decision, Engine, Event, EventRecord, Failure, ManualClock,
    RetryPolicy, SqliteStore, Timestamp, Workflow, WorkflowId,
};

/// 2025-01-01T00:00:00Z.
const START: Timestamp = Timestamp::from_millis(1_735_689_600_000);

struct Trip;

impl Workflow for Trip {
    type State = ();

    fn evolve(&self, _: &mut (), _: &EventRecord) {}

    fn decide(&self, _: &(), event: &EventRecord) -> Decision {
        if event.kind != "trip_requested" {
            return Decision::none();
        }
        let trip = json!({ "trip_id": event.workflow_id });
        Decision::new()
            .command(Command::new("lock_budget", trip.clone()))
            .command(Command::new("book_hotel", trip.clone()))
            // Seats sell out first: flights go before everything else.
            .command(Command::new("book_flight", trip.clone()).priority(10))
            // Nobody waits for a confirmation mail.
            .command(Command::new("send_confirmation", trip).priority(-5))
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = PathBuf::from(std::env::args().nth(1).unwrap_or_else(|| "flow.db".into()));
    if path.exists() {
        return Err(format!("{} exists already; name a new file", path.display()).into());
    }
    let mut store = SqliteStore::open(&path)?;
    let clock = ManualClock::new(START);
    let engine = Engine::new(Trip);
    for n in 1..=5 {
        let trip = WorkflowId::new(format!("trip-{n:03}"))?;
        engine.handle(
            &mut store,
            &trip,
            Event::new("trip_requested", json!({ "city": "成都" })),
            clock.now(),
        )?;
    }

    clock.advance(Duration::from_secs(1));
    let now = clock.now();
    let request = ClaimRequest::new("worker-1")
        .limit(100)
        .lease_ttl(Duration::from_secs(600));
    let claimed = store.claim(&request, now)?;
    let policy = RetryPolicy::default().initial_delay(Duration::from_secs(30));
    for delivery in &claimed {
        let trip = delivery.command_id.workflow_id().as_str();
        let (id, token) = (&delivery.command_id, delivery.token);
        match (delivery.kind.as_str(), trip) {
            // Still being booked when the tool looks.
            ("book_flight", "trip-005") => {}
            ("book_hotel", "trip-002" | "trip-004") => {
                store.fail(
                    id,
                    token,
                    &Failure::permanent("422 no rooms left at the Atlantis"),
                    &policy,
                    now,
                )?;
            }
            ("book_hotel", "trip-001") => {
                store.fail(
                    id,
                    token,
                    &Failure::retryable("503 hotel busy"),
                    &policy,
                    now,
                )?;
            }
            ("book_hotel" | "send_confirmation", _) => store.release(id, token, now)?,
            _ => store.complete(id, token, None, now)?,
        }
    }
    let order: Vec<String> = claimed
        .iter()
        .take(6)
        .map(|d| format!("{} {}", d.command_id, d.kind))
        .collect();
    println!("claimed first: {}", order.join(", "));
    let stats = store.stats(now)?;
    println!(
        "wrote {}: {} pending, {} leased, {} dead at 2025-01-01T00:00:01Z",
        path.display(),
        stats.pending(),
        stats.leased(),
        stats.dead()
    );
    println!(
        "try: miniflow stats {} --now 2025-01-01T00:01:00Z",
        path.display()
    );
    Ok(())
}
