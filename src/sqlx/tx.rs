//! [`IdempotentTx`] for sqlx: the handler's exclusive hold on the shared transaction.

use std::fmt;
use std::ops::{Deref, DerefMut};

use ::sqlx::PgConnection;
use tokio::sync::OwnedRwLockWriteGuard;

use super::store::SqlxConn;
use crate::engine::shared_tx::HandleToken;

/// The extractor that makes a route idempotent on the sqlx driver, and the handle
/// [`Inbox`](crate::Inbox) work gets on an `sqlx::PgPool`.
///
/// It derefs to the `PgConnection` of the transaction that also stores the idempotency
/// record, so `&mut *tx` is an executor: every statement the handler runs through it
/// commits with the record once the handler returns, or not at all. Like
/// [`crate::IdempotentTx`], it must not outlive the handler: a handle still alive when the
/// handler returns makes the layer roll everything back and answer 500.
///
/// ```no_run
/// use axum::http::StatusCode;
/// use axum_idempotency::sqlx::IdempotentTx;
///
/// async fn grant_coupon(mut tx: IdempotentTx) -> StatusCode {
///     let granted = sqlx::query("INSERT INTO coupon_account (user_id, coupon_code) VALUES ($1, $2)")
///         .bind(1001_i64)
///         .bind("NEW_USER_50")
///         .execute(&mut *tx)
///         .await;
///     match granted {
///         Ok(_) => StatusCode::CREATED,
///         Err(_) => StatusCode::INTERNAL_SERVER_ERROR, // rolled back; a retry runs again
///     }
/// }
/// ```
pub struct IdempotentTx {
    guard: OwnedRwLockWriteGuard<Option<SqlxConn>>,
    token: HandleToken<SqlxConn>,
}

impl IdempotentTx {
    pub(crate) fn new(
        guard: OwnedRwLockWriteGuard<Option<SqlxConn>>,
        token: HandleToken<SqlxConn>,
    ) -> Self {
        Self { guard, token }
    }

    /// A stable key for one downstream effect of this operation: the same on every retry of
    /// the same request (or redelivery of the same message), different for every `label`.
    /// See [`crate::IdempotentTx::derive_key`].
    pub fn derive_key(&self, label: &str) -> String {
        crate::engine::key::derive_key(self.token.id(), label)
    }

    /// Enqueues `message` in this transaction: it becomes visible with the handler's rows
    /// and the idempotency record, in one COMMIT, or never. See
    /// [`crate::IdempotentTx::enqueue`].
    ///
    /// ```no_run
    /// use axum_idempotency::outbox::OutboxMessage;
    ///
    /// # async fn pay(mut tx: axum_idempotency::sqlx::IdempotentTx) -> Result<(), axum_idempotency::Error> {
    /// let id = tx.derive_key("paid");
    /// tx.enqueue(&OutboxMessage::new("payment-succeeded", r#"{"order_no":"ORD-7"}"#).id(id))
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub async fn enqueue(
        &mut self,
        message: &crate::outbox::OutboxMessage,
    ) -> Result<crate::outbox::Enqueued, crate::Error> {
        let conn = self
            .guard
            .as_mut()
            .expect("the transaction is held by this handle");
        let persistent = conn.persistent();
        super::outbox::enqueue(conn.connection_mut(), message, persistent).await
    }
}

impl Deref for IdempotentTx {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        // The slot is filled before a handle is made, and emptied only once no handle holds
        // it.
        self.guard
            .as_ref()
            .expect("the transaction is held by this handle")
            .connection()
    }
}

impl DerefMut for IdempotentTx {
    fn deref_mut(&mut self) -> &mut PgConnection {
        self.guard
            .as_mut()
            .expect("the transaction is held by this handle")
            .connection_mut()
    }
}

impl fmt::Debug for IdempotentTx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotentTx")
            .field("record", &self.token.id())
            .finish_non_exhaustive()
    }
}
