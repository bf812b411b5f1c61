//! The outbox on MySQL/MariaDB: enqueueing on a connection inside the caller's
//! transaction (the handler's [`IdempotentTx`](super::IdempotentTx) or a transaction of
//! your own), with the ordering key's row lock, and the relay's statements.

use std::collections::HashMap;

use ::sqlx::{AssertSqlSafe, MySqlConnection, Row};

use super::MySqlStore;
use super::MySqlTx;
use super::conn::{DUPLICATE_KEY, MySqlConn, error_number, statement};
use super::sql;
use crate::engine::error::Error;
use crate::engine::outbox::{Enqueued, OutboxBatch, OutboxMessage, Settlement, barrier_params};
use crate::store::OutboxStore;

/// `?, ?, ...`: `n` placeholders, for a list (MySQL has no array parameters).
fn placeholders(n: usize) -> String {
    vec!["?"; n].join(", ")
}

impl OutboxStore for MySqlStore {
    async fn enqueue(handle: &mut MySqlTx, message: &OutboxMessage) -> Result<Enqueued, Error> {
        let slot = handle.slot_mut();
        let persistent = slot.persistent();
        enqueue(slot.connection_mut(), message, persistent).await
    }

    /// `BEGIN` (READ COMMITTED, lock waits bounded to 1 s), the locking `SELECT ... SKIP
    /// LOCKED`, and the barriers of the batch's ordering keys when it has keyed messages.
    async fn outbox_lock_batch(&self, limit: i64) -> Result<Option<OutboxBatch<MySqlConn>>, Error> {
        let mut conn = self.begin_internal(1).await?;
        let rows = self
            .query(sql::OUTBOX_LOCK_BATCH)
            .bind(limit)
            .fetch_all(conn.connection_mut())
            .await?;
        let rows = rows
            .iter()
            .map(crate::store::rows::outgoing)
            .collect::<Result<Vec<_>, _>>()?;
        if rows.is_empty() {
            conn.reset().await;
            return Ok(None);
        }
        let mut barriers = HashMap::new();
        if let Some((keys, seqs)) = barrier_params(&rows) {
            let text = format!(
                "SELECT CONVERT(ordering_key USING utf8mb4), MIN(seq) FROM idempotency_outbox \
                 WHERE state = 'PENDING' AND ordering_key IN ({}) AND seq NOT IN ({}) \
                 GROUP BY ordering_key",
                placeholders(keys.len()),
                placeholders(seqs.len())
            );
            let mut query = ::sqlx::query(AssertSqlSafe(text)).persistent(false);
            for key in &keys {
                query = query.bind(*key);
            }
            for seq in &seqs {
                query = query.bind(*seq);
            }
            for row in query.fetch_all(conn.connection_mut()).await? {
                barriers.insert(row.try_get(0)?, row.try_get(1)?);
            }
        }
        Ok(Some(OutboxBatch {
            conn,
            rows,
            barriers,
        }))
    }

    /// The confirmed messages marked SENT in one `UPDATE`, each refused one retried or
    /// parked with its own, and `COMMIT`.
    async fn outbox_settle(mut conn: MySqlConn, s: &Settlement<'_>) -> Result<u64, Error> {
        let parked = settle(&mut conn, s).await;
        match parked {
            Ok(parked) => {
                conn.finish(true).await?;
                Ok(parked)
            }
            Err(e) => {
                conn.reset().await;
                Err(e)
            }
        }
    }
}

async fn settle(conn: &mut MySqlConn, s: &Settlement<'_>) -> Result<u64, Error> {
    let persistent = conn.persistent();
    if !s.sent.is_empty() {
        let text = format!(
            "UPDATE idempotency_outbox SET state = 'SENT', sent_at = UTC_TIMESTAMP(6), \
             attempts = attempts + 1, last_error = NULL WHERE seq IN ({})",
            placeholders(s.sent.len())
        );
        let mut query = ::sqlx::query(AssertSqlSafe(text)).persistent(false);
        for seq in s.sent {
            query = query.bind(*seq);
        }
        query.execute(conn.connection_mut()).await?;
    }
    let mut parked = 0;
    for (seq, error) in s.refused.iter().zip(s.errors) {
        statement(sql::OUTBOX_MARK_FAILED, persistent)
            .bind(error.as_str())
            .bind(s.max_attempts)
            .bind(s.retry_base_seconds)
            .bind(s.retry_cap_seconds)
            .bind(*seq)
            .execute(conn.connection_mut())
            .await?;
        let row = statement(sql::OUTBOX_IS_PARKED, persistent)
            .bind(*seq)
            .fetch_optional(conn.connection_mut())
            .await?;
        if let Some(row) = row {
            if row.try_get::<bool, _>(0)? {
                parked += 1;
            }
        }
    }
    Ok(parked)
}

/// Enqueues `message` on `conn`, inside the caller's transaction: the ordering key's row
/// lock first, then the insert (a duplicate id is a no-op: the failed statement alone is
/// undone), then, for a generated id, its value.
pub(crate) async fn enqueue(
    conn: &mut MySqlConnection,
    message: &OutboxMessage,
    persistent: bool,
) -> Result<Enqueued, Error> {
    message.check().map_err(Error::InvalidMessage)?;
    if let Some(key) = message.ordering_key.as_deref() {
        statement(sql::OUTBOX_KEY_LOCK, persistent)
            .bind(key)
            .execute(&mut *conn)
            .await?;
    }
    let inserted = statement(sql::OUTBOX_ENQUEUE, persistent)
        .bind(message.id.as_deref())
        .bind(message.topic.as_str())
        .bind(message.ordering_key.as_deref())
        .bind(message.content_type.as_deref())
        .bind(&message.payload[..])
        .execute(&mut *conn)
        .await;
    let inserted = match inserted {
        Err(e) if error_number(&e) == Some(DUPLICATE_KEY) => None,
        inserted => Some(inserted?),
    };
    let message_id = match (inserted, &message.id) {
        (None, _) => None,
        (Some(_), Some(id)) => Some(id.clone()),
        (Some(done), None) => {
            let seq = i64::try_from(done.last_insert_id()).unwrap_or(i64::MAX);
            let row = statement(sql::OUTBOX_MESSAGE_ID, persistent)
                .bind(seq)
                .fetch_one(&mut *conn)
                .await?;
            Some(row.try_get(0)?)
        }
    };
    Ok(Enqueued::from_insert(message, message_id))
}
