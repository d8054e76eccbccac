//! The schema: numbered SQL migrations applied in one transaction under an advisory lock, the
//! version kept in `miniflow_schema`, and the checks a store makes of a database before it uses it.

use miniflow_core::Error;

use crate::db::{begin, end, Columns, Isolation, Own};
use crate::errors::storage;

/// The schema migrations, applied in order; the count is the schema version in `miniflow_schema`.
const MIGRATIONS: &[&str] = &[
    include_str!("../migrations/0001_init.sql"),
    include_str!("../migrations/0002_operator_controls.sql"),
    include_str!("../migrations/0003_trace_context.sql"),
    include_str!("../migrations/0004_retired_workflows.sql"),
];

/// The newest schema version this build writes.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// The advisory lock class of miniflow's locks (`pg_advisory_xact_lock(class, id)`, a key space of
/// its own): "mflw".
pub(crate) const LOCK_CLASS: i32 = 0x6d66_6c77;
/// The lock id, within [`LOCK_CLASS`], that migrations take.
const MIGRATION_LOCK: i32 = 1;
/// The lock id, within [`LOCK_CLASS`] + 1, of an idempotency key is `hashtext(key)`.
pub(crate) const KEY_LOCK_CLASS: i32 = LOCK_CLASS + 1;

/// Refuses a database whose schema is not this version's, changing nothing: none or an older one is
/// [`Error::InvalidInput`] naming `target`, a newer one [`Error::UnsupportedSchema`].
pub(crate) async fn check_schema(
    db: &mut impl Own,
    schema: Option<&str>,
    (field, value): (&'static str, String),
) -> Result<(), Error> {
    match schema_version(db, schema).await? {
        found if found == SCHEMA_VERSION => Ok(()),
        0 => Err(Error::invalid(
            field,
            &value,
            format!(
                "holds no miniflow schema (no miniflow_schema table in its search path): create it \
                 with `miniflow migrate {value}`, or connect a store that migrates"
            ),
        )),
        found if found < SCHEMA_VERSION => Err(Error::invalid(
            field,
            &value,
            format!(
                "holds miniflow schema version {found}, older than version {SCHEMA_VERSION} of \
                 this miniflow: upgrade it first with `miniflow migrate {value}`"
            ),
        )),
        found => Err(Error::UnsupportedSchema {
            found,
            supported: SCHEMA_VERSION,
        }),
    }
}

/// Refuses a server that may lose a commit that returned (see
/// [`PostgresOptions::require_durable_commits`]).
pub(crate) async fn check_durability(db: &mut impl Own) -> Result<(), Error> {
    for (setting, weak) in [("fsync", "off"), ("synchronous_commit", "off")] {
        let value: String = db
            .query_one("SELECT current_setting($1)", &[&setting])
            .await
            .and_then(|row| Columns::try_get(&row, 0))
            .map_err(storage)?;
        if value == weak {
            return Err(Error::Storage(
                format!(
                    "the server runs with {setting} = {value}: a commit that returned can be lost \
                     in a crash, and with it a command a worker already delivered; set {setting} \
                     back on, or opt in with PostgresOptions::require_durable_commits(false)"
                )
                .into(),
            ));
        }
    }
    Ok(())
}

/// The schema version of the database `db` is on: 0 without miniflow's schema. With `schema`
/// ([`crate::PostgresOptions::schema`]) it looks there only, not at a table of the same name further
/// along the `search_path`.
pub(crate) async fn schema_version(db: &mut impl Own, schema: Option<&str>) -> Result<i64, Error> {
    let table = schema.map_or_else(
        || "miniflow_schema".to_owned(),
        |schema| format!("{schema}.miniflow_schema"),
    );
    let exists: bool = db
        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&table])
        .await
        .and_then(|row| Columns::try_get(&row, 0))
        .map_err(storage)?;
    if !exists {
        return Ok(0);
    }
    db.query_one("SELECT COALESCE(MAX(version), 0) FROM miniflow_schema", &[])
        .await
        .and_then(|row| Columns::try_get(&row, 0))
        .map_err(storage)
}

/// Brings the schema to [`SCHEMA_VERSION`] in one transaction, under the migrations' advisory lock;
/// in `schema` (created if missing) when one is set, whose name leads the connection's `search_path`.
pub(crate) async fn migrate(db: &mut impl Own, schema: Option<&str>) -> Result<(), Error> {
    let unsupported = |found| Error::UnsupportedSchema {
        found,
        supported: SCHEMA_VERSION,
    };
    match schema_version(db, schema).await? {
        found if found == SCHEMA_VERSION => return Ok(()),
        found if found > SCHEMA_VERSION => return Err(unsupported(found)),
        _ => {}
    }
    begin(db, Isolation::ReadCommitted).await?;
    let out = migrate_locked(db, schema).await;
    end(db, out).await
}

async fn migrate_locked(db: &mut impl Own, schema: Option<&str>) -> Result<(), Error> {
    db.execute(
        "SELECT pg_advisory_xact_lock($1, $2)",
        &[&LOCK_CLASS, &MIGRATION_LOCK],
    )
    .await
    .map_err(storage)?;
    if let Some(schema) = schema {
        // Created only when missing: a role without CREATE on the database can use a schema an
        // administrator made for it.
        let exists: bool = db
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)",
                &[&schema],
            )
            .await
            .and_then(|row| Columns::try_get(&row, 0))
            .map_err(storage)?;
        if !exists {
            // A validated identifier (see `PostgresOptions::validate`): nothing to quote.
            db.batch(&format!("CREATE SCHEMA {schema}"))
                .await
                .map_err(storage)?;
        }
    }
    db.batch(
        "CREATE TABLE IF NOT EXISTS miniflow_schema (
             version    BIGINT PRIMARY KEY,
             applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
         )",
    )
    .await
    .map_err(storage)?;
    // Read again under the lock: another process may have migrated meanwhile.
    let found = schema_version(db, schema).await?;
    if found > SCHEMA_VERSION {
        return Err(Error::UnsupportedSchema {
            found,
            supported: SCHEMA_VERSION,
        });
    }
    for (version, sql) in (1_i64..)
        .zip(MIGRATIONS)
        .skip(usize::try_from(found).unwrap_or(0))
    {
        db.batch(sql).await.map_err(|e| {
            Error::Storage(format!("schema migration {version} failed: {e}").into())
        })?;
        db.execute(
            "INSERT INTO miniflow_schema (version) VALUES ($1)",
            &[&version],
        )
        .await
        .map_err(storage)?;
    }
    Ok(())
}
