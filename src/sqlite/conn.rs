//! A transaction the crate began on a pooled SQLite connection (`BEGIN IMMEDIATE`), and the
//! statement helpers every concern of the driver shares.

use std::time::Duration;

use ::sqlx::pool::PoolConnection;
use ::sqlx::query::Query;
use ::sqlx::sqlite::{Sqlite, SqliteArguments, SqliteRow};
use ::sqlx::{SqlSafeStr, SqliteConnection, SqlitePool, Transaction};

use super::{SqliteStore, sql};
use crate::engine::error::Error;

/// A transaction the crate began on a pooled SQLite connection.
///
/// An `sqlx::Transaction` dropped before it ended queues its ROLLBACK on the connection's
/// worker, which runs it before the pool's release check (a ping queued behind it): a
/// connection never goes back inside a transaction.
pub struct SqliteConn {
    pub(super) tx: Option<Transaction<'static, Sqlite>>,
    pub(super) persistent: bool,
    /// For the new transaction of a stored 4xx, whose handler writes are discarded.
    pub(super) pool: SqlitePool,
    /// The outbox batch's claim token, between the relay's claim and its settlement.
    pub(super) claim: Option<i64>,
    /// The key this transaction runs, marked in flight for this process until it ends.
    pub(super) key: Option<super::in_flight::Entered>,
}

impl SqliteConn {
    pub(crate) fn connection(&self) -> &SqliteConnection {
        self.tx.as_deref().expect("SqliteConn used after it ended")
    }

    pub(crate) fn connection_mut(&mut self) -> &mut SqliteConnection {
        self.tx
            .as_deref_mut()
            .expect("SqliteConn used after it ended")
    }

    /// The store's prepared-statement setting, for statements run through a handle.
    pub(crate) fn persistent(&self) -> bool {
        self.persistent
    }

    /// Commits the transaction. Dropped unfinished (COMMIT failed), it rolls back.
    pub(super) async fn commit(&mut self) -> Result<(), ::sqlx::Error> {
        self.tx.take().expect("an open transaction").commit().await
    }
}

crate::store::sqlx_tx::impl_sqlx_tx_queries!(
    SqliteConn,
    row: SqliteRow,
    rollback_work: sql::INBOX_ROLLBACK_WORK,
);

impl std::fmt::Debug for SqliteConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteConn")
            .field("open", &self.tx.is_some())
            .finish_non_exhaustive()
    }
}

/// SQLite's primary result code of a database error (`SQLITE_BUSY` is 5, whatever its
/// extended code).
pub(super) fn primary_code(error: &::sqlx::Error) -> Option<i32> {
    let code: i32 = error.as_database_error()?.code()?.parse().ok()?;
    Some(code & 0xff)
}

pub(super) const SQLITE_BUSY: i32 = 5;
pub(super) const SQLITE_READONLY: i32 = 8;
pub(super) const SQLITE_CANTOPEN: i32 = 14;

pub(super) fn is_busy(error: &::sqlx::Error) -> bool {
    primary_code(error) == Some(SQLITE_BUSY)
}

pub(super) fn is_unique_violation(error: &::sqlx::Error) -> bool {
    error
        .as_database_error()
        .is_some_and(|e| e.is_unique_violation())
}

/// The shortest bounded wait: `BEGIN` is answered by the connection's worker thread, so
/// even a free write lock takes a moment to be granted.
const MIN_WAIT: Duration = Duration::from_millis(50);

/// `BEGIN IMMEDIATE` on `pooled`: waits for SQLite's write lock up to the busy timeout, or
/// up to `wait` (at least [`MIN_WAIT`]) if that comes first — `Ok(None)` when either ran
/// out. The connection's
/// settings are never changed: a `BEGIN` the timer gave up on goes on waiting on the
/// connection's worker, and is rolled back there as soon as it is granted, before the pool
/// gets the connection back.
pub(super) async fn begin_immediate(
    pooled: PoolConnection<Sqlite>,
    wait: Option<Duration>,
) -> Result<Option<Transaction<'static, Sqlite>>, ::sqlx::Error> {
    // `Transaction::begin` is how `Pool::begin_with` starts its transaction on a connection
    // it owns; here the connection is the one the claim's look-up just used.
    let begin = Transaction::begin(pooled, Some(sql::BEGIN_IMMEDIATE.into_sql_str()));
    let Some(wait) = wait else {
        return begin.await.map(Some);
    };
    match tokio::time::timeout(wait.max(MIN_WAIT), begin).await {
        Ok(Ok(tx)) => Ok(Some(tx)),
        Ok(Err(e)) if is_busy(&e) => Ok(None),
        Ok(Err(e)) => Err(e),
        Err(_elapsed) => Ok(None),
    }
}

impl SqliteStore {
    pub(super) fn query(&self, sql: &'static str) -> Query<'static, Sqlite, SqliteArguments> {
        statement(sql, self.persistent)
    }

    /// A connection in a new write transaction; `None` when `wait` ran out first.
    pub(super) async fn begin_write(
        &self,
        wait: Option<Duration>,
    ) -> Result<Option<SqliteConn>, Error> {
        let pooled = self.pool.acquire().await?;
        Ok(begin_immediate(pooled, wait).await?.map(|tx| self.open(tx)))
    }

    /// A connection in a new write transaction, waiting up to the busy timeout.
    pub(super) async fn begin(&self) -> Result<SqliteConn, Error> {
        let tx = self.pool.begin_with(sql::BEGIN_IMMEDIATE).await?;
        Ok(self.open(tx))
    }

    pub(super) fn open(&self, tx: Transaction<'static, Sqlite>) -> SqliteConn {
        SqliteConn {
            tx: Some(tx),
            persistent: self.persistent,
            pool: self.pool.clone(),
            claim: None,
            key: None,
        }
    }

    /// A connection that holds no transaction: the answer needed none.
    pub(super) fn ended(&self) -> SqliteConn {
        SqliteConn {
            tx: None,
            persistent: self.persistent,
            pool: self.pool.clone(),
            claim: None,
            key: None,
        }
    }

    pub(super) async fn rows<T>(
        &self,
        query: Query<'static, Sqlite, SqliteArguments>,
        map: fn(&SqliteRow) -> Result<T, ::sqlx::Error>,
    ) -> Result<Vec<T>, Error> {
        let rows = query.fetch_all(&self.pool).await?;
        Ok(rows.iter().map(map).collect::<Result<_, _>>()?)
    }

    /// Runs a write on the pool; the rows it changed.
    pub(super) async fn affected(
        &self,
        query: Query<'static, Sqlite, SqliteArguments>,
    ) -> Result<u64, Error> {
        Ok(query.execute(&self.pool).await?.rows_affected())
    }
}

pub(super) fn statement(
    sql: &'static str,
    persistent: bool,
) -> Query<'static, Sqlite, SqliteArguments> {
    ::sqlx::query(sql).persistent(persistent)
}

impl crate::store::sqlx_tx::SqlxSlot for SqliteConn {
    type Connection = SqliteConnection;

    fn connection(&self) -> &SqliteConnection {
        SqliteConn::connection(self)
    }

    fn connection_mut(&mut self) -> &mut SqliteConnection {
        SqliteConn::connection_mut(self)
    }

    fn persistent(&self) -> bool {
        SqliteConn::persistent(self)
    }
}

crate::store::sqlx_tx::impl_sqlx_queries!(
    SqliteStore,
    row: SqliteRow,
    statements: [crate::store::queries::statements!(text sql::)],
    affected: affected,
);
