//! The sqlx driver (feature `sqlx`, sqlx 0.9): [`SqlxStore`] over an `sqlx::PgPool`, and
//! [`IdempotentTx`], the extractor whose handle derefs to the shared transaction's
//! `PgConnection`, so handlers keep writing `sqlx::query(..).execute(&mut *tx)`.
//!
//! ```no_run
//! use axum::{Json, Router, http::StatusCode, routing::post};
//! use axum_idempotency::IdempotencyLayer;
//! use axum_idempotency::sqlx::IdempotentTx;
//!
//! async fn create_order(mut tx: IdempotentTx) -> Result<(StatusCode, Json<i64>), StatusCode> {
//!     let id: i64 = sqlx::query_scalar("INSERT INTO orders (amount) VALUES ($1) RETURNING id")
//!         .bind(299_i64)
//!         .fetch_one(&mut *tx)
//!         .await
//!         .map_err(|_| StatusCode::INTERNAL_SERVER_ERROR)?;
//!     Ok((StatusCode::CREATED, Json(id)))
//! }
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let pool = sqlx::PgPool::connect("postgres://postgres@127.0.0.1:5432/postgres").await?;
//! axum_idempotency::migrate(&pool).await?;
//! let app: Router = Router::new()
//!     .route("/orders", post(create_order))
//!     .layer(IdempotencyLayer::new(pool));
//! # Ok(()) }
//! ```
//!
//! sqlx cannot pipeline, so each step costs a round trip per statement: the claim is the
//! record's lookup outside any transaction (all a replay needs), then, on the same
//! connection, `BEGIN` and the claim function: three round trips before the handler's
//! first statement, where tokio-postgres spends one. The completion is the record's
//! insert, then `COMMIT`. The semantics are the same: the claim
//! takes the key's lock before it reads the record, `COMMIT` carries the record, and a
//! connection goes back to the pool only after its transaction ended — an
//! `sqlx::Transaction` that is dropped unfinished rolls back before its connection is
//! reused. Statements are prepared and cached per connection by sqlx itself; with
//! `prepared_statements(false)` they are sent unprepared (`persistent(false)`).
//!
//! Unlike the tokio-postgres handle, which refuses `COMMIT`, `ROLLBACK` and `BEGIN`, this
//! one cannot see the SQL a handler sends through `&mut *tx`: do not end the transaction
//! yourself (nested `sqlx::Connection::begin` savepoints are fine).

mod conn;
mod inbox;
mod link;
mod listen;
mod maintenance;
mod migrate;
mod outbox;
mod store;

/// The sqlx (PostgreSQL) driver's hold on the shared transaction: what
/// [`IdempotentTx`] keeps, exclusively, for as long as it lives (it derefs to the
/// transaction's `PgConnection`).
pub type SqlxTx = crate::store::sqlx_tx::SqlxTx<conn::SqlxConn>;

/// The `sqlx` this driver is built with: the `PgPool` given to `IdempotencyLayer::new`
/// must come from this version.
pub use ::sqlx;

/// The [`IdempotentTx`](crate::IdempotentTx) extractor on sqlx: it derefs to the shared
/// transaction's `PgConnection`, so `&mut *tx` is an executor.
pub type IdempotentTx = crate::store::IdempotentTx<SqlxStore>;

use ::sqlx::PgPool;

use crate::store::IntoStore;

/// The sqlx [`Store`](crate::Store): an `sqlx::PgPool`, the crate's prepared-statement
/// setting and its bound on a silent link. Cloning it is a reference-count bump.
///
/// `IdempotencyLayer::new(pool)` makes one with the defaults; build it yourself to change
/// the link timeout:
///
/// ```no_run
/// use std::time::Duration;
/// use axum_idempotency::IdempotencyLayer;
/// use axum_idempotency::sqlx::SqlxStore;
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let pool = sqlx::postgres::PgPoolOptions::new()
///     .acquire_timeout(Duration::from_secs(4))
///     .connect("postgres://postgres@127.0.0.1:5432/postgres")
///     .await?;
/// let layer = IdempotencyLayer::new(SqlxStore::new(pool).link_timeout(Duration::from_secs(2)));
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct SqlxStore {
    pool: PgPool,
    persistent: bool,
    link: std::sync::Arc<link::Link>,
}

impl SqlxStore {
    /// A store over `pool`, with a link timeout of 4 s.
    pub fn new(pool: PgPool) -> Self {
        Self {
            pool,
            persistent: true,
            link: std::sync::Arc::new(link::Link::new(link::DEFAULT_LINK_TIMEOUT)),
        }
    }

    /// How long the layer waits on the database before it answers 503 `store_unavailable`
    /// (default 4 s). sqlx sets no TCP keepalive or user timeout, so a link that went
    /// silent (packets dropped, nothing sent back) would hold a statement for minutes;
    /// instead:
    ///
    /// - each checkout and each of the crate's statements (the lookup, the claim, the
    ///   record insert, `COMMIT`, `ROLLBACK`, the lease upserts) fails after `timeout`
    ///   (a lock wait after `timeout` plus the wait);
    /// - while a handler runs inside its transaction, the link is checked every
    ///   `timeout / 2` with a fresh connection (one check at a time, shared by every
    ///   request); when the server cannot be reached within `timeout / 2`, the handler is
    ///   abandoned and answered 503 — a handler that runs long on a healthy link is left
    ///   alone;
    /// - a connection whose statement timed out, or that was left inside a transaction,
    ///   is closed, never handed out again, and the pool opens a fresh one.
    ///
    /// Give the pool an `acquire_timeout` of the same order, so starting the service
    /// against a wrong address fails as fast.
    pub fn link_timeout(mut self, timeout: std::time::Duration) -> Self {
        self.link = std::sync::Arc::new(link::Link::new(
            timeout.max(std::time::Duration::from_millis(10)),
        ));
        self
    }
}

impl crate::store::sealed::Sealed for SqlxStore {}

/// Enqueues an outbox message through any sqlx executor — `&mut *tx` of a plain
/// `sqlx::Transaction` of yours, so it commits or rolls back with it (inside an idempotent
/// handler, use [`IdempotentTx::enqueue`] instead). Run [`migrate`](crate::migrate) first.
///
/// ```no_run
/// use axum_idempotency::outbox::OutboxMessage;
///
/// # async fn run(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
/// let mut tx = pool.begin().await?;
/// sqlx::query("UPDATE orders SET status = 'PAID' WHERE order_no = $1")
///     .bind("ORD-7")
///     .execute(&mut *tx)
///     .await?;
/// axum_idempotency::sqlx::enqueue(
///     &mut *tx,
///     &OutboxMessage::new("payment-succeeded", r#"{"order_no":"ORD-7"}"#).id("ORD-7-paid"),
/// )
/// .await?;
/// tx.commit().await?; // the UPDATE and the message, together
/// # Ok(()) }
/// ```
pub async fn enqueue<'c, E>(
    executor: E,
    message: &crate::engine::outbox::OutboxMessage,
) -> Result<crate::engine::outbox::Enqueued, crate::engine::error::Error>
where
    E: ::sqlx::Executor<'c, Database = ::sqlx::Postgres>,
{
    outbox::enqueue(executor, message, true)
        .await
        .map_err(crate::engine::error::Error::of_crate_statement)
}

impl IntoStore for PgPool {
    type Store = SqlxStore;

    fn into_store(self) -> SqlxStore {
        SqlxStore::new(self)
    }
}
