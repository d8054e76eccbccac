//! The times of an operation: the caller's clock, or the database's (DESIGN rule 18).

use miniflow_core::{Error, Timestamp};

use crate::db::{Columns, Exec};
use crate::errors::storage;
use crate::options::PostgresOptions;

/// The database's clock, in milliseconds since the Unix epoch.
pub(crate) async fn database_now(db: &mut impl Exec) -> Result<Timestamp, Error> {
    let millis: i64 = db
        .query_one(
            "SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint",
            &[],
        )
        .await
        .and_then(|row| Columns::try_get(&row, 0))
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
    pub(crate) async fn read(
        options: &PostgresOptions,
        db: &mut impl Exec,
        caller: Timestamp,
    ) -> Result<Self, Error> {
        let now = if options.database_clock {
            database_now(db).await?
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
