//! [`Store`] for MySQL/MariaDB: the claim under the key's row lock with the record's
//! placeholder inserted at the start of the transaction, and the completion that turns the
//! placeholder into the record.

use std::sync::Arc;
use std::time::Duration;

use ::sqlx::mysql::MySqlRow;
use ::sqlx::{Executor, MySqlConnection, Row};

use super::MySqlStore;
use super::conn::{
    DUPLICATE_KEY, MySqlConn, NO_SUCH_TABLE, error_number, lock_refused, lock_wait_seconds, micros,
    savepoint_error, statement, transaction_lost,
};
use super::sql;
use super::tx::MySqlTx;
use crate::engine::error::Error;
use crate::engine::fingerprint::Fingerprint;
use crate::engine::key::RecordId;
use crate::engine::record::{Claim, CommitError, Completion, NewRecord, RecordRow};
use crate::engine::shared_tx::SharedTx;
use crate::store::rows::impl_row;
use crate::store::{Store, rows};

impl_row!(MySqlRow, ::sqlx::Error);

impl Store for MySqlStore {
    type Conn = MySqlConn;
    type Handle = MySqlTx;
    type Tx = MySqlConnection;

    const DRIVER: &'static str = "mysql";

    fn set_prepared_statements(&mut self, enabled: bool) {
        self.persistent = enabled;
    }

    async fn migrate(&self) -> Result<(), Error> {
        super::migrate::run(&self.pool).await
    }

    async fn schema_version(&self) -> Result<i32, Error> {
        match statement(sql::SCHEMA_VERSION, false)
            .fetch_one(&self.pool)
            .await
        {
            Ok(row) => Ok(row.try_get(0)?),
            Err(e) if error_number(&e) == Some(NO_SUCH_TABLE) => Ok(0),
            Err(e) => Err(e.into()),
        }
    }

    /// The lookup outside any transaction; then `BEGIN` (READ COMMITTED, `autocommit = 0`,
    /// the lock wait bounded), the locking read, the placeholder, and the savepoint with the
    /// lock wait timeout restored.
    async fn claim(
        &self,
        id: RecordId,
        fingerprint: Fingerprint,
        wait: Option<Duration>,
    ) -> Result<(Claim, MySqlConn), Error> {
        let mut conn = self.acquire().await?;
        let peeked = self
            .query(sql::LOOKUP)
            .bind(&id.as_bytes()[..])
            .fetch_optional(conn.connection_mut())
            .await?;
        let peeked = peeked.map(|row| rows::record_row(&row, 9)).transpose()?;
        if let Some(claim) = Claim::from_peek(peeked) {
            // Outside any transaction: the connection goes back to the pool as it is.
            return Ok((claim, conn));
        }
        conn.begin(sql::begin(true, Some(lock_wait_seconds(wait)), false))
            .await?;
        let lock = if wait.is_some() {
            sql::LOCK_WAIT
        } else {
            sql::LOCK_NOWAIT
        };
        let locked = self
            .query(lock)
            .bind(&id.as_bytes()[..])
            .fetch_optional(conn.connection_mut())
            .await;
        let found = match locked {
            Err(e) if lock_refused(&e) => {
                conn.reset().await;
                return Ok((Claim::InFlight, conn));
            }
            locked => locked?.map(|row| rows::record_row(&row, 9)).transpose()?,
        };
        let replaces = match Claim::decide(true, found, fingerprint) {
            Claim::Run { replaces } => replaces,
            // Under the lock: the layer rolls back before answering.
            other => return Ok((other, conn)),
        };
        if replaces {
            self.query(sql::DELETE_REPLACEABLE)
                .bind(&id.as_bytes()[..])
                .execute(conn.connection_mut())
                .await?;
        }
        let inserted = self
            .query(sql::INSERT_PLACEHOLDER)
            .bind(&id.as_bytes()[..])
            .bind(&fingerprint.0[..])
            .execute(conn.connection_mut())
            .await;
        match inserted {
            Ok(_) => {}
            Err(e) if lock_refused(&e) => {
                // A twin inserted its placeholder after the locking read, and still holds it.
                conn.reset().await;
                return Ok((Claim::InFlight, conn));
            }
            Err(e) if error_number(&e) == Some(DUPLICATE_KEY) => {
                // A twin committed its record after the locking read: answer from it.
                conn.reset().await;
                let found = self.lookup(id).await?;
                let claim = Claim::from_peek(found).unwrap_or(Claim::InFlight);
                return Ok((claim, MySqlConn::ended(self.persistent)));
            }
            Err(e) => return Err(e.into()),
        }
        conn.connection_mut().execute(sql::WORK_SAVEPOINT).await?;
        Ok((Claim::Run { replaces }, conn))
    }

    /// The savepoint check (`RELEASE SAVEPOINT`, or for a stored 4xx the rollback to it),
    /// the placeholder's `UPDATE` into the record, and `COMMIT` with the session restored.
    async fn commit(
        conn: &mut MySqlConn,
        record: &NewRecord<'_>,
        completion: Completion,
    ) -> Result<(), CommitError> {
        let failed = |e: Error| CommitError::Failed(e);
        let persistent = conn.persistent;
        let check = if completion.discard_handler_writes.is_some() {
            // Discard the handler's writes; the placeholder and its lock stay.
            sql::ROLLBACK_WORK
        } else {
            sql::RELEASE_WORK
        };
        if let Err(e) = conn.connection_mut().execute(check).await {
            conn.reset().await;
            return Err(failed(savepoint_error(e)));
        }
        let done = statement(sql::COMPLETE, persistent)
            .bind(record.scope)
            .bind(record.raw_key)
            .bind(&record.fingerprint.0[..])
            .bind(record.status.as_u16() as i16)
            .bind(&record.headers[..])
            .bind(&*record.body.bytes)
            .bind(record.body.key_id)
            .bind(micros(record.ttl))
            .bind(&record.id.as_bytes()[..])
            .execute(conn.connection_mut())
            .await;
        let done = match done {
            Ok(done) => done,
            Err(e) => {
                conn.reset().await;
                return Err(failed(e.into()));
            }
        };
        if done.rows_affected() != 1 {
            // The placeholder went with the transaction: what the handler sent since is in
            // a transaction of its own, rolled back here.
            conn.reset().await;
            return Err(failed(transaction_lost()));
        }
        conn.finish(true).await.map_err(|e| failed(e.into()))
    }

    /// `BEGIN` (READ COMMITTED, `autocommit = 0`) and a savepoint, in one round trip.
    async fn begin(&self) -> Result<MySqlConn, Error> {
        let mut conn = self.acquire().await?;
        conn.begin(sql::begin(true, None, true)).await?;
        Ok(conn)
    }

    /// The savepoint check, then `COMMIT`: a transaction the server rolled back is not
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

    async fn lookup(&self, id: RecordId) -> Result<Option<RecordRow>, Error> {
        let row = self
            .query(sql::LOOKUP)
            .bind(&id.as_bytes()[..])
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(|row| rows::record_row(&row, 9)).transpose()?)
    }

    fn handle(shared: &Arc<SharedTx<MySqlConn>>) -> Option<MySqlTx> {
        let guard = shared.try_write_owned()?;
        Some(MySqlTx::new(guard, shared.count_handle()))
    }

    fn handle_id(handle: &MySqlTx) -> RecordId {
        handle.record_id()
    }

    fn tx(handle: &MySqlTx) -> &MySqlConnection {
        handle.connection()
    }

    fn tx_mut(handle: &mut MySqlTx) -> &mut MySqlConnection {
        handle.connection_mut()
    }
}
