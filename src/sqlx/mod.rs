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
mod lease;
mod listen;
mod maintenance;
mod migrate;
mod outbox;
mod store;
mod tx;

pub use self::tx::SqlxTx;

/// The `sqlx` this driver is built with: the `PgPool` given to `IdempotencyLayer::new`
/// must come from this version.
pub use ::sqlx;

/// The [`IdempotentTx`](crate::IdempotentTx) extractor on sqlx: it derefs to the shared
/// transaction's `PgConnection`, so `&mut *tx` is an executor.
pub type IdempotentTx = crate::store::IdempotentTx<SqlxStore>;

use ::sqlx::PgPool;

use crate::store::IntoStore;

/// The sqlx [`Store`](crate::Store): an `sqlx::PgPool` and the crate's prepared-statement
/// setting. Cloning it is a reference-count bump.
#[derive(Clone, Debug)]
pub struct SqlxStore {
    pool: PgPool,
    persistent: bool,
}

impl SqlxStore {
    /// A store over `pool`.
    pub fn new(pool: PgPool) -> Self {
        Self {
            pool,
            persistent: true,
        }
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
