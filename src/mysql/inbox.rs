//! The Inbox on MySQL/MariaDB: a message's claim under its row lock (the upserted row —
//! a placeholder for a new message — stands in for PostgreSQL's advisory lock), and its
//! outcome recorded in the same transaction.

use std::time::Duration;

use ::sqlx::{Executor, Row};

use super::MySqlStore;
use super::conn::{
    MySqlConn, lock_refused, lock_wait_seconds, savepoint_error, statement, transaction_lost,
};
use super::sql;
use crate::engine::error::Error;
use crate::engine::key::RecordId;
use crate::engine::record::{InboxClaim, InboxWrite};
use crate::store::InboxStore;
use crate::store::queries::Queries;
use crate::store::queries::{TxQueries, inbox_failure_params, inbox_success_params};

impl InboxStore for MySqlStore {
    /// `BEGIN` (READ COMMITTED, `autocommit = 0`, lock waits bounded by `wait` in whole
    /// seconds, at least 1), the row lock's upsert, the record's read, and the savepoint
    /// with the lock wait timeout restored for the work.
    async fn inbox_claim(
        &self,
        _id: RecordId,
        group: &str,
        message_id: &str,
        wait: Duration,
    ) -> Result<InboxClaim<MySqlConn>, Error> {
        let begin = sql::begin(Some(lock_wait_seconds(Some(wait))), false);
        let mut conn = self.acquire_begun(&begin, true).await?;
        let locked = self
            .query(sql::INBOX_LOCK)
            .bind(group)
            .bind(message_id)
            .execute(conn.connection_mut())
            .await;
        match locked {
            Err(e) if lock_refused(&e) => {
                conn.reset().await;
                return Ok(InboxClaim::Busy);
            }
            locked => locked?,
        };
        let found = self
            .query(sql::INBOX_LOOKUP)
            .bind(group)
            .bind(message_id)
            .fetch_optional(conn.connection_mut())
            .await?;
        conn.connection_mut().execute(sql::WORK_SAVEPOINT).await?;
        Ok(crate::store::rows::inbox_locked(conn, found.as_ref())?)
    }

    /// The savepoint check, the record's `UPDATE` on the locked row, and `COMMIT`.
    async fn inbox_commit(
        conn: &mut MySqlConn,
        write: &InboxWrite<'_>,
        attempts: i32,
    ) -> Result<(), Error> {
        if let Err(e) = conn.connection_mut().execute(sql::RELEASE_WORK).await {
            conn.reset().await;
            return Err(savepoint_error(e));
        }
        // A failed statement has reset the connection (`run_statement`).
        let params = inbox_success_params(write, attempts);
        let success = Self::STATEMENTS.inbox_record_success;
        if conn.tx_affected(success, &params).await? != 1 {
            conn.reset().await;
            return Err(transaction_lost());
        }
        conn.finish(true).await?;
        Ok(())
    }

    /// The rollback to the savepoint (the work discarded, the row lock kept), the failed
    /// attempt on the locked row, its count, and `COMMIT`.
    async fn inbox_fail(
        mut conn: MySqlConn,
        write: &InboxWrite<'_>,
        error: &str,
    ) -> Result<Option<i32>, Error> {
        if let Err(e) = conn.connection_mut().execute(sql::ROLLBACK_WORK).await {
            conn.reset().await;
            return Err(savepoint_error(e));
        }
        let persistent = conn.persistent();
        let attempts = record_failure(&mut conn, write, error, persistent).await;
        match attempts {
            Ok(attempts) => {
                conn.finish(true).await?;
                Ok(attempts)
            }
            Err(e) => {
                conn.reset().await;
                Err(e)
            }
        }
    }

    /// In a transaction of its own: the row lock's upsert (waits bounded to 1 s), the
    /// failed attempt, its count, and `COMMIT`.
    async fn inbox_record_failure(
        &self,
        write: &InboxWrite<'_>,
        error: &str,
    ) -> Result<Option<i32>, Error> {
        let mut conn = self.begin_internal(1).await?;
        self.query(sql::INBOX_LOCK)
            .bind(write.group)
            .bind(write.message_id)
            .execute(conn.connection_mut())
            .await?;
        let attempts = record_failure(&mut conn, write, error, self.persistent).await?;
        conn.finish(true).await?;
        Ok(attempts)
    }
}

/// The failed attempt on the locked row and, unless the message has succeeded, its count.
async fn record_failure(
    conn: &mut MySqlConn,
    write: &InboxWrite<'_>,
    error: &str,
    persistent: bool,
) -> Result<Option<i32>, Error> {
    let params = inbox_failure_params(write, error);
    let failure = <MySqlStore as Queries>::STATEMENTS.inbox_record_failure;
    let done = crate::store::sqlx_tx::bound(failure, &params, persistent)
        .execute(conn.connection_mut())
        .await?;
    if done.rows_affected() == 0 {
        return Ok(None);
    }
    let row = statement(sql::INBOX_ATTEMPTS, persistent)
        .bind(write.group)
        .bind(write.message_id)
        .fetch_one(conn.connection_mut())
        .await?;
    Ok(Some(row.try_get(0)?))
}
