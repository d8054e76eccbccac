//! Pooled connections with the statements prepared on them: each of miniflow's statements is parsed
//! and planned once per connection, and every later use is one round trip (bind + execute).

use std::collections::HashMap;
use std::ops::DerefMut;

use postgres::error::SqlState;
use postgres::types::ToSql;
use postgres::{Client, GenericClient, Row, Statement, Transaction};

use crate::errors::storage;
use miniflow_core::Error;

/// A connection of the pool: the client and the statements prepared on it.
pub(crate) struct Connection {
    pub(crate) client: Client,
    pub(crate) statements: Statements,
    /// When it was last given back to the pool (or opened): how long it has been idle.
    pub(crate) idle_since: std::time::Instant,
}

impl Connection {
    pub(crate) fn new(client: Client) -> Self {
        Self {
            client,
            statements: Statements::default(),
            idle_since: std::time::Instant::now(),
        }
    }

    /// The connection outside any transaction: each statement is a transaction of its own.
    pub(crate) fn db(&mut self) -> Db<'_, Client> {
        Db::new(&mut self.client, &mut self.statements)
    }

    /// Runs `work` in one `READ COMMITTED` transaction (whatever the server's default), committed
    /// when it succeeds and rolled back when it fails.
    pub(crate) fn in_transaction<T, E: From<Error>>(
        &mut self,
        work: impl FnOnce(&mut Db<'_, Transaction<'_>>) -> Result<T, E>,
    ) -> Result<T, E> {
        let mut tx = self
            .client
            .build_transaction()
            .isolation_level(postgres::IsolationLevel::ReadCommitted)
            .start()
            .map_err(storage)?;
        let out = work(&mut Db::new(&mut tx, &mut self.statements))?;
        tx.commit().map_err(storage)?;
        Ok(out)
    }

    /// Runs the reads of `work` in one `REPEATABLE READ, READ ONLY` transaction: every statement
    /// sees the same snapshot, and nothing can be written.
    pub(crate) fn in_snapshot<T, E: From<Error>>(
        &mut self,
        work: impl FnOnce(&mut Db<'_, Transaction<'_>>) -> Result<T, E>,
    ) -> Result<T, E> {
        let mut tx = self
            .client
            .build_transaction()
            .isolation_level(postgres::IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .map_err(storage)?;
        let out = work(&mut Db::new(&mut tx, &mut self.statements))?;
        tx.commit().map_err(storage)?;
        Ok(out)
    }
}

/// The statements prepared on one connection, by their SQL.
#[derive(Default)]
pub(crate) struct Statements {
    prepared: HashMap<&'static str, Statement>,
}

impl Statements {
    /// After an error that says the server no longer has a statement this cache holds (someone ran
    /// `DEALLOCATE` or `DISCARD` on the connection) or that a cached plan went stale (a column changed
    /// type), forgets them all: the next operation prepares afresh.
    fn forget_after(&mut self, e: &postgres::Error) {
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

/// A client (a connection, a transaction or a savepoint) with the statement cache of its connection.
pub(crate) struct Db<'a, C> {
    client: &'a mut C,
    statements: &'a mut Statements,
}

impl<'a, C: GenericClient> Db<'a, C> {
    pub(crate) fn new(client: &'a mut C, statements: &'a mut Statements) -> Self {
        Self { client, statements }
    }

    /// A savepoint inside this transaction, sharing the cache.
    pub(crate) fn savepoint(&mut self) -> Result<(Transaction<'_>, &mut Statements), Error> {
        let savepoint = self.client.transaction().map_err(storage)?;
        Ok((savepoint, &mut *self.statements))
    }

    fn statement(&mut self, sql: &'static str) -> Result<Statement, postgres::Error> {
        if let Some(statement) = self.statements.prepared.get(sql) {
            return Ok(statement.clone());
        }
        let statement = self.client.prepare(sql)?;
        self.statements.prepared.insert(sql, statement.clone());
        Ok(statement)
    }

    fn checked<T>(&mut self, result: Result<T, postgres::Error>) -> Result<T, postgres::Error> {
        if let Err(e) = &result {
            self.statements.forget_after(e);
        }
        result
    }

    pub(crate) fn query(
        &mut self,
        sql: &'static str,
        params: &Params<'_>,
    ) -> Result<Vec<Row>, postgres::Error> {
        let result = self
            .statement(sql)
            .and_then(|statement| self.client.query(&statement, params));
        self.checked(result)
    }

    pub(crate) fn query_one(
        &mut self,
        sql: &'static str,
        params: &Params<'_>,
    ) -> Result<Row, postgres::Error> {
        let result = self
            .statement(sql)
            .and_then(|statement| self.client.query_one(&statement, params));
        self.checked(result)
    }

    pub(crate) fn query_opt(
        &mut self,
        sql: &'static str,
        params: &Params<'_>,
    ) -> Result<Option<Row>, postgres::Error> {
        let result = self
            .statement(sql)
            .and_then(|statement| self.client.query_opt(&statement, params));
        self.checked(result)
    }

    pub(crate) fn execute(
        &mut self,
        sql: &'static str,
        params: &Params<'_>,
    ) -> Result<u64, postgres::Error> {
        let result = self
            .statement(sql)
            .and_then(|statement| self.client.execute(&statement, params));
        self.checked(result)
    }
}

/// A connection of the pool with its prepared statements, checked out; it goes back when dropped.
pub(crate) type Pooled = Box<dyn DerefMut<Target = Connection> + Send>;

/// Where connections come from, whatever TLS connector the pool was built with.
pub(crate) trait Connections: Send + Sync {
    fn get(&self) -> Result<Pooled, Error>;
    fn dedicated(&self) -> Result<Client, Error>;
}
