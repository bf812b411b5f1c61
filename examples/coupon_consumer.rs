//! The coupon consumer: "payment succeeded" messages from RabbitMQ grant a coupon,
//! once per message id, however often the broker delivers them.
//!
//! ```text
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres \
//! AMQP_URL=amqp://guest:guest@127.0.0.1:5672/%2f QUEUE=payment-succeeded \
//!     cargo run --example coupon_consumer
//! ```
//!
//! Each message is JSON `{"message_id": "...", "user_id": 1001, "coupon_code": "NEW_USER_50"}`
//! (the AMQP `message_id` property, when set, wins over the body's). Outcomes:
//! processed or duplicate → ack; gave up → reject without requeue (dead-letter it with a
//! dead-letter exchange on the queue); failed → nack with requeue, so it is redelivered.

use axum_idempotency::inbox::Outcome;
use axum_idempotency::{Inbox, InboxError};
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions, BasicRejectOptions,
    QueueDeclareOptions,
};
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties};
use serde::Deserialize;
use tokio_postgres::NoTls;

#[derive(Deserialize)]
struct PaymentSucceeded {
    message_id: Option<String>,
    user_id: i64,
    coupon_code: String,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let database_url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned());
    let amqp_url = std::env::var("AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned());
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

    let connection = Connection::connect(&amqp_url, ConnectionProperties::default()).await?;
    let channel = connection.create_channel().await?;
    channel
        .queue_declare(
            queue.as_str().into(),
            QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await?;
    channel.basic_qos(8, BasicQosOptions::default()).await?;
    let mut deliveries = channel
        .basic_consume(
            queue.as_str().into(),
            "coupon-consumer".into(),
            BasicConsumeOptions::default(), // manual acknowledgements
            FieldTable::default(),
        )
        .await?;
    println!("coupon consumer waiting on queue {queue}");

    loop {
        let delivery = tokio::select! {
            delivery = deliveries.next() => delivery,
            _ = tokio::signal::ctrl_c() => break,
        };
        let Some(delivery) = delivery else { break };
        let delivery = delivery?;
        let message: PaymentSucceeded = match serde_json::from_slice(&delivery.data) {
            Ok(message) => message,
            Err(e) => {
                println!("malformed message ({e}); rejected");
                delivery
                    .reject(BasicRejectOptions { requeue: false })
                    .await?;
                continue;
            }
        };
        let message_id = delivery
            .properties
            .message_id()
            .as_ref()
            .map(|id| id.to_string())
            .or(message.message_id.clone())
            .unwrap_or_default();
        let row_message_id = message_id.clone();
        let outcome = inbox
            .process_payload(&message_id, &delivery.data, |tx| async move {
                tx.execute(
                    "INSERT INTO coupon_account (user_id, coupon_code, message_id) \
                     VALUES ($1, $2, $3)",
                    &[&message.user_id, &message.coupon_code, &row_message_id],
                )
                .await
            })
            .await;
        match outcome {
            Ok(Outcome::Processed(_)) => {
                println!("processed {message_id}: coupon granted");
                delivery.ack(BasicAckOptions::default()).await?;
            }
            Ok(Outcome::Duplicate { .. }) => {
                println!("duplicate {message_id}: skipped");
                delivery.ack(BasicAckOptions::default()).await?;
            }
            Ok(Outcome::GaveUp {
                attempts,
                last_error,
            }) => {
                println!("gave up {message_id} after {attempts} attempts: {last_error:?}");
                delivery
                    .reject(BasicRejectOptions { requeue: false })
                    .await?;
            }
            Err(InboxError::InvalidMessageId(e)) => {
                println!("rejected a message with an invalid id: {e}");
                delivery
                    .reject(BasicRejectOptions { requeue: false })
                    .await?;
            }
            Err(e) => {
                println!("failed {message_id}: {e}; requeued");
                delivery
                    .nack(BasicNackOptions {
                        requeue: true,
                        ..BasicNackOptions::default()
                    })
                    .await?;
            }
        }
    }
    connection.close(200, "bye".into()).await?;
    Ok(())
}
