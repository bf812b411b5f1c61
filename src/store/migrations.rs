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
pub(crate) const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "idempotency_records",
        sql: include_str!("../../migrations/0001_idempotency_records.sql"),
    },
    Migration {
        version: 2,
        name: "inbox_messages",
        sql: include_str!("../../migrations/0002_inbox_messages.sql"),
    },
    Migration {
        version: 3,
        name: "lease_state",
        sql: include_str!("../../migrations/0003_lease_state.sql"),
    },
    Migration {
        version: 4,
        name: "claim_function",
        sql: include_str!("../../migrations/0004_claim_function.sql"),
    },
    Migration {
        version: 5,
        name: "body_encryption",
        sql: include_str!("../../migrations/0005_body_encryption.sql"),
    },
    Migration {
        version: 6,
        name: "fencing_tokens",
        sql: include_str!("../../migrations/0006_fencing_tokens.sql"),
    },
    Migration {
        version: 7,
        name: "outbox",
        sql: include_str!("../../migrations/0007_outbox.sql"),
    },
    Migration {
        version: 8,
        name: "console_indexes",
        sql: include_str!("../../migrations/0008_console_indexes.sql"),
    },
];

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
