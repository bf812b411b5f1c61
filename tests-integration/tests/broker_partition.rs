//! Silent link cuts around the message path: the outbox relay and the Inbox consumer against
//! a RabbitMQ node cut off by `iptables -j DROP` in its network namespace
//! (`tests/partition/rabbit.sh`), and the consumer against a PostgreSQL cut off the same way
//! (`tests/partition/netns.sh`). Nothing is lost, nothing takes effect twice, duplicates are
//! absorbed by the Inbox and counted, and no message is dead-lettered for the cut.
//!
//! Opt-in like `tests/partition.rs`: `AXUM_IDEMPOTENCY_PARTITION_TESTS=1 cargo test
//! --all-features --test broker_partition` (`.ci/run` sets it). Needs root, iproute2,
//! iptables, PostgreSQL's binaries and the rabbitmq-server package.

#![cfg(feature = "rabbitmq")]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum_idempotency::Inbox;
use axum_idempotency::inbox::rabbit::Consumer;
use axum_idempotency::outbox::{OutboxMessage, OutboxRelay, RabbitPublisher};
use common::recorder::{Capture, Recorder};
use common::*;
use lapin::options::{BasicPublishOptions, QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Connection, ConnectionProperties};

/// The AMQP heartbeat the relay and the consumer ask for: a silent broker is noticed after
/// about two of them.
const HEARTBEAT: &str = "heartbeat=2";

/// The tests take turns: two of them use the PostgreSQL namespace.
static NAMESPACE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// How long each link stays cut.
const CUT: Duration = Duration::from_secs(20);

fn opted_in() -> bool {
    let opted_in = std::env::var_os("AXUM_IDEMPOTENCY_PARTITION_TESTS").is_some();
    if !opted_in {
        eprintln!(
            "skipped: set AXUM_IDEMPOTENCY_PARTITION_TESTS=1 (root, iproute2, iptables, \
             rabbitmq-server)"
        );
    }
    opted_in
}

/// Every counter the crate emits, from every thread (the relay and the consumer run on the
/// runtime's workers).
fn metrics() -> Arc<Capture> {
    static CAPTURE: std::sync::OnceLock<Arc<Capture>> = std::sync::OnceLock::new();
    CAPTURE
        .get_or_init(|| {
            let capture = Arc::new(Capture::default());
            metrics::set_global_recorder(Recorder(Arc::clone(&capture)))
                .expect("the only recorder of this test binary");
            capture
        })
        .clone()
}

/// One of the two namespace scripts: `rabbit.sh` (a broker) or `netns.sh` (a PostgreSQL).
struct Namespace {
    script: &'static str,
    url: String,
}

impl Namespace {
    fn run(script: &str, action: &str) -> String {
        let path = format!("{}/tests/partition/{script}", env!("CARGO_MANIFEST_DIR"));
        let output = std::process::Command::new("bash")
            .args([path.as_str(), action])
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{script} {action}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).unwrap()
    }

    fn up(script: &'static str) -> Self {
        let url = Self::run(script, "up").trim().to_owned();
        Self { script, url }
    }

    fn cut(&self) {
        Self::run(self.script, "cut");
    }

    fn heal(&self) {
        Self::run(self.script, "heal");
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        Self::run(self.script, "down");
    }
}

/// `url` with the heartbeat the relay and the consumer use.
fn with_heartbeat(url: &str) -> String {
    format!("{url}?{HEARTBEAT}")
}

/// A quorum queue with a small delivery limit, dead-lettering to a queue of its own:
/// a message requeued for the cut would land in the dead-letter queue.
async fn declare_queues(connection: &Connection, queue: &str) -> String {
    let mut arguments = FieldTable::default();
    arguments.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
    arguments.insert("x-delivery-limit".into(), AMQPValue::LongLongInt(2));
    common::rabbit::declare_dead_lettered(connection, queue, arguments).await
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
    let _ = channel.close(200, "counted".into()).await;
    declared.message_count()
}

/// Polls `check` every 100 ms until it holds; panics after `within`.
async fn within(what: &str, within: Duration, mut check: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn counter(capture: &Capture, key: &str) -> f64 {
    capture.values().get(key).copied().unwrap_or(0.0)
}

/// The relay publishes to a broker whose link is cut for 20 s while producers keep
/// committing messages, and the consumer takes them into the Inbox: after the heal both
/// reconnect, every message is marked sent and takes effect exactly once, nothing is
/// dead-lettered, and what was published or delivered twice is answered duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_and_the_consumer_ride_out_a_silent_broker_cut() {
    if !opted_in() || !Database::Postgres.configured() {
        return;
    }
    let capture = metrics();
    let broker = Namespace::up("rabbit.sh");
    let amqp = with_heartbeat(&broker.url);
    let db = TestDb::new(8).await;
    db.admin
        .batch_execute(&format!(
            "CREATE TABLE {}.grants (message_id text NOT NULL)",
            db.schema
        ))
        .await
        .unwrap();
    let queue = unique_name("cut");
    let setup = Connection::connect(&broker.url, ConnectionProperties::default())
        .await
        .unwrap();
    let dead = declare_queues(&setup, &queue).await;
    drop(setup);

    let relay = OutboxRelay::new(db.pool.clone(), RabbitPublisher::new(amqp.clone()))
        .poll_interval(Duration::from_millis(50))
        .max_backoff(Duration::from_millis(500))
        .publish_timeout(Duration::from_secs(5))
        .spawn();
    let inbox = Inbox::new(db.pool.clone(), "broker-cut");
    let consumer = Consumer::new(inbox, [amqp.clone()], &queue)
        .max_backoff(Duration::from_millis(500))
        .start(|tx, message| async move {
            tx.execute(
                "INSERT INTO grants (message_id) VALUES ($1)",
                &[&message.id()],
            )
            .await?;
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
        })
        .await
        .unwrap();

    // Producers commit a message every 20 ms for the whole run: before, during and after
    // the cut.
    let produced = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let producing = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let producer = {
        let (pool, queue) = (db.pool.clone(), queue.clone());
        let (produced, producing) = (Arc::clone(&produced), Arc::clone(&producing));
        tokio::spawn(async move {
            let mut i = 0;
            while producing.load(std::sync::atomic::Ordering::SeqCst) {
                let message = OutboxMessage::new(&queue, i.to_string()).id(format!("m-{i}"));
                axum_idempotency::postgres::enqueue(&**pool.get().await.unwrap(), &message)
                    .await
                    .unwrap();
                i += 1;
                produced.store(i, std::sync::atomic::Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let granted = async || -> i64 { db.scalar("SELECT count(*) FROM grants").await };
    let sent = async || -> i64 {
        db.scalar("SELECT count(*) FROM idempotency_outbox WHERE state = 'SENT'")
            .await
    };
    within("the first grants", Duration::from_secs(20), async || {
        granted().await >= 50
    })
    .await;

    broker.cut();
    let cut_at = Instant::now();
    let granted_at_cut = granted().await;
    tokio::time::sleep(CUT).await;
    let (granted_during, sent_during) = (granted().await, sent().await);
    broker.heal();
    let healed_at = Instant::now();
    let produced_at_heal = produced.load(std::sync::atomic::Ordering::SeqCst) as i64;
    eprintln!(
        "cut {:?}: {} messages committed by then, {granted_at_cut} granted at the cut, \
         {granted_during} at its end, {sent_during} marked sent",
        cut_at.elapsed(),
        produced_at_heal
    );

    // After the heal: a message committed now is published and granted within seconds.
    let watermark = granted().await;
    within(
        "a grant after the heal",
        Duration::from_secs(30),
        async || granted().await > watermark,
    )
    .await;
    let first_grant = healed_at.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    producing.store(false, std::sync::atomic::Ordering::SeqCst);
    producer.await.unwrap();
    let produced = produced.load(std::sync::atomic::Ordering::SeqCst) as i64;
    within("every message sent", Duration::from_secs(60), async || {
        sent().await == produced
    })
    .await;
    within(
        "every message granted",
        Duration::from_secs(60),
        async || granted().await >= produced,
    )
    .await;
    let all_done = healed_at.elapsed();
    // Whatever is still in flight settles.
    tokio::time::sleep(Duration::from_secs(1)).await;
    relay.shutdown().await;
    consumer.shutdown().await;

    let distinct = db
        .scalar("SELECT count(DISTINCT message_id) FROM grants")
        .await;
    let grants = granted().await;
    let check = Connection::connect(&broker.url, ConnectionProperties::default())
        .await
        .unwrap();
    let (left, dead_lettered) = (depth(&check, &queue).await, depth(&check, &dead).await);
    let duplicates = counter(
        &capture,
        "idempotency_inbox_messages_total{outcome=duplicate}",
    );
    eprintln!(
        "after the heal: first grant {first_grant:?}, all {produced} messages sent and \
         granted {all_done:?}; {duplicates} duplicates answered by the Inbox; {left} left in \
         the queue, {dead_lettered} dead-lettered"
    );
    assert_eq!(grants, produced, "each message's work exactly once");
    assert_eq!(distinct, produced, "no message lost");
    assert_eq!(
        db.scalar("SELECT count(*) FROM inbox_messages").await,
        produced
    );
    assert_eq!(dead_lettered, 0, "nothing dead-lettered for the cut");
    assert_eq!(left, 0, "nothing left behind");
    let channel = check.create_channel().await.unwrap();
    for name in [&queue, &dead] {
        let _ = channel
            .queue_delete(name.as_str().into(), QueueDeleteOptions::default())
            .await;
    }
}

/// The consumer's database is cut off while messages arrive: it acknowledges nothing it
/// could not commit, keeps each message in hand (the quorum queue's delivery limit of 2 is
/// not spent on the cut), and after the heal each message takes effect once.
async fn consumer_across_a_database_cut(
    driver: &str,
    net: &Namespace,
    broker: &Connection,
    start: impl AsyncFnOnce(&str) -> axum_idempotency::inbox::rabbit::ConsumerHandle,
) {
    let queue = unique_name("dbcut");
    let dead = declare_queues(broker, &queue).await;
    let consumer = start(&queue).await;
    let channel = broker.create_channel().await.unwrap();
    let publish = async |from: usize, to: usize| {
        for i in from..to {
            channel
                .basic_publish(
                    "".into(),
                    queue.as_str().into(),
                    BasicPublishOptions::default(),
                    format!("{i}").as_bytes(),
                    BasicProperties::default()
                        .with_delivery_mode(2)
                        .with_message_id(format!("m-{i}").into()),
                )
                .await
                .unwrap()
                .await
                .unwrap();
        }
    };
    let count = async |sql: &str| -> i64 {
        connect(&net.url)
            .await
            .query_one(sql, &[])
            .await
            .unwrap()
            .get(0)
    };
    let granted = async || count("SELECT count(*) FROM grants").await;
    publish(0, 10).await;
    within(
        "the first ten granted",
        Duration::from_secs(20),
        async || granted().await == 10,
    )
    .await;

    net.cut();
    let cut_at = Instant::now();
    publish(10, 30).await;
    tokio::time::sleep(CUT).await;
    // Nothing acknowledged: the twenty are in the consumer's hand (prefetched) or queued.
    let waiting = depth(broker, &queue).await;
    net.heal();
    let healed_at = Instant::now();
    eprintln!(
        "{driver}: database cut {:?}: {waiting} messages ready in the queue, the rest in \
         the consumer's hand, none acknowledged",
        cut_at.elapsed()
    );
    within(
        "every message granted",
        Duration::from_secs(30),
        async || granted().await == 30,
    )
    .await;
    eprintln!(
        "{driver}: database cut: all 30 granted {:?} after the heal",
        healed_at.elapsed()
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    consumer.shutdown().await;
    assert_eq!(
        count("SELECT count(DISTINCT message_id) FROM grants").await,
        30,
        "{driver}: each message once"
    );
    assert_eq!(granted().await, 30, "{driver}: no message's work twice");
    assert_eq!(
        depth(broker, &queue).await,
        0,
        "{driver}: every message acknowledged"
    );
    assert_eq!(
        depth(broker, &dead).await,
        0,
        "{driver}: no message dead-lettered for the cut"
    );
    for name in [&queue, &dead] {
        let _ = channel
            .queue_delete(name.as_str().into(), QueueDeleteOptions::default())
            .await;
    }
}

/// The table the consumers' work writes, on the partitioned database.
async fn grants_table(net: &Namespace) {
    connect(&net.url)
        .await
        .batch_execute("CREATE TABLE grants (message_id text NOT NULL)")
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_consumer_acknowledges_nothing_during_a_database_cut() {
    if !opted_in() {
        return;
    }
    let Some(broker) = common::rabbit::connect().await else {
        return;
    };
    let _turn = NAMESPACE.lock().await;
    let net = Namespace::up("netns.sh");
    let pool = dead_peer_pool(&net.url, 4).await;
    grants_table(&net).await;
    let start = async |queue: &str| {
        Consumer::new(Inbox::new(pool.clone(), "db-cut"), [amqp_url()], queue)
            .max_backoff(Duration::from_millis(500))
            .start(|tx, message| async move {
                tx.execute(
                    "INSERT INTO grants (message_id) VALUES ($1)",
                    &[&message.id()],
                )
                .await?;
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
            })
            .await
            .unwrap()
    };
    consumer_across_a_database_cut("deadpool", &net, &broker, start).await;
}

/// The same on sqlx, whose connections set no TCP timeouts: the store's link bound and
/// its watch of the link while the work runs keep the consumer from waiting on a dead
/// connection.
#[cfg(feature = "sqlx")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_consumer_acknowledges_nothing_during_a_database_cut_on_sqlx() {
    if !opted_in() {
        return;
    }
    let Some(broker) = common::rabbit::connect().await else {
        return;
    };
    let _turn = NAMESPACE.lock().await;
    let net = Namespace::up("netns.sh");
    let pool = bounded_sqlx_pool(&net.url).await;
    grants_table(&net).await;
    let start = async |queue: &str| {
        Consumer::new(Inbox::new(pool.clone(), "db-cut"), [amqp_url()], queue)
            .max_backoff(Duration::from_millis(500))
            .start(
                |mut tx: axum_idempotency::sqlx::IdempotentTx, message| async move {
                    sqlx::query("INSERT INTO grants (message_id) VALUES ($1)")
                        .bind(message.id())
                        .execute(&mut *tx)
                        .await?;
                    Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
                },
            )
            .await
            .unwrap()
    };
    consumer_across_a_database_cut("sqlx", &net, &broker, start).await;
}
