//! The orders service's statements on PostgreSQL, through tokio-postgres over deadpool.
//!
//! Behind PgBouncer in transaction pooling mode without prepared-statement support (before
//! 1.21, or `max_prepared_statements` unset), `PREPARED_STATEMENTS=false` makes these send
//! no named prepared statement, like the layer.

use std::sync::OnceLock;

use axum_idempotency::Error;
use axum_idempotency::postgres::{IdempotentTx, PgStore};
use deadpool_postgres::Pool;
use tokio_postgres::types::{ToSql, Type};

use super::{Order, OrdersDb};

/// `PREPARED_STATEMENTS`: `false` for a PgBouncer without prepared-statement support.
static PREPARED_STATEMENTS: OnceLock<bool> = OnceLock::new();

/// Sets what [`OrdersDb`]'s statements do about prepared statements (once, at start-up).
pub(crate) fn use_prepared_statements(enabled: bool) {
    PREPARED_STATEMENTS.get_or_init(|| enabled);
}

fn prepared_statements() -> bool {
    *PREPARED_STATEMENTS.get().unwrap_or(&true)
}

const INSERT_ORDER: &str = "INSERT INTO orders (order_no, user_id, amount) \
                            VALUES ('ORD-' || nextval('orders_no_seq'), $1, $2) \
                            RETURNING order_no";

const PAY_ORDER: &str = "UPDATE orders SET status = 'PAID' \
                         WHERE order_no = $1 AND status = 'NEW' RETURNING user_id";

impl OrdersDb for PgStore {
    type Pool = Pool;

    async fn create_schema(pool: &Pool) -> Result<(), Error> {
        axum_idempotency::migrate(pool).await?;
        let client = pool.get().await?;
        client
            .batch_execute(
                "CREATE SEQUENCE IF NOT EXISTS orders_no_seq;
                 CREATE TABLE IF NOT EXISTS orders (
                     order_no   text        PRIMARY KEY,
                     user_id    bigint      NOT NULL,
                     amount     bigint      NOT NULL,
                     created_at timestamptz NOT NULL DEFAULT now()
                 );
                 ALTER TABLE orders ADD COLUMN IF NOT EXISTS status text NOT NULL DEFAULT 'NEW';",
            )
            .await?;
        Ok(())
    }

    async fn insert_order(
        tx: &mut IdempotentTx,
        user_id: i64,
        amount: i64,
    ) -> Result<String, Error> {
        let params: [&(dyn ToSql + Sync); 2] = [&user_id, &amount];
        let row = if prepared_statements() {
            // Prepared once per pooled connection, then reused.
            let insert = tx.prepare_cached(INSERT_ORDER).await?;
            tx.query_one(&insert, &params).await?
        } else {
            // Prepared, run and closed inside the request's transaction, which PgBouncer
            // keeps on one server connection.
            tx.query_one(INSERT_ORDER, &params).await?
        };
        Ok(row.get(0))
    }

    async fn mark_paid(tx: &mut IdempotentTx, order_no: &str) -> Result<Option<i64>, Error> {
        let paid = tx.query_opt(PAY_ORDER, &[&order_no]).await?;
        Ok(paid.map(|row| row.get(0)))
    }

    async fn order_exists(tx: &mut IdempotentTx, order_no: &str) -> Result<bool, Error> {
        let known = tx
            .query_opt("SELECT 1 FROM orders WHERE order_no = $1", &[&order_no])
            .await?;
        Ok(known.is_some())
    }

    async fn find_order(pool: &Pool, order_no: &str) -> Result<Option<Order>, Error> {
        let client = pool.get().await?;
        // One round trip with the parameter type given, no named statement: it works the
        // same with or without PgBouncer.
        let row = client
            .query_typed_opt(
                "SELECT order_no, user_id, amount FROM orders WHERE order_no = $1",
                &[(&order_no, Type::TEXT)],
            )
            .await?;
        Ok(row.map(|row| Order {
            order_no: row.get(0),
            user_id: row.get(1),
            amount: row.get(2),
        }))
    }
}
