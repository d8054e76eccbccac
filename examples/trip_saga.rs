//! The trip booking saga: durable timers and compensation.
//!
//! `trip_requested` locks the budget, books the flight and books the hotel, and gives the hotel 30
//! minutes (a durable timer) to confirm.
//! - `trip-001`: the hotel refuses for good. The dead `book_hotel` feeds a `command_failed` event back
//!   into the trip, whose decision cancels the flight, releases the budget and cancels the deadline.
//! - `trip-002`: the hotel takes the request but never confirms. The deadline fires a `timer_fired`
//!   event 30 minutes later, whose decision cancels the hotel and the flight and releases the budget.
//!
//! Time is a manual clock: 30 minutes pass at once. Run with `cargo run --example trip_saga`.

use std::time::Duration;

use miniflow::{
    json, Clock, Command, Decision, Delivery, Dispatcher, Engine, Event, EventRecord, ManualClock,
    Outcome, RetryPolicy, SqliteStore, Status, Store, Timer, TimerStatus, Timestamp, Workflow,
    WorkflowId, COMMAND_FAILED, TIMER_FIRED,
};
use std::sync::Arc;

const HOTEL_DEADLINE: &str = "hotel_deadline";

/// What a trip knows, folded from its events.
#[derive(Debug, Default)]
struct Trip {
    requested: bool,
    hotel_confirmed: bool,
    cancelled: Option<String>,
    failed: Vec<String>,
}

struct TripSaga;

impl TripSaga {
    /// Undo what may have happened: every booking that did not fail is cancelled.
    fn compensate(failed: &[&str], reason: &str, trip_id: &str) -> Decision {
        let undo = [
            ("lock_budget", "release_budget"),
            ("book_flight", "cancel_flight"),
            ("book_hotel", "cancel_hotel"),
        ];
        let mut decision = Decision::new().cancel_timer(HOTEL_DEADLINE);
        for (booking, undo) in undo {
            if !failed.contains(&booking) {
                decision = decision.command(Command::new(
                    undo,
                    json!({ "trip_id": trip_id, "reason": reason }),
                ));
            }
        }
        decision
    }
}

impl Workflow for TripSaga {
    type State = Trip;

    fn evolve(&self, trip: &mut Trip, event: &EventRecord) {
        match event.kind.as_str() {
            "trip_requested" => trip.requested = true,
            "hotel_confirmed" => trip.hotel_confirmed = true,
            COMMAND_FAILED => {
                trip.failed.push(
                    event.payload["kind"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                );
                if trip.cancelled.is_none() {
                    trip.cancelled = Some(format!(
                        "{} failed: {}",
                        event.payload["kind"].as_str().unwrap_or_default(),
                        event.payload["error"].as_str().unwrap_or_default()
                    ));
                }
            }
            TIMER_FIRED if event.payload["name"] == HOTEL_DEADLINE && !trip.hotel_confirmed => {
                trip.cancelled
                    .get_or_insert_with(|| "the hotel did not confirm within 30 minutes".into());
            }
            _ => {}
        }
    }

    fn decide(&self, trip: &Trip, event: &EventRecord) -> Decision {
        let trip_id = event.workflow_id.as_str();
        match event.kind.as_str() {
            "trip_requested" if !trip.requested => {
                let booking = json!({ "trip_id": trip_id, "city": event.payload["city"] });
                Decision::new()
                    .command(Command::new(
                        "lock_budget",
                        json!({ "trip_id": trip_id, "amount": 3000 }),
                    ))
                    .command(Command::new("book_flight", booking.clone()))
                    .command(Command::new("book_hotel", booking))
                    .timer(Timer::after(
                        HOTEL_DEADLINE,
                        Duration::from_secs(30 * 60),
                        json!({ "trip_id": trip_id }),
                    ))
            }
            "hotel_confirmed" => Decision::new().cancel_timer(HOTEL_DEADLINE),
            COMMAND_FAILED if trip.cancelled.is_none() => {
                let mut failed: Vec<&str> = trip.failed.iter().map(String::as_str).collect();
                failed.push(event.payload["kind"].as_str().unwrap_or_default());
                Self::compensate(&failed, "a booking failed", trip_id)
            }
            TIMER_FIRED
                if event.payload["name"] == HOTEL_DEADLINE
                    && trip.cancelled.is_none()
                    && !trip.hotel_confirmed =>
            {
                let failed: Vec<&str> = trip.failed.iter().map(String::as_str).collect();
                Self::compensate(&failed, "the hotel did not confirm in time", trip_id)
            }
            _ => Decision::none(), // e.g. a failure after the trip was cancelled: recorded, nothing to undo
        }
    }
}

/// The suppliers: the hotel refuses trip-001 for good after a 503, and takes trip-002's request
/// without ever confirming it; everything else succeeds.
fn suppliers(delivery: &Delivery) -> Outcome {
    let trip = delivery.payload["trip_id"].as_str().unwrap_or_default();
    match (delivery.kind.as_str(), trip, delivery.attempt) {
        ("book_hotel", "trip-001", 1) => Outcome::retry("503 hotel busy"),
        ("book_hotel", "trip-001", _) => Outcome::permanent("422 hotel fully booked"),
        _ => Outcome::Done,
    }
}

fn minutes(clock: &ManualClock, start: Timestamp) -> String {
    let elapsed = clock.now().saturating_since(start).as_secs_f64();
    format!("{:>5.1} min", elapsed / 60.0)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("trips.db");
    let start = Timestamp::from_millis(1_700_000_000_000);
    let clock = Arc::new(ManualClock::new(start));
    let engine = Engine::new(TripSaga);
    let mut store = SqliteStore::open(&path)?;
    let trips = [WorkflowId::new("trip-001")?, WorkflowId::new("trip-002")?];
    for (trip, city) in trips.iter().zip(["成都", "西安"]) {
        engine.handle(
            &mut store,
            trip,
            Event::new("trip_requested", json!({ "city": city })),
            clock.now(),
        )?;
    }

    let report_clock = clock.clone();
    let dispatcher = Dispatcher::sqlite(&path, suppliers)
        .workflow(Engine::new(TripSaga))
        .retry_policy(
            RetryPolicy::default()
                .initial_delay(Duration::from_secs(60))
                .jitter(0.0),
        )
        .clock(clock.clone())
        .on_settled(move |d, settled| {
            println!(
                "[{}] {} {:<14} attempt {}: {settled}",
                minutes(&report_clock, start),
                d.command_id,
                d.kind,
                d.attempt
            );
        });

    // Run until nothing is left: deliver what is due, then jump the clock to the next due command or timer.
    loop {
        dispatcher.run_until_idle()?;
        let mut next: Vec<Timestamp> = store
            .pending(usize::MAX)?
            .iter()
            .map(|row| row.available_at)
            .collect();
        for trip in &trips {
            next.extend(
                store
                    .timers(trip)?
                    .iter()
                    .filter(|t| t.status == TimerStatus::Scheduled)
                    .map(|t| t.fire_at),
            );
        }
        let Some(next) = next.into_iter().min() else {
            break;
        };
        clock.set(next.max(clock.now()));
    }

    for trip in &trips {
        println!();
        println!("== {trip} ==");
        println!("events:");
        for event in store.load(trip)? {
            println!("  {} {:<16} {}", event.seq, event.kind, event.payload);
        }
        println!("outbox:");
        for row in store.commands(trip)? {
            let error = row
                .last_error
                .map(|e| format!(" ({e})"))
                .unwrap_or_default();
            println!(
                "  {} {:<14} {:<4} attempts={}{error}",
                row.command_id,
                row.kind,
                row.status.to_string(),
                row.attempts
            );
        }
        println!("timers:");
        for timer in store.timers(trip)? {
            println!("  {} {:<16} {}", timer.timer_id, timer.name, timer.status);
        }
        let state = engine.replay(&store, trip)?.state;
        let done = |kind: &str| {
            store.commands(trip).map(|rows| {
                rows.iter()
                    .any(|r| r.kind == kind && r.status == Status::Done)
            })
        };
        println!(
            "state: {}; budget released: {}; flight cancelled: {}",
            state
                .cancelled
                .as_deref()
                .map_or("booked".to_owned(), |why| format!("cancelled ({why})")),
            done("release_budget")?,
            done("cancel_flight")?
        );
    }
    let dead = store.dead_letters(usize::MAX)?;
    let unexplained: Vec<String> = dead
        .iter()
        .filter(|row| {
            let events = store.load(row.command_id.workflow_id()).unwrap_or_default();
            !events.iter().any(|e| {
                e.kind == COMMAND_FAILED && e.payload["command_id"] == row.command_id.to_string()
            })
        })
        .map(|row| row.command_id.to_string())
        .collect();
    println!();
    println!("pending: {}", store.pending(usize::MAX)?.len());
    println!("dead: {} (unexplained: {})", dead.len(), unexplained.len());
    Ok(())
}
