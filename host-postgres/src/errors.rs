//! Driver errors as miniflow's kinds: what a lost race, a timeout or a full server is, and a
//! message that says what the server said.

use miniflow_core::Error;
use postgres::error::SqlState;

/// An error of a statement, from whichever driver ran it: the `postgres` and `tokio-postgres`
/// crates for the store's own connections and for a caller's tokio-postgres transaction, sqlx for a
/// caller's sqlx transaction, or a column that could not be read as its type.
#[derive(Debug)]
pub(crate) enum DbError {
    Postgres(postgres::Error),
    #[cfg(feature = "sqlx")]
    Sqlx(sqlx::Error),
    /// A value that could not be written or read as its column's type (a caller's sqlx transaction,
    /// whose values miniflow encodes and decodes itself).
    Value(String),
}

impl From<postgres::Error> for DbError {
    fn from(e: postgres::Error) -> Self {
        Self::Postgres(e)
    }
}

#[cfg(feature = "sqlx")]
impl From<sqlx::Error> for DbError {
    fn from(e: sqlx::Error) -> Self {
        Self::Sqlx(e)
    }
}

impl DbError {
    /// The server's SQLSTATE, when the server answered with an error.
    pub(crate) fn code(&self) -> Option<SqlState> {
        match self {
            Self::Postgres(e) => e.code().cloned(),
            #[cfg(feature = "sqlx")]
            Self::Sqlx(e) => e
                .as_database_error()
                .and_then(|db| db.code())
                .map(|code| SqlState::from_code(&code)),
            Self::Value(_) => None,
        }
    }

    /// The constraint the server named in its error, if any.
    pub(crate) fn constraint(&self) -> Option<&str> {
        match self {
            Self::Postgres(e) => e.as_db_error().and_then(|db| db.constraint()),
            #[cfg(feature = "sqlx")]
            Self::Sqlx(e) => e.as_database_error().and_then(|db| db.constraint()),
            Self::Value(_) => None,
        }
    }
}

impl std::fmt::Display for DbError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Postgres(e) => with_cause(e, f),
            #[cfg(feature = "sqlx")]
            Self::Sqlx(e) => e.fmt(f),
            Self::Value(message) => f.write_str(message),
        }
    }
}

impl std::error::Error for DbError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Postgres(e) => Some(e),
            #[cfg(feature = "sqlx")]
            Self::Sqlx(e) => Some(e),
            Self::Value(_) => None,
        }
    }
}

/// A driver error whose message says what went wrong: the driver's own says only "db error" or
/// "error connecting to server"; this one adds what the server or the system said. The driver's
/// error stays its source.
#[derive(Debug)]
pub(crate) struct DriverError(pub(crate) postgres::Error);

impl std::fmt::Display for DriverError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        with_cause(&self.0, f)
    }
}

/// Writes `e` and, unless its message ends with it already, what caused it.
fn with_cause(e: &postgres::Error, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
    write!(f, "{e}")?;
    match std::error::Error::source(e) {
        Some(cause) if !e.to_string().ends_with(&cause.to_string()) => write!(f, ": {cause}"),
        _ => Ok(()),
    }
}

impl std::error::Error for DriverError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

/// Maps a driver error onto miniflow's kinds: a lost serialization race, a deadlock, a lock or
/// statement timeout and a full server are [`Error::Busy`] (retry later); anything else, including
/// a lost connection, is [`Error::Storage`].
pub(crate) fn storage(e: impl Into<DbError>) -> Error {
    let e = e.into();
    let busy = [
        SqlState::T_R_SERIALIZATION_FAILURE,
        SqlState::T_R_DEADLOCK_DETECTED,
        SqlState::LOCK_NOT_AVAILABLE,
        SqlState::QUERY_CANCELED,
        SqlState::TOO_MANY_CONNECTIONS,
    ];
    match e.code() {
        Some(code) if busy.contains(&code) => Error::Busy(Box::new(e)),
        _ => Error::Storage(Box::new(e)),
    }
}

/// Whether `e` is a unique violation of `constraint`.
pub(crate) fn is_unique_violation(e: &DbError, constraint: &str) -> bool {
    e.code() == Some(SqlState::UNIQUE_VIOLATION) && e.constraint() == Some(constraint)
}
