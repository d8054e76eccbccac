//! Connections: the pool every store handle shares, its options, the schema migrations, and how
//! driver errors map onto miniflow's kinds.

use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::time::Duration;

use miniflow_core::backend::HistoryId;
use miniflow_core::{Error, Timestamp};
use postgres::tls::{MakeTlsConnect, TlsConnect};
use postgres::{Client, Config, GenericClient, NoTls, Socket};
use r2d2_postgres::PostgresConnectionManager;

use crate::db::{Connection, Db};
pub(crate) use crate::db::{Connections, Pooled};
use crate::errors::DriverError;
pub(crate) use crate::errors::{is_unique_violation, storage};
use crate::notifier::Notifier;
pub use crate::notifier::NOTIFY_CHANNEL;

/// The schema migrations, applied in order; the count is the schema version in `miniflow_schema`.
const MIGRATIONS: &[&str] = &[
    include_str!("../migrations/0001_init.sql"),
    include_str!("../migrations/0002_operator_controls.sql"),
    include_str!("../migrations/0003_trace_context.sql"),
    include_str!("../migrations/0004_retired_workflows.sql"),
];

/// The newest schema version this build writes.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// The advisory lock class of miniflow's locks (`pg_advisory_xact_lock(class, id)`, a key space of
/// its own): "mflw".
pub(crate) const LOCK_CLASS: i32 = 0x6d66_6c77;
/// The lock id, within [`LOCK_CLASS`], that migrations take.
const MIGRATION_LOCK: i32 = 1;
/// The lock id, within [`LOCK_CLASS`] + 1, of an idempotency key is `hashtext(key)`.
pub(crate) const KEY_LOCK_CLASS: i32 = LOCK_CLASS + 1;

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
    pool_size: u32,
    connect_timeout: Duration,
    database_clock: bool,
    notify: bool,
    require_durable_commits: bool,
    migrate: bool,
    read_only: bool,
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
        Ok(())
    }
}

/// A connection checked out of the pool; it goes back when dropped.
pub type PooledClient = Box<dyn DerefMut<Target = Client> + Send>;

/// The client of a checked-out connection, for the caller.
struct ClientOf(Pooled);

impl Deref for ClientOf {
    type Target = Client;
    fn deref(&self) -> &Client {
        &self.0.client
    }
}

impl DerefMut for ClientOf {
    fn deref_mut(&mut self) -> &mut Client {
        &mut self.0.client
    }
}

/// The pool's connections: `r2d2_postgres`'s, each with its statement cache.
struct Manager<T>(PostgresConnectionManager<T>);

/// How long a pooled connection may have been idle and still be handed out untested.
const TRUSTED_IDLE: Duration = Duration::from_secs(1);

impl<T> r2d2::ManageConnection for Manager<T>
where
    T: MakeTlsConnect<Socket> + Clone + Send + Sync + 'static,
    T::TlsConnect: Send,
    T::Stream: Send,
    <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
{
    type Connection = Connection;
    type Error = postgres::Error;

    fn connect(&self) -> Result<Connection, postgres::Error> {
        self.0.connect().map(Connection::new)
    }

    /// Asks the server only about a connection that has been idle a while: the server may have
    /// closed it meanwhile (an idle-session timeout, a restart, a proxy), and a connection taken
    /// back at once is still open. So a busy pool pays no round trip per operation, and an idle one
    /// pays one per checkout instead of failing its caller's operation.
    fn is_valid(&self, connection: &mut Connection) -> Result<(), postgres::Error> {
        if connection.idle_since.elapsed() < TRUSTED_IDLE {
            return Ok(());
        }
        self.0.is_valid(&mut connection.client)
    }

    fn has_broken(&self, connection: &mut Connection) -> bool {
        connection.idle_since = std::time::Instant::now(); // given back: idle from now on
        self.0.has_broken(&mut connection.client)
    }
}

struct Pool<T>
where
    T: MakeTlsConnect<Socket> + Clone + Send + Sync + 'static,
    T::TlsConnect: Send,
    T::Stream: Send,
    <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
{
    pool: r2d2::Pool<Manager<T>>,
    config: Config,
    tls: T,
}

impl<T> Connections for Pool<T>
where
    T: MakeTlsConnect<Socket> + Clone + Send + Sync + 'static,
    T::TlsConnect: Send,
    T::Stream: Send,
    <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
{
    fn get(&self) -> Result<Pooled, Error> {
        self.pool
            .get()
            .map(|connection| Box::new(connection) as Pooled)
            .map_err(|e| Error::Storage(format!("no PostgreSQL connection: {e}").into()))
    }

    fn dedicated(&self) -> Result<Client, Error> {
        self.config.connect(self.tls.clone()).map_err(storage)
    }
}

/// The connections and options every handle of one store shares.
#[derive(Clone)]
pub(crate) struct Shared {
    connections: Arc<dyn Connections>,
    notifier: Arc<Notifier>,
    pub(crate) options: PostgresOptions,
    /// The history the store's events are, for the engine's state cache: one per pool.
    pub(crate) history: HistoryId,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl Shared {
    /// A pool on `url` without TLS.
    pub(crate) fn connect(url: &str, options: &PostgresOptions) -> Result<Self, Error> {
        Self::open(
            parse_url(url)?,
            NoTls,
            options,
            ("url", redact_password(url)),
        )
    }

    /// A pool on `config` through `tls`: checks the server's durability, migrates the schema.
    pub(crate) fn connect_tls<T>(
        config: Config,
        tls: T,
        options: &PostgresOptions,
    ) -> Result<Self, Error>
    where
        T: MakeTlsConnect<Socket> + Clone + Send + Sync + 'static,
        T::TlsConnect: Send,
        T::Stream: Send,
        <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
    {
        let database = config.get_dbname().unwrap_or("(the user's)").to_owned();
        Self::open(config, tls, options, ("database", database))
    }

    /// A pool on `config` through `tls`: checks the server's durability and migrates the schema, or
    /// (read-only, or not migrating) checks the schema is this version's. `target` names the
    /// database in errors (`("url", the URL without its password)`).
    fn open<T>(
        mut config: Config,
        tls: T,
        options: &PostgresOptions,
        target: (&'static str, String),
    ) -> Result<Self, Error>
    where
        T: MakeTlsConnect<Socket> + Clone + Send + Sync + 'static,
        T::TlsConnect: Send,
        T::Stream: Send,
        <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
    {
        options.validate()?;
        // Startup options: every connection of the pool, and each one it reopens, runs its
        // transactions at READ COMMITTED whatever the server's default (each of the store's
        // operations is written for it), and with `read_only` is a read-only session from its first
        // statement on.
        let mut startup = format!(
            "{} -c default_transaction_isolation=read\\ committed",
            config.get_options().unwrap_or_default()
        );
        if options.read_only {
            startup.push_str(" -c default_transaction_read_only=on");
        }
        config.options(startup.trim_start());
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(options.connect_timeout);
        }
        if config.get_application_name().is_none() {
            config.application_name("miniflow");
        }
        let manager = Manager(PostgresConnectionManager::new(config.clone(), tls.clone()));
        let pool = r2d2::Pool::builder()
            .max_size(options.pool_size)
            .min_idle(Some(0))
            .connection_timeout(options.connect_timeout)
            // A connection idle for longer than `TRUSTED_IDLE` is tested before it is handed out
            // (see `Manager::is_valid`); one the server closed is replaced, not given to a caller.
            .test_on_check_out(true)
            .build(manager)
            .map_err(|e| Error::Storage(format!("cannot build the connection pool: {e}").into()))?;
        let connections: Arc<dyn Connections> = Arc::new(Pool { pool, config, tls });
        let shared = Self {
            notifier: Arc::new(Notifier::new(connections.clone())),
            connections,
            options: options.clone(),
            history: HistoryId::unique(),
        };
        // The checks on a connection of their own: a server that cannot be reached fails the
        // connect at once with what went wrong, where the pool would retry until its timeout.
        let mut client = shared.dedicated().map_err(|e| match e {
            Error::Storage(source) => Error::Storage(Box::new(Connecting {
                target: format!("{} {}", target.0, target.1),
                source,
            })),
            other => other,
        })?;
        if options.require_durable_commits && !options.read_only {
            check_durability(&mut client)?;
        }
        if options.migrate && !options.read_only {
            migrate(&mut client)?;
        } else {
            check_schema(&mut client, target)?;
        }
        Ok(shared)
    }

    /// A connection from the pool, for the caller.
    pub(crate) fn client(&self) -> Result<PooledClient, Error> {
        Ok(Box::new(ClientOf(self.connections.get()?)))
    }

    /// A connection from the pool with its prepared statements.
    pub(crate) fn connection(&self) -> Result<Pooled, Error> {
        self.connections.get()
    }

    /// Raises the wake-up hint when `work` says an operation that committed made work claimable
    /// and the options allow it (see [`crate::notifier`]).
    pub(crate) fn hint(&self, work: bool) {
        if work && self.options.notify && !self.options.read_only {
            self.notifier.raise();
        }
    }

    /// A connection of its own, outside the pool (for a listener).
    pub(crate) fn dedicated(&self) -> Result<Client, Error> {
        self.connections.dedicated()
    }
}

/// The connection settings `url` spells.
fn parse_url(url: &str) -> Result<Config, Error> {
    url.parse().map_err(|e: postgres::Error| {
        let e = DriverError(e);
        Error::invalid(
            "url",
            redact_password(url),
            format!("is not a PostgreSQL URL: {e}"),
        )
    })
}

/// Brings the schema of the database at `url` to [`SCHEMA_VERSION`] on a connection of its own (see
/// [`crate::PostgresStore::migrate`]); returns the version it found.
pub(crate) fn migrate_url(url: &str) -> Result<i64, Error> {
    let mut config = parse_url(url)?;
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(PostgresOptions::default().connect_timeout);
    }
    if config.get_application_name().is_none() {
        config.application_name("miniflow");
    }
    let mut client = config.connect(NoTls).map_err(storage)?;
    let found = schema_version(&mut client)?;
    migrate(&mut client)?;
    Ok(found)
}

/// Refuses a database whose schema is not this version's, changing nothing: none or an older one is
/// [`Error::InvalidInput`] naming `target`, a newer one [`Error::UnsupportedSchema`].
fn check_schema(client: &mut Client, (field, value): (&'static str, String)) -> Result<(), Error> {
    match schema_version(client)? {
        found if found == SCHEMA_VERSION => Ok(()),
        0 => Err(Error::invalid(
            field,
            &value,
            format!(
                "holds no miniflow schema (no miniflow_schema table in its search path): create it \
                 with `miniflow migrate {value}`, or connect a store that migrates"
            ),
        )),
        found if found < SCHEMA_VERSION => Err(Error::invalid(
            field,
            &value,
            format!(
                "holds miniflow schema version {found}, older than version {SCHEMA_VERSION} of \
                 this miniflow: upgrade it first with `miniflow migrate {value}`"
            ),
        )),
        found => Err(Error::UnsupportedSchema {
            found,
            supported: SCHEMA_VERSION,
        }),
    }
}

/// `url` without its password, for messages: the password of a URL's user (`app:***@host`), and
/// every `password=` setting, in a URL's query (`?password=***`) or a `key=value` string
/// (`password=***`, quoted or not).
///
/// ```
/// use miniflow_postgres::redact_password;
///
/// assert_eq!(redact_password("postgresql://app:s3cret@db/flow"), "postgresql://app:***@db/flow");
/// assert_eq!(redact_password("postgresql://app@db/flow?password=s3cret&sslmode=disable"),
///            "postgresql://app@db/flow?password=***&sslmode=disable");
/// assert_eq!(redact_password("host=db password='s3 cret' dbname=flow"), "host=db password=*** dbname=flow");
/// ```
pub fn redact_password(url: &str) -> String {
    let url = match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            match userinfo.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..scheme + 3], &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    };
    const KEY: &str = "password=";
    let (lower, bytes) = (url.to_ascii_lowercase(), url.as_bytes());
    let (mut out, mut kept, mut at) = (String::with_capacity(url.len()), 0, 0);
    while let Some(found) = lower[at..].find(KEY) {
        let key = at + found;
        let start = key + KEY.len();
        at = start;
        // A setting of its own: at the start, or after a separator (not `old_password=`).
        if key > 0 && !matches!(bytes[key - 1], b'?' | b'&' | b' ' | b'\t' | b'\n') {
            continue;
        }
        let end = if bytes.get(start) == Some(&b'\'') {
            // Quoted, up to the closing quote that no backslash escapes.
            let mut end = start + 1;
            while end < bytes.len() && !(bytes[end] == b'\'' && bytes[end - 1] != b'\\') {
                end += 1;
            }
            (end + 1).min(bytes.len())
        } else {
            url[start..]
                .find(|c: char| c == '&' || c.is_whitespace())
                .map_or(url.len(), |len| start + len)
        };
        out.push_str(&url[kept..start]);
        out.push_str("***");
        (kept, at) = (end, end);
    }
    out.push_str(&url[kept..]);
    out
}

/// A failed first connection, naming where it went (the URL without its password, or the
/// database); the driver's error stays its source.
#[derive(Debug)]
struct Connecting {
    target: String,
    source: Box<dyn std::error::Error + Send + Sync>,
}

impl std::fmt::Display for Connecting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "cannot connect to {}: {}", self.target, self.source)
    }
}

impl std::error::Error for Connecting {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.source)
    }
}

/// Refuses a server that may lose a commit that returned (see
/// [`PostgresOptions::require_durable_commits`]).
fn check_durability(client: &mut Client) -> Result<(), Error> {
    for (setting, weak) in [("fsync", "off"), ("synchronous_commit", "off")] {
        let value: String = client
            .query_one(&format!("SHOW {setting}"), &[])
            .and_then(|row| row.try_get(0))
            .map_err(storage)?;
        if value == weak {
            return Err(Error::Storage(
                format!(
                    "the server runs with {setting} = {value}: a commit that returned can be lost \
                     in a crash, and with it a command a worker already delivered; set {setting} \
                     back on, or opt in with PostgresOptions::require_durable_commits(false)"
                )
                .into(),
            ));
        }
    }
    Ok(())
}

/// The schema version recorded in `client`'s database (0 when miniflow never migrated it).
fn schema_version(client: &mut impl GenericClient) -> Result<i64, Error> {
    let exists: bool = client
        .query_one("SELECT to_regclass('miniflow_schema') IS NOT NULL", &[])
        .and_then(|row| row.try_get(0))
        .map_err(storage)?;
    if !exists {
        return Ok(0);
    }
    client
        .query_one("SELECT COALESCE(MAX(version), 0) FROM miniflow_schema", &[])
        .and_then(|row| row.try_get(0))
        .map_err(storage)
}

/// Brings the schema to [`SCHEMA_VERSION`]: every missing migration in one transaction, under an
/// advisory lock so that two processes migrating at once apply each migration once. A newer schema
/// is refused untouched.
fn migrate(client: &mut Client) -> Result<(), Error> {
    let unsupported = |found| Error::UnsupportedSchema {
        found,
        supported: SCHEMA_VERSION,
    };
    match schema_version(client)? {
        found if found == SCHEMA_VERSION => return Ok(()),
        found if found > SCHEMA_VERSION => return Err(unsupported(found)),
        _ => {}
    }
    let mut tx = client.transaction().map_err(storage)?;
    tx.execute(
        "SELECT pg_advisory_xact_lock($1, $2)",
        &[&LOCK_CLASS, &MIGRATION_LOCK],
    )
    .map_err(storage)?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS miniflow_schema (
             version    BIGINT PRIMARY KEY,
             applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
         )",
    )
    .map_err(storage)?;
    // Read again under the lock: another process may have migrated meanwhile.
    let found = schema_version(&mut tx)?;
    if found > SCHEMA_VERSION {
        return Err(unsupported(found));
    }
    for (version, sql) in (1_i64..)
        .zip(MIGRATIONS)
        .skip(usize::try_from(found).unwrap_or(0))
    {
        tx.batch_execute(sql).map_err(|e| {
            Error::Storage(format!("schema migration {version} failed: {e}").into())
        })?;
        tx.execute(
            "INSERT INTO miniflow_schema (version) VALUES ($1)",
            &[&version],
        )
        .map_err(storage)?;
    }
    tx.commit().map_err(storage)
}

/// The database's clock, in milliseconds since the Unix epoch.
pub(crate) fn database_now(db: &mut Db<'_, impl GenericClient>) -> Result<Timestamp, Error> {
    let millis: i64 = db
        .query_one(
            "SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint",
            &[],
        )
        .and_then(|row| row.try_get(0))
        .map_err(storage)?;
    u64::try_from(millis)
        .map(Timestamp::from_millis)
        .map_err(|_| Error::Storage(format!("the database's clock reads {millis} ms").into()))
}

/// The times of one operation: `now` in the store's clock (the caller's, or the database's), and the
/// caller's `now`, to translate times between the two.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Clock {
    pub(crate) now: Timestamp,
    caller: Timestamp,
}

impl Clock {
    /// The store's `now` for an operation the caller made at `caller`: the database's clock read on
    /// `client` when the options say so, or `caller` itself.
    pub(crate) fn read(
        options: &PostgresOptions,
        db: &mut Db<'_, impl GenericClient>,
        caller: Timestamp,
    ) -> Result<Self, Error> {
        let now = if options.database_clock {
            database_now(db)?
        } else {
            caller
        };
        Ok(Self { now, caller })
    }

    /// The caller's clock, for an operation at `now` (without [`PostgresOptions::database_clock`]).
    pub(crate) fn caller(now: Timestamp) -> Self {
        Self { now, caller: now }
    }

    /// A time of the caller's clock in the store's.
    pub(crate) fn inward(&self, t: Timestamp) -> Timestamp {
        shift(
            t,
            i128::from(self.now.as_millis()) - i128::from(self.caller.as_millis()),
        )
    }

    /// A time of the store's clock in the caller's.
    pub(crate) fn outward(&self, t: Timestamp) -> Timestamp {
        shift(
            t,
            i128::from(self.caller.as_millis()) - i128::from(self.now.as_millis()),
        )
    }
}

/// `t` moved by `by` milliseconds, within what a timestamp holds: a time past what the database
/// stores stays past it, for `to_sql_time` to refuse rather than to be written as another time.
fn shift(t: Timestamp, by: i128) -> Timestamp {
    let millis = (i128::from(t.as_millis()) + by).clamp(0, i128::from(u64::MAX));
    Timestamp::from_millis(u64::try_from(millis).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_in_messages_hide_the_password() {
        for (url, shown) in [
            (
                "postgresql://app:s3cret@db:5432/flow",
                "postgresql://app:***@db:5432/flow",
            ),
            ("postgresql://app@db/flow", "postgresql://app@db/flow"),
            ("host=db user=app", "host=db user=app"),
            (
                "postgresql://app@db/flow?password=s3cret",
                "postgresql://app@db/flow?password=***",
            ),
            (
                "postgresql://app@db/flow?sslmode=disable&PASSWORD=s3cret&port=abc",
                "postgresql://app@db/flow?sslmode=disable&PASSWORD=***&port=abc",
            ),
            (
                "host=db user=app password=s3cret dbname=flow",
                "host=db user=app password=*** dbname=flow",
            ),
            ("password='it\\'s secret' host=db", "password=*** host=db"),
            ("host=db password=", "host=db password=***"),
            ("host=db old_password=x", "host=db old_password=x"),
        ] {
            assert_eq!(redact_password(url), shown, "{url}");
            assert!(!redact_password(url).contains("s3cret"), "{url}");
        }
    }

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
    }

    #[test]
    fn clocks_translate_both_ways() {
        let clock = Clock {
            now: Timestamp::from_millis(10_000),
            caller: Timestamp::from_millis(4_000),
        };
        assert_eq!(
            clock.inward(Timestamp::from_millis(5_000)).as_millis(),
            11_000
        );
        assert_eq!(
            clock.outward(Timestamp::from_millis(11_000)).as_millis(),
            5_000
        );
        assert_eq!(clock.outward(Timestamp::from_millis(1_000)).as_millis(), 0);
    }
}
