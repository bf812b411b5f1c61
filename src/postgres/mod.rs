//! The tokio-postgres driver: [`PgStore`] over any pool that hands out a
//! `tokio_postgres::Client` — deadpool (feature `deadpool`, default), bb8 (feature `bb8`),
//! or your own through [`ClientPool`] — and [`IdempotentTx`], the handle its handlers
//! run their statements through.
//!
//! The fastest driver: the claim is a lookup outside any transaction (all a replay needs),
//! then `BEGIN`, the lock attempt and the lookup again pipelined in one round trip; the
//! completion is the record's insert and `COMMIT` pipelined in another. Statements are
//! prepared once per connection where the pool keeps a statement cache (deadpool); with a
//! pool that does not (bb8), or with `prepared_statements(false)`, they are sent
//! unprepared with their parameter types — the same round trips, planned each time.

mod conn;
mod inbox;
mod link;
mod listen;
mod maintenance;
mod migrate;
mod outbox;
mod pool;
mod queries;
mod statement;
mod store;
mod tx;

use std::fmt;
use std::sync::Arc;

pub use self::link::{DEAD_LISTENER_AFTER, detect_dead_peers};
pub use self::outbox::enqueue;
pub use self::pool::{BoxFuture, ClientPool, PoolError, PooledClient};
pub use self::tx::{PgTx, TxStatement};

/// The `bb8` this driver is built with (feature `bb8`), for the same reason.
#[cfg(feature = "bb8")]
#[cfg_attr(docsrs, doc(cfg(feature = "bb8")))]
pub use ::bb8;
/// The `deadpool-postgres` this driver is built with (feature `deadpool`): build the pool
/// given to `IdempotencyLayer::new` from it, so its type is the one the crate implements
/// `IntoStore` for.
#[cfg(feature = "deadpool")]
#[cfg_attr(docsrs, doc(cfg(feature = "deadpool")))]
pub use ::deadpool_postgres;
/// The `tokio-postgres` this driver is built with: a `Config`, a TLS connector or a
/// `Client` you hand the crate must come from this version.
pub use ::tokio_postgres;

/// The [`IdempotentTx`](crate::IdempotentTx) extractor on tokio-postgres: it derefs to
/// [`PgTx`], whose `query`, `execute` and friends run in the transaction that also
/// stores the idempotency record.
pub type IdempotentTx = crate::store::IdempotentTx<PgStore>;

/// The tokio-postgres [`Store`](crate::Store): a [`ClientPool`] and the crate's
/// prepared-statement setting. Cloning it is a reference-count bump.
///
/// Components build one from a deadpool or bb8 pool themselves
/// (`IdempotencyLayer::new(pool)`); build it with [`PgStore::new`] for another pool.
#[derive(Clone)]
pub struct PgStore {
    pool: Arc<dyn ClientPool>,
    prepared: bool,
    /// The optimistic claim's bound on a twin's wait; `None`: the locked claim.
    optimistic: Option<std::time::Duration>,
}

impl PgStore {
    /// A store over `pool`.
    pub fn new(pool: impl ClientPool) -> Self {
        Self {
            pool: Arc::new(pool),
            prepared: true,
            optimistic: None,
        }
    }
}

impl fmt::Debug for PgStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgStore")
            .field("prepared_statements", &self.prepared)
            .finish_non_exhaustive()
    }
}

impl crate::store::sealed::Sealed for PgStore {}
