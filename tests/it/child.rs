//! Child processes for multi-process and crash tests: this test binary started again, running one
//! `child_*` test with a role and its settings in environment variables.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The variable that turns a run of this binary into a child; its value is the role.
const ROLE: &str = "MINIFLOW_TEST_CHILD";

/// Starts this test binary again, running only `test_name` with `role` and `settings`.
pub fn spawn(test_name: &str, role: &str, settings: &[(&str, String)]) -> Child {
    spawn_through(&[], test_name, role, settings)
}

/// As [`spawn`], through the command `through` (e.g. `setpriv` with its options, to run the child
/// as another user): the test binary's path and arguments follow it.
pub fn spawn_through(
    through: &[&str],
    test_name: &str,
    role: &str,
    settings: &[(&str, String)],
) -> Child {
    let exe = std::env::current_exe().expect("test binary path");
    let mut command = match through.split_first() {
        Some((program, args)) => {
            let mut command = Command::new(program);
            command.args(args).arg(exe);
            command
        }
        None => Command::new(exe),
    };
    command
        .args([test_name, "--exact", "--nocapture", "--test-threads=1"])
        .env(ROLE, role)
        .envs(settings.iter().map(|(k, v)| (*k, v.as_str())))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn child process")
}

/// The role of this process when it is a child, `None` in a normal test run.
pub fn role() -> Option<String> {
    std::env::var(ROLE).ok()
}

/// A setting of this child.
pub fn setting(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("child setting {name} missing"))
}

/// A setting of this child, if given.
pub fn optional(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// Kills this process with SIGKILL: no destructor, no flush, no unwinding — a crash.
pub fn kill_self() -> ! {
    let _ = Command::new("kill")
        .args(["-9", &std::process::id().to_string()])
        .status();
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// What a child printed as `key=value` on its standard output.
pub fn reported(stdout: &str, key: &str) -> Option<String> {
    let marker = format!("{key}=");
    stdout
        .lines()
        .find_map(|line| line.split(&marker).nth(1))
        .map(|rest| rest.split_whitespace().next().unwrap_or("").to_owned())
}

/// Waits for `child`; panics with its output unless it exited successfully. Returns its stdout.
pub fn wait_ok(child: Child, what: &str) -> String {
    let out = child.wait_with_output().expect("wait for child");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}
