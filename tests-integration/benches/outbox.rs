//! The outbox relay's throughput and lag, beside what the broker alone allows: the same
//! number of messages published with confirms straight to RabbitMQ (no database), and
//! through the outbox — producers committing one message per transaction, one listening
//! relay publishing them, a consumer timing each delivery against its producer's COMMIT.
//!
//! ```text
//! cargo bench --bench outbox --all-features                       # 5 000 messages, 8 producers
//! cargo bench --bench outbox --all-features -- --messages 20000 --producers 16
//! ```
//!
//! Needs PostgreSQL at `DATABASE_URL` and RabbitMQ at `AMQP_URL` (the defaults are the
//! local ones). Each path is reported as messages per second and the p50/p99 of the lag
//! (broker alone: publish to confirm; outbox: COMMIT to delivery), and the outbox's
//! throughput as a ratio to the broker's, both measured in this process.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum_idempotency::outbox::{OutboxMessage, OutboxRelay, RabbitPublisher};
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, ConfirmSelectOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Connection, ConnectionProperties};
use tokio_postgres::NoTls;

fn env(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

fn flag(args: &[String], name: &str, default: usize) -> usize {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map_or(default, |v| v.parse().expect("a number"))
}

/// Throughput and lag of one path.
struct Figures {
    per_second: f64,
    p50: Duration,
    p99: Duration,
}

fn figures(count: usize, elapsed: Duration, mut lags: Vec<Duration>) -> Figures {
    lags.sort();
    let at = |q: f64| lags[((lags.len() as f64 * q) as usize).min(lags.len() - 1)];
    Figures {
        per_second: count as f64 / elapsed.as_secs_f64(),
        p50: at(0.50),
        p99: at(0.99),
    }
}

/// A consumer that records when each message id arrives.
async fn consume(connection: &Connection, queue: &str, count: usize) -> HashMap<String, Instant> {
    let channel = connection.create_channel().await.unwrap();
    channel.basic_qos(1000, Default::default()).await.unwrap();
    let mut consumer = channel
        .basic_consume(
            queue.into(),
            "bench".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let mut arrived = HashMap::with_capacity(count);
    while arrived.len() < count {
        let delivery = tokio::time::timeout(Duration::from_secs(60), consumer.next())
            .await
            .expect("deliveries stopped")
            .unwrap()
            .unwrap();
        let id = delivery
            .properties
            .message_id()
            .as_ref()
            .unwrap()
            .to_string();
        arrived.entry(id).or_insert_with(Instant::now);
        delivery.ack(BasicAckOptions::default()).await.unwrap();
    }
    arrived
}

/// The broker alone: `producers` tasks publish `messages` persistent, mandatory messages
/// with confirms on one channel, as the relay's publisher does; lag is publish to confirm.
async fn broker_alone(
    connection: &Connection,
    queue: &str,
    messages: usize,
    producers: usize,
) -> Figures {
    let channel = connection.create_channel().await.unwrap();
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let lags = Arc::new(Mutex::new(Vec::with_capacity(messages)));
    let started = Instant::now();
    let tasks: Vec<_> = (0..producers)
        .map(|p| {
            let (channel, lags, queue) = (channel.clone(), Arc::clone(&lags), queue.to_owned());
            tokio::spawn(async move {
                for i in (p..messages).step_by(producers) {
                    let sent = Instant::now();
                    let confirm = channel
                        .basic_publish(
                            "".into(),
                            queue.as_str().into(),
                            BasicPublishOptions {
                                mandatory: true,
                                ..BasicPublishOptions::default()
                            },
                            b"{\"user_id\":1001}",
                            BasicProperties::default()
                                .with_message_id(format!("alone-{i}").into())
                                .with_delivery_mode(2),
                        )
                        .await
                        .unwrap()
                        .await
                        .unwrap();
                    assert!(confirm.is_ack());
                    lags.lock().unwrap().push(sent.elapsed());
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let elapsed = started.elapsed();
    let lags = std::mem::take(&mut *lags.lock().unwrap());
    figures(messages, elapsed, lags)
}

/// `producers` tasks commit `messages` outbox messages, one per transaction, recording
/// when each COMMIT returned.
async fn produce(
    pool: &Pool,
    queue: &str,
    prefix: &str,
    messages: usize,
    producers: usize,
    committed: Arc<Mutex<HashMap<String, Instant>>>,
) {
    let tasks: Vec<_> = (0..producers)
        .map(|p| {
            let (pool, committed, queue) = (pool.clone(), Arc::clone(&committed), queue.to_owned());
            let prefix = prefix.to_owned();
            tokio::spawn(async move {
                for i in (p..messages).step_by(producers) {
                    let id = format!("{prefix}-{i}");
                    let mut client = pool.get().await.unwrap();
                    let tx = client.transaction().await.unwrap();
                    let message = OutboxMessage::new(queue.as_str(), &b"{\"user_id\":1001}"[..])
                        .id(id.as_str());
                    axum_idempotency::postgres::enqueue(&*tx, &message)
                        .await
                        .unwrap();
                    tx.commit().await.unwrap();
                    committed.lock().unwrap().insert(id, Instant::now());
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
}

/// The producers alone, no relay running: the rate at which messages can be committed,
/// which bounds the outbox's throughput. The rows are deleted afterwards.
async fn producers_alone(pool: &Pool, queue: &str, messages: usize, producers: usize) -> Figures {
    let committed = Arc::new(Mutex::new(HashMap::with_capacity(messages)));
    let started = Instant::now();
    produce(
        pool,
        queue,
        "alone",
        messages,
        producers,
        Arc::clone(&committed),
    )
    .await;
    let elapsed = started.elapsed();
    pool.get()
        .await
        .unwrap()
        .batch_execute("DELETE FROM idempotency_outbox")
        .await
        .unwrap();
    figures(messages, elapsed, vec![Duration::ZERO])
}

/// Through the outbox: producers commit one message per transaction; one listening relay
/// publishes; lag is COMMIT to delivery.
async fn through_outbox(
    pool: &Pool,
    database_url: &str,
    connection: &Connection,
    queue: &str,
    messages: usize,
    producers: usize,
) -> Figures {
    let relay = OutboxRelay::new(
        pool.clone(),
        RabbitPublisher::new(env("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2f")),
    )
    .listen(axum_idempotency::outbox::Listener::postgres(
        database_url.parse().unwrap(),
    ))
    .spawn();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let committed = Arc::new(Mutex::new(HashMap::with_capacity(messages)));
    let consumer = consume(connection, queue, messages);
    let started = Instant::now();
    let produce = produce(
        pool,
        queue,
        "outbox",
        messages,
        producers,
        Arc::clone(&committed),
    );
    let ((), arrived) = tokio::join!(produce, consumer);
    let elapsed = started.elapsed();
    relay.shutdown().await;
    let committed = committed.lock().unwrap();
    let lags = arrived
        .iter()
        .map(|(id, at)| at.saturating_duration_since(committed[id]))
        .collect();
    figures(messages, elapsed, lags)
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let messages = flag(&args, "--messages", 5000);
    let producers = flag(&args, "--producers", 8);
    let database_url = env(
        "DATABASE_URL",
        "postgres://postgres@127.0.0.1:5432/postgres",
    );
    let amqp_url = env("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2f");

    let schema = format!("axi_bench_outbox_{}", std::process::id());
    let (admin, connection) = tokio_postgres::connect(&database_url, NoTls).await.unwrap();
    tokio::spawn(connection);
    admin
        .batch_execute(&format!("CREATE SCHEMA {schema}"))
        .await
        .unwrap();
    let mut config: tokio_postgres::Config = database_url.parse().unwrap();
    config.options(format!("-c search_path={schema}"));
    let pool = Pool::builder(Manager::from_config(
        config,
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    ))
    .max_size(producers + 4)
    .build()
    .unwrap();
    axum_idempotency::migrate(&pool).await.unwrap();

    let broker = Connection::connect(&amqp_url, ConnectionProperties::default())
        .await
        .expect("RabbitMQ at AMQP_URL");
    let queue = format!("bench-outbox-{}", std::process::id());
    let channel = broker.create_channel().await.unwrap();
    channel
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

    println!("{messages} messages, {producers} producers, one relay (batch 100, LISTEN)");
    // The producers first, before the broker has any disk work of its own.
    let committing = producers_alone(&pool, &queue, messages, producers).await;
    let alone = broker_alone(&broker, &queue, messages, producers).await;
    consume(&broker, &queue, messages).await; // drain the baseline's messages
    let outbox = through_outbox(&pool, &database_url, &broker, &queue, messages, producers).await;

    println!();
    println!("| path | msg/s | lag p50 | lag p99 | × broker alone | × producers alone |");
    println!("|---|---|---|---|---|---|");
    for (name, f, lag) in [
        (
            "broker alone (publish with confirm, no database)",
            &alone,
            true,
        ),
        (
            "producers alone (enqueue + COMMIT, no relay)",
            &committing,
            false,
        ),
        ("through the outbox (COMMIT → delivery)", &outbox, true),
    ] {
        let ms = |d: Duration| {
            if lag {
                format!("{:.1} ms", d.as_secs_f64() * 1000.0)
            } else {
                "—".to_owned()
            }
        };
        println!(
            "| {name} | {:.0} | {} | {} | {:.2} | {:.2} |",
            f.per_second,
            ms(f.p50),
            ms(f.p99),
            f.per_second / alone.per_second,
            f.per_second / committing.per_second
        );
    }

    channel
        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
        .await
        .unwrap();
    pool.close();
    admin
        .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await
        .unwrap();
}
