//! The server crashes and restarts mid-run: while a producer process and three worker processes
//! deliver, the PostgreSQL server is stopped as by a crash (`pg_ctl stop -m immediate`: no
//! checkpoint, every connection cut) and started again on the same port, twice. The started
//! dispatchers must come back by themselves — their pools replace the dead connections, their
//! failed claims, acks and extensions are reported through `on_error` and backed off from, their
//! listeners reconnect — and in the end nothing is lost and no effect is repeated.
//!
//! The test starts a cluster of its own, so that no other test loses its server. On a server of the
//! caller's (`MINIFLOW_TEST_DATABASE_URL`) it is skipped: that server is not the tests' to stop.

use std::process::Child;
use std::time::{Duration, Instant};

use miniflow::postgres::{Client, NoTls};
use miniflow::{Clock, SystemClock};

use super::cluster::{external_server, Cluster};
use super::delivery::{
    check_invariants, commands_of, plain_client, prepare, spawn_producer, sum_reported,
    Idempotency, Workers,
};
use crate::child;

/// Waits until at least `target` commands are done; returns how many are.
fn wait_for_done(url: &str, target: i64, context: &str) -> i64 {
    let started = Instant::now();
    let mut client: Option<Client> = None;
    let mut done = 0;
    while started.elapsed() < Duration::from_secs(60) {
        if client.is_none() {
            client = plain_client(url, "check").ok();
        }
        if let Some(db) = client.as_mut() {
            match db.query_one("SELECT count(*) FROM outbox WHERE status = 'done'", &[]) {
                Ok(row) => done = row.get(0),
                Err(_) => client = None,
            }
        }
        if done >= target {
            return done;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("{context}: only {done} commands done after 60 s, waiting for {target}");
}

#[test]
fn dispatchers_ride_out_server_crashes_and_lose_nothing_nor_repeat_an_effect() {
    if external_server() {
        eprintln!("skipped: the server of MINIFLOW_TEST_DATABASE_URL is not the tests' to stop");
        return;
    }
    let started = Instant::now();
    let cluster = Cluster::start().expect("a cluster of its own");
    Client::connect(&cluster.url("postgres"), NoTls)
        .and_then(|mut admin| admin.batch_execute("CREATE DATABASE restart"))
        .expect("create the database");
    let url = cluster.url("restart");
    prepare(&url);
    let orders = 100; // 1,725 commands
    let commands = commands_of(orders) as i64;
    let producer = spawn_producer(&url, "producer", orders, 0, 1, None);
    let workers: Vec<Child> = (0..3)
        .map(|n| {
            Workers {
                url: url.clone(),
                app: format!("workers-{n}"),
                workers: 2,
                // Shorter than the outage: leases run out while the server is down.
                lease: Duration::from_secs(1),
                orders,
                idempotency: Idempotency::Reservations,
                // Shorter than the outage: operations fail while the server is down, not just wait.
                connect_timeout: Some(Duration::from_millis(500)),
                crash: None,
                deadline: Duration::from_secs(120),
                asynchronous: false,
            }
            .spawn()
        })
        .collect();

    let downtime = Duration::from_millis(1_500);
    let mut restarts = Vec::new();
    for share in [4, 10] {
        let context = format!("restart {}", restarts.len() + 1);
        let done = wait_for_done(&url, commands * share / 16, &context);
        let down_at = SystemClock.now().as_millis();
        cluster.stop_immediately().expect("stop the server");
        std::thread::sleep(downtime);
        cluster.start_again().expect("start the server again");
        let up_at = SystemClock.now().as_millis();
        eprintln!(
            "{context}: server down at {done} of {commands} commands done, for {} ms",
            up_at - down_at
        );
        restarts.push((done, up_at));
    }

    let context = format!("server crashed and restarted at {restarts:?} (done, up at ms)");
    let out = child::wait_ok(producer, &format!("{context}: the producer"));
    eprintln!(
        "producer rode out {} errors",
        child::reported(&out, "producer_errors").unwrap_or_default()
    );
    let outputs: Vec<String> = workers
        .into_iter()
        .map(|process| child::wait_ok(process, &format!("{context}: a worker process")))
        .collect();
    let elapsed = started.elapsed();
    for out in &outputs {
        let errors = sum_reported(std::slice::from_ref(out), "errors");
        assert!(
            errors > 0,
            "{context}: a worker process saw no error through on_error:\n{out}"
        );
        assert_eq!(
            child::reported(out, "listening").as_deref(),
            Some("true"),
            "{context}: a worker process's listener did not reconnect:\n{out}"
        );
    }
    let history = check_invariants(&url, orders, &context);
    assert!(
        history.takeovers > 0,
        "{context}: the outages outlasted the leases held when they began, yet none was taken \
         over: {history:?}"
    );
    // Every worker process delivered again after each restart: it came back by itself.
    let mut db = plain_client(&url, "check").unwrap();
    let mut resumed = Vec::new();
    for (_, up_at) in &restarts {
        for n in 0..3 {
            let app = format!("workers-{n}");
            let first: Option<i64> = db
                .query_one(
                    "SELECT min(at) FROM deliveries WHERE app = $1 AND at > $2",
                    &[&app, &i64::try_from(*up_at).unwrap()],
                )
                .unwrap()
                .get(0);
            let first = first.unwrap_or_else(|| {
                panic!("{context}: {app} delivered nothing after the restart at {up_at}")
            });
            resumed.push(format!(
                "{app} +{} ms",
                first - i64::try_from(*up_at).unwrap()
            ));
        }
    }
    let mut seen: Vec<&str> = outputs
        .iter()
        .flat_map(|out| out.lines())
        .filter_map(|line| line.strip_prefix("error: "))
        .collect();
    seen.sort_unstable();
    seen.dedup();
    eprintln!("delivering again after the server was up: {resumed:?}; errors seen: {seen:#?}");
    eprintln!(
        "{commands} commands, 1 producer and 3 worker processes × 2 workers, 2 server crashes: \
         {} errors reported, {} leases lost, {history:?}, {:.1} s",
        sum_reported(&outputs, "errors"),
        sum_reported(&outputs, "lost_leases"),
        elapsed.as_secs_f64()
    );
}
