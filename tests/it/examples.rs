//! The examples run as a user runs them, and print what their docs promise.

use std::path::PathBuf;
use std::process::Command;

/// Builds (if needed) and runs `cargo run --example <name>`, returning its standard output.
pub fn run_example(name: &str, args: &[&str]) -> String {
    run_example_with(name, &[], &[], args)
}

/// As [`run_example`], with the package's `features` and `env` set for the example.
pub fn run_example_with(
    name: &str,
    features: &[&str],
    env: &[(&str, &str)],
    args: &[&str],
) -> String {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
    let mut cargo = Command::new(env!("CARGO"));
    cargo.args(["run", "--quiet", "--example", name, "--manifest-path"]);
    cargo.arg(&manifest);
    if !features.is_empty() {
        cargo.args(["--features", &features.join(",")]);
    }
    let output = cargo
        .arg("--")
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("run cargo");
    assert!(
        output.status.success(),
        "example {name} failed: {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("UTF-8 output")
}

#[test]
fn trip_example_folds_the_redelivery_into_one_effect() {
    let out = run_example("trip", &[]);
    assert_eq!(
        out,
        "first delivery: REF-1\nretry delivery: REF-1\nreal side effects: 1\npending: 0\n"
    );
}

#[test]
fn worker_example_retries_with_backoff_folds_the_timeout_and_buries_the_refusal() {
    let out = run_example("worker", &[]);
    let line = |needle: &str| {
        out.lines()
            .find(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no line with {needle:?} in:\n{out}"))
    };
    line("trip-001:1:0 lock_budget attempt 1: failed (503 budget service unavailable), retry in");
    line("trip-001:1:0 lock_budget attempt 2: failed (503 budget service unavailable), retry in");
    line("attempt 3: failed (timed out after 5s: result unknown), retry in");
    line("trip-001:1:0 lock_budget attempt 4: done");
    line("budget service: trip-001:1:0 seen before, replays BUDGET-1");
    line("trip-001:1:1 book_hotel  attempt 1: failed for good (422 hotel Atlantis does not exist): dead");
    line("trip-001:1:0 lock_budget done attempts=4");
    line("trip-001:1:1 book_hotel  dead attempts=1");
    assert_eq!(line("dead letters:"), "dead letters: 1");
    assert_eq!(line("real side effects:"), "real side effects: 1");
    // Backoffs grow: 1 s, 2 s, 4 s bases, each shortened by at most 20 % jitter.
    let backoffs: Vec<f64> = out
        .lines()
        .filter_map(|l| l.split("retry in ").nth(1))
        .map(|s| s.trim_end_matches('s').parse().unwrap())
        .collect();
    assert_eq!(backoffs.len(), 3, "{out}");
    for (backoff, base) in backoffs.iter().zip([1.0, 2.0, 4.0]) {
        assert!(
            *backoff <= base && *backoff >= base * 0.8,
            "backoff {backoff} for base {base}"
        );
    }
}

/// One trace per trip runs from the request through the outbox to the supplier, with no tracing
/// system installed: the trace ID the producer started is the one stored with the command, the one
/// the supplier received in each attempt's `traceparent` header, and the one stored with the booking.
#[test]
fn http_supplier_example_carries_one_trace_from_the_request_to_the_booking() {
    let out = run_example("http_supplier", &[]);
    let after = |prefix: &str, word: &str| -> Vec<String> {
        out.lines()
            .filter(|l| l.starts_with(prefix))
            .map(|l| {
                let id = l.split(word).nth(1).unwrap_or_default();
                id.split([' ', '-']).next().unwrap_or_default().to_owned()
            })
            .collect()
    };
    for trip in ["trip-001", "trip-002", "trip-003"] {
        let started = after(&format!("{trip} requested"), "in trace ");
        assert_eq!(started.len(), 1, "{out}");
        let trace = &started[0];
        assert!(
            trace.len() == 32 && trace.bytes().all(|b| b.is_ascii_hexdigit()),
            "{trace}"
        );
        let stored = after(&format!("{trip}:1:0 done"), "traceparent 00-");
        assert_eq!(
            stored,
            std::slice::from_ref(trace),
            "stored with the command: {out}"
        );
        let received = after(&format!("supplier: POST /bookings {trip} "), "in trace ");
        let attempts = if trip == "trip-002" { 2 } else { 1 };
        assert_eq!(
            received,
            vec![trace.clone(); attempts],
            "every attempt: {out}"
        );
        let booked = after("booking BK-", "in trace ");
        assert!(booked.contains(trace), "stored with the booking: {out}");
    }
    // Each attempt is a span of its own below the producer's.
    let spans: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("supplier: POST /bookings trip-002"))
        .filter_map(|l| l.split("(span ").nth(1))
        .collect();
    assert_eq!(spans.len(), 2, "{out}");
    assert_ne!(spans[0], spans[1], "{out}");
}

#[test]
fn http_supplier_example_books_once_per_command_despite_a_dropped_answer() {
    let out = run_example("http_supplier", &[]);
    let line = |needle: &str| {
        out.lines()
            .find(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no line with {needle:?} in:\n{out}"))
            .to_owned()
    };
    line("trip-002:1:0 attempt 1: timeout -> retry with the same key");
    let replay = line("trip-002:1:0 attempt 2: 201 (replayed)");
    assert!(replay.ends_with("-> done"), "{replay}");
    assert_eq!(
        line("answers dropped after commit:"),
        "answers dropped after commit: trip-002:1:0"
    );
    assert_eq!(
        line("bookings at the supplier:"),
        "bookings at the supplier: 3"
    );
    // Exactly one reference per command, and three different ones.
    let mut references: Vec<String> = out
        .lines()
        .filter(|l| l.contains("-> done"))
        .map(|l| {
            l.split("\"reference\":\"")
                .nth(1)
                .unwrap()
                .split('"')
                .next()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(references.len(), 3, "{out}");
    references.sort();
    references.dedup();
    assert_eq!(
        references.len(),
        3,
        "two commands got the same booking: {out}"
    );
    for trip in ["trip-001", "trip-002", "trip-003"] {
        line(&format!("{trip}:1:0 done"));
    }
    // Each booking's reference came back into its workflow, once, as the supplier gave it (for
    // trip-002, the replayed answer of the booking whose first answer was dropped).
    for trip in ["trip-001", "trip-002", "trip-003"] {
        let done = out
            .lines()
            .find(|l| l.starts_with(&format!("{trip}:1:0 attempt")) && l.ends_with("-> done"))
            .unwrap_or_else(|| panic!("{trip} never done:\n{out}"));
        let reference = done
            .split("\"reference\":\"")
            .nth(1)
            .unwrap()
            .split('"')
            .next()
            .unwrap();
        let fed_back: Vec<&str> = out
            .lines()
            .filter(|l| l.starts_with(&format!("{trip} event")) && l.contains("command_completed"))
            .collect();
        assert_eq!(
            fed_back,
            [format!(
                "{trip} event 2: command_completed {trip}:1:0 book_flight {{\"reference\":\"{reference}\"}} after {} attempt(s)",
                if trip == "trip-002" { 2 } else { 1 }
            )],
            "{out}"
        );
        assert_eq!(
            line(&format!("{trip} knows its booking:")),
            format!("{trip} knows its booking: {reference}")
        );
    }
    assert_eq!(line("pending:"), "pending: 0");
}

/// The supplier of the HTTP example, running alone on 127.0.0.1 until the test ends.
struct Supplier {
    process: std::process::Child,
    url: String,
}

impl Supplier {
    fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts `http_supplier serve` with `options` after `serve`.
    fn start_with(options: &[&str]) -> Self {
        let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
        let mut process = Command::new(env!("CARGO"))
            .args([
                "run",
                "--quiet",
                "--example",
                "http_supplier",
                "--manifest-path",
            ])
            .arg(&manifest)
            .args(["--", "serve"])
            .args(options)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("start the supplier");
        let mut first = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(process.stdout.take().unwrap()),
            &mut first,
        )
        .unwrap();
        let url = first
            .trim()
            .strip_prefix("supplier listening on ")
            .expect("the supplier's address")
            .to_owned();
        Self { process, url }
    }

    fn book(
        &self,
        key: Option<&str>,
        body: serde_json::Value,
        work_ms: u64,
    ) -> (u16, bool, serde_json::Value) {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .build()
            .into();
        let mut request = agent
            .post(format!("{}/bookings", self.url))
            .header("X-Simulate-Work-Ms", work_ms.to_string());
        if let Some(key) = key {
            request = request.header("Idempotency-Key", key);
        }
        let mut response = request.send_json(&body).expect("an answer");
        let replayed = response.headers().contains_key("Idempotent-Replayed");
        (
            response.status().as_u16(),
            replayed,
            response.body_mut().read_json().unwrap(),
        )
    }

    /// The supplier's bookings (`GET /bookings`).
    fn bookings(&self) -> Vec<serde_json::Value> {
        let agent: ureq::Agent = ureq::Agent::config_builder().build().into();
        let mut response = agent
            .get(format!("{}/bookings", self.url))
            .call()
            .expect("the bookings");
        let body: serde_json::Value = response.body_mut().read_json().unwrap();
        body["bookings"].as_array().unwrap().clone()
    }
}

impl Drop for Supplier {
    fn drop(&mut self) {
        drop(self.process.stdin.take()); // closing stdin stops the supplier
        let _ = self.process.wait();
    }
}

#[test]
fn http_supplier_answers_201_replay_409_and_422_by_idempotency_key() {
    let supplier = Supplier::start();
    let request = |traveller: &str, sent_at: u64| serde_json::json!({ "trip_id": "t-1", "traveller": traveller, "flight": "CA1405", "sent_at": sent_at });

    let (status, replayed, first) = supplier.book(Some("t-1:1:0"), request("Li Lei", 1), 0);
    assert_eq!((status, replayed), (201, false));
    let (status, replayed, again) = supplier.book(Some("t-1:1:0"), request("Li Lei", 2), 0);
    assert_eq!(
        (status, replayed),
        (201, true),
        "a replay with another sent_at is the same booking"
    );
    assert_eq!(again, first);

    let (status, _, body) = supplier.book(Some("t-1:1:0"), request("Han Meimei", 3), 0);
    assert_eq!(status, 422, "{body}");
    assert!(body["error"].as_str().unwrap().contains("other parameters"));

    let (status, _, _) = supplier.book(None, request("Li Lei", 4), 0);
    assert_eq!(status, 400);

    // A slow first call holds its key: a concurrent call with the same key gets 409.
    std::thread::scope(|scope| {
        let slow = scope.spawn(|| supplier.book(Some("t-2:1:0"), request("Li Lei", 5), 1_500));
        std::thread::sleep(std::time::Duration::from_millis(500));
        let (status, _, body) = supplier.book(Some("t-2:1:0"), request("Li Lei", 6), 0);
        assert_eq!(status, 409, "{body}");
        assert_eq!(slow.join().unwrap().0, 201);
    });
    let (status, replayed, _) = supplier.book(Some("t-2:1:0"), request("Li Lei", 7), 0);
    assert_eq!((status, replayed), (201, true));
    let keys: Vec<String> = supplier
        .bookings()
        .iter()
        .map(|b| b["idempotency_key"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(keys, ["t-1:1:0", "t-2:1:0"], "one booking per key");
}

#[test]
fn http_supplier_rolls_back_the_booking_of_a_request_whose_reservation_was_taken_over() {
    // Reservations hold 400 ms: a request working 2 s loses its key to a retry meanwhile.
    let supplier = Supplier::start_with(&["--reservation-timeout-ms", "400"]);
    let request = |sent_at: u64| serde_json::json!({ "trip_id": "t-3", "traveller": "Li Lei", "flight": "CA1405", "sent_at": sent_at });
    let (slow, (status, replayed, taken_over)) = std::thread::scope(|scope| {
        let slow = scope.spawn(|| supplier.book(Some("t-3:1:0"), request(1), 2_000));
        std::thread::sleep(std::time::Duration::from_millis(900));
        let retry = supplier.book(Some("t-3:1:0"), request(2), 0);
        (slow.join().unwrap(), retry)
    });
    assert_eq!(
        (status, replayed),
        (201, false),
        "the retry took the timed-out reservation over and booked: {taken_over}"
    );
    assert_eq!(
        slow.0, 409,
        "the slow request's token was stale: {}",
        slow.2
    );
    assert!(
        slow.2["error"].as_str().unwrap().contains("rolled back"),
        "{}",
        slow.2
    );
    let bookings = supplier.bookings();
    assert_eq!(
        bookings.len(),
        1,
        "the stale request's booking went with its rollback: {bookings:?}"
    );
    assert_eq!(bookings[0]["reference"], taken_over["reference"]);
    let (status, replayed, again) = supplier.book(Some("t-3:1:0"), request(3), 0);
    assert_eq!((status, replayed), (201, true));
    assert_eq!(again, taken_over, "the booking that counts is answered");
}

#[test]
fn trip_saga_example_compensates_a_failed_hotel_and_a_hotel_past_its_deadline() {
    let out = run_example("trip_saga", &[]);
    let line = |needle: &str| {
        out.lines()
            .find(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no line with {needle:?} in:\n{out}"))
            .to_owned()
    };
    // The airline's reference came back into each trip as one command_completed event.
    line("2 command_completed {\"attempts\":1,\"command_id\":\"trip-001:1:1\",\"kind\":\"book_flight\",\"result\":{\"reference\":\"FL-001\"}}");
    line("trip-001:1:1:completed command_completed fired");
    assert_eq!(out.matches("2 command_completed").count(), 2, "{out}");
    // trip-001: the hotel refused; the failure came back as an event and was compensated, the flight
    // cancelled with the reference the workflow kept.
    line("trip-001:1:2 book_hotel     attempt 2: failed for good (422 hotel fully booked): dead");
    line("3 command_failed   {\"attempts\":2,\"command_id\":\"trip-001:1:2\",\"error\":\"422 hotel fully booked\",\"kind\":\"book_hotel\"}");
    line("trip-001:3:0 release_budget done");
    assert!(
        line("trip-001:3:1 cancel_flight  done").contains("\"reference\":\"FL-001\""),
        "{out}"
    );
    line("trip-001:1:t0 hotel_deadline   cancelled");
    line("state: cancelled (book_hotel failed: 422 hotel fully booked); flight reference: FL-001; budget released: true; flight cancelled: true");
    // trip-002: the hotel kept answering busy; the 30-minute deadline fired once and withdrew the
    // still-retrying booking instead of letting it land later.
    line("[ 30.0 min] trip-002:3:1 cancel_flight  attempt 1: done");
    line("3 timer_fired      {\"name\":\"hotel_deadline\",\"payload\":{\"trip_id\":\"trip-002\"},\"timer_id\":\"trip-002:1:t0\"}");
    line("trip-002:1:t0 hotel_deadline   fired");
    line("trip-002:1:2 book_hotel     cancelled attempts=6");
    assert!(
        !out.contains("trip-002:1:2 book_hotel     attempt 7"),
        "a withdrawn command is never delivered again: {out}"
    );
    assert!(
        line("trip-002:3:1 cancel_flight  done").contains("\"reference\":\"FL-002\""),
        "{out}"
    );
    line("state: cancelled (the hotel did not confirm within 30 minutes); flight reference: FL-002; budget released: true; flight cancelled: true");
    assert_eq!(
        out.matches("timer_fired").count(),
        1,
        "the deadline fired once: {out}"
    );
    assert_eq!(line("pending:"), "pending: 0");
    assert_eq!(line("dead:"), "dead: 1 (unexplained: 0)");
}

#[test]
fn schedule_example_fires_each_occurrence_once_and_catches_up_after_an_outage_by_policy() {
    let out = run_example("schedule", &[]);
    let line = |needle: &str| {
        out.lines()
            .find(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no line with {needle:?} in:\n{out}"))
            .to_owned()
    };
    // On time: every occurrence once, at its time.
    line("[2024-02-01 09:00] send_invoice      for 2024-02-01 09:00");
    line("[2024-03-01 09:00] send_invoice      for 2024-03-01 09:00");
    line("[2024-03-18 10:00] send_usage_report for 2024-03-18 10:00");
    // After the outage: the invoices catch up one by one (at most three, April counted as missed),
    // the weekly report fires once for the fifteen it missed.
    line("[2024-07-02 12:00] send_invoice      for 2024-05-01 09:00 (1 missed before it)");
    line("[2024-07-02 12:00] send_invoice      for 2024-06-01 09:00");
    line("[2024-07-02 12:00] send_invoice      for 2024-07-01 09:00");
    line("[2024-07-02 12:00] send_usage_report for 2024-07-01 10:00 (14 missed before it)");
    assert!(
        !out.contains("for 2024-04-01"),
        "April is folded into May: {out}"
    );
    assert_eq!(out.matches("send_invoice ").count(), 5, "{out}");
    // Stopped: nothing after the cancellation, the armed occurrences cancelled.
    assert!(!out.contains("for 2024-08"), "{out}");
    assert_eq!(line("invoices sent:"), "invoices sent: 5");
    assert_eq!(line("usage reports sent:"), "usage reports sent: 11");
    assert!(
        line("last invoice occurrence:").ends_with("cancelled"),
        "{out}"
    );
    assert!(
        line("last usage_report occurrence:").ends_with("cancelled"),
        "{out}"
    );
    assert_eq!(line("pending:"), "pending: 0");
}

/// The trip and worker examples on PostgreSQL, given a database by `--database-url` or by
/// `MINIFLOW_DATABASE_URL`: the same story, in a database that outlives the run (a second run there
/// meets none of the first's commands).
#[cfg(feature = "postgres")]
#[test]
fn trip_and_worker_examples_run_on_postgres_given_a_database_url() {
    let database = crate::postgres::TestDatabase::new();
    let url = database.url();
    let expected =
        "first delivery: REF-1\nretry delivery: REF-1\nreal side effects: 1\npending: 0\n";
    let out = run_example_with("trip", &["postgres"], &[], &["--database-url", &url]);
    assert_eq!(out, expected);
    let out = run_example_with(
        "trip",
        &["postgres"],
        &[("MINIFLOW_DATABASE_URL", &url)],
        &[],
    );
    assert_eq!(out, expected, "a second run, by the environment");
    let mut client = database.client();
    let trips: i64 = client
        .query_one("SELECT count(DISTINCT workflow_id) FROM events", &[])
        .unwrap()
        .get(0);
    assert_eq!(trips, 2, "both runs wrote to the database");

    for _ in 0..2 {
        let out = run_example_with("worker", &["postgres"], &[], &["--database-url", &url]);
        let line = |needle: &str| {
            out.lines()
                .find(|l| l.contains(needle))
                .unwrap_or_else(|| panic!("no line with {needle:?} in:\n{out}"))
        };
        line(":1:0 lock_budget attempt 2: failed (503 budget service unavailable), retry in");
        line(":1:0 lock_budget attempt 4: done");
        line(
            ":1:1 book_hotel  attempt 1: failed for good (422 hotel Atlantis does not exist): dead",
        );
        assert_eq!(line("dead letters:"), "dead letters: 1");
        assert_eq!(line("real side effects:"), "real side effects: 1");
    }
    let dead: i64 = client
        .query_one("SELECT count(*) FROM outbox WHERE status = 'dead'", &[])
        .unwrap()
        .get(0);
    assert_eq!(dead, 2, "one dead hotel booking per worker run");
}

/// The metrics example serves what its workload recorded over HTTP on 127.0.0.1, in a text format
/// that Prometheus's own checker (`promtool check metrics`) accepts, with the documented names and
/// the counts of the workload: 3 retries, 1 dead letter, 1 commit conflict, a fired timer, and the
/// outbox gauges.
#[test]
fn metrics_example_serves_a_valid_prometheus_exposition_of_the_workload() {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
    let mut process = Command::new(env!("CARGO"))
        .args(["run", "--quiet", "--example", "metrics", "--manifest-path"])
        .arg(&manifest)
        .args(["--", "--requests", "1"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start the metrics example");
    let mut stdout = std::io::BufReader::new(process.stdout.take().unwrap());
    let url = loop {
        let mut line = String::new();
        let read = std::io::BufRead::read_line(&mut stdout, &mut line).unwrap();
        assert!(read > 0, "the example ended before it served");
        if let Some(url) = line.trim().strip_prefix("metrics on ") {
            break url.to_owned();
        }
    };
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");
    let scrape = ureq::get(&url)
        .call()
        .expect("a scrape")
        .body_mut()
        .read_to_string()
        .unwrap();
    assert!(
        process.wait().unwrap().success(),
        "it stops after one request"
    );

    let mut check = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool (Debian's prometheus package; scripts/setup installs it)");
    std::io::Write::write_all(&mut check.stdin.take().unwrap(), scrape.as_bytes()).unwrap();
    let checked = check.wait_with_output().unwrap();
    assert!(
        checked.status.success() && checked.stdout.is_empty() && checked.stderr.is_empty(),
        "promtool: {}{}\n{scrape}",
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    );

    let value = |series: &str| -> f64 {
        scrape
            .lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("no {series} in:\n{scrape}"))
            .parse()
            .unwrap()
    };
    assert_eq!(value("miniflow_retries_total{kind=\"charge_card\"}"), 3.0);
    assert_eq!(
        value("miniflow_dead_letters_total{kind=\"book_courier\"}"),
        1.0
    );
    assert_eq!(value("miniflow_completed_total{kind=\"charge_card\"}"), 3.0);
    assert_eq!(
        value("miniflow_delivery_attempts_total{kind=\"charge_card\"}"),
        6.0
    );
    assert_eq!(value("miniflow_commit_conflicts_total"), 1.0);
    assert_eq!(value("miniflow_timers_fired_total"), 1.0);
    assert_eq!(value("miniflow_rows_purged_total"), 8.0);
    assert_eq!(
        value("miniflow_claim_delay_seconds_count{kind=\"send_email\"}"),
        3.0
    );
    // The gauges, from the stats before the scrape: order-3's courier is dead, nothing waits.
    let depth = |status: &str| {
        value(&format!(
            "miniflow_outbox_depth{{status=\"{status}\",kind=\"book_courier\"}}"
        ))
    };
    assert_eq!((depth("dead"), depth("pending")), (1.0, 0.0));
    assert_eq!(
        value("miniflow_outbox_oldest_due_age_seconds{kind=\"book_courier\"}"),
        0.0
    );
    // Every family is documented, with its help text.
    for line in scrape.lines().filter(|l| l.starts_with("# TYPE ")) {
        let name = line.split(' ').nth(2).unwrap();
        let metric = miniflow::telemetry::METRICS
            .iter()
            .find(|m| m.name == name)
            .unwrap_or_else(|| panic!("{name} is not in telemetry::METRICS"));
        assert!(
            scrape.contains(&format!("# HELP {name} {}", metric.help)),
            "{name} has no help"
        );
    }
}

/// `cargo run -p miniflow-example-axum`: two axum services on 127.0.0.1, orders written with their
/// event and command in one transaction, delivered by the async dispatcher with `Idempotency-Key`.
#[cfg(feature = "tokio")]
#[test]
fn axum_example_reserves_once_per_order_despite_a_duplicate_and_a_lost_answer() {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
    let output = Command::new(env!("CARGO"))
        .args([
            "run",
            "--quiet",
            "-p",
            "miniflow-example-axum",
            "--manifest-path",
        ])
        .arg(&manifest)
        .output()
        .expect("run cargo");
    assert!(
        output.status.success(),
        "the axum example failed: {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let out = String::from_utf8(output.stdout).expect("UTF-8 output");
    let line = |needle: &str| {
        out.lines()
            .find(|l| l.starts_with(needle))
            .unwrap_or_else(|| panic!("no line starting with {needle:?} in:\n{out}"))
            .to_owned()
    };
    assert_eq!(line("orders placed:"), "orders placed: 5");
    assert_eq!(line("the same order again:"), "the same order again: 409");
    // Five orders, one sent twice at once, one whose answer was lost and delivered again: seven
    // requests, two of them answered from the idempotency record, one reservation per order.
    assert_eq!(
        line("warehouse requests:"),
        "warehouse requests: 7, replayed answers: 2"
    );
    assert_eq!(
        line("reservations at the warehouse:"),
        "reservations at the warehouse: 5"
    );
    assert_eq!(
        line("reservations per order:"),
        "reservations per order: order-001=1 order-002=1 order-003=1 order-004=1 order-005=1"
    );
    assert_eq!(
        line("deliveries:"),
        "deliveries: 5 completed, 1 retried, 0 dead"
    );
    assert_eq!(line("commands pending:"), "commands pending: 0");
    // Each reservation came back into its order's workflow, and no two orders share one.
    let mut reservations: Vec<String> = (1..=5)
        .map(|n| {
            let reserved = line(&format!("order-{n:03}: reserved "));
            let reservation = reserved.rsplit(' ').next().unwrap().to_owned();
            assert!(reservation.starts_with("RSV-"), "{reserved}");
            reservation
        })
        .collect();
    reservations.sort();
    reservations.dedup();
    assert_eq!(reservations.len(), 5, "{out}");
}
