//! The async store's connections: a `deadpool` pool of tokio-postgres clients, each with its
//! statement cache (the synchronous store's [`Statements`]), and the [`Exec`] of such a client and
//! of the caller's own transaction.

use std::time::{Duration, Instant};

use deadpool::managed::{self, Metrics, RecycleError, RecycleResult};
use miniflow_core::Error;
use postgres::Row;
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::{Client, Config, Socket};

use crate::db::{Exec, Params, Statements};
use crate::errors::{storage, DbError};

/// How long a pooled connection may have been idle and still be handed out untested (as the
/// synchronous pool's).
const TRUSTED_IDLE: Duration = Duration::from_secs(1);

/// A connection of the async pool.
pub(crate) struct AsyncConnection {
    client: Client,
    statements: Statements,
    /// As [`crate::db::Connection::in_transaction`]: a connection given back inside a transaction of
    /// the store's (its operation's future was dropped, or panicked) is closed, which rolls it back.
    in_transaction: bool,
    idle_since: Instant,
}

impl AsyncConnection {
    /// A connection on `client`, with an empty statement cache.
    pub(crate) fn new(client: Client, statements: Statements) -> Self {
        Self {
            client,
            statements,
            in_transaction: false,
            idle_since: Instant::now(),
        }
    }

    /// The connection as the store's operations take it.
    pub(crate) fn db(&mut self) -> AsyncDb<'_> {
        AsyncDb {
            client: &self.client,
            statements: &mut self.statements,
            in_transaction: &mut self.in_transaction,
        }
    }

    /// Whether the connection is inside a transaction of the store's.
    pub(crate) fn in_transaction(&self) -> bool {
        self.in_transaction
    }

    /// The driver's client, for the caller (see [`super::AsyncPostgresStore::client`]).
    pub(crate) fn client(&self) -> &Client {
        &self.client
    }

    /// As [`AsyncConnection::client`], to begin the caller's transactions on.
    pub(crate) fn client_mut(&mut self) -> &mut Client {
        &mut self.client
    }
}

/// Opens and recycles the async pool's connections.
pub(crate) struct Manager<T> {
    pub(crate) config: Config,
    pub(crate) tls: T,
}

impl<T> managed::Manager for Manager<T>
where
    T: MakeTlsConnect<Socket> + Clone + Send + Sync + 'static,
    T::Stream: Send + Sync + 'static,
    T::TlsConnect: Send + Sync,
    <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
{
    type Type = AsyncConnection;
    type Error = tokio_postgres::Error;

    async fn create(&self) -> Result<AsyncConnection, tokio_postgres::Error> {
        let client = connect(&self.config, self.tls.clone()).await?;
        Ok(AsyncConnection::new(client, Statements::default()))
    }

    /// A connection still inside a transaction, or closed, is not reused; one idle for a while is
    /// asked first (the server may have closed it meanwhile).
    async fn recycle(
        &self,
        connection: &mut AsyncConnection,
        _: &Metrics,
    ) -> RecycleResult<tokio_postgres::Error> {
        if connection.in_transaction {
            return Err(RecycleError::message(
                "given back inside a transaction: closed, which rolls it back",
            ));
        }
        if connection.client.is_closed() {
            return Err(RecycleError::message("closed"));
        }
        if connection.idle_since.elapsed() >= TRUSTED_IDLE {
            connection.client.simple_query("").await?;
        }
        connection.idle_since = Instant::now();
        Ok(())
    }
}

/// Opens a client on `config` and runs its connection as a task of the caller's runtime.
pub(crate) async fn connect<T>(config: &Config, tls: T) -> Result<Client, tokio_postgres::Error>
where
    T: MakeTlsConnect<Socket> + Send + 'static,
    T::Stream: Send + 'static,
    T::TlsConnect: Send,
    <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
{
    let (client, connection) = config.connect(tls).await?;
    // The connection ends when the client is dropped or the server goes; its error, if any, is
    // the next statement's on the client.
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

/// A pooled async connection as the operations take it: its client, its statement cache and its
/// transaction flag.
pub(crate) struct AsyncDb<'a> {
    client: &'a Client,
    statements: &'a mut Statements,
    in_transaction: &'a mut bool,
}

impl AsyncDb<'_> {
    async fn statement(
        &mut self,
        sql: &'static str,
    ) -> Result<tokio_postgres::Statement, tokio_postgres::Error> {
        if let Some(statement) = self.statements.get(sql) {
            return Ok(statement);
        }
        let statement = self.client.prepare(sql).await?;
        self.statements.insert(sql, statement.clone());
        Ok(statement)
    }

    fn checked<T>(&mut self, result: Result<T, tokio_postgres::Error>) -> Result<T, DbError> {
        if let Err(e) = &result {
            self.statements.forget_after(e);
        }
        result.map_err(DbError::from)
    }
}

impl Exec for AsyncDb<'_> {
    type Row = Row;

    async fn query(&mut self, sql: &'static str, params: &Params<'_>) -> Result<Vec<Row>, DbError> {
        let result = match self.statement(sql).await {
            Ok(statement) => self.client.query(&statement, params).await,
            Err(e) => Err(e),
        };
        self.checked(result)
    }

    async fn query_one(&mut self, sql: &'static str, params: &Params<'_>) -> Result<Row, DbError> {
        let result = match self.statement(sql).await {
            Ok(statement) => self.client.query_one(&statement, params).await,
            Err(e) => Err(e),
        };
        self.checked(result)
    }

    async fn query_opt(
        &mut self,
        sql: &'static str,
        params: &Params<'_>,
    ) -> Result<Option<Row>, DbError> {
        let result = match self.statement(sql).await {
            Ok(statement) => self.client.query_opt(&statement, params).await,
            Err(e) => Err(e),
        };
        self.checked(result)
    }

    async fn execute(&mut self, sql: &'static str, params: &Params<'_>) -> Result<u64, DbError> {
        let result = match self.statement(sql).await {
            Ok(statement) => self.client.execute(&statement, params).await,
            Err(e) => Err(e),
        };
        self.checked(result)
    }

    async fn batch(&mut self, sql: &str) -> Result<(), DbError> {
        self.client.batch_execute(sql).await.map_err(DbError::from)
    }

    fn set_in_transaction(&mut self, open: bool) -> bool {
        *self.in_transaction = open;
        true
    }
}

/// Maps a pool error onto miniflow's kinds: a server that cannot be reached (or not within the
/// timeout) is [`Error::Storage`].
pub(crate) fn pool_error(e: managed::PoolError<tokio_postgres::Error>) -> Error {
    match e {
        managed::PoolError::Backend(e) => storage(e),
        other => Error::Storage(format!("no PostgreSQL connection: {other}").into()),
    }
}
