//! What the benchmarks share: the CPU time of this process, and the workload of a commit (the trip
//! workflow's first event and the two commands it decides).

#![allow(dead_code)] // each benchmark uses what it needs

use std::time::Duration;

use miniflow::{json, Command, Decision, Event};

/// This process's CPU time so far (user + system, every thread), from `getrusage`.
pub fn process_cpu() -> Duration {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage fills the struct it is given; RUSAGE_SELF is always valid.
    let usage = unsafe {
        assert_eq!(libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()), 0);
        usage.assume_init()
    };
    let time = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    time(usage.ru_utime) + time(usage.ru_stime)
}

/// The CPU time (user + system) of this process's threads named `name`, from `/proc` (Linux);
/// zero elsewhere. Clock-tick resolution: for runs of seconds.
#[allow(dead_code)] // not every benchmark reports a thread
pub fn thread_cpu(name: &str) -> Duration {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Duration::ZERO;
    };
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    let mut total = 0;
    for task in tasks.flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim_end() != name {
            continue;
        }
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        // Fields after the command's closing parenthesis: state is the 3rd field, utime the 14th.
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .map_or("", |(_, rest)| rest)
            .split_whitespace()
            .collect();
        let field = |n: usize| fields.get(n - 3).and_then(|f| f.parse::<u64>().ok());
        total += field(14).unwrap_or(0) + field(15).unwrap_or(0);
    }
    Duration::from_micros(total * 1_000_000 / ticks)
}

/// The decision every commit benchmark commits: two commands.
pub fn decision() -> Decision {
    Decision::new()
        .command(Command::new(
            "lock_budget",
            json!({ "trip_id": "t", "amount": 1200 }),
        ))
        .command(Command::new(
            "book_flight",
            json!({ "to": "成都", "class": "economy" }),
        ))
}

/// The event every commit benchmark commits.
pub fn event() -> Event {
    Event::new("trip_requested", json!({ "city": "成都", "travellers": 2 }))
}
