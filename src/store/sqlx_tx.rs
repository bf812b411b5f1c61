//! [`SqlxTx`]: the handle of the three sqlx drivers (PostgreSQL, MySQL/MariaDB, SQLite) on
//! the shared transaction, written once over the driver's connection slot.

use std::fmt;

use tokio::sync::OwnedRwLockWriteGuard;

use crate::engine::key::RecordId;
use crate::engine::shared_tx::HandleToken;

/// What a sqlx driver keeps in the shared transaction's slot: its connection, and the
/// store's prepared-statement setting.
pub trait SqlxSlot: Send + Sync + 'static {
    /// The sqlx connection the handle derefs to (`PgConnection`, `MySqlConnection`,
    /// `SqliteConnection`).
    type Connection: ?Sized;
    fn connection(&self) -> &Self::Connection;
    fn connection_mut(&mut self) -> &mut Self::Connection;
    /// Whether statements run through a handle are prepared.
    fn persistent(&self) -> bool;
}

/// A sqlx driver's hold on the shared transaction: what
/// [`IdempotentTx`](crate::IdempotentTx) keeps, exclusively, for as long as it lives (it
/// derefs to the transaction's connection). Named by each driver's alias:
/// `sqlx::SqlxTx`, `mysql::MySqlTx`, `sqlite::SqliteTx`.
pub struct SqlxTx<C> {
    guard: OwnedRwLockWriteGuard<Option<C>>,
    token: HandleToken<C>,
}

impl<C: SqlxSlot> SqlxTx<C> {
    pub(crate) fn new(guard: OwnedRwLockWriteGuard<Option<C>>, token: HandleToken<C>) -> Self {
        Self { guard, token }
    }

    /// The record id this handle's transaction claimed.
    pub(crate) fn record_id(&self) -> RecordId {
        self.token.id()
    }

    /// The slot: the connection and the store's settings.
    pub(crate) fn slot_mut(&mut self) -> &mut C {
        // The slot is filled before a handle is made, and emptied only once no handle
        // holds it.
        self.guard
            .as_mut()
            .expect("the transaction is held by this handle")
    }

    pub(crate) fn connection(&self) -> &C::Connection {
        self.guard
            .as_ref()
            .expect("the transaction is held by this handle")
            .connection()
    }

    pub(crate) fn connection_mut(&mut self) -> &mut C::Connection {
        self.slot_mut().connection_mut()
    }
}

impl<C> fmt::Debug for SqlxTx<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotentTx")
            .field("record", &self.token.id())
            .finish_non_exhaustive()
    }
}
