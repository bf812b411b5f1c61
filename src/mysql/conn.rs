//! A pooled MySQL/MariaDB connection the crate changed (a transaction, session settings),
//! its clean way back to the pool, and the statement helpers every concern shares.

use std::time::Duration;

use futures_util::{FutureExt, StreamExt};

use futures_util::future::BoxFuture;

use ::sqlx::mysql::{MySql, MySqlArguments, MySqlDatabaseError, MySqlRow};
use ::sqlx::pool::PoolConnection;
use ::sqlx::query::Query;
use ::sqlx::{
    AssertSqlSafe, Connection, Either, Executor, MySqlConnection, SqlSafeStr, Transaction,
};

use super::{MySqlStore, sql};
use crate::engine::error::Error;
use crate::store::queries::Text;

/// A pooled connection the crate took out of the pool: possibly inside a transaction it
/// began, possibly with its session settings changed (`autocommit`, the lock wait timeout).
///
/// It goes back to the pool only through [`finish`](Self::finish), which ends the
/// transaction and restores the settings in one round trip. Dropped on any other path (an
/// error, a dropped future, a panic), the connection is closed instead of returned, and the
/// server rolls its transaction back: a connection never goes back to the pool inside a
/// transaction or with the crate's session settings.
pub struct MySqlConn {
    conn: Option<PoolConnection<MySql>>,
    /// The crate began a transaction or changed session settings not yet restored.
    dirty: bool,
    /// The crate may have left `wsrep_sync_wait` changed (a Galera node's claim that
    /// stopped before restoring it): the rollback restores it too.
    pub(super) causal: bool,
    /// The connection is to a Galera node: the completion reads its record back after the
    /// commit (see `Store::commit`).
    pub(super) galera: bool,
    pub(super) persistent: bool,
}

impl MySqlConn {
    pub(super) fn new(conn: PoolConnection<MySql>, persistent: bool) -> Self {
        Self {
            conn: Some(conn),
            dirty: false,
            causal: false,
            galera: false,
            persistent,
        }
    }

    pub(crate) fn connection(&self) -> &MySqlConnection {
        self.conn.as_deref().expect("MySqlConn used after it ended")
    }

    pub(crate) fn connection_mut(&mut self) -> &mut MySqlConnection {
        self.conn
            .as_deref_mut()
            .expect("MySqlConn used after it ended")
    }

    /// The store's prepared-statement setting, for statements run through a handle.
    pub(crate) fn persistent(&self) -> bool {
        self.persistent
    }

    /// Runs `begin` (session settings ending in `START TRANSACTION`, and what a claim sends
    /// with it) through sqlx's transaction manager, so sqlx counts the transaction: a
    /// handler's nested `Connection::begin` then takes a SAVEPOINT instead of sending
    /// `BEGIN`, which in MySQL would commit the request's transaction.
    pub(super) async fn begin(&mut self, begin: String) -> Result<(), ::sqlx::Error> {
        self.dirty = true;
        let tx = Transaction::<MySql>::begin(
            self.connection_mut(),
            Some(AssertSqlSafe(begin).into_sql_str()),
        )
        .await?;
        // sqlx now counts the transaction on the connection; the crate ends it itself, in
        // `finish`, with the session's restore in the same round trip.
        std::mem::forget(tx);
        Ok(())
    }

    /// Runs `begin` as it is: for the crate's own short transactions, whose connection no
    /// handler sees, so sqlx need not count them (and `finish` need not uncount them).
    pub(super) async fn begin_internal(&mut self, begin: &str) -> Result<(), ::sqlx::Error> {
        self.dirty = true;
        self.connection_mut()
            .execute(AssertSqlSafe(begin.to_owned()))
            .await?;
        Ok(())
    }

    /// Commits the transaction.
    pub(super) async fn commit(&mut self) -> Result<(), ::sqlx::Error> {
        self.finish(true).await
    }

    /// Ends the transaction (`COMMIT` or `ROLLBACK`) and restores the session in the same
    /// round trip; the connection may then go back to the pool. On error it stays dirty,
    /// and is closed when dropped.
    pub(super) async fn finish(&mut self, commit: bool) -> Result<(), ::sqlx::Error> {
        let end = match (commit, self.causal) {
            (true, _) => sql::COMMIT_AND_RESTORE,
            (false, false) => sql::ROLLBACK_AND_RESTORE,
            (false, true) => sql::ROLLBACK_AND_RESTORE_ALL,
        };
        self.connection_mut().execute(end).await?;
        self.causal &= commit;
        self.settle();
        Ok(())
    }

    /// The transaction has ended on the server and the session is restored (by `finish`,
    /// or by a completion's own text query): the connection may go back to the pool once
    /// sqlx's count of the transaction, if it counts one, is back to zero.
    pub(super) fn settle(&mut self) {
        let conn = self.connection_mut();
        if conn.is_in_transaction() {
            // sqlx's count goes back to zero the one way its public API offers: a custom
            // `BEGIN` inside a counted transaction is refused at once, without a round
            // trip, and the refused `Transaction`, dropped, counts one transaction ended
            // and queues a `ROLLBACK` — a no-op now, sent with the pool's release check.
            let refused = matches!(
                Transaction::<MySql>::begin(
                    &mut *conn,
                    Some(AssertSqlSafe("BEGIN").into_sql_str()),
                )
                .now_or_never(),
                Some(Err(::sqlx::Error::InvalidSavePointStatement))
            );
            if !refused || conn.is_in_transaction() {
                // Not what sqlx 0.9 does: keep the connection out of the pool.
                return;
            }
        }
        self.dirty = false;
    }

    /// Runs a text query of several statements (which may change the session), gathering
    /// what it answered up to its first error.
    pub(super) async fn run(&mut self, query: String) -> Answered {
        self.dirty = true;
        let mut answered = Answered {
            rows: Vec::new(),
            rows_affected: 0,
            last_insert_id: 0,
            error: None,
        };
        let mut stream = self.connection_mut().fetch_many(AssertSqlSafe(query));
        while let Some(item) = stream.next().await {
            match item {
                Ok(Either::Left(done)) => {
                    answered.rows_affected += done.rows_affected();
                    answered.last_insert_id = answered.last_insert_id.max(done.last_insert_id());
                }
                Ok(Either::Right(row)) => answered.rows.push(row),
                Err(error) => {
                    answered.error = Some(error);
                    break;
                }
            }
        }
        answered
    }

    /// Rolls back and restores the session, or, if that fails, leaves the connection to be
    /// closed when dropped.
    pub(super) async fn reset(&mut self) {
        if self.conn.is_none() || !self.dirty {
            return;
        }
        if let Err(error) = self.finish(false).await {
            tracing::debug!(%error, "ROLLBACK failed; the connection is closed");
        }
    }

    /// Ends the connection's use: back to the pool if clean, closed otherwise.
    pub(super) fn release(&mut self) {
        if let Some(mut conn) = self.conn.take() {
            if self.dirty {
                conn.close_on_drop();
            }
        }
    }
}

impl Drop for MySqlConn {
    fn drop(&mut self) {
        self.release();
    }
}

impl std::fmt::Debug for MySqlConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MySqlConn")
            .field("open", &self.conn.is_some())
            .field("dirty", &self.dirty)
            .finish_non_exhaustive()
    }
}

/// What the server is: the claim's shape depends on it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Server {
    /// MariaDB: a statement may bound its own lock wait (`SET STATEMENT`), and a lock wait
    /// timeout of 0 refuses at once.
    pub(super) mariadb: bool,
    /// A Galera node (`wsrep_on`).
    pub(super) galera: bool,
}

/// What a text query of several statements answered before its first error.
pub(super) struct Answered {
    /// The rows of its statements, in order.
    pub(super) rows: Vec<MySqlRow>,
    /// The rows its statements changed, together.
    pub(super) rows_affected: u64,
    /// The largest `last_insert_id` a statement reported (a drawn fencing token).
    pub(super) last_insert_id: u64,
    /// The error that stopped it; `None`: every statement ran.
    pub(super) error: Option<::sqlx::Error>,
}

/// The server's error number of a database error.
pub(super) fn error_number(error: &::sqlx::Error) -> Option<u16> {
    Some(
        error
            .as_database_error()?
            .try_downcast_ref::<MySqlDatabaseError>()?
            .number(),
    )
}

/// Duplicate key.
pub(super) const DUPLICATE_KEY: u16 = 1062;
/// A deadlock, or on Galera a certification failure: the transaction was rolled back.
pub(super) const DEADLOCK: u16 = 1213;
/// A `NOT NULL` column given `NULL`: lease mode's token when the counter row is missing.
pub(super) const COLUMN_CANNOT_BE_NULL: u16 = 1048;
/// `SAVEPOINT ... does not exist`: the transaction that took it is gone.
pub(super) const NO_SUCH_SAVEPOINT: u16 = 1305;
/// "Transaction characteristics can't be changed while a transaction is in progress".
pub(super) const TRANSACTION_IN_PROGRESS: u16 = 1568;

/// A lock not granted: `NOWAIT` refused (MariaDB 1205, MySQL 3572) or the lock wait
/// timeout passed (1205).
pub(super) fn lock_refused(error: &::sqlx::Error) -> bool {
    matches!(error_number(error), Some(1205 | 3572))
}

/// The transient error for a transaction the server rolled back under the handler (a
/// deadlock, or a lock wait timeout with `innodb_rollback_on_timeout`) that the handler did
/// not pass on: nothing of it was committed, and a retry may succeed.
pub(super) fn transaction_lost() -> Error {
    Error::Sqlx(::sqlx::Error::Io(std::io::Error::new(
        std::io::ErrorKind::Interrupted,
        "MySQL rolled the transaction back under the handler (a deadlock or lock wait \
         timeout it did not pass on); nothing was committed",
    )))
}

/// A savepoint statement's error: the savepoint gone means the transaction is gone.
pub(super) fn savepoint_error(error: ::sqlx::Error) -> Error {
    if error_number(&error) == Some(NO_SUCH_SAVEPOINT) {
        transaction_lost()
    } else {
        Error::Sqlx(error)
    }
}

/// Whole seconds for `innodb_lock_wait_timeout` (at least 1): `wait` rounded up.
pub(super) fn lock_wait_seconds(wait: Option<Duration>) -> u64 {
    let Some(wait) = wait else { return 1 };
    let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    secs.clamp(1, 3600)
}

/// A duration in whole microseconds, for `INTERVAL ? MICROSECOND`.
pub(super) fn micros(duration: Duration) -> i64 {
    i64::try_from(duration.as_micros()).unwrap_or(i64::MAX / 2)
}

pub(super) fn statement(
    sql: &'static str,
    persistent: bool,
) -> Query<'static, MySql, MySqlArguments> {
    ::sqlx::query(sql).persistent(persistent)
}

impl MySqlStore {
    pub(super) fn query(&self, sql: &'static str) -> Query<'static, MySql, MySqlArguments> {
        statement(sql, self.persistent)
    }

    /// A pooled connection, not yet changed.
    pub(super) async fn acquire(&self) -> Result<MySqlConn, Error> {
        Ok(MySqlConn::new(self.pool.acquire().await?, self.persistent))
    }

    /// What the server is, on a connection of its own the first time.
    pub(super) async fn server_known(&self) -> Result<Server, Error> {
        if let Some(server) = self.server.get() {
            return Ok(*server);
        }
        let mut conn = self.acquire().await?;
        self.server(&mut conn).await
    }

    /// What the server is, asked on `conn` the first time.
    pub(super) async fn server(&self, conn: &mut MySqlConn) -> Result<Server, Error> {
        let server = self
            .server
            .get_or_try_init(|| async {
                let conn = conn.connection_mut();
                let version: String =
                    ::sqlx::Row::try_get(&conn.fetch_one(super::migrate::VERSION).await?, 0)?;
                let wsrep_on = match conn.fetch_optional(super::migrate::WSREP_ON).await? {
                    Some(row) => ::sqlx::Row::try_get::<String, _>(&row, 1)?,
                    None => String::new(),
                };
                Ok::<_, Error>(Server {
                    mariadb: version.to_ascii_lowercase().contains("mariadb"),
                    galera: wsrep_on.eq_ignore_ascii_case("ON"),
                })
            })
            .await?;
        Ok(*server)
    }

    /// A pooled connection on which `begin` succeeded, [`counted`](MySqlConn::begin) by
    /// sqlx or [not](MySqlConn::begin_internal). A connection that comes out of the pool
    /// inside a transaction — a caller's future dropped while its `BEGIN` was in flight
    /// leaves one there, as sqlx counts a transaction only once `BEGIN`'s answer arrived —
    /// refuses the first statement that sets the next transaction's isolation (1568); it is
    /// closed, which rolls that transaction back, and another is taken.
    pub(super) async fn acquire_begun(
        &self,
        begin: &str,
        counted: bool,
    ) -> Result<MySqlConn, Error> {
        let mut closed = 0;
        loop {
            let mut conn = self.acquire().await?;
            let begun = if counted {
                conn.begin(begin.to_owned()).await
            } else {
                conn.begin_internal(begin).await
            };
            match begun {
                Ok(()) => return Ok(conn),
                Err(e) if self.discard_dirty(&e, &mut closed) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Whether `error` says the connection came out of the pool inside a transaction
    /// (1568), and another may be taken: at most as many as the pool holds, plus one.
    /// The connection, marked changed, is closed when dropped.
    pub(super) fn discard_dirty(&self, error: &::sqlx::Error, closed: &mut u32) -> bool {
        if error_number(error) != Some(TRANSACTION_IN_PROGRESS) || *closed > self.pool.size() {
            return false;
        }
        *closed += 1;
        tracing::warn!(
            "a pooled MySQL connection was inside a transaction nobody ended (a dropped \
             caller's BEGIN); it is closed, which rolls that transaction back"
        );
        true
    }

    /// `query` (see [`MySqlConn::run`]) on a pooled connection; one found inside a stray
    /// transaction is closed and the query sent again on another (see
    /// [`acquire_begun`](Self::acquire_begun)).
    pub(super) async fn run(&self, query: String) -> Result<(MySqlConn, Answered), Error> {
        let mut closed = 0;
        loop {
            let mut conn = self.acquire().await?;
            let answered = conn.run(query.clone()).await;
            match &answered.error {
                Some(e) if self.discard_dirty(e, &mut closed) => {}
                _ => return Ok((conn, answered)),
            }
        }
    }

    /// A connection inside a READ COMMITTED transaction whose row-lock waits are bounded
    /// by `lock_wait` whole seconds, for the crate's own short transactions.
    pub(super) async fn begin_internal(&self, lock_wait: u64) -> Result<MySqlConn, Error> {
        self.acquire_begun(&sql::begin(Some(lock_wait), false), false)
            .await
    }

    /// `query` run on its own (autocommit, READ COMMITTED) with its lock waits bounded to
    /// one second; the rows it affected.
    pub(super) async fn execute_bounded(
        &self,
        query: Query<'static, MySql, MySqlArguments>,
    ) -> Result<u64, Error> {
        let mut conn = self.acquire_begun(sql::BOUND_NEXT_STATEMENT, false).await?;
        let done = query.execute(conn.connection_mut()).await?;
        conn.finish(false).await?;
        Ok(done.rows_affected())
    }

    pub(super) async fn rows<T>(
        &self,
        query: Query<'static, MySql, MySqlArguments>,
        map: fn(&MySqlRow) -> Result<T, ::sqlx::Error>,
    ) -> Result<Vec<T>, Error> {
        let rows = query.fetch_all(&self.pool).await?;
        Ok(rows.iter().map(map).collect::<Result<_, _>>()?)
    }
}

impl crate::store::sqlx_tx::SqlxSlot for MySqlConn {
    type Connection = MySqlConnection;

    fn connection(&self) -> &MySqlConnection {
        MySqlConn::connection(self)
    }

    fn connection_mut(&mut self) -> &mut MySqlConnection {
        MySqlConn::connection_mut(self)
    }

    fn persistent(&self) -> bool {
        MySqlConn::persistent(self)
    }

    /// A failed statement resets the connection (its transaction is over).
    async fn run_statement<T: Send>(
        &mut self,
        work: impl for<'c> FnOnce(&'c mut MySqlConnection) -> BoxFuture<'c, Result<T, ::sqlx::Error>>
        + Send,
    ) -> Result<T, ::sqlx::Error> {
        let done = work(self.connection_mut()).await;
        if done.is_err() {
            self.reset().await;
        }
        done
    }
}

// Every write of the console with its lock waits bounded.
crate::store::sqlx_tx::impl_sqlx_tx_queries!(
    MySqlConn,
    row: MySqlRow,
    rollback_work: sql::ROLLBACK_WORK,
);

crate::store::sqlx_tx::impl_sqlx_queries!(
    MySqlStore,
    row: MySqlRow,
    statements: [crate::store::queries::Statements {
        // Their placeholders take the values to set first, the row's key last.
        lease_complete: &Text::ordered(sql::LEASE_COMPLETE, &[2, 3, 4, 5, 6, 7, 8, 0, 1]),
        inbox_record_failure: &Text::ordered(sql::INBOX_RECORD_FAILURE, &[2, 3, 4, 5, 6, 0, 1]),
        inbox_record_success: &Text::ordered(sql::INBOX_RECORD_SUCCESS, &[2, 3, 4, 5, 6, 0, 1]),
        // Whether the archive keeps the response first, the limit last.
        export_records: &Text::ordered(sql::EXPORT_RECORDS, &[4, 4, 4, 2, 0, 1, 3]),
        ..crate::store::queries::statements!(text sql::)
    }],
    affected: execute_bounded,
);
