//! [`Store`] for sqlx: the same statements as the tokio-postgres driver, one round trip
//! each (so the claim after the first lookup is one call of the claim function).

use std::sync::Arc;
use std::time::Duration;

use ::sqlx::postgres::types::Oid;
use ::sqlx::postgres::{PgArgumentBuffer, PgArguments, PgRow, PgTypeInfo, Postgres};
use ::sqlx::query::Query;
use ::sqlx::{Executor, PgConnection, Row, Transaction};

use super::SqlxStore;
use super::tx::IdempotentTx;
use crate::Error;
use crate::admin::{MessageColumns, MessageInfo, OutboxInfo, RecordColumns, RecordInfo};
use crate::engine::fingerprint::Fingerprint;
use crate::engine::key::RecordId;
use crate::engine::outbox::{OutboxBatch, Settlement};
use crate::engine::record::{
    Backlog, Claim, CommitError, Completion, InboxClaim, InboxWrite, LeaseClaim, LeaseEnd,
    NewRecord, RecordRow, SweepBatch,
};
use crate::engine::shared_tx::SharedTx;
use crate::store::{Store, sql};

/// `uuid`'s built-in type oid.
const UUID_OID: Oid = Oid(2950);

impl ::sqlx::Type<Postgres> for RecordId {
    fn type_info() -> PgTypeInfo {
        PgTypeInfo::with_oid(UUID_OID)
    }
}

impl ::sqlx::Encode<'_, Postgres> for RecordId {
    fn encode_by_ref(
        &self,
        buf: &mut PgArgumentBuffer,
    ) -> Result<::sqlx::encode::IsNull, ::sqlx::error::BoxDynError> {
        buf.extend_from_slice(self.as_bytes());
        Ok(::sqlx::encode::IsNull::No)
    }
}

/// A transaction the crate began on a pooled sqlx connection.
///
/// An `sqlx::Transaction` dropped before it ended queues its ROLLBACK, and the pool runs
/// it before the connection is handed out again (or closes the connection if it fails):
/// a connection never goes back inside a transaction.
pub struct SqlxConn {
    tx: Option<Transaction<'static, Postgres>>,
    persistent: bool,
    /// For the new transaction of a stored 4xx, whose handler writes are discarded.
    pool: ::sqlx::PgPool,
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
fn sql_state(error: &::sqlx::Error) -> Option<String> {
    Some(error.as_database_error()?.code()?.into_owned())
}

const UNIQUE_VIOLATION: &str = "23505";
const LOCK_NOT_AVAILABLE: &str = "55P03";
const UNDEFINED_TABLE: &str = "42P01";

fn lock_timeout(wait: Duration) -> String {
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
    fn ended(&self) -> SqlxConn {
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

/// The columns of [`sql::LOOKUP`]; the claim function returns the same, with `locked` and
/// `found` before `body_key_id`.
fn record_row(row: &PgRow, body_key_id: usize) -> Result<RecordRow, ::sqlx::Error> {
    Ok(RecordRow {
        status: row.try_get(0)?,
        headers: row.try_get(1)?,
        body: row.try_get(2)?,
        fingerprint: row.try_get(3)?,
        expired: row.try_get(4)?,
        state: row.try_get(5)?,
        retryable: row.try_get(6)?,
        lease_left: row.try_get(7)?,
        expires_in: row.try_get(8)?,
        body_key_id: row.try_get(body_key_id)?,
    })
}

impl Store for SqlxStore {
    type Conn = SqlxConn;
    type Handle = IdempotentTx;

    const DRIVER: &'static str = "sqlx";

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
            Err(e) if sql_state(&e).as_deref() == Some(UNDEFINED_TABLE) => Ok(0),
            Err(e) => Err(e.into()),
        }
    }

    /// By default, first a lookup outside any transaction (a replay, a 422 or a 409 for a
    /// leased key needs nothing more), then `BEGIN` and the claim function on the same
    /// connection — one checkout, so a new key pays no second checkout (nor the pool's
    /// `test_before_acquire` ping). With `wait`, `BEGIN`, the bounded lock wait and the
    /// lookup after it.
    async fn claim(
        &self,
        id: RecordId,
        fingerprint: Fingerprint,
        wait: Option<Duration>,
    ) -> Result<(Claim, SqlxConn), Error> {
        let lock_key = id.lock_key();
        let Some(wait) = wait else {
            let mut pooled = self.pool.acquire().await?;
            let peeked = self
                .query(sql::LOOKUP)
                .bind(id)
                .fetch_optional(&mut *pooled)
                .await?;
            let peeked = peeked.map(|row| record_row(&row, 9)).transpose()?;
            if let Some(claim) = Claim::from_peek(peeked) {
                // Outside any transaction: the connection goes back to the pool as it is.
                return Ok((claim, self.ended()));
            }
            // `Transaction::begin` is how `Pool::begin` starts its transaction on a
            // connection it owns; here the connection is the one just used.
            let mut conn = SqlxConn {
                tx: Some(Transaction::begin(pooled, None).await?),
                persistent: self.persistent,
                pool: self.pool.clone(),
            };
            let row = self
                .query(sql::CLAIM)
                .bind(id)
                .bind(lock_key)
                .fetch_one(conn.connection_mut())
                .await?;
            let locked: bool = row.try_get(9)?;
            let found: bool = row.try_get(10)?;
            let found = if found {
                Some(record_row(&row, 11)?)
            } else {
                None
            };
            return Ok((Claim::decide(locked, found, fingerprint), conn));
        };
        let mut conn = self.begin().await?;
        match wait_lock(conn.connection_mut(), lock_key, wait, self.persistent).await {
            Err(e) if timed_out(&e) => return Ok((Claim::InFlight, conn)),
            locked => locked?,
        }
        let found = self
            .query(sql::LOOKUP)
            .bind(id)
            .fetch_optional(conn.connection_mut())
            .await?;
        let found = found.map(|row| record_row(&row, 9)).transpose()?;
        Ok((Claim::decide(true, found, fingerprint), conn))
    }

    async fn commit(
        conn: &mut SqlxConn,
        record: &NewRecord<'_>,
        completion: Completion,
    ) -> Result<(), CommitError> {
        let failed = |e: ::sqlx::Error| CommitError::Failed(Error::Sqlx(e));
        let persistent = conn.persistent;
        if let Some(timeout) = completion.discard_handler_writes {
            // Discard the handler's writes, then take the key again in a new transaction;
            // if another request got in between, the insert below meets its record.
            let handler_tx = conn.tx.take().expect("an open transaction");
            handler_tx.rollback().await.map_err(failed)?;
            conn.tx = Some(conn.pool.begin().await.map_err(failed)?);
            wait_lock(
                conn.connection_mut(),
                record.id.lock_key(),
                timeout,
                persistent,
            )
            .await
            .map_err(failed)?;
        }
        let connection = conn.connection_mut();
        if completion.replaces || completion.discard_handler_writes.is_some() {
            statement(sql::DELETE_REPLACEABLE, persistent)
                .bind(record.id)
                .execute(&mut *connection)
                .await
                .map_err(failed)?;
        }
        let inserted = statement(sql::INSERT, persistent)
            .bind(record.id)
            .bind(record.scope)
            .bind(record.raw_key)
            .bind(&record.fingerprint.0[..])
            .bind(record.status.as_u16() as i16)
            .bind(&record.headers[..])
            .bind(&*record.body.bytes)
            .bind(record.body.key_id)
            .bind(record.ttl.as_secs_f64())
            .execute(&mut *connection)
            .await;
        let tx = conn.tx.take().expect("an open transaction");
        match inserted {
            Err(e) if sql_state(&e).as_deref() == Some(UNIQUE_VIOLATION) => {
                tx.rollback().await.map_err(failed)?;
                return Err(CommitError::Conflict);
            }
            // Dropped unfinished, the transaction rolls back.
            inserted => inserted.map_err(failed)?,
        };
        tx.commit().await.map_err(failed)
    }

    async fn rollback(mut conn: SqlxConn) {
        if let Some(tx) = conn.tx.take() {
            if let Err(error) = tx.rollback().await {
                tracing::debug!(%error, "ROLLBACK failed; the pool closes the connection");
            }
        }
    }

    async fn lookup(&self, id: RecordId) -> Result<Option<RecordRow>, Error> {
        let row = self
            .query(sql::LOOKUP)
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(|row| record_row(&row, 9)).transpose()?)
    }

    /// The upsert commits on its own; only when it did not take the key is the record read.
    async fn lease_acquire(
        &self,
        record: &NewRecord<'_>,
        lease: Duration,
    ) -> Result<LeaseClaim, Error> {
        let acquired = self
            .query(sql::LEASE_ACQUIRE)
            .bind(record.id)
            .bind(record.scope)
            .bind(record.raw_key)
            .bind(&record.fingerprint.0[..])
            .bind(lease.as_secs_f64())
            .bind(record.ttl.as_secs_f64())
            .fetch_optional(&self.pool)
            .await?;
        if let Some(row) = acquired {
            return Ok(LeaseClaim::Acquired {
                token: row.try_get(0)?,
                took_over: row.try_get(1)?,
            });
        }
        let found = self.lookup(record.id).await?;
        Ok(LeaseClaim::not_acquired(found, record.fingerprint))
    }

    async fn lease_complete(
        &self,
        record: &NewRecord<'_>,
        token: i64,
        end: LeaseEnd,
    ) -> Result<bool, Error> {
        let done = self
            .query(sql::LEASE_COMPLETE)
            .bind(record.id)
            .bind(token)
            .bind(end.state())
            .bind(end.retryable())
            .bind(record.status.as_u16() as i16)
            .bind(&record.headers[..])
            .bind(&*record.body.bytes)
            .bind(record.body.key_id)
            .bind(record.ttl.as_secs_f64())
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn inbox_claim(
        &self,
        id: RecordId,
        group: &str,
        message_id: &str,
        wait: Duration,
    ) -> Result<InboxClaim<SqlxConn>, Error> {
        super::inbox::claim(self, id, group, message_id, wait).await
    }

    async fn inbox_commit(
        conn: &mut SqlxConn,
        write: &InboxWrite<'_>,
        attempts: i32,
    ) -> Result<(), Error> {
        super::inbox::commit(conn, write, attempts).await
    }

    async fn inbox_fail(
        conn: SqlxConn,
        write: &InboxWrite<'_>,
        error: &str,
    ) -> Result<Option<i32>, Error> {
        super::inbox::fail(conn, write, error).await
    }

    async fn inbox_record_failure(
        &self,
        write: &InboxWrite<'_>,
        error: &str,
    ) -> Result<Option<i32>, Error> {
        super::inbox::record_failure(self, write, error).await
    }

    async fn sweep_batch(&self, batch: SweepBatch) -> Result<u64, Error> {
        let query = match batch {
            SweepBatch::PurgeRecords(r)
            | SweepBatch::PurgeMessages(r)
            | SweepBatch::PurgeOutbox(r) => {
                let sql = match batch {
                    SweepBatch::PurgeRecords(_) => sql::PURGE_RECORDS,
                    SweepBatch::PurgeMessages(_) => sql::PURGE_MESSAGES,
                    _ => sql::PURGE_OUTBOX,
                };
                let success = r.success_grace.as_secs_f64();
                let failure = r.failure_retention.as_secs_f64();
                self.query(sql)
                    .bind(success)
                    .bind(failure)
                    .bind(success.min(failure))
                    .bind(r.limit)
            }
            SweepBatch::MarkStaleFailed { after, limit } => self
                .query(sql::MARK_STALE_FAILED)
                .bind(after.as_secs_f64())
                .bind(limit),
        };
        Ok(query.execute(&self.pool).await?.rows_affected())
    }

    async fn stale_summary(&self) -> Result<Backlog, Error> {
        self.backlog(sql::STALE_SUMMARY).await
    }

    async fn stale_ids(&self, limit: i64) -> Result<Vec<Vec<u8>>, Error> {
        self.rows(self.query(sql::STALE_IDS).bind(limit), |row| row.try_get(0))
            .await
    }

    async fn record_info(&self, id: RecordId) -> Result<Option<RecordInfo>, Error> {
        Ok(self
            .rows(self.query(sql::ADMIN_RECORD).bind(id), record_info)
            .await?
            .pop())
    }

    async fn stale_records(&self, limit: i64) -> Result<Vec<RecordInfo>, Error> {
        self.rows(self.query(sql::ADMIN_STALE).bind(limit), record_info)
            .await
    }

    async fn message_info(
        &self,
        group: &str,
        message_id: &str,
    ) -> Result<Option<MessageInfo>, Error> {
        let query = self.query(sql::ADMIN_MESSAGE).bind(group).bind(message_id);
        Ok(self.rows(query, message_info).await?.pop())
    }

    async fn failed_messages(&self, group: &str, limit: i64) -> Result<Vec<MessageInfo>, Error> {
        let query = self
            .query(sql::ADMIN_FAILED_MESSAGES)
            .bind(group)
            .bind(limit);
        self.rows(query, message_info).await
    }

    async fn outbox_lock_batch(&self, limit: i64) -> Result<Option<OutboxBatch<SqlxConn>>, Error> {
        super::outbox::lock_batch(self, limit).await
    }

    async fn outbox_settle(conn: SqlxConn, settlement: &Settlement<'_>) -> Result<u64, Error> {
        super::outbox::settle(conn, settlement).await
    }

    async fn outbox_pending(&self) -> Result<Backlog, Error> {
        self.backlog(sql::OUTBOX_PENDING).await
    }

    async fn outbox_messages(&self, state: &str, limit: i64) -> Result<Vec<OutboxInfo>, Error> {
        super::outbox::messages(self, state, limit).await
    }

    async fn outbox_requeue(&self, message_id: &str) -> Result<bool, Error> {
        super::outbox::requeue(self, message_id).await
    }

    fn handle(shared: &Arc<SharedTx<SqlxConn>>) -> Option<IdempotentTx> {
        let guard = shared.try_write_owned()?;
        Some(IdempotentTx::new(guard, shared.count_handle()))
    }
}

fn record_info(row: &PgRow) -> Result<RecordInfo, ::sqlx::Error> {
    Ok(RecordColumns {
        id: row.try_get(0)?,
        scope: row.try_get(1)?,
        key: row.try_get(2)?,
        state: row.try_get(3)?,
        retryable: row.try_get(4)?,
        status: row.try_get(5)?,
        fingerprint: row.try_get(6)?,
        fencing_token: row.try_get(7)?,
        created_at: row.try_get(8)?,
        updated_at: row.try_get(9)?,
        expires_at: row.try_get(10)?,
        locked_until: row.try_get(11)?,
        response_bytes: row.try_get(12)?,
    }
    .into())
}

fn message_info(row: &PgRow) -> Result<MessageInfo, ::sqlx::Error> {
    Ok(MessageColumns {
        consumer_group: row.try_get(0)?,
        message_id: row.try_get(1)?,
        status: row.try_get(2)?,
        attempts: row.try_get(3)?,
        last_error: row.try_get(4)?,
        payload_digest: row.try_get(5)?,
        created_at: row.try_get(6)?,
        updated_at: row.try_get(7)?,
        expires_at: row.try_get(8)?,
    }
    .into())
}
