//! [`MySqlTx`]: the MySQL/MariaDB handle's exclusive hold on the shared transaction.

use std::fmt;

use ::sqlx::MySqlConnection;
use tokio::sync::OwnedRwLockWriteGuard;

use super::conn::MySqlConn;
use crate::engine::shared_tx::HandleToken;

/// The MySQL/MariaDB driver's hold on the shared transaction: what
/// [`IdempotentTx`](super::IdempotentTx) keeps, exclusively, for as long as it lives (it
/// derefs to the transaction's `MySqlConnection`).
pub struct MySqlTx {
    guard: OwnedRwLockWriteGuard<Option<MySqlConn>>,
    token: HandleToken<MySqlConn>,
}

impl MySqlTx {
    pub(crate) fn new(
        guard: OwnedRwLockWriteGuard<Option<MySqlConn>>,
        token: HandleToken<MySqlConn>,
    ) -> Self {
        Self { guard, token }
    }

    /// The record id this handle's transaction claimed.
    pub(crate) fn record_id(&self) -> crate::engine::key::RecordId {
        self.token.id()
    }

    /// Enqueues `message` (checked by the caller) in this transaction.
    pub(crate) async fn enqueue(
        &mut self,
        message: &crate::engine::outbox::OutboxMessage,
    ) -> Result<crate::engine::outbox::Enqueued, crate::engine::error::Error> {
        let conn = self
            .guard
            .as_mut()
            .expect("the transaction is held by this handle");
        let persistent = conn.persistent();
        super::outbox::enqueue(conn.connection_mut(), message, persistent).await
    }

    pub(crate) fn connection(&self) -> &MySqlConnection {
        // The slot is filled before a handle is made, and emptied only once no handle holds
        // it.
        self.guard
            .as_ref()
            .expect("the transaction is held by this handle")
            .connection()
    }

    pub(crate) fn connection_mut(&mut self) -> &mut MySqlConnection {
        self.guard
            .as_mut()
            .expect("the transaction is held by this handle")
            .connection_mut()
    }
}

impl fmt::Debug for MySqlTx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotentTx")
            .field("record", &self.token.id())
            .finish_non_exhaustive()
    }
}
