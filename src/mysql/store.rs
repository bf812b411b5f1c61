//! [`Store`] for MySQL/MariaDB: the claim under the key's row lock with the record's
//! placeholder inserted at the start of the transaction, and the completion that turns the
//! placeholder into the record.

use std::time::Duration;

use ::sqlx::mysql::MySqlRow;
use ::sqlx::{Executor, MySqlConnection, Row};

use super::MySqlStore;
use super::MySqlTx;
use super::conn::{
    DEADLOCK, DUPLICATE_KEY, MySqlConn, error_number, lock_refused, lock_wait_seconds,
    savepoint_error, statement, transaction_lost,
};
use super::{batch, sql};
use crate::engine::error::Error;
use crate::engine::fingerprint::Fingerprint;
use crate::engine::key::RecordId;
use crate::engine::record::{Claim, CommitError, Completion, NewRecord};
use crate::store::rows::impl_row;
use crate::store::{Store, rows};

impl_row!(MySqlRow, ::sqlx::Error);

/// The completion of a record too large to inline, before its commit: the savepoint
/// check and the bound `UPDATE` — two round trips; the rows it changed.
async fn complete_bound(
    conn: &mut MySqlConn,
    record: &NewRecord<'_>,
    discard: bool,
) -> Result<u64, ::sqlx::Error> {
    let check = if discard {
        sql::ROLLBACK_WORK
    } else {
        sql::RELEASE_WORK
    };
    conn.connection_mut().execute(check).await?;
    let done = batch::bind(
        statement(sql::COMPLETE, conn.persistent),
        &batch::complete_values(record),
    )
    .execute(conn.connection_mut())
    .await?;
    Ok(done.rows_affected())
}

/// On a Galera node, the record read back after the commit. A twin on another node whose
/// commit certified first rolls this transaction back, and Galera does not always report
/// it: a brute-force abort that lands while a text query of several statements runs can
/// end that transaction with no error, and the rest of the query (and the commit) then run
/// outside it (`tests-integration/tests/galera.rs` meets it). The record the node now holds says what
/// happened: this request's answer (committed, or a twin's byte for byte the same, which is
/// as true), or another one — then this request lost, and is answered as the twin's
/// duplicate.
async fn verify_record(conn: &mut MySqlConn, record: &NewRecord<'_>) -> Result<(), CommitError> {
    let row = statement(sql::RECORD_RESPONSE, conn.persistent)
        .bind(&record.id.as_bytes()[..])
        .fetch_optional(conn.connection_mut())
        .await
        .map_err(|e| CommitError::Failed(e.into()))?;
    let ours = match &row {
        Some(row) => {
            let status: i16 = row.try_get(0).map_err(|e| CommitError::Failed(e.into()))?;
            let headers: Vec<u8> = row.try_get(1).map_err(|e| CommitError::Failed(e.into()))?;
            let body: Vec<u8> = row.try_get(2).map_err(|e| CommitError::Failed(e.into()))?;
            i32::from(status) == i32::from(record.status.as_u16())
                && headers == record.headers
                && body[..] == record.body.bytes[..]
        }
        None => false,
    };
    if ours {
        Ok(())
    } else {
        tracing::warn!(
            record = %record.id,
            "the commit was answered OK but the node holds another answer for the key: a twin \
             on another Galera node won, and this transaction was rolled back"
        );
        Err(CommitError::Conflict)
    }
}

impl Store for MySqlStore {
    type Handle = MySqlTx;
    type Tx = MySqlConnection;

    const DRIVER: &'static str = "mysql";

    fn set_prepared_statements(&mut self, enabled: bool) {
        self.persistent = enabled;
    }

    async fn migrate(&self) -> Result<(), Error> {
        super::migrate::run(&self.pool).await
    }

    /// The look-up outside any transaction; for a new key, then, one text query that
    /// begins the transaction, takes the key's row lock, inserts the placeholder and takes
    /// the savepoint ([`batch::claim`]).
    async fn claim(
        &self,
        id: RecordId,
        fingerprint: Fingerprint,
        wait: Option<Duration>,
    ) -> Result<(Claim, MySqlConn), Error> {
        let key = &id.as_bytes()[..];
        let mut closed = 0;
        let mut conn = loop {
            let mut conn = self.acquire().await?;
            let peeked = self
                .query(sql::LOOKUP)
                .bind(key)
                .fetch_optional(conn.connection_mut())
                .await?;
            let peeked = peeked.map(|row| rows::lookup(&row)).transpose()?;
            if let Some(claim) = Claim::from_peek(peeked) {
                // Outside any transaction: the connection goes back to the pool as it is.
                return Ok((claim, conn));
            }
            let server = self.server(&mut conn).await?;
            let wait_seconds = wait.map(|w| lock_wait_seconds(Some(w)));
            let claim = batch::claim(key, &fingerprint.0, wait_seconds, server);
            conn.causal = server.galera;
            conn.galera = server.galera;
            match conn.begin(claim).await {
                Ok(()) => return Ok((Claim::Run { replaces: false }, conn)),
                Err(e) if lock_refused(&e) => {
                    // A twin holds the key (its placeholder, uncommitted).
                    conn.reset().await;
                    return Ok((Claim::InFlight, conn));
                }
                // The key has a record the look-up did not see: it committed since, or it
                // is one the claim may replace. The transaction holds its lock.
                Err(e) if error_number(&e) == Some(DUPLICATE_KEY) => break conn,
                // The pooled connection was inside a stray transaction: closed (with the
                // look-up it answered), and the claim starts again on another.
                Err(e) if self.discard_dirty(&e, &mut closed) => {}
                Err(e) => return Err(e.into()),
            }
        };
        let found = self
            .query(sql::LOOKUP)
            .bind(key)
            .fetch_optional(conn.connection_mut())
            .await?;
        let found = found.map(|row| rows::lookup(&row)).transpose()?;
        match Claim::decide(true, found, fingerprint) {
            Claim::Run { replaces } => {
                let server = self.server(&mut conn).await?;
                conn.begin(batch::replace(key, &fingerprint.0, server))
                    .await?;
                Ok((Claim::Run { replaces }, conn))
            }
            // Under the lock: the layer rolls back before answering.
            other => Ok((other, conn)),
        }
    }

    /// One text query ([`batch::complete`]): the savepoint check (`RELEASE SAVEPOINT`, or
    /// for a stored 4xx the rollback to it) and the placeholder's `UPDATE` into the record;
    /// then the commit, alone, with the session restored.
    async fn commit(
        conn: &mut MySqlConn,
        record: &NewRecord<'_>,
        completion: Completion,
    ) -> Result<(), CommitError> {
        let discard = completion.discard_handler_writes.is_some();
        let written = match batch::complete(record, discard) {
            Some(query) => {
                let answered = conn.run(query).await;
                match answered.error {
                    None => Ok(answered.rows_affected),
                    Some(e) => Err(e),
                }
            }
            None => complete_bound(conn, record, discard).await,
        };
        let failed = match written {
            Ok(1) => match conn.finish(true).await {
                Ok(()) if !conn.galera => return Ok(()),
                Ok(()) => return verify_record(conn, record).await,
                // A Galera certification failure: a twin on another node committed first.
                // Answered from its record (or 409 while this node has not applied it).
                Err(e) if conn.galera && error_number(&e) == Some(DEADLOCK) => {
                    conn.reset().await;
                    return Err(CommitError::Conflict);
                }
                Err(e) => Error::Sqlx(e),
            },
            // The placeholder went with the transaction: what the handler sent since is in a
            // transaction of its own, rolled back below.
            Ok(_) => transaction_lost(),
            // The savepoint gone: so is the transaction.
            Err(e) => savepoint_error(e),
        };
        conn.reset().await;
        Err(CommitError::Failed(failed))
    }

    /// `BEGIN` (READ COMMITTED, `autocommit = 0`) and a savepoint, in one round trip.
    async fn begin(&self) -> Result<MySqlConn, Error> {
        self.acquire_begun(&sql::begin(None, true), true).await
    }

    /// The savepoint check, then the commit: a transaction the server rolled back is not
    /// reported committed.
    async fn commit_plain(conn: &mut MySqlConn) -> Result<(), Error> {
        if let Err(e) = conn.connection_mut().execute(sql::RELEASE_WORK).await {
            conn.reset().await;
            return Err(savepoint_error(e));
        }
        Ok(conn.finish(true).await?)
    }

    async fn rollback(mut conn: MySqlConn) {
        conn.reset().await;
    }
}
