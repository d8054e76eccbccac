//! Opening the store the command line names: read-only for a read, and for a change only a store of
//! this version (never one created or upgraded on the way).

use std::borrow::Cow;
use std::path::Path;

use miniflow::{PostgresOptions, PostgresStore, SqliteStore};

use crate::args::{location, Location};
use crate::output::Stop;

/// A store the tool opened: a SQLite file, or a PostgreSQL database.
pub enum Store {
    Sqlite(SqliteStore),
    Postgres(PostgresStore),
}

/// `$body` with `$store` bound to whichever store `$on` holds (`&Store` or `&mut Store`).
macro_rules! on_store {
    ($on:expr, $store:ident => $body:expr) => {
        match $on {
            $crate::store::Store::Sqlite($store) => $body,
            $crate::store::Store::Postgres($store) => $body,
        }
    };
}

pub(crate) use on_store;

/// `url` with the password of `PGPASSWORD` when it names none itself (as libpq does).
pub fn with_password(url: &str) -> Cow<'_, str> {
    let Ok(password) = std::env::var("PGPASSWORD") else {
        return Cow::Borrowed(url);
    };
    let Some((scheme, rest)) = url.split_once("://") else {
        return Cow::Borrowed(url);
    };
    let authority = rest.split(['/', '?']).next().unwrap_or_default();
    let Some((userinfo, _)) = authority.rsplit_once('@') else {
        return Cow::Borrowed(url); // no user named: nothing to give a password to
    };
    if userinfo.contains(':') || password.is_empty() {
        return Cow::Borrowed(url);
    }
    let encoded: String = password
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect();
    Cow::Owned(format!(
        "{scheme}://{userinfo}:{encoded}{}",
        &rest[userinfo.len()..]
    ))
}

/// Opens the store to read it: nothing in or beside the file changes, and a path without a miniflow
/// store of this version is refused. A database is read in read-only sessions, without migrating
/// it, and must hold miniflow's schema at this version.
pub fn open_to_read(db: &Path) -> Result<Store, Stop> {
    Ok(match location(db)? {
        Location::Postgres(url) => {
            Store::Postgres(PostgresStore::connect_read_only(&with_password(url))?)
        }
        Location::File(path) => Store::Sqlite(SqliteStore::open_read_only(path)?),
    })
}

/// Opens the store to change it. It must already be a store of this version: a write command never
/// turns a missing, empty or foreign file (or a database without miniflow's schema) into a store,
/// nor upgrades an older one (`migrate` does).
pub fn open_to_write(db: &Path) -> Result<Store, Stop> {
    let path = match location(db)? {
        Location::Postgres(url) => {
            let options = PostgresOptions::new().migrate(false).pool_size(2);
            return Ok(Store::Postgres(PostgresStore::connect_with(
                &with_password(url),
                &options,
            )?));
        }
        Location::File(path) => path,
    };
    drop(open_to_read(path)?);
    SqliteStore::open(path)
        .map(Store::Sqlite)
        .map_err(|e| Stop::Failed(format!("cannot open {} for writing: {e}", path.display())))
}
