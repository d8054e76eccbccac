//! The examples run as a user runs them, and print what their docs promise.

use std::path::PathBuf;
use std::process::Command;

/// Builds (if needed) and runs `cargo run --example <name>`, returning its standard output.
pub fn run_example(name: &str, args: &[&str]) -> String {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
    let output = Command::new(env!("CARGO"))
        .args(["run", "--quiet", "--example", name, "--manifest-path"])
        .arg(&manifest)
        .arg("--")
        .args(args)
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
