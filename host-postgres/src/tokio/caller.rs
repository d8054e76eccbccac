//! The caller's own transaction, whichever driver opened it: miniflow's statements run in it, and it
//! never commits it, rolls it back or retries inside it.

use postgres::types::{FromSql, Type};
use postgres::Row;

use crate::db::{ColumnIndex, Columns, Exec, Params};
use crate::errors::DbError;

/// A transaction the service opened, which miniflow's rows join: the async store's
/// [`append_in`](super::AsyncPostgresStore::append_in), [`handle_in`](super::AsyncPostgresStore::handle_in)
/// and [`start_in`](super::AsyncPostgresStore::start_in), and the receiver's
/// [`begin_in`](super::AsyncPostgresIdempotencyStore::begin_in) and
/// [`finish_in`](super::AsyncPostgresIdempotencyStore::finish_in) take one.
///
/// Made from what a service holds, so a call reads `store.append_in(&tx, …)` or, on sqlx,
/// `store.append_in(&mut *tx, …)`:
/// - a tokio-postgres transaction: `&tokio_postgres::Transaction<'_>`;
/// - with the `sqlx` feature, a sqlx transaction on PostgreSQL: `&mut *tx` of a
///   `sqlx::Transaction<'_, Postgres>` (a `&mut sqlx::PgConnection` inside a transaction), or
///   `&mut tx` itself.
///
/// miniflow's part runs in a savepoint of it: an error (a lost race on a workflow among them)
/// leaves nothing of miniflow's in it and does not leave it aborted. A connection that is not in a
/// transaction is refused by the server (`SAVEPOINT can only be used in transaction blocks`).
pub struct CallerTransaction<'a>(Driver<'a>);

enum Driver<'a> {
    TokioPostgres(&'a tokio_postgres::Transaction<'a>),
    #[cfg(feature = "sqlx")]
    Sqlx(&'a mut sqlx::PgConnection),
}

impl<'a> From<&'a tokio_postgres::Transaction<'_>> for CallerTransaction<'a> {
    fn from(tx: &'a tokio_postgres::Transaction<'_>) -> Self {
        Self(Driver::TokioPostgres(shorten(tx)))
    }
}

/// A transaction borrowed for `'a` whose own lifetime is shortened to `'a` (it is covariant).
fn shorten<'a, 't: 'a>(
    tx: &'a tokio_postgres::Transaction<'t>,
) -> &'a tokio_postgres::Transaction<'a> {
    tx
}

#[cfg(feature = "sqlx")]
impl<'a> From<&'a mut sqlx::PgConnection> for CallerTransaction<'a> {
    fn from(connection: &'a mut sqlx::PgConnection) -> Self {
        Self(Driver::Sqlx(connection))
    }
}

#[cfg(feature = "sqlx")]
impl<'a> From<&'a mut sqlx::Transaction<'_, sqlx::Postgres>> for CallerTransaction<'a> {
    fn from(tx: &'a mut sqlx::Transaction<'_, sqlx::Postgres>) -> Self {
        Self(Driver::Sqlx(tx))
    }
}

impl std::fmt::Debug for CallerTransaction<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let driver = match &self.0 {
            Driver::TokioPostgres(_) => "tokio-postgres",
            #[cfg(feature = "sqlx")]
            Driver::Sqlx(_) => "sqlx",
        };
        f.debug_tuple("CallerTransaction").field(&driver).finish()
    }
}

/// A row of the caller's transaction: tokio-postgres's own, or one read from sqlx's wire values.
pub(crate) enum CallerRow {
    TokioPostgres(Row),
    #[cfg_attr(not(feature = "sqlx"), allow(dead_code))]
    Wire(WireRow),
}

impl Columns for CallerRow {
    fn try_get<'a, I: ColumnIndex, T: FromSql<'a>>(&'a self, index: I) -> Result<T, DbError> {
        match self {
            Self::TokioPostgres(row) => Columns::try_get(row, index),
            Self::Wire(row) => row.try_get(index),
        }
    }

    fn column_name(&self, at: usize) -> Option<&str> {
        match self {
            Self::TokioPostgres(row) => Columns::column_name(row, at),
            Self::Wire(row) => row.columns.get(at).map(|(name, _, _)| name.as_str()),
        }
    }
}

/// A row as the server sent it: each column's name, type and value in PostgreSQL's binary format,
/// decoded by the same codecs (`postgres-types`) as the store's own rows.
#[cfg_attr(not(feature = "sqlx"), allow(dead_code))]
pub(crate) struct WireRow {
    columns: Vec<(String, Type, Option<Vec<u8>>)>,
}

impl WireRow {
    fn try_get<'a, I: ColumnIndex, T: FromSql<'a>>(&'a self, index: I) -> Result<T, DbError> {
        let names = self.columns.iter().map(|(name, _, _)| name.as_str());
        let (name, ty, value) = index
            .position(names)
            .and_then(|at| self.columns.get(at))
            .ok_or_else(|| DbError::Value(format!("no column {index} in the row")))?;
        if !T::accepts(ty) {
            return Err(DbError::Value(format!(
                "column {name} of type {ty} cannot be read as {}",
                std::any::type_name::<T>()
            )));
        }
        T::from_sql_nullable(ty, value.as_deref())
            .map_err(|e| DbError::Value(format!("column {name} of type {ty}: {e}")))
    }
}

impl Exec for CallerTransaction<'_> {
    type Row = CallerRow;

    async fn query(
        &mut self,
        sql: &'static str,
        params: &Params<'_>,
    ) -> Result<Vec<CallerRow>, DbError> {
        match &mut self.0 {
            Driver::TokioPostgres(tx) => Ok(tx
                .query(sql, params)
                .await?
                .into_iter()
                .map(CallerRow::TokioPostgres)
                .collect()),
            #[cfg(feature = "sqlx")]
            Driver::Sqlx(connection) => Ok(sqlx_driver::query(connection, sql, params)
                .await?
                .into_iter()
                .map(CallerRow::Wire)
                .collect()),
        }
    }

    async fn execute(&mut self, sql: &'static str, params: &Params<'_>) -> Result<u64, DbError> {
        match &mut self.0 {
            Driver::TokioPostgres(tx) => Ok(tx.execute(sql, params).await?),
            #[cfg(feature = "sqlx")]
            Driver::Sqlx(connection) => sqlx_driver::execute(connection, sql, params).await,
        }
    }

    async fn batch(&mut self, sql: &str) -> Result<(), DbError> {
        match &mut self.0 {
            Driver::TokioPostgres(tx) => Ok(tx.batch_execute(sql).await?),
            #[cfg(feature = "sqlx")]
            Driver::Sqlx(connection) => sqlx_driver::batch(connection, sql).await,
        }
    }

    fn set_in_transaction(&mut self, _: bool) -> bool {
        false
    }
}

/// miniflow's statements on a sqlx connection: each prepared through sqlx (which caches it on the
/// connection), its parameters encoded by `postgres-types` for the types the server gave them, its
/// rows kept as the server's binary values.
#[cfg(feature = "sqlx")]
mod sqlx_driver {
    use postgres::types::{IsNull, Type};
    use sqlx::postgres::{PgArguments, PgTypeInfo, Postgres};
    use sqlx::{
        Arguments, Column, Either, Executor, PgConnection, Row, Statement, TypeInfo, ValueRef,
    };

    use super::WireRow;
    use crate::db::Params;
    use crate::errors::DbError;

    /// One parameter, already in PostgreSQL's binary format for its type.
    struct Encoded {
        oid: u32,
        bytes: Option<Vec<u8>>,
    }

    impl sqlx::Type<Postgres> for Encoded {
        fn type_info() -> PgTypeInfo {
            // Never used: `produces` names each value's type.
            PgTypeInfo::with_oid(sqlx::postgres::types::Oid(0))
        }
    }

    impl sqlx::Encode<'_, Postgres> for Encoded {
        fn encode_by_ref(
            &self,
            buf: &mut sqlx::postgres::PgArgumentBuffer,
        ) -> Result<sqlx::encode::IsNull, sqlx::error::BoxDynError> {
            match &self.bytes {
                Some(bytes) => {
                    buf.extend_from_slice(bytes);
                    Ok(sqlx::encode::IsNull::No)
                }
                None => Ok(sqlx::encode::IsNull::Yes),
            }
        }

        fn produces(&self) -> Option<PgTypeInfo> {
            Some(PgTypeInfo::with_oid(sqlx::postgres::types::Oid(self.oid)))
        }
    }

    /// `sql` prepared on `connection` (cached there by sqlx) and `params` encoded for it.
    async fn bind(
        connection: &mut PgConnection,
        sql: &'static str,
        params: &Params<'_>,
    ) -> Result<(sqlx::postgres::PgStatement, PgArguments), DbError> {
        let statement = connection
            .prepare(sqlx::SqlSafeStr::into_sql_str(sql))
            .await?;
        let types: Vec<Type> = match statement.parameters() {
            Some(Either::Left(types)) => types.iter().map(server_type).collect::<Result<_, _>>()?,
            _ => Vec::new(),
        };
        if types.len() != params.len() {
            return Err(DbError::Value(format!(
                "the statement takes {} parameters, {} were given",
                types.len(),
                params.len()
            )));
        }
        let mut arguments = PgArguments::default();
        for (param, ty) in params.iter().zip(&types) {
            let mut bytes = bytes::BytesMut::new();
            let bytes = match param.to_sql_checked(ty, &mut bytes) {
                Ok(IsNull::Yes) => None,
                Ok(IsNull::No) => Some(bytes.to_vec()),
                Err(e) => return Err(DbError::Value(format!("a parameter of type {ty}: {e}"))),
            };
            arguments
                .add(Encoded {
                    oid: ty.oid(),
                    bytes,
                })
                .map_err(|e| DbError::Value(format!("a parameter of type {ty}: {e}")))?;
        }
        Ok((statement, arguments))
    }

    /// The `postgres-types` type of a type the server named.
    fn server_type(info: &PgTypeInfo) -> Result<Type, DbError> {
        info.oid()
            .and_then(|oid| Type::from_oid(oid.0))
            .ok_or_else(|| DbError::Value(format!("a value of the unknown type {}", info.name())))
    }

    pub(super) async fn query(
        connection: &mut PgConnection,
        sql: &'static str,
        params: &Params<'_>,
    ) -> Result<Vec<WireRow>, DbError> {
        let (statement, arguments) = bind(connection, sql, params).await?;
        let rows = statement
            .query_with(arguments)
            .fetch_all(&mut *connection)
            .await?;
        rows.iter().map(wire_row).collect()
    }

    pub(super) async fn execute(
        connection: &mut PgConnection,
        sql: &'static str,
        params: &Params<'_>,
    ) -> Result<u64, DbError> {
        let (statement, arguments) = bind(connection, sql, params).await?;
        let done = statement
            .query_with(arguments)
            .execute(&mut *connection)
            .await?;
        Ok(done.rows_affected())
    }

    pub(super) async fn batch(connection: &mut PgConnection, sql: &str) -> Result<(), DbError> {
        let sql = sqlx::AssertSqlSafe(sql.to_owned());
        sqlx::raw_sql(sql).execute(&mut *connection).await?;
        Ok(())
    }

    fn wire_row(row: &sqlx::postgres::PgRow) -> Result<WireRow, DbError> {
        let mut columns = Vec::with_capacity(row.columns().len());
        for (at, column) in row.columns().iter().enumerate() {
            let value = row.try_get_raw(at)?;
            let ty = server_type(&value.type_info())?;
            let bytes = if value.is_null() {
                None
            } else {
                if value.format() != sqlx::postgres::PgValueFormat::Binary {
                    return Err(DbError::Value(format!(
                        "column {} came as text, not in the binary format",
                        column.name()
                    )));
                }
                Some(
                    value
                        .as_bytes()
                        .map_err(|e| DbError::Value(format!("column {}: {e}", column.name())))?
                        .to_vec(),
                )
            };
            columns.push((column.name().to_owned(), ty, bytes));
        }
        Ok(WireRow { columns })
    }
}
