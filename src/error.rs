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
    /// PostgreSQL (or the connection to it) reported an error, through tokio-postgres.
    Postgres(tokio_postgres::Error),
    /// PostgreSQL (or the connection to it, or sqlx's pool) reported an error, through
    /// sqlx (feature `sqlx`).
    #[cfg(feature = "sqlx")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sqlx")))]
    Sqlx(::sqlx::Error),
    /// The transaction this handle belonged to has already been committed or rolled back —
    /// typically a handle moved into a task that outlived its handler.
    TransactionEnded,
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
    /// The database holds a schema version this build of the crate does not know.
    UnknownSchemaVersion {
        /// Highest version found in the database.
        found: i32,
        /// Highest version this build ships.
        known: i32,
    },
    /// A key given to [`Admin::lookup`](crate::Admin::lookup) is not a valid
    /// `Idempotency-Key` value.
    InvalidKey(crate::KeyError),
    /// An [`OutboxMessage`](crate::outbox::OutboxMessage) was refused before it reached
    /// the database (see [`MessageError`](crate::outbox::MessageError)).
    InvalidMessage(crate::outbox::MessageError),
    /// A stored response body or inbox payload could not be encrypted or decrypted (see
    /// [`EncryptionError`](crate::EncryptionError)).
    Encryption(crate::EncryptionError),
}

impl Error {
    /// The SQLSTATE code, when PostgreSQL reported one — also when it came through the
    /// pool (a connection refused by the server).
    pub fn sql_state(&self) -> Option<tokio_postgres::error::SqlState> {
        let mut source: Option<&(dyn std::error::Error + 'static)> = Some(self);
        while let Some(error) = source {
            if let Some(e) = error.downcast_ref::<tokio_postgres::Error>() {
                if let Some(code) = e.code() {
                    return Some(code.clone());
                }
            }
            #[cfg(feature = "sqlx")]
            if let Some(code) = error
                .downcast_ref::<::sqlx::Error>()
                .and_then(::sqlx::Error::as_database_error)
                .and_then(|e| e.code())
            {
                return Some(tokio_postgres::error::SqlState::from_code(&code));
            }
            source = error.source();
        }
        None
    }
}

impl Error {
    /// Whether PostgreSQL said a table, function or column of the crate does not exist
    /// (SQLSTATE 42P01, 42883, 42703): the schema was never migrated, or is older than this
    /// version needs. A permanent misconfiguration, not an outage: run
    /// [`migrate`](crate::migrate).
    pub fn is_schema_missing(&self) -> bool {
        use tokio_postgres::error::SqlState;
        if matches!(self, Self::SchemaOutdated { .. }) {
            return true;
        }
        self.sql_state().is_some_and(|code| {
            code == SqlState::UNDEFINED_TABLE
                || code == SqlState::UNDEFINED_FUNCTION
                || code == SqlState::UNDEFINED_COLUMN
        })
    }
}

impl Error {
    /// Whether a retry may succeed: no pooled connection, a connection lost or refused, the
    /// server shutting down or short of resources, a serialization failure or deadlock.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Pool(_) => true,
            Self::Postgres(e) if e.is_closed() => true,
            _ => match self.sql_state() {
                Some(code) => {
                    let code = code.code();
                    code.starts_with("08")
                        || code.starts_with("53")
                        || code.starts_with("57P")
                        || code == "40001"
                        || code == "40P01"
                }
                None => matches!(self, Self::Postgres(_)) || self.is_sqlx_io(),
            },
        }
    }

    #[cfg(feature = "sqlx")]
    fn is_sqlx_io(&self) -> bool {
        matches!(
            self,
            Self::Sqlx(
                ::sqlx::Error::Io(_)
                    | ::sqlx::Error::PoolTimedOut
                    | ::sqlx::Error::PoolClosed
                    | ::sqlx::Error::WorkerCrashed
            )
        )
    }

    #[cfg(not(feature = "sqlx"))]
    fn is_sqlx_io(&self) -> bool {
        false
    }
}

/// An error with its whole source chain, `: `-separated, for log lines.
pub(crate) struct Chain<'a>(pub(crate) &'a (dyn std::error::Error + 'static));

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(error) = source {
            write!(f, ": {error}")?;
            source = error.source();
        }
        Ok(())
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Pool(_) => f.write_str("could not check out a database connection"),
            Self::Postgres(_) => f.write_str("database error"),
            #[cfg(feature = "sqlx")]
            Self::Sqlx(_) => f.write_str("database error"),
            Self::TransactionEnded => f.write_str(
                "the idempotent transaction has already ended; \
                 an IdempotentTx must not outlive its handler",
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
            Self::UnknownSchemaVersion { found, known } => write!(
                f,
                "the database schema is at version {found}, \
                 newer than the {known} this version of axum-idempotency knows"
            ),
            Self::InvalidKey(_) => f.write_str("invalid idempotency key"),
            Self::InvalidMessage(_) => f.write_str("invalid outbox message"),
            Self::Encryption(_) => f.write_str("encryption at rest failed"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Pool(e) => Some(&**e),
            Self::Postgres(e) => Some(e),
            #[cfg(feature = "sqlx")]
            Self::Sqlx(e) => Some(e),
            Self::InvalidKey(e) => Some(e),
            Self::InvalidMessage(e) => Some(e),
            Self::Encryption(e) => Some(e),
            _ => None,
        }
    }
}

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

#[cfg(feature = "sqlx")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlx")))]
impl From<::sqlx::Error> for Error {
    fn from(e: ::sqlx::Error) -> Self {
        Self::Sqlx(e)
    }
}
