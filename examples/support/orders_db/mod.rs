//! The orders example's own statements, once per database: the service in
//! `examples/orders.rs` is written once against [`OrdersDb`], and each database's module
//! supplies its tables and its SQL (PostgreSQL through tokio-postgres, MySQL/MariaDB and
//! SQLite through sqlx). The `orders` table has the same columns on each: `order_no`
//! (`ORD-` and a number that never repeats), `user_id`, `amount`, `created_at`, `status`
//! (`NEW`, then `PAID`).

use std::future::Future;

use axum_idempotency::{
    Error, IdempotentTx, InboxStore, LeaseStore, MaintenanceStore, OutboxStore,
};
use serde::Serialize;

#[cfg(feature = "mysql")]
#[path = "mysql.rs"]
pub(crate) mod mysql;
#[cfg(feature = "deadpool")]
#[path = "postgres.rs"]
pub(crate) mod postgres;
#[cfg(feature = "sqlite")]
#[path = "sqlite.rs"]
pub(crate) mod sqlite;

/// An order as the API shows it.
#[derive(Serialize)]
pub(crate) struct Order {
    pub(crate) order_no: String,
    pub(crate) user_id: i64,
    pub(crate) amount: i64,
}

/// What the orders service needs of its database, beside what the crate's store does.
pub(crate) trait OrdersDb:
    LeaseStore + InboxStore + OutboxStore + MaintenanceStore + Clone + Send + Sync + 'static
{
    /// What the service's own reads run on (the pool the layer was given).
    type Pool: Clone + Send + Sync + 'static;

    /// The crate's tables (`migrate`) and the service's own, if missing.
    fn create_schema(pool: &Self::Pool) -> impl Future<Output = Result<(), Error>> + Send;

    /// Inserts a `NEW` order in the request's transaction; its number.
    fn insert_order(
        tx: &mut IdempotentTx<Self>,
        user_id: i64,
        amount: i64,
    ) -> impl Future<Output = Result<String, Error>> + Send;

    /// Moves the order from `NEW` to `PAID`; its user when this call changed it.
    fn mark_paid(
        tx: &mut IdempotentTx<Self>,
        order_no: &str,
    ) -> impl Future<Output = Result<Option<i64>, Error>> + Send;

    /// Whether the order exists.
    fn order_exists(
        tx: &mut IdempotentTx<Self>,
        order_no: &str,
    ) -> impl Future<Output = Result<bool, Error>> + Send;

    /// The order, outside any idempotent request.
    fn find_order(
        pool: &Self::Pool,
        order_no: &str,
    ) -> impl Future<Output = Result<Option<Order>, Error>> + Send;
}
