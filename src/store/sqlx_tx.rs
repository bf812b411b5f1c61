//! What the three sqlx drivers (PostgreSQL, MySQL/MariaDB, SQLite) share, written once:
//! [`SqlxTx`], the handle on the shared transaction over the driver's connection slot;
//! [`bound`], a statement of the query seam with its parameters bound, each dialect saying
//! how it binds record ids and durations ([`Dialect`]); and `impl_sqlx_queries!`, the
//! query seam on a sqlx store.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio::sync::OwnedRwLockWriteGuard;

use ::sqlx::database::HasStatementCache;
use ::sqlx::query::Query;
use ::sqlx::{ColumnIndex, Database, Decode, Encode, Executor, IntoArguments, Row, Type};

use crate::engine::key::RecordId;
use crate::engine::shared_tx::{HandleToken, SharedTx};
use crate::store::migrations::Migration;
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

    /// Runs one of the crate's statements on the transaction's connection, bounded and
    /// cleaned up after as the driver does; by default, as it is.
    fn run_statement<T: Send>(
        &mut self,
        work: impl for<'c> FnOnce(&'c mut Self::Connection) -> BoxFuture<'c, Result<T, ::sqlx::Error>>
        + Send,
    ) -> impl Future<Output = Result<T, ::sqlx::Error>> + Send {
        work(self.connection_mut())
    }
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
pub(crate) trait Dialect: Database + HasStatementCache {
    fn bind_id(query: SqlxQuery<'static, Self>, id: RecordId) -> SqlxQuery<'static, Self>
    where
        Vec<u8>: Encode<'static, Self> + Type<Self>,
    {
        query.bind(id.as_bytes().to_vec())
    }

    fn bind_duration(
        query: SqlxQuery<'static, Self>,
        duration: Duration,
    ) -> SqlxQuery<'static, Self>
    where
        f64: Encode<'static, Self> + Type<Self>,
    {
        query.bind(duration.as_secs_f64())
    }
}

/// PostgreSQL: a record id as a `uuid`.
#[cfg(feature = "sqlx")]
impl Dialect for ::sqlx::Postgres {
    fn bind_id(query: SqlxQuery<'static, Self>, id: RecordId) -> SqlxQuery<'static, Self>
    where
        Vec<u8>: Encode<'static, Self> + Type<Self>,
    {
        query.bind(id)
    }
}

/// MySQL: a duration in whole microseconds, for `INTERVAL ? MICROSECOND`.
#[cfg(feature = "mysql")]
impl Dialect for ::sqlx::MySql {
    fn bind_duration(
        query: SqlxQuery<'static, Self>,
        duration: Duration,
    ) -> SqlxQuery<'static, Self>
    where
        f64: Encode<'static, Self> + Type<Self>,
    {
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

/// A dialect's statements of the migration table.
pub(crate) struct MigrationTable {
    /// Creates the table if it is missing.
    pub(crate) create: &'static str,
    /// The highest version applied (0 for none).
    pub(crate) version: &'static str,
    /// Records an applied version. Version, name.
    pub(crate) record: &'static str,
}

/// Creates the migration table on `conn` and applies the migrations of `all` that its
/// schema lacks, each recorded in the table; the version found, and how many were applied.
/// Unprepared throughout (safe behind a transaction-pooling PgBouncer).
pub(crate) async fn apply_migrations<DB>(
    conn: &mut DB::Connection,
    table: &MigrationTable,
    all: &'static [Migration],
) -> Result<(i32, usize), crate::engine::error::Error>
where
    DB: Database + HasStatementCache,
    DB::Arguments: IntoArguments<DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'r> i32: Encode<'static, DB> + Decode<'r, DB> + Type<DB>,
    &'static str: Encode<'static, DB> + Type<DB>,
    usize: ColumnIndex<DB::Row>,
{
    ::sqlx::raw_sql(table.create).execute(&mut *conn).await?;
    let found = ::sqlx::query::<DB>(table.version).persistent(false);
    let current: i32 = found.fetch_one(&mut *conn).await?.try_get(0)?;
    let mut applied = 0;
    for migration in super::migrations::pending(all, current)? {
        ::sqlx::raw_sql(migration.sql).execute(&mut *conn).await?;
        ::sqlx::query::<DB>(table.record)
            .persistent(false)
            .bind(migration.version)
            .bind(migration.name)
            .execute(&mut *conn)
            .await?;
        applied += 1;
        tracing::info!(
            version = migration.version,
            name = migration.name,
            "applied migration"
        );
    }
    Ok((current, applied))
}

/// Implements the query seam ([`Queries`](crate::store::queries::Queries)) for a sqlx
/// store with inherent `query(sql)` (a query on its pool), `rows(query, map)` and the given
/// `affected` method (the rows a write changed): its statements (a
/// [`Statements`](crate::store::queries::Statements) of [`Text`](crate::store::queries::Text)),
/// each bound by [`bound`]; with `batch_bound`, the sweeper's batches run by its inherent
/// `rows_within` and `affected_within` with that bound.
macro_rules! impl_sqlx_queries {
    (
        $store:ty,
        row: $row:ty,
        statements: [$($statements:tt)*],
        affected: $affected:ident
        $(, batch_bound: $batch_bound:expr)? $(,)?
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

            $(
                async fn batch_rows<T: Send>(
                    &self,
                    statement: &'static $crate::store::queries::Text,
                    params: &[$crate::store::queries::Param<'_>],
                    map: fn(&$row) -> Result<T, ::sqlx::Error>,
                ) -> Result<Vec<T>, $crate::engine::error::Error> {
                    let query = $crate::store::sqlx_tx::bound(statement, params, self.persistent);
                    self.rows_within($batch_bound, query, map).await
                }

                async fn batch_affected(
                    &self,
                    statement: &'static $crate::store::queries::Text,
                    params: &[$crate::store::queries::Param<'_>],
                ) -> Result<u64, $crate::engine::error::Error> {
                    let query = $crate::store::sqlx_tx::bound(statement, params, self.persistent);
                    self.affected_within($batch_bound, query).await
                }
            )?
        }
    };
}
pub(crate) use impl_sqlx_queries;

/// Implements the seam on the transaction's connection
/// ([`TxQueries`](crate::store::queries::TxQueries)) for a sqlx driver's connection slot
/// with its [`SqlxSlot`] and an inherent `commit()`; `rollback_work` is the
/// dialect's rollback to the claim's savepoint.
macro_rules! impl_sqlx_tx_queries {
    ($conn:ty, row: $row:ty, rollback_work: $rollback_work:expr $(,)?) => {
        impl $crate::store::queries::TxQueries for $conn {
            type Statement = $crate::store::queries::Text;
            type Row = $row;

            async fn tx_rows<T: Send>(
                &mut self,
                statement: &'static $crate::store::queries::Text,
                params: &[$crate::store::queries::Param<'_>],
                map: fn(&$row) -> Result<T, ::sqlx::Error>,
            ) -> Result<Vec<T>, $crate::engine::error::Error> {
                let query = $crate::store::sqlx_tx::bound(statement, params, self.persistent());
                let rows = $crate::store::sqlx_tx::SqlxSlot::run_statement(self, |conn| {
                    Box::pin(query.fetch_all(conn))
                })
                .await?;
                Ok(rows.iter().map(map).collect::<Result<_, _>>()?)
            }

            async fn tx_affected(
                &mut self,
                statement: &'static $crate::store::queries::Text,
                params: &[$crate::store::queries::Param<'_>],
            ) -> Result<u64, $crate::engine::error::Error> {
                let query = $crate::store::sqlx_tx::bound(statement, params, self.persistent());
                let done = $crate::store::sqlx_tx::SqlxSlot::run_statement(self, |conn| {
                    Box::pin(query.execute(conn))
                })
                .await?;
                Ok(done.rows_affected())
            }

            async fn tx_rollback_work(&mut self) -> Result<(), $crate::engine::error::Error> {
                use ::sqlx::Executor as _;
                $crate::store::sqlx_tx::SqlxSlot::run_statement(self, |conn| {
                    Box::pin(conn.execute($rollback_work))
                })
                .await?;
                Ok(())
            }

            async fn tx_commit(&mut self) -> Result<(), $crate::engine::error::Error> {
                Ok(self.commit().await?)
            }
        }
    };
}
pub(crate) use impl_sqlx_tx_queries;
