//! What operators' tools read of a store besides its rows: one row with every column as stored (for
//! a row miniflow cannot read), a workflow's events read one by one (an unreadable event reported
//! apart, not fatal), and how many rows a purge would delete. Every read is on the store's own
//! connection, so a store opened with [`SqliteStore::open_read_only`] answers them all and nothing
//! in or beside the file changes (DESIGN rule 17).

use miniflow_core::purge_cutoff;

use super::*;

/// Every column of the outbox row keyed `(workflow_id, event_seq, idx)`.
const RAW_BY_KEY: &str =
    "SELECT * FROM outbox WHERE workflow_id = ?1 AND event_seq = ?2 AND idx = ?3";
/// Every column of the outbox row whose key columns spell `?1` (a key stored in another shape, such
/// as a seq stored as text).
const RAW_BY_TEXT: &str = "SELECT * FROM outbox WHERE command_id = ?1";
/// A workflow's events as stored, in seq order.
const EVENTS_AS_STORED: &str =
    "SELECT seq, kind, payload, recorded_at FROM events WHERE workflow_id = ?1 ORDER BY seq";
/// The rows [`Operations::purge_done`] deletes with cutoff `?1` ([`OutboxRow::is_purgeable`]): done
/// or cancelled, processed at or before the cutoff. Counted in the partial index `outbox_done`.
const COUNT_PURGEABLE: &str = "SELECT COUNT(*) FROM outbox \
     WHERE (status = 'done' OR status = 'cancelled') AND processed_at <= ?1";

pub use miniflow_core::{EventListing, UnreadableEvent};

impl SqliteStore {
    /// Every column of one outbox row by name, in the table's order, as stored: text as a JSON
    /// string, integers and reals as numbers, a blob as an `x'…'` string of hex digits, NULL as
    /// `null`. For a row that [`Outbox::command`] cannot read. `command_id` is read from the right
    /// (`workflow:seq:index`, the workflow ID as stored, whatever it holds) and need not be a valid
    /// [`CommandId`]; `None` when no row has that key.
    ///
    /// ```
    /// use miniflow_core::prelude::*;
    /// use miniflow_core::{json, Command, Commit, Decision, Event, Seq, Timestamp, WorkflowId};
    /// use miniflow_native::SqliteStore;
    ///
    /// let dir = tempfile::tempdir()?;
    /// let path = dir.path().join("flow.db");
    /// let mut store = SqliteStore::open(&path)?;
    /// let decision = Decision::new().command(Command::new("lock_budget", json!({})));
    /// let event = Event::new("trip_requested", json!({}));
    /// let commit = Commit::new(WorkflowId::new("trip-001")?, Seq::ZERO, event, decision, Timestamp::EPOCH)?;
    /// store.append_with_commands(&commit)?;
    /// let columns = SqliteStore::open_read_only(&path)?.raw_command("trip-001:1:0")?.unwrap();
    /// assert!(columns.contains(&("kind".to_owned(), json!("lock_budget"))));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Storage`] when the file cannot be read.
    pub fn raw_command(
        &self,
        command_id: &str,
    ) -> Result<Option<Vec<(String, serde_json::Value)>>, Error> {
        let found = match raw_key(command_id) {
            Some((workflow_id, seq, idx)) => {
                self.raw_row(RAW_BY_KEY, params![workflow_id, seq, idx])?
            }
            None => None,
        };
        match found {
            Some(columns) => Ok(Some(columns)),
            None => self.raw_row(RAW_BY_TEXT, [command_id]),
        }
    }

    fn raw_row(
        &self,
        sql: &str,
        params: impl rusqlite::Params,
    ) -> Result<Option<Vec<(String, serde_json::Value)>>, Error> {
        let mut stmt = self.conn.prepare(sql).map_err(storage)?;
        let names: Vec<String> = stmt.column_names().into_iter().map(str::to_owned).collect();
        let mut rows = stmt.query(params).map_err(storage)?;
        let Some(row) = rows.next().map_err(storage)? else {
            return Ok(None);
        };
        let mut columns = Vec::with_capacity(names.len());
        for (i, name) in names.into_iter().enumerate() {
            columns.push((name, stored_json(row.get_ref(i).map_err(storage)?)));
        }
        Ok(Some(columns))
    }

    /// The events of `workflow_id` in seq order, each read on its own: those that read, and apart
    /// from them those that cannot be read, with their stored seq and why (for operators' tools;
    /// [`EventLog::load`] refuses a history with an unreadable event as [`Error::Corrupt`]). Empty
    /// for an unknown or retired workflow.
    ///
    /// # Errors
    ///
    /// [`Error::Storage`] when the file cannot be read.
    pub fn events_listing(&self, workflow_id: &WorkflowId) -> Result<EventListing, Error> {
        let mut listing = EventListing::default();
        each_row(
            &self.conn,
            EVENTS_AS_STORED,
            [workflow_id.as_str()],
            |row| read_event(workflow_id, row),
            |row| raw_text(row, 0),
            |item| {
                match item {
                    Ok(event) => listing.events.push(event),
                    Err(unreadable) => listing.unreadable.push(UnreadableEvent::new(
                        unreadable.row,
                        unreadable.why.to_string(),
                    )),
                }
                Ok(true)
            },
        )?;
        Ok(listing)
    }

    /// How many done (and cancelled) commands [`Operations::purge_done`] would delete at `now`
    /// with `older_than` (those [`OutboxRow::is_purgeable`] admits: processed at or before
    /// [`purge_cutoff`]), counted on the store's own connection (a store opened read-only too).
    /// Nothing is changed: what a dry run of the purge prints.
    ///
    /// # Errors
    ///
    /// [`Error::Storage`] when the file cannot be read.
    pub fn count_purgeable(&self, older_than: Duration, now: Timestamp) -> Result<usize, Error> {
        let Some(cutoff) = purge_cutoff(now, older_than) else {
            return Ok(0);
        };
        // A cutoff past what a file holds (the year 292 million) reaches every stored time.
        let cutoff = i64::try_from(cutoff.as_millis()).unwrap_or(i64::MAX);
        let count: i64 = self
            .conn
            .prepare_cached(COUNT_PURGEABLE)
            .and_then(|mut stmt| stmt.query_row([cutoff], |row| row.get(0)))
            .map_err(storage)?;
        Ok(usize::try_from(count).unwrap_or(0))
    }
}

/// The key columns `command_id` spells, read from the right: `(workflow_id, event_seq, idx)`.
fn raw_key(command_id: &str) -> Option<(&str, i64, i64)> {
    let mut key = command_id.rsplitn(3, ':');
    let (idx, seq, workflow_id) = (key.next()?, key.next()?, key.next()?);
    Some((workflow_id, seq.parse().ok()?, idx.parse().ok()?))
}

/// A stored value as JSON (see [`SqliteStore::raw_command`]).
fn stored_json(value: ValueRef<'_>) -> serde_json::Value {
    match value {
        ValueRef::Null => serde_json::Value::Null,
        ValueRef::Integer(i) => i.into(),
        ValueRef::Real(f) => f.into(),
        ValueRef::Text(t) => String::from_utf8_lossy(t).into_owned().into(),
        ValueRef::Blob(b) => {
            let hex: String = b.iter().map(|byte| format!("{byte:02x}")).collect();
            format!("x'{hex}'").into()
        }
    }
}

/// One event of `workflow_id` from the columns `seq, kind, payload, recorded_at` (those of
/// [`EVENTS_AS_STORED`] and of every query of events).
pub(super) fn read_event(workflow_id: &WorkflowId, row: &Row<'_>) -> rusqlite::Result<EventRecord> {
    let seq: i64 = row.get(0)?;
    Ok(EventRecord {
        workflow_id: workflow_id.clone(),
        seq: u64::try_from(seq)
            .ok()
            .and_then(|s| Seq::new(s).ok())
            .ok_or_else(|| unreadable(row, 0, format!("holds {seq}, out of range")))?,
        kind: row.get(1)?,
        payload: read_json(row, 2)?,
        recorded_at: read_time(row, 3)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use miniflow_core::{json, Command, Decision, Event};

    /// A store with `w:1:0` done at 10 ms, `w:1:1` cancelled at 20 ms, `w:1:2` pending, and the
    /// events `w#1` (which decided them) and `w#2`.
    fn store(dir: &Path) -> SqliteStore {
        let mut store = SqliteStore::open(dir.join("flow.db")).unwrap();
        let w = WorkflowId::new("w").unwrap();
        let decision = Decision::new()
            .command(Command::new("a", json!({})))
            .command(Command::new("b", json!({})))
            .command(Command::new("c", json!({})));
        let first = Event::new("started", json!({ "n": 1 }));
        let commit = Commit::new(w.clone(), Seq::ZERO, first, decision, Timestamp::EPOCH).unwrap();
        store.append_with_commands(&commit).unwrap();
        let second = Event::new("noted", json!({ "n": 2 }));
        let one = Seq::new(1).unwrap();
        let commit = Commit::new(w, one, second, Decision::none(), Timestamp::EPOCH).unwrap();
        store.append_with_commands(&commit).unwrap();
        store
            .connection()
            .execute_batch(
                "UPDATE outbox SET status = 'done', processed_at = 10 WHERE idx = 0;
                 UPDATE outbox SET status = 'cancelled', processed_at = 20 WHERE idx = 1;",
            )
            .unwrap();
        store
    }

    fn read_only(dir: &Path) -> SqliteStore {
        SqliteStore::open_read_only(dir.join("flow.db")).unwrap()
    }

    #[test]
    fn a_raw_row_is_every_column_as_stored_also_when_it_cannot_be_read() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(dir.path());
        store
            .connection()
            .execute_batch(
                "PRAGMA foreign_keys = OFF;
                 UPDATE outbox SET payload = 'not json {', last_error = x'00ff' WHERE idx = 2;
                 UPDATE outbox SET workflow_id = 'bad' || char(10) || 'id' WHERE idx = 1;",
            )
            .unwrap();
        let reader = read_only(dir.path());
        assert!(matches!(
            reader.command(&"w:1:2".parse().unwrap()),
            Err(Error::Corrupt(_))
        ));
        let columns = reader.raw_command("w:1:2").unwrap().unwrap();
        let column = |name: &str| {
            columns
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, value)| value.clone())
                .unwrap_or_else(|| panic!("no column {name} in {columns:?}"))
        };
        assert_eq!(column("payload"), json!("not json {"));
        assert_eq!(column("last_error"), json!("x'00ff'"));
        assert_eq!(column("idx"), json!(2));
        assert_eq!(column("processed_at"), json!(null));
        assert_eq!(columns[0].0, "id", "in the table's order");
        assert!(columns.len() >= 23, "{columns:?}");
        // A key whose workflow ID is no valid one is found as stored.
        let columns = reader.raw_command("bad\nid:1:1").unwrap().unwrap();
        assert!(columns.contains(&("status".to_owned(), json!("cancelled"))));
        // A seq stored as text is found by the text its key spells.
        store
            .connection()
            .execute("UPDATE outbox SET event_seq = 'one' WHERE idx = 0", [])
            .unwrap();
        let columns = reader.raw_command("w:one:0").unwrap().unwrap();
        assert!(columns.contains(&("event_seq".to_owned(), json!("one"))));
        for unknown in ["w:9:0", "w:1", "", "w:x:y"] {
            assert_eq!(reader.raw_command(unknown).unwrap(), None, "{unknown:?}");
        }
    }

    #[test]
    fn an_unreadable_event_is_listed_apart_and_the_others_still_read() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(dir.path());
        let w = WorkflowId::new("w").unwrap();
        let listing = read_only(dir.path()).events_listing(&w).unwrap();
        assert_eq!(listing.events, store.load(&w).unwrap());
        assert!(listing.unreadable.is_empty());

        store
            .connection()
            .execute_batch(
                "UPDATE events SET payload = '{' WHERE seq = 1;
                 INSERT INTO events VALUES ('w', 3, 'noted', '{}', -4);",
            )
            .unwrap();
        assert!(matches!(store.load(&w), Err(Error::Corrupt(_))));
        let listing = read_only(dir.path()).events_listing(&w).unwrap();
        let seqs: Vec<u64> = listing.events.iter().map(|e| e.seq.get()).collect();
        assert_eq!(seqs, [2]);
        assert_eq!(listing.events[0].payload, json!({ "n": 2 }));
        let unreadable: Vec<(&str, &str)> = listing
            .unreadable
            .iter()
            .map(|e| (e.seq.as_str(), e.error.as_str()))
            .collect();
        assert_eq!(unreadable.len(), 2, "{unreadable:?}");
        assert_eq!(unreadable[0].0, "1");
        assert!(
            unreadable[0]
                .1
                .starts_with("column payload cannot be read as JSON"),
            "{unreadable:?}"
        );
        assert_eq!(
            unreadable[1],
            ("3", "column recorded_at holds the negative time -4")
        );
        let unknown = WorkflowId::new("nobody").unwrap();
        assert_eq!(
            store.events_listing(&unknown).unwrap(),
            EventListing::default()
        );
    }

    #[test]
    fn the_purgeable_count_is_what_purge_done_then_deletes() {
        let at = Timestamp::from_millis;
        for (older_than, now, purged) in [
            (Duration::ZERO, at(9), 0),
            (Duration::ZERO, at(10), 1),
            (Duration::from_millis(10), at(29), 1),
            (Duration::from_millis(10), at(30), 2),
            (Duration::from_millis(31), at(30), 0),
            (Duration::MAX, at(u64::MAX), 0),
            (Duration::ZERO, at(u64::MAX), 2),
        ] {
            let dir = tempfile::tempdir().unwrap();
            let mut store = store(dir.path());
            let counted = read_only(dir.path())
                .count_purgeable(older_than, now)
                .unwrap();
            assert_eq!(counted, purged, "{older_than:?} at {now}");
            if let Some(cutoff) = purge_cutoff(now, older_than) {
                if cutoff.as_millis() <= i64::MAX as u64 {
                    assert_eq!(store.purge_done(older_than, now, 100).unwrap(), purged);
                }
            }
        }
    }

    #[test]
    fn the_purgeable_count_searches_the_partial_index_of_done_rows() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(dir.path());
        let plan: Vec<String> = store
            .connection()
            .prepare(&format!("EXPLAIN QUERY PLAN {COUNT_PURGEABLE}"))
            .unwrap()
            .query_map([0], |row| row.get(3))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let plan = plan.join("; ");
        assert!(
            plan.starts_with("SEARCH outbox USING")
                && plan.contains("INDEX outbox_done (processed_at<?)"),
            "{plan}"
        );
    }
}
