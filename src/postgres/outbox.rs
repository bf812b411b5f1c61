//! The outbox on tokio-postgres: enqueueing in a handler's or inbox work's
//! [`IdempotentTx`](super::IdempotentTx) or in any transaction of your own, and the
//! relay's statements.

use std::collections::HashMap;

use tokio_postgres::GenericClient;
use tokio_postgres::types::{ToSql, Type};

use super::PgStore;
use super::conn::TxConn;
use super::statement::{self, Db, OUTBOX_ENQUEUE};
use super::tx::PgTx;
use crate::engine::error::Error;
use crate::engine::outbox::{Enqueued, OutboxBatch, OutboxMessage, Settlement, barrier_params};
use crate::store::OutboxStore;

/// Enqueues `message` in the transaction `client` is in: it is published after that
/// transaction commits, and never if it rolls back. One round trip, unprepared (safe behind
/// a transaction-pooling PgBouncer).
///
/// `client` is a `tokio_postgres::Transaction` (`&*tx` for deadpool's) or any other
/// [`GenericClient`]; on a plain client outside a transaction the message commits at once.
/// Run [`migrate`](crate::migrate) first: the outbox is its table `idempotency_outbox`.
///
/// ```no_run
/// use axum_idempotency::outbox::OutboxMessage;
///
/// # async fn run(pool: deadpool_postgres::Pool) -> Result<(), Box<dyn std::error::Error>> {
/// let mut client = pool.get().await?;
/// let tx = client.transaction().await?;
/// tx.execute("UPDATE orders SET status = 'PAID' WHERE order_no = $1", &[&"ORD-7"]).await?;
/// axum_idempotency::postgres::enqueue(
///     &*tx,
///     &OutboxMessage::new("payment-succeeded", r#"{"order_no":"ORD-7"}"#).id("ORD-7-paid"),
/// )
/// .await?;
/// tx.commit().await?; // the UPDATE and the message, together
/// # Ok(()) }
/// ```
pub async fn enqueue<C>(client: &C, message: &OutboxMessage) -> Result<Enqueued, Error>
where
    C: GenericClient + Sync,
{
    message.check().map_err(Error::InvalidMessage)?;
    let params = enqueue_params(message);
    let typed: Vec<(&(dyn ToSql + Sync), Type)> = params
        .iter()
        .copied()
        .zip(OUTBOX_ENQUEUE.types.iter().cloned())
        .collect();
    let row = client
        .query_typed_opt(OUTBOX_ENQUEUE.text, &typed)
        .await
        .map_err(|e| Error::from(e).of_crate_statement())?;
    enqueued(message, row)
}

/// The parameters of `sql::OUTBOX_ENQUEUE`.
pub(crate) fn enqueue_params(message: &OutboxMessage) -> [&(dyn ToSql + Sync); 5] {
    [
        &message.id,
        &message.topic,
        &message.ordering_key,
        &message.content_type,
        &message.payload,
    ]
}

/// The enqueue's answer: the row's id, or no row for an id already in the outbox.
pub(crate) fn enqueued(
    message: &OutboxMessage,
    row: Option<tokio_postgres::Row>,
) -> Result<Enqueued, Error> {
    let inserted = row.map(|row| row.try_get(0)).transpose()?;
    Ok(Enqueued::from_insert(message, inserted))
}

impl OutboxStore for PgStore {
    async fn enqueue(handle: &mut PgTx, message: &OutboxMessage) -> Result<Enqueued, Error> {
        let row = handle
            .with_client(None, async |conn| {
                let db = statement::Db::new(conn.pooled(), conn.prepared());
                let insert = db.prepare(&statement::OUTBOX_ENQUEUE).await?;
                db.query_opt(&insert, &enqueue_params(message)).await
            })
            .await?;
        enqueued(message, row)
    }

    /// `BEGIN` and the locking `SELECT` pipelined; the barriers of the batch's ordering
    /// keys in a second round trip, only when it has keyed messages.
    async fn outbox_lock_batch(&self, limit: i64) -> Result<Option<OutboxBatch<TxConn>>, Error> {
        let conn = TxConn::new(self.checkout().await?, self.prepared);
        let db = self.db(conn.pooled());
        let lock = db.prepare(&statement::OUTBOX_LOCK_BATCH).await?;
        let limit_params: [&(dyn ToSql + Sync); 1] = [&limit];
        let (begun, rows) = tokio::join!(
            biased;
            db.client().batch_execute("BEGIN"),
            db.query(&lock, &limit_params),
        );
        begun?;
        let rows = rows?
            .iter()
            .map(crate::store::rows::outgoing)
            .collect::<Result<Vec<_>, _>>()?;
        if rows.is_empty() {
            conn.rollback().await;
            return Ok(None);
        }
        let mut barriers = HashMap::new();
        if let Some((keys, seqs)) = barrier_params(&rows) {
            let statement = db.prepare(&statement::OUTBOX_BARRIERS).await?;
            for row in db.query(&statement, &[&keys, &seqs]).await? {
                barriers.insert(row.try_get(0)?, row.try_get(1)?);
            }
        }
        Ok(Some(OutboxBatch {
            conn,
            rows,
            barriers,
        }))
    }

    /// Both updates and `COMMIT` pipelined in one round trip; if an update fails, the
    /// server turns the `COMMIT` into a `ROLLBACK` and the batch stays pending.
    async fn outbox_settle(mut conn: TxConn, s: &Settlement<'_>) -> Result<u64, Error> {
        let db = Db::new(conn.pooled(), conn.prepared());
        let mark_sent = match s.sent {
            [] => None,
            _ => Some(db.prepare(&statement::OUTBOX_MARK_SENT).await?),
        };
        let mark_failed = match s.refused {
            [] => None,
            _ => Some(db.prepare(&statement::OUTBOX_MARK_FAILED).await?),
        };
        let failed_params: [&(dyn ToSql + Sync); 5] = [
            &s.refused,
            &s.errors,
            &s.max_attempts,
            &s.retry_base_seconds,
            &s.retry_cap_seconds,
        ];
        let (sent, parked, committed) = tokio::join!(
            biased;
            async {
                match &mark_sent {
                    Some(statement) => db.execute(statement, &[&s.sent]).await.map(drop),
                    None => Ok(()),
                }
            },
            async {
                let Some(statement) = &mark_failed else {
                    return Ok(0);
                };
                let rows = db.query(statement, &failed_params).await?;
                let mut parked = 0;
                for row in rows {
                    if row.try_get::<_, bool>(0)? {
                        parked += 1;
                    }
                }
                Ok::<_, tokio_postgres::Error>(parked)
            },
            db.client().batch_execute("COMMIT"),
        );
        sent?;
        let parked = parked?;
        committed?;
        conn.mark_ended();
        Ok(parked)
    }
}
