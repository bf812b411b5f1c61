//! Maintenance on MySQL/MariaDB: the sweeper's bounded batches (each a short READ
//! COMMITTED transaction — no gap locks blocking new records — that locks its batch with
//! `FOR UPDATE SKIP LOCKED` and deletes or marks exactly those rows, its lock waits bounded
//! to one second), the stale-lease scan, and the record look-ups of `Admin`.

use ::sqlx::mysql::{MySql, MySqlArguments, MySqlRow};
use ::sqlx::query::Query;
use ::sqlx::{AssertSqlSafe, Row};

use super::MySqlStore;
use super::conn::micros;
use super::sql;
use crate::engine::error::Error;
use crate::engine::key::RecordId;
use crate::engine::record::{Backlog, StoredRow, SweepBatch};
use crate::engine::view::RecordInfo;
use crate::store::{MaintenanceStore, rows};

/// Keys per `DELETE` (or `UPDATE`) of a sweep batch: a larger batch is settled in several
/// statements of its one transaction, so the placeholders stay far below the protocol's
/// 65 535.
const KEYS_PER_STATEMENT: usize = 1000;

/// The primary key of a sweep batch's table, as its locking `SELECT` returns it.
#[derive(Clone, Copy)]
enum Key {
    /// `idempotency_records.id`.
    RecordId,
    /// `inbox_messages (consumer_group, message_id)`.
    Message,
    /// `idempotency_outbox.seq`.
    Seq,
}

impl Key {
    /// One key's placeholders in the `IN` list.
    fn placeholder(self) -> &'static str {
        match self {
            Self::Message => "(?, ?)",
            Self::RecordId | Self::Seq => "?",
        }
    }

    /// Binds the key of `row`.
    fn bind<'q>(
        self,
        query: Query<'q, MySql, MySqlArguments>,
        row: &MySqlRow,
    ) -> Result<Query<'q, MySql, MySqlArguments>, ::sqlx::Error> {
        Ok(match self {
            Self::RecordId => query.bind(row.try_get::<Vec<u8>, _>(0)?),
            Self::Message => query
                .bind(row.try_get::<Vec<u8>, _>(0)?)
                .bind(row.try_get::<Vec<u8>, _>(1)?),
            Self::Seq => query.bind(row.try_get::<i64, _>(0)?),
        })
    }

    /// Binds a key that matches no row (NULL), padding a statement to its fixed width.
    fn bind_none(
        self,
        query: Query<'_, MySql, MySqlArguments>,
    ) -> Query<'_, MySql, MySqlArguments> {
        match self {
            Self::RecordId => query.bind(None::<Vec<u8>>),
            Self::Message => query.bind(None::<Vec<u8>>).bind(None::<Vec<u8>>),
            Self::Seq => query.bind(None::<i64>),
        }
    }
}

/// `prefix` (ending in `IN (`) completed with `width` keys' placeholders and `)`.
fn settle_text(prefix: &str, key: Key, width: usize) -> String {
    let mut text = String::with_capacity(prefix.len() + width * (key.placeholder().len() + 2));
    text.push_str(prefix);
    for i in 0..width {
        if i > 0 {
            text.push_str(", ");
        }
        text.push_str(key.placeholder());
    }
    text.push(')');
    text
}

impl MySqlStore {
    /// One sweep batch, in a short READ COMMITTED transaction of its own (lock waits bounded
    /// to 1 s): `select` locks the batch's keys (`FOR UPDATE SKIP LOCKED`, so it never waits
    /// for a row a live request holds), the `settle` statement (`prefix` of `IN (`) deletes
    /// or marks exactly those rows, and `COMMIT`; the rows affected. An empty batch ends
    /// its transaction after the `SELECT`. The `IN` list always has the batch's full width
    /// (at most [`KEYS_PER_STATEMENT`]), padded with NULLs, so each batch kind prepares one
    /// statement per connection however many rows it found.
    async fn sweep_locked(
        &self,
        select: Query<'static, MySql, MySqlArguments>,
        limit: i64,
        key: Key,
        prefix: &str,
    ) -> Result<u64, Error> {
        let mut conn = self.begin_internal(1).await?;
        let keys = select.fetch_all(conn.connection_mut()).await?;
        if keys.is_empty() {
            conn.reset().await;
            return Ok(0);
        }
        let width = usize::try_from(limit)
            .unwrap_or(usize::MAX)
            .clamp(1, KEYS_PER_STATEMENT);
        let text: std::sync::Arc<str> = settle_text(prefix, key, width).into();
        let mut affected = 0;
        for chunk in keys.chunks(width) {
            let mut query = ::sqlx::query(AssertSqlSafe(text.clone())).persistent(self.persistent);
            for row in chunk {
                query = key.bind(query, row)?;
            }
            for _ in chunk.len()..width {
                query = key.bind_none(query);
            }
            affected += query.execute(conn.connection_mut()).await?.rows_affected();
        }
        conn.finish(true).await?;
        Ok(affected)
    }
}

impl MaintenanceStore for MySqlStore {
    async fn sweep_batch(&self, batch: SweepBatch) -> Result<u64, Error> {
        match batch {
            SweepBatch::PurgeRecords(r)
            | SweepBatch::PurgeMessages(r)
            | SweepBatch::PurgeOutbox(r) => {
                let (select, key, prefix) = match batch {
                    SweepBatch::PurgeRecords(_) => {
                        (sql::PURGE_RECORDS, Key::RecordId, sql::PURGE_RECORDS_IN)
                    }
                    SweepBatch::PurgeMessages(_) => {
                        (sql::PURGE_MESSAGES, Key::Message, sql::PURGE_MESSAGES_IN)
                    }
                    _ => (sql::PURGE_OUTBOX, Key::Seq, sql::PURGE_OUTBOX_IN),
                };
                let success = micros(r.success_grace);
                let failure = micros(r.failure_retention);
                let select = self
                    .query(select)
                    .bind(success.min(failure))
                    .bind(success)
                    .bind(failure)
                    .bind(r.limit);
                self.sweep_locked(select, r.limit, key, prefix).await
            }
            SweepBatch::MarkStaleFailed { after, limit } => {
                let select = self
                    .query(sql::MARK_STALE_FAILED)
                    .bind(micros(after))
                    .bind(limit);
                self.sweep_locked(select, limit, Key::RecordId, sql::MARK_STALE_FAILED_IN)
                    .await
            }
        }
    }

    async fn stale_summary(&self) -> Result<Backlog, Error> {
        self.backlog(sql::STALE_SUMMARY).await
    }

    async fn stale_ids(&self, limit: i64) -> Result<Vec<Vec<u8>>, Error> {
        self.rows(self.query(sql::STALE_IDS).bind(limit), |row| row.try_get(0))
            .await
    }

    async fn record_info(&self, id: RecordId) -> Result<Option<RecordInfo>, Error> {
        let query = self.query(sql::ADMIN_RECORD).bind(&id.as_bytes()[..]);
        Ok(self.rows(query, rows::record_info).await?.pop())
    }

    async fn stale_records(&self, limit: i64) -> Result<Vec<RecordInfo>, Error> {
        self.rows(self.query(sql::ADMIN_STALE).bind(limit), rows::record_info)
            .await
    }

    async fn stale_page(
        &self,
        after: (i64, RecordId),
        limit: i64,
    ) -> Result<Vec<(RecordInfo, i64)>, Error> {
        let query = self
            .query(sql::ADMIN_STALE_PAGE)
            .bind(after.0)
            .bind(&after.1.as_bytes()[..])
            .bind(limit);
        self.rows(query, rows::stale_row).await
    }

    async fn record_response(&self, id: RecordId) -> Result<Option<StoredRow>, Error> {
        let query = self
            .query(sql::ADMIN_RECORD_RESPONSE)
            .bind(&id.as_bytes()[..]);
        Ok(self.rows(query, rows::stored_row).await?.pop())
    }

    async fn release_lease(&self, id: RecordId, token: i64) -> Result<bool, Error> {
        let query = self
            .query(sql::ADMIN_RELEASE_LEASE)
            .bind(&id.as_bytes()[..])
            .bind(token);
        Ok(self.execute_bounded(query).await? == 1)
    }

    async fn delete_record(&self, id: RecordId, token: i64) -> Result<bool, Error> {
        let query = self
            .query(sql::ADMIN_DELETE_RECORD)
            .bind(&id.as_bytes()[..])
            .bind(token);
        Ok(self.execute_bounded(query).await? == 1)
    }

    async fn record_counts(&self) -> Result<[i64; 3], Error> {
        let query = self.query(sql::ADMIN_RECORD_COUNTS);
        Ok(self
            .rows(query, rows::record_counts)
            .await?
            .pop()
            .unwrap_or_default())
    }
}
