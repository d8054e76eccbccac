//! miniflow's metrics for Prometheus: a recorder (`metrics-exporter-prometheus`, without its own
//! HTTP server) collects what the store and the dispatcher record, and a small `tiny_http` server on
//! 127.0.0.1 serves it as `GET /metrics` in the Prometheus text format.
//!
//! A short workload runs first: commands that complete, one that fails once and is retried, one
//! refused for good (a dead letter), a commit that loses its race, a timer (the dead letter's
//! `command_failed` feedback) and a retention run. Before each scrape the outbox gauges (depth by
//! status and kind, the age of the oldest due command) are set from the store's stats
//! (`OutboxGauges`); a long-running dispatcher sets them itself with `Dispatcher::report_stats`.
//!
//! `cargo run --example metrics` serves on an ephemeral port until stopped and prints its address;
//! `--port N` picks the port, `--requests N` stops after N requests.

use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use miniflow::prelude::*;
use miniflow::{
    json, Clock, Command, Commit, Decision, Delivery, Dispatcher, Engine, Event, EventRecord,
    OutboxGauges, Outcome, RetryPolicy, Seq, SqliteStore, SystemClock, Workflow, WorkflowId,
};

/// Order workflows: each placed order sends a confirmation, charges a card and books a courier.
struct Orders;

impl Workflow for Orders {
    type State = ();
    fn evolve(&self, _: &mut (), _: &EventRecord) {}
    fn decide(&self, _: &(), event: &EventRecord) -> Decision {
        match event.kind.as_str() {
            "order_placed" => Decision::new()
                .command(Command::new(
                    "send_email",
                    json!({ "order": event.workflow_id }),
                ))
                .command(Command::new(
                    "charge_card",
                    json!({ "order": event.workflow_id }),
                ))
                .command(Command::new(
                    "book_courier",
                    json!({ "order": event.workflow_id }),
                )),
            // `command_failed` and the rest: nothing more to do here.
            _ => Decision::none(),
        }
    }
}

/// The recorder, installed globally; its handle renders the text format.
fn install_recorder() -> Result<PrometheusHandle, Box<dyn std::error::Error>> {
    let handle = PrometheusBuilder::new()
        // Histograms as Prometheus histograms (buckets), not summaries.
        .set_buckets_for_metric(
            Matcher::Suffix("_seconds".into()),
            &[0.001, 0.005, 0.025, 0.1, 0.5, 2.5, 10.0, 60.0, 300.0],
        )?
        .set_buckets_for_metric(
            Matcher::Full(miniflow::telemetry::DELIVERY_ATTEMPT.into()),
            &[1.0, 2.0, 3.0, 5.0, 8.0],
        )?
        .install_recorder()?;
    miniflow::describe_metrics();
    Ok(handle)
}

fn workload(path: &std::path::Path) -> Result<(), Box<dyn std::error::Error>> {
    let mut store = SqliteStore::open(path)?;
    let engine = Engine::new(Orders);
    for n in 1..=3 {
        let order = WorkflowId::new(format!("order-{n}"))?;
        engine.handle(
            &mut store,
            &order,
            Event::new("order_placed", json!({})),
            SystemClock.now(),
        )?;
    }
    // A commit on a stale seq loses its race: a commit conflict.
    let late = Commit::new(
        WorkflowId::new("order-1")?,
        Seq::ZERO,
        Event::new("order_placed", json!({})),
        Decision::none(),
        SystemClock.now(),
    )?;
    assert!(store.append_with_commands(&late).is_err());

    let dispatcher = Dispatcher::sqlite(path, |d: &Delivery| match d.kind.as_str() {
        // The card service is down at first: one retry each.
        "charge_card" if d.attempt == 1 => Outcome::retry("503 card service unavailable"),
        // order-3's courier cannot be booked: a dead letter.
        "book_courier" if d.payload["order"] == "order-3" => {
            Outcome::permanent("422 no courier for that address")
        }
        _ => Outcome::Done,
    })
    .workflow(Engine::new(Orders))
    .retry_policy(RetryPolicy::default().initial_delay(Duration::from_millis(20)))
    .poll_interval(Duration::from_millis(5));
    while !store.pending(1)?.is_empty() {
        dispatcher.run_until_idle()?;
        std::thread::sleep(Duration::from_millis(25));
    }
    // Feedback of the dead letter may still be due: fire it.
    dispatcher.run_until_idle()?;
    let purged = store.purge_done(Duration::ZERO, SystemClock.now(), 1_000)?;
    println!("workload done: {purged} done rows purged");
    Ok(())
}

/// Serves `GET /metrics` on `server` until `requests` requests were answered (forever if `None`),
/// setting the outbox gauges from `store` before each.
fn serve(
    server: &tiny_http::Server,
    handle: &PrometheusHandle,
    store: &SqliteStore,
    requests: Option<usize>,
) {
    let mut gauges = OutboxGauges::default();
    for (n, request) in server.incoming_requests().enumerate() {
        match store.stats(SystemClock.now()) {
            Ok(stats) => gauges.record(&stats),
            Err(e) => eprintln!("outbox stats: {e}"),
        }
        let response = match (request.method(), request.url()) {
            (tiny_http::Method::Get, "/metrics") => {
                tiny_http::Response::from_string(handle.render()).with_header(
                    tiny_http::Header::from_bytes(
                        "Content-Type",
                        "text/plain; version=0.0.4; charset=utf-8",
                    )
                    .expect("a valid header"),
                )
            }
            _ => tiny_http::Response::from_string("GET /metrics\n").with_status_code(404),
        };
        let _ = request.respond(response);
        if requests.is_some_and(|wanted| n + 1 >= wanted) {
            return;
        }
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut port = 0_u16;
    let mut requests = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--port" => port = value()?.parse()?,
            "--requests" => requests = Some(value()?.parse()?),
            _ => return Err("usage: metrics [--port N] [--requests N]".into()),
        }
    }
    let handle = install_recorder()?;
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("flow.db");
    workload(&path)?;
    // Stats are a read: a read-only store is enough.
    let store = SqliteStore::open_read_only(&path)?;
    let server = tiny_http::Server::http(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    println!("metrics on http://{}/metrics", server.server_addr());
    serve(&server, &handle, &store, requests);
    Ok(())
}
