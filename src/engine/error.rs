//! The crate's error type.

use std::fmt;

/// An error from the database side of the crate: checking out a connection, running a
/// statement on the shared transaction, or migrating the schema.
///
/// The source is always kept, so `std::error::Error::source` walks to the driver's error
/// underneath (`tokio_postgres::Error`, `sqlx::Error`, the pool's own error).
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// No connection could be checked out of the pool (the pool's own error: a
    /// `deadpool_postgres::PoolError`, a `bb8::RunError`, ...).
    Pool(Box<dyn std::error::Error + Send + Sync>),
    /// PostgreSQL (or the connection to it) reported an error, through tokio-postgres
    /// (feature `postgres`).
    #[cfg(feature = "postgres")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    Postgres(tokio_postgres::Error),
    /// The database (or the connection to it, or sqlx's pool) reported an error, through
    /// sqlx: PostgreSQL (feature `sqlx`), MySQL/MariaDB (feature `mysql`) or SQLite
    /// (feature `sqlite`).
    #[cfg(feature = "_sqlx")]
    #[cfg_attr(
        docsrs,
        doc(cfg(any(feature = "sqlx", feature = "mysql", feature = "sqlite")))
    )]
    Sqlx(::sqlx::Error),
    /// The transaction this handle belonged to has already been committed or rolled back —
    /// typically a handle moved into a task that outlived its handler.
    TransactionEnded,
    /// Another request with the same idempotency key is in flight or has just completed:
    /// the key's lock, sent with the handler's first statement, was refused, or a record
    /// committed before it was granted. The statement's result is withheld and its
    /// transaction rolls back; the layer answers the request as that request's duplicate
    /// (409 `in_flight`, or the stored response), whatever the handler returns.
    DuplicateRequest,
    /// The handler tried to end, restart or split the shared transaction (`COMMIT`,
    /// `ROLLBACK`, `BEGIN`, `END`, `ABORT`, `PREPARE TRANSACTION`). The layer alone decides how the
    /// transaction ends.
    TransactionControl,
    /// The database's schema is older than this build of the crate needs (0: never
    /// migrated): run [`migrate`](crate::migrate). Returned by
    /// [`check_schema`](crate::check_schema).
    SchemaOutdated {
        /// Highest version found in the database.
        found: i32,
        /// The version this build needs.
        needed: i32,
    },
    /// One of the crate's own statements named a table, function or column that does not
    /// exist (SQLSTATE 42P01, 42883, 42703): the schema was never migrated, or is older
    /// than this version needs. Run [`migrate`](crate::migrate). The driver's error is the
    /// source. (The same codes from a handler's own statement are that statement's
    /// failure, not this.)
    SchemaMissing(Box<Error>),
    /// The database, or one of its settings, cannot give what the crate needs (a journal
    /// mode, a server version, a read-only file): a permanent misconfiguration, found by
    /// [`migrate`](crate::migrate) at start-up. Says what and what to change.
    Unsupported(String),
    /// The database holds a schema version this build of the crate does not know.
    UnknownSchemaVersion {
        /// Highest version found in the database.
        found: i32,
        /// Highest version this build ships.
        known: i32,
    },
    /// A key given to [`Admin::lookup`](crate::Admin::lookup) is not a valid
    /// `Idempotency-Key` value.
    InvalidKey(crate::engine::key::KeyError),
    /// An argument given to an [`Admin`](crate::Admin) method is not one it takes: a
    /// record id that is not 32 hex digits, a page cursor it did not hand out, a list it
    /// does not page. Says which.
    InvalidArgument(&'static str),
    /// An [`OutboxMessage`](crate::outbox::OutboxMessage) was refused before it reached
    /// the database (see [`MessageError`](crate::outbox::MessageError)).
    InvalidMessage(crate::engine::outbox::MessageError),
    /// A stored response body or inbox payload could not be encrypted or decrypted (see
    /// [`EncryptionError`](crate::EncryptionError)).
    Encryption(crate::engine::crypto::EncryptionError),
    /// The [`ArchiveSink`](crate::ArchiveSink) of a [`Sweeper`](crate::Sweeper) failed to
    /// write a batch (the sink's error is the source). Nothing of the batch was purged; it
    /// is sent again on the next run.
    Archive(crate::engine::archive::BoxError),
}

impl Error {
    /// The five-character SQLSTATE code, when PostgreSQL or MySQL/MariaDB reported one —
    /// also when it came through the pool (a connection refused by the server). SQLite has
    /// no SQLSTATE. Compare it with the codes of
    /// the PostgreSQL manual's appendix A (`"23505"` is `unique_violation`).
    pub fn sql_state(&self) -> Option<&str> {
        let mut source: Option<&(dyn std::error::Error + 'static)> = Some(self);
        while let Some(error) = source {
            if let Some(code) = driver_sql_state(error) {
                return Some(code);
            }
            source = error.source();
        }
        None
    }

    /// Whether PostgreSQL said a table, function or column does not exist (SQLSTATE 42P01,
    /// 42883, 42703), or the schema check found the schema older than this version needs:
    /// the schema was never migrated, or is older than this version needs. A permanent
    /// misconfiguration, not an outage: run [`migrate`](crate::migrate).
    pub fn is_schema_missing(&self) -> bool {
        matches!(self, Self::SchemaOutdated { .. })
            || self
                .sql_state()
                .is_some_and(|code| matches!(code, "42P01" | "42883" | "42703"))
            || self.native() == Some(Native::SchemaMissing)
    }

    /// Whether this is the crate's own schema missing or outdated, as opposed to a
    /// handler's statement naming an object of its own that does not exist.
    pub(crate) fn is_crate_schema_missing(&self) -> bool {
        matches!(
            self,
            Self::SchemaOutdated { .. }
                | Self::UnknownSchemaVersion { .. }
                | Self::SchemaMissing(_)
        )
    }

    /// Marks an error of one of the crate's own statements, run on a caller's transaction
    /// (the outbox's enqueue): a missing object there is the crate's schema.
    pub(crate) fn of_crate_statement(self) -> Self {
        if self.is_schema_missing() && !self.is_crate_schema_missing() {
            Self::SchemaMissing(Box::new(self))
        } else {
            self
        }
    }

    /// Whether a retry may succeed: no pooled connection, a connection lost or refused, the
    /// server shutting down or short of resources, a serialization failure or deadlock.
    pub fn is_transient(&self) -> bool {
        if let Some(native) = self.native() {
            return native == Native::Transient;
        }
        match self {
            Self::Pool(_) => true,
            #[cfg(feature = "postgres")]
            Self::Postgres(e) if e.is_closed() => true,
            _ => match self.sql_state() {
                Some(code) => {
                    code.starts_with("08")
                        || code.starts_with("53")
                        || code.starts_with("57P")
                        || code == "40001"
                        || code == "40P01"
                        || code == "55P03"
                }
                None => self.is_driver_io(),
            },
        }
    }

    /// A driver error without a SQLSTATE: the connection, not a statement, failed.
    fn is_driver_io(&self) -> bool {
        match self {
            #[cfg(feature = "postgres")]
            Self::Postgres(_) => true,
            #[cfg(feature = "_sqlx")]
            Self::Sqlx(e) => matches!(
                e,
                ::sqlx::Error::Io(_)
                    | ::sqlx::Error::PoolTimedOut
                    | ::sqlx::Error::PoolClosed
                    | ::sqlx::Error::WorkerCrashed
            ),
            _ => false,
        }
    }
}

/// What a MySQL/MariaDB or SQLite error number says, where the SQLSTATE does not say it
/// (MySQL reports a lock wait timeout as `HY000`; SQLite has no SQLSTATE).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(any(feature = "mysql", feature = "sqlite")), allow(dead_code))]
enum Native {
    /// Retry: a lock wait or busy timeout, a deadlock, a record changed under snapshot
    /// isolation, the connection killed or the server going away.
    Transient,
    /// The crate's schema is missing (no such table or column).
    SchemaMissing,
    /// Neither: the SQLSTATE (MySQL) or nothing (SQLite) decides.
    Other,
}

impl Error {
    /// The classification of the first MySQL/MariaDB or SQLite database error in the chain;
    /// `None` for other errors.
    fn native(&self) -> Option<Native> {
        #[cfg(any(feature = "mysql", feature = "sqlite"))]
        {
            let mut source: Option<&(dyn std::error::Error + 'static)> = Some(self);
            while let Some(error) = source {
                if let Some(database) = error
                    .downcast_ref::<::sqlx::Error>()
                    .and_then(::sqlx::Error::as_database_error)
                {
                    #[cfg(feature = "mysql")]
                    if let Some(e) =
                        database.try_downcast_ref::<::sqlx::mysql::MySqlDatabaseError>()
                    {
                        return Some(match e.number() {
                            // Lock wait timeout, deadlock (and a Galera certification
                            // failure), record changed (MariaDB's snapshot isolation), too
                            // many connections, shutdown in progress, connection killed,
                            // query interrupted; on a Galera node leaving or joining the
                            // cluster, "WSREP has not yet prepared node for application
                            // use" (1047) and a failed commit (1180).
                            1205 | 1213 | 1020 | 1040 | 1053 | 1927 | 1317 | 4031 | 1047 | 1180 => {
                                Native::Transient
                            }
                            // No such table or column; no such function (1305 also
                            // says "SAVEPOINT ... does not exist", which is no schema).
                            1146 | 1054 => Native::SchemaMissing,
                            1305 if e.message().starts_with("FUNCTION") => Native::SchemaMissing,
                            _ => Native::Other,
                        });
                    }
                    #[cfg(feature = "sqlite")]
                    if let Some(e) = database.try_downcast_ref::<::sqlx::sqlite::SqliteError>() {
                        use ::sqlx::error::DatabaseError;
                        let code: i32 = e.code().and_then(|c| c.parse().ok()).unwrap_or(0);
                        return Some(match code & 0xff {
                            // SQLITE_BUSY (a busy wait that expired), SQLITE_LOCKED.
                            5 | 6 => Native::Transient,
                            _ if e.message().starts_with("no such table")
                                || e.message().starts_with("no such column") =>
                            {
                                Native::SchemaMissing
                            }
                            _ => Native::Other,
                        });
                    }
                }
                source = error.source();
            }
        }
        None
    }
}

/// The SQLSTATE of one error of the chain, if it is a driver's database error.
#[allow(unused_variables)]
fn driver_sql_state<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a str> {
    #[cfg(feature = "postgres")]
    if let Some(code) = error
        .downcast_ref::<tokio_postgres::Error>()
        .and_then(tokio_postgres::Error::code)
    {
        return Some(code.code());
    }
    #[cfg(feature = "sqlx")]
    if let Some(database) = error
        .downcast_ref::<::sqlx::Error>()
        .and_then(::sqlx::Error::as_database_error)
        .and_then(|e| e.try_downcast_ref::<::sqlx::postgres::PgDatabaseError>())
    {
        return Some(database.code());
    }
    #[cfg(feature = "mysql")]
    if let Some(code) = error
        .downcast_ref::<::sqlx::Error>()
        .and_then(::sqlx::Error::as_database_error)
        .and_then(|e| e.try_downcast_ref::<::sqlx::mysql::MySqlDatabaseError>())
        .and_then(::sqlx::mysql::MySqlDatabaseError::code)
    {
        return Some(code);
    }
    None
}
/// An error with its whole source chain, `: `-separated, for log lines.
pub(crate) struct Chain<'a>(pub(crate) &'a (dyn std::error::Error + 'static));

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut written = self.0.to_string();
        let mut source = self.0.source();
        while let Some(error) = source {
            // A driver error that repeats its source's text (sqlx's does) is said once.
            let text = error.to_string();
            if !written.contains(&text) {
                written.push_str(": ");
                written.push_str(&text);
            }
            source = error.source();
        }
        f.write_str(&written)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Pool(_) => f.write_str("could not check out a database connection"),
            #[cfg(feature = "postgres")]
            Self::Postgres(_) => f.write_str("database error"),
            #[cfg(feature = "_sqlx")]
            Self::Sqlx(_) => f.write_str("database error"),
            Self::TransactionEnded => f.write_str(
                "the idempotent transaction has already ended; \
                 an IdempotentTx must not outlive its handler",
            ),
            Self::DuplicateRequest => f.write_str(
                "another request with this idempotency key is in flight or has completed; \
                 this one is answered as its duplicate",
            ),
            Self::TransactionControl => f.write_str(
                "transaction control statements are not allowed on an IdempotentTx; \
                 the layer commits or rolls back from the handler's response",
            ),
            Self::SchemaOutdated { found, needed } => write!(
                f,
                "the database schema is at version {found}, older than the {needed} this \
                 version of axum-idempotency needs; run axum_idempotency::migrate"
            ),
            Self::SchemaMissing(_) => f.write_str(
                "a table, function or column of axum-idempotency is missing; \
                 run axum_idempotency::migrate",
            ),
            Self::UnknownSchemaVersion { found, known } => write!(
                f,
                "the database schema is at version {found}, \
                 newer than the {known} this version of axum-idempotency knows"
            ),
            Self::Unsupported(what) => f.write_str(what),
            Self::InvalidKey(_) => f.write_str("invalid idempotency key"),
            Self::InvalidArgument(what) => write!(f, "invalid argument: {what}"),
            Self::InvalidMessage(_) => f.write_str("invalid outbox message"),
            Self::Encryption(_) => f.write_str("encryption at rest failed"),
            Self::Archive(_) => f.write_str("the archive sink failed to write a batch"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Pool(e) => Some(&**e),
            #[cfg(feature = "postgres")]
            Self::Postgres(e) => Some(e),
            #[cfg(feature = "_sqlx")]
            Self::Sqlx(e) => Some(e),
            Self::SchemaMissing(e) => Some(&**e),
            Self::InvalidKey(e) => Some(e),
            Self::InvalidMessage(e) => Some(e),
            Self::Encryption(e) => Some(e),
            Self::Archive(e) => Some(&**e),
            _ => None,
        }
    }
}

#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
impl From<tokio_postgres::Error> for Error {
    fn from(e: tokio_postgres::Error) -> Self {
        Self::Postgres(e)
    }
}

#[cfg(feature = "deadpool")]
#[cfg_attr(docsrs, doc(cfg(feature = "deadpool")))]
impl From<deadpool_postgres::PoolError> for Error {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        Self::Pool(Box::new(e))
    }
}

#[cfg(feature = "_sqlx")]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "sqlx", feature = "mysql", feature = "sqlite")))
)]
impl From<::sqlx::Error> for Error {
    fn from(e: ::sqlx::Error) -> Self {
        Self::Sqlx(e)
    }
}
