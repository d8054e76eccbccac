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
