//! The transactional outbox against real PostgreSQL and the real RabbitMQ: a message exists
//! exactly when the work that enqueued it committed, the relay publishes it with confirms,
//! and a consumer's Inbox turns "at least once" into one effect.
//!
//! Needs RabbitMQ at `AMQP_URL` (default `amqp://guest:guest@127.0.0.1:5672/%2f`); without
//! one the broker tests say so and pass, except under CI (`CI` set), where they fail.

#![cfg(feature = "rabbitmq")]

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use axum_idempotency::inbox::Outcome;
use axum_idempotency::outbox::{
    MessageError, OutboxMessage, OutboxRelay, Outgoing, PublishError, Publisher, RabbitPublisher,
};
use axum_idempotency::{Admin, Error, IdempotencyLayer, Inbox, OutboxState, Sweeper};
use common::*;
use futures_util::StreamExt;
use lapin::Connection;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use serde_json::json;

/// The outbox rows of a test's schema: (message id, topic, state, attempts, last error).
async fn outbox_rows(db: &TestDb) -> Vec<(String, String, String, i32, Option<String>)> {
    db.admin
        .query(
            &format!(
                "SELECT message_id, topic, state, attempts, last_error \
                 FROM {}.idempotency_outbox ORDER BY seq",
                db.schema
            ),
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
        .collect()
}

/// A queue of its own for one test, deleted at the end.
struct Queue {
    connection: Connection,
    name: String,
}

impl Queue {
    async fn new() -> Option<Self> {
        let queue = Self {
            connection: common::rabbit::connect().await?,
            name: unique_name("outbox"),
        };
        queue.declare().await;
        Some(queue)
    }

    async fn declare(&self) {
        common::rabbit::declare_durable(&self.connection, &self.name).await;
    }

    /// Consumes (and acks) `count` messages: (AMQP message id, body), in delivery order.
    async fn take(&self, count: usize) -> Vec<(String, Vec<u8>)> {
        let channel = self.connection.create_channel().await.unwrap();
        let mut consumer = channel
            .basic_consume(
                self.name.as_str().into(),
                unique_name("c").as_str().into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        let mut taken = Vec::new();
        while taken.len() < count {
            let delivery = tokio::time::timeout(Duration::from_secs(20), consumer.next())
                .await
                .unwrap_or_else(|_| panic!("only {} of {count} messages arrived", taken.len()))
                .unwrap()
                .unwrap();
            let id = delivery
                .properties
                .message_id()
                .as_ref()
                .map(|id| id.to_string())
                .expect("a message_id property");
            delivery.ack(BasicAckOptions::default()).await.unwrap();
            taken.push((id, delivery.data));
        }
        channel.close(200, "done".into()).await.unwrap();
        taken
    }

    /// Messages waiting in the queue.
    async fn depth(&self) -> u32 {
        let channel = self.connection.create_channel().await.unwrap();
        let queue = channel
            .queue_declare(
                self.name.as_str().into(),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .unwrap();
        queue.message_count()
    }

    async fn delete(self) {
        let channel = self.connection.create_channel().await.unwrap();
        channel
            .queue_delete(self.name.as_str().into(), QueueDeleteOptions::default())
            .await
            .unwrap();
    }
}

fn idempotent_app<D: PgDriver>(db: &TestDb, knobs: Arc<Knobs>) -> axum::Router {
    router(knobs, IdempotencyLayer::new(D::pool(db)))
}

async fn a_committed_handler_makes_its_message_visible_with_its_rows<D: PgDriver>() {
    let db = TestDb::new(4).await;
    let (knobs, gate) = gated();
    let app = idempotent_app::<D>(&db, Arc::clone(&knobs));
    let body = json!({"amount": 5, "enqueue": "orders-created"});
    let first = tokio::spawn({
        let app = app.clone();
        let body = body.clone();
        async move { send(&app, post_json("/orders", Some("k-1"), &body)).await }
    });
    knobs.wait_inserted().await;
    // Enqueued, not committed: invisible, like the order row.
    assert_eq!(outbox_rows(&db).await.len(), 0);
    assert_eq!(db.orders().await, 0);
    gate.add_permits(1);
    let answer = first.await.unwrap();
    assert_eq!(answer.status, 201);
    let rows = outbox_rows(&db).await;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].1, "orders-created");
    assert_eq!(rows[0].2, "PENDING");
    assert_eq!((db.orders().await, db.records().await), (1, 1));

    // The retry replays; the handler does not run, nothing more is enqueued.
    gate.add_permits(1);
    let replay = send(&app, post_json("/orders", Some("k-1"), &body)).await;
    assert!(replay.replayed());
    assert_eq!(outbox_rows(&db).await.len(), 1);
    assert_eq!(knobs.calls(), 1);
    db.assert_settles().await;
}

async fn a_handler_that_does_not_commit_leaves_no_message<D: PgDriver>() {
    let db = TestDb::new(4).await;
    let knobs = Arc::new(Knobs::default());
    let app = idempotent_app::<D>(&db, Arc::clone(&knobs));
    let cases = [
        ("server-error", json!({"enqueue": "t", "status": 500}), 500),
        ("stored-4xx", json!({"enqueue": "t", "status": 400}), 400),
        ("panic", json!({"enqueue": "t", "panic": true}), 500),
    ];
    for (key, body, status) in cases {
        let answer = send(&app, post_json("/orders", Some(key), &body)).await;
        assert_eq!(answer.status, status, "{key}");
    }
    knobs
        .fail_commit_once
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let answer = send(
        &app,
        post_json("/orders", Some("commit-fails"), &json!({"enqueue": "t"})),
    )
    .await;
    assert_eq!(answer.status, 503, "a failed COMMIT");
    assert_eq!(knobs.calls(), 4);
    assert_eq!(
        outbox_rows(&db).await,
        vec![],
        "no message of work that did not commit"
    );
    assert_eq!(db.orders().await, 0);
    db.assert_settles().await;
}

async fn inbox_work_enqueues_the_next_event_once<D: PgDriver>() {
    let db = TestDb::new(2).await;
    let inbox = Inbox::new(D::pool(&db), "orders");
    for _ in 0..3 {
        inbox
            .process("payment-77", |mut tx| async move {
                tx.insert_order(77, 1).await?;
                let next = OutboxMessage::new("ship-order", "77").id(tx.derive("ship"));
                tx.enqueue_message(&next).await.map(drop)
            })
            .await
            .unwrap();
    }
    let rows = outbox_rows(&db).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].1, "ship-order");
    assert_eq!(db.orders().await, 1);
}

async fn enqueue_checks_the_message_and_keeps_the_first_of_an_id<D: PgDriver>() {
    let db = TestDb::new(2).await;
    let inbox = Inbox::new(D::pool(&db), "g");
    let outcome = inbox
        .process("m", |mut tx| async move {
            let bad = tx
                .enqueue_message(&OutboxMessage::new("t", "x").id("has space"))
                .await
                .unwrap_err();
            assert!(
                matches!(bad, Error::InvalidMessage(MessageError::Id(_))),
                "{bad:?}"
            );
            let empty_topic = tx.enqueue_message(&OutboxMessage::new("", "x")).await;
            assert!(matches!(
                empty_topic,
                Err(Error::InvalidMessage(MessageError::Topic))
            ));
            let first = tx
                .enqueue_message(&OutboxMessage::new("t", "first").id("same"))
                .await?;
            let second = tx
                .enqueue_message(&OutboxMessage::new("t", "second").id("same"))
                .await?;
            let generated = tx.enqueue_message(&OutboxMessage::new("t", "x")).await?;
            Ok::<_, Error>((first, second, generated))
        })
        .await
        .unwrap();
    let Outcome::Processed((first, second, generated)) = outcome else {
        panic!("{outcome:?}");
    };
    assert_eq!(
        (first.message_id.as_str(), first.duplicate),
        ("same", false)
    );
    assert_eq!(
        (second.message_id.as_str(), second.duplicate),
        ("same", true)
    );
    assert!(!generated.duplicate);
    assert_eq!(
        generated.message_id.len(),
        36,
        "a UUID: {}",
        generated.message_id
    );
    let payload: Vec<u8> = db
        .admin
        .query_one(
            &format!(
                "SELECT payload FROM {}.idempotency_outbox WHERE message_id = 'same'",
                db.schema
            ),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(payload, b"first");
    assert_eq!(outbox_rows(&db).await.len(), 2);
}

async fn the_relay_publishes_confirmed_messages_with_their_id_and_marks_them_sent<D: PgDriver>() {
    let Some(queue) = Queue::new().await else {
        return;
    };
    let db = TestDb::new(4).await;
    let knobs = Arc::new(Knobs::default());
    let app = idempotent_app::<D>(&db, knobs);
    for key in ["a", "b", "c"] {
        let body = json!({"enqueue": queue.name});
        assert_eq!(
            send(&app, post_json("/orders", Some(key), &body))
                .await
                .status,
            201
        );
    }
    let relay = OutboxRelay::new(D::pool(&db), RabbitPublisher::new(amqp_url()));
    let report = relay.run_once().await.unwrap();
    assert_eq!((report.locked, report.published, report.refused), (3, 3, 0));
    let rows = outbox_rows(&db).await;
    assert!(rows.iter().all(|r| r.2 == "SENT" && r.3 == 1), "{rows:?}");
    let delivered = queue.take(3).await;
    let mut delivered_ids: Vec<_> = delivered.iter().map(|(id, _)| id.clone()).collect();
    let mut stored_ids: Vec<_> = rows.iter().map(|r| r.0.clone()).collect();
    delivered_ids.sort();
    stored_ids.sort();
    assert_eq!(
        delivered_ids, stored_ids,
        "AMQP message_id is the outbox id"
    );
    for (id, body) in &delivered {
        let body: serde_json::Value = serde_json::from_slice(body).unwrap();
        assert_eq!(body["order"], id.as_str());
    }
    // Nothing left: a second batch finds nothing.
    assert_eq!(relay.run_once().await.unwrap().locked, 0);
    queue.delete().await;
}

/// Publishes through RabbitMQ, then never returns: a relay that dies after the broker's
/// confirm, before its transaction marked the message SENT.
struct DiesAfterConfirm(RabbitPublisher);

impl Publisher for DiesAfterConfirm {
    async fn publish(&self, message: &Outgoing) -> Result<(), PublishError> {
        self.0.publish(message).await?;
        std::future::pending().await
    }
}

async fn a_relay_killed_after_the_confirm_publishes_again_and_the_inbox_keeps_one_effect<
    D: PgDriver,
>() {
    let Some(queue) = Queue::new().await else {
        return;
    };
    let db = TestDb::new(4).await;
    let app = idempotent_app::<D>(&db, Arc::new(Knobs::default()));
    let body = json!({"user_id": 1001, "enqueue": queue.name});
    assert_eq!(
        send(&app, post_json("/orders", Some("pay-1"), &body))
            .await
            .status,
        201
    );

    let dying = OutboxRelay::new(
        D::pool(&db),
        DiesAfterConfirm(RabbitPublisher::new(amqp_url())),
    );
    assert!(
        tokio::time::timeout(Duration::from_secs(2), dying.run_once())
            .await
            .is_err()
    );
    drop(dying);
    // Its transaction rolled back: the message is pending again.
    eventually("the dead relay's batch to roll back", async || {
        outbox_rows(&db).await[0].2 == "PENDING" && db.idle_in_transaction().await == 0
    })
    .await;
    let relay = OutboxRelay::new(D::pool(&db), RabbitPublisher::new(amqp_url()));
    assert_eq!(relay.run_once().await.unwrap().published, 1);

    let delivered = queue.take(2).await;
    assert_eq!(delivered[0].0, delivered[1].0, "the same message id twice");
    let inbox = Inbox::new(D::pool(&db), "coupons");
    let mut outcomes = Vec::new();
    for (id, _) in &delivered {
        let outcome = inbox
            .process(id, |mut tx| async move { tx.insert_order(1001, 50).await })
            .await
            .unwrap();
        outcomes.push(matches!(outcome, Outcome::Processed(_)));
    }
    assert_eq!(outcomes, [true, false], "processed, then a duplicate");
    // One order from the handler, one coupon from the consumer.
    assert_eq!(db.orders().await, 2);
    queue.delete().await;
}

async fn while_the_broker_is_down_messages_wait_and_nothing_is_marked<D: PgDriver>() {
    let db = TestDb::new(2).await;
    let app = idempotent_app::<D>(&db, Arc::new(Knobs::default()));
    assert_eq!(
        send(
            &app,
            post_json("/orders", Some("k"), &json!({"enqueue": "t"}))
        )
        .await
        .status,
        201
    );
    // Nothing listens on port 1: connection refused.
    let relay = OutboxRelay::new(
        D::pool(&db),
        RabbitPublisher::new("amqp://guest:guest@127.0.0.1:1/%2f"),
    );
    for _ in 0..3 {
        let report = relay.run_once().await.unwrap();
        assert!(report.unavailable);
        assert_eq!((report.published, report.refused), (0, 0));
    }
    let rows = outbox_rows(&db).await;
    assert_eq!(
        (rows[0].2.as_str(), rows[0].3),
        ("PENDING", 0),
        "no attempt counted"
    );
    db.assert_settles().await;
}

async fn an_unroutable_message_is_parked_after_its_attempts_and_can_be_requeued<D: PgDriver>() {
    let Some(queue) = Queue::new().await else {
        return;
    };
    let db = TestDb::new(2).await;
    let no_queue = unique_name("nobody-listens");
    let app = idempotent_app::<D>(&db, Arc::new(Knobs::default()));
    assert_eq!(
        send(
            &app,
            post_json("/orders", Some("k"), &json!({"enqueue": no_queue}))
        )
        .await
        .status,
        201
    );
    let relay = OutboxRelay::new(D::pool(&db), RabbitPublisher::new(amqp_url()))
        .max_attempts(2)
        .retry_delay(Duration::ZERO, Duration::ZERO);
    let first = relay.run_once().await.unwrap();
    assert_eq!((first.refused, first.parked), (1, 0));
    let rows = outbox_rows(&db).await;
    assert_eq!((rows[0].2.as_str(), rows[0].3), ("PENDING", 1));
    let second = relay.run_once().await.unwrap();
    assert_eq!((second.refused, second.parked), (1, 1));

    let admin = Admin::new(D::pool(&db));
    let parked = admin
        .outbox_messages(OutboxState::Failed, 10)
        .await
        .unwrap();
    assert_eq!(parked.len(), 1);
    assert_eq!(parked[0].attempts, 2);
    let error = parked[0].last_error.clone().unwrap();
    assert!(error.contains("unroutable"), "{error}");
    // Parked messages are not tried again.
    assert_eq!(relay.run_once().await.unwrap().locked, 0);

    // Requeued once a queue takes the topic, it goes out.
    let channel = queue.connection.create_channel().await.unwrap();
    channel
        .queue_bind(
            queue.name.as_str().into(),
            "amq.direct".into(),
            no_queue.as_str().into(),
            Default::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let relay = OutboxRelay::new(
        D::pool(&db),
        RabbitPublisher::new(amqp_url()).exchange("amq.direct"),
    );
    assert!(admin.requeue_outbox(&parked[0].message_id).await.unwrap());
    assert!(!admin.requeue_outbox("no-such-message").await.unwrap());
    assert_eq!(relay.run_once().await.unwrap().published, 1);
    assert_eq!(queue.take(1).await[0].0, parked[0].message_id);
    assert!(
        admin
            .outbox_messages(OutboxState::Failed, 10)
            .await
            .unwrap()
            .is_empty()
    );
    queue.delete().await;
}

async fn the_sweeper_purges_settled_messages_after_their_retention<D: PgDriver>() {
    let db = TestDb::new(2).await;
    let inbox = Inbox::new(D::pool(&db), "g");
    for (id, state) in [
        ("sent-old", "SENT"),
        ("sent-new", "SENT"),
        ("failed-old", "FAILED"),
        ("pending", "PENDING"),
    ] {
        inbox
            .process(id, |mut tx| async move {
                tx.enqueue_message(&OutboxMessage::new("t", "x").id(id))
                    .await
            })
            .await
            .unwrap();
        db.admin
            .execute(
                &format!(
                    "UPDATE {}.idempotency_outbox SET state = $2, \
                     sent_at = CASE WHEN $2 = 'SENT' THEN now() END WHERE message_id = $1",
                    db.schema
                ),
                &[&id, &state],
            )
            .await
            .unwrap();
    }
    db.admin
        .batch_execute(&format!(
            "UPDATE {s}.idempotency_outbox SET sent_at = now() - interval '2 hours', \
             created_at = now() - interval '2 hours' WHERE message_id LIKE '%-old'; \
             UPDATE {s}.idempotency_outbox SET created_at = now() - interval '2 days' \
             WHERE message_id = 'pending'",
            s = db.schema
        ))
        .await
        .unwrap();
    let report = Sweeper::new(D::pool(&db))
        .outbox_sent_retention(Duration::from_secs(3600))
        .outbox_failed_retention(Duration::from_secs(3600))
        .run_once()
        .await
        .unwrap();
    assert_eq!(report.purged_outbox, 2);
    let left: Vec<String> = outbox_rows(&db).await.into_iter().map(|r| r.0).collect();
    assert_eq!(left, ["sent-new", "pending"]);
}

for_each_driver! {
    #[tokio::test] async a_committed_handler_makes_its_message_visible_with_its_rows;
    #[tokio::test] async a_handler_that_does_not_commit_leaves_no_message;
    #[tokio::test] async inbox_work_enqueues_the_next_event_once;
    #[tokio::test] async enqueue_checks_the_message_and_keeps_the_first_of_an_id;
    #[tokio::test] async the_relay_publishes_confirmed_messages_with_their_id_and_marks_them_sent;
    #[tokio::test] async a_relay_killed_after_the_confirm_publishes_again_and_the_inbox_keeps_one_effect;
    #[tokio::test] async while_the_broker_is_down_messages_wait_and_nothing_is_marked;
    #[tokio::test] async an_unroutable_message_is_parked_after_its_attempts_and_can_be_requeued;
    #[tokio::test] async the_sweeper_purges_settled_messages_after_their_retention;
}

#[tokio::test]
async fn enqueue_on_a_plain_transaction_commits_and_rolls_back_with_it() {
    if !common::Database::Postgres.configured() {
        return;
    }
    let db = TestDb::new(2).await;
    let mut client = db.pool.get().await.unwrap();
    let tx = client.transaction().await.unwrap();
    axum_idempotency::postgres::enqueue(&*tx, &OutboxMessage::new("t", "x").id("rolled-back"))
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    let tx = client.transaction().await.unwrap();
    axum_idempotency::postgres::enqueue(&*tx, &OutboxMessage::new("t", "x").id("committed"))
        .await
        .unwrap();
    assert!(outbox_rows(&db).await.is_empty(), "not before COMMIT");
    tx.commit().await.unwrap();
    drop(client);
    let ids: Vec<String> = outbox_rows(&db).await.into_iter().map(|r| r.0).collect();
    assert_eq!(ids, ["committed"]);
}

#[cfg(feature = "sqlx")]
#[tokio::test]
async fn enqueue_on_a_plain_sqlx_transaction_commits_and_rolls_back_with_it() {
    if !common::Database::Postgres.configured() {
        return;
    }
    let db = TestDb::new(2).await;
    let pool = <Sqlx as Driver>::pool(&db);
    let mut tx = pool.begin().await.unwrap();
    axum_idempotency::sqlx::enqueue(
        &mut *tx,
        &OutboxMessage::new("t", "x").id("sqlx-rolled-back"),
    )
    .await
    .unwrap();
    tx.rollback().await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    axum_idempotency::sqlx::enqueue(&mut *tx, &OutboxMessage::new("t", "x").id("sqlx-committed"))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let ids: Vec<String> = outbox_rows(&db).await.into_iter().map(|r| r.0).collect();
    assert_eq!(ids, ["sqlx-committed"]);
}

/// Three relays, as three app instances would run them, drain 400 messages enqueued by
/// eight concurrent producers over five ordering keys (and some without a key): every
/// message is delivered exactly once, and each key's messages arrive in commit order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_relays_publish_every_message_once_and_each_key_in_order() {
    if !common::Database::Postgres.configured() {
        return;
    }
    let Some(queue) = Queue::new().await else {
        return;
    };
    let db = TestDb::new(12).await;
    let relays: Vec<_> = (0..3)
        .map(|_| {
            OutboxRelay::new(db.pool.clone(), RabbitPublisher::new(amqp_url()))
                .batch_size(16)
                .poll_interval(Duration::from_millis(20))
                .spawn()
        })
        .collect();
    let producers: Vec<_> = (0..8)
        .map(|producer| {
            let pool = db.pool.clone();
            let topic = queue.name.clone();
            tokio::spawn(async move {
                for i in 0..50 {
                    let mut client = pool.get().await.unwrap();
                    let tx = client.transaction().await.unwrap();
                    let id = format!("p{producer}-{i}");
                    let mut message = OutboxMessage::new(topic.as_str(), id.clone()).id(id);
                    if i % 5 != 0 {
                        message = message.ordering_key(format!("key-{}", (producer + i) % 5));
                    }
                    axum_idempotency::postgres::enqueue(&*tx, &message)
                        .await
                        .unwrap();
                    tx.commit().await.unwrap();
                }
            })
        })
        .collect();
    for producer in producers {
        producer.await.unwrap();
    }
    let delivered = queue.take(400).await;
    for relay in relays {
        relay.shutdown().await;
    }
    let unique: HashSet<_> = delivered.iter().map(|(id, _)| id.clone()).collect();
    assert_eq!(unique.len(), 400, "every message once");
    assert_eq!(queue.depth().await, 0, "and nothing twice");

    // Commit order of a key is its seq order (its producers serialise on the key).
    let rows = db
        .admin
        .query(
            &format!(
                "SELECT message_id, seq, ordering_key, state FROM {}.idempotency_outbox",
                db.schema
            ),
            &[],
        )
        .await
        .unwrap();
    let mut seq_of = HashMap::new();
    let mut key_of = HashMap::new();
    for row in &rows {
        assert_eq!(row.get::<_, String>(3), "SENT");
        seq_of.insert(row.get::<_, String>(0), row.get::<_, i64>(1));
        key_of.insert(row.get::<_, String>(0), row.get::<_, Option<String>>(2));
    }
    let mut per_key: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for (id, _) in &delivered {
        if let Some(key) = &key_of[id] {
            per_key.entry(key.clone()).or_default().push(seq_of[id]);
        }
    }
    assert_eq!(per_key.len(), 5);
    for (key, seqs) in per_key {
        assert!(
            seqs.windows(2).all(|w| w[0] < w[1]),
            "{key} out of order: {seqs:?}"
        );
    }
    queue.delete().await;
}

/// Producers of one ordering key commit one after the other: the second waits for the
/// first's COMMIT before its message gets its place.
#[tokio::test]
async fn producers_of_one_ordering_key_wait_for_each_others_commit() {
    if !common::Database::Postgres.configured() {
        return;
    }
    let db = TestDb::new(4).await;
    let mut first_client = db.pool.get().await.unwrap();
    let first = first_client.transaction().await.unwrap();
    axum_idempotency::postgres::enqueue(
        &*first,
        &OutboxMessage::new("t", "1").id("first").ordering_key("k"),
    )
    .await
    .unwrap();
    let pool = db.pool.clone();
    let second = tokio::spawn(async move {
        let mut client = pool.get().await.unwrap();
        let tx = client.transaction().await.unwrap();
        let message = OutboxMessage::new("t", "2").id("second").ordering_key("k");
        axum_idempotency::postgres::enqueue(&*tx, &message)
            .await
            .unwrap();
        tx.commit().await.unwrap();
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !second.is_finished(),
        "the second producer waits for the key"
    );
    // Another key does not wait.
    let mut other = db.pool.get().await.unwrap();
    let tx = other.transaction().await.unwrap();
    axum_idempotency::postgres::enqueue(
        &*tx,
        &OutboxMessage::new("t", "3").id("other").ordering_key("j"),
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    first.commit().await.unwrap();
    second.await.unwrap();
    let ids: Vec<String> = outbox_rows(&db).await.into_iter().map(|r| r.0).collect();
    assert_eq!(ids, ["first", "other", "second"]);
}

/// Refuses every message whose topic is `refused`; records the ids of the others.
struct RefusesOneTopic(Arc<std::sync::Mutex<Vec<String>>>);

impl Publisher for RefusesOneTopic {
    async fn publish(&self, message: &Outgoing) -> Result<(), PublishError> {
        if message.topic() == "refused" {
            return Err(PublishError::refused("refused by the test"));
        }
        self.0.lock().unwrap().push(message.message_id().to_owned());
        Ok(())
    }
}

/// A key whose first message waits for its next attempt holds back that key's later
/// messages, and only those: even with more of them waiting than a batch holds, the other
/// keys' messages still go out.
#[tokio::test]
async fn a_key_waiting_for_a_retry_does_not_starve_the_other_keys() {
    if !common::Database::Postgres.configured() {
        return;
    }
    let db = TestDb::new(2).await;
    let pooled = db.pool.get().await.unwrap();
    let client: &tokio_postgres::Client = &pooled;
    let enqueue = |topic: &'static str, key: &'static str, id: String| async move {
        {
            axum_idempotency::postgres::enqueue(
                client,
                &OutboxMessage::new(topic, "{}").id(id).ordering_key(key),
            )
            .await
            .unwrap();
        }
    };
    enqueue("refused", "stuck", "stuck-0".to_owned()).await;
    for i in 1..=4 {
        enqueue("fine", "stuck", format!("stuck-{i}")).await;
    }
    enqueue("fine", "other", "other-0".to_owned()).await;
    let published = Arc::new(std::sync::Mutex::new(Vec::new()));
    let relay = OutboxRelay::new(db.pool.clone(), RefusesOneTopic(Arc::clone(&published)))
        .batch_size(2)
        .retry_delay(Duration::from_secs(60), Duration::from_secs(60));
    let first = relay.run_once().await.unwrap();
    assert_eq!((first.locked, first.refused), (2, 1));
    assert!(
        published.lock().unwrap().is_empty(),
        "a lane stops at its refusal"
    );
    // `stuck-0` now waits 60 s; the rest of its key waits behind it, and the batch reaches
    // the other key.
    for _ in 0..3 {
        relay.run_once().await.unwrap();
    }
    assert_eq!(*published.lock().unwrap(), ["other-0"]);
}

/// With `listen`, a COMMIT wakes the relay at once even with a 60 s poll interval; without
/// it (as behind a transaction-pooling PgBouncer), polling alone delivers.
#[tokio::test]
async fn a_listening_relay_wakes_on_commit_and_a_polling_one_still_delivers() {
    if !common::Database::Postgres.configured() {
        return;
    }
    let Some(queue) = Queue::new().await else {
        return;
    };
    let db = TestDb::new(4).await;
    let listening = OutboxRelay::new(db.pool.clone(), RabbitPublisher::new(amqp_url()))
        .listen(axum_idempotency::outbox::Listener::postgres(
            database_url().parse().unwrap(),
        ))
        .poll_interval(Duration::from_secs(60))
        .spawn();
    // Its first batch runs at once, and its LISTEN is up once it has settled.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = std::time::Instant::now();
    axum_idempotency::postgres::enqueue(
        &**db.pool.get().await.unwrap(),
        &OutboxMessage::new(queue.name.as_str(), "woken").id("woken"),
    )
    .await
    .unwrap();
    // Polling would take 60 s; `take` gives up after 20.
    assert_eq!(queue.take(1).await[0].0, "woken");
    eprintln!("LISTEN wake-up: commit to delivery {:?}", started.elapsed());
    listening.shutdown().await;

    let polling = OutboxRelay::new(db.pool.clone(), RabbitPublisher::new(amqp_url()))
        .prepared_statements(false)
        .poll_interval(Duration::from_millis(100))
        .spawn();
    axum_idempotency::postgres::enqueue(
        &**db.pool.get().await.unwrap(),
        &OutboxMessage::new(queue.name.as_str(), "polled").id("polled"),
    )
    .await
    .unwrap();
    assert_eq!(queue.take(1).await[0].0, "polled");
    polling.shutdown().await;
    queue.delete().await;
}

/// `listen_with_tls`: the LISTEN connection is encrypted (PostgreSQL's `pg_stat_ssl` says
/// so for the backend that listens), and a COMMIT still wakes the relay at once.
#[tokio::test]
async fn a_relay_listens_over_tls() {
    if !common::Database::Postgres.configured() {
        return;
    }
    let Some(queue) = Queue::new().await else {
        return;
    };
    let db = TestDb::new(4).await;
    let ssl: String = db.admin.query_one("SHOW ssl", &[]).await.unwrap().get(0);
    if ssl != "on" {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI's PostgreSQL must have ssl on (Debian's default)"
        );
        eprintln!("skipped: this PostgreSQL has ssl off");
        return;
    }
    let application = unique_name("tls_listener");
    let mut config: tokio_postgres::Config = database_url().parse().unwrap();
    config
        .ssl_mode(tokio_postgres::config::SslMode::Require)
        .application_name(&application);
    // The server's certificate is the distribution's self-signed one.
    let tls = native_tls::TlsConnector::builder()
        .danger_accept_invalid_certs(true)
        .build()
        .unwrap();
    let relay = OutboxRelay::new(db.pool.clone(), RabbitPublisher::new(amqp_url()))
        .listen(axum_idempotency::outbox::Listener::postgres_with_tls(
            config,
            postgres_native_tls::MakeTlsConnector::new(tls),
        ))
        .poll_interval(Duration::from_secs(60))
        .spawn();
    let mut listener = None;
    for _ in 0..100 {
        listener = db
            .admin
            .query_opt(
                "SELECT s.ssl FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
                 WHERE a.application_name = $1 AND a.query = 'LISTEN idempotency_outbox'",
                &[&application],
            )
            .await
            .unwrap()
            .map(|row| row.get::<_, bool>(0));
        if listener.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        listener,
        Some(true),
        "the LISTEN connection is up and encrypted"
    );
    axum_idempotency::postgres::enqueue(
        &**db.pool.get().await.unwrap(),
        &OutboxMessage::new(queue.name.as_str(), "woken over tls").id("tls"),
    )
    .await
    .unwrap();
    // Polling would take 60 s; `take` gives up after 20.
    let delivered = queue.take(1).await;
    assert_eq!(
        (delivered[0].0.as_str(), delivered[0].1.as_slice()),
        ("tls", b"woken over tls".as_slice())
    );
    relay.shutdown().await;
    queue.delete().await;
}

/// A nack (a full queue that rejects publishes) and a channel the broker closes over a
/// message (no such exchange) are refusals: counted, parked after their attempts, and the
/// same publisher goes on on a new channel. An unreachable broker is counted apart, and
/// the pending gauges say what waits. A local recorder sees only this thread, so the test
/// drives its own single-threaded runtime.
#[test]
fn nacked_and_channel_closing_messages_are_parked_and_the_metrics_say_so() {
    if !common::Database::Postgres.configured() {
        return;
    }
    use common::recorder::{Capture, Recorder};

    let capture = Arc::new(Capture::default());
    let recorder = Recorder(Arc::clone(&capture));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let ran = metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            let Some(queue) = Queue::new().await else {
                return false;
            };
            let db = TestDb::new(4).await;
            let channel = queue.connection.create_channel().await.unwrap();
            let full = unique_name("full");
            let mut arguments = FieldTable::default();
            arguments.insert("x-max-length".into(), lapin::types::AMQPValue::LongInt(0));
            arguments.insert(
                "x-overflow".into(),
                lapin::types::AMQPValue::LongString("reject-publish".into()),
            );
            channel
                .queue_declare(
                    full.as_str().into(),
                    QueueDeclareOptions::default(),
                    arguments,
                )
                .await
                .unwrap();
            let enqueue = async |id: &str, topic: &str| {
                axum_idempotency::postgres::enqueue(
                    &**db.pool.get().await.unwrap(),
                    &OutboxMessage::new(topic, "x").id(id),
                )
                .await
                .unwrap();
            };

            // A nack: parked after its one attempt; the other message goes out.
            enqueue("to-queue", &queue.name).await;
            enqueue("to-full-queue", &full).await;
            let relay =
                OutboxRelay::new(db.pool.clone(), RabbitPublisher::new(amqp_url())).max_attempts(1);
            let report = relay.run_once().await.unwrap();
            assert_eq!((report.published, report.refused, report.parked), (1, 1, 1));

            // No such exchange: the broker closes the channel over the message.
            let exchange = unique_name("exchange");
            let relay = OutboxRelay::new(
                db.pool.clone(),
                RabbitPublisher::new(amqp_url()).exchange(exchange.as_str()),
            )
            .max_attempts(1);
            enqueue("no-exchange", &queue.name).await;
            let report = relay.run_once().await.unwrap();
            assert_eq!((report.refused, report.parked), (1, 1));
            let admin = Admin::new(db.pool.clone());
            let parked = admin
                .outbox_messages(OutboxState::Failed, 10)
                .await
                .unwrap();
            let errors: Vec<_> = parked
                .iter()
                .map(|m| (m.message_id.as_str(), m.last_error.clone().unwrap()))
                .collect();
            assert_eq!(errors.len(), 2, "{errors:?}");
            assert!(
                errors[0].1.contains("negatively acknowledged"),
                "{errors:?}"
            );
            assert!(
                errors[1].1.contains("NOT_FOUND") || errors[1].1.contains("404"),
                "{errors:?}"
            );

            // The exchange appears; the same publisher recovers on a new channel.
            channel
                .exchange_declare(
                    exchange.as_str().into(),
                    lapin::ExchangeKind::Direct,
                    Default::default(),
                    FieldTable::default(),
                )
                .await
                .unwrap();
            channel
                .queue_bind(
                    queue.name.as_str().into(),
                    exchange.as_str().into(),
                    queue.name.as_str().into(),
                    Default::default(),
                    FieldTable::default(),
                )
                .await
                .unwrap();
            assert!(admin.requeue_outbox("no-exchange").await.unwrap());
            assert_eq!(relay.run_once().await.unwrap().published, 1);
            assert_eq!(queue.take(2).await.len(), 2);

            // The broker unreachable: counted apart, and the gauges show the backlog.
            enqueue("waiting", &queue.name).await;
            let down = OutboxRelay::new(
                db.pool.clone(),
                RabbitPublisher::new("amqp://guest:guest@127.0.0.1:1/%2f"),
            );
            assert!(down.run_once().await.unwrap().unavailable);

            channel
                .exchange_delete(exchange.as_str().into(), Default::default())
                .await
                .unwrap();
            channel
                .queue_delete(full.as_str().into(), QueueDeleteOptions::default())
                .await
                .unwrap();
            queue.delete().await;
            true
        })
    });
    if !ran {
        return;
    }
    let values = capture.values();
    let value = |key: &str| values.get(key).copied().unwrap_or(0.0);
    assert_eq!(
        value("idempotency_outbox_published_total{}"),
        2.0,
        "{values:?}"
    );
    assert_eq!(
        value("idempotency_outbox_publish_failures_total{reason=refused}"),
        2.0,
        "{values:?}"
    );
    assert_eq!(
        value("idempotency_outbox_parked_total{}"),
        2.0,
        "{values:?}"
    );
    assert_eq!(
        value("idempotency_outbox_publish_failures_total{reason=unavailable}"),
        1.0,
        "{values:?}"
    );
    assert_eq!(value("idempotency_outbox_pending{}"), 1.0, "{values:?}");
    assert!(values.contains_key("idempotency_outbox_oldest_pending_seconds{}"));
}
