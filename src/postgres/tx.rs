//! [`PgTx`], what a handler runs its statements through on tokio-postgres.

use std::fmt;

use tokio_postgres::types::{BorrowToSql, ToSql};
use tokio_postgres::{RowStream, Statement, ToStatement};

use super::conn::{TxConn, lock_timeout};
use super::statement::{self, Db};
use crate::engine::error::Error;
use crate::engine::record::Deferred;
use crate::engine::shared_tx::{HandleToken, SharedTx};

/// What [`IdempotentTx`](super::IdempotentTx) derefs to on tokio-postgres: the
/// statements of the transaction that also stores the idempotency record
/// ([`query`](Self::query), [`execute`](Self::execute), ...). It refuses `COMMIT`,
/// `ROLLBACK`, `BEGIN` and the like: the layer ends the transaction.
pub struct PgTx {
    token: HandleToken<TxConn>,
}

impl crate::store::TxHandle for PgTx {
    type Conn = TxConn;
    type Target = PgTx;

    /// Handles share the connection (statements wait their turn on it).
    fn on_shared(shared: &std::sync::Arc<SharedTx<TxConn>>) -> Option<Self> {
        Some(PgTx::new(shared.count_handle()))
    }

    fn record_id(&self) -> crate::engine::key::RecordId {
        self.token.id()
    }

    fn target(&self) -> &PgTx {
        self
    }

    fn target_mut(&mut self) -> &mut PgTx {
        self
    }
}

impl PgTx {
    pub(crate) fn new(token: HandleToken<TxConn>) -> Self {
        Self { token }
    }

    /// Runs `f` on the transaction's connection. The first statement of a lazy claim
    /// leaves in one pipeline with `BEGIN`, the key's lock attempt and the record's
    /// look-up after it, and its result is given only once the lock was granted on a key
    /// still free: otherwise it answers [`Error::DuplicateRequest`], and the layer answers
    /// the request as the other request's duplicate.
    pub(super) async fn with_client<T, F>(&self, sql: Option<&str>, f: F) -> Result<T, Error>
    where
        F: AsyncFnOnce(&TxConn) -> Result<T, tokio_postgres::Error>,
    {
        if sql.is_some_and(is_transaction_control) {
            return Err(Error::TransactionControl);
        }
        let slot = self.token.shared().read().await;
        let Some(conn) = slot.as_ref() else {
            return Err(Error::TransactionEnded);
        };
        run_on(conn, f).await
    }

    /// Runs a statement and returns the rows. See [`tokio_postgres::Client::query`].
    pub async fn query<T>(
        &self,
        statement: &T,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>, Error>
    where
        T: ?Sized + TxStatement,
    {
        self.with_client(statement.sql(), async |c| {
            c.client().query(statement, params).await
        })
        .await
    }

    /// Runs a statement that returns exactly one row. See
    /// [`tokio_postgres::Client::query_one`].
    pub async fn query_one<T>(
        &self,
        statement: &T,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<tokio_postgres::Row, Error>
    where
        T: ?Sized + TxStatement,
    {
        self.with_client(statement.sql(), async |c| {
            c.client().query_one(statement, params).await
        })
        .await
    }

    /// Runs a statement that returns at most one row. See
    /// [`tokio_postgres::Client::query_opt`].
    pub async fn query_opt<T>(
        &self,
        statement: &T,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<tokio_postgres::Row>, Error>
    where
        T: ?Sized + TxStatement,
    {
        self.with_client(statement.sql(), async |c| {
            c.client().query_opt(statement, params).await
        })
        .await
    }

    /// Runs a statement and returns the number of rows it affected. See
    /// [`tokio_postgres::Client::execute`].
    pub async fn execute<T>(
        &self,
        statement: &T,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, Error>
    where
        T: ?Sized + TxStatement,
    {
        self.with_client(statement.sql(), async |c| {
            c.client().execute(statement, params).await
        })
        .await
    }

    /// Runs a statement and streams its rows. The stream borrows nothing from the handle,
    /// but it must be consumed before the handler returns. See
    /// [`tokio_postgres::Client::query_raw`].
    pub async fn query_raw<T, P, I>(&self, statement: &T, params: I) -> Result<RowStream, Error>
    where
        T: ?Sized + TxStatement,
        P: BorrowToSql,
        I: IntoIterator<Item = P>,
        I::IntoIter: ExactSizeIterator,
    {
        self.with_client(statement.sql(), async |c| {
            c.client().query_raw(statement, params).await
        })
        .await
    }

    /// Prepares a statement once per pooled connection and returns the cached copy after
    /// that, where the pool keeps a statement cache (deadpool); elsewhere (bb8) it prepares
    /// the statement for this transaction.
    ///
    /// Not behind PgBouncer in transaction pooling mode without prepared-statement support
    /// (before 1.21, or `max_prepared_statements` unset), where the next request's
    /// transaction may run on a server connection that never saw the statement: pass the
    /// SQL text to [`query`](Self::query) and friends instead, and turn the crate's own
    /// prepared statements off with
    /// [`IdempotencyLayer::prepared_statements`](crate::IdempotencyLayer::prepared_statements).
    ///
    /// A statement this connection has already prepared here is handed over at once,
    /// without a round trip, so the claim of a new key rides with the handler's first
    /// statement: on deadpool, `prepare_cached` then `query` costs the round trips of the
    /// handler alone. The first time on a connection, the prepare carries the claim (sent
    /// after it, so a prepare that waits on a table another session locked does not keep a
    /// duplicate from being answered 409).
    pub async fn prepare_cached(&self, query: &str) -> Result<Statement, Error> {
        if is_transaction_control(query) {
            return Err(Error::TransactionControl);
        }
        let slot = self.token.shared().read().await;
        let Some(conn) = slot.as_ref() else {
            return Err(Error::TransactionEnded);
        };
        if let Some(statement) = conn.pooled().cached_statement(query) {
            return Ok(statement);
        }
        run_on(conn, async |conn| {
            match conn.pooled().prepare_cached(query, &[]) {
                Some(cached) => {
                    let statement = cached.await?;
                    conn.pooled().remember_cached(query);
                    Ok(statement)
                }
                None => conn.client().prepare(query).await,
            }
        })
        .await
    }
}

/// Runs `f`, the handler's statement, on the request's connection: with the claim if it is
/// the first, refused if the claim found the key held or its record committed.
async fn run_on<T, F>(conn: &TxConn, f: F) -> Result<T, Error>
where
    F: AsyncFnOnce(&TxConn) -> Result<T, tokio_postgres::Error>,
{
    match conn.first_statement().await {
        Some(_first) => begin_with(conn, f).await,
        None if conn.deferred() != Deferred::Granted => Err(Error::DuplicateRequest),
        None => f(conn).await.map_err(Error::Postgres),
    }
}

/// The first statement of a lazy claim: `BEGIN`, the key's lock attempt, the record's
/// look-up (a statement of its own after the lock, so its snapshot sees what a twin
/// committed before the lock was granted) and the statement, pipelined in one round trip.
async fn begin_with<T, F>(conn: &TxConn, f: F) -> Result<T, Error>
where
    F: AsyncFnOnce(&TxConn) -> Result<T, tokio_postgres::Error>,
{
    let db = Db::new(conn.pooled(), conn.prepared());
    let Some(id) = conn.claimed_record() else {
        // A plain transaction: `BEGIN` and the statement.
        conn.beginning();
        let (begun, result) = tokio::join!(biased; db.client().batch_execute("BEGIN"), f(conn));
        begun?;
        conn.begun(true, false);
        return result.map_err(Error::Postgres);
    };
    if let Some(bound) = conn.optimistic() {
        // The optimistic claim: `BEGIN`, the twins' bound and the statement; no lock.
        let set_timeout = db.prepare(&statement::SET_LOCK_TIMEOUT).await?;
        let timeout = lock_timeout(bound);
        let params: [&(dyn ToSql + Sync); 1] = [&timeout];
        conn.beginning();
        let (begun, timeout_set, result) = tokio::join!(
            biased;
            db.client().batch_execute("BEGIN"),
            db.query_one(&set_timeout, &params),
            f(conn),
        );
        if let Err(error) = begun.and(timeout_set.map(drop)) {
            tracing::warn!(error = %crate::engine::error::Chain(&error), "the optimistic claim's BEGIN failed");
            conn.claim_failed();
            return Err(Error::Postgres(error));
        }
        conn.begun(true, false);
        return result.map_err(Error::Postgres);
    }
    let try_lock = db.prepare(&statement::TRY_LOCK).await?;
    let exists = db.prepare(&statement::EXISTS).await?;
    let lock_key = id.lock_key();
    let lock_params: [&(dyn ToSql + Sync); 1] = [&lock_key];
    let exists_params: [&(dyn ToSql + Sync); 1] = [&id];
    conn.beginning();
    let claim = async {
        tokio::join!(
            biased;
            db.client().batch_execute("BEGIN"),
            db.query_one(&try_lock, &lock_params),
            db.query_opt(&exists, &exists_params),
        )
    };
    let mut claim = std::pin::pin!(claim);
    let mut statement = std::pin::pin!(f(conn));
    let mut done = None;
    // Polled in this order, the four requests leave in one pipeline; the claim's answers
    // come first.
    let (begun, locked, found) = loop {
        tokio::select! {
            biased;
            claimed = &mut claim => break claimed,
            result = &mut statement, if done.is_none() => done = Some(result),
        }
    };
    let claimed = (|| {
        begun?;
        let locked: bool = locked?.try_get(0)?;
        Ok::<_, tokio_postgres::Error>((locked, found?.is_some()))
    })();
    let (locked, found) = match claimed {
        Ok(claimed) => claimed,
        Err(error) => {
            tracing::warn!(error = %crate::engine::error::Chain(&error), "the claim sent with the first statement failed");
            conn.claim_failed();
            return Err(Error::Postgres(error));
        }
    };
    conn.begun(locked, found);
    if locked && !found {
        return match done {
            Some(result) => result,
            None => statement.await,
        }
        .map_err(Error::Postgres);
    }
    if done.is_none() {
        // A duplicate's statement may wait on rows its twin holds: stop it rather than
        // answer only when the twin ends.
        if tokio::time::timeout(STATEMENT_GRACE, &mut statement)
            .await
            .is_err()
        {
            conn.cancel_running().await;
            let _ = statement.await;
        }
    }
    Err(Error::DuplicateRequest)
}

/// How long a duplicate's first statement may take after its claim was refused before
/// it is cancelled.
const STATEMENT_GRACE: std::time::Duration = std::time::Duration::from_millis(50);

impl fmt::Debug for PgTx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotentTx")
            .field("record", &self.token.id())
            .finish_non_exhaustive()
    }
}

mod sealed {
    #[allow(unreachable_pub)]
    pub trait Sealed {}
    impl Sealed for str {}
    impl Sealed for String {}
    impl Sealed for tokio_postgres::Statement {}
}

/// A statement [`IdempotentTx`](super::IdempotentTx) runs: SQL text (`&str`, `String`) or a [`Statement`]
/// prepared through [`PgTx::prepare_cached`].
pub trait TxStatement: sealed::Sealed + ToStatement {
    /// The SQL text, when the statement is not prepared yet.
    #[doc(hidden)]
    fn sql(&self) -> Option<&str>;
}

impl TxStatement for str {
    fn sql(&self) -> Option<&str> {
        Some(self)
    }
}

impl TxStatement for String {
    fn sql(&self) -> Option<&str> {
        Some(self)
    }
}

impl TxStatement for Statement {
    fn sql(&self) -> Option<&str> {
        // Only `prepare_cached`, which checks the text, makes statements for this connection.
        None
    }
}

/// Whether a statement would end the shared transaction or start another one. (Prepared
/// statements hold exactly one command, so the first words decide.) Savepoints of the
/// handler's own are fine.
fn is_transaction_control(sql: &str) -> bool {
    let mut words = sql_words(sql);
    match words.next().unwrap_or_default().as_str() {
        "BEGIN" | "START" | "COMMIT" | "END" | "ABORT" => true,
        "PREPARE" => words.next().as_deref() == Some("TRANSACTION"),
        // ROLLBACK, ROLLBACK WORK, ROLLBACK PREPARED — but not ROLLBACK TO a savepoint.
        "ROLLBACK" => {
            let next = words.next().unwrap_or_default();
            next != "TO" && words.next().as_deref() != Some("TO")
        }
        _ => false,
    }
}

/// Upper-cased words of a statement, skipping whitespace, comments and identifier quotes.
fn sql_words(sql: &str) -> impl Iterator<Item = String> + '_ {
    let mut rest = sql;
    std::iter::from_fn(move || {
        loop {
            rest = rest.trim_start_matches(|c: char| c.is_whitespace() || c == ';' || c == '(');
            if let Some(comment) = rest.strip_prefix("--") {
                rest = comment.split_once('\n').map_or("", |(_, after)| after);
            } else if let Some(comment) = rest.strip_prefix("/*") {
                rest = comment.split_once("*/").map_or("", |(_, after)| after);
            } else {
                break;
            }
        }
        let end = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == '"'))
            .unwrap_or(rest.len());
        if end == 0 {
            return None;
        }
        let (word, after) = rest.split_at(end);
        rest = after;
        Some(word.replace('"', "").to_ascii_uppercase())
    })
}

#[cfg(test)]
mod tests {
    use super::is_transaction_control;

    #[test]
    fn transaction_control_is_refused() {
        for sql in [
            "COMMIT",
            "commit;",
            "  /* sneaky */ -- really\n COMMIT WORK",
            "END",
            "ROLLBACK",
            "rollback prepared 'x'",
            "BEGIN",
            "START TRANSACTION",
            "ABORT",
            "PREPARE TRANSACTION 'x'",
        ] {
            assert!(is_transaction_control(sql), "{sql}");
        }
    }

    #[test]
    fn ordinary_statements_and_own_savepoints_pass() {
        for sql in [
            "INSERT INTO orders VALUES (1)",
            "SELECT 'COMMIT'",
            "SAVEPOINT mine",
            "ROLLBACK TO SAVEPOINT mine",
            "ROLLBACK TO mine",
            "ROLLBACK WORK TO SAVEPOINT mine",
            "RELEASE SAVEPOINT mine",
            "PREPARE q AS SELECT 1",
            "WITH x AS (SELECT 1) SELECT * FROM x",
            "",
        ] {
            assert!(!is_transaction_control(sql), "{sql}");
        }
    }
}
