//! The orders service's statements on SQLite.

use axum_idempotency::Error;
use axum_idempotency::sqlite::{IdempotentTx, SqliteStore};
use sqlx::SqlitePool;

use super::{Order, OrdersDb};

impl OrdersDb for SqliteStore {
    type Pool = SqlitePool;

    async fn create_schema(pool: &SqlitePool) -> Result<(), Error> {
        axum_idempotency::migrate(pool).await?;
        sqlx::raw_sql(
            "CREATE TABLE IF NOT EXISTS orders_no_seq (n INTEGER PRIMARY KEY AUTOINCREMENT);
             CREATE TABLE IF NOT EXISTS orders (
                 order_no   TEXT    PRIMARY KEY,
                 user_id    INTEGER NOT NULL,
                 amount     INTEGER NOT NULL,
                 created_at TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
                 status     TEXT    NOT NULL DEFAULT 'NEW'
             );",
        )
        .execute(pool)
        .await?;
        Ok(())
    }

    async fn insert_order(
        tx: &mut IdempotentTx,
        user_id: i64,
        amount: i64,
    ) -> Result<String, Error> {
        // AUTOINCREMENT never hands out a number again, even after a delete.
        let n: i64 = sqlx::query_scalar("INSERT INTO orders_no_seq DEFAULT VALUES RETURNING n")
            .fetch_one(&mut **tx)
            .await?;
        let order_no = format!("ORD-{n}");
        sqlx::query("INSERT INTO orders (order_no, user_id, amount) VALUES (?, ?, ?)")
            .bind(&order_no)
            .bind(user_id)
            .bind(amount)
            .execute(&mut **tx)
            .await?;
        Ok(order_no)
    }

    async fn mark_paid(tx: &mut IdempotentTx, order_no: &str) -> Result<Option<i64>, Error> {
        Ok(sqlx::query_scalar(
            "UPDATE orders SET status = 'PAID' WHERE order_no = ? AND status = 'NEW' \
             RETURNING user_id",
        )
        .bind(order_no)
        .fetch_optional(&mut **tx)
        .await?)
    }

    async fn order_exists(tx: &mut IdempotentTx, order_no: &str) -> Result<bool, Error> {
        let found: Option<i64> = sqlx::query_scalar("SELECT 1 FROM orders WHERE order_no = ?")
            .bind(order_no)
            .fetch_optional(&mut **tx)
            .await?;
        Ok(found.is_some())
    }

    async fn find_order(pool: &SqlitePool, order_no: &str) -> Result<Option<Order>, Error> {
        let row: Option<(String, i64, i64)> =
            sqlx::query_as("SELECT order_no, user_id, amount FROM orders WHERE order_no = ?")
                .bind(order_no)
                .fetch_optional(pool)
                .await?;
        Ok(row.map(|(order_no, user_id, amount)| Order {
            order_no,
            user_id,
            amount,
        }))
    }
}
