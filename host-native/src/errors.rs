//! Driver errors as miniflow's kinds: what a locked database is.

use miniflow_core::Error;
use rusqlite::ErrorCode;

/// Maps a driver error onto miniflow's kinds: a locked database is [`Error::Busy`].
pub(crate) fn storage(e: rusqlite::Error) -> Error {
    match e.sqlite_error_code() {
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => Error::Busy(Box::new(e)),
        _ => Error::Storage(Box::new(e)),
    }
}
