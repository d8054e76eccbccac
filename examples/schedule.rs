//! Recurring schedules: a subscription invoiced on a cron expression and reported on every week,
//! through a host outage.
//!
//! `subscribed` starts two schedules: `invoice` at 09:00 UTC on the first of every month
//! (`0 9 1 * *`), catching up at most three missed invoices one by one (`Missed::FireAll`), and
//! `usage_report` every 7 days, firing once for whatever it missed (`Missed::FireOnce`, the default).
//! Each occurrence commits one `schedule_fired` event and arms the next in the same transaction.
//! - January to March 20: each occurrence fires once, on time.
//! - The host is down from March 20 to July 2: four invoices (April to July) and fifteen weekly
//!   reports come due meanwhile. On restart the invoices catch up as May, June and July (April is
//!   counted as missed in May's event); the report fires once, counting the fourteen it stands for.
//! - `cancelled` on July 10 stops both schedules: nothing fires after it.
//!
//! Time is a manual clock: months pass at once. Run with `cargo run --example schedule`.

use std::sync::Arc;
use std::time::Duration;

use chrono::DateTime;
use miniflow::prelude::*;
use miniflow::{
    json, Clock, Command, Decision, Delivery, Dispatcher, Engine, Event, EventRecord, ManualClock,
    Missed, Outcome, Schedule, ScheduleFired, SqliteStore, TimerStatus, Timestamp, Workflow,
    WorkflowId,
};

const INVOICE: &str = "invoice";
const USAGE_REPORT: &str = "usage_report";

struct Subscription;

impl Workflow for Subscription {
    type State = ();

    fn evolve(&self, _: &mut (), _: &EventRecord) {}

    fn decide(&self, _: &(), event: &EventRecord) -> Decision {
        if let Some(Ok(fired)) = event.decode::<ScheduleFired>() {
            let kind = if fired.name == INVOICE {
                "send_invoice"
            } else {
                "send_usage_report"
            };
            let payload = json!({
                "customer": event.workflow_id,
                "for": fired.scheduled_at,
                "missed": fired.missed,
            });
            return Decision::new().command(Command::new(kind, payload));
        }
        match event.kind.as_str() {
            "subscribed" => Decision::new()
                .schedule(
                    Schedule::cron(INVOICE, "0 9 1 * *")
                        .payload(json!({ "plan": "pro" }))
                        .on_missed(Missed::FireAll { max: 3 }),
                )
                .schedule(Schedule::every(
                    USAGE_REPORT,
                    Duration::from_secs(7 * 24 * 60 * 60),
                )),
            "cancelled" => Decision::new()
                .cancel_schedule(INVOICE)
                .cancel_schedule(USAGE_REPORT),
            _ => Decision::none(),
        }
    }
}

/// A time as a UTC date and time.
fn utc(t: Timestamp) -> String {
    i64::try_from(t.as_millis())
        .ok()
        .and_then(DateTime::from_timestamp_millis)
        .map_or_else(|| t.to_string(), |t| t.format("%Y-%m-%d %H:%M").to_string())
}

/// A UTC date at midnight.
fn day(year: i32, month: u32, day: u32) -> Timestamp {
    let t = chrono::NaiveDate::from_ymd_opt(year, month, day)
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .expect("a real date")
        .and_utc();
    Timestamp::from_millis(u64::try_from(t.timestamp_millis()).expect("after 1970"))
}

/// Delivers what is due and fires what comes due, jumping the clock from one due time to the next,
/// until nothing is due before `until`; then sets the clock to `until`.
fn run_until(
    dispatcher: &Dispatcher<SqliteStore>,
    store: &SqliteStore,
    customer: &WorkflowId,
    clock: &ManualClock,
    until: Timestamp,
) -> Result<(), Box<dyn std::error::Error>> {
    loop {
        dispatcher.run_until_idle()?;
        let next = store
            .timers(customer)?
            .iter()
            .filter(|t| t.status == TimerStatus::Scheduled)
            .map(|t| t.fire_at)
            .min();
        match next {
            Some(next) if next <= until => clock.set(next.max(clock.now())),
            _ => break,
        }
    }
    clock.set(until);
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("billing.db");
    let clock = Arc::new(ManualClock::new(
        day(2024, 1, 15) + Duration::from_secs(10 * 3600),
    ));
    let engine = Engine::new(Subscription);
    let mut store = SqliteStore::open(&path)?;
    let customer = WorkflowId::new("customer-42")?;
    engine.handle(
        &mut store,
        &customer,
        Event::new("subscribed", json!({ "plan": "pro" })),
        clock.now(),
    )?;
    println!("[{}] subscribed", utc(clock.now()));

    let sent = clock.clone();
    let send = move |d: &Delivery| {
        let scheduled = Timestamp::from_millis(d.payload["for"].as_u64().unwrap_or_default());
        let missed = d.payload["missed"].as_u64().unwrap_or_default();
        let missed = if missed > 0 {
            format!(" ({missed} missed before it)")
        } else {
            String::new()
        };
        println!(
            "[{}] {:<17} for {}{missed}",
            utc(sent.now()),
            d.kind,
            utc(scheduled)
        );
        Outcome::Done
    };
    let dispatcher = Dispatcher::sqlite(&path, send)
        .workflow(Engine::new(Subscription))
        .clock(clock.clone());

    run_until(&dispatcher, &store, &customer, &clock, day(2024, 3, 20))?;
    println!("[{}] the host goes down", utc(clock.now()));
    clock.set(day(2024, 7, 2) + Duration::from_secs(12 * 3600));
    println!("[{}] the host is back", utc(clock.now()));
    dispatcher.run_until_idle()?;
    run_until(&dispatcher, &store, &customer, &clock, day(2024, 7, 10))?;
    engine.handle(
        &mut store,
        &customer,
        Event::new("cancelled", json!({})),
        clock.now(),
    )?;
    println!("[{}] cancelled", utc(clock.now()));
    run_until(&dispatcher, &store, &customer, &clock, day(2024, 12, 31))?;

    println!();
    let kinds = |kind: &str| -> Result<usize, miniflow::Error> {
        Ok(store
            .commands(&customer)?
            .iter()
            .filter(|r| r.kind == kind)
            .count())
    };
    let occurrences = store
        .load(&customer)?
        .iter()
        .filter(|e| e.decode::<ScheduleFired>().is_some())
        .count();
    println!("schedule_fired events: {occurrences}");
    println!("invoices sent: {}", kinds("send_invoice")?);
    println!("usage reports sent: {}", kinds("send_usage_report")?);
    for name in [INVOICE, USAGE_REPORT] {
        let last = store
            .timers(&customer)?
            .into_iter()
            .rfind(|t| t.name == name)
            .map_or("none".to_owned(), |t| {
                format!("{} {}", t.timer_id, t.status)
            });
        println!("last {name} occurrence: {last}");
    }
    println!("pending: {}", store.pending(usize::MAX)?.len());
    Ok(())
}
