//! A pooled connection that may be inside a transaction, and the rule that it never goes
//! back to its pool inside one; the checkout and the statement helpers every concern of
//! the driver shares.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::Duration;

use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Row};

use super::PgStore;
use super::pool::PooledClient;
use super::statement::{self, Db, Sql};
use crate::engine::error::Error;
use crate::engine::key::RecordId;
use crate::engine::record::Deferred;
use crate::store::sql;

/// How long a background ROLLBACK may take before the connection is discarded instead: no
/// longer than the default bound on an answer during a silent link cut, so a rollback sent
/// into a dead link never pins a pool slot past it.
const ROLLBACK_TIMEOUT: Duration = Duration::from_secs(4);

/// A pooled connection that may be inside a transaction.
///
/// It never goes back to the pool inside a transaction: dropped while one is open, it
/// rolls back in a background task, and if that is impossible (no runtime, or the ROLLBACK
/// fails) the connection is [discarded](PooledClient::discard), so the server rolls back.
pub struct TxConn {
    conn: Option<Box<dyn PooledClient>>,
    in_transaction: AtomicBool,
    /// The store's prepared-statement setting, for statements run after the claim.
    prepared: bool,
    /// The lazy claim ([`TxConn::lazy`]): whether `BEGIN` and the key's lock are still to
    /// be sent, were sent with the first statement, or were refused.
    begin: AtomicU8,
    /// Serialises the first statements of a lazy transaction, so one of them carries the
    /// `BEGIN` and the lock.
    first: tokio::sync::Mutex<()>,
    /// The record the lazy claim takes the lock of, and looks up, with the first statement.
    id: Option<RecordId>,
    /// A query cancel was sent on this connection: it never goes back to the pool, where
    /// a late cancel could stop another request's statement.
    cancelled: AtomicBool,
    /// The optimistic claim: no lock with the first statement, and the transaction's
    /// `lock_timeout`, which bounds a twin's wait on the winner's uncommitted key.
    optimistic: Option<Duration>,
}

/// [`TxConn::begin`]: a transaction the claim already began (and locked).
const BEGUN: u8 = 0;
/// [`TxConn::begin`]: no statement sent yet; the first one carries `BEGIN` and the lock.
const LAZY: u8 = 1;
/// [`TxConn::begin`]: the lock sent with the first statement was held by another request.
const REFUSED: u8 = 2;
/// [`TxConn::begin`]: the lock was granted, but the key's record committed before it.
const FOUND: u8 = 3;
/// [`TxConn::begin`]: `BEGIN`, the lock or the look-up sent with the first statement failed.
const FAILED: u8 = 4;

impl TxConn {
    /// Wraps a connection that is about to begin a transaction.
    pub(crate) fn new(conn: Box<dyn PooledClient>, prepared: bool) -> Self {
        Self::with_state(conn, prepared, BEGUN, None, true)
    }

    /// Wraps a connection outside any transaction, for a key the claim found free: its
    /// `BEGIN` and the key's lock attempt leave in one pipeline with the handler's first
    /// statement (or, when the handler sends none, with the record's insert and `COMMIT`).
    pub(crate) fn lazy(conn: Box<dyn PooledClient>, prepared: bool, id: RecordId) -> Self {
        Self::with_state(conn, prepared, LAZY, Some(id), false)
    }

    fn with_state(
        conn: Box<dyn PooledClient>,
        prepared: bool,
        begin: u8,
        id: Option<RecordId>,
        in_transaction: bool,
    ) -> Self {
        Self {
            conn: Some(conn),
            in_transaction: AtomicBool::new(in_transaction),
            prepared,
            begin: AtomicU8::new(begin),
            first: tokio::sync::Mutex::new(()),
            id,
            cancelled: AtomicBool::new(false),
            optimistic: None,
        }
    }

    /// Makes a lazy claim optimistic (`Some(bound)`): its first statement carries `BEGIN`
    /// and the bound as `lock_timeout`, no lock attempt and no look-up; the record's primary
    /// key decides between twins at the insert.
    pub(crate) fn set_optimistic(&mut self, bound: Option<Duration>) {
        self.optimistic = bound;
    }

    /// The optimistic claim's bound, if this is one.
    pub(crate) fn optimistic(&self) -> Option<Duration> {
        self.optimistic
    }

    /// Wraps a connection outside any transaction for a plain transaction (no key): its
    /// `BEGIN` leaves in one pipeline with the handler's first statement.
    pub(crate) fn plain(conn: Box<dyn PooledClient>, prepared: bool) -> Self {
        Self::with_state(conn, prepared, LAZY, None, false)
    }

    /// The record a lazy claim locks with the first statement; `None` for a plain
    /// transaction.
    pub(crate) fn claimed_record(&self) -> Option<RecordId> {
        self.id
    }

    /// Whether a transaction may be open on the connection: begun, or its `BEGIN` sent
    /// (or about to be, in a pipeline whose future may have been dropped midway).
    pub(crate) fn in_transaction(&self) -> bool {
        self.in_transaction.load(Ordering::Acquire)
    }

    /// Whether no statement has been sent yet on a lazy claim's connection.
    pub(crate) fn is_lazy(&self) -> bool {
        self.begin.load(Ordering::Acquire) == LAZY
    }

    /// What the lock sent with the first statement found.
    pub(crate) fn deferred(&self) -> Deferred {
        match self.begin.load(Ordering::Acquire) {
            REFUSED => Deferred::InFlight,
            FOUND => Deferred::Found,
            FAILED => Deferred::Failed,
            _ => Deferred::Granted,
        }
    }

    /// Serialises a lazy transaction's first statements; `None` once it has begun (or was
    /// refused), when no serialising is needed.
    pub(crate) async fn first_statement(&self) -> Option<tokio::sync::MutexGuard<'_, ()>> {
        if !self.is_lazy() {
            return None;
        }
        let guard = self.first.lock().await;
        self.is_lazy().then_some(guard)
    }

    /// Cancels the statement the server is running on this connection, and marks the
    /// connection to be closed rather than pooled once its transaction ends.
    pub(crate) async fn cancel_running(&self) {
        self.cancelled.store(true, Ordering::Release);
        self.in_transaction.store(true, Ordering::Release);
        let token = self.client().cancel_token();
        if let Err(error) = token.cancel_query(tokio_postgres::NoTls).await {
            tracing::debug!(%error, "could not cancel a duplicate's statement; it runs to its end");
        }
    }

    /// Marks the connection as inside a transaction before a pipeline that begins one is
    /// sent: if that pipeline's future is dropped midway, the connection still rolls back
    /// before it goes back to the pool.
    pub(crate) fn beginning(&self) {
        self.in_transaction.store(true, Ordering::Release);
    }

    /// Records that the claim's statements sent with the first statement failed.
    pub(crate) fn claim_failed(&self) {
        self.begin.store(FAILED, Ordering::Release);
    }

    /// Records what the pipeline that carried `BEGIN`, the lock and the look-up found:
    /// the transaction is open either way (a refused one rolls back like any other).
    pub(crate) fn begun(&self, locked: bool, found: bool) {
        let state = match (locked, found) {
            (false, _) => REFUSED,
            (true, true) => FOUND,
            (true, false) => BEGUN,
        };
        self.begin.store(state, Ordering::Release);
    }

    pub(crate) fn prepared(&self) -> bool {
        self.prepared
    }

    pub(crate) fn pooled(&self) -> &dyn PooledClient {
        // `conn` is only taken in `Drop` and `rollback`, which consume the value.
        self.conn.as_deref().expect("TxConn used after drop")
    }

    pub(crate) fn client(&self) -> &Client {
        self.pooled().client()
    }

    /// Marks the transaction as ended (committed or rolled back by the server); the
    /// connection may go back to the pool.
    pub(crate) fn mark_ended(&mut self) {
        *self.in_transaction.get_mut() = false;
    }

    /// Rolls back and returns the connection to the pool, waiting for the ROLLBACK.
    pub(crate) async fn rollback(mut self) {
        let Some(conn) = self.conn.take() else {
            return;
        };
        if *self.cancelled.get_mut() {
            conn.discard();
            return;
        }
        if !*self.in_transaction.get_mut() {
            // A lazy claim that never began: the connection is clean.
            return;
        }
        rollback_or_discard(DiscardOnDrop(Some(conn))).await;
    }
}

impl Drop for TxConn {
    fn drop(&mut self) {
        if !*self.in_transaction.get_mut() {
            return;
        }
        let Some(conn) = self.conn.take() else {
            return;
        };
        if *self.cancelled.get_mut() {
            conn.discard();
            return;
        }
        let guard = DiscardOnDrop(Some(conn));
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(rollback_or_discard(guard));
            }
            Err(_) => drop(guard),
        }
    }
}

impl fmt::Debug for TxConn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TxConn")
            .field("in_transaction", &self.in_transaction)
            .field("begin", &self.begin)
            .finish_non_exhaustive()
    }
}

/// Owns a connection of unknown state: dropped, it discards the connection rather than
/// return it to the pool.
struct DiscardOnDrop(Option<Box<dyn PooledClient>>);

impl Drop for DiscardOnDrop {
    fn drop(&mut self) {
        if let Some(conn) = self.0.take() {
            tracing::debug!("discarding a connection whose transaction state is unknown");
            conn.discard();
        }
    }
}

async fn rollback_or_discard(mut guard: DiscardOnDrop) {
    let Some(conn) = guard.0.as_ref() else {
        return;
    };
    let rolled_back =
        tokio::time::timeout(ROLLBACK_TIMEOUT, conn.client().batch_execute("ROLLBACK")).await;
    if let Ok(Ok(())) = rolled_back {
        // Clean: back to the pool.
        drop(guard.0.take());
    }
}

impl PgStore {
    pub(crate) fn db<'a>(&self, conn: &'a dyn super::PooledClient) -> Db<'a> {
        Db::new(conn, self.prepared)
    }

    pub(crate) async fn checkout(&self) -> Result<Box<dyn super::PooledClient>, Error> {
        self.pool.get().await.map_err(Error::Pool)
    }

    /// Runs one statement on a connection of its own and maps its rows.
    pub(crate) async fn rows<T>(
        &self,
        sql: &'static Sql,
        params: &[&(dyn ToSql + Sync)],
        map: fn(&Row) -> Result<T, tokio_postgres::Error>,
    ) -> Result<Vec<T>, Error> {
        let conn = self.checkout().await?;
        let db = self.db(&*conn);
        let statement = db.prepare(sql).await?;
        let rows = db.query(&statement, params).await?;
        Ok(rows.iter().map(map).collect::<Result<_, _>>()?)
    }

    /// Runs one statement on a connection of its own; the rows it affected.
    pub(crate) async fn execute(
        &self,
        sql: &'static Sql,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, Error> {
        let conn = self.checkout().await?;
        let db = self.db(&*conn);
        let statement = db.prepare(sql).await?;
        Ok(db.execute(&statement, params).await?)
    }
}

pub(crate) fn lock_timeout(wait: Duration) -> String {
    format!("{}ms", wait.as_millis().max(1))
}

/// `BEGIN`, the key's lock awaited for at most `wait`, and `lookup` after it, pipelined in
/// one round trip; `Ok(None)` when the lock was not granted in time (the transaction is
/// then aborted, and rolls back when the connection is dropped).
pub(crate) async fn begin_wait_and_look_up(
    db: Db<'_>,
    lock_key: i64,
    wait: Duration,
    lookup: &'static Sql,
    lookup_params: &[&(dyn ToSql + Sync)],
    savepoint: Option<&'static str>,
) -> Result<Option<Option<Row>>, Error> {
    let set_timeout = db.prepare(&statement::SET_LOCK_TIMEOUT).await?;
    let lock = db.prepare(&statement::WAIT_LOCK).await?;
    let lookup = db.prepare(lookup).await?;
    let client = db.client();
    let timeout = lock_timeout(wait);
    let timeout_params: [&(dyn ToSql + Sync); 1] = [&timeout];
    let lock_params: [&(dyn ToSql + Sync); 1] = [&lock_key];
    let (begin, timeout_set, locked, reset, found, saved) = tokio::join!(
        biased;
        client.batch_execute("BEGIN"),
        db.query_one(&set_timeout, &timeout_params),
        db.query_one(&lock, &lock_params),
        client.batch_execute(sql::RESET_LOCK_TIMEOUT),
        db.query_opt(&lookup, lookup_params),
        async {
            match savepoint {
                Some(savepoint) => client.batch_execute(savepoint).await,
                None => Ok(()),
            }
        },
    );
    begin?;
    timeout_set?;
    match locked {
        Err(e) if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => return Ok(None),
        locked => locked?,
    };
    reset?;
    let found = found?;
    saved?;
    Ok(Some(found))
}
