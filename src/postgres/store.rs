//! [`Store`] for tokio-postgres: every statement pipelined where the protocol allows, in
//! one round trip per step.

use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::Row;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{ToSql, Type};

use super::PgStore;
use super::conn::TxConn;
use super::db::{self, Db, Sql};
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

impl tokio_postgres::types::ToSql for RecordId {
    fn to_sql(
        &self,
        _ty: &Type,
        out: &mut bytes::BytesMut,
    ) -> Result<tokio_postgres::types::IsNull, Box<dyn std::error::Error + Sync + Send>> {
        out.extend_from_slice(self.as_bytes());
        Ok(tokio_postgres::types::IsNull::No)
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::UUID
    }

    tokio_postgres::types::to_sql_checked!();
}

impl PgStore {
    pub(super) fn db<'a>(&self, conn: &'a dyn super::PooledClient) -> Db<'a> {
        Db::new(conn, self.prepared)
    }

    pub(super) async fn checkout(&self) -> Result<Box<dyn super::PooledClient>, Error> {
        self.pool.get().await.map_err(Error::Pool)
    }

    /// Runs one statement on a connection of its own and maps its rows.
    pub(super) async fn rows<T>(
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

    /// `sql`'s one aggregate row: a count and the age in seconds of the oldest.
    pub(super) async fn backlog(&self, sql: &'static Sql) -> Result<Backlog, Error> {
        let mut rows = self
            .rows(sql, &[], |row| {
                Ok(Backlog {
                    count: row.try_get(0)?,
                    oldest_seconds: row.try_get(1)?,
                })
            })
            .await?;
        Ok(rows.pop().unwrap_or_default())
    }
}

/// The columns of [`sql::LOOKUP`]; the claim function returns the same, with `locked` and
/// `found` before `body_key_id`.
fn record_row(row: &Row, body_key_id: usize) -> Result<RecordRow, tokio_postgres::Error> {
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

fn lock_timeout(wait: Duration) -> String {
    format!("{}ms", wait.as_millis().max(1))
}

/// `BEGIN`, the key's lock awaited for at most `wait`, and `lookup` after it, pipelined in
/// one round trip; `Ok(None)` when the lock was not granted in time (the transaction is
/// then aborted, and rolls back when the connection is dropped).
pub(super) async fn begin_wait_and_look_up(
    db: Db<'_>,
    lock_key: i64,
    wait: Duration,
    lookup: &'static Sql,
    lookup_params: &[&(dyn ToSql + Sync)],
    savepoint: Option<&'static str>,
) -> Result<Option<Option<Row>>, Error> {
    let set_timeout = db.prepare(&db::SET_LOCK_TIMEOUT).await?;
    let lock = db.prepare(&db::WAIT_LOCK).await?;
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

impl Store for PgStore {
    type Conn = TxConn;
    type Handle = IdempotentTx;

    const DRIVER: &'static str = "tokio-postgres";

    fn set_prepared_statements(&mut self, enabled: bool) {
        self.prepared = enabled;
    }

    async fn migrate(&self) -> Result<(), Error> {
        super::migrate::run(self.checkout().await?).await
    }

    async fn schema_version(&self) -> Result<i32, Error> {
        let conn = self.checkout().await?;
        match conn
            .client()
            .query_typed_one(sql::SCHEMA_VERSION, &[])
            .await
        {
            Ok(row) => Ok(row.try_get(0)?),
            Err(e) if e.code() == Some(&SqlState::UNDEFINED_TABLE) => Ok(0),
            Err(e) => Err(e.into()),
        }
    }

    /// By default, first a lookup outside any transaction (a replay, a 422 or a 409 for a
    /// leased key needs nothing more), then `BEGIN`, the lock attempt and the lookup again,
    /// pipelined in one round trip: the second lookup is a statement of its own after the
    /// lock, so its READ COMMITTED snapshot sees whatever the previous holder committed.
    /// With `wait`, the lock is awaited (bounded by a transaction-local `lock_timeout`,
    /// reset before the handler runs) instead of tried.
    async fn claim(
        &self,
        id: RecordId,
        fingerprint: Fingerprint,
        wait: Option<Duration>,
    ) -> Result<(Claim, TxConn), Error> {
        let mut conn = TxConn::new(self.checkout().await?, self.prepared);
        let db = self.db(conn.pooled());
        let client = db.client();
        let lock_key = id.lock_key();
        let lookup = db.prepare(&db::LOOKUP).await?;
        let lookup_params: [&(dyn ToSql + Sync); 1] = [&id];
        let Some(wait) = wait else {
            let peeked = db.query_opt(&lookup, &lookup_params).await?;
            let peeked = peeked.map(|row| record_row(&row, 9)).transpose()?;
            if let Some(claim) = Claim::from_peek(peeked) {
                // Outside any transaction: the connection is clean.
                conn.mark_ended();
                return Ok((claim, conn));
            }
            let try_lock = db.prepare(&db::TRY_LOCK).await?;
            let lock_params: [&(dyn ToSql + Sync); 1] = [&lock_key];
            let (begin, locked, found) = tokio::join!(
                biased;
                client.batch_execute("BEGIN"),
                db.query_one(&try_lock, &lock_params),
                db.query_opt(&lookup, &lookup_params),
            );
            begin?;
            let locked: bool = locked?.try_get(0)?;
            let found = found?.map(|row| record_row(&row, 9)).transpose()?;
            return Ok((Claim::decide(locked, found, fingerprint), conn));
        };
        let Some(found) =
            begin_wait_and_look_up(db, lock_key, wait, &db::LOOKUP, &lookup_params, None).await?
        else {
            return Ok((Claim::InFlight, conn));
        };
        let found = found.map(|row| record_row(&row, 9)).transpose()?;
        Ok((Claim::decide(true, found, fingerprint), conn))
    }

    /// One round trip: (rollback and re-lock, for a stored 4xx whose writes are
    /// discarded), (delete the record being replaced), insert and COMMIT are pipelined. If
    /// any of them fails, PostgreSQL turns the COMMIT into a ROLLBACK, so the handler's
    /// writes never commit without their record.
    async fn commit(
        conn: &mut TxConn,
        record: &NewRecord<'_>,
        completion: Completion,
    ) -> Result<(), CommitError> {
        let prepared = conn.prepared();
        let db = Db::new(conn.pooled(), prepared);
        let client = db.client();
        let failed = |e| CommitError::Failed(Error::Postgres(e));
        let insert = db.prepare(&db::INSERT).await.map_err(failed)?;
        // After a rollback the transaction starts afresh, so look for a replaceable record
        // again.
        let delete = if completion.replaces || completion.discard_handler_writes.is_some() {
            Some(db.prepare(&db::DELETE_REPLACEABLE).await.map_err(failed)?)
        } else {
            None
        };
        let relock = match completion.discard_handler_writes {
            Some(timeout) => Some((
                db.prepare(&db::SET_LOCK_TIMEOUT).await.map_err(failed)?,
                db.prepare(&db::WAIT_LOCK).await.map_err(failed)?,
                lock_timeout(timeout),
            )),
            None => None,
        };
        let lock_key = record.id.lock_key();
        let status = record.status.as_u16() as i16;
        let ttl = record.ttl.as_secs_f64();
        let fingerprint = &record.fingerprint.0[..];
        let body = &*record.body.bytes;
        let insert_params: [&(dyn ToSql + Sync); 9] = [
            &record.id,
            &record.scope,
            &record.raw_key,
            &fingerprint,
            &status,
            &record.headers,
            &body,
            &record.body.key_id,
            &ttl,
        ];
        let (relocked, deleted, inserted, committed) = tokio::join!(
            biased;
            async {
                let Some((set_timeout, lock, timeout)) = &relock else {
                    return Ok(());
                };
                // Discard the handler's writes, then take the key again in a new
                // transaction; if another request got in between, the insert below meets
                // its record.
                let timeout_params: [&(dyn ToSql + Sync); 1] = [timeout];
                let lock_params: [&(dyn ToSql + Sync); 1] = [&lock_key];
                let (rolled_back, begun, timeout_set, locked, reset) = tokio::join!(
                    biased;
                    client.batch_execute("ROLLBACK"),
                    client.batch_execute("BEGIN"),
                    db.query_one(set_timeout, &timeout_params),
                    db.query_one(lock, &lock_params),
                    client.batch_execute(sql::RESET_LOCK_TIMEOUT),
                );
                rolled_back?;
                begun?;
                timeout_set?;
                locked?;
                reset
            },
            async {
                match &delete {
                    Some(delete) => db.execute(delete, &[&record.id]).await.map(drop),
                    None => Ok(()),
                }
            },
            db.execute(&insert, &insert_params),
            client.batch_execute("COMMIT"),
        );
        relocked.map_err(failed)?;
        deleted.map_err(failed)?;
        match inserted {
            Err(e) if e.code() == Some(&SqlState::UNIQUE_VIOLATION) => {
                // The COMMIT after the failed insert was a ROLLBACK.
                conn.mark_ended();
                return Err(CommitError::Conflict);
            }
            inserted => inserted.map_err(failed)?,
        };
        committed.map_err(failed)?;
        conn.mark_ended();
        Ok(())
    }

    async fn rollback(conn: TxConn) {
        conn.rollback().await;
    }

    async fn lookup(&self, id: RecordId) -> Result<Option<RecordRow>, Error> {
        let conn = self.checkout().await?;
        let db = self.db(&*conn);
        let lookup = db.prepare(&db::LOOKUP).await?;
        let row = db.query_opt(&lookup, &[&id]).await?;
        Ok(row.map(|row| record_row(&row, 9)).transpose()?)
    }

    /// Commits the PROCESSING record (autocommit, one statement); only when the key was not
    /// free is the record read, to say why.
    async fn lease_acquire(
        &self,
        record: &NewRecord<'_>,
        lease: Duration,
    ) -> Result<LeaseClaim, Error> {
        let conn = self.checkout().await?;
        let db = self.db(&*conn);
        let acquire = db.prepare(&db::LEASE_ACQUIRE).await?;
        let fingerprint = &record.fingerprint.0[..];
        let (lease, ttl) = (lease.as_secs_f64(), record.ttl.as_secs_f64());
        let acquire_params: [&(dyn ToSql + Sync); 6] = [
            &record.id,
            &record.scope,
            &record.raw_key,
            &fingerprint,
            &lease,
            &ttl,
        ];
        if let Some(row) = db.query_opt(&acquire, &acquire_params).await? {
            return Ok(LeaseClaim::Acquired {
                token: row.try_get(0)?,
                // An upsert that updated leaves its transaction in the row's `xmax`; a
                // fresh insert leaves 0.
                took_over: row.try_get(1)?,
            });
        }
        let lookup = db.prepare(&db::LOOKUP).await?;
        let found = db.query_opt(&lookup, &[&record.id]).await?;
        let found = found.map(|row| record_row(&row, 9)).transpose()?;
        Ok(LeaseClaim::not_acquired(found, record.fingerprint))
    }

    async fn lease_complete(
        &self,
        record: &NewRecord<'_>,
        token: i64,
        end: LeaseEnd,
    ) -> Result<bool, Error> {
        let conn = self.checkout().await?;
        let db = self.db(&*conn);
        let complete = db.prepare(&db::LEASE_COMPLETE).await?;
        let (state, retryable) = (end.state(), end.retryable());
        let status = record.status.as_u16() as i16;
        let ttl = record.ttl.as_secs_f64();
        let body = &*record.body.bytes;
        let params: [&(dyn ToSql + Sync); 9] = [
            &record.id,
            &token,
            &state,
            &retryable,
            &status,
            &record.headers,
            &body,
            &record.body.key_id,
            &ttl,
        ];
        Ok(db.execute(&complete, &params).await? == 1)
    }

    async fn inbox_claim(
        &self,
        id: RecordId,
        group: &str,
        message_id: &str,
        wait: Duration,
    ) -> Result<InboxClaim<TxConn>, Error> {
        super::inbox::claim(self, id, group, message_id, wait).await
    }

    async fn inbox_commit(
        conn: &mut TxConn,
        write: &InboxWrite<'_>,
        attempts: i32,
    ) -> Result<(), Error> {
        super::inbox::commit(conn, write, attempts).await
    }

    async fn inbox_fail(
        conn: TxConn,
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
        let conn = self.checkout().await?;
        let db = self.db(&*conn);
        let affected = match batch {
            SweepBatch::PurgeRecords(r)
            | SweepBatch::PurgeMessages(r)
            | SweepBatch::PurgeOutbox(r) => {
                let sql = match batch {
                    SweepBatch::PurgeRecords(_) => &db::PURGE_RECORDS,
                    SweepBatch::PurgeMessages(_) => &db::PURGE_MESSAGES,
                    _ => &db::PURGE_OUTBOX,
                };
                let success = r.success_grace.as_secs_f64();
                let failure = r.failure_retention.as_secs_f64();
                let earliest = success.min(failure);
                let statement = db.prepare(sql).await?;
                db.execute(&statement, &[&success, &failure, &earliest, &r.limit])
                    .await?
            }
            SweepBatch::MarkStaleFailed { after, limit } => {
                let statement = db.prepare(&db::MARK_STALE_FAILED).await?;
                db.execute(&statement, &[&after.as_secs_f64(), &limit])
                    .await?
            }
        };
        Ok(affected)
    }

    async fn stale_summary(&self) -> Result<Backlog, Error> {
        self.backlog(&db::STALE_SUMMARY).await
    }

    async fn stale_ids(&self, limit: i64) -> Result<Vec<Vec<u8>>, Error> {
        self.rows(&db::STALE_IDS, &[&limit], |row| row.try_get(0))
            .await
    }

    async fn record_info(&self, id: RecordId) -> Result<Option<RecordInfo>, Error> {
        Ok(self
            .rows(&db::ADMIN_RECORD, &[&id], record_info)
            .await?
            .pop())
    }

    async fn stale_records(&self, limit: i64) -> Result<Vec<RecordInfo>, Error> {
        self.rows(&db::ADMIN_STALE, &[&limit], record_info).await
    }

    async fn message_info(
        &self,
        group: &str,
        message_id: &str,
    ) -> Result<Option<MessageInfo>, Error> {
        Ok(self
            .rows(&db::ADMIN_MESSAGE, &[&group, &message_id], message_info)
            .await?
            .pop())
    }

    async fn failed_messages(&self, group: &str, limit: i64) -> Result<Vec<MessageInfo>, Error> {
        self.rows(&db::ADMIN_FAILED_MESSAGES, &[&group, &limit], message_info)
            .await
    }

    async fn outbox_lock_batch(&self, limit: i64) -> Result<Option<OutboxBatch<TxConn>>, Error> {
        super::outbox::lock_batch(self, limit).await
    }

    async fn outbox_settle(conn: TxConn, settlement: &Settlement<'_>) -> Result<u64, Error> {
        super::outbox::settle(conn, settlement).await
    }

    async fn outbox_pending(&self) -> Result<Backlog, Error> {
        self.backlog(&db::OUTBOX_PENDING).await
    }

    async fn outbox_messages(&self, state: &str, limit: i64) -> Result<Vec<OutboxInfo>, Error> {
        super::outbox::messages(self, state, limit).await
    }

    async fn outbox_requeue(&self, message_id: &str) -> Result<bool, Error> {
        super::outbox::requeue(self, message_id).await
    }

    fn handle(shared: &Arc<SharedTx<TxConn>>) -> Option<IdempotentTx> {
        Some(IdempotentTx::new(shared.count_handle()))
    }
}

fn record_info(row: &Row) -> Result<RecordInfo, tokio_postgres::Error> {
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

fn message_info(row: &Row) -> Result<MessageInfo, tokio_postgres::Error> {
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
