//! The writer thread: group commit, a savepoint per request, answers after the COMMIT.

use std::sync::mpsc::Receiver;

use rusqlite::{Connection, Transaction, TransactionBehavior};

use super::{copy_error, take_made_work, Job, WorkSignal};
use crate::sqlite::storage;
use miniflow_core::Error;

/// The most requests one transaction takes: a bound on how long the lock is held at a time, and on
/// how long the last request of a group waits for the first.
const MAX_GROUP: usize = 1024;

/// The thread's loop: waits for a request, takes every other one already queued behind it (up to
/// [`MAX_GROUP`]), and commits them together. Ends when every handle is gone and the queue is empty.
pub(super) fn run(mut conn: Connection, queue: Receiver<Box<dyn Job>>, work: &WorkSignal) {
    let mut group: Vec<Box<dyn Job>> = Vec::with_capacity(MAX_GROUP);
    while let Ok(first) = queue.recv() {
        group.push(first);
        while group.len() < MAX_GROUP {
            match queue.try_recv() {
                Ok(job) => group.push(job),
                Err(_) => break,
            }
        }
        commit_group(&mut conn, &mut group, work);
    }
}

/// Runs the requests of `group` in one transaction and answers each once its fate is known. If
/// SQLite ends the transaction under a request (an I/O error or a full disk roll it back), the
/// requests that ran in it are answered with that error and the rest go on in a new transaction.
fn commit_group(conn: &mut Connection, group: &mut Vec<Box<dyn Job>>, work: &WorkSignal) {
    let mut waiting = group.drain(..);
    loop {
        take_made_work();
        let tx = match conn.transaction_with_behavior(TransactionBehavior::Immediate) {
            Ok(tx) => tx,
            Err(e) => {
                let e = storage(e);
                for job in waiting {
                    job.finish(Err(&e));
                }
                return;
            }
        };
        let mut ran: Vec<Box<dyn Job>> = Vec::new();
        let mut ended = false;
        for mut job in waiting.by_ref() {
            run_one(&tx, job.as_mut());
            ran.push(job);
            if tx.is_autocommit() {
                ended = true;
                break;
            }
        }
        if ended {
            drop(tx);
            let e = Error::Storage(
                "SQLite rolled back the transaction this request was grouped in (an I/O error, \
                 a full disk or a request that ended it): nothing of it was written"
                    .into(),
            );
            for job in ran {
                job.finish(Err(&e));
            }
            continue;
        }
        let committed = tx.commit().map_err(storage);
        if committed.is_ok() && take_made_work() {
            work.bump();
        }
        let committed = committed.as_ref().map(|_| ());
        for job in ran {
            job.finish(committed);
        }
        return;
    }
}

/// Runs one request inside a savepoint of its own: kept if it succeeds, rolled back if it fails.
fn run_one(tx: &Transaction<'_>, job: &mut dyn Job) {
    if let Err(e) = statement(tx, "SAVEPOINT miniflow_request") {
        job.fail(e);
        return;
    }
    if job.run(tx) {
        match statement(tx, "RELEASE miniflow_request") {
            Ok(()) => return,
            Err(e) => job.fail(e),
        }
    }
    if tx.is_autocommit() {
        return; // the transaction is gone, and the savepoint with it
    }
    let undone = statement(tx, "ROLLBACK TO miniflow_request")
        .and_then(|()| statement(tx, "RELEASE miniflow_request"));
    if let Err(e) = undone {
        // The request's writes could not be undone: they must not be committed with the others.
        job.fail(copy_error(&e));
        let _ = tx.execute_batch("ROLLBACK");
    }
}

fn statement(tx: &Transaction<'_>, sql: &str) -> Result<(), Error> {
    tx.prepare_cached(sql)
        .and_then(|mut stmt| stmt.execute([]))
        .map(drop)
        .map_err(storage)
}
