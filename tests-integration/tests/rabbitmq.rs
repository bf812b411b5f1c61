//! The article's failure on a real broker: a consumer does its work, the ACK is lost, and
//! RabbitMQ redelivers. With the Inbox the coupon is granted exactly once.
//!
//! Needs RabbitMQ at `AMQP_URL` (default `amqp://guest:guest@127.0.0.1:5672/%2f`). Without
//! a reachable broker these tests say so and pass, except under CI (`CI` set), where
//! they fail.

mod common;

use std::sync::Arc;
use std::time::Duration;

use axum_idempotency::inbox::Outcome;
use axum_idempotency::postgres::PgStore;
use axum_idempotency::{Error, Inbox, InboxError};
use common::*;
use futures_util::StreamExt;
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Connection, Consumer};
use serde_json::json;
use tokio::sync::Semaphore;

/// A durable queue of its own for one test, deleted at the end.
struct Broker {
    connection: Connection,
    queue: String,
}

impl Broker {
    async fn new() -> Option<Self> {
        let connection = common::rabbit::connect().await?;
        let queue = unique_name("coupons");
        common::rabbit::declare_durable(&connection, &queue).await;
        Some(Self { connection, queue })
    }

    async fn publish(&self, message_id: &str, user_id: i64) {
        let channel = self.connection.create_channel().await.unwrap();
        let body =
            json!({"message_id": message_id, "user_id": user_id, "coupon_code": "NEW_USER_50"});
        channel
            .basic_publish(
                "".into(),
                self.queue.as_str().into(),
                BasicPublishOptions::default(),
                body.to_string().as_bytes(),
                BasicProperties::default()
                    .with_message_id(message_id.into())
                    .with_delivery_mode(2),
            )
            .await
            .unwrap()
            .await
            .unwrap();
        channel.close(200, "published".into()).await.unwrap();
    }

    /// A consumer with manual acknowledgements on a channel of its own.
    async fn consumer(&self) -> (Channel, Consumer) {
        let channel = self.connection.create_channel().await.unwrap();
        let consumer = channel
            .basic_consume(
                self.queue.as_str().into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        (channel, consumer)
    }

    async fn cleanup(self) {
        let channel = self.connection.create_channel().await.unwrap();
        let _ = channel
            .queue_delete(self.queue.as_str().into(), QueueDeleteOptions::default())
            .await;
        let _ = self.connection.close(200, "done".into()).await;
    }
}

async fn next(consumer: &mut Consumer) -> Delivery {
    tokio::time::timeout(Duration::from_secs(10), consumer.next())
        .await
        .expect("no delivery within 10 s")
        .expect("consumer closed")
        .expect("delivery error")
}

fn message_id(delivery: &Delivery) -> String {
    delivery
        .properties
        .message_id()
        .as_ref()
        .map(|id| id.to_string())
        .unwrap()
}

async fn coupon_db() -> TestDb {
    let db = TestDb::new(4).await;
    db.pool
        .get()
        .await
        .unwrap()
        .batch_execute(
            "CREATE TABLE coupon_account (
                 user_id     bigint NOT NULL,
                 coupon_code text   NOT NULL,
                 message_id  text   NOT NULL
             )",
        )
        .await
        .unwrap();
    db
}

/// Grants the coupon of one delivery through the inbox, as `examples/coupon_consumer.rs`.
async fn grant(
    inbox: &Inbox<PgStore>,
    delivery: &Delivery,
) -> Result<Outcome<()>, InboxError<Error>> {
    let id = message_id(delivery);
    let body: serde_json::Value = serde_json::from_slice(&delivery.data).unwrap();
    let user_id = body["user_id"].as_i64().unwrap();
    let row_id = id.clone();
    inbox
        .process_payload(&id, &delivery.data, |tx| async move {
            tx.execute(
                "INSERT INTO coupon_account (user_id, coupon_code, message_id) \
                 VALUES ($1, 'NEW_USER_50', $2)",
                &[&user_id, &row_id],
            )
            .await
            .map(drop)
        })
        .await
}

async fn coupons(db: &TestDb, message_id: &str) -> i64 {
    db.admin
        .query_one(
            &format!(
                "SELECT count(*) FROM {}.coupon_account WHERE message_id = $1",
                db.schema
            ),
            &[&message_id],
        )
        .await
        .unwrap()
        .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_ack_redelivery_and_republished_duplicates_grant_one_coupon() {
    if !common::Database::Postgres.configured() {
        return;
    }
    let db = coupon_db().await;
    let inbox = Inbox::new(db.pool.clone(), "coupon-service");
    let Some(broker) = Broker::new().await else {
        return;
    };

    // Processed, but the channel closes before the ACK reaches the broker.
    broker.publish("pay-1", 1001).await;
    let (channel, mut consumer) = broker.consumer().await;
    let delivery = next(&mut consumer).await;
    assert!(!delivery.redelivered);
    assert_eq!(
        grant(&inbox, &delivery).await.unwrap(),
        Outcome::Processed(())
    );
    channel.close(200, "ack lost".into()).await.unwrap();

    // RabbitMQ redelivers; the inbox reports a duplicate and the consumer acks it.
    let (_channel, mut consumer) = broker.consumer().await;
    let redelivery = next(&mut consumer).await;
    assert!(redelivery.redelivered, "the broker marks the redelivery");
    assert_eq!(message_id(&redelivery), "pay-1");
    assert!(matches!(
        grant(&inbox, &redelivery).await.unwrap(),
        Outcome::Duplicate { .. }
    ));
    redelivery.ack(BasicAckOptions::default()).await.unwrap();

    // The producer publishes the same message id twice.
    broker.publish("pay-2", 1002).await;
    broker.publish("pay-2", 1002).await;
    let first = next(&mut consumer).await;
    assert_eq!(grant(&inbox, &first).await.unwrap(), Outcome::Processed(()));
    first.ack(BasicAckOptions::default()).await.unwrap();
    let second = next(&mut consumer).await;
    assert!(matches!(
        grant(&inbox, &second).await.unwrap(),
        Outcome::Duplicate { .. }
    ));
    second.ack(BasicAckOptions::default()).await.unwrap();

    assert_eq!(coupons(&db, "pay-1").await, 1);
    assert_eq!(coupons(&db, "pay-2").await, 1);
    db.assert_settles().await;
    broker.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_killed_mid_work_is_redelivered_and_processed_once() {
    if !common::Database::Postgres.configured() {
        return;
    }
    let db = coupon_db().await;
    let inbox = Inbox::new(db.pool.clone(), "coupon-service");
    let Some(broker) = Broker::new().await else {
        return;
    };
    broker.publish("pay-3", 1003).await;

    let (channel, mut consumer) = broker.consumer().await;
    let delivery = next(&mut consumer).await;
    let inserted = Arc::new(Semaphore::new(0));
    let worker = tokio::spawn({
        let (inbox, inserted) = (inbox.clone(), Arc::clone(&inserted));
        let payload = delivery.data.clone();
        async move {
            inbox
                .process_payload("pay-3", &payload, |tx| async move {
                    tx.execute(
                        "INSERT INTO coupon_account (user_id, coupon_code, message_id) \
                         VALUES (1003, 'NEW_USER_50', 'pay-3')",
                        &[],
                    )
                    .await?;
                    inserted.add_permits(1);
                    std::future::pending::<()>().await;
                    Ok::<_, Error>(())
                })
                .await
        }
    });
    tokio::time::timeout(Duration::from_secs(10), inserted.acquire())
        .await
        .unwrap()
        .unwrap()
        .forget();
    // The consumer dies before commit and before its ACK.
    worker.abort();
    channel.close(320, "consumer killed".into()).await.unwrap();
    db.assert_settles().await;
    assert_eq!(
        coupons(&db, "pay-3").await,
        0,
        "nothing of the killed attempt committed"
    );

    let (_channel, mut consumer) = broker.consumer().await;
    let redelivery = next(&mut consumer).await;
    assert!(redelivery.redelivered);
    assert_eq!(
        grant(&inbox, &redelivery).await.unwrap(),
        Outcome::Processed(())
    );
    redelivery.ack(BasicAckOptions::default()).await.unwrap();
    assert_eq!(coupons(&db, "pay-3").await, 1);
    db.assert_settles().await;
    broker.cleanup().await;
}
