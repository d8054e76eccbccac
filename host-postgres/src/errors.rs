//! Driver errors as miniflow's kinds: what a lost race, a timeout or a full server is, and a
//! message that says what the server said.

use miniflow_core::Error;
use postgres::error::SqlState;

/// A driver error whose message says what went wrong: the driver's own says only "db error" or
/// "error connecting to server"; this one adds what the server or the system said. The driver's
/// error stays its source.
#[derive(Debug)]
pub(crate) struct DriverError(pub(crate) postgres::Error);

impl std::fmt::Display for DriverError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        match std::error::Error::source(&self.0) {
            Some(cause) if !self.0.to_string().ends_with(&cause.to_string()) => {
                write!(f, ": {cause}")
            }
            _ => Ok(()),
        }
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
pub(crate) fn storage(e: postgres::Error) -> Error {
    let busy = [
        SqlState::T_R_SERIALIZATION_FAILURE,
        SqlState::T_R_DEADLOCK_DETECTED,
        SqlState::LOCK_NOT_AVAILABLE,
        SqlState::QUERY_CANCELED,
        SqlState::TOO_MANY_CONNECTIONS,
    ];
    match e.code() {
        Some(code) if busy.contains(code) => Error::Busy(Box::new(DriverError(e))),
        _ => Error::Storage(Box::new(DriverError(e))),
    }
}

/// Whether `e` is a unique violation (of `constraint`, when given).
pub(crate) fn is_unique_violation(e: &postgres::Error, constraint: &str) -> bool {
    e.as_db_error().is_some_and(|db| {
        *db.code() == SqlState::UNIQUE_VIOLATION && db.constraint() == Some(constraint)
    })
}
