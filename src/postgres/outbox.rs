//! Enqueueing outbox messages through tokio-postgres: in a handler's or inbox work's
//! [`IdempotentTx`](super::IdempotentTx), or in any transaction of your own.

use tokio_postgres::GenericClient;
use tokio_postgres::types::{ToSql, Type};

use super::db::OUTBOX_ENQUEUE;
use crate::Error;
use crate::engine::outbox::{Enqueued, OutboxMessage};

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
    let row = client.query_typed_opt(OUTBOX_ENQUEUE.text, &typed).await?;
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
    Ok(match row {
        Some(row) => Enqueued {
            message_id: row.try_get(0)?,
            duplicate: false,
        },
        None => Enqueued {
            message_id: message.id.clone().unwrap_or_default(),
            duplicate: true,
        },
    })
}
