//! The throwaway cluster's watchdog: a test process killed while its cluster runs leaves no server
//! and no directory behind.

use std::path::Path;

use super::cluster::{external_server, replace_database, throwaway_dir};
use super::TestDatabase;

#[test]
fn child_starts_a_cluster_and_dies() {
    if crate::child::role().as_deref() != Some("postgres_cluster") {
        return;
    }
    let database = TestDatabase::new();
    database.client().batch_execute("SELECT 1").unwrap();
    let dir = throwaway_dir().expect("a throwaway cluster");
    let pid = std::fs::read_to_string(dir.join("data/postmaster.pid")).unwrap();
    println!(
        "cluster_dir={} server_pid={}",
        dir.display(),
        pid.lines().next().unwrap_or("")
    );
    crate::child::kill_self();
}

#[test]
fn a_test_process_killed_while_its_cluster_runs_leaves_nothing_behind() {
    if external_server() {
        return; // no throwaway cluster to leave behind
    }
    let child = crate::child::spawn(
        "postgres::throwaway::child_starts_a_cluster_and_dies",
        "postgres_cluster",
        &[],
    );
    let out = child.wait_with_output().expect("wait for the child");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let dir = crate::child::reported(&stdout, "cluster_dir").unwrap_or_else(|| {
        panic!(
            "the child reported no cluster:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let pid = crate::child::reported(&stdout, "server_pid").expect("the server's pid");
    assert!(!out.status.success(), "the child was to be killed");
    // Running: the process exists and is not a zombie.
    let running = || {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
            stat.rsplit(')')
                .next()
                .is_some_and(|rest| !rest.trim_start().starts_with('Z'))
        })
    };
    let started = std::time::Instant::now();
    while (running() || Path::new(&dir).exists()) && started.elapsed().as_secs() < 30 {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(
        !running(),
        "the server {pid} of the killed test process still runs"
    );
    assert!(!Path::new(&dir).exists(), "{dir} was left behind");
}

#[test]
fn database_urls_keep_the_server_and_its_parameters() {
    assert_eq!(
        replace_database("postgresql://u:p@h:5432/postgres?sslmode=disable", "t1"),
        "postgresql://u:p@h:5432/t1?sslmode=disable"
    );
    assert_eq!(
        replace_database("postgresql://u@h", "t2"),
        "postgresql://u@h/t2"
    );
}
