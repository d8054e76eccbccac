//! [`PostgresStore`]: the miniflow [`Store`] on a PostgreSQL database.

use std::time::{Duration, Instant};

use miniflow_core::backend::HistoryId;
use miniflow_core::prelude::*;
use miniflow_core::AppendedAfter;
use miniflow_core::{
    Ack, ClaimRequest, CommandId, Commit, Delivery, Engine, Error, Event, EventRecord, Extended,
    Failure, Handled, KindChange, KindControl, OutboxRow, OutboxStats, RetryPolicy, Seq, Settled,
    TimerId, TimerRow, Timestamp, Workflow, WorkflowId,
};
use postgres::tls::{MakeTlsConnect, TlsConnect};
use postgres::{Config, Socket, Transaction};

use crate::acks::settled_outward;
use crate::clock::Clock;
use crate::commit::LastEvent;
use crate::connect::Shared;
use crate::db::{block, Db, Exec, Own, Statements};
use crate::errors::storage;
use crate::migrations::Track;
use crate::ops;
use crate::options::PostgresOptions;
use crate::pool::PooledClient;
pub use crate::queries::hot_queries;
use crate::queries::*;
use crate::rows::{
    id_params, load_events, load_events_after, query_rows, query_timers, raw_command_id,
    read_outbox_row, Params,
};
use crate::wakeup::Wakeups;

/// The miniflow [`Store`] on PostgreSQL, for several processes and machines sharing one outbox.
///
/// A `PostgresStore` is a handle on a pool of connections: clone it for each thread (the clones
/// share the pool), or let a dispatcher do it. Every write is one short transaction in PostgreSQL's
/// default `READ COMMITTED` isolation: the rows an operation changes are read `FOR UPDATE`, changed by
/// the core's rules ([`OutboxRow`], [`TimerRow`]) and written back with the feedback they schedule,
/// and a claim takes the longest-due commands with `FOR UPDATE SKIP LOCKED`, so claiming workers
/// never wait for each other and never take the same command.
///
/// ```no_run
/// use miniflow_core::prelude::*;
/// use miniflow_core::{Command, Commit, Decision, Event, Seq, Timestamp, WorkflowId};
/// use miniflow_postgres::PostgresStore;
/// use serde_json::json;
///
/// let mut store = PostgresStore::connect("postgresql://app@db.internal/flow")?;
/// let trip = WorkflowId::new("trip-001")?;
/// let decision = Decision::new().command(Command::new("lock_budget", json!({ "trip_id": "trip-001" })));
/// let event = Event::new("trip_requested", json!({ "city": "成都" }));
/// store.append_with_commands(&Commit::new(trip, Seq::ZERO, event, decision, Timestamp::from_millis(0))?)?;
/// assert_eq!(store.pending(10)?[0].command_id.to_string(), "trip-001:1:0");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct PostgresStore {
    shared: Shared,
    wakeups: Option<(Wakeups, Duration)>,
    /// Idle claims skipped until a wake-up (see [`PostgresStore::woken_by`]).
    idle_commands: Idle,
    idle_timers: Idle,
    /// The last claim came back full: the next one goes straight to claiming, without asking first
    /// whether anything is due (there most likely is).
    busy: bool,
}

/// When an idle store asks the database again: after a notification newer than `generation`, or at
/// `until` (the next due time it saw, or the fallback poll).
#[derive(Debug, Clone, Copy, Default)]
struct Idle(Option<(u64, Instant)>);

impl PostgresStore {
    /// Connects to the database at `url` (`postgresql://user:password@host:port/database`, or
    /// `host=… user=… dbname=…`) without TLS, with the default [`PostgresOptions`], and brings its
    /// schema up to date.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a malformed URL; [`Error::Storage`] when the server cannot be
    /// reached or may lose commits (see [`PostgresOptions::require_durable_commits`]);
    /// [`Error::UnsupportedSchema`] when a newer miniflow migrated the database (it is left as it is).
    pub fn connect(url: &str) -> Result<Self, Error> {
        Self::connect_with(url, &PostgresOptions::default())
    }

    /// As [`PostgresStore::connect`], with `options`.
    ///
    /// # Errors
    ///
    /// As [`PostgresStore::connect`], and [`Error::InvalidInput`] for options out of bounds.
    pub fn connect_with(url: &str, options: &PostgresOptions) -> Result<Self, Error> {
        Ok(Self::from_shared(Shared::connect(
            url,
            options,
            Track::Outbox,
        )?))
    }

    /// Connects with a parsed `config` through the TLS connector `tls` (e.g. from
    /// `postgres-native-tls` or `postgres-openssl`).
    ///
    /// # Errors
    ///
    /// As [`PostgresStore::connect_with`].
    pub fn connect_tls<T>(config: Config, tls: T, options: &PostgresOptions) -> Result<Self, Error>
    where
        T: MakeTlsConnect<Socket> + Clone + Send + Sync + 'static,
        T::TlsConnect: Send,
        T::Stream: Send,
        <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
    {
        Ok(Self::from_shared(Shared::connect_tls(
            config, tls, options,
        )?))
    }

    /// Connects to the database at `url` to look into it, changing nothing: read-only sessions, no
    /// migration, no durability check, a pool of 2 (see [`PostgresOptions::read_only`]). The
    /// database must hold miniflow's schema at this version.
    ///
    /// ```no_run
    /// use miniflow_core::prelude::*;
    /// use miniflow_postgres::PostgresStore;
    ///
    /// let store = PostgresStore::connect_read_only("postgresql://operator@db.internal/flow")?;
    /// let listing = store.dead_listing(100)?;
    /// println!("{} dead, {} unreadable", listing.rows.len(), listing.unreadable.len());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a malformed URL, or a database without miniflow's schema or with
    /// an older one; [`Error::UnsupportedSchema`] for a newer one; [`Error::Storage`] when the
    /// server cannot be reached.
    pub fn connect_read_only(url: &str) -> Result<Self, Error> {
        Self::connect_with(url, &PostgresOptions::new().read_only(true).pool_size(2))
    }

    /// Brings the schema of the database at `url` up to this version (creating it in a database
    /// without one), on a connection of its own, and returns the version it found there: 0 for
    /// none, [`crate::SCHEMA_VERSION`] when there was nothing to do. Older versions of miniflow
    /// refuse a database it upgraded. Connecting a store does the same unless
    /// [`PostgresOptions::migrate`] is off; this is for running migrations ahead, with a role that
    /// may change the schema.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a malformed URL; [`Error::UnsupportedSchema`] when a newer
    /// miniflow migrated the database (it is left as it is); [`Error::Storage`] when the server
    /// cannot be reached or a migration fails (it is rolled back whole).
    pub fn migrate(url: &str) -> Result<i64, Error> {
        crate::connect::migrate_url(url)
    }

    fn from_shared(shared: Shared) -> Self {
        Self {
            shared,
            wakeups: None,
            idle_commands: Idle::default(),
            idle_timers: Idle::default(),
            busy: false,
        }
    }

    pub(crate) fn shared(&self) -> &Shared {
        &self.shared
    }

    /// The options the store was connected with.
    pub fn options(&self) -> &PostgresOptions {
        &self.shared.options
    }

    /// A connection from the store's pool, for diagnostics, tests and the caller's own transactions
    /// ([`PostgresStore::append_in`]). Writing miniflow's tables through it bypasses every rule
    /// miniflow keeps.
    ///
    /// # Errors
    ///
    /// [`Error::Storage`] when no connection can be had within the connect timeout.
    pub fn client(&self) -> Result<PooledClient, Error> {
        self.shared.client()
    }

    /// This store, skipping the database on idle polls: after a claim (or a timer claim) that found
    /// nothing, the next ones return at once without a query until `wakeups` hears a notification,
    /// the earliest due time that claim saw arrives, or `fallback` has passed. A worker that polls
    /// often then costs the database one query per `fallback` while idle, and still starts within
    /// its poll interval of a notifying commit. `fallback` catches what no notification announces
    /// (a transaction that locked due rows and rolled back, a listener reconnecting). A `fallback`
    /// longer than [`MAX_FALLBACK`] (an hour) is taken as that.
    #[must_use]
    pub fn woken_by(mut self, wakeups: &Wakeups, fallback: Duration) -> Self {
        self.wakeups = Some((wakeups.clone(), fallback.min(MAX_FALLBACK)));
        self.idle_commands = Idle::default();
        self.idle_timers = Idle::default();
        self
    }

    /// Writes `commit` inside the caller's own transaction `tx`, so the caller's rows commit together
    /// with the event and its commands, or not at all. The store never commits `tx`; on an error
    /// nothing of the commit stays in it (a savepoint is rolled back) and the caller decides whether
    /// to roll back the rest. `tx` must be on the store's database, in `READ COMMITTED` or stronger.
    /// In `REPEATABLE READ` or `SERIALIZABLE`, a commit that lost its race to another transaction
    /// is a [`Error::Conflict`] whose `actual` is the last seq `tx`'s snapshot sees (which may be
    /// `expected` itself): `tx` cannot see the newer events, so roll it back and run it again. One
    /// that a retirement ([`PostgresStore::purge_finished`]) may have overtaken is an
    /// [`Error::Busy`] (a serialization failure): the workflow's last event was deleted after `tx`'s
    /// snapshot, or, for a workflow's first event, some retention committed since it. Run again, it
    /// is told the workflow is retired, or goes through.
    ///
    /// ```no_run
    /// use miniflow_core::prelude::*;
    /// use miniflow_core::{json, Command, Commit, Decision, Event, Seq, Timestamp, WorkflowId};
    /// use miniflow_postgres::PostgresStore;
    ///
    /// let store = PostgresStore::connect("postgresql://app@db.internal/shop")?;
    /// let mut client = store.client()?;
    /// let mut tx = client.transaction()?;
    /// tx.execute("INSERT INTO orders VALUES ('order-7', 1200)", &[])?;
    /// let order = WorkflowId::new("order-7")?;
    /// let decision = Decision::new().command(Command::new("charge_card", json!({ "amount": 1200 })));
    /// let commit = Commit::new(order, Seq::ZERO, Event::new("placed", json!({})), decision, Timestamp::from_millis(0))?;
    /// store.append_in(&mut tx, &commit)?;
    /// tx.commit()?; // the order row, the event and its command, together
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`EventLog::append_with_commands`].
    pub fn append_in(&self, tx: &mut Transaction<'_>, commit: &Commit) -> Result<(), Error> {
        // The caller's connection may not be one of the pool's: its statements are prepared for this
        // call only.
        let mut statements = Statements::default();
        let mut db = Db::new(tx, &mut statements, None);
        self.append_in_db(&mut db, commit)
    }

    /// [`PostgresStore::append_in`] on the caller's transaction as a client of the operations.
    fn append_in_db(&self, db: &mut impl Own, commit: &Commit) -> Result<(), Error> {
        crate::telemetry::sending(commit, || {
            let xid = block(ops::append_in(db, &self.shared.options, commit))?;
            if let Some(xid) = xid {
                self.shared.hint_after(xid);
            }
            Ok(())
        })
    }

    /// [`Engine::handle`] inside the caller's own transaction `tx`: replays the workflow from `tx`,
    /// decides, and writes the commit with [`PostgresStore::append_in`]. A concurrent commit of the
    /// same workflow makes it fail with [`Error::Conflict`]; the caller rolls back and tries again.
    ///
    /// It replays the workflow's whole history and leaves the engine's state cache alone: a state
    /// folded inside your transaction may include events that your rollback takes back, and the cache
    /// keeps only states folded from committed events.
    ///
    /// # Errors
    ///
    /// As [`Engine::handle`].
    pub fn handle_in<W: Workflow>(
        &self,
        tx: &mut Transaction<'_>,
        engine: &Engine<W>,
        workflow_id: &WorkflowId,
        event: Event,
        now: Timestamp,
    ) -> Result<Handled, Error> {
        let mut statements = Statements::default();
        let mut db = Db::new(tx, &mut statements, None);
        let events = block(ops::load_events_in(
            &mut db,
            &self.shared.options,
            workflow_id,
        ))?;
        let commit = engine.plan(&events, workflow_id, event, now)?;
        self.append_in_db(&mut db, &commit)?;
        Ok(Handled::of(&commit, 0))
    }

    /// [`Engine::start`] inside the caller's own transaction `tx`: the workflow's first event and
    /// its commands, decided on the initial state with nothing read first (a new order placed with
    /// its order row). A workflow that has events already is an [`Error::Conflict`]; `tx` is left
    /// usable.
    ///
    /// # Errors
    ///
    /// As [`Engine::start`].
    pub fn start_in<W: Workflow>(
        &self,
        tx: &mut Transaction<'_>,
        engine: &Engine<W>,
        workflow_id: &WorkflowId,
        event: Event,
        now: Timestamp,
    ) -> Result<Handled, Error> {
        let commit = engine.plan(&[], workflow_id, event, now)?;
        self.append_in(tx, &commit)?;
        Ok(Handled::of(&commit, 0))
    }

    /// The store's `now` for an operation the caller made at `now` (see
    /// [`PostgresOptions::database_clock`]).
    pub(crate) fn clock(&self, db: &mut impl Own, now: Timestamp) -> Result<Clock, Error> {
        block(Clock::read(&self.shared.options, db, now))
    }

    /// Applies `change` to one row (see [`ops::update`]) and raises the hint if that made work.
    fn update<T: Send>(
        &mut self,
        command_id: &CommandId,
        now: Timestamp,
        change: impl FnOnce(&mut OutboxRow, Timestamp) -> Result<T, Error> + Send,
    ) -> Result<(T, Clock), Error> {
        let mut connection = self.shared.connection()?;
        let (value, clock, work) = block(ops::update(
            &mut connection.db(),
            &self.shared.options,
            command_id,
            now,
            change,
        ))?;
        self.shared.hint(work);
        Ok((value, clock))
    }

    /// Applies `change` to up to `batch` dead rows of `kind` (see [`ops::change_dead_of_kind`]).
    fn change_dead_of_kind(
        &mut self,
        kind: &str,
        batch: usize,
        now: Timestamp,
        change: impl Fn(&mut OutboxRow, Timestamp) -> Result<(), Error> + Send,
    ) -> Result<Vec<CommandId>, Error> {
        let mut connection = self.shared.connection()?;
        let ids = block(ops::change_dead_of_kind(
            &mut connection.db(),
            &self.shared.options,
            kind,
            batch,
            now,
            change,
        ))?;
        self.shared.hint(!ids.is_empty());
        Ok(ids)
    }

    /// Whether an idle claim may skip the database (see [`PostgresStore::woken_by`]).
    fn still_idle(&self, idle: Idle) -> bool {
        match (&self.wakeups, idle.0) {
            (Some((wakeups, _)), Some((generation, until))) => {
                wakeups.generation() == generation && Instant::now() < until
            }
            _ => false,
        }
    }

    /// The notification generation before a poll, to sleep on after it.
    fn generation(&self) -> u64 {
        self.wakeups.as_ref().map_or(0, |(w, _)| w.generation())
    }

    /// How long a poll that found nothing at `now` may sleep: until `next` (the next due time it saw)
    /// or the fallback poll, whichever comes first.
    fn idle_after(&self, generation: u64, now: Timestamp, next: Option<Timestamp>) -> Idle {
        let Some((_, fallback)) = &self.wakeups else {
            return Idle::default();
        };
        let until_due = next.map_or(*fallback, |next| next.saturating_since(now));
        Idle(Some((
            generation,
            Instant::now() + until_due.min(*fallback),
        )))
    }

    /// Whether anything is due at `now` in the table `due_sql` asks about (see [`ops::due`]).
    fn due(
        &self,
        due_sql: &'static str,
        now: Timestamp,
    ) -> Result<(Timestamp, bool, Option<Timestamp>), Error> {
        let mut connection = self.shared.connection()?;
        block(ops::due(
            &mut connection.db(),
            &self.shared.options,
            due_sql,
            now,
        ))
    }

    /// The first `limit` rows of `sql` (a keyset query as for [`PostgresStore::read_readable`]),
    /// those that cannot be read apart.
    fn listing(&self, sql: &'static str, limit: usize) -> Result<Listing, Error> {
        let mut connection = self.shared.connection()?;
        let page = block(
            connection
                .db()
                .query(sql, &[&"", &i64::MIN, &i64::MIN, &sql_limit(limit)]),
        )
        .map_err(storage)?;
        let mut listing = Listing::default();
        for row in &page {
            match read_outbox_row(row) {
                Ok(outbox_row) => listing.rows.push(outbox_row),
                Err(why) => listing.unreadable.push(UnreadableCommand::new(
                    raw_command_id(row),
                    row.try_get::<_, String>("status")
                        .unwrap_or_else(|_| "?".into()),
                    why.to_string(),
                )),
            }
        }
        Ok(listing)
    }

    /// As [`Outbox::pending`], with the unreadable rows among the first `limit` reported apart
    /// instead of skipped (for operators' tools).
    ///
    /// # Errors
    ///
    /// [`Error::Storage`] when the database cannot be read.
    pub fn pending_listing(&self, limit: usize) -> Result<Listing, Error> {
        self.listing(SELECT_PENDING, limit)
    }

    /// As [`Operations::dead_letters`], with the unreadable rows among the first `limit` reported
    /// apart instead of skipped.
    ///
    /// # Errors
    ///
    /// [`Error::Storage`] when the database cannot be read.
    pub fn dead_listing(&self, limit: usize) -> Result<Listing, Error> {
        self.listing(SELECT_DEAD, limit)
    }

    /// Up to `limit` readable rows of `sql` (see [`ops::read_readable`]).
    fn read_readable(&self, sql: &'static str, limit: usize) -> Result<Vec<OutboxRow>, Error> {
        let mut connection = self.shared.connection()?;
        block(ops::read_readable(&mut connection.db(), sql, limit))
    }
}

pub use miniflow_core::{Listing, UnreadableCommand};

/// The longest an idle store skips the database for ([`PostgresStore::woken_by`]).
pub const MAX_FALLBACK: Duration = Duration::from_secs(3600);

impl EventLog for PostgresStore {
    fn load(&self, workflow_id: &WorkflowId) -> Result<Vec<EventRecord>, Error> {
        block(load_events(
            &mut self.shared.connection()?.db(),
            workflow_id,
        ))
    }
    /// Waits [`miniflow_core::backend::conflict_backoff`], with a random jitter: connections writing one
    /// workflow spread out instead of racing again together.
    fn before_retry(&mut self, conflicts: u32) {
        std::thread::sleep(miniflow_core::backend::conflict_backoff(
            conflicts,
            ops::jitter(),
        ));
    }
    fn load_after(&self, workflow_id: &WorkflowId, after: Seq) -> Result<Vec<EventRecord>, Error> {
        block(load_events_after(
            &mut self.shared.connection()?.db(),
            workflow_id,
            after,
        ))
    }
    /// One ID for a store and its clones: they share one pool on one database.
    fn history_id(&self) -> Option<HistoryId> {
        Some(self.shared.history)
    }
    /// A commit without timers or cancellations, on the caller's clock, is one statement in a
    /// transaction of its own; any other is one transaction of several.
    fn append_with_commands(&mut self, commit: &Commit) -> Result<(), Error> {
        crate::telemetry::sending(commit, || self.append(commit, None))
    }
    /// On the caller's clock the last event is checked in the commit's own statement, so nothing is
    /// read before it. On the database's clock (whose times the engine does not hold) `None`.
    fn append_after(
        &mut self,
        last: &EventRecord,
        commit: &Commit,
    ) -> Result<AppendedAfter, Error> {
        if self.shared.options.uses_database_clock() {
            return Ok(AppendedAfter::Unchecked);
        }
        commit.check_follows(last)?;
        let last = LastEvent::of(last)?;
        crate::telemetry::sending(commit, || self.append(commit, Some(&last)))?;
        Ok(AppendedAfter::Written)
    }
}

impl PostgresStore {
    /// [`EventLog::append_with_commands`], without its span, written only while `last`, if any, is
    /// the workflow's last event.
    fn append(&self, commit: &Commit, last: Option<&LastEvent>) -> Result<(), Error> {
        let mut connection = self.shared.connection()?;
        let work = block(ops::append(
            &mut connection.db(),
            &self.shared.options,
            commit,
            last,
        ))?;
        self.shared.hint(work);
        Ok(())
    }
}

impl Outbox for PostgresStore {
    /// Skips rows that cannot be read (DESIGN rule 13): a claim buries them when they are due.
    fn pending(&self, limit: usize) -> Result<Vec<OutboxRow>, Error> {
        self.read_readable(SELECT_PENDING, limit)
    }
    fn command(&self, command_id: &CommandId) -> Result<Option<OutboxRow>, Error> {
        let (w, s, i) = id_params(command_id);
        Ok(block(query_rows(
            &mut self.shared.connection()?.db(),
            SELECT_ONE,
            &[&w, &s, &i],
        ))?
        .pop())
    }
    fn commands(&self, workflow_id: &WorkflowId) -> Result<Vec<OutboxRow>, Error> {
        let params: &Params<'_> = &[&workflow_id.as_str()];
        block(query_rows(
            &mut self.shared.connection()?.db(),
            SELECT_WORKFLOW,
            params,
        ))
    }
    fn mark_done(&mut self, command_id: &CommandId, now: Timestamp) -> Result<(), Error> {
        self.update(command_id, now, |row, now| row.mark_done(now))
            .map(|_| ())
    }
    fn claim(&mut self, request: &ClaimRequest, now: Timestamp) -> Result<Vec<Delivery>, Error> {
        request.validate()?;
        if self.still_idle(self.idle_commands) {
            return Ok(Vec::new());
        }
        let generation = self.generation();
        let asked = if self.busy {
            None
        } else {
            Some(self.due(COMMANDS_DUE, now)?)
        };
        let mut deliveries = Vec::new();
        if asked.is_none_or(|(_, due, _)| due) {
            let mut connection = self.shared.connection()?;
            let fed_back;
            (deliveries, fed_back) = block(ops::claim(
                &mut connection.db(),
                &self.shared.options,
                request,
                now,
            ))?;
            self.shared.hint(fed_back);
        }
        self.busy = deliveries.len() == request.limit;
        self.idle_commands = if deliveries.is_empty() {
            let (store_now, _, next) = match asked {
                Some(answer) => answer,
                None => self.due(COMMANDS_DUE, now)?,
            };
            self.idle_after(generation, store_now, next)
        } else {
            Idle::default()
        };
        Ok(deliveries)
    }
    fn extend(
        &mut self,
        command_id: &CommandId,
        token: u64,
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Extended, Error> {
        let (extended, clock) =
            self.update(command_id, now, |row, now| row.extend(token, ttl, now))?;
        Ok(Extended {
            expires_at: clock.outward(extended.expires_at),
            ..extended
        })
    }
    /// One transaction of two statements for all the leases.
    fn extend_all(
        &mut self,
        leases: &[(CommandId, u64)],
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Vec<Result<Extended, Error>>, Error> {
        let mut connection = self.shared.connection()?;
        block(ops::extend_all(
            &mut connection.db(),
            &self.shared.options,
            leases,
            ttl,
            now,
        ))
    }
    fn release(&mut self, command_id: &CommandId, token: u64, now: Timestamp) -> Result<(), Error> {
        self.update(command_id, now, |row, now| row.release(token, now))
            .map(|_| ())
    }
    fn complete(
        &mut self,
        command_id: &CommandId,
        token: u64,
        result: Option<&serde_json::Value>,
        now: Timestamp,
    ) -> Result<(), Error> {
        let mut connection = self.shared.connection()?;
        let work = block(ops::complete(
            &mut connection.db(),
            &self.shared.options,
            command_id,
            token,
            result,
            now,
        ))?;
        self.shared.hint(work);
        Ok(())
    }
    /// All acks in one transaction: one commit for the batch. The results are returned only after the
    /// commit, so a reported completion is durable.
    fn complete_all(
        &mut self,
        acks: Vec<Ack>,
        now: Timestamp,
    ) -> Result<Vec<Result<(), Error>>, Error> {
        let mut connection = self.shared.connection()?;
        let (results, work) = block(ops::complete_all(
            &mut connection.db(),
            &self.shared.options,
            &acks,
            now,
        ))?;
        self.shared.hint(work);
        Ok(results)
    }
    fn fail(
        &mut self,
        command_id: &CommandId,
        token: u64,
        failure: &Failure,
        policy: &RetryPolicy,
        now: Timestamp,
    ) -> Result<Settled, Error> {
        let (settled, clock) = self.update(command_id, now, |row, now| {
            row.fail(token, failure, policy, now)
        })?;
        Ok(settled_outward(settled, &clock))
    }
}

impl Timers for PostgresStore {
    fn claim_timers(
        &mut self,
        limit: usize,
        lease_ttl: Duration,
        now: Timestamp,
    ) -> Result<Vec<TimerRow>, Error> {
        if limit == 0 || self.still_idle(self.idle_timers) {
            return Ok(Vec::new());
        }
        let generation = self.generation();
        let (store_now, due, next) = self.due(TIMERS_DUE, now)?;
        let mut timers = Vec::new();
        if due {
            let mut connection = self.shared.connection()?;
            timers = block(ops::claim_timers(
                &mut connection.db(),
                &self.shared.options,
                limit,
                lease_ttl,
                now,
            ))?;
        }
        self.idle_timers = if timers.is_empty() {
            self.idle_after(generation, store_now, next)
        } else {
            Idle::default()
        };
        Ok(timers)
    }
    fn any_timer_due(&self, now: Timestamp) -> Result<bool, Error> {
        Ok(self.due(TIMERS_DUE, now)?.1)
    }
    fn reject_timer(
        &mut self,
        timer_id: &TimerId,
        reason: &str,
        now: Timestamp,
    ) -> Result<(), Error> {
        let mut connection = self.shared.connection()?;
        block(ops::reject_timer(
            &mut connection.db(),
            &self.shared.options,
            timer_id,
            reason,
            now,
        ))
    }
    fn timers(&self, workflow_id: &WorkflowId) -> Result<Vec<TimerRow>, Error> {
        let params: &Params<'_> = &[&workflow_id.as_str()];
        block(query_timers(
            &mut self.shared.connection()?.db(),
            SELECT_WORKFLOW_TIMERS,
            params,
        ))
    }
}

impl Operations for PostgresStore {
    fn purge_done(
        &mut self,
        older_than: Duration,
        now: Timestamp,
        batch: usize,
    ) -> Result<usize, Error> {
        let mut connection = self.shared.connection()?;
        block(ops::purge_done(
            &mut connection.db(),
            &self.shared.options,
            older_than,
            now,
            batch,
        ))
    }
    /// Skips rows that cannot be read (DESIGN rule 13).
    fn dead_letters(&self, limit: usize) -> Result<Vec<OutboxRow>, Error> {
        self.read_readable(SELECT_DEAD, limit)
    }
    fn retry(&mut self, command_id: &CommandId, now: Timestamp) -> Result<(), Error> {
        self.update(command_id, now, |row, now| row.retry(now))
            .map(|_| ())
    }
    fn resolve(&mut self, command_id: &CommandId, note: &str, now: Timestamp) -> Result<(), Error> {
        self.update(command_id, now, |row, now| row.resolve(note, now))
            .map(|_| ())
    }
    /// Three reads of one snapshot (a `REPEATABLE READ, READ ONLY` transaction): the unfinished
    /// rows by kind and status (from the partial index `outbox_claim`), the dead rows by kind
    /// (`outbox_dead_by_kind`) and the controls, so a command that moves between them while the
    /// stats are read is counted once. Works on [`PostgresStore::connect_read_only`].
    fn stats(&self, now: Timestamp) -> Result<OutboxStats, Error> {
        let mut connection = self.shared.connection()?;
        block(ops::stats(&mut connection.db(), &self.shared.options, now))
    }
    /// Times as stored: in the database's clock with [`PostgresOptions::database_clock`] (there
    /// is no caller's `now` to translate them by; [`Operations::stats`] translates them).
    fn kind_controls(&self) -> Result<Vec<KindControl>, Error> {
        let mut connection = self.shared.connection()?;
        block(crate::controls::read_controls(
            &mut connection.db(),
            crate::controls::SELECT_CONTROLS,
            Clock::caller(Timestamp::EPOCH),
        ))
    }
    /// The control row is read `FOR UPDATE`, so the change waits for a claim counting the kind's
    /// leases; the commit notifies idle workers (a resume or a higher limit makes work claimable).
    fn control_kind(
        &mut self,
        kind: &str,
        change: KindChange,
        by: &str,
        now: Timestamp,
    ) -> Result<KindControl, Error> {
        let mut connection = self.shared.connection()?;
        let control = block(ops::control_kind(
            &mut connection.db(),
            &self.shared.options,
            kind,
            change,
            by,
            now,
        ))?;
        self.shared.hint(true);
        Ok(control)
    }
    /// Skips rows that cannot be read (DESIGN rule 13).
    fn dead_letters_of_kind(&self, kind: &str, limit: usize) -> Result<Vec<OutboxRow>, Error> {
        miniflow_core::check_kind("kind", kind)?;
        let mut connection = self.shared.connection()?;
        block(crate::controls::dead_of_kind(
            &mut connection.db(),
            kind,
            limit,
            false,
        ))
    }
    fn retry_dead_of_kind(
        &mut self,
        kind: &str,
        batch: usize,
        now: Timestamp,
    ) -> Result<Vec<CommandId>, Error> {
        self.change_dead_of_kind(kind, batch, now, |row, now| row.retry(now))
    }
    fn resolve_dead_of_kind(
        &mut self,
        kind: &str,
        note: &str,
        batch: usize,
        now: Timestamp,
    ) -> Result<Vec<CommandId>, Error> {
        self.change_dead_of_kind(kind, batch, now, |row, now| row.resolve(note, now))
    }
}
