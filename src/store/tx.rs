//! [`IdempotentTx`], the one extractor and handle every driver shares, and [`TxHandle`],
//! what a driver's handle on the shared transaction gives it.

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::{OutboxStore, Store};
use crate::engine::error::Error;
use crate::engine::key::RecordId;
use crate::engine::outbox::{Enqueued, OutboxMessage};
use crate::engine::shared_tx::SharedTx;

/// A driver's handle on the shared transaction: what [`IdempotentTx`] holds and derefs
/// through. Written once for the three sqlx drivers (`store::sqlx_tx::SqlxTx`) and once by
/// each other client library (`postgres::PgTx`).
#[doc(hidden)]
pub trait TxHandle: Sized + Send + Sync + 'static {
    /// What the shared transaction holds: a pooled connection inside a transaction the
    /// crate began.
    type Conn: Send + Sync + 'static;
    /// What [`IdempotentTx`] derefs to: the handle itself (tokio-postgres), or the
    /// transaction's connection (sqlx).
    type Target: ?Sized;

    /// A new handle on a transaction that holds a connection; `None` if the driver hands
    /// the connection out exclusively and another handle holds it.
    fn on_shared(shared: &Arc<SharedTx<Self::Conn>>) -> Option<Self>;

    /// The record id the handle's transaction claimed (for `derive_key`).
    fn record_id(&self) -> RecordId;

    fn target(&self) -> &Self::Target;

    fn target_mut(&mut self) -> &mut Self::Target;
}

/// A handle on the transaction that also stores the idempotency record: the extractor that
/// enables idempotency for a route, and what the [`Inbox`](crate::Inbox) hands a
/// consumer's work. `D` is the driver; name it through its alias,
/// [`postgres::IdempotentTx`](crate::postgres::IdempotentTx) (tokio-postgres) or
/// `sqlx::IdempotentTx` (sqlx).
///
/// Taking it as a handler argument makes the route idempotent: before the handler runs,
/// the extractor checks out a connection, begins a transaction, takes the key's lock and
/// looks for a stored response. A repeat is answered from the store (the handler does not
/// run); otherwise the handler gets this handle, and every statement it runs through it
/// belongs to the transaction that also stores the idempotency record.
/// [`IdempotencyLayer`](crate::IdempotencyLayer) commits both once the handler returns.
///
/// It derefs to the driver's way of running statements: on tokio-postgres a handle with
/// `query`, `execute` and friends (`PgTx`), on sqlx the transaction's `PgConnection`, so
/// `&mut *tx` is an executor. It cannot commit, roll back or open another transaction: the
/// layer decides the outcome from the handler's response.
///
/// It must not outlive the handler: a handle still alive when the handler returns (moved
/// into a spawned task, say) makes the layer roll everything back and answer 500.
///
/// ```no_run
/// # #[cfg(feature = "postgres")] mod doc {
/// use axum::{Json, http::StatusCode, response::IntoResponse};
/// use axum_idempotency::postgres::IdempotentTx;
///
/// #[derive(serde::Deserialize)]
/// struct NewOrder { user_id: i64, amount: i64 }
///
/// async fn create_order(
///     tx: IdempotentTx,
///     Json(order): Json<NewOrder>,
/// ) -> Result<impl IntoResponse, StatusCode> {
///     let row = tx
///         .query_one(
///             "INSERT INTO orders (user_id, amount) VALUES ($1, $2) RETURNING id",
///             &[&order.user_id, &order.amount],
///         )
///         .await
///         .map_err(|_| StatusCode::INTERNAL_SERVER_ERROR)?;
///     let id: i64 = row.get(0);
///     Ok((StatusCode::CREATED, Json(serde_json::json!({ "id": id }))))
/// }
/// # }
/// ```
pub struct IdempotentTx<D: Store> {
    handle: D::Handle,
    /// Set when the handler first reaches the transaction (a statement, an enqueue): an
    /// answer given before that is not stored.
    work_began: Option<Arc<AtomicBool>>,
}

impl<D: Store> IdempotentTx<D> {
    pub(crate) fn new(handle: D::Handle) -> Self {
        Self {
            handle,
            work_began: None,
        }
    }

    /// A handle that sets `work_began` when the handler first uses the transaction.
    pub(crate) fn watched(handle: D::Handle, work_began: Arc<AtomicBool>) -> Self {
        Self {
            handle,
            work_began: Some(work_began),
        }
    }

    fn began(&self) {
        if let Some(flag) = &self.work_began {
            flag.store(true, Ordering::Release);
        }
    }

    /// A stable key for one downstream effect of this operation: the same on every retry of
    /// the same request (or redelivery of the same message), different for every `label`.
    /// Send it as the `Idempotency-Key` of a call to another service, or as the id of a
    /// message, so that service applies the effect once too.
    ///
    /// ```no_run
    /// # #[cfg(feature = "postgres")]
    /// # async fn grant(tx: axum_idempotency::postgres::IdempotentTx) -> Result<(), axum_idempotency::Error> {
    /// let coupon_request_id = tx.derive_key("coupon");
    /// // The coupon service receives the same id on every retry of this request, e.g.
    /// // with `Idempotency-Key: {coupon_request_id}`.
    /// tx.execute(
    ///     "INSERT INTO outbox (message_id, topic) VALUES ($1, 'grant-coupon')",
    ///     &[&coupon_request_id],
    /// )
    /// .await?;
    /// # Ok(()) }
    /// ```
    pub fn derive_key(&self, label: &str) -> String {
        crate::engine::key::derive_key(self.handle.record_id(), label)
    }
}

impl<D: OutboxStore> IdempotentTx<D> {
    /// Enqueues `message` in this transaction: it becomes visible with the handler's rows
    /// and the idempotency record, in one COMMIT, and a relay
    /// ([`OutboxRelay`](crate::outbox::OutboxRelay)) publishes it after that. If the
    /// handler fails, panics, answers 5xx or a stored 4xx, or the COMMIT fails, it is never
    /// published.
    ///
    /// Give the message an id derived from the operation ([`derive_key`](Self::derive_key))
    /// so the consumer's [`Inbox`](crate::Inbox) recognises it, and a repeated enqueue is a
    /// no-op.
    ///
    /// ```no_run
    /// use axum_idempotency::outbox::OutboxMessage;
    ///
    /// # #[cfg(feature = "postgres")]
    /// # async fn pay(mut tx: axum_idempotency::postgres::IdempotentTx, order_no: String) -> Result<(), axum_idempotency::Error> {
    /// let paid = tx
    ///     .execute("UPDATE orders SET status = 'PAID' WHERE order_no = $1 AND status = 'NEW'", &[&order_no])
    ///     .await?;
    /// if paid == 1 {
    ///     let event = serde_json::json!({ "order_no": order_no });
    ///     let id = tx.derive_key("paid");
    ///     tx.enqueue(&OutboxMessage::json("payment-succeeded", &event).expect("JSON").id(id))
    ///         .await?;
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn enqueue(&mut self, message: &OutboxMessage) -> Result<Enqueued, Error> {
        message.check().map_err(Error::InvalidMessage)?;
        self.began();
        D::enqueue(&mut self.handle, message)
            .await
            .map_err(Error::of_crate_statement)
    }
}

impl<D: Store> Deref for IdempotentTx<D> {
    type Target = D::Tx;

    fn deref(&self) -> &D::Tx {
        self.began();
        self.handle.target()
    }
}

impl<D: Store> DerefMut for IdempotentTx<D> {
    fn deref_mut(&mut self) -> &mut D::Tx {
        self.began();
        self.handle.target_mut()
    }
}

impl<D: Store> fmt::Debug for IdempotentTx<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotentTx")
            .field("driver", &D::DRIVER)
            .field("record", &self.handle.record_id())
            .finish_non_exhaustive()
    }
}
