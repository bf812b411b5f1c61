//! The coupon consumer: "payment succeeded" messages from RabbitMQ grant a coupon,
//! once per message id, however often the broker delivers them.
//!
//! ```text
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres \
//! AMQP_URL=amqp://guest:guest@127.0.0.1:5672/%2f QUEUE=payment-succeeded \
//!     cargo run --example coupon_consumer --features rabbitmq
//! DATABASE_URL=mysql://root@127.0.0.1:3306/shop \
//!     cargo run --example coupon_consumer --features rabbitmq,mysql
//! ```
//!
//! `DATABASE_URL` names PostgreSQL (`postgres://…`, the default
//! `postgres://postgres@127.0.0.1:5432/postgres`; feature `deadpool`) or MySQL/MariaDB
//! (`mysql://…` or `mariadb://…`; feature `mysql`). The crate's tables and the
//! `coupon_account` table are created on start.
//!
//! Each message is JSON `{"message_id": "...", "user_id": 1001, "coupon_code": "NEW_USER_50"}`
//! (the AMQP `message_id` property, when set, wins over the body's). The crate's
//! [`Consumer`] runs the loop: processed or duplicate → ack; gave up → reject without
//! requeue (dead-letter it with a dead-letter exchange on the queue); failed → nack with
//! requeue, so it is redelivered. `AMQP_URL` may list a cluster's nodes separated by commas;
//! `QUEUE_TYPE=quorum` declares the queue as a quorum queue. Ctrl-C finishes the messages in
//! hand and stops.

use std::future::Future;

use axum_idempotency::inbox::rabbit::{Consumer, Message};
use axum_idempotency::{IdempotentTx, Inbox, InboxStore};
use serde::Deserialize;

#[path = "support/amqp.rs"]
mod amqp;
#[path = "support/log.rs"]
mod log;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Deserialize)]
struct PaymentSucceeded {
    user_id: i64,
    coupon_code: String,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // What the consumer did with each delivery: processed, duplicate, gave up, ...
    log::init(std::io::stdout, false);
    let database_url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned());
    let queue = std::env::var("QUEUE").unwrap_or_else(|_| "payment-succeeded".to_owned());
    match database_url.split_once("://").map(|(scheme, _)| scheme) {
        Some("mysql" | "mariadb") => mysql(&database_url, &queue).await,
        Some("postgres" | "postgresql") => postgres(&database_url, &queue).await,
        _ => Err("DATABASE_URL must be a postgres:// or mysql:// URL".into()),
    }
}

/// Consumes `queue` through `inbox` until Ctrl-C; `work` grants the coupon in the
/// message's transaction.
async fn consume<D, F, Fut>(
    inbox: Inbox<D>,
    queue: &str,
    work: F,
) -> Result<(), Box<dyn std::error::Error>>
where
    D: InboxStore + Send + Sync + 'static,
    F: Fn(IdempotentTx<D>, Message) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), BoxError>> + Send + 'static,
{
    let urls = amqp::urls();
    amqp::declare(&urls, queue).await?;
    let consumer = Consumer::new(inbox, urls, queue)
        .prefetch(8)
        .message_id_field("message_id")
        .start(work)
        .await?;
    println!("coupon consumer waiting on queue {queue}");

    tokio::signal::ctrl_c().await?;
    consumer.shutdown().await;
    Ok(())
}

#[cfg(feature = "deadpool")]
async fn postgres(url: &str, queue: &str) -> Result<(), Box<dyn std::error::Error>> {
    use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};

    // A connection whose peer went silent fails within 4 s: the delivery is not acked and
    // comes back once the database answers again.
    let mut config: tokio_postgres::Config = url.parse()?;
    axum_idempotency::postgres::detect_dead_peers(&mut config, std::time::Duration::from_secs(4));
    let manager = Manager::from_config(
        config,
        tokio_postgres::NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    let pool = Pool::builder(manager).max_size(4).build()?;
    axum_idempotency::migrate(&pool).await?;
    pool.get()
        .await?
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS coupon_account (
                 id          bigserial   PRIMARY KEY,
                 user_id     bigint      NOT NULL,
                 coupon_code text        NOT NULL,
                 message_id  text        NOT NULL,
                 created_at  timestamptz NOT NULL DEFAULT now()
             )",
        )
        .await?;
    let inbox = Inbox::new(pool, "coupon-service");
    consume(inbox, queue, |tx, message| async move {
        let payment: PaymentSucceeded = message.json()?;
        tx.execute(
            "INSERT INTO coupon_account (user_id, coupon_code, message_id) VALUES ($1, $2, $3)",
            &[&payment.user_id, &payment.coupon_code, &message.id()],
        )
        .await?;
        Ok(())
    })
    .await
}

#[cfg(not(feature = "deadpool"))]
async fn postgres(_url: &str, _queue: &str) -> Result<(), Box<dyn std::error::Error>> {
    Err("a postgres:// DATABASE_URL needs feature `deadpool`".into())
}

#[cfg(feature = "mysql")]
async fn mysql(url: &str, queue: &str) -> Result<(), Box<dyn std::error::Error>> {
    let pool = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(std::time::Duration::from_secs(5))
        .connect(url)
        .await?;
    axum_idempotency::migrate(&pool).await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS coupon_account (
             id          BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
             user_id     BIGINT       NOT NULL,
             coupon_code VARCHAR(64)  NOT NULL,
             message_id  VARBINARY(255) NOT NULL,
             created_at  DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
         ) ENGINE = InnoDB",
    )
    .execute(&pool)
    .await?;
    let inbox = Inbox::new(pool, "coupon-service");
    consume(inbox, queue, |mut tx, message| async move {
        let payment: PaymentSucceeded = message.json()?;
        sqlx::query(
            "INSERT INTO coupon_account (user_id, coupon_code, message_id) VALUES (?, ?, ?)",
        )
        .bind(payment.user_id)
        .bind(&payment.coupon_code)
        .bind(message.id())
        .execute(&mut *tx)
        .await?;
        Ok(())
    })
    .await
}

#[cfg(not(feature = "mysql"))]
async fn mysql(_url: &str, _queue: &str) -> Result<(), Box<dyn std::error::Error>> {
    Err("a mysql:// DATABASE_URL needs feature `mysql`".into())
}
