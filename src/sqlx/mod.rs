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
//! sqlx cannot pipeline, so each step costs a round trip per statement: the claim is
//! `BEGIN`, then the claim function (two round trips where tokio-postgres needs one), the
//! completion the record's insert, then `COMMIT`. The semantics are the same: the claim
//! takes the key's lock before it reads the record, `COMMIT` carries the record, and a
//! connection goes back to the pool only after its transaction ended — an
//! `sqlx::Transaction` that is dropped unfinished rolls back before its connection is
//! reused. Statements are prepared and cached per connection by sqlx itself; with
//! `prepared_statements(false)` they are sent unprepared (`persistent(false)`).
//!
//! Unlike the tokio-postgres handle, which refuses `COMMIT`, `ROLLBACK` and `BEGIN`, this
//! one cannot see the SQL a handler sends through `&mut *tx`: do not end the transaction
//! yourself (nested `sqlx::Connection::begin` savepoints are fine).

mod store;
mod tx;

pub use self::tx::IdempotentTx;

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

impl IntoStore for PgPool {
    type Store = SqlxStore;

    fn into_store(self) -> SqlxStore {
        SqlxStore::new(self)
    }
}
