//! The PostgreSQL version across processes, with faults: the orders service, a worker and the
//! warehouse each run as a process of `axum-orders-postgres` on a throwaway cluster; orders are
//! placed over HTTP while the worker is killed and started again, the warehouse loses answers after
//! committing them, and the server is stopped as a crash would stop it and started again. Then the
//! databases must show every order once, every reservation once, every result once in its order.

#[path = "../../../tests/it/postgres/cluster.rs"]
#[allow(dead_code)]
mod cluster;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use cluster::Cluster;
use miniflow::postgres::{Client, NoTls};
use miniflow::tokio::tokio_postgres;
use miniflow::{json, Value};
use miniflow_example_axum::{get_json, http_client, post_json, HttpClient};

/// How many orders the test places: in three waves, one per fault.
const ORDERS: usize = 45;
const FIRST_WAVE: std::ops::RangeInclusive<usize> = 1..=15;
const SECOND_WAVE: std::ops::RangeInclusive<usize> = 16..=30;
const THIRD_WAVE: std::ops::RangeInclusive<usize> = 31..=45;
/// Every how many new reservations the warehouse loses its answer after committing.
const LOSE_ANSWER_EVERY: u64 = 4;

fn order_id(n: usize) -> String {
    format!("order-{n:03}")
}

/// A process of `axum-orders-postgres`, killed (SIGKILL) when dropped; its stderr goes to a log
/// file, shown when the test fails.
struct Process {
    role: &'static str,
    child: Child,
    log: PathBuf,
}

impl Process {
    /// Starts `role` with `args` and waits until it prints `ready`; returns it and what followed
    /// `ready` (its address).
    fn start(role: &'static str, args: &[&str], logs: &Path, run: usize) -> (Self, String) {
        let log = logs.join(format!("{role}-{run}.log"));
        let stderr = std::fs::File::create(&log).expect("create the process's log");
        let mut child = Command::new(env!("CARGO_BIN_EXE_axum-orders-postgres"))
            .arg(role)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|e| panic!("start the {role} process: {e}"));
        let stdout = child.stdout.take().expect("piped stdout");
        let process = Self { role, child, log };
        let (lines, ready) = mpsc::channel();
        // Reads the process's stdout to its end, so that it never blocks on a full pipe.
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = lines.send(line);
            }
        });
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match ready.recv_timeout(left) {
                Ok(line) if line.starts_with("ready") => {
                    let address = line.trim_start_matches("ready").trim().to_owned();
                    return (process, address);
                }
                Ok(_) => {}
                Err(e) => panic!(
                    "the {role} process did not get ready ({e}):\n{}",
                    process.log_text()
                ),
            }
        }
    }

    /// Kills it as a crash would (SIGKILL) and reaps it.
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            let text = self.log_text();
            let tail: Vec<&str> = text.lines().rev().take(30).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            eprintln!(
                "--- {} ({}):\n{}",
                self.role,
                self.log.display(),
                tail.join("\n")
            );
        }
    }
}

/// Places order `n` as a client would: retried with the same order ID after a 5xx or no answer,
/// until it is placed. A `409` counts as placed only after a try whose outcome is unknown (that try
/// committed). Returns how many tries failed.
async fn place(client: HttpClient, url: String, n: usize) -> Result<u32, String> {
    let order =
        json!({ "order_id": order_id(n), "sku": format!("SKU-{}", n % 7), "quantity": n % 5 + 1 });
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut failed = 0;
    loop {
        match post_json(&client, &url, None, &order).await {
            Ok((status, _)) if status.as_u16() == 201 => return Ok(failed),
            Ok((status, _)) if status.as_u16() == 409 && failed > 0 => return Ok(failed),
            Ok((status, _)) if status.is_server_error() => {}
            Err(_) => {}
            Ok((status, body)) => return Err(format!("{}: {status} {body}", order_id(n))),
        }
        failed += 1;
        if Instant::now() > deadline {
            return Err(format!("{} was never placed", order_id(n)));
        }
        tokio::time::sleep(Duration::from_millis(100)).await; // a client's pause between tries
    }
}

/// Places the orders of `wave`, all at once; returns how many tries failed.
async fn place_wave(client: &HttpClient, url: &str, wave: std::ops::RangeInclusive<usize>) -> u32 {
    let mut placing = tokio::task::JoinSet::new();
    for n in wave {
        placing.spawn(place(client.clone(), format!("{url}/orders"), n));
    }
    let mut failed = 0;
    while let Some(placed) = placing.join_next().await {
        failed += placed
            .expect("the placing task")
            .unwrap_or_else(|e| panic!("{e}"));
    }
    failed
}

/// How many results reached the orders' workflows, or `None` while the database is away.
async fn results_in(url: &str) -> Option<i64> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .ok()?;
    tokio::spawn(connection);
    let row = client
        .query_one(
            "SELECT count(*) FROM events WHERE kind = 'command_completed'",
            &[],
        )
        .await
        .ok()?;
    row.try_get(0).ok()
}

/// Polls until at least `at_least` results reached the orders (or the deadline passes).
async fn wait_for_results(url: &str, at_least: i64, within: Duration) -> i64 {
    let deadline = Instant::now() + within;
    loop {
        let seen = results_in(url).await.unwrap_or(0);
        if seen >= at_least || Instant::now() > deadline {
            return seen;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Polls `GET /orders/{id}` until every order shows its reservation; returns them.
async fn wait_for_reservations(client: &HttpClient, url: &str) -> BTreeMap<String, String> {
    let deadline = Instant::now() + Duration::from_secs(40);
    let mut reserved = BTreeMap::new();
    while reserved.len() < ORDERS && Instant::now() < deadline {
        for n in 1..=ORDERS {
            let id = order_id(n);
            if reserved.contains_key(&id) {
                continue;
            }
            if let Ok((status, body)) = get_json(client, &format!("{url}/orders/{id}")).await {
                if let (200, Some(reservation)) = (status.as_u16(), body["reservation"].as_str()) {
                    reserved.insert(id, reservation.to_owned());
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    reserved
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// 45 orders in three waves, one fault each: (1) the worker killed with SIGKILL after a few results
/// and started again once the second wave is placed; (2) throughout, the warehouse losing every 4th
/// new reservation's answer after its commit; (3) the server stopped with `pg_ctl stop -m immediate`
/// while deliveries are in flight and the third wave is being placed, and started again a second
/// later. No process is restarted for (3): each reconnects by itself.
#[test]
fn every_order_reserved_once_despite_a_killed_worker_lost_answers_and_a_crashed_server() {
    let cluster = Cluster::start().unwrap_or_else(|e| panic!("{e}"));
    let mut admin = Client::connect(&cluster.url("postgres"), NoTls).unwrap();
    for database in ["orders", "warehouse"] {
        admin
            .batch_execute(&format!("CREATE DATABASE {database}"))
            .unwrap();
    }
    drop(admin);
    let (orders_db, warehouse_db) = (cluster.url("orders"), cluster.url("warehouse"));
    let logs = tempfile::tempdir().unwrap();
    let every = LOSE_ANSWER_EVERY.to_string();

    let warehouse_args = [
        "--database",
        &warehouse_db,
        "--work-ms",
        "20",
        "--lose-answer-every",
        &every,
    ];
    // (2) The warehouse loses answers after committing them, from the start.
    let (_warehouse, warehouse) = Process::start("warehouse", &warehouse_args, logs.path(), 1);
    let warehouse = format!("http://{warehouse}");
    let (_orders, orders) = Process::start("orders", &["--database", &orders_db], logs.path(), 1);
    let orders = format!("http://{orders}");
    let worker_args = [
        "--database",
        orders_db.as_str(),
        "--warehouse",
        &warehouse,
        "--concurrency",
        "4",
        "--lease-ttl-ms",
        "1500",
    ];
    let (mut worker, _) = Process::start("worker", &worker_args, logs.path(), 1);

    let client = http_client();
    let (reserved, stats, failed_while_down) = runtime().block_on(async {
        // (1) The worker is killed mid-run, orders arrive while none runs, and it starts again.
        place_wave(&client, &orders, FIRST_WAVE).await;
        let again = json!({ "order_id": order_id(1), "sku": "SKU-1", "quantity": 2 });
        let (status, _) = post_json(&client, &format!("{orders}/orders"), None, &again)
            .await
            .unwrap();
        assert_eq!(status.as_u16(), 409, "the same order again is refused");
        let before_kill = wait_for_results(&orders_db, 4, Duration::from_secs(20)).await;
        worker.kill();
        println!("worker killed after {before_kill} results");
        place_wave(&client, &orders, SECOND_WAVE).await;
        worker = Process::start("worker", &worker_args, logs.path(), 2).0;

        // (3) The server stops as a crash would while deliveries are in flight; orders placed
        // meanwhile are retried by their client until the server is back.
        let before_stop = wait_for_results(&orders_db, 18, Duration::from_secs(20)).await;
        tokio::task::block_in_place(|| cluster.stop_immediately()).unwrap();
        println!("server stopped after {before_stop} results");
        let placing = {
            let (client, orders) = (client.clone(), orders.clone());
            tokio::spawn(async move { place_wave(&client, &orders, THIRD_WAVE).await })
        };
        tokio::time::sleep(Duration::from_secs(1)).await; // the server stays away this long
        tokio::task::block_in_place(|| cluster.start_again()).unwrap();
        let failed_while_down = placing.await.unwrap();

        let reserved = wait_for_reservations(&client, &orders).await;
        let (status, stats) = get_json(&client, &format!("{warehouse}/stats"))
            .await
            .unwrap();
        assert_eq!(status.as_u16(), 200);
        println!(
            "tries refused while the server was down: {failed_while_down}; warehouse: {stats}"
        );
        (reserved, stats, failed_while_down)
    });
    drop(worker);

    let expected: BTreeSet<String> = (1..=ORDERS).map(order_id).collect();
    assert_eq!(
        reserved.keys().cloned().collect::<BTreeSet<_>>(),
        expected,
        "every order shows its reservation"
    );
    assert!(
        failed_while_down > 0,
        "orders placed while the server was down were refused and retried"
    );

    let mut orders_db = Client::connect(&orders_db, NoTls).unwrap();
    let mut warehouse_db = Client::connect(&warehouse_db, NoTls).unwrap();
    assert_orders_placed_once(&mut orders_db, &expected);
    let results = results_per_order(&mut orders_db, &expected);
    assert_commands_done_once(&mut orders_db, &expected);
    let effects = reservations_per_order(&mut warehouse_db, &expected);
    assert_keys_recorded_once(&mut warehouse_db, &expected);

    for id in &expected {
        let effect = &effects[id];
        assert_eq!(
            results[id], effect.0,
            "{id}: the result in its workflow is the warehouse's reservation"
        );
        assert_eq!(
            reserved[id], effect.0,
            "{id}: the order shows that reservation"
        );
        assert_eq!(
            effect.1,
            format!("{id}:1:0"),
            "{id}: reserved under its command's ID"
        );
    }

    // The faults happened: answers were lost after their commit, and each lost answer's key came
    // back and was answered from its record, without a second reservation.
    let count = |name: &str| stats[name].as_u64().unwrap_or_default();
    assert!(count("lost") >= 1, "answers were lost: {stats}");
    // A commit the server made durable as it stopped may have reached the warehouse as an error:
    // that reservation is in the database (checked above) but not in this count.
    assert!(
        count("reserved") <= ORDERS as u64,
        "no more new reservations than orders: {stats}"
    );
    assert!(
        count("replayed") >= count("lost"),
        "each lost answer was asked for again and replayed: {stats}"
    );
}

/// One row per order ID, and each order's workflow started once.
fn assert_orders_placed_once(db: &mut Client, expected: &BTreeSet<String>) {
    let rows = db.query("SELECT order_id FROM orders", &[]).unwrap();
    let ids: Vec<String> = rows.iter().map(|row| row.get(0)).collect();
    assert_eq!(ids.len(), expected.len(), "one row per order");
    assert_eq!(ids.into_iter().collect::<BTreeSet<_>>(), *expected);
    let placed = db
        .query(
            "SELECT workflow_id, count(*) FROM events WHERE kind = 'order_placed' \
             GROUP BY workflow_id",
            &[],
        )
        .unwrap();
    let placed: BTreeMap<String, i64> = placed.iter().map(|row| (row.get(0), row.get(1))).collect();
    assert_eq!(placed.keys().cloned().collect::<BTreeSet<_>>(), *expected);
    assert!(
        placed.values().all(|n| *n == 1),
        "one order_placed per order: {placed:?}"
    );
}

/// Each order's workflow has exactly its two events, the second the one `command_completed` of its
/// command; returns the reservation each result carries.
fn results_per_order(db: &mut Client, expected: &BTreeSet<String>) -> BTreeMap<String, String> {
    let rows = db
        .query(
            "SELECT workflow_id, seq, kind, payload FROM events ORDER BY workflow_id, seq",
            &[],
        )
        .unwrap();
    let mut events: BTreeMap<String, Vec<(i64, String, Value)>> = BTreeMap::new();
    for row in &rows {
        let payload: String = row.get(3);
        events.entry(row.get(0)).or_default().push((
            row.get(1),
            row.get(2),
            serde_json::from_str(&payload).unwrap(),
        ));
    }
    assert_eq!(events.keys().cloned().collect::<BTreeSet<_>>(), *expected);
    let mut results = BTreeMap::new();
    for (id, events) in events {
        let kinds: Vec<&str> = events.iter().map(|(_, kind, _)| kind.as_str()).collect();
        assert_eq!(
            kinds,
            ["order_placed", "command_completed"],
            "{id}: one result, once"
        );
        let completed = &events[1].2;
        assert_eq!(completed["command_id"], json!(format!("{id}:1:0")), "{id}");
        let reservation = completed["result"]["reservation_id"]
            .as_str()
            .unwrap_or_else(|| panic!("{id}: no reservation in {completed}"));
        results.insert(id, reservation.to_owned());
    }
    results
}

/// Each order has one command, done; together they were delivered more than once each on average
/// (the faults made deliveries repeat).
fn assert_commands_done_once(db: &mut Client, expected: &BTreeSet<String>) {
    let rows = db
        .query(
            "SELECT workflow_id, event_seq, idx, status, attempts FROM outbox",
            &[],
        )
        .unwrap();
    let mut per_order = BTreeMap::new();
    let mut attempts = 0;
    for row in &rows {
        let id: String = row.get(0);
        let (seq, idx, status): (i64, i64, String) = (row.get(1), row.get(2), row.get(3));
        assert_eq!(
            (seq, idx, status.as_str()),
            (1, 0, "done"),
            "{id}'s command"
        );
        attempts += row.get::<_, i64>(4);
        *per_order.entry(id).or_insert(0) += 1;
    }
    assert_eq!(
        per_order.keys().cloned().collect::<BTreeSet<_>>(),
        *expected
    );
    assert!(per_order.values().all(|n| *n == 1), "one command per order");
    assert!(
        attempts > expected.len() as i64,
        "some deliveries were repeated ({attempts} attempts for {} commands)",
        expected.len()
    );
}

/// One reservation per order at the warehouse: its `RSV-…` ID and the key it was made under.
fn reservations_per_order(
    db: &mut Client,
    expected: &BTreeSet<String>,
) -> BTreeMap<String, (String, String)> {
    let rows = db
        .query(
            "SELECT order_id, reservation_id, idempotency_key FROM reservations",
            &[],
        )
        .unwrap();
    let mut effects: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    for row in &rows {
        let reservation: i64 = row.get(1);
        effects
            .entry(row.get(0))
            .or_default()
            .push((format!("RSV-{reservation}"), row.get(2)));
    }
    assert_eq!(effects.keys().cloned().collect::<BTreeSet<_>>(), *expected);
    let repeated: Vec<_> = effects.iter().filter(|(_, made)| made.len() > 1).collect();
    assert!(repeated.is_empty(), "effects made twice: {repeated:?}");
    effects
        .into_iter()
        .map(|(id, mut made)| (id, made.remove(0)))
        .collect()
}

/// One completed idempotency record per command.
fn assert_keys_recorded_once(db: &mut Client, expected: &BTreeSet<String>) {
    let rows = db
        .query("SELECT key, result IS NOT NULL FROM idempotency", &[])
        .unwrap();
    let keys: BTreeMap<String, bool> = rows.iter().map(|row| (row.get(0), row.get(1))).collect();
    let commands: BTreeSet<String> = expected.iter().map(|id| format!("{id}:1:0")).collect();
    assert_eq!(keys.keys().cloned().collect::<BTreeSet<_>>(), commands);
    assert!(
        keys.values().all(|done| *done),
        "every record completed: {keys:?}"
    );
    let tables: BTreeSet<String> = db
        .query(
            "SELECT tablename::text FROM pg_tables WHERE schemaname = 'public'",
            &[],
        )
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(
        tables,
        ["idempotency", "miniflow_receiver_schema", "reservations"]
            .map(String::from)
            .into(),
        "the warehouse's database holds its records beside its own table, no outbox"
    );
}
