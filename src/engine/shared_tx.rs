//! The transaction one request or message runs in, shared by its owner (the layer or the
//! inbox) and the handles it gives the handler. Driver-neutral: `C` is the driver's
//! connection inside a transaction.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::{OwnedRwLockWriteGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::engine::key::RecordId;

/// The slot holding the transaction's connection, and the count of live handles.
pub struct SharedTx<C> {
    pub(crate) id: RecordId,
    slot: Arc<RwLock<Option<C>>>,
    /// Live handles, so the owner can tell a handle that outlived its handler.
    handles: AtomicUsize,
}

impl<C> SharedTx<C> {
    pub(crate) fn new(id: RecordId) -> Self {
        Self {
            id,
            slot: Arc::new(RwLock::new(None)),
            handles: AtomicUsize::new(0),
        }
    }

    /// Exclusive access to the slot, to install a freshly claimed transaction.
    pub(crate) async fn slot(&self) -> RwLockWriteGuard<'_, Option<C>> {
        self.slot.write().await
    }

    /// Exclusive access to the slot unless a handle holds it (a driver whose handles hold
    /// the connection for as long as they live).
    pub(crate) fn try_slot(&self) -> Option<RwLockWriteGuard<'_, Option<C>>> {
        self.slot.try_write().ok()
    }

    /// Exclusive access held by a handle for as long as it lives (drivers whose statements
    /// need `&mut` to the connection); `None` if another handle holds it.
    #[cfg_attr(not(feature = "_sqlx"), allow(dead_code))]
    pub(crate) fn try_write_owned(&self) -> Option<OwnedRwLockWriteGuard<Option<C>>> {
        Arc::clone(&self.slot).try_write_owned().ok()
    }

    /// Shared access, for a handle running a statement.
    pub(crate) async fn read(&self) -> RwLockReadGuard<'_, Option<C>> {
        self.slot.read().await
    }

    /// Counts a new handle; the token uncounts it when dropped.
    pub(crate) fn count_handle(self: &Arc<Self>) -> HandleToken<C> {
        self.handles.fetch_add(1, Ordering::AcqRel);
        HandleToken {
            shared: Arc::clone(self),
        }
    }

    /// Handles still alive.
    pub(crate) fn live_handles(&self) -> usize {
        self.handles.load(Ordering::Acquire)
    }

    /// Takes the transaction back, waiting for statements in progress; handles see
    /// [`Error::TransactionEnded`](crate::Error::TransactionEnded) from now on.
    pub(crate) async fn take(&self) -> Option<C> {
        self.slot.write().await.take()
    }

    /// Takes the transaction back unless a handle holds it; a handle that outlived its
    /// handler may hold it for as long as it lives.
    pub(crate) fn try_take(&self) -> Option<C> {
        self.slot.try_write().ok()?.take()
    }
}

impl<C> fmt::Debug for SharedTx<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedTx")
            .field("id", &self.id)
            .field("handles", &self.live_handles())
            .finish_non_exhaustive()
    }
}

/// A live handle's share of a [`SharedTx`].
pub(crate) struct HandleToken<C> {
    shared: Arc<SharedTx<C>>,
}

impl<C> HandleToken<C> {
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn shared(&self) -> &SharedTx<C> {
        &self.shared
    }

    pub(crate) fn id(&self) -> RecordId {
        self.shared.id
    }
}

impl<C> Drop for HandleToken<C> {
    fn drop(&mut self) {
        self.shared.handles.fetch_sub(1, Ordering::AcqRel);
    }
}
