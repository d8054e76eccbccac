//! The schema: numbered SQL migrations applied in one transaction under an advisory lock, the
//! version kept in `miniflow_schema`, and the checks a store makes of a database before it uses it.

use miniflow_core::Error;

use crate::db::{begin, end, Columns, Isolation, Own};
use crate::errors::storage;
use crate::PostgresOptions;

/// The outbox's migrations, applied in order; the count is the schema version in `miniflow_schema`.
/// The first holds the receiver's table too ([`RECEIVER_MIGRATIONS`]' first, written to find it there).
const MIGRATIONS: &[&str] = &[
    concat!(
        include_str!("../migrations/0001_init.sql"),
        include_str!("../migrations/idempotency.sql")
    ),
    include_str!("../migrations/0002_operator_controls.sql"),
    include_str!("../migrations/0003_trace_context.sql"),
    include_str!("../migrations/0004_retired_workflows.sql"),
];

/// The newest schema version this build writes.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// A receiver's migrations when its database holds no outbox: the idempotency table alone, the
/// version in `miniflow_receiver_schema`. Each is written to change nothing where the outbox's
/// migrations already made the same table (`IF NOT EXISTS`), so the outbox can come later; a change
/// to the table is a migration on both tracks.
const RECEIVER_MIGRATIONS: &[&str] = &[include_str!("../migrations/idempotency.sql")];

/// The newest receiver version this build writes.
const RECEIVER_VERSION: i64 = RECEIVER_MIGRATIONS.len() as i64;

/// The outbox version from which on its database holds the receiver track's newest table.
const RECEIVER_IN_OUTBOX: i64 = 1;

/// The tables a store needs: the whole outbox ([`crate::PostgresStore`] and every store on it), or
/// a receiver's idempotency records alone ([`crate::PostgresIdempotencyStore::connect`]), which
/// the outbox's tables also hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Track {
    /// Every table, versioned in `miniflow_schema`.
    Outbox,
    /// The idempotency table, versioned in `miniflow_receiver_schema` unless the outbox holds it.
    Receiver,
}

impl Track {
    fn migrations(self) -> &'static [&'static str] {
        match self {
            Track::Outbox => MIGRATIONS,
            Track::Receiver => RECEIVER_MIGRATIONS,
        }
    }

    fn version_table(self) -> &'static str {
        match self {
            Track::Outbox => "miniflow_schema",
            Track::Receiver => "miniflow_receiver_schema",
        }
    }

    /// The statements on the version table (prepared and cached: text known at compile time).
    fn version_statements(self) -> VersionStatements {
        macro_rules! on {
            ($table:literal) => {
                VersionStatements {
                    create: concat!(
                        "CREATE TABLE IF NOT EXISTS ",
                        $table,
                        " (version BIGINT PRIMARY KEY, \
                         applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
                    ),
                    newest: concat!("SELECT COALESCE(MAX(version), 0) FROM ", $table),
                    record: concat!("INSERT INTO ", $table, " (version) VALUES ($1)"),
                }
            };
        }
        match self {
            Track::Outbox => on!("miniflow_schema"),
            Track::Receiver => on!("miniflow_receiver_schema"),
        }
    }
}

/// A track's statements on its version table.
struct VersionStatements {
    create: &'static str,
    newest: &'static str,
    record: &'static str,
}

/// Where a database stands against a track of this build.
enum Standing {
    /// It holds what the track needs.
    Current,
    /// It holds the track up to `found` (0: none of it).
    Behind { found: i64 },
    /// It holds a newer version than this build knows.
    Ahead { found: i64, supported: i64 },
}

/// The advisory lock class of miniflow's locks (`pg_advisory_xact_lock(class, id)`, a key space of
/// its own): "mflw".
pub(crate) const LOCK_CLASS: i32 = 0x6d66_6c77;
/// The lock id, within [`LOCK_CLASS`], that migrations take.
const MIGRATION_LOCK: i32 = 1;
/// The lock id, within [`LOCK_CLASS`] + 1, of an idempotency key is `hashtext(key)`.
pub(crate) const KEY_LOCK_CLASS: i32 = LOCK_CLASS + 1;

/// What a store needs of its database before it uses it, by `options`: a server that keeps its
/// commits, then `track` migrated ([`migrate`]), or (read-only, or not migrating) checked
/// ([`check_schema`]). `target` names the database in errors.
pub(crate) async fn prepare(
    db: &mut impl Own,
    options: &PostgresOptions,
    track: Track,
    target: (&'static str, String),
) -> Result<(), Error> {
    if options.require_durable_commits && !options.read_only {
        check_durability(db).await?;
    }
    if options.migrate && !options.read_only {
        migrate(db, options.schema_name(), track).await
    } else {
        check_schema(db, options.schema_name(), track, target).await
    }
}

/// Refuses a database that does not hold `track` at this version, changing nothing: none or an
/// older one is [`Error::InvalidInput`] naming `target`, a newer one [`Error::UnsupportedSchema`].
async fn check_schema(
    db: &mut impl Own,
    schema: Option<&str>,
    track: Track,
    (field, value): (&'static str, String),
) -> Result<(), Error> {
    let holds = match track {
        Track::Outbox => "holds no miniflow schema (no miniflow_schema table in its search path)",
        Track::Receiver => {
            "holds no miniflow idempotency records (no miniflow_schema or \
             miniflow_receiver_schema table in its search path)"
        }
    };
    match standing(db, schema, track).await? {
        Standing::Current => Ok(()),
        Standing::Behind { found: 0 } => Err(Error::invalid(
            field,
            &value,
            format!(
                "{holds}: create it with `miniflow migrate {value}`, or connect a store that \
                 migrates"
            ),
        )),
        Standing::Behind { found } => Err(Error::invalid(
            field,
            &value,
            format!(
                "holds miniflow schema version {found}, older than version {SCHEMA_VERSION} of \
                 this miniflow: upgrade it first with `miniflow migrate {value}`"
            ),
        )),
        Standing::Ahead { found, supported } => Err(Error::UnsupportedSchema { found, supported }),
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

/// The outbox's schema version of the database `db` is on: 0 without miniflow's schema. With
/// `schema` ([`crate::PostgresOptions::schema`]) it looks there only, not at a table of the same
/// name further along the `search_path`.
pub(crate) async fn schema_version(db: &mut impl Own, schema: Option<&str>) -> Result<i64, Error> {
    version(db, schema, Track::Outbox).await
}

/// The version of `track` the database holds, read from the track's own table (0 without it).
///
/// Whether the table exists is read from the catalog with the statement's snapshot, not through
/// the session's cache of names (`to_regclass`): after waiting for the migrations' lock, the cache
/// can still say "no such table" of one another process made and committed meanwhile.
async fn version(db: &mut impl Own, schema: Option<&str>, track: Track) -> Result<i64, Error> {
    let exists: bool = db
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_class c \
                 JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
                 WHERE c.relname = $1 AND c.relkind = 'r' AND n.nspname = ANY ( \
                     CASE WHEN $2::text IS NULL THEN current_schemas(false) \
                          ELSE ARRAY[$2::text]::name[] END))",
            &[&track.version_table(), &schema],
        )
        .await
        .and_then(|row| Columns::try_get(&row, 0))
        .map_err(storage)?;
    if !exists {
        return Ok(0);
    }
    db.query_one(track.version_statements().newest, &[])
        .await
        .and_then(|row| Columns::try_get(&row, 0))
        .map_err(storage)
}

/// Where the database stands against `track`. A receiver is current on an outbox that holds its
/// table, whatever its own track says; an outbox newer than this build is refused either way.
async fn standing(
    db: &mut impl Own,
    schema: Option<&str>,
    track: Track,
) -> Result<Standing, Error> {
    let against = |found: i64, supported: i64| match found.cmp(&supported) {
        std::cmp::Ordering::Equal => Standing::Current,
        std::cmp::Ordering::Less => Standing::Behind { found },
        std::cmp::Ordering::Greater => Standing::Ahead { found, supported },
    };
    let outbox = version(db, schema, Track::Outbox).await?;
    Ok(match track {
        Track::Outbox => against(outbox, SCHEMA_VERSION),
        Track::Receiver if outbox > SCHEMA_VERSION => against(outbox, SCHEMA_VERSION),
        Track::Receiver if outbox >= RECEIVER_IN_OUTBOX => Standing::Current,
        Track::Receiver => against(version(db, schema, track).await?, RECEIVER_VERSION),
    })
}

/// Brings `track` to this build's version in one transaction, under the migrations' advisory lock;
/// in `schema` (created if missing) when one is set, whose name leads the connection's `search_path`.
pub(crate) async fn migrate(
    db: &mut impl Own,
    schema: Option<&str>,
    track: Track,
) -> Result<(), Error> {
    match standing(db, schema, track).await? {
        Standing::Current => return Ok(()),
        Standing::Ahead { found, supported } => {
            return Err(Error::UnsupportedSchema { found, supported })
        }
        Standing::Behind { .. } => {}
    }
    begin(db, Isolation::ReadCommitted).await?;
    let out = migrate_locked(db, schema, track).await;
    end(db, out).await
}

async fn migrate_locked(
    db: &mut impl Own,
    schema: Option<&str>,
    track: Track,
) -> Result<(), Error> {
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
    // Read again under the lock: another process may have migrated meanwhile.
    let found = match standing(db, schema, track).await? {
        Standing::Current => return Ok(()),
        Standing::Ahead { found, supported } => {
            return Err(Error::UnsupportedSchema { found, supported })
        }
        Standing::Behind { found } => found,
    };
    let statements = track.version_statements();
    db.batch(statements.create).await.map_err(storage)?;
    for (version, sql) in (1_i64..)
        .zip(track.migrations())
        .skip(usize::try_from(found).unwrap_or(0))
    {
        db.batch(sql).await.map_err(|e| {
            Error::Storage(format!("schema migration {version} failed: {e}").into())
        })?;
        db.execute(statements.record, &[&version])
            .await
            .map_err(storage)?;
    }
    Ok(())
}
