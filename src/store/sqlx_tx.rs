//! What the three sqlx drivers (PostgreSQL, MySQL/MariaDB, SQLite) share, written once:
//! [`SqlxTx`], the handle on the shared transaction over the driver's connection slot, and
//! [`bind_params`], the query seam's parameters bound to a sqlx query, and
//! `impl_sqlx_queries!`, the query seam on a sqlx store.

use std::fmt;
use std::sync::Arc;

use tokio::sync::OwnedRwLockWriteGuard;

use ::sqlx::query::Query;
use ::sqlx::{Database, Encode, Type};

use crate::engine::key::RecordId;
use crate::engine::shared_tx::{HandleToken, SharedTx};

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

impl<C: SqlxSlot> crate::store::TxHandle for SqlxTx<C> {
    type Conn = C;
    type Target = C::Connection;

    /// The connection is handed out exclusively: `None` while another handle holds it.
    fn on_shared(shared: &Arc<SharedTx<C>>) -> Option<Self> {
        let guard = shared.try_write_owned()?;
        Some(Self::new(guard, shared.count_handle()))
    }

    fn record_id(&self) -> RecordId {
        self.token.id()
    }

    fn target(&self) -> &C::Connection {
        self.connection()
    }

    fn target_mut(&mut self) -> &mut C::Connection {
        self.connection_mut()
    }
}

impl<C> fmt::Debug for SqlxTx<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotentTx")
            .field("record", &self.token.id())
            .finish_non_exhaustive()
    }
}

/// A sqlx query of `DB` with its arguments.
pub(crate) type SqlxQuery<'q, DB> = Query<'q, DB, <DB as Database>::Arguments>;

/// `query` with the query seam's `params` bound in order (texts copied: the query outlives
/// them); `bind_id` binds a record id in the driver's column type.
pub(crate) fn bind_params<'q, DB>(
    mut query: SqlxQuery<'q, DB>,
    params: &[crate::store::queries::Param<'_>],
    bind_id: fn(SqlxQuery<'q, DB>, RecordId) -> SqlxQuery<'q, DB>,
) -> SqlxQuery<'q, DB>
where
    DB: Database,
    String: Encode<'q, DB> + Type<DB>,
    i32: Encode<'q, DB> + Type<DB>,
    i64: Encode<'q, DB> + Type<DB>,
{
    use crate::store::queries::Param;
    for param in params {
        query = match *param {
            Param::Id(id) => bind_id(query, id),
            Param::Text(text) => query.bind(text.to_owned()),
            Param::I32(value) => query.bind(value),
            Param::I64(value) => query.bind(value),
        };
    }
    query
}

/// Implements the query seam ([`Queries`](crate::store::queries::Queries)) for a sqlx
/// store with inherent `query(sql)` (a query on its pool), `rows(query, map)` and the given
/// `affected` method (the rows a write changed): its statements from the dialect's
/// constants at `statements`, a record id bound by `bind_id`.
macro_rules! impl_sqlx_queries {
    (
        $store:ty,
        row: $row:ty,
        statements: [$($statements:tt)*],
        affected: $affected:ident,
        bind_id: |$query:ident, $id:ident| $bind_id:expr $(,)?
    ) => {
        /// The seam's statements in this dialect, run on the pool.
        impl $crate::store::queries::Queries for $store {
            type Statement = str;
            type Row = $row;

            const STATEMENTS: $crate::store::queries::Statements<str> =
                $crate::store::queries::statements!($($statements)*);

            async fn query_rows<T: Send>(
                &self,
                statement: &'static str,
                params: &[$crate::store::queries::Param<'_>],
                map: fn(&$row) -> Result<T, ::sqlx::Error>,
            ) -> Result<Vec<T>, $crate::engine::error::Error> {
                let query = $crate::store::sqlx_tx::bind_params(
                    self.query(statement),
                    params,
                    |$query, $id| $bind_id,
                );
                self.rows(query, map).await
            }

            async fn query_affected(
                &self,
                statement: &'static str,
                params: &[$crate::store::queries::Param<'_>],
            ) -> Result<u64, $crate::engine::error::Error> {
                let query = $crate::store::sqlx_tx::bind_params(
                    self.query(statement),
                    params,
                    |$query, $id| $bind_id,
                );
                self.$affected(query).await
            }
        }
    };
}
pub(crate) use impl_sqlx_queries;
