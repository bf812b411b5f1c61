//! What the three sqlx drivers (PostgreSQL, MySQL/MariaDB, SQLite) share, written once:
//! [`SqlxTx`], the handle on the shared transaction over the driver's connection slot;
//! [`bound`], a statement of the query seam with its parameters bound, each dialect saying
//! how it binds record ids and durations ([`Dialect`]); and `impl_sqlx_queries!`, the
//! query seam on a sqlx store.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::OwnedRwLockWriteGuard;

use ::sqlx::query::Query;
use ::sqlx::{Database, Encode, Type};

use crate::engine::key::RecordId;
use crate::engine::shared_tx::{HandleToken, SharedTx};
use crate::store::queries::{Param, Text};

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

/// How a sqlx dialect binds the seam's record ids and durations: by default a record id as
/// its 16 bytes, a duration in seconds.
pub(crate) trait Dialect: Database + ::sqlx::database::HasStatementCache
where
    Vec<u8>: Encode<'static, Self> + Type<Self>,
    f64: Encode<'static, Self> + Type<Self>,
{
    fn bind_id(query: SqlxQuery<'static, Self>, id: RecordId) -> SqlxQuery<'static, Self> {
        query.bind(id.as_bytes().to_vec())
    }

    fn bind_duration(
        query: SqlxQuery<'static, Self>,
        duration: Duration,
    ) -> SqlxQuery<'static, Self> {
        query.bind(duration.as_secs_f64())
    }
}

/// PostgreSQL: a record id as a `uuid`.
#[cfg(feature = "sqlx")]
impl Dialect for ::sqlx::Postgres {
    fn bind_id(query: SqlxQuery<'static, Self>, id: RecordId) -> SqlxQuery<'static, Self> {
        query.bind(id)
    }
}

/// MySQL: a duration in whole microseconds, for `INTERVAL ? MICROSECOND`.
#[cfg(feature = "mysql")]
impl Dialect for ::sqlx::MySql {
    fn bind_duration(
        query: SqlxQuery<'static, Self>,
        duration: Duration,
    ) -> SqlxQuery<'static, Self> {
        query.bind(i64::try_from(duration.as_micros()).unwrap_or(i64::MAX / 2))
    }
}

#[cfg(feature = "sqlite")]
impl Dialect for ::sqlx::Sqlite {}

/// A statement of the query seam with `params` bound in the placeholders' order (texts and
/// bytes copied: the query outlives them), prepared when `persistent`.
pub(crate) fn bound<DB>(
    statement: &'static Text,
    params: &[Param<'_>],
    persistent: bool,
) -> SqlxQuery<'static, DB>
where
    DB: Dialect,
    String: Encode<'static, DB> + Type<DB>,
    Option<String>: Encode<'static, DB> + Type<DB>,
    Vec<u8>: Encode<'static, DB> + Type<DB>,
    Option<Vec<u8>>: Encode<'static, DB> + Type<DB>,
    bool: Encode<'static, DB> + Type<DB>,
    i16: Encode<'static, DB> + Type<DB>,
    Option<i16>: Encode<'static, DB> + Type<DB>,
    i32: Encode<'static, DB> + Type<DB>,
    i64: Encode<'static, DB> + Type<DB>,
    f64: Encode<'static, DB> + Type<DB>,
{
    let mut query = ::sqlx::query::<DB>(statement.sql).persistent(persistent);
    for param in statement.params(params) {
        query = match *param {
            Param::Id(id) => DB::bind_id(query, id),
            Param::Text(text) => query.bind(text.to_owned()),
            Param::OptText(text) => query.bind(text.map(str::to_owned)),
            Param::Bool(value) => query.bind(value),
            Param::I16(value) => query.bind(value),
            Param::OptI16(value) => query.bind(value),
            Param::I32(value) => query.bind(value),
            Param::I64(value) => query.bind(value),
            Param::Bytes(bytes) => query.bind(bytes.to_vec()),
            Param::OptBytes(bytes) => query.bind(bytes.map(<[u8]>::to_vec)),
            Param::Duration(duration) => DB::bind_duration(query, duration),
        };
    }
    query
}

/// Implements the query seam ([`Queries`](crate::store::queries::Queries)) for a sqlx
/// store with inherent `query(sql)` (a query on its pool), `rows(query, map)` and the given
/// `affected` method (the rows a write changed): its statements (a
/// [`Statements`](crate::store::queries::Statements) of [`Text`](crate::store::queries::Text)),
/// each bound by [`bound`].
macro_rules! impl_sqlx_queries {
    (
        $store:ty,
        row: $row:ty,
        statements: [$($statements:tt)*],
        affected: $affected:ident $(,)?
    ) => {
        /// The seam's statements in this dialect, run on the pool.
        impl $crate::store::queries::Queries for $store {
            type Statement = $crate::store::queries::Text;
            type Row = $row;

            const STATEMENTS: $crate::store::queries::Statements<$crate::store::queries::Text> =
                $($statements)*;

            async fn query_rows<T: Send>(
                &self,
                statement: &'static $crate::store::queries::Text,
                params: &[$crate::store::queries::Param<'_>],
                map: fn(&$row) -> Result<T, ::sqlx::Error>,
            ) -> Result<Vec<T>, $crate::engine::error::Error> {
                let query = $crate::store::sqlx_tx::bound(statement, params, self.persistent);
                self.rows(query, map).await
            }

            async fn query_affected(
                &self,
                statement: &'static $crate::store::queries::Text,
                params: &[$crate::store::queries::Param<'_>],
            ) -> Result<u64, $crate::engine::error::Error> {
                let query = $crate::store::sqlx_tx::bound(statement, params, self.persistent);
                self.$affected(query).await
            }
        }
    };
}
pub(crate) use impl_sqlx_queries;
