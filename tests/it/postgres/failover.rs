//! A primary failover mid-run. Two throwaway clusters: a primary whose commits wait for its standby
//! (synchronous streaming replication), and the standby. An async producer process and three
//! async worker processes (producer, dispatchers and receivers on the async API) reach them
//! through one multi-host URL with `target_session_attrs=read-write`; a probe in the test process
//! commits workflows and acknowledges their commands on a database of its own, noting each
//! acknowledged commit and ack. Mid-run the primary is killed (`pg_ctl stop -m immediate`) and the
//! standby promoted (`pg_ctl promote`).
//!
//! Nobody is told: every process must find the new primary by itself through the URL, and in the
//! end no acknowledged commit or ack is lost — every order the producer moved past is there, every
//! effect whose commit a receiver saw acknowledged is that receiver's, every ack the probe saw
//! acknowledged is the command's last word — nothing is lost, and no effect is repeated.
//!
//! On a server of the caller's (`MINIFLOW_TEST_DATABASE_URL`) it is skipped: the clusters are the
//! test's own.

use std::process::Child;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use miniflow::postgres::{Client, NoTls};
use miniflow::tokio::AsyncPostgresStore;
use miniflow::{
    json, ClaimRequest, Clock, Command, CommandId, Decision, Engine, Error, Event, EventRecord,
    SystemClock, Workflow, WorkflowId,
};

use super::async_processes::spawn_producer;
use super::cluster::{external_server, replace_database, Cluster};
use super::delivery::{
    check_invariants, commands_of, options, plain_client, prepare, sum_reported, Idempotency,
    Workers,
};
use crate::child;

/// The URL of `database` on whichever of `clusters` takes writes.
fn multi_host(clusters: &[&Cluster], database: &str) -> String {
    let hosts: Vec<String> = clusters
        .iter()
        .map(|cluster| format!("127.0.0.1:{}", cluster.port()))
        .collect();
    replace_database(
        &format!(
            "postgresql://postgres@{}/?target_session_attrs=read-write",
            hosts.join(",")
        ),
        database,
    )
}

/// A probe's workflow: starting it decides one command.
struct Probe;

impl Workflow for Probe {
    type State = ();
    fn evolve(&self, _: &mut (), _: &EventRecord) {}
    fn decide(&self, _: &(), event: &EventRecord) -> Decision {
        match event.kind.as_str() {
            "probed" => Decision::new().command(Command::new("probe", json!({}))),
            _ => Decision::none(),
        }
    }
}

/// What the probe saw acknowledged.
#[derive(Debug, Default)]
struct Acknowledged {
    /// Workflows whose start was acknowledged (or found committed by a retry).
    started: Vec<WorkflowId>,
    /// Commands whose ack was acknowledged, with the token it was written under.
    acked: Vec<(CommandId, u64)>,
    /// Errors the probe rode out.
    errors: u64,
}

/// Starts workflows and acknowledges their commands on `url` until `stop`, one at a time, noting
/// each commit and ack the database acknowledged; rides out every error.
async fn probe(url: &str, stop: &AtomicBool) -> Acknowledged {
    let engine = Engine::new(Probe);
    let mut seen = Acknowledged::default();
    let store = loop {
        match AsyncPostgresStore::connect_with(
            url,
            &options().connect_timeout(Duration::from_millis(500)),
        )
        .await
        {
            Ok(store) => break store,
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    let claim = ClaimRequest::new("probe")
        .limit(1)
        .lease_ttl(Duration::from_millis(500));
    let mut n = 0;
    while !stop.load(Ordering::SeqCst) {
        let id = WorkflowId::new(format!("probe-{n:05}")).unwrap();
        match store
            .start(&engine, &id, Event::new("probed", json!({})))
            .await
        {
            // A conflict: an earlier try landed, its answer lost.
            Ok(_) | Err(Error::Conflict { .. }) => {
                seen.started.push(id);
                n += 1;
            }
            Err(_) => seen.errors += 1,
        }
        match store.claim(claim.clone()).await {
            Ok(claimed) => {
                for d in claimed {
                    match store.complete(&d.command_id, d.token, None).await {
                        Ok(()) => seen.acked.push((d.command_id, d.token)),
                        // Stale: an earlier ack landed unseen, or the lease ran out meanwhile.
                        Err(_) => seen.errors += 1,
                    }
                }
            }
            Err(_) => seen.errors += 1,
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    seen
}

/// Waits until at least `target` orders are placed.
fn wait_for_orders(url: &str, target: i64) {
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(60) {
        let placed: i64 = plain_client(url, "check")
            .and_then(|mut db| {
                db.query_one(
                    "SELECT count(*) FROM events WHERE kind = 'order_placed'",
                    &[],
                )
            })
            .map_or(0, |row| row.get(0));
        if placed >= target {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("fewer than {target} orders placed after 60 s");
}

#[test]
fn a_primary_failover_loses_no_acknowledged_commit_and_everyone_reconnects() {
    if external_server() {
        eprintln!("skipped: the clusters of this test are its own");
        return;
    }
    let started = Instant::now();
    let primary = Cluster::start().expect("a primary");
    let mut admin = Client::connect(&primary.url("postgres"), NoTls).expect("connect");
    for database in ["orders", "probe"] {
        admin
            .batch_execute(&format!("CREATE DATABASE {database}"))
            .expect("create the databases");
    }
    drop(admin);
    let standby = Cluster::standby_of(&primary).expect("a standby");
    primary
        .require_synchronous_standby()
        .expect("the standby in sync");
    let url = multi_host(&[&primary, &standby], "orders");
    let probe_url = multi_host(&[&primary, &standby], "probe");
    prepare(&url);
    let orders = 60; // 1,035 commands
    let commands = commands_of(orders) as i64;
    let producer = spawn_producer(&url, "producer", orders, Duration::from_millis(25));
    let workers: Vec<(String, Child)> = (0..3)
        .map(|n| {
            let app = format!("workers-{n}");
            let process = Workers {
                url: url.clone(),
                app: app.clone(),
                workers: 2,
                // Shorter than the outage: leases run out while there is no primary.
                lease: Duration::from_secs(1),
                orders,
                idempotency: Idempotency::Reservations,
                connect_timeout: Some(Duration::from_millis(500)),
                crash: None,
                deadline: Duration::from_secs(120),
                asynchronous: true,
            }
            .spawn();
            (app, process)
        })
        .collect();
    let pids: Vec<(String, u32)> = workers
        .iter()
        .map(|(app, process)| (app.clone(), process.id()))
        .collect();
    let stop_probe = Arc::new(AtomicBool::new(false));
    let probing = {
        let (url, stop) = (probe_url.clone(), stop_probe.clone());
        std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(probe(&url, &stop))
        })
    };

    wait_for_orders(&url, orders as i64 / 3);
    std::thread::sleep(Duration::from_millis(200)); // the probe and the workers busy too
    let down_at = SystemClock.now().as_millis();
    primary.stop_immediately().expect("kill the primary");
    std::thread::sleep(Duration::from_millis(700)); // no primary at all for a while
    standby.promote().expect("promote the standby");
    let up_at = SystemClock.now().as_millis();
    let context = format!(
        "primary killed at {down_at}, standby promoted {} ms later",
        up_at - down_at
    );
    eprintln!("{context}");

    // Every order the producer moved past is on the new primary: only the producer places orders.
    let out = child::wait_ok(producer, &format!("{context}: the producer"));
    let producer_errors: u64 = child::reported(&out, "producer_errors")
        .and_then(|n| n.parse().ok())
        .unwrap_or_default();
    assert!(
        producer_errors > 0,
        "{context}: the producer saw no error, so it did not ride the failover out:\n{out}"
    );
    let mut db = plain_client(&url, "check").unwrap();
    let placed: i64 = db
        .query_one(
            "SELECT count(*) FROM events WHERE kind = 'order_placed'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(
        placed, orders as i64,
        "{context}: an order the producer saw committed is gone"
    );

    let outputs: Vec<String> = workers
        .into_iter()
        .map(|(app, process)| child::wait_ok(process, &format!("{context}: {app}")))
        .collect();
    stop_probe.store(true, Ordering::SeqCst);
    let probed = probing.join().expect("the probe");
    for out in &outputs {
        assert!(
            sum_reported(std::slice::from_ref(out), "errors") > 0,
            "{context}: a worker process saw no error through on_error:\n{out}"
        );
        assert_eq!(
            child::reported(out, "listening").as_deref(),
            Some("true"),
            "{context}: a worker process's listener did not reconnect:\n{out}"
        );
    }
    let history = check_invariants(&url, orders, &context);

    // Every effect a receiver saw committed is that receiver's one effect.
    let mut acknowledged_effects: i64 = 0;
    for ((app, pid), out) in pids.iter().zip(&outputs) {
        for id in out.lines().filter_map(|line| line.strip_prefix("effect=")) {
            let by: Vec<i64> = db
                .query("SELECT pid FROM effects WHERE command_id = $1", &[&id])
                .unwrap()
                .iter()
                .map(|row| row.get(0))
                .collect();
            assert_eq!(
                by,
                [i64::from(*pid)],
                "{context}: the effect of {id} that {app} saw committed is not its one effect"
            );
            acknowledged_effects += 1;
        }
    }
    assert!(
        acknowledged_effects > 0 && acknowledged_effects <= commands,
        "{context}: {acknowledged_effects} acknowledged effects for {commands} commands"
    );

    // Every commit and ack the probe saw acknowledged is there, the ack as its command's last word.
    assert!(
        probed.errors > 0 && !probed.acked.is_empty(),
        "{context}: the probe did not ride the failover out: {} errors, {} acks",
        probed.errors,
        probed.acked.len()
    );
    let mut probe_db = plain_client(&probe_url, "check").unwrap();
    for id in &probed.started {
        let events: i64 = probe_db
            .query_one(
                "SELECT count(*) FROM events WHERE workflow_id = $1",
                &[&id.as_str()],
            )
            .unwrap()
            .get(0);
        assert_eq!(
            events, 1,
            "{context}: the probe's acknowledged start of {id} is gone"
        );
    }
    for (id, token) in &probed.acked {
        let row = probe_db
            .query_one(
                "SELECT status, lease_token FROM outbox \
                 WHERE workflow_id || ':' || event_seq || ':' || idx = $1",
                &[&id.to_string()],
            )
            .unwrap();
        let (status, last): (String, i64) = (row.get(0), row.get(1));
        assert_eq!(
            (status.as_str(), last),
            ("done", i64::try_from(*token).unwrap()),
            "{context}: the probe's acknowledged ack of {id} under token {token} is gone"
        );
    }

    // Every worker process delivered again after the promotion: it came back by itself.
    let mut resumed = Vec::new();
    for (app, _) in &pids {
        let first: Option<i64> = db
            .query_one(
                "SELECT min(at) FROM deliveries WHERE app = $1 AND at > $2",
                &[app, &i64::try_from(up_at).unwrap()],
            )
            .unwrap()
            .get(0);
        let first = first
            .unwrap_or_else(|| panic!("{context}: {app} delivered nothing after the promotion"));
        resumed.push(format!(
            "{app} +{} ms",
            first - i64::try_from(up_at).unwrap()
        ));
    }
    eprintln!(
        "{commands} commands, an async producer ({producer_errors} errors ridden out) and 3 async \
         worker processes, {acknowledged_effects} acknowledged effects kept, the probe's {} starts \
         and {} acks kept ({} errors): delivering again after the promotion {resumed:?}, \
         {history:?}, {:.1} s",
        probed.started.len(),
        probed.acked.len(),
        probed.errors,
        started.elapsed().as_secs_f64()
    );
}
