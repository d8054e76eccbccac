//! A real HTTP round trip: an airline supplier service that honours the `Idempotency-Key` header, and a
//! dispatcher that delivers outbox commands to it over HTTP with the command ID as the key.
//!
//! The supplier answers (as the IETF Idempotency-Key draft and Stripe do):
//! - `201` with a booking reference on the first call;
//! - the same `201` body again on a replay of the key (header `Idempotent-Replayed: true`);
//! - `409` while the first call with that key is still in progress;
//! - `422` when the key comes back with other parameters (another traveller or flight);
//! - `400` without a key.
//!
//! The supplier writes a booking (a row of its `bookings` table) and the idempotency record that
//! answers replays in ONE transaction of its SQLite file (`SqliteIdempotencyStore::finish_in`):
//! both commit, or neither. A request whose reservation timed out while it worked, and was taken
//! over by another request with the key, finds its token stale at `finish_in`: its transaction
//! rolls back, its booking goes with it, and it answers `409`; the booking of the current holder is
//! the only one (DESIGN rule 14). `GET /bookings` lists the bookings.
//!
//! The dispatcher completes a command only on a 2xx; a timeout means "unknown" and is retried with the
//! same key. To show it, the supplier drops its answer to the first call for `trip-002` *after* it has
//! committed the booking: the retry gets the stored answer, and each traveller has exactly one booking.
//!
//! The workflow asks for each booking's result (`Command::report_result`); the dispatcher completes
//! the command with the booking reference (`Outcome::done_with`), and the reference comes back into
//! the workflow as one `command_completed` event, committed with the acknowledgement.
//!
//! One trace runs from each trip request to its booking, without any tracing system: the request
//! starts a W3C trace (`new_trace_context`), the commit stores it with the command
//! (`Engine::handle_traced`), each delivery sends a child of it as the `traceparent` header, and
//! the supplier continues it: it logs and stores the trace ID with the booking, under a span of
//! its own.
//!
//! `cargo run --example http_supplier` runs the whole demo on 127.0.0.1.
//! `cargo run --example http_supplier -- serve` runs only the supplier and prints its address;
//! `serve --reservation-timeout-ms N` shortens how long a reservation holds (30 s by default).

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use miniflow::prelude::*;
use miniflow::rusqlite::{params, Connection, TransactionBehavior};
use miniflow::{
    json, Begin, Clock, Command, CommandCompleted, Decision, Delivery, Digest, Dispatcher, Engine,
    Error, Event, EventRecord, IdempotencyKey, IdempotencyPolicy, IdempotencyStore, Outcome,
    RetryPolicy, Settlement, SqliteIdempotencyStore, SqliteStore, SystemClock, TimerStatus,
    TraceContext, Value, Workflow, WorkflowId,
};

/// The fields of a booking request that define the business intent: a retry that only changes
/// `sent_at` or `trace_id` is the same booking.
const INTENT: [&str; 3] = ["trip_id", "traveller", "flight"];

/// How long the dispatcher waits for an answer before it calls the result unknown.
const CLIENT_TIMEOUT: Duration = Duration::from_millis(1_000);

/// How long a reservation holds before another request may take the key over.
const RESERVATION_TIMEOUT: Duration = Duration::from_secs(30);

/// The airline: bookings and idempotency records in its own SQLite file.
struct Supplier {
    db: Mutex<Db>,
    /// Drop the answer to the first call for this trip, after committing it.
    drop_first_answer_for: Option<String>,
    dropped: Mutex<Vec<String>>,
}

/// The supplier's file, through two connections: the records' own, and the one its booking
/// transactions run on.
struct Db {
    keys: SqliteIdempotencyStore,
    conn: Connection,
}

struct Reply {
    status: u16,
    body: Value,
    replayed: bool,
}

/// A SQLite error of the supplier's own statements, as a miniflow error.
fn sql(e: miniflow::rusqlite::Error) -> Error {
    Error::Storage(Box::new(e))
}

impl Supplier {
    fn open(
        path: &Path,
        reservation_timeout: Duration,
        drop_first_answer_for: Option<String>,
    ) -> Result<Self, Box<dyn std::error::Error>> {
        let policy = IdempotencyPolicy {
            retention: Duration::from_secs(7 * 24 * 3600),
            reservation_timeout,
        };
        // The records first: opening them creates (or upgrades) their table in the file.
        let keys = SqliteIdempotencyStore::open(path, policy)?;
        let conn = Connection::open(path)?;
        conn.busy_timeout(Duration::from_secs(5))?;
        // A booking the supplier has answered 201 for must survive a power loss.
        conn.execute_batch(
            "PRAGMA synchronous = FULL;
             CREATE TABLE IF NOT EXISTS bookings (
                 id INTEGER PRIMARY KEY,
                 idempotency_key TEXT NOT NULL,
                 trip_id TEXT,
                 traveller TEXT,
                 flight TEXT,
                 trace_id TEXT
             );",
        )?;
        Ok(Self {
            db: Mutex::new(Db { keys, conn }),
            drop_first_answer_for,
            dropped: Mutex::new(Vec::new()),
        })
    }

    /// Answers one `POST /bookings` in trace `trace`. `work` simulates how long the booking itself
    /// takes.
    fn book(&self, key: Option<&str>, body: &[u8], work: Duration, trace: &TraceContext) -> Reply {
        let error = |status, message: String| Reply {
            status,
            body: json!({ "error": message }),
            replayed: false,
        };
        let Some(key) = key else {
            return error(400, "missing Idempotency-Key header".into());
        };
        let key = match IdempotencyKey::new(key) {
            Ok(key) => key,
            Err(e) => return error(400, e.to_string()),
        };
        let request: Value = match serde_json::from_slice(body) {
            Ok(request) => request,
            Err(e) => return error(400, format!("body is not JSON: {e}")),
        };
        let digest = Digest::of_intent(&request, &INTENT);
        // The reservation, in its own short transaction: from now on a concurrent request with this
        // key sees it and gets 409.
        let begun = self
            .db
            .lock()
            .unwrap()
            .keys
            .begin(&key, digest, SystemClock.now());
        let token = match begun {
            Ok(Begin::Fresh { token }) => token,
            Ok(Begin::Completed { result }) => {
                return Reply {
                    status: 201,
                    body: result,
                    replayed: true,
                }
            }
            Ok(Begin::InProgress { .. }) => {
                return error(409, format!("a request with key {key} is in progress"))
            }
            Ok(Begin::Conflict {
                stored_digest,
                new_digest,
                ..
            }) => {
                return error(
                    422,
                    format!(
                        "key {key} was used with other parameters ({stored_digest} ≠ {new_digest})"
                    ),
                )
            }
            Err(e) => return error(503, e.to_string()),
        };
        // The slow part (asking the airline's inventory for a seat) holds no lock.
        std::thread::sleep(work);
        match self.commit_booking(&key, token, &request, trace) {
            Ok(result) => Reply {
                status: 201,
                body: result,
                replayed: false,
            },
            // This request's reservation timed out and another request holds the key now: this
            // booking was rolled back, and the other request's is the one that counts. The caller
            // retries and gets it.
            Err(e @ Error::StaleReservation { .. }) => {
                error(409, format!("{e}; this booking was rolled back"))
            }
            Err(e) => error(503, e.to_string()),
        }
    }

    /// The effect and its record in one transaction: the booking row and `finish_in`, under the
    /// reservation's token. A stale token rolls the booking back.
    fn commit_booking(
        &self,
        key: &IdempotencyKey,
        token: u64,
        request: &Value,
        trace: &TraceContext,
    ) -> Result<Value, Error> {
        let mut db = self.db.lock().unwrap();
        let Db { keys, conn } = &mut *db;
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sql)?;
        tx.execute(
            "INSERT INTO bookings (idempotency_key, trip_id, traveller, flight, trace_id) \
             VALUES (?1, ?2, ?3, ?4, ?5)",
            params![
                key.as_str(),
                request["trip_id"].as_str(),
                request["traveller"].as_str(),
                request["flight"].as_str(),
                trace.trace_id_hex()
            ],
        )
        .map_err(sql)?;
        let result = json!({
            "reference": format!("BK-{:03}", tx.last_insert_rowid()),
            "traveller": request["traveller"],
            "flight": request["flight"],
        });
        if let Err(e) = keys.finish_in(&tx, key, token, &result, SystemClock.now()) {
            tx.rollback().map_err(sql)?; // the booking goes with it
            return Err(e);
        }
        tx.commit().map_err(sql)?;
        Ok(result)
    }

    /// Answers `GET /bookings`: every booking, in order.
    fn bookings(&self) -> Result<Vec<Value>, Error> {
        let db = self.db.lock().unwrap();
        let mut stmt = db
            .conn
            .prepare(
                "SELECT id, idempotency_key, trip_id, traveller, flight, trace_id FROM bookings \
                 ORDER BY id",
            )
            .map_err(sql)?;
        let rows = stmt
            .query_map([], |row| {
                Ok(json!({
                    "reference": format!("BK-{:03}", row.get::<_, i64>(0)?),
                    "idempotency_key": row.get::<_, String>(1)?,
                    "trip_id": row.get::<_, Option<String>>(2)?,
                    "traveller": row.get::<_, Option<String>>(3)?,
                    "flight": row.get::<_, Option<String>>(4)?,
                    "trace_id": row.get::<_, Option<String>>(5)?,
                }))
            })
            .map_err(sql)?;
        rows.collect::<Result<_, _>>().map_err(sql)
    }

    /// Serves on `server` until it is unblocked; one thread per request.
    fn serve(self: Arc<Self>, server: Arc<tiny_http::Server>) {
        for mut request in server.incoming_requests() {
            let supplier = self.clone();
            std::thread::spawn(move || {
                let header = |name: &str| {
                    request
                        .headers()
                        .iter()
                        .find(|h| h.field.as_str().as_str().eq_ignore_ascii_case(name))
                        .map(|h| h.value.as_str().to_owned())
                };
                let key = header("Idempotency-Key");
                let work = header("X-Simulate-Work-Ms")
                    .and_then(|v| v.parse().ok())
                    .map_or(Duration::ZERO, Duration::from_millis);
                let trace = continue_trace(header("traceparent"), header("tracestate"));
                let mut body = Vec::new();
                let _ = request.as_reader().read_to_end(&mut body);
                let reply = match (request.method(), request.url()) {
                    (tiny_http::Method::Post, "/bookings") => {
                        let trip = serde_json::from_slice::<Value>(&body)
                            .ok()
                            .and_then(|b| b["trip_id"].as_str().map(str::to_owned));
                        log(format_args!(
                            "supplier: POST /bookings {} in trace {} (span {})",
                            trip.as_deref().unwrap_or("?"),
                            trace.trace_id_hex(),
                            trace.span_id_hex()
                        ));
                        supplier.book(key.as_deref(), &body, work, &trace)
                    }
                    (tiny_http::Method::Get, "/bookings") => match supplier.bookings() {
                        Ok(bookings) => Reply {
                            status: 200,
                            body: json!({ "bookings": bookings }),
                            replayed: false,
                        },
                        Err(e) => Reply {
                            status: 503,
                            body: json!({ "error": e.to_string() }),
                            replayed: false,
                        },
                    },
                    _ => Reply {
                        status: 404,
                        body: json!({ "error": "POST /bookings or GET /bookings" }),
                        replayed: false,
                    },
                };
                let trip = serde_json::from_slice::<Value>(&body)
                    .ok()
                    .and_then(|b| b["trip_id"].as_str().map(str::to_owned));
                if reply.status == 201
                    && !reply.replayed
                    && trip.is_some()
                    && trip == supplier.drop_first_answer_for
                {
                    // Committed, but the answer is lost on the way back: the caller times out.
                    supplier
                        .dropped
                        .lock()
                        .unwrap()
                        .push(key.unwrap_or_default());
                    std::thread::sleep(CLIENT_TIMEOUT * 3);
                    return;
                }
                let mut response = tiny_http::Response::from_string(reply.body.to_string())
                    .with_status_code(reply.status)
                    .with_header(
                        tiny_http::Header::from_bytes("Content-Type", "application/json").unwrap(),
                    );
                if reply.replayed {
                    response.add_header(
                        tiny_http::Header::from_bytes("Idempotent-Replayed", "true").unwrap(),
                    );
                }
                let _ = request.respond(response);
            });
        }
    }
}

/// Writes one line of the supplier's log to standard output; a reader that went away stops no
/// request.
fn log(line: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let _ = writeln!(std::io::stdout().lock(), "{line}");
}

/// The supplier's span of a request: a child of the caller's `traceparent` (and `tracestate`), or
/// the root of a new trace when the request has none or an invalid one (W3C: restart, never refuse).
fn continue_trace(traceparent: Option<String>, tracestate: Option<String>) -> TraceContext {
    let Some(traceparent) = traceparent else {
        return miniflow::new_trace_context();
    };
    match TraceContext::parse(&traceparent, tracestate.as_deref()) {
        Ok(caller) => caller.child("supplier"),
        // A tracestate we cannot read does not break the trace: keep the traceparent alone.
        Err(_) => match TraceContext::parse(&traceparent, None) {
            Ok(caller) => caller.child("supplier"),
            Err(e) => {
                log(format_args!("supplier: {e}; starting a new trace"));
                miniflow::new_trace_context()
            }
        },
    }
}

/// A supplier serving on 127.0.0.1.
struct Running {
    url: String,
    supplier: Arc<Supplier>,
    server: Arc<tiny_http::Server>,
}

/// Starts the supplier on an ephemeral port of 127.0.0.1.
fn start_supplier(
    path: &Path,
    reservation_timeout: Duration,
    drop_first_answer_for: Option<String>,
) -> Result<Running, Box<dyn std::error::Error>> {
    let supplier = Arc::new(Supplier::open(
        path,
        reservation_timeout,
        drop_first_answer_for,
    )?);
    let server = Arc::new(tiny_http::Server::http("127.0.0.1:0").map_err(|e| e.to_string())?);
    let url = format!("http://{}", server.server_addr());
    let (serving, listener) = (supplier.clone(), server.clone());
    std::thread::spawn(move || serving.serve(listener));
    Ok(Running {
        url,
        supplier,
        server,
    })
}

/// Delivers one command over HTTP: 2xx completes it with the booking reference; 409, 5xx and
/// timeouts retry with the same key; other 4xx are permanent failures.
fn deliver_over_http(agent: &ureq::Agent, url: &str, delivery: &Delivery) -> (Outcome, String) {
    let mut body = delivery.payload.clone();
    body["sent_at"] = json!(SystemClock.now().as_millis()); // changes on every attempt; not part of the intent
    let mut post = agent
        .post(format!("{url}/bookings"))
        .header("Idempotency-Key", delivery.command_id.to_string());
    // The trace of the commit that created the command goes on, under a span for this attempt.
    if let Some(trace) = &delivery.trace_context {
        let attempt = trace.child(format!("{}#{}", delivery.command_id, delivery.attempt));
        post = post.header("traceparent", attempt.traceparent());
        if let Some(state) = attempt.tracestate() {
            post = post.header("tracestate", state);
        }
    }
    let sent = post.send_json(&body);
    match sent {
        Err(e) => (
            Outcome::retry(format!("no answer ({e}): result unknown")),
            "timeout".into(),
        ),
        Ok(mut response) => {
            let status = response.status().as_u16();
            let replayed = response.headers().contains_key("Idempotent-Replayed");
            let answer: Value = response.body_mut().read_json().unwrap_or(Value::Null);
            let said = format!(
                "{status}{} {answer}",
                if replayed { " (replayed)" } else { "" }
            );
            let outcome = match status {
                200..=299 => Outcome::done_with(json!({ "reference": answer["reference"] })),
                409 | 500..=599 => Outcome::retry(format!("{status} {answer}")),
                _ => Outcome::permanent(format!("{status} {answer}")),
            };
            (outcome, said)
        }
    }
}

/// What a trip knows: its booking reference, once the result of `book_flight` has come back.
#[derive(Default)]
struct Trip {
    reference: Option<String>,
}

/// `trip_requested` books a flight and asks for the result; the `command_completed` event that
/// carries it back records the reference.
struct Trips;

impl Workflow for Trips {
    type State = Trip;

    fn evolve(&self, trip: &mut Trip, event: &EventRecord) {
        if let Some(Ok(done)) = event.decode::<CommandCompleted>() {
            trip.reference = done.result["reference"].as_str().map(str::to_owned);
        }
    }

    fn decide(&self, _: &Trip, event: &EventRecord) -> Decision {
        let p = &event.payload;
        match event.kind.as_str() {
            "trip_requested" => Decision::new().command(
                Command::new(
                    "book_flight",
                    json!({ "trip_id": event.workflow_id, "traveller": p["traveller"], "flight": p["flight"] }),
                )
                .report_result(),
            ),
            // `command_completed`: the reference is in the state; nothing more to do.
            _ => Decision::none(),
        }
    }
}

const TRIPS: [&str; 3] = ["trip-001", "trip-002", "trip-003"];

/// Whether anything is left to do: a command to deliver, or a result to feed back.
fn work_left(store: &SqliteStore) -> Result<bool, Error> {
    if !store.pending(1)?.is_empty() {
        return Ok(true);
    }
    for trip in TRIPS {
        let timers = store.timers(&WorkflowId::new(trip)?)?;
        if timers.iter().any(|t| t.status == TimerStatus::Scheduled) {
            return Ok(true);
        }
    }
    Ok(false)
}

fn demo(dir: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let Running {
        url,
        supplier,
        server,
    } = start_supplier(
        &dir.join("supplier.db"),
        RESERVATION_TIMEOUT,
        Some("trip-002".into()),
    )?;
    println!("supplier listening on {url}");

    let outbox = dir.join("flow.db");
    let mut store = SqliteStore::open(&outbox)?;
    let engine = Engine::new(Trips);
    // Two travellers on the same flight: two operations, two keys, two bookings.
    for (trip, traveller) in TRIPS.into_iter().zip(["Li Lei", "Han Meimei", "Li Lei"]) {
        let event = Event::new(
            "trip_requested",
            json!({ "traveller": traveller, "flight": "CA1405" }),
        );
        // The request starts a trace; the commit stores it with the booking command.
        let trace = miniflow::new_trace_context();
        println!("{trip} requested in trace {}", trace.trace_id_hex());
        engine.handle_traced(
            &mut store,
            &WorkflowId::new(trip)?,
            event,
            &trace,
            SystemClock.now(),
        )?;
    }

    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(CLIENT_TIMEOUT))
        .http_status_as_error(false)
        .build()
        .into();
    let answers = Arc::new(Mutex::new(std::collections::HashMap::new()));
    let (said, base) = (answers.clone(), url.clone());
    let dispatcher = Dispatcher::sqlite(&outbox, move |d: &Delivery| {
        let (outcome, answer) = deliver_over_http(&agent, &base, d);
        said.lock()
            .unwrap()
            .insert((d.command_id.to_string(), d.attempt), answer);
        outcome
    })
    // Fires the `command_completed` feedback into the trips.
    .workflow(Engine::new(Trips))
    .workers(2)
    .retry_policy(
        RetryPolicy::default()
            .initial_delay(Duration::from_millis(50))
            .max_attempts(5),
    )
    .poll_interval(Duration::from_millis(10))
    .on_settled(move |d, settlement| {
        let answer = answers
            .lock()
            .unwrap()
            .get(&(d.command_id.to_string(), d.attempt))
            .cloned()
            .unwrap_or_default();
        let what = match settlement {
            Settlement::Completed => "done".to_owned(),
            Settlement::RetryAt { .. } => "retry with the same key".to_owned(),
            Settlement::Dead { error } => format!("dead: {error}"),
            other => format!("{other:?}"),
        };
        println!("{} attempt {}: {answer} -> {what}", d.command_id, d.attempt);
    });
    while work_left(&store)? {
        dispatcher.run_until_idle()?;
        std::thread::sleep(Duration::from_millis(20));
    }

    println!(
        "answers dropped after commit: {}",
        supplier.dropped.lock().unwrap().join(", ")
    );
    let bookings = supplier.bookings()?;
    println!("bookings at the supplier: {}", bookings.len());
    for booking in &bookings {
        println!(
            "booking {} for {} in trace {}",
            booking["reference"].as_str().unwrap_or("?"),
            booking["trip_id"].as_str().unwrap_or("?"),
            booking["trace_id"].as_str().unwrap_or("?")
        );
    }
    for trip in TRIPS {
        for row in store.commands(&WorkflowId::new(trip)?)? {
            println!(
                "{} {} after {} attempt(s), traceparent {}",
                row.command_id,
                row.status,
                row.attempts,
                row.trace_context
                    .as_ref()
                    .map_or("(none)".to_owned(), TraceContext::traceparent)
            );
        }
    }
    println!("results fed back into the workflows:");
    for trip in TRIPS {
        let id = WorkflowId::new(trip)?;
        for event in store.load(&id)? {
            if let Some(done) = event.decode::<CommandCompleted>() {
                let done = done?;
                println!(
                    "{trip} event {}: command_completed {} {} {} after {} attempt(s)",
                    event.seq, done.command_id, done.kind, done.result, done.attempts
                );
            }
        }
        let trip_state = engine.replay(&store, &id)?.state;
        println!(
            "{trip} knows its booking: {}",
            trip_state.reference.as_deref().unwrap_or("(none)")
        );
    }
    println!("pending: {}", store.pending(usize::MAX)?.len());
    server.unblock();
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("serve") {
        let reservation_timeout = match &args[1..] {
            [] => RESERVATION_TIMEOUT,
            [flag, ms] if flag == "--reservation-timeout-ms" => Duration::from_millis(ms.parse()?),
            _ => return Err("usage: http_supplier [serve [--reservation-timeout-ms N]]".into()),
        };
        // Serve until standard input closes (the caller's signal to stop).
        let path: PathBuf = dir.path().join("supplier.db");
        let running = start_supplier(&path, reservation_timeout, None)?;
        println!("supplier listening on {}", running.url);
        for _ in std::io::stdin().lock().lines() {}
        running.server.unblock();
        return Ok(());
    }
    demo(dir.path())
}
