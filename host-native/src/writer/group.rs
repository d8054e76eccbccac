//! The writer thread: group commit, each request isolated from the others, answers once durable.

use std::sync::mpsc::{Receiver, Sender};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use rusqlite::{Connection, Transaction, TransactionBehavior};

use super::beside::Beside;
use super::durable::{stopped_by, Durability};
use super::{copy_error, take_made_work, Isolation, Job, WorkSignal};
use crate::errors::storage;
use miniflow_core::Error;

/// The most requests one transaction takes: a bound on how long the lock is held at a time, and on
/// how long the last request of a group waits for the first.
const MAX_GROUP: usize = 1024;

/// The longest the writer waits for the callers of its last group to come back before it begins
/// the next one.
const MAX_DELAY: Duration = Duration::from_millis(1);

/// Takes what is queued behind the group's first request; while fewer than `expected` (the size of
/// the last group) are in, waits for more, up to `delay` (half the last commit's time): a caller
/// answered a moment ago is likely to come back, and one more request in a group costs far less
/// than one more commit.
fn gather(
    queue: &Receiver<Box<dyn Job>>,
    group: &mut Vec<Box<dyn Job>>,
    expected: usize,
    delay: Duration,
) {
    let until = Instant::now() + delay;
    while group.len() < MAX_GROUP {
        match queue.try_recv() {
            Ok(job) => group.push(job),
            Err(_) if group.len() >= expected => return,
            Err(_) => {
                let left = until.saturating_duration_since(Instant::now());
                match queue.recv_timeout(left) {
                    Ok(job) if !left.is_zero() => group.push(job),
                    Ok(job) => return group.push(job),
                    Err(_) => return,
                }
            }
        }
    }
}

/// Requests whose group is over, with how it ended, for the reply thread to answer.
pub(super) type Answered = (Vec<Box<dyn Job>>, Result<(), Error>);

/// The reply thread's loop, until the writer thread ends: takes every group that is over, makes
/// the ones that committed durable with one sync (see [`Durability`]), checks that the `-wal` and
/// `-shm` they went to are still the store's ([`Beside`]; otherwise they fail, and the writer stops
/// through `failed`), and answers their requests in order, off the writer thread (waking the
/// callers costs a system call each).
pub(super) fn reply(
    answered: Receiver<Answered>,
    mut durability: Durability,
    mut beside: Beside,
    failed: &OnceLock<String>,
) {
    while let Ok(first) = answered.recv() {
        let mut groups = vec![first];
        groups.extend(answered.try_iter());
        if groups.iter().any(|(_, committed)| committed.is_ok()) {
            if let Err(e) = durability.sync().and_then(|()| beside.check(failed)) {
                for (_, committed) in &mut groups {
                    if committed.is_ok() {
                        *committed = Err(copy_error(&e));
                    }
                }
            }
        }
        for (jobs, committed) in groups {
            for job in jobs {
                job.finish(committed.as_ref().map(|_| ()));
            }
        }
    }
}

/// The thread's loop: waits for a request, takes every other one already queued behind it (up to
/// [`MAX_GROUP`]), and commits them together. Ends when every handle is gone and the queue is empty.
/// Once a sync of the WAL has failed (`failed`), it writes nothing more and answers with why.
pub(super) fn run(
    mut conn: Connection,
    queue: Receiver<Box<dyn Job>>,
    answers: Sender<Answered>,
    work: &WorkSignal,
    failed: &OnceLock<String>,
) {
    let mut group: Vec<Box<dyn Job>> = Vec::with_capacity(MAX_GROUP);
    // The callers answered last time, likely to come back, and how long that commit took.
    let (mut expected, mut last_commit) = (0, Duration::ZERO);
    while let Ok(first) = queue.recv() {
        group.push(first);
        gather(&queue, &mut group, expected, last_commit / 2);
        expected = group.len();
        if let Some(e) = stopped_by(failed) {
            if let Err(std::sync::mpsc::SendError((jobs, e))) =
                answers.send((std::mem::take(&mut group), Err(e)))
            {
                jobs.into_iter()
                    .for_each(|job| job.finish(e.as_ref().map(|_| ())));
            }
            continue;
        }
        let started = Instant::now();
        commit_group(&mut conn, &mut group, &answers, work);
        last_commit = started.elapsed().min(MAX_DELAY * 2);
    }
}

/// Runs the requests of `group` in one transaction and answers each once its fate is known. If
/// SQLite ends the transaction under a request (an I/O error or a full disk roll it back), the
/// requests that ran in it are answered with that error and the rest go on in a new transaction.
fn commit_group(
    conn: &mut Connection,
    group: &mut Vec<Box<dyn Job>>,
    answers: &Sender<Answered>,
    work: &WorkSignal,
) {
    let mut waiting = group.drain(..);
    // Records the transaction (before its callers can be answered), then hands it to the reply thread.
    let answer = |jobs: Vec<Box<dyn Job>>, committed: Result<(), Error>, began: Instant| {
        crate::telemetry::writer_committed(jobs.len(), began.elapsed());
        if let Err(std::sync::mpsc::SendError((jobs, committed))) = answers.send((jobs, committed))
        {
            // The reply thread is gone (it never panics): answer here, without the sync it makes.
            let committed = committed.and_then(|()| -> Result<(), Error> {
                Err(Error::Storage(
                    "the reply thread of this writer has stopped: the commit may not be durable"
                        .into(),
                ))
            });
            for job in jobs {
                job.finish(committed.as_ref().map(|_| ()));
            }
        }
    };
    loop {
        take_made_work();
        let began = Instant::now();
        let tx = match conn.transaction_with_behavior(TransactionBehavior::Immediate) {
            Ok(tx) => tx,
            Err(e) => {
                answer(waiting.collect(), Err(storage(e)), began);
                return;
            }
        };
        let mut ran: Vec<Box<dyn Job>> = Vec::new();
        let (mut ended, mut spoiled) = (false, false);
        for mut job in waiting.by_ref() {
            spoiled = run_one(&tx, job.as_mut());
            ran.push(job);
            if tx.is_autocommit() {
                ended = true;
                break;
            }
            if spoiled {
                break;
            }
        }
        if spoiled && !ended {
            drop(tx); // rolled back
            let e = Error::Storage(
                "a request grouped with this one failed after it had written, so the whole group \
                 was rolled back: nothing of it was written"
                    .into(),
            );
            answer(ran, Err(e), began);
            continue;
        }
        if ended {
            drop(tx);
            let e = Error::Storage(
                "SQLite rolled back the transaction this request was grouped in (an I/O error, \
                 a full disk or a request that ended it): nothing of it was written"
                    .into(),
            );
            answer(ran, Err(e), began);
            continue;
        }
        let committed = tx.commit().map_err(storage);
        if committed.is_ok() && take_made_work() {
            work.bump();
        }
        answer(ran, committed, began);
        return;
    }
}

/// Runs one request as its [`Isolation`] says: in a savepoint of its own, kept if it succeeds and
/// rolled back if it fails; or without one. Returns whether the request spoiled the transaction: it
/// ran without a savepoint and failed after it had written (SQLite counts every row a completed
/// statement changed, and undoes a statement that fails), so the transaction must be rolled back.
fn run_one(tx: &Transaction<'_>, job: &mut dyn Job) -> bool {
    if job.isolation() == Isolation::ChecksFirst {
        let before = tx.total_changes();
        return !job.run(tx) && tx.total_changes() != before;
    }
    if let Err(e) = statement(tx, "SAVEPOINT miniflow_request") {
        job.fail(e);
        return false;
    }
    if job.run(tx) {
        match statement(tx, "RELEASE miniflow_request") {
            Ok(()) => return false,
            Err(e) => job.fail(e),
        }
    }
    if tx.is_autocommit() {
        return false; // the transaction is gone, and the savepoint with it
    }
    let undone = statement(tx, "ROLLBACK TO miniflow_request")
        .and_then(|()| statement(tx, "RELEASE miniflow_request"));
    if let Err(e) = undone {
        // The request's writes could not be undone: they must not be committed with the others.
        job.fail(copy_error(&e));
        let _ = tx.execute_batch("ROLLBACK");
    }
    false
}

fn statement(tx: &Transaction<'_>, sql: &str) -> Result<(), Error> {
    tx.prepare_cached(sql)
        .and_then(|mut stmt| stmt.execute([]))
        .map(drop)
        .map_err(storage)
}
