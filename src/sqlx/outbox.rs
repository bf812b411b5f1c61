//! The outbox on sqlx: enqueueing through any executor (the handler's
//! [`IdempotentTx`](super::IdempotentTx) or a transaction of your own), and the relay's
//! statements.

use std::collections::HashMap;
use std::time::Duration;

use ::sqlx::postgres::Postgres;
use ::sqlx::{Executor, Row};

use super::SqlxStore;
use super::SqlxTx;
use super::conn::{SqlxConn, statement};
use crate::engine::error::Error;
use crate::engine::outbox::{Enqueued, OutboxBatch, OutboxMessage, Settlement, barrier_params};
use crate::store::{OutboxStore, Store, sql};

/// `BEGIN`, the locking `SELECT`, and the barriers of the batch's ordering keys only
/// when it has keyed messages.
impl OutboxStore for SqlxStore {
    async fn enqueue(handle: &mut SqlxTx, message: &OutboxMessage) -> Result<Enqueued, Error> {
        let slot = handle.slot_mut();
        let persistent = slot.persistent();
        enqueue(slot.connection_mut(), message, persistent).await
    }

    async fn outbox_lock_batch(&self, limit: i64) -> Result<Option<OutboxBatch<SqlxConn>>, Error> {
        let mut conn = self.begin().await?;
        let locked = self
            .query(sql::OUTBOX_LOCK_BATCH)
            .bind(limit)
            .fetch_all(conn.connection_mut());
        let rows = self.link.within(Duration::ZERO, locked).await?;
        let rows = rows
            .iter()
            .map(crate::store::rows::outgoing)
            .collect::<Result<Vec<_>, _>>()?;
        if rows.is_empty() {
            <SqlxStore as Store>::rollback(conn).await;
            return Ok(None);
        }
        let mut barriers = HashMap::new();
        if let Some((keys, seqs)) = barrier_params(&rows) {
            let query = self
                .query(sql::OUTBOX_BARRIERS)
                .bind(&keys[..])
                .bind(&seqs[..])
                .fetch_all(conn.connection_mut());
            let found = self.link.within(Duration::ZERO, query).await?;
            for row in found {
                barriers.insert(row.try_get(0)?, row.try_get(1)?);
            }
        }
        Ok(Some(OutboxBatch {
            conn,
            rows,
            barriers,
        }))
    }

    async fn outbox_settle(mut conn: SqlxConn, s: &Settlement<'_>) -> Result<u64, Error> {
        let link = conn.link.clone();
        let persistent = conn.persistent();
        if !s.sent.is_empty() {
            let sent = statement(sql::OUTBOX_MARK_SENT, persistent)
                .bind(s.sent)
                .execute(conn.connection_mut());
            link.within(Duration::ZERO, sent).await?;
        }
        let mut parked = 0;
        if !s.refused.is_empty() {
            let failed = statement(sql::OUTBOX_MARK_FAILED, persistent)
                .bind(s.refused)
                .bind(s.errors)
                .bind(s.max_attempts)
                .bind(s.retry_base_seconds)
                .bind(s.retry_cap_seconds)
                .fetch_all(conn.connection_mut());
            let rows = link.within(Duration::ZERO, failed).await?;
            for row in rows {
                if row.try_get::<bool, _>(0)? {
                    parked += 1;
                }
            }
        }
        conn.commit().await?;
        Ok(parked)
    }
}

/// Enqueues `message` through `executor`; see [`crate::sqlx::enqueue`].
pub(crate) async fn enqueue<'c, E>(
    executor: E,
    message: &OutboxMessage,
    persistent: bool,
) -> Result<Enqueued, Error>
where
    E: Executor<'c, Database = Postgres>,
{
    message.check().map_err(Error::InvalidMessage)?;
    let row = statement(sql::OUTBOX_ENQUEUE, persistent)
        .bind(message.id.as_deref())
        .bind(message.topic.as_str())
        .bind(message.ordering_key.as_deref())
        .bind(message.content_type.as_deref())
        .bind(&message.payload[..])
        .fetch_optional(executor)
        .await?;
    let inserted = row.map(|row| row.try_get(0)).transpose()?;
    Ok(Enqueued::from_insert(message, inserted))
}
