//! The orders service's statements on MySQL/MariaDB (no `RETURNING`, no sequences: MySQL 8
//! has neither).

use axum_idempotency::Error;
use axum_idempotency::mysql::{IdempotentTx, MySqlStore};
use sqlx::MySqlPool;

use super::{Order, OrdersDb};

impl OrdersDb for MySqlStore {
    type Pool = MySqlPool;

    async fn create_schema(pool: &MySqlPool) -> Result<(), Error> {
        axum_idempotency::migrate(pool).await?;
        for ddl in [
            "CREATE TABLE IF NOT EXISTS orders_no_seq (
                 n BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY
             ) ENGINE = InnoDB",
            "CREATE TABLE IF NOT EXISTS orders (
                 order_no   VARCHAR(32) CHARACTER SET ascii COLLATE ascii_bin PRIMARY KEY,
                 user_id    BIGINT      NOT NULL,
                 amount     BIGINT      NOT NULL,
                 created_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
                 status     VARCHAR(16) NOT NULL DEFAULT 'NEW'
             ) ENGINE = InnoDB",
        ] {
            sqlx::query(ddl).execute(pool).await?;
        }
        Ok(())
    }

    async fn insert_order(
        tx: &mut IdempotentTx,
        user_id: i64,
        amount: i64,
    ) -> Result<String, Error> {
        // InnoDB's AUTO_INCREMENT never hands out a number twice (persisted across restarts).
        let n = sqlx::query("INSERT INTO orders_no_seq () VALUES ()")
            .execute(&mut **tx)
            .await?
            .last_insert_id();
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
        let paid =
            sqlx::query("UPDATE orders SET status = 'PAID' WHERE order_no = ? AND status = 'NEW'")
                .bind(order_no)
                .execute(&mut **tx)
                .await?;
        if paid.rows_affected() == 0 {
            return Ok(None);
        }
        Ok(Some(
            sqlx::query_scalar("SELECT user_id FROM orders WHERE order_no = ?")
                .bind(order_no)
                .fetch_one(&mut **tx)
                .await?,
        ))
    }

    async fn order_exists(tx: &mut IdempotentTx, order_no: &str) -> Result<bool, Error> {
        let found: Option<i32> = sqlx::query_scalar("SELECT 1 FROM orders WHERE order_no = ?")
            .bind(order_no)
            .fetch_optional(&mut **tx)
            .await?;
        Ok(found.is_some())
    }

    async fn find_order(pool: &MySqlPool, order_no: &str) -> Result<Option<Order>, Error> {
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
