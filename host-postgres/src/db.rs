//! Pooled connections with the statements prepared on them: each of miniflow's statements is parsed
//! and planned once per connection, and every later use is one round trip (bind + execute).

use std::collections::HashMap;
use std::future::Future;
use std::ops::DerefMut;
use std::task::{Context, Poll, Waker};

use postgres::error::SqlState;
use postgres::types::{FromSql, ToSql};
use postgres::{Client, GenericClient, Row, Statement};

use crate::errors::{storage, DbError};
use miniflow_core::Error;

/// A connection of the pool: the client and the statements prepared on it.
pub(crate) struct Connection {
    pub(crate) client: Client,
    pub(crate) statements: Statements,
    /// When it was last given back to the pool (or opened): how long it has been idle.
    pub(crate) idle_since: std::time::Instant,
    /// A transaction of the store's is open on it (see [`Session`]): set before `BEGIN` is sent,
    /// cleared once `COMMIT` or `ROLLBACK` has been answered. A connection given back with it set (an
    /// operation that panicked) is broken: the pool closes it, which rolls the transaction back.
    pub(crate) in_transaction: bool,
}

impl Connection {
    pub(crate) fn new(client: Client) -> Self {
        Self {
            client,
            statements: Statements::default(),
            idle_since: std::time::Instant::now(),
            in_transaction: false,
        }
    }

    /// The connection with its statement cache, as the store's operations take it.
    pub(crate) fn db(&mut self) -> Db<'_, Client> {
        Db::new(
            &mut self.client,
            &mut self.statements,
            Some(&mut self.in_transaction),
        )
    }
}

/// The statements prepared on one connection, by their SQL.
#[derive(Default)]
pub(crate) struct Statements {
    prepared: HashMap<&'static str, Statement>,
}

impl Statements {
    /// The statement prepared for `sql`, if it was.
    #[cfg(feature = "tokio")]
    pub(crate) fn get(&self, sql: &'static str) -> Option<Statement> {
        self.prepared.get(sql).cloned()
    }

    /// Keeps `statement`, prepared for `sql`.
    #[cfg(feature = "tokio")]
    pub(crate) fn insert(&mut self, sql: &'static str, statement: Statement) {
        self.prepared.insert(sql, statement);
    }

    /// After an error that says the server no longer has a statement this cache holds (someone ran
    /// `DEALLOCATE` or `DISCARD` on the connection) or that a cached plan went stale (a column changed
    /// type), forgets them all: the next operation prepares afresh.
    pub(crate) fn forget_after(&mut self, e: &postgres::Error) {
        let stale = e.as_db_error().is_some_and(|db| {
            *db.code() == SqlState::INVALID_SQL_STATEMENT_NAME
                || (*db.code() == SqlState::FEATURE_NOT_SUPPORTED
                    && db.message().contains("cached plan"))
        });
        if stale {
            self.prepared.clear();
        }
    }
}

/// SQL parameters.
pub(crate) type Params<'a> = [&'a (dyn ToSql + Sync)];

/// A synchronous client (a connection of the pool, or a caller's transaction) with the statement
/// cache of its connection: the [`Exec`] of the synchronous store, whose every statement is
/// answered before its future is first polled (see [`block`]).
pub(crate) struct Db<'a, C> {
    client: &'a mut C,
    statements: &'a mut Statements,
    /// The pool's connection's flag (see [`Connection::in_transaction`]); `None` on a caller's
    /// transaction, which the store never begins or ends.
    in_transaction: Option<&'a mut bool>,
}

impl<'a, C: GenericClient> Db<'a, C> {
    pub(crate) fn new(
        client: &'a mut C,
        statements: &'a mut Statements,
        in_transaction: Option<&'a mut bool>,
    ) -> Self {
        Self {
            client,
            statements,
            in_transaction,
        }
    }

    fn statement(&mut self, sql: &'static str) -> Result<Statement, postgres::Error> {
        if let Some(statement) = self.statements.prepared.get(sql) {
            return Ok(statement.clone());
        }
        let statement = self.client.prepare(sql)?;
        self.statements.prepared.insert(sql, statement.clone());
        Ok(statement)
    }

    fn checked<T>(&mut self, result: Result<T, postgres::Error>) -> Result<T, DbError> {
        if let Err(e) = &result {
            self.statements.forget_after(e);
        }
        result.map_err(DbError::from)
    }
}

impl<C: GenericClient + Send> Exec for Db<'_, C> {
    type Row = Row;

    async fn query(&mut self, sql: &'static str, params: &Params<'_>) -> Result<Vec<Row>, DbError> {
        let result = self
            .statement(sql)
            .and_then(|statement| self.client.query(&statement, params));
        self.checked(result)
    }

    async fn query_one(&mut self, sql: &'static str, params: &Params<'_>) -> Result<Row, DbError> {
        let result = self
            .statement(sql)
            .and_then(|statement| self.client.query_one(&statement, params));
        self.checked(result)
    }

    async fn query_opt(
        &mut self,
        sql: &'static str,
        params: &Params<'_>,
    ) -> Result<Option<Row>, DbError> {
        let result = self
            .statement(sql)
            .and_then(|statement| self.client.query_opt(&statement, params));
        self.checked(result)
    }

    async fn execute(&mut self, sql: &'static str, params: &Params<'_>) -> Result<u64, DbError> {
        let result = self
            .statement(sql)
            .and_then(|statement| self.client.execute(&statement, params));
        self.checked(result)
    }

    async fn batch(&mut self, sql: &str) -> Result<(), DbError> {
        self.client.batch_execute(sql).map_err(DbError::from)
    }

    fn set_in_transaction(&mut self, open: bool) -> bool {
        match &mut self.in_transaction {
            Some(flag) => {
                **flag = open;
                true
            }
            None => false,
        }
    }
}

/// A client the store's operations run their statements on: a connection of the synchronous
/// store's pool ([`Db`]), of the async store's, or the caller's own transaction (tokio-postgres's
/// or sqlx's). The SQL and the rules are the operations'; a client only runs statements, each
/// prepared once per connection where it can cache them.
pub(crate) trait Exec: Send {
    /// A row it returns.
    type Row: Columns + Send + Sync;

    /// The rows `sql` returns with `params`.
    fn query(
        &mut self,
        sql: &'static str,
        params: &Params<'_>,
    ) -> impl Future<Output = Result<Vec<Self::Row>, DbError>> + Send;

    /// How many rows `sql` changed with `params`.
    fn execute(
        &mut self,
        sql: &'static str,
        params: &Params<'_>,
    ) -> impl Future<Output = Result<u64, DbError>> + Send;

    /// Statements without parameters, in one round trip (`BEGIN`, `SAVEPOINT`, migrations).
    fn batch(&mut self, sql: &str) -> impl Future<Output = Result<(), DbError>> + Send;

    /// Marks whether a transaction the store began is open on this client's connection; `false`
    /// when the client is not one of the store's connections (a caller's transaction).
    fn set_in_transaction(&mut self, open: bool) -> bool;

    /// The one row `sql` returns (an error for none or more).
    fn query_one(
        &mut self,
        sql: &'static str,
        params: &Params<'_>,
    ) -> impl Future<Output = Result<Self::Row, DbError>> + Send {
        async move {
            let mut rows = self.query(sql, params).await?;
            match rows.len() {
                1 => Ok(rows.remove(0)),
                n => Err(DbError::Value(format!("expected one row, got {n}"))),
            }
        }
    }

    /// The row `sql` returns, if any (an error for more than one).
    fn query_opt(
        &mut self,
        sql: &'static str,
        params: &Params<'_>,
    ) -> impl Future<Output = Result<Option<Self::Row>, DbError>> + Send {
        async move {
            let mut rows = self.query(sql, params).await?;
            match rows.len() {
                0 => Ok(None),
                1 => Ok(rows.pop()),
                n => Err(DbError::Value(format!("expected at most one row, got {n}"))),
            }
        }
    }
}

/// A client of the store's own (a connection of its pools), whose rows are tokio-postgres's.
pub(crate) trait Own: Exec<Row = Row> {}

impl<E: Exec<Row = Row>> Own for E {}

/// The columns of a row, read by position or by name as the type the caller asks for.
pub(crate) trait Columns {
    /// The value of column `index` as a `T`.
    fn try_get<'a, I: ColumnIndex, T: FromSql<'a>>(&'a self, index: I) -> Result<T, DbError>;

    /// The name of column `at`, if there is one.
    fn column_name(&self, at: usize) -> Option<&str>;
}

impl Columns for Row {
    fn try_get<'a, I: ColumnIndex, T: FromSql<'a>>(&'a self, index: I) -> Result<T, DbError> {
        index.get(self).map_err(DbError::from)
    }

    fn column_name(&self, at: usize) -> Option<&str> {
        self.columns().get(at).map(postgres::Column::name)
    }
}

/// A column's position or name.
pub(crate) trait ColumnIndex: Copy + std::fmt::Display {
    /// The value at this index of a tokio-postgres row.
    fn get<'a, T: FromSql<'a>>(self, row: &'a Row) -> Result<T, postgres::Error>;
    /// The position of this index among the columns named `names` (a caller's sqlx rows).
    #[cfg_attr(not(feature = "sqlx"), allow(dead_code))]
    fn position<'n>(self, names: impl Iterator<Item = &'n str>) -> Option<usize>;
}

impl ColumnIndex for usize {
    fn get<'a, T: FromSql<'a>>(self, row: &'a Row) -> Result<T, postgres::Error> {
        row.try_get(self)
    }
    fn position<'n>(self, mut names: impl Iterator<Item = &'n str>) -> Option<usize> {
        names.nth(self).map(|_| self)
    }
}

impl ColumnIndex for &str {
    fn get<'a, T: FromSql<'a>>(self, row: &'a Row) -> Result<T, postgres::Error> {
        row.try_get(self)
    }
    fn position<'n>(self, mut names: impl Iterator<Item = &'n str>) -> Option<usize> {
        names.position(|name| name == self)
    }
}

/// How a transaction of the store's begins.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Isolation {
    /// `READ COMMITTED`: every write of the store.
    ReadCommitted,
    /// `REPEATABLE READ, READ ONLY`: reads that must see one snapshot.
    Snapshot,
}

/// Begins a transaction of the store's on `db`, one of its connections.
pub(crate) async fn begin(db: &mut impl Exec, isolation: Isolation) -> Result<(), Error> {
    db.set_in_transaction(true);
    db.batch(match isolation {
        Isolation::ReadCommitted => "BEGIN ISOLATION LEVEL READ COMMITTED",
        Isolation::Snapshot => "BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY",
    })
    .await
    .map_err(storage)
}

/// Ends the transaction [`begin`] began: commits it when `out` is a success (a failed commit is
/// the error then), rolls it back otherwise. Either way the connection is out of the transaction
/// once the server answered; a connection whose `ROLLBACK` was not answered stays marked and is
/// not reused.
pub(crate) async fn end<T, E: From<Error>>(db: &mut impl Exec, out: Result<T, E>) -> Result<T, E> {
    match out {
        Ok(value) => {
            db.batch("COMMIT").await.map_err(storage)?;
            db.set_in_transaction(false);
            Ok(value)
        }
        Err(e) => {
            if db.batch("ROLLBACK").await.is_ok() {
                db.set_in_transaction(false);
            }
            Err(e)
        }
    }
}

/// Runs `$body` (an `async` block's statements, ending in a `Result`) in one transaction of the
/// store's on `$db`: committed when it succeeds, rolled back when it fails.
macro_rules! transaction {
    ($db:ident, $isolation:expr, $body:block) => {{
        $crate::db::begin($db, $isolation).await?;
        let out = async { $body }.await;
        $crate::db::end($db, out).await
    }};
}
pub(crate) use transaction;

/// Runs `$body` (an `async` block's statements, ending in a `Result<_, Error>`) in a savepoint of
/// the caller's transaction on `$db`: released when it succeeds, rolled back when it fails, so a
/// failed body leaves nothing in the caller's transaction and does not leave it aborted.
macro_rules! savepoint {
    ($db:ident, $body:block) => {{
        $crate::db::Exec::batch($db, "SAVEPOINT miniflow")
            .await
            .map_err($crate::errors::storage)?;
        let out = async { $body }.await;
        let undo = if out.is_ok() {
            "RELEASE SAVEPOINT miniflow"
        } else {
            "ROLLBACK TO SAVEPOINT miniflow; RELEASE SAVEPOINT miniflow"
        };
        $crate::db::Exec::batch($db, undo)
            .await
            .map_err($crate::errors::storage)?;
        out
    }};
}
pub(crate) use savepoint;

/// Puts the store's schema ([`crate::PostgresOptions::schema`]), if it has one, at the head of the
/// caller's transaction's `search_path` for the rest of that transaction; returns the path it had,
/// for [`leave_schema`]. Nothing without a schema.
pub(crate) async fn enter_schema(
    db: &mut impl Exec,
    options: &crate::PostgresOptions,
) -> Result<Option<String>, Error> {
    let Some(schema) = options.schema_name() else {
        return Ok(None);
    };
    // The old path read first (a materialised CTE), then the new one set, local to the transaction.
    let row = db
        .query_one(
            "WITH o AS MATERIALIZED (SELECT current_setting('search_path') AS path) \
             SELECT o.path, set_config('search_path', $1 || ', ' || o.path, true) FROM o",
            &[&schema],
        )
        .await
        .map_err(storage)?;
    Columns::try_get(&row, 0).map(Some).map_err(storage)
}

/// Gives the caller's transaction back the `search_path` [`enter_schema`] found.
pub(crate) async fn leave_schema(db: &mut impl Exec, old: Option<String>) -> Result<(), Error> {
    let Some(old) = old else {
        return Ok(());
    };
    db.query_one("SELECT set_config('search_path', $1, true)", &[&old])
        .await
        .map(drop)
        .map_err(storage)
}

/// Runs `$body` (an `async` block's statements, ending in a `Result<_, Error>`) on the caller's
/// transaction `$db` with the store's schema leading its `search_path`, and gives the transaction
/// its path back after — whatever `$body` returned. The body's error wins over the restore's.
macro_rules! in_schema {
    ($db:ident, $options:expr, $body:block) => {{
        let old = $crate::db::enter_schema($db, $options).await?;
        let out = async { $body }.await;
        let left = $crate::db::leave_schema($db, old).await;
        match (out, left) {
            (Ok(_), Err(e)) => Err(e.into()),
            (out, _) => out,
        }
    }};
}
pub(crate) use in_schema;

/// Runs a future of the store's operations on a synchronous client ([`Db`]), whose statements are
/// all answered before the future is first polled: it completes in one poll. (Polled again should
/// it ever not, it would still complete.)
pub(crate) fn block<F: Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    let mut context = Context::from_waker(Waker::noop());
    loop {
        if let Poll::Ready(out) = future.as_mut().poll(&mut context) {
            return out;
        }
        std::thread::yield_now();
    }
}

/// A connection of the pool with its prepared statements, checked out; it goes back when dropped.
pub(crate) type Pooled = Box<dyn DerefMut<Target = Connection> + Send>;

/// Where connections come from, whatever TLS connector the pool was built with.
pub(crate) trait Connections: Send + Sync {
    fn get(&self) -> Result<Pooled, Error>;
    fn dedicated(&self) -> Result<Client, Error>;
}
