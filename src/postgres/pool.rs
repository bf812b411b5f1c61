//! Pools the tokio-postgres driver runs on: [`ClientPool`], implemented here for deadpool
//! and bb8, and implementable for any other pool that hands out a `tokio_postgres::Client`.

use std::future::Future;
use std::pin::Pin;

use tokio_postgres::types::Type;
use tokio_postgres::{Client, Statement};

/// A boxed future, as [`ClientPool`] and [`PooledClient`] return them.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The error a pool reports when it cannot hand out a connection.
pub type PoolError = Box<dyn std::error::Error + Send + Sync>;

/// A pool of tokio-postgres connections: what [`PgStore`](super::PgStore) needs of one.
///
/// Implemented for `deadpool_postgres::Pool` (feature `deadpool`, default) and
/// `bb8::Pool<bb8_postgres::PostgresConnectionManager<T>>` (feature `bb8`). For another
/// pool, implement it and pass the pool to [`PgStore::new`](super::PgStore::new):
///
/// ```no_run
/// use axum_idempotency::postgres::{BoxFuture, ClientPool, PgStore, PoolError, PooledClient};
///
/// /// A pool of one, for illustration: a real pool hands out many.
/// struct MyPool(std::sync::Arc<tokio::sync::Mutex<Option<tokio_postgres::Client>>>);
///
/// struct MyConnection {
///     client: Option<tokio_postgres::Client>,
///     home: std::sync::Arc<tokio::sync::Mutex<Option<tokio_postgres::Client>>>,
/// }
///
/// impl PooledClient for MyConnection {
///     fn client(&self) -> &tokio_postgres::Client {
///         self.client.as_ref().expect("present until dropped")
///     }
///
///     fn discard(mut self: Box<Self>) {
///         // Never give a connection of unknown state back: drop it, and the server
///         // rolls back whatever it was in.
///         self.client.take();
///     }
/// }
///
/// impl Drop for MyConnection {
///     fn drop(&mut self) {
///         if let (Some(client), Ok(mut home)) = (self.client.take(), self.home.try_lock()) {
///             *home = Some(client);
///         }
///     }
/// }
///
/// impl ClientPool for MyPool {
///     fn get(&self) -> BoxFuture<'_, Result<Box<dyn PooledClient>, PoolError>> {
///         Box::pin(async move {
///             let client = self.0.lock().await.take().ok_or("the connection is in use")?;
///             let home = std::sync::Arc::clone(&self.0);
///             Ok(Box::new(MyConnection { client: Some(client), home }) as Box<dyn PooledClient>)
///         })
///     }
/// }
///
/// # fn f(pool: MyPool) {
/// let layer = axum_idempotency::IdempotencyLayer::new(PgStore::new(pool));
/// # }
/// ```
pub trait ClientPool: Send + Sync + 'static {
    /// Checks a connection out of the pool.
    fn get(&self) -> BoxFuture<'_, Result<Box<dyn PooledClient>, PoolError>>;
}

/// A connection checked out of a [`ClientPool`]; dropping it gives it back.
///
/// The crate gives a connection back only outside a transaction: it rolls back first, and
/// calls [`discard`](Self::discard) when it cannot tell the connection's state.
pub trait PooledClient: Send + Sync + 'static {
    /// The connection.
    fn client(&self) -> &Client;

    /// Prepares `query` once per connection and returns the cached statement after that,
    /// if the pool keeps a statement cache per connection (deadpool does). `None` (the
    /// default) makes the crate send its statements unprepared, each with its parameter
    /// types: the same round trips, planned each time.
    fn prepare_cached<'a>(
        &'a self,
        query: &'a str,
        types: &'a [Type],
    ) -> Option<BoxFuture<'a, Result<Statement, tokio_postgres::Error>>> {
        let _ = (query, types);
        None
    }

    /// The statement a handler's `prepare_cached` prepared for `query` on this connection
    /// before (see [`remember_cached`](Self::remember_cached)), handed over without
    /// sending anything; `None` (the default) when it is not known to be cached. The claim
    /// of a new key rides with the first statement that goes to the server, so a hit here
    /// costs no round trip.
    fn cached_statement(&self, query: &str) -> Option<Statement> {
        let _ = query;
        None
    }

    /// Notes that [`prepare_cached`](Self::prepare_cached) of `query` (no declared types)
    /// succeeded on this connection, for [`cached_statement`](Self::cached_statement).
    /// The default forgets it.
    fn remember_cached(&self, query: &str) {
        let _ = query;
    }

    /// Closes the connection instead of giving it back: its transaction state is unknown
    /// (a ROLLBACK failed or did not answer in time).
    fn discard(self: Box<Self>);
}

#[cfg(feature = "deadpool")]
mod deadpool {
    use super::{BoxFuture, ClientPool, PoolError, PooledClient};
    use crate::postgres::PgStore;
    use crate::store::IntoStore;
    use deadpool_postgres::{Object, Pool};
    use futures_util::FutureExt;
    use tokio_postgres::types::Type;
    use tokio_postgres::{Client, Statement};

    /// The handlers' statements each live deadpool connection has in its statement cache:
    /// deadpool can only be asked by preparing, and a miss would send the prepare ahead of
    /// the claim. A connection is known by its cache's address; the entry holds a `Weak`
    /// of it, so the address is not reused while the entry lives, and entries of closed
    /// connections are dropped as new ones come.
    mod known {
        use std::collections::{HashMap, HashSet};
        use std::sync::{Arc, RwLock, Weak};

        use deadpool_postgres::StatementCache;

        type Known = HashMap<usize, (Weak<StatementCache>, HashSet<String>)>;

        static KNOWN: RwLock<Option<Known>> = RwLock::new(None);

        fn address(cache: &Arc<StatementCache>) -> usize {
            Arc::as_ptr(cache) as usize
        }

        pub(super) fn contains(cache: &Arc<StatementCache>, query: &str) -> bool {
            let known = KNOWN.read().unwrap_or_else(|e| e.into_inner());
            known
                .as_ref()
                .and_then(|known| known.get(&address(cache)))
                .is_some_and(|(_, queries)| queries.contains(query))
        }

        pub(super) fn insert(cache: &Arc<StatementCache>, query: &str) {
            let mut known = KNOWN.write().unwrap_or_else(|e| e.into_inner());
            let known = known.get_or_insert_with(HashMap::new);
            if let Some((_, queries)) = known.get_mut(&address(cache)) {
                queries.insert(query.to_owned());
                return;
            }
            known.retain(|_, (cache, _)| cache.strong_count() > 0);
            let queries = HashSet::from([query.to_owned()]);
            known.insert(address(cache), (Arc::downgrade(cache), queries));
        }
    }

    #[cfg_attr(docsrs, doc(cfg(feature = "deadpool")))]
    impl IntoStore for Pool {
        type Store = PgStore;

        fn into_store(self) -> PgStore {
            PgStore::new(self)
        }
    }

    #[cfg_attr(docsrs, doc(cfg(feature = "deadpool")))]
    impl ClientPool for Pool {
        fn get(&self) -> BoxFuture<'_, Result<Box<dyn PooledClient>, PoolError>> {
            Box::pin(async move {
                let object = Pool::get(self).await?;
                Ok(Box::new(object) as Box<dyn PooledClient>)
            })
        }
    }

    #[cfg_attr(docsrs, doc(cfg(feature = "deadpool")))]
    impl PooledClient for Object {
        fn client(&self) -> &Client {
            self
        }

        fn prepare_cached<'a>(
            &'a self,
            query: &'a str,
            types: &'a [Type],
        ) -> Option<BoxFuture<'a, Result<Statement, tokio_postgres::Error>>> {
            Some(Box::pin(self.prepare_typed_cached(query, types)))
        }

        fn cached_statement(&self, query: &str) -> Option<Statement> {
            if !known::contains(&self.statement_cache, query) {
                return None;
            }
            // In deadpool's cache (unless the application cleared it): a hit is ready at
            // its first poll and sends nothing.
            self.prepare_typed_cached(query, &[]).now_or_never()?.ok()
        }

        fn remember_cached(&self, query: &str) {
            known::insert(&self.statement_cache, query);
        }

        fn discard(self: Box<Self>) {
            drop(Object::take(*self));
        }
    }
}

/// bb8 over any manager of tokio-postgres connections (`bb8_postgres` is the usual one).
#[cfg(feature = "bb8")]
mod bb8 {
    use super::{BoxFuture, ClientPool, PoolError, PooledClient};
    use crate::postgres::PgStore;
    use crate::store::IntoStore;
    use ::bb8::{ManageConnection, Pool, PooledConnection};
    use tokio_postgres::Client;

    #[cfg_attr(docsrs, doc(cfg(feature = "bb8")))]
    impl<M> IntoStore for Pool<M>
    where
        M: ManageConnection<Connection = Client>,
        M::Error: std::error::Error + Send + Sync + 'static,
    {
        type Store = PgStore;

        fn into_store(self) -> PgStore {
            PgStore::new(self)
        }
    }

    #[cfg_attr(docsrs, doc(cfg(feature = "bb8")))]
    impl<M> ClientPool for Pool<M>
    where
        M: ManageConnection<Connection = Client>,
        M::Error: std::error::Error + Send + Sync + 'static,
    {
        fn get(&self) -> BoxFuture<'_, Result<Box<dyn PooledClient>, PoolError>> {
            Box::pin(async move {
                let conn = self.get_owned().await?;
                Ok(Box::new(conn) as Box<dyn PooledClient>)
            })
        }
    }

    #[cfg_attr(docsrs, doc(cfg(feature = "bb8")))]
    impl<M> PooledClient for PooledConnection<'static, M>
    where
        M: ManageConnection<Connection = Client>,
    {
        fn client(&self) -> &Client {
            self
        }

        /// bb8 cannot close a connection it handed out, and takes back whatever it is
        /// given unless the connection has closed. So the connection is held until a
        /// ROLLBACK has answered — or the connection closed, which bb8 then drops — and
        /// only then given back: never inside a transaction, at the price of a pool slot
        /// for as long as the server takes to answer.
        fn discard(self: Box<Self>) {
            let Ok(runtime) = tokio::runtime::Handle::try_current() else {
                // No runtime drives the connection any more: it is closed.
                return;
            };
            runtime.spawn(async move {
                if let Err(error) = self.batch_execute("ROLLBACK").await {
                    tracing::debug!(%error, "ROLLBACK of a connection of unknown state failed");
                }
                drop(self);
            });
        }
    }
}
