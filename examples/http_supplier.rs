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
//! The dispatcher completes a command only on a 2xx; a timeout means "unknown" and is retried with the
//! same key. To show it, the supplier drops its answer to the first call for `trip-002` *after* it has
//! committed the booking: the retry gets the stored answer, and each traveller has exactly one booking.
//!
//! `cargo run --example http_supplier` runs the whole demo on 127.0.0.1.
//! `cargo run --example http_supplier -- serve` runs only the supplier and prints its address.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use miniflow::{
    json, Begin, Clock, Command, Decision, Delivery, Digest, Dispatcher, Engine, Error, Event,
    EventRecord, IdempotencyKey, IdempotencyPolicy, IdempotencyStore, Outcome, RetryPolicy,
    Settlement, SqliteIdempotencyStore, SqliteStore, Store, SystemClock, Value, Workflow,
    WorkflowId,
};

/// The fields of a booking request that define the business intent: a retry that only changes
/// `sent_at` or `trace_id` is the same booking.
const INTENT: [&str; 3] = ["trip_id", "traveller", "flight"];

/// How long the dispatcher waits for an answer before it calls the result unknown.
const CLIENT_TIMEOUT: Duration = Duration::from_millis(1_000);

/// The airline: idempotency records and bookings in its own SQLite file.
struct Supplier {
    keys: Mutex<SqliteIdempotencyStore>,
    bookings: AtomicU64,
    /// Drop the answer to the first call for this trip, after committing it.
    drop_first_answer_for: Option<String>,
    dropped: Mutex<Vec<String>>,
}

struct Reply {
    status: u16,
    body: Value,
    replayed: bool,
}

impl Supplier {
    fn open(path: &Path, drop_first_answer_for: Option<String>) -> Result<Self, miniflow::Error> {
        let policy = IdempotencyPolicy {
            retention: Duration::from_secs(7 * 24 * 3600),
            reservation_timeout: Duration::from_secs(30),
        };
        Ok(Self {
            keys: Mutex::new(SqliteIdempotencyStore::open(path, policy)?),
            bookings: AtomicU64::new(0),
            drop_first_answer_for,
            dropped: Mutex::new(Vec::new()),
        })
    }

    /// Answers one `POST /bookings`. `work` simulates how long the booking itself takes.
    fn book(&self, key: Option<&str>, body: &[u8], work: Duration) -> Reply {
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
        let begun = self
            .keys
            .lock()
            .unwrap()
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
        // The effect: book the seat. (A real service would do this and `finish` in one transaction.)
        std::thread::sleep(work);
        let n = self.bookings.fetch_add(1, Ordering::SeqCst) + 1;
        let result = json!({ "reference": format!("BK-{n:03}"), "traveller": request["traveller"], "flight": request["flight"] });
        let finished = self
            .keys
            .lock()
            .unwrap()
            .finish(&key, token, &result, SystemClock.now());
        match finished {
            Ok(()) => {}
            // This request's reservation timed out and another request holds the key now: its result
            // is the one that counts. The caller retries and gets it.
            Err(e @ Error::StaleReservation { .. }) => return error(409, e.to_string()),
            Err(e) => return error(503, e.to_string()),
        }
        Reply {
            status: 201,
            body: result,
            replayed: false,
        }
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
                let mut body = Vec::new();
                let _ = request.as_reader().read_to_end(&mut body);
                let reply = if request.method() == &tiny_http::Method::Post
                    && request.url() == "/bookings"
                {
                    supplier.book(key.as_deref(), &body, work)
                } else {
                    Reply {
                        status: 404,
                        body: json!({ "error": "POST /bookings" }),
                        replayed: false,
                    }
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

/// A supplier serving on 127.0.0.1.
struct Running {
    url: String,
    supplier: Arc<Supplier>,
    server: Arc<tiny_http::Server>,
}

/// Starts the supplier on an ephemeral port of 127.0.0.1.
fn start_supplier(
    path: &Path,
    drop_first_answer_for: Option<String>,
) -> Result<Running, Box<dyn std::error::Error>> {
    let supplier = Arc::new(Supplier::open(path, drop_first_answer_for)?);
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

/// Delivers one command over HTTP: 2xx completes it; 409, 5xx and timeouts retry with the same key;
/// other 4xx are permanent failures.
fn deliver_over_http(agent: &ureq::Agent, url: &str, delivery: &Delivery) -> (Outcome, String) {
    let mut body = delivery.payload.clone();
    body["sent_at"] = json!(SystemClock.now().as_millis()); // changes on every attempt; not part of the intent
    let sent = agent
        .post(format!("{url}/bookings"))
        .header("Idempotency-Key", delivery.command_id.to_string())
        .send_json(&body);
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
                200..=299 => Outcome::Done,
                409 | 500..=599 => Outcome::retry(format!("{status} {answer}")),
                _ => Outcome::permanent(format!("{status} {answer}")),
            };
            (outcome, said)
        }
    }
}

struct Trips;

impl Workflow for Trips {
    type State = ();

    fn evolve(&self, _: &mut (), _: &EventRecord) {}

    fn decide(&self, _: &(), event: &EventRecord) -> Decision {
        let p = &event.payload;
        Decision::new().command(Command::new(
            "book_flight",
            json!({ "trip_id": event.workflow_id, "traveller": p["traveller"], "flight": p["flight"] }),
        ))
    }
}

fn demo(dir: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let Running {
        url,
        supplier,
        server,
    } = start_supplier(&dir.join("supplier.db"), Some("trip-002".into()))?;
    println!("supplier listening on {url}");

    let outbox = dir.join("flow.db");
    let mut store = SqliteStore::open(&outbox)?;
    let engine = Engine::new(Trips);
    // Two travellers on the same flight: two operations, two keys, two bookings.
    for (trip, traveller) in [
        ("trip-001", "Li Lei"),
        ("trip-002", "Han Meimei"),
        ("trip-003", "Li Lei"),
    ] {
        let event = Event::new(
            "trip_requested",
            json!({ "traveller": traveller, "flight": "CA1405" }),
        );
        engine.handle(
            &mut store,
            &WorkflowId::new(trip)?,
            event,
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
    while !store.pending(1)?.is_empty() {
        dispatcher.run_until_idle()?;
        std::thread::sleep(Duration::from_millis(20));
    }

    println!(
        "answers dropped after commit: {}",
        supplier.dropped.lock().unwrap().join(", ")
    );
    println!(
        "bookings at the supplier: {}",
        supplier.bookings.load(Ordering::SeqCst)
    );
    for trip in ["trip-001", "trip-002", "trip-003"] {
        for row in store.commands(&WorkflowId::new(trip)?)? {
            println!(
                "{} {} after {} attempt(s)",
                row.command_id, row.status, row.attempts
            );
        }
    }
    println!("pending: {}", store.pending(usize::MAX)?.len());
    server.unblock();
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    if std::env::args().nth(1).as_deref() == Some("serve") {
        // Serve until standard input closes (the caller's signal to stop).
        let path: PathBuf = dir.path().join("supplier.db");
        let running = start_supplier(&path, None)?;
        println!("supplier listening on {}", running.url);
        for _ in std::io::stdin().lock().lines() {}
        running.server.unblock();
        return Ok(());
    }
    demo(dir.path())
}
