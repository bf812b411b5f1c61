//! The outbox on sqlx: enqueueing through any executor (the handler's
//! [`IdempotentTx`](super::IdempotentTx) or a transaction of your own), and the relay's
//! statements.

use std::collections::HashMap;

use ::sqlx::postgres::{PgRow, Postgres};
use ::sqlx::{Executor, Row};

use super::SqlxStore;
use super::store::{SqlxConn, statement};
use crate::Error;
use crate::admin::{OutboxColumns, OutboxInfo};
use crate::engine::outbox::{
    Enqueued, OutboxBatch, OutboxMessage, Outgoing, Settlement, barrier_params,
};
use crate::store::{Store, sql};

/// `BEGIN`, the locking `SELECT`, and the barriers of the batch's ordering keys only
/// when it has keyed messages.
pub(super) async fn lock_batch(
    store: &SqlxStore,
    limit: i64,
) -> Result<Option<OutboxBatch<SqlxConn>>, Error> {
    let mut conn = store.begin().await?;
    let rows = store
        .query(sql::OUTBOX_LOCK_BATCH)
        .bind(limit)
        .fetch_all(conn.connection_mut())
        .await?;
    let rows = rows.iter().map(outgoing).collect::<Result<Vec<_>, _>>()?;
    if rows.is_empty() {
        <SqlxStore as Store>::rollback(conn).await;
        return Ok(None);
    }
    let mut barriers = HashMap::new();
    if let Some((keys, seqs)) = barrier_params(&rows) {
        let found = store
            .query(sql::OUTBOX_BARRIERS)
            .bind(&keys[..])
            .bind(&seqs[..])
            .fetch_all(conn.connection_mut())
            .await?;
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

pub(super) async fn settle(mut conn: SqlxConn, s: &Settlement<'_>) -> Result<u64, Error> {
    if !s.sent.is_empty() {
        statement(sql::OUTBOX_MARK_SENT, conn.persistent())
            .bind(s.sent)
            .execute(conn.connection_mut())
            .await?;
    }
    let mut parked = 0;
    if !s.refused.is_empty() {
        let rows = statement(sql::OUTBOX_MARK_FAILED, conn.persistent())
            .bind(s.refused)
            .bind(s.errors)
            .bind(s.max_attempts)
            .bind(s.retry_base_seconds)
            .bind(s.retry_cap_seconds)
            .fetch_all(conn.connection_mut())
            .await?;
        for row in rows {
            if row.try_get::<bool, _>(0)? {
                parked += 1;
            }
        }
    }
    conn.commit().await?;
    Ok(parked)
}

pub(super) async fn messages(
    store: &SqlxStore,
    state: &str,
    limit: i64,
) -> Result<Vec<OutboxInfo>, Error> {
    store
        .rows(
            store.query(sql::ADMIN_OUTBOX).bind(state).bind(limit),
            outbox_info,
        )
        .await
}

pub(super) async fn requeue(store: &SqlxStore, message_id: &str) -> Result<bool, Error> {
    let done = store
        .query(sql::ADMIN_REQUEUE_OUTBOX)
        .bind(message_id)
        .execute(&store.pool)
        .await?;
    Ok(done.rows_affected() == 1)
}

fn outgoing(row: &PgRow) -> Result<Outgoing, ::sqlx::Error> {
    Ok(Outgoing {
        seq: row.try_get(0)?,
        message_id: row.try_get(1)?,
        topic: row.try_get(2)?,
        ordering_key: row.try_get(3)?,
        content_type: row.try_get(4)?,
        payload: row.try_get(5)?,
        attempts: row.try_get(6)?,
        age_seconds: row.try_get(7)?,
    })
}

fn outbox_info(row: &PgRow) -> Result<OutboxInfo, ::sqlx::Error> {
    Ok(OutboxColumns {
        seq: row.try_get(0)?,
        message_id: row.try_get(1)?,
        topic: row.try_get(2)?,
        ordering_key: row.try_get(3)?,
        state: row.try_get(4)?,
        attempts: row.try_get(5)?,
        last_error: row.try_get(6)?,
        payload_bytes: row.try_get(7)?,
        created_at: row.try_get(8)?,
        sent_at: row.try_get(9)?,
    }
    .into())
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
