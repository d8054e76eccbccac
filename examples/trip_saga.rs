//! The trip booking saga: results flowing back, durable timers, withdrawn commands and compensation.
//!
//! `trip_requested` locks the budget, books the flight and books the hotel, and gives the hotel 30
//! minutes (a durable timer) to confirm. The flight and the hotel report their results: the airline's
//! booking reference comes back into the trip as a `command_completed` event, and `cancel_flight`
//! carries it.
//! - `trip-001`: the hotel refuses for good. The dead `book_hotel` feeds a `command_failed` event back
//!   into the trip, whose decision cancels the flight (with its reference), releases the budget and
//!   cancels the deadline.
//! - `trip-002`: the hotel answers "busy" again and again. When the 30-minute deadline fires, the
//!   decision withdraws the still-retrying `book_hotel` — it becomes `cancelled` and is never sent
//!   again — and cancels the flight and releases the budget.
//!
//! Time is a manual clock: 30 minutes pass at once. Run with `cargo run --example trip_saga`.

use std::time::Duration;

use miniflow::prelude::*;
use miniflow::{
    json, Clock, Command, CommandCompleted, CommandFailed, Decision, Delivery, Dispatcher, Engine,
    Event, EventRecord, ManualClock, Outcome, RetryPolicy, SqliteStore, Status, Timer, TimerFired,
    TimerStatus, Timestamp, Workflow, WorkflowId, COMMAND_FAILED,
};
use std::sync::Arc;

const HOTEL_DEADLINE: &str = "hotel_deadline";

/// What a trip knows, folded from its events.
#[derive(Debug, Default)]
struct Trip {
    requested: bool,
    /// The airline's booking reference, once `book_flight`'s result came back.
    flight_reference: Option<String>,
    /// The hotel's confirmation, once `book_hotel`'s result came back.
    hotel_confirmation: Option<String>,
    cancelled: Option<String>,
    failed: Vec<String>,
}

struct TripSaga;

impl TripSaga {
    /// Undo what may have happened: withdraw the bookings still under way, cancel the ones that
    /// came back with a result, release the budget.
    fn compensate(trip: &Trip, reason: &str, trip_id: &str) -> Decision {
        let undo = |kind: &str, extra: serde_json::Value| {
            let mut payload = json!({ "trip_id": trip_id, "reason": reason });
            if let (Some(payload), Some(extra)) = (payload.as_object_mut(), extra.as_object()) {
                payload.extend(extra.clone());
            }
            Command::new(kind, payload)
        };
        let mut decision = Decision::new()
            .cancel_timer(HOTEL_DEADLINE)
            .cancel_commands_of_kind("book_flight")
            .cancel_commands_of_kind("book_hotel");
        if !trip.failed.iter().any(|kind| kind == "lock_budget") {
            decision = decision.command(undo("release_budget", json!({})));
        }
        if let Some(reference) = &trip.flight_reference {
            decision = decision.command(undo("cancel_flight", json!({ "reference": reference })));
        }
        if let Some(confirmation) = &trip.hotel_confirmation {
            decision = decision.command(undo(
                "cancel_hotel",
                json!({ "confirmation": confirmation }),
            ));
        }
        decision
    }
}

impl Workflow for TripSaga {
    type State = Trip;

    fn evolve(&self, trip: &mut Trip, event: &EventRecord) {
        if event.kind == "trip_requested" {
            trip.requested = true;
        }
        if let Some(Ok(done)) = event.decode::<CommandCompleted>() {
            let reference = done.result["reference"].as_str().map(str::to_owned);
            match done.kind.as_str() {
                "book_flight" => trip.flight_reference = reference,
                "book_hotel" => trip.hotel_confirmation = reference,
                _ => {}
            }
        }
        if let Some(Ok(failed)) = event.decode::<CommandFailed>() {
            trip.failed.push(failed.kind.clone());
            trip.cancelled.get_or_insert_with(|| {
                format!(
                    "{} failed: {}",
                    failed.kind,
                    failed.error.unwrap_or_default()
                )
            });
        }
        if let Some(Ok(fired)) = event.decode::<TimerFired>() {
            if fired.name == HOTEL_DEADLINE && trip.hotel_confirmation.is_none() {
                trip.cancelled
                    .get_or_insert_with(|| "the hotel did not confirm within 30 minutes".into());
            }
        }
    }

    fn decide(&self, trip: &Trip, event: &EventRecord) -> Decision {
        let trip_id = event.workflow_id.as_str();
        if event.kind == "trip_requested" && !trip.requested {
            let booking = json!({ "trip_id": trip_id, "city": event.payload["city"] });
            return Decision::new()
                .command(Command::new(
                    "lock_budget",
                    json!({ "trip_id": trip_id, "amount": 3000 }),
                ))
                .command(Command::new("book_flight", booking.clone()).report_result())
                .command(Command::new("book_hotel", booking).report_result())
                .timer(Timer::after(
                    HOTEL_DEADLINE,
                    Duration::from_secs(30 * 60),
                    json!({ "trip_id": trip_id }),
                ));
        }
        if let Some(Ok(done)) = event.decode::<CommandCompleted>() {
            return match (done.kind.as_str(), &trip.cancelled) {
                // The hotel confirmed in time: no deadline any more.
                ("book_hotel", None) => Decision::new().cancel_timer(HOTEL_DEADLINE),
                // A booking that completed after the trip was cancelled is undone with its result.
                ("book_flight", Some(reason)) => Decision::new().command(Command::new(
                    "cancel_flight",
                    json!({ "trip_id": trip_id, "reason": reason, "reference": done.result["reference"] }),
                )),
                ("book_hotel", Some(reason)) => Decision::new().command(Command::new(
                    "cancel_hotel",
                    json!({ "trip_id": trip_id, "reason": reason, "confirmation": done.result["reference"] }),
                )),
                _ => Decision::none(),
            };
        }
        let fired_deadline = event
            .decode::<TimerFired>()
            .is_some_and(|fired| fired.is_ok_and(|f| f.name == HOTEL_DEADLINE));
        let failed = event.kind == COMMAND_FAILED;
        if trip.cancelled.is_none()
            && (failed || (fired_deadline && trip.hotel_confirmation.is_none()))
        {
            // Fold this event in first: the compensation sees the failure or the deadline too.
            let mut after = Trip {
                requested: trip.requested,
                flight_reference: trip.flight_reference.clone(),
                hotel_confirmation: trip.hotel_confirmation.clone(),
                cancelled: None,
                failed: trip.failed.clone(),
            };
            self.evolve(&mut after, event);
            let reason = after.cancelled.clone().unwrap_or_default();
            return Self::compensate(&after, &reason, trip_id);
        }
        Decision::none() // e.g. a failure after the trip was cancelled: recorded, nothing to undo
    }
}

/// The suppliers: the airline books every flight with a reference; the hotel refuses trip-001 for
/// good after a 503, and answers "busy" to trip-002 every time; everything else succeeds.
fn suppliers(delivery: &Delivery) -> Outcome {
    let trip = delivery.payload["trip_id"].as_str().unwrap_or_default();
    match (delivery.kind.as_str(), trip, delivery.attempt) {
        ("book_flight", _, _) => {
            Outcome::done_with(json!({ "reference": format!("FL-{}", &trip[5..]) }))
        }
        ("book_hotel", "trip-001", 1) => Outcome::retry("503 hotel busy"),
        ("book_hotel", "trip-001", _) => Outcome::permanent("422 hotel fully booked"),
        ("book_hotel", _, _) => Outcome::retry("503 hotel busy"),
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
                .max_delay(Duration::from_secs(10 * 60))
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
            let result = row
                .result
                .map(|r| format!(" result={r}"))
                .unwrap_or_default();
            println!(
                "  {} {:<14} {:<9} attempts={} payload={}{result}{error}",
                row.command_id,
                row.kind,
                row.status.to_string(),
                row.attempts,
                row.payload
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
            "state: {}; flight reference: {}; budget released: {}; flight cancelled: {}",
            state
                .cancelled
                .as_deref()
                .map_or("booked".to_owned(), |why| format!("cancelled ({why})")),
            state.flight_reference.as_deref().unwrap_or("-"),
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
