//! The outbox on SQLite: enqueueing through any executor (the handler's
//! [`IdempotentTx`](super::IdempotentTx) or a transaction of your own), and the relay's
//! statements — a batch **claimed** in a short write transaction rather than locked for
//! the whole publish, since SQLite's one write lock would stop every other writer
//! meanwhile.

use std::collections::HashMap;

use ::sqlx::sqlite::Sqlite;
use ::sqlx::{Executor, Row};

use super::SqliteTx;
use super::conn::{SqliteConn, statement};
use super::{SqliteStore, sql};
use crate::engine::error::Error;
use crate::engine::outbox::{Enqueued, OutboxBatch, OutboxMessage, Settlement};
use crate::store::{OutboxStore, Store};

/// How long a relay's claim on its batch lasts: past it, another relay may take the
/// messages it has not settled (a relay that died mid-batch). Longer than a batch takes to
/// publish (a lane stops at its first refusal, every lane at the first timeout).
const CLAIM_SECONDS: f64 = 120.0;

impl OutboxStore for SqliteStore {
    async fn enqueue(handle: &mut SqliteTx, message: &OutboxMessage) -> Result<Enqueued, Error> {
        let slot = handle.slot_mut();
        let persistent = slot.persistent();
        enqueue(slot.connection_mut(), message, persistent).await
    }

    /// A read outside any transaction first (an idle relay never takes the write lock);
    /// then `BEGIN IMMEDIATE`, the batch's claim token, the claiming `UPDATE .. RETURNING`,
    /// the barriers of its ordering keys only when it has keyed messages, and `COMMIT`. The
    /// batch's connection holds no transaction, only the claim token its settlement is
    /// fenced by.
    async fn outbox_lock_batch(
        &self,
        limit: i64,
    ) -> Result<Option<OutboxBatch<SqliteConn>>, Error> {
        let due: bool = self
            .query(sql::OUTBOX_ANY_DUE)
            .fetch_one(&self.pool)
            .await?
            .try_get(0)?;
        if !due {
            return Ok(None);
        }
        let mut conn = self.begin().await?;
        let token = next_claim_token(&mut conn).await?;
        let claimed = self
            .query(sql::OUTBOX_CLAIM_BATCH)
            .bind(token)
            .bind(CLAIM_SECONDS)
            .bind(limit)
            .fetch_all(conn.connection_mut())
            .await?;
        let mut rows = claimed
            .iter()
            .map(crate::store::rows::outgoing)
            .collect::<Result<Vec<_>, _>>()?;
        if rows.is_empty() {
            <SqliteStore as Store>::rollback(conn).await;
            return Ok(None);
        }
        rows.sort_by_key(|row| row.seq);
        let mut barriers = HashMap::new();
        if rows.iter().any(|row| row.ordering_key.is_some()) {
            let found = self
                .query(sql::OUTBOX_BARRIERS)
                .bind(token)
                .fetch_all(conn.connection_mut())
                .await?;
            for row in found {
                barriers.insert(row.try_get(0)?, row.try_get(1)?);
            }
        }
        conn.commit().await?;
        let mut conn = self.ended();
        conn.claim = Some(token);
        Ok(Some(OutboxBatch {
            conn,
            rows,
            barriers,
        }))
    }

    /// `BEGIN IMMEDIATE`, the confirmed ones marked SENT, the refused ones retried or
    /// parked, the rest of the claim released, `COMMIT` — each fenced by the batch's claim
    /// token, so a relay whose claim lapsed and was taken over changes nothing.
    async fn outbox_settle(conn: SqliteConn, s: &Settlement<'_>) -> Result<u64, Error> {
        let Some(token) = conn.claim else {
            return Ok(0);
        };
        let persistent = conn.persistent;
        let tx = conn.pool.begin_with(sql::BEGIN_IMMEDIATE).await?;
        let mut conn = SqliteConn {
            tx: Some(tx),
            persistent,
            pool: conn.pool.clone(),
            key: None,
            claim: None,
        };
        if !s.sent.is_empty() {
            statement(sql::OUTBOX_MARK_SENT, persistent)
                .bind(json(&s.sent)?)
                .bind(token)
                .execute(conn.connection_mut())
                .await?;
        }
        let mut parked = 0;
        if !s.refused.is_empty() {
            let refused: Vec<(i64, &String)> = s.refused.iter().copied().zip(s.errors).collect();
            let rows = statement(sql::OUTBOX_MARK_FAILED, persistent)
                .bind(json(&refused)?)
                .bind(s.max_attempts)
                .bind(s.retry_base_seconds)
                .bind(s.retry_cap_seconds)
                .bind(token)
                .fetch_all(conn.connection_mut())
                .await?;
            for row in rows {
                if row.try_get::<bool, _>(0)? {
                    parked += 1;
                }
            }
        }
        statement(sql::OUTBOX_RELEASE, persistent)
            .bind(token)
            .execute(conn.connection_mut())
            .await?;
        conn.commit().await?;
        Ok(parked)
    }
}

/// The next claim token, in `conn`'s write transaction.
async fn next_claim_token(conn: &mut SqliteConn) -> Result<i64, Error> {
    let rows = statement(sql::NEXT_CLAIM_TOKEN, conn.persistent())
        .fetch_all(conn.connection_mut())
        .await?;
    let row = rows.first().ok_or(::sqlx::Error::RowNotFound)?;
    Ok(row.try_get(0)?)
}

/// A statement's list parameter: SQLite has no arrays, so lists go in as JSON text and come
/// out of `json_each`.
fn json<T: serde::Serialize + ?Sized>(value: &T) -> Result<String, Error> {
    serde_json::to_string(value).map_err(|e| Error::Sqlx(::sqlx::Error::Encode(Box::new(e))))
}

/// Enqueues `message` through `executor`; see [`crate::sqlite::enqueue`].
pub(crate) async fn enqueue<'c, E>(
    executor: E,
    message: &OutboxMessage,
    persistent: bool,
) -> Result<Enqueued, Error>
where
    E: Executor<'c, Database = Sqlite>,
{
    message.check().map_err(Error::InvalidMessage)?;
    // `fetch_all`: a statement with RETURNING is run to its end before its rows are read.
    let rows = statement(sql::OUTBOX_ENQUEUE, persistent)
        .bind(message.id.clone())
        .bind(message.topic.clone())
        .bind(message.ordering_key.clone())
        .bind(message.content_type.clone())
        .bind(message.payload.clone())
        .fetch_all(executor)
        .await?;
    let inserted = rows.first().map(|row| row.try_get(0)).transpose()?;
    Ok(Enqueued::from_insert(message, inserted))
}
