//! The outbox through a broker restart: RabbitMQ's application is stopped and started again
//! (`rabbitmqctl stop_app` / `start_app`) while producers keep committing messages. Nothing
//! is lost and nothing is marked sent that the broker did not confirm.
//!
//! It stops the shared broker, so it runs only with `AXUM_IDEMPOTENCY_DISRUPTIVE_TESTS=1`
//! (`.ci/run` sets it), in a test binary of its own so no other test sees the broker go.

#![cfg(feature = "rabbitmq")]

mod common;

use std::collections::HashSet;
use std::time::Duration;

use axum_idempotency::outbox::{OutboxMessage, OutboxRelay, RabbitPublisher};
use common::*;
use futures_util::StreamExt;
use lapin::options::{BasicConsumeOptions, QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties};

fn rabbitmqctl(command: &str) {
    let status = std::process::Command::new("rabbitmqctl")
        .arg(command)
        .stdout(std::process::Stdio::null())
        .status()
        .expect("run rabbitmqctl");
    assert!(status.success(), "rabbitmqctl {command}: {status}");
}

async fn connect_when_up() -> Connection {
    for _ in 0..300 {
        if let Ok(connection) =
            Connection::connect(&amqp_url(), ConnectionProperties::default()).await
        {
            return connection;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("RabbitMQ did not come back in 30 s");
}

async fn enqueue(db: &TestDb, queue: &str, from: usize, to: usize) {
    for i in from..to {
        axum_idempotency::postgres::enqueue(
            &**db.pool.get().await.unwrap(),
            &OutboxMessage::new(queue, i.to_string()).id(format!("m-{i}")),
        )
        .await
        .unwrap();
    }
}

async fn states(db: &TestDb) -> (i64, i64) {
    let row = db
        .admin
        .query_one(
            &format!(
                "SELECT count(*) FILTER (WHERE state = 'SENT'), count(*) FILTER (WHERE state <> 'SENT') \
                 FROM {}.idempotency_outbox",
                db.schema
            ),
            &[],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_wait_through_a_broker_restart_and_all_arrive() {
    if !common::Database::Postgres.configured() {
        return;
    }
    if std::env::var_os("AXUM_IDEMPOTENCY_DISRUPTIVE_TESTS").is_none() {
        eprintln!(
            "skipped: restarts the shared RabbitMQ; set AXUM_IDEMPOTENCY_DISRUPTIVE_TESTS=1 to run it"
        );
        return;
    }
    let db = TestDb::new(4).await;
    let queue = unique_name("restart");
    let connection = connect_when_up().await;
    connection
        .create_channel()
        .await
        .unwrap()
        .queue_declare(
            queue.as_str().into(),
            QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();

    let relay = OutboxRelay::new(db.pool.clone(), RabbitPublisher::new(amqp_url()))
        .poll_interval(Duration::from_millis(50))
        .max_backoff(Duration::from_millis(500))
        .spawn();
    enqueue(&db, &queue, 0, 50).await;
    eventually("the first 50 sent", async || states(&db).await == (50, 0)).await;

    rabbitmqctl("stop_app");
    enqueue(&db, &queue, 50, 100).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (sent, waiting) = states(&db).await;
    assert_eq!(
        (sent, waiting),
        (50, 50),
        "nothing marked sent while the broker is down"
    );
    rabbitmqctl("start_app");

    let connection = connect_when_up().await;
    let channel = connection.create_channel().await.unwrap();
    let mut consumer = channel
        .basic_consume(
            queue.as_str().into(),
            "restart-test".into(),
            BasicConsumeOptions {
                no_ack: true,
                ..BasicConsumeOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
    let mut seen = HashSet::new();
    while seen.len() < 100 {
        let delivery = tokio::time::timeout(Duration::from_secs(30), consumer.next())
            .await
            .unwrap_or_else(|_| panic!("only {} of 100 arrived", seen.len()))
            .unwrap()
            .unwrap();
        seen.insert(String::from_utf8(delivery.data).unwrap());
    }
    eventually("every message sent", async || states(&db).await == (100, 0)).await;
    relay.shutdown().await;
    channel
        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
        .await
        .unwrap();
}
