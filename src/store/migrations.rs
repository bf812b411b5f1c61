//! The schema migrations: the SQL files in `migrations/`, embedded at compile time and run
//! in order by every driver's `migrate`.

/// One migration file.
#[derive(Debug)]
pub(crate) struct Migration {
    pub(crate) version: i32,
    pub(crate) name: &'static str,
    pub(crate) sql: &'static str,
}

/// PostgreSQL's, in `migrations/`. Append-only: a released file never changes, a new one
/// gets the next number. Every database has the same versions, each in its own dialect.
pub(crate) const POSTGRES: &[Migration] = &[
    Migration {
        version: 1,
        name: "schema",
        sql: include_str!("../../migrations/0001_schema.sql"),
    },
    Migration {
        version: 2,
        name: "archive",
        sql: include_str!("../../migrations/0002_archive.sql"),
    },
];

/// MySQL/MariaDB's, in `migrations/mysql/`.
#[cfg(feature = "mysql")]
pub(crate) const MYSQL: &[Migration] = &[
    Migration {
        version: 1,
        name: "schema",
        sql: include_str!("../../migrations/mysql/0001_schema.sql"),
    },
    Migration {
        version: 2,
        name: "archive",
        sql: include_str!("../../migrations/mysql/0002_archive.sql"),
    },
];

/// SQLite's, in `migrations/sqlite/`.
#[cfg(feature = "sqlite")]
pub(crate) const SQLITE: &[Migration] = &[
    Migration {
        version: 1,
        name: "schema",
        sql: include_str!("../../migrations/sqlite/0001_schema.sql"),
    },
    Migration {
        version: 2,
        name: "archive",
        sql: include_str!("../../migrations/sqlite/0002_archive.sql"),
    },
];

/// Advisory lock that serialises concurrent `migrate` calls (any schema, one database).
#[cfg_attr(not(any(feature = "postgres", feature = "sqlx")), allow(dead_code))]
pub(crate) const MIGRATION_LOCK: i64 = 0x6178_6964_656d_0001;

/// The newest version this build knows (the same for every database).
pub(crate) fn latest() -> i32 {
    POSTGRES.last().map_or(0, |m| m.version)
}

/// The migrations of `all` (one database's list) still to run on a schema at `current`, or
/// the error for a schema newer than this build.
pub(crate) fn pending(
    all: &'static [Migration],
    current: i32,
) -> Result<impl Iterator<Item = &'static Migration>, crate::engine::error::Error> {
    let known = latest();
    if current > known {
        return Err(crate::engine::error::Error::UnknownSchemaVersion {
            found: current,
            known,
        });
    }
    Ok(all.iter().filter(move |m| m.version > current))
}

#[cfg(test)]
mod tests {
    /// `check_schema` compares every database's schema with one number.
    #[test]
    fn every_database_has_the_same_versions() {
        let versions = |all: &[super::Migration]| all.iter().map(|m| m.version).collect::<Vec<_>>();
        #[cfg(feature = "mysql")]
        assert_eq!(versions(super::MYSQL), versions(super::POSTGRES));
        #[cfg(feature = "sqlite")]
        assert_eq!(versions(super::SQLITE), versions(super::POSTGRES));
        assert_eq!(super::latest(), versions(super::POSTGRES).len() as i32);
    }
}
