//! The schema migrations: the SQL files in `migrations/`, embedded at compile time and run
//! in order by every driver's `migrate`.

/// One migration file.
#[derive(Debug)]
pub(crate) struct Migration {
    pub(crate) version: i32,
    pub(crate) name: &'static str,
    pub(crate) sql: &'static str,
}

/// Append-only: a released file never changes, a new one gets the next number.
pub(crate) const MIGRATIONS: &[Migration] = &[Migration {
    version: 1,
    name: "schema",
    sql: include_str!("../../migrations/0001_schema.sql"),
}];

/// Advisory lock that serialises concurrent `migrate` calls (any schema, one database).
pub(crate) const MIGRATION_LOCK: i64 = 0x6178_6964_656d_0001;

/// The newest version this build knows.
pub(crate) fn latest() -> i32 {
    MIGRATIONS.last().map_or(0, |m| m.version)
}

/// The migrations still to run on a schema at `current`, or the error for a schema newer
/// than this build.
pub(crate) fn pending(
    current: i32,
) -> Result<impl Iterator<Item = &'static Migration>, crate::engine::error::Error> {
    let known = latest();
    if current > known {
        return Err(crate::engine::error::Error::UnknownSchemaVersion {
            found: current,
            known,
        });
    }
    Ok(MIGRATIONS.iter().filter(move |m| m.version > current))
}
