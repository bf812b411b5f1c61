//! `inbox::rabbit::Consumer` on a real broker: what it answers the broker for each outcome
//! of the Inbox, the broker's delivery count in the attempt policy, and a shutdown that
//! finishes the message in hand.
//!
//! Needs RabbitMQ at `AMQP_URL`; without one it says so and passes, except under CI.

#![cfg(feature = "rabbitmq")]

mod common;

use std::sync::Arc;
use std::time::Duration;

use axum_idempotency::Inbox;
use axum_idempotency::inbox::rabbit::Consumer;
use common::*;
use lapin::options::{BasicPublishOptions, QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Connection};
use tokio::sync::Semaphore;

async fn coupon_db() -> TestDb {
    let db = TestDb::new(4).await;
    db.pool
        .get()
        .await
        .unwrap()
        .batch_execute(
            "CREATE TABLE coupon_account (user_id bigint NOT NULL, message_id text NOT NULL)",
        )
        .await
        .unwrap();
    db
}

/// A queue dead-lettering to a queue of its own; returns (queue, dead-letter queue).
async fn queues(connection: &Connection) -> (String, String) {
    let queue = unique_name("consumer");
    let dead =
        common::rabbit::declare_dead_lettered(connection, &queue, FieldTable::default()).await;
    (queue, dead)
}

async fn publish(
    connection: &Connection,
    queue: &str,
    id: Option<&str>,
    body: &str,
    count: Option<i64>,
) {
    let channel = connection.create_channel().await.unwrap();
    let mut properties = BasicProperties::default().with_delivery_mode(2);
    if let Some(id) = id {
        properties = properties.with_message_id(id.into());
    }
    if let Some(count) = count {
        let mut headers = FieldTable::default();
        headers.insert("x-delivery-count".into(), AMQPValue::LongLongInt(count));
        properties = properties.with_headers(headers);
    }
    channel
        .basic_publish(
            "".into(),
            queue.into(),
            BasicPublishOptions::default(),
            body.as_bytes(),
            properties,
        )
        .await
        .unwrap()
        .await
        .unwrap();
    channel.close(200, "published".into()).await.unwrap();
}

async fn depth(connection: &Connection, queue: &str) -> u32 {
    let channel = connection.create_channel().await.unwrap();
    let declared = channel
        .queue_declare(
            queue.into(),
            QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
    declared.message_count()
}

async fn scalar(db: &TestDb, sql: &str) -> i64 {
    db.admin
        .query_one(&sql.replace("{s}", &db.schema), &[])
        .await
        .unwrap()
        .get(0)
}

async fn cleanup(connection: &Connection, names: &[&str]) {
    let channel = connection.create_channel().await.unwrap();
    for name in names {
        let _ = channel
            .queue_delete((*name).into(), QueueDeleteOptions::default())
            .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_duplicates_requeues_failures_and_dead_letters_what_the_inbox_gives_up() {
    if !common::Database::Postgres.configured() {
        return;
    }
    let Some(connection) = common::rabbit::connect().await else {
        return;
    };
    let db = coupon_db().await;
    let (queue, dead) = queues(&connection).await;
    let inbox = Inbox::new(db.pool.clone(), "coupon-service").max_attempts(3);
    let consumer = Consumer::new(inbox, [amqp_url()], &queue)
        .message_id_field("message_id")
        .start(|tx, message| async move {
            let body: serde_json::Value = message.json()?;
            if body["fail"].as_bool() == Some(true) {
                return Err("the coupon service refuses this one".into());
            }
            tx.execute(
                "INSERT INTO coupon_account (user_id, message_id) VALUES ($1, $2)",
                &[&body["user_id"].as_i64(), &message.id()],
            )
            .await?;
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
        })
        .await
        .unwrap();

    // Processed, then a duplicate of it; the id from the property, then from the body.
    publish(&connection, &queue, Some("m-1"), r#"{"user_id": 1}"#, None).await;
    publish(
        &connection,
        &queue,
        None,
        r#"{"message_id": "m-1", "user_id": 1}"#,
        None,
    )
    .await;
    // Fails every time: requeued, then given up after 3 attempts and dead-lettered.
    publish(
        &connection,
        &queue,
        Some("m-2"),
        r#"{"user_id": 2, "fail": true}"#,
        None,
    )
    .await;
    // No id at all: dead-lettered at once.
    publish(&connection, &queue, None, r#"{"user_id": 3}"#, None).await;
    // Delivered 5 times before without an outcome (the consumer died each time): given up
    // without running.
    publish(
        &connection,
        &queue,
        Some("m-4"),
        r#"{"user_id": 4}"#,
        Some(5),
    )
    .await;

    eventually("three messages dead-lettered", async || {
        depth(&connection, &dead).await == 3
    })
    .await;
    eventually("the queue drained", async || {
        depth(&connection, &queue).await == 0
    })
    .await;
    consumer.shutdown().await;

    assert_eq!(
        scalar(
            &db,
            "SELECT count(*) FROM {s}.coupon_account WHERE message_id = 'm-1'"
        )
        .await,
        1
    );
    assert_eq!(
        scalar(&db, "SELECT count(*) FROM {s}.coupon_account").await,
        1,
        "only m-1 granted"
    );
    assert_eq!(
        scalar(&db, "SELECT attempts::bigint FROM {s}.inbox_messages WHERE message_id = 'm-2' AND status = 'FAILED'").await,
        3,
        "m-2 failed three times before it was given up"
    );
    assert_eq!(
        scalar(
            &db,
            "SELECT count(*) FROM {s}.inbox_messages WHERE message_id = 'm-4'"
        )
        .await,
        0,
        "m-4's work never ran"
    );
    db.assert_settles().await;
    cleanup(&connection, &[&queue, &dead]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_finishes_the_message_in_hand() {
    if !common::Database::Postgres.configured() {
        return;
    }
    let Some(connection) = common::rabbit::connect().await else {
        return;
    };
    let db = coupon_db().await;
    let (queue, dead) = queues(&connection).await;
    let started = Arc::new(Semaphore::new(0));
    let release = Arc::new(Semaphore::new(0));
    let consumer = Consumer::new(
        Inbox::new(db.pool.clone(), "coupon-service"),
        [amqp_url()],
        &queue,
    )
    .start({
        let (started, release) = (Arc::clone(&started), Arc::clone(&release));
        move |tx, message| {
            let (started, release) = (Arc::clone(&started), Arc::clone(&release));
            async move {
                tx.execute(
                    "INSERT INTO coupon_account (user_id, message_id) VALUES (7, $1)",
                    &[&message.id()],
                )
                .await?;
                started.add_permits(1);
                release.acquire().await.unwrap().forget();
                Ok::<_, axum_idempotency::Error>(())
            }
        }
    })
    .await
    .unwrap();
    publish(&connection, &queue, Some("m-7"), "{}", None).await;
    tokio::time::timeout(Duration::from_secs(10), started.acquire())
        .await
        .expect("the work started")
        .unwrap()
        .forget();

    let stopping = tokio::spawn(consumer.shutdown());
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !stopping.is_finished(),
        "shutdown waits for the message in hand"
    );
    release.add_permits(1);
    tokio::time::timeout(Duration::from_secs(10), stopping)
        .await
        .expect("shutdown finished")
        .unwrap();

    assert_eq!(
        scalar(&db, "SELECT count(*) FROM {s}.coupon_account").await,
        1
    );
    assert_eq!(
        depth(&connection, &queue).await,
        0,
        "the message was acknowledged"
    );
    db.assert_settles().await;
    cleanup(&connection, &[&queue, &dead]).await;
}
