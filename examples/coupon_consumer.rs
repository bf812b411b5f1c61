//! The coupon consumer: "payment succeeded" messages from RabbitMQ grant a coupon,
//! once per message id, however often the broker delivers them.
//!
//! ```text
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres \
//! AMQP_URL=amqp://guest:guest@127.0.0.1:5672/%2f QUEUE=payment-succeeded \
//!     cargo run --example coupon_consumer --features rabbitmq
//! ```
//!
//! Each message is JSON `{"message_id": "...", "user_id": 1001, "coupon_code": "NEW_USER_50"}`
//! (the AMQP `message_id` property, when set, wins over the body's). The crate's
//! [`Consumer`] runs the loop: processed or duplicate → ack; gave up → reject without
//! requeue (dead-letter it with a dead-letter exchange on the queue); failed → nack with
//! requeue, so it is redelivered. `AMQP_URL` may list a cluster's nodes separated by commas;
//! `QUEUE_TYPE=quorum` declares the queue as a quorum queue. Ctrl-C finishes the messages in
//! hand and stops.

use axum_idempotency::Inbox;
use axum_idempotency::inbox::rabbit::Consumer;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use serde::Deserialize;
use tokio_postgres::NoTls;

#[path = "support/amqp.rs"]
mod amqp;

#[derive(Deserialize)]
struct PaymentSucceeded {
    user_id: i64,
    coupon_code: String,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // What the consumer did with each delivery: processed, duplicate, gave up, ...
    tracing_subscriber::fmt()
        .with_env_filter(
            std::env::var("RUST_LOG").unwrap_or_else(|_| "axum_idempotency=info".to_owned()),
        )
        .with_ansi(false)
        .init();
    let database_url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned());
    let queue = std::env::var("QUEUE").unwrap_or_else(|_| "payment-succeeded".to_owned());

    let manager = Manager::from_config(
        database_url.parse()?,
        NoTls,
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

    let urls = amqp::urls();
    amqp::declare(&urls, &queue).await?;
    let consumer = Consumer::new(inbox, urls, &queue)
        .prefetch(8)
        .message_id_field("message_id")
        .start(|tx, message| async move {
            let payment: PaymentSucceeded = message.json()?;
            tx.execute(
                "INSERT INTO coupon_account (user_id, coupon_code, message_id) \
                 VALUES ($1, $2, $3)",
                &[&payment.user_id, &payment.coupon_code, &message.id()],
            )
            .await?;
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
        })
        .await?;
    println!("coupon consumer waiting on queue {queue}");

    tokio::signal::ctrl_c().await?;
    consumer.shutdown().await;
    Ok(())
}
