//! `migrate`: the one command that upgrades a store (and on PostgreSQL creates miniflow's schema in
//! a database without one).

use std::io::Write;
use std::path::Path;

use miniflow::{
    redact_password, PostgresStore, SqliteStore, POSTGRES_SCHEMA_VERSION, SCHEMA_VERSION,
};

use crate::args::{location, Location};
use crate::output::Done;
use crate::store::with_password;

/// `migrate`: upgrades the store `db` names to this version's schema, and says from which.
pub fn migrate(out: &mut impl Write, db: &Path) -> Done {
    let db = match location(db)? {
        Location::File(path) => path,
        Location::Postgres(url) => return migrate_database(out, url),
    };
    let found = SqliteStore::migrate(db)?;
    if found == SCHEMA_VERSION {
        writeln!(
            out,
            "{}: already at schema version {SCHEMA_VERSION}; nothing to do",
            db.display()
        )?;
    } else {
        writeln!(
            out,
            "{}: upgraded from schema version {found} to {SCHEMA_VERSION}; older versions of \
             miniflow now refuse it",
            db.display()
        )?;
    }
    Ok(())
}

/// [`migrate`] of a PostgreSQL database, which it also gives miniflow's schema when it has none.
fn migrate_database(out: &mut impl Write, url: &str) -> Done {
    let found = PostgresStore::migrate(&with_password(url))?;
    let (url, version) = (redact_password(url), POSTGRES_SCHEMA_VERSION);
    match found {
        0 => writeln!(out, "{url}: created miniflow's schema, version {version}")?,
        found if found == version => writeln!(
            out,
            "{url}: already at schema version {version}; nothing to do"
        )?,
        found => writeln!(
            out,
            "{url}: upgraded from schema version {found} to {version}; older versions of \
             miniflow now refuse it"
        )?,
    }
    Ok(())
}
