//! Connecting a store: the pool every handle shares, the checks made before it is used, and the
//! connection string's password kept out of every message.

use std::sync::Arc;

use miniflow_core::backend::HistoryId;
use miniflow_core::Error;
use postgres::tls::{MakeTlsConnect, TlsConnect};
use postgres::{Client, Config, NoTls, Socket};

use crate::db::{block, Connections, Db, Pooled, Statements};
use crate::errors::{storage, DriverError};
use crate::migrations::{migrate, prepare, schema_version, Track};
use crate::notifier::Notifier;
use crate::options::PostgresOptions;
use crate::pool::{ClientOf, Manager, Pool, PooledClient};
use r2d2_postgres::PostgresConnectionManager;

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
    /// A pool on `url` without TLS, for a store that needs `track`'s tables.
    pub(crate) fn connect(
        url: &str,
        options: &PostgresOptions,
        track: Track,
    ) -> Result<Self, Error> {
        Self::open(
            parse_url(url)?,
            NoTls,
            options,
            track,
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
        Self::open(config, tls, options, Track::Outbox, ("database", database))
    }

    /// A pool on `config` through `tls`, on a database [`prepare`]d for `track`. `target` names the
    /// database in errors (`("url", the URL without its password)`).
    fn open<T>(
        mut config: Config,
        tls: T,
        options: &PostgresOptions,
        track: Track,
        target: (&'static str, String),
    ) -> Result<Self, Error>
    where
        T: MakeTlsConnect<Socket> + Clone + Send + Sync + 'static,
        T::TlsConnect: Send,
        T::Stream: Send,
        <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
    {
        options.validate()?;
        config.options(&startup_options(config.get_options(), options));
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
        let mut statements = Statements::default();
        let mut db = Db::new(&mut client, &mut statements, None);
        block(prepare(&mut db, options, track, target))?;
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

    /// Raises the wake-up hint once the caller's transaction `xid` commits (see
    /// [`Notifier::raise_after`]).
    pub(crate) fn hint_after(&self, xid: i64) {
        if self.options.notify && !self.options.read_only {
            self.notifier.raise_after(xid);
        }
    }

    /// A connection of its own, outside the pool (for a listener).
    pub(crate) fn dedicated(&self) -> Result<Client, Error> {
        self.connections.dedicated()
    }
}

/// The startup options of every connection of a store, after the caller's own (`existing`): its
/// transactions run at `READ COMMITTED` whatever the server's default (each of the store's
/// operations is written for it), and with [`PostgresOptions::read_only`] it is a read-only
/// session from its first statement on.
pub(crate) fn startup_options(existing: Option<&str>, options: &PostgresOptions) -> String {
    let mut startup = format!(
        "{} -c default_transaction_isolation=read\\ committed",
        existing.unwrap_or_default()
    );
    if options.read_only {
        startup.push_str(" -c default_transaction_read_only=on");
    }
    if let Some(schema) = options.schema_name() {
        // A validated identifier: nothing to quote or escape.
        startup.push_str(&format!(" -c search_path={schema},public"));
    }
    startup.trim_start().to_owned()
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
    let mut statements = Statements::default();
    let mut db = Db::new(&mut client, &mut statements, None);
    let found = block(schema_version(&mut db, None))?;
    block(migrate(&mut db, None, Track::Outbox))?;
    Ok(found)
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
pub(crate) struct Connecting {
    pub(crate) target: String,
    pub(crate) source: Box<dyn std::error::Error + Send + Sync>,
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
}
