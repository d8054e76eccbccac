//! [`Tx`]: the writer's transaction as [`AsyncStore::transaction`](super::AsyncStore::transaction)'s
//! closure sees it.

use std::sync::{Arc, Mutex, PoisonError};

use miniflow_core::backend::HistoryId;
use miniflow_core::{Commit, Engine, Error, Event, Handled, Timestamp, Workflow, WorkflowId};
use rusqlite::{Params, Transaction};

use crate::errors::storage;
use crate::sqlite::load_events_after;
use crate::SqliteStore;

/// The writer's transaction, inside the savepoint of one [`super::AsyncStore::transaction`] call:
/// your own statements, events with their commands, and idempotency records written through it
/// commit together once the closure returns `Ok`, or not at all.
pub struct Tx<'a> {
    tx: &'a Transaction<'a>,
    now: Timestamp,
    history: HistoryId,
    undo: &'a Mutex<Undo>,
}

/// What to do if the transaction fails: make the engines forget the states folded in it.
#[derive(Default)]
pub(crate) struct Undo(Vec<Box<dyn FnOnce() + Send>>);

impl Undo {
    pub(crate) fn run(self) {
        for undo in self.0 {
            undo();
        }
    }
}

impl<'a> Tx<'a> {
    pub(crate) fn new(
        tx: &'a Transaction<'a>,
        now: Timestamp,
        history: HistoryId,
        undo: &'a Mutex<Undo>,
    ) -> Self {
        Self {
            tx,
            now,
            history,
            undo,
        }
    }

    /// The transaction itself, for statements of your own (`query_row`, `prepare_cached`, …). It is
    /// the writer's: never commit or roll it back.
    pub fn sql(&self) -> &Transaction<'a> {
        self.tx
    }

    /// Runs one statement of your own (see [`rusqlite::Connection::execute`]); returns the number
    /// of rows it changed.
    ///
    /// # Errors
    ///
    /// [`Error::Storage`] with SQLite's error (a constraint, a syntax error, …).
    pub fn execute<P: Params>(&self, sql: &str, params: P) -> Result<usize, Error> {
        self.tx.execute(sql, params).map_err(storage)
    }

    /// The time of this transaction, from the store's clock: what events and commands written
    /// through it record.
    pub fn now(&self) -> Timestamp {
        self.now
    }

    /// [`Engine::handle`] in this transaction: folds the workflow (from the engine's cached state
    /// when it has one), decides on `event`, and writes the commit. Several calls on one workflow in
    /// one transaction each see the events of the ones before, and fold on from the state the one
    /// before kept in the engine's cache; if the transaction fails, the engine forgets it.
    ///
    /// # Errors
    ///
    /// As [`Engine::handle`]. On an error nothing of this event is written; the rest of the
    /// transaction is yours to keep (return `Ok`) or drop (return the error).
    pub fn handle<W>(
        &mut self,
        engine: &Arc<Engine<W>>,
        workflow_id: &WorkflowId,
        event: Event,
    ) -> Result<Handled, Error>
    where
        W: Workflow + Send + Sync + 'static,
        W::State: Send,
    {
        let handled = handle_in(self.tx, engine, self.history, workflow_id, event, self.now)?;
        let (engine, history, workflow_id) = (engine.clone(), self.history, workflow_id.clone());
        self.undo
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .0
            .push(Box::new(move || engine.forget(history, &workflow_id)));
        Ok(handled)
    }

    /// Writes a commit you built ([`Commit::new`]) in this transaction (see
    /// [`SqliteStore::append_in`]).
    ///
    /// # Errors
    ///
    /// As [`miniflow_core::EventLog::append_with_commands`].
    pub fn append(&mut self, commit: &Commit) -> Result<(), Error> {
        SqliteStore::append_in(self.tx, commit)
    }
}

/// [`Engine::handle`] in the writer's transaction `tx`: folds the workflow there (from the engine's
/// cached state when it has one), decides, writes the commit, and remembers the state at once; the
/// caller makes the engine forget it if the transaction fails.
pub(super) fn handle_in<W>(
    tx: &Transaction<'_>,
    engine: &Engine<W>,
    history: HistoryId,
    workflow_id: &WorkflowId,
    event: Event,
    now: Timestamp,
) -> Result<Handled, Error>
where
    W: Workflow,
{
    let planned = engine.plan_in(history, workflow_id, event, now, |after| {
        load_events_after(tx, workflow_id, after)
    })?;
    SqliteStore::append_in(tx, planned.commit())?;
    let handled = Handled::of(planned.commit(), 0);
    engine.remember(planned);
    Ok(handled)
}
