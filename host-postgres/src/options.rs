//! [`PostgresOptions`]: the settings of a store and of a receiver's store on PostgreSQL.

use std::time::Duration;

use miniflow_core::Error;

/// Settings of a [`crate::PostgresStore`] and [`crate::PostgresIdempotencyStore`]; the defaults
/// keep every commit durable and take `now` from the caller, like every miniflow store.
///
/// ```
/// use std::time::Duration;
/// use miniflow_postgres::PostgresOptions;
///
/// let options = PostgresOptions::new()
///     .pool_size(16)
///     .connect_timeout(Duration::from_secs(5))
///     .database_clock(true);
/// assert!(options.uses_database_clock());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PostgresOptions {
    pub(crate) pool_size: u32,
    pub(crate) connect_timeout: Duration,
    pub(crate) database_clock: bool,
    pub(crate) notify: bool,
    pub(crate) require_durable_commits: bool,
    pub(crate) migrate: bool,
    pub(crate) read_only: bool,
    pub(crate) schema: Option<String>,
}

impl Default for PostgresOptions {
    fn default() -> Self {
        Self {
            pool_size: 10,
            connect_timeout: Duration::from_secs(10),
            database_clock: false,
            notify: true,
            require_durable_commits: true,
            migrate: true,
            read_only: false,
            schema: None,
        }
    }
}

impl PostgresOptions {
    /// The largest pool a store may keep.
    pub const MAX_POOL_SIZE: u32 = 1_000;

    /// The defaults: a pool of up to 10 connections, 10 s to get one, the caller's clock, NOTIFY on,
    /// durable commits required.
    pub fn new() -> Self {
        Self::default()
    }

    /// Keeps up to `size` connections (1 to [`PostgresOptions::MAX_POOL_SIZE`]); every clone of a
    /// store shares them. A dispatcher needs one per worker, one for its heartbeat, one for its ack
    /// thread (unless its `ack_delay` is 0), one for `report_stats` if set, and its listener opens
    /// one more of its own.
    #[must_use]
    pub fn pool_size(mut self, size: u32) -> Self {
        self.pool_size = size;
        self
    }

    /// How long an operation waits for a free connection, and a new connection for the server, before
    /// it fails (1 ms to 10 min).
    #[must_use]
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// One clock for leases (DESIGN rule 18). With `true`, every operation reads the database's clock
    /// (`clock_timestamp()`, in milliseconds) at the start of its transaction and uses it instead of
    /// the caller's `now`: lease expiries, due times, retry times, the times a commit writes and the
    /// retention cut-off all come from the one server, so workers on machines whose clocks disagree
    /// still agree on when a lease ran out. The times an operation *returns* (a delivery's lease
    /// expiry, an extended lease, a retry time, a taken timer's times) are translated back into the
    /// caller's clock by the offset measured in that transaction, so a heartbeat that compares them
    /// with its own clock keeps working; the times stored and read back by `pending`, `command`,
    /// `commands`, `timers` and `load` are the database's.
    ///
    /// Off by default: then `now` is the caller's, as for every other miniflow store (and the
    /// conformance suite, which controls time). Turn it on when workers run on more than one
    /// machine.
    #[must_use]
    pub fn database_clock(mut self, on: bool) -> Self {
        self.database_clock = on;
        self
    }

    /// Whether an operation that makes work claimable (new commands or timers, a command pending
    /// again, a finished command whose workflow has later ones) is followed by `NOTIFY
    /// miniflow_outbox`, the hint that wakes idle [`crate::Wakeups`] listeners. On by default.
    ///
    /// The hint is sent after the operation committed (so whoever it wakes finds the work), by a
    /// thread of the store's own on one more connection, opened on the first hint: committing never
    /// waits for it, and operations committing while one is on its way share the next, at most one
    /// per millisecond per store. PostgreSQL serialises the commits of notifying transactions; the
    /// hint's own transaction commits without waiting for its WAL flush, so the operations' commits
    /// do not queue behind one another. A hint lost (in a crash, or with its connection) costs idle
    /// workers their fallback poll and nothing else. Only [`crate::PostgresStore::append_in`]
    /// and [`crate::PostgresStore::handle_in`], which commit in the caller's transaction, notify in
    /// it. A store whose workers only poll may turn hints off.
    #[must_use]
    pub fn notify(mut self, on: bool) -> Self {
        self.notify = on;
        self
    }

    /// Whether connecting refuses a server that may lose a commit that returned: `fsync = off`, or
    /// `synchronous_commit = off` for this connection's user and database (DESIGN rule 3: when a
    /// commit returns it survives a crash). On by default; turning it off is the explicit opt-in to
    /// weaker durability.
    #[must_use]
    pub fn require_durable_commits(mut self, on: bool) -> Self {
        self.require_durable_commits = on;
        self
    }

    /// Whether connecting brings the database's schema up to date (on by default: numbered
    /// migrations under an advisory lock, see the crate's documentation). Off, connecting changes
    /// nothing and refuses a database that does not hold miniflow's schema at this version:
    /// [`Error::InvalidInput`] for a database without it or with an older one (upgrade it with
    /// [`crate::PostgresStore::migrate`] or `miniflow migrate URL`), [`Error::UnsupportedSchema`]
    /// for a newer one. For tools that must not create or upgrade a schema by accident, and for
    /// roles that may not change it.
    #[must_use]
    pub fn migrate(mut self, on: bool) -> Self {
        self.migrate = on;
        self
    }

    /// Read-only sessions: every connection of the pool starts with `default_transaction_read_only
    /// = on`, so the database refuses any write through the store (an [`Error::Storage`] naming the
    /// read-only transaction). Connecting then migrates nothing and checks no durability setting
    /// (as with [`PostgresOptions::migrate`] off, the schema must be this version's), and nothing
    /// notifies. For inspection: `pending`, `command`, `load`, the listings. Off by default.
    #[must_use]
    pub fn read_only(mut self, on: bool) -> Self {
        self.read_only = on;
        self
    }

    /// Keeps miniflow's tables in the schema `name` (created when connecting migrates) rather than
    /// in the first schema of the `search_path`, beside the service's own: the store's connections
    /// start with `search_path = name, public`, and in a transaction of the caller's (`append_in`,
    /// `handle_in`, `start_in`, a receiver's `begin_in` and `finish_in`) miniflow puts `name` first
    /// for its own statements and gives the transaction its `search_path` back after them (two
    /// round trips more per call). `name` is a lower-case SQL identifier: letters, digits and `_`,
    /// at most 63 bytes, not beginning with a digit or `pg_`. Unset by default.
    ///
    /// ```
    /// use miniflow_postgres::PostgresOptions;
    ///
    /// let options = PostgresOptions::new().schema("miniflow");
    /// assert_eq!(options.schema_name(), Some("miniflow"));
    /// assert!(PostgresOptions::new().schema("Mini Flow").validate().is_err());
    /// ```
    #[must_use]
    pub fn schema(mut self, name: impl Into<String>) -> Self {
        self.schema = Some(name.into());
        self
    }

    /// The schema miniflow's tables are in, if one was set (see [`PostgresOptions::schema`]).
    pub fn schema_name(&self) -> Option<&str> {
        self.schema.as_deref()
    }

    /// Whether connections are read-only sessions (see [`PostgresOptions::read_only`]).
    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    /// Whether the store reads the database's clock (see [`PostgresOptions::database_clock`]).
    pub fn uses_database_clock(&self) -> bool {
        self.database_clock
    }

    /// Whether committing transactions notify (see [`PostgresOptions::notify`]).
    pub fn notifies(&self) -> bool {
        self.notify
    }

    /// Refuses settings out of bounds, naming the setting and its value.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] naming the setting.
    pub fn validate(&self) -> Result<(), Error> {
        if !(1..=Self::MAX_POOL_SIZE).contains(&self.pool_size) {
            return Err(Error::invalid(
                "pool_size",
                self.pool_size,
                format!("must be 1 to {}", Self::MAX_POOL_SIZE),
            ));
        }
        let timeouts = Duration::from_millis(1)..=Duration::from_secs(600);
        if !timeouts.contains(&self.connect_timeout) {
            return Err(Error::invalid(
                "connect_timeout",
                format!("{:?}", self.connect_timeout),
                "must be 1ms to 600s",
            ));
        }
        if let Some(name) = &self.schema {
            let identifier = !name.is_empty()
                && name.len() <= 63
                && !name.starts_with(|c: char| c.is_ascii_digit())
                && !name.starts_with("pg_")
                && name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
            if !identifier {
                let shown: String = name.chars().take(70).collect();
                return Err(Error::invalid(
                    "schema",
                    shown,
                    "must be a lower-case SQL identifier: letters a-z, digits and _, at most 63 \
                     bytes, not beginning with a digit or pg_",
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_out_of_bounds_are_refused_naming_the_setting() {
        let field = |options: PostgresOptions| match options.validate() {
            Err(Error::InvalidInput { field, .. }) => Some(field),
            _ => None,
        };
        assert_eq!(field(PostgresOptions::new()), None);
        assert_eq!(
            field(PostgresOptions::new().pool_size(0)),
            Some("pool_size")
        );
        assert_eq!(
            field(PostgresOptions::new().pool_size(1_001)),
            Some("pool_size")
        );
        assert_eq!(
            field(PostgresOptions::new().connect_timeout(Duration::ZERO)),
            Some("connect_timeout")
        );
        assert_eq!(field(PostgresOptions::new().schema("orders_2")), None);
        for bad in [
            "",
            "Miniflow",
            "mini flow",
            "1st",
            "pg_mine",
            "a;b",
            "é",
            &"s".repeat(64),
        ] {
            assert_eq!(
                field(PostgresOptions::new().schema(bad)),
                Some("schema"),
                "{bad:?}"
            );
        }
    }
}
