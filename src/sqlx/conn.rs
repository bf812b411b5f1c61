//! A transaction the crate began on a pooled sqlx connection, and the statement helpers
//! every concern of the driver shares.

use std::time::Duration;

use ::sqlx::postgres::{PgArguments, PgRow, Postgres};
use ::sqlx::query::Query;
use ::sqlx::{Executor, PgConnection, Row, Transaction};

use super::SqlxStore;
use crate::engine::error::Error;
use crate::engine::record::Backlog;
use crate::store::sql;

/// A transaction the crate began on a pooled sqlx connection.
///
/// An `sqlx::Transaction` dropped before it ended queues its ROLLBACK, and the pool runs
/// it before the connection is handed out again (or closes the connection if it fails):
/// a connection never goes back inside a transaction.
pub struct SqlxConn {
    pub(super) tx: Option<Transaction<'static, Postgres>>,
    pub(super) persistent: bool,
    /// For the new transaction of a stored 4xx, whose handler writes are discarded.
    pub(super) pool: ::sqlx::PgPool,
}

impl SqlxConn {
    pub(crate) fn connection(&self) -> &PgConnection {
        self.tx.as_deref().expect("SqlxConn used after it ended")
    }

    /// The store's prepared-statement setting, for statements run through a handle.
    pub(crate) fn persistent(&self) -> bool {
        self.persistent
    }

    /// Commits the transaction.
    pub(super) async fn commit(&mut self) -> Result<(), ::sqlx::Error> {
        self.tx.take().expect("an open transaction").commit().await
    }

    pub(crate) fn connection_mut(&mut self) -> &mut PgConnection {
        self.tx
            .as_deref_mut()
            .expect("SqlxConn used after it ended")
    }
}

impl std::fmt::Debug for SqlxConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqlxConn")
            .field("open", &self.tx.is_some())
            .finish_non_exhaustive()
    }
}

/// The SQLSTATE of a database error.
pub(super) fn sql_state(error: &::sqlx::Error) -> Option<String> {
    Some(error.as_database_error()?.code()?.into_owned())
}

pub(super) const UNIQUE_VIOLATION: &str = "23505";
pub(super) const LOCK_NOT_AVAILABLE: &str = "55P03";
pub(super) const UNDEFINED_TABLE: &str = "42P01";

pub(super) fn lock_timeout(wait: Duration) -> String {
    format!("{}ms", wait.as_millis().max(1))
}

impl SqlxStore {
    pub(super) fn query(&self, sql: &'static str) -> Query<'static, Postgres, PgArguments> {
        statement(sql, self.persistent)
    }

    pub(super) async fn begin(&self) -> Result<SqlxConn, Error> {
        Ok(SqlxConn {
            tx: Some(self.pool.begin().await?),
            persistent: self.persistent,
            pool: self.pool.clone(),
        })
    }

    /// A connection that holds no transaction: the answer needed none.
    pub(super) fn ended(&self) -> SqlxConn {
        SqlxConn {
            tx: None,
            persistent: self.persistent,
            pool: self.pool.clone(),
        }
    }

    /// `sql`'s one aggregate row: a count and the age in seconds of the oldest.
    pub(super) async fn backlog(&self, sql: &'static str) -> Result<Backlog, Error> {
        let row = self.query(sql).fetch_one(&self.pool).await?;
        Ok(Backlog {
            count: row.try_get(0)?,
            oldest_seconds: row.try_get(1)?,
        })
    }

    pub(super) async fn rows<T>(
        &self,
        query: Query<'static, Postgres, PgArguments>,
        map: fn(&PgRow) -> Result<T, ::sqlx::Error>,
    ) -> Result<Vec<T>, Error> {
        let rows = query.fetch_all(&self.pool).await?;
        Ok(rows.iter().map(map).collect::<Result<_, _>>()?)
    }
}

pub(super) fn statement(
    sql: &'static str,
    persistent: bool,
) -> Query<'static, Postgres, PgArguments> {
    ::sqlx::query(sql).persistent(persistent)
}

/// Waits (bounded by `wait`) for the key's lock on `conn`'s transaction, then resets the
/// timeout for the statements after it. A lock not granted in time is the error
/// [`timed_out`] recognises (and aborts the transaction).
pub(super) async fn wait_lock(
    conn: &mut PgConnection,
    lock_key: i64,
    wait: Duration,
    persistent: bool,
) -> Result<(), ::sqlx::Error> {
    statement(sql::SET_LOCK_TIMEOUT, persistent)
        .bind(lock_timeout(wait))
        .execute(&mut *conn)
        .await?;
    statement(sql::WAIT_LOCK, persistent)
        .bind(lock_key)
        .execute(&mut *conn)
        .await?;
    conn.execute(sql::RESET_LOCK_TIMEOUT).await?;
    Ok(())
}

pub(super) fn timed_out(error: &::sqlx::Error) -> bool {
    sql_state(error).as_deref() == Some(LOCK_NOT_AVAILABLE)
}
