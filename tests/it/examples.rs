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
