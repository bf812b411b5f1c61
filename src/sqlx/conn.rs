//! A transaction the crate began on a pooled sqlx connection, and the statement helpers
//! every concern of the driver shares.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;

use ::sqlx::pool::PoolConnection;
use ::sqlx::postgres::{PgArguments, PgRow, PgTransactionManager, Postgres};
use ::sqlx::query::Query;
use ::sqlx::{Executor, PgConnection};
use sqlx_core::transaction::TransactionManager;

use super::SqlxStore;
use super::link::Link;
use crate::engine::error::Error;
use crate::store::queries::Text;
use crate::store::sql;

/// A pooled sqlx connection and the transaction the crate began on it.
///
/// The transaction is begun and ended through sqlx's `TransactionManager` on a
/// `PoolConnection` this value owns, so the connection's transaction depth is right (a
/// handler's nested `sqlx::Connection::begin` is a savepoint) and a connection left inside
/// the transaction — dropped unfinished (a cancelled request, a lost link) or after a
/// statement that failed on the connection itself — is closed, never returned to the pool:
/// the server rolls back, and the pool opens a fresh connection in its place.
pub struct SqlxConn {
    /// `None` once the answer needed no transaction.
    conn: Option<PoolConnection<Postgres>>,
    /// The crate's transaction is open on `conn`.
    open: bool,
    pub(super) persistent: bool,
    /// For the new transaction of a stored 4xx, whose handler writes are discarded.
    pub(super) pool: ::sqlx::PgPool,
    pub(super) link: Arc<Link>,
}

impl SqlxConn {
    /// Begins the crate's transaction on `conn` (bounded by the link's timeout).
    pub(super) async fn begin(
        store: &SqlxStore,
        conn: PoolConnection<Postgres>,
    ) -> Result<Self, ::sqlx::Error> {
        let mut this = Self {
            conn: Some(conn),
            open: true,
            persistent: store.persistent,
            pool: store.pool.clone(),
            link: store.link.clone(),
        };
        let link = this.link.clone();
        // Open from here on: a BEGIN that failed or timed out leaves the state unknown,
        // and the connection is closed when `this` drops.
        link.within(
            Duration::ZERO,
            PgTransactionManager::begin(this.connection_mut(), None),
        )
        .await?;
        Ok(this)
    }

    /// Whether the crate's transaction is still open on this connection.
    pub(super) fn is_open(&self) -> bool {
        self.open && self.conn.is_some()
    }

    /// A store handle with this connection's pool and settings.
    pub(super) fn store(&self) -> SqlxStore {
        SqlxStore {
            pool: self.pool.clone(),
            persistent: self.persistent,
            link: self.link.clone(),
        }
    }

    pub(crate) fn connection(&self) -> &PgConnection {
        self.conn.as_deref().expect("SqlxConn used after it ended")
    }

    /// The store's prepared-statement setting, for statements run through a handle.
    pub(crate) fn persistent(&self) -> bool {
        self.persistent
    }

    /// Commits the transaction (bounded by the link's timeout); the connection goes back
    /// to the pool only if the `COMMIT` was answered.
    pub(super) async fn commit(&mut self) -> Result<(), ::sqlx::Error> {
        self.end(true).await
    }

    /// Rolls the transaction back; the connection is closed instead when the rollback
    /// fails, times out, or the link was just found down.
    pub(super) async fn rollback(&mut self) -> Result<(), ::sqlx::Error> {
        if self.link.recently_lost() {
            return Err(::sqlx::Error::Io(std::io::Error::new(
                std::io::ErrorKind::NotConnected,
                "the database was just found unreachable",
            )));
        }
        self.end(false).await
    }

    /// `COMMIT` or `ROLLBACK`, bounded by the link's timeout; only an answered one hands
    /// the connection back (a failed one leaves it to be closed on drop).
    async fn end(&mut self, commit: bool) -> Result<(), ::sqlx::Error> {
        let link = self.link.clone();
        let conn = self.connection_mut();
        let ending = async move {
            if commit {
                PgTransactionManager::commit(conn).await
            } else {
                PgTransactionManager::rollback(conn).await
            }
        };
        link.within(Duration::ZERO, ending).await?;
        self.open = false;
        self.conn = None;
        Ok(())
    }

    pub(crate) fn connection_mut(&mut self) -> &mut PgConnection {
        self.conn
            .as_deref_mut()
            .expect("SqlxConn used after it ended")
    }
}

crate::store::sqlx_tx::impl_sqlx_tx_queries!(
    SqlxConn,
    row: PgRow,
    rollback_work: sql::INBOX_ROLLBACK_WORK,
);

impl Drop for SqlxConn {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.as_mut() {
            if self.open {
                tracing::debug!("closing a connection left inside a transaction");
                conn.close_on_drop();
            }
        }
    }
}

impl std::fmt::Debug for SqlxConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqlxConn")
            .field("open", &self.open)
            .finish_non_exhaustive()
    }
}

/// Whether `error` left its connection in an unknown state: I/O failed or timed out, or the
/// protocol broke (a database error leaves the connection usable).
pub(super) fn broke_connection(error: &::sqlx::Error) -> bool {
    matches!(error, ::sqlx::Error::Io(_) | ::sqlx::Error::Protocol(_))
}

/// The SQLSTATE of a database error.
pub(super) fn sql_state(error: &::sqlx::Error) -> Option<String> {
    Some(error.as_database_error()?.code()?.into_owned())
}

pub(super) const UNIQUE_VIOLATION: &str = "23505";
pub(super) const LOCK_NOT_AVAILABLE: &str = "55P03";

pub(super) fn lock_timeout(wait: Duration) -> String {
    format!("{}ms", wait.as_millis().max(1))
}

impl SqlxStore {
    pub(super) fn query(&self, sql: &'static str) -> Query<'static, Postgres, PgArguments> {
        statement(sql, self.persistent)
    }

    /// A pooled connection, its checkout bounded by the link's timeout.
    pub(super) async fn acquire(&self) -> Result<PoolConnection<Postgres>, ::sqlx::Error> {
        self.link.within(Duration::ZERO, self.pool.acquire()).await
    }

    pub(super) async fn begin(&self) -> Result<SqlxConn, Error> {
        let conn = self.acquire().await?;
        Ok(SqlxConn::begin(self, conn).await?)
    }

    /// A connection that holds no transaction: the answer needed none.
    pub(super) fn ended(&self) -> SqlxConn {
        SqlxConn {
            conn: None,
            open: false,
            persistent: self.persistent,
            pool: self.pool.clone(),
            link: self.link.clone(),
        }
    }

    /// Runs `statement` on a pooled connection of its own, checkout and statement bounded
    /// together by `bound`; a connection whose statement failed on the link is closed.
    pub(super) async fn on_own_connection_within<T>(
        &self,
        bound: Duration,
        statement: impl for<'c> FnOnce(
            &'c mut PgConnection,
        )
            -> futures_util::future::BoxFuture<'c, Result<T, ::sqlx::Error>>,
    ) -> Result<T, ::sqlx::Error> {
        // One bound for the checkout and the statement together.
        let started = std::time::Instant::now();
        let mut conn = self.acquire().await?;
        let left = bound.saturating_sub(started.elapsed());
        let done = Link::bounded(left, statement(&mut conn)).await;
        if done.as_ref().is_err_and(broke_connection) {
            conn.close_on_drop();
        }
        done
    }

    /// Runs `query` on a connection of its own, bounded by the link's timeout; its rows.
    pub(super) async fn rows<T>(
        &self,
        query: Query<'static, Postgres, PgArguments>,
        map: fn(&PgRow) -> Result<T, ::sqlx::Error>,
    ) -> Result<Vec<T>, Error> {
        self.rows_within(self.link.timeout, query, map).await
    }

    /// Runs a write on a connection of its own, bounded by the link's timeout; the rows it
    /// changed.
    pub(super) async fn affected(
        &self,
        query: Query<'static, Postgres, PgArguments>,
    ) -> Result<u64, Error> {
        self.affected_within(self.link.timeout, query).await
    }

    /// [`rows`](Self::rows) with a bound of its own.
    pub(super) async fn rows_within<T>(
        &self,
        bound: Duration,
        query: Query<'static, Postgres, PgArguments>,
        map: fn(&PgRow) -> Result<T, ::sqlx::Error>,
    ) -> Result<Vec<T>, Error> {
        let rows = self
            .on_own_connection_within(bound, |conn| Box::pin(query.fetch_all(conn)))
            .await?;
        Ok(rows.iter().map(map).collect::<Result<_, _>>()?)
    }

    /// [`affected`](Self::affected) with a bound of its own.
    pub(super) async fn affected_within(
        &self,
        bound: Duration,
        query: Query<'static, Postgres, PgArguments>,
    ) -> Result<u64, Error> {
        let done = self
            .on_own_connection_within(bound, |conn| Box::pin(query.execute(conn)))
            .await?;
        Ok(done.rows_affected())
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

impl crate::store::sqlx_tx::SqlxSlot for SqlxConn {
    type Connection = PgConnection;

    fn connection(&self) -> &PgConnection {
        SqlxConn::connection(self)
    }

    fn connection_mut(&mut self) -> &mut PgConnection {
        SqlxConn::connection_mut(self)
    }

    fn persistent(&self) -> bool {
        SqlxConn::persistent(self)
    }

    /// Bounded by the link's timeout.
    async fn run_statement<T: Send>(
        &mut self,
        work: impl for<'c> FnOnce(&'c mut PgConnection) -> BoxFuture<'c, Result<T, ::sqlx::Error>>
        + Send,
    ) -> Result<T, ::sqlx::Error> {
        let link = self.link.clone();
        link.within(Duration::ZERO, work(self.connection_mut()))
            .await
    }
}

/// Lease mode: the upsert, the text tokio-postgres runs too.
impl crate::store::UpsertLease for SqlxStore {
    const LEASE_ACQUIRE: &'static Text = &Text::new(sql::LEASE_ACQUIRE);
}

crate::store::sqlx_tx::impl_sqlx_queries!(
    SqlxStore,
    row: PgRow,
    statements: [crate::store::queries::statements!(text crate::store::sql::)],
    affected: affected,
    batch_bound: super::maintenance::BATCH_BOUND,
);
