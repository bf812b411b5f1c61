//! A pooled connection that may be inside a transaction, and the rule that it never goes
//! back to its pool inside one.

use std::fmt;
use std::time::Duration;

use tokio_postgres::Client;

use super::pool::PooledClient;

/// How long a background ROLLBACK may take before the connection is discarded instead.
const ROLLBACK_TIMEOUT: Duration = Duration::from_secs(10);

/// A pooled connection that may be inside a transaction.
///
/// It never goes back to the pool inside a transaction: dropped while one is open, it
/// rolls back in a background task, and if that is impossible (no runtime, or the ROLLBACK
/// fails) the connection is [discarded](PooledClient::discard), so the server rolls back.
pub struct TxConn {
    conn: Option<Box<dyn PooledClient>>,
    in_transaction: bool,
    /// The store's prepared-statement setting, for statements run after the claim.
    prepared: bool,
}

impl TxConn {
    /// Wraps a connection that is about to begin a transaction.
    pub(crate) fn new(conn: Box<dyn PooledClient>, prepared: bool) -> Self {
        Self {
            conn: Some(conn),
            in_transaction: true,
            prepared,
        }
    }

    pub(crate) fn prepared(&self) -> bool {
        self.prepared
    }

    pub(crate) fn pooled(&self) -> &dyn PooledClient {
        // `conn` is only taken in `Drop` and `rollback`, which consume the value.
        self.conn.as_deref().expect("TxConn used after drop")
    }

    pub(crate) fn client(&self) -> &Client {
        self.pooled().client()
    }

    /// Marks the transaction as ended (committed or rolled back by the server); the
    /// connection may go back to the pool.
    pub(crate) fn mark_ended(&mut self) {
        self.in_transaction = false;
    }

    /// Rolls back and returns the connection to the pool, waiting for the ROLLBACK.
    pub(crate) async fn rollback(mut self) {
        let Some(conn) = self.conn.take() else {
            return;
        };
        rollback_or_discard(DiscardOnDrop(Some(conn))).await;
    }
}

impl Drop for TxConn {
    fn drop(&mut self) {
        if !self.in_transaction {
            return;
        }
        let Some(conn) = self.conn.take() else {
            return;
        };
        let guard = DiscardOnDrop(Some(conn));
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(rollback_or_discard(guard));
            }
            Err(_) => drop(guard),
        }
    }
}

impl fmt::Debug for TxConn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TxConn")
            .field("in_transaction", &self.in_transaction)
            .finish_non_exhaustive()
    }
}

/// Owns a connection of unknown state: dropped, it discards the connection rather than
/// return it to the pool.
struct DiscardOnDrop(Option<Box<dyn PooledClient>>);

impl Drop for DiscardOnDrop {
    fn drop(&mut self) {
        if let Some(conn) = self.0.take() {
            tracing::debug!("discarding a connection whose transaction state is unknown");
            conn.discard();
        }
    }
}

async fn rollback_or_discard(mut guard: DiscardOnDrop) {
    let Some(conn) = guard.0.as_ref() else {
        return;
    };
    let rolled_back =
        tokio::time::timeout(ROLLBACK_TIMEOUT, conn.client().batch_execute("ROLLBACK")).await;
    if let Ok(Ok(())) = rolled_back {
        // Clean: back to the pool.
        drop(guard.0.take());
    }
}
