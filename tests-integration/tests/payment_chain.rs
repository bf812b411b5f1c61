//! The coupon story end to end: the orders example pays orders and announces each payment
//! through its outbox and RabbitMQ; the coupon consumer grants one coupon per payment
//! through its Inbox. Clients retry and pay twice, both processes are killed mid-run, and
//! every paid order still ends with exactly one coupon.
//!
//! Runs with both services on PostgreSQL (`DATABASE_URL`) and on MySQL/MariaDB (`MYSQL_URL`,
//! feature `mysql`), each when its URL is set. Needs RabbitMQ at `AMQP_URL`; without one it
//! says so and passes, except under CI.

#![cfg(feature = "rabbitmq")]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::RwLock;

const ORDERS: i64 = 500;
const PAID: i64 = 400;
const CLIENTS: i64 = 8;

/// One HTTP/1.1 exchange, or the I/O error of a server that went away.
async fn exchange(addr: &str, request: &str) -> std::io::Result<(u16, String)> {
    let mut stream = TcpStream::connect(addr).await?;
    stream.write_all(request.as_bytes()).await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    let status = response
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other("no status line"))?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}

/// A client that keeps its key: retries a lost answer, a 409 and a 503 until it gets a
/// final one.
async fn until_final(addr: &RwLock<String>, request: &str, retries: &AtomicUsize) -> (u16, String) {
    for _ in 0..600 {
        let current = addr.read().await.clone();
        match exchange(&current, request).await {
            Ok((409 | 503, _)) | Err(_) => {
                retries.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Ok(answer) => return answer,
        }
    }
    panic!("no final answer for {request}");
}

fn create(user: i64, key: &str) -> String {
    let body = format!(r#"{{"user_id": {user}, "amount": 100}}"#);
    format!(
        "POST /orders HTTP/1.1\r\nhost: x\r\nconnection: close\r\nidempotency-key: {key}\r\n\
         x-user-id: {user}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
}

fn pay(user: i64, order_no: &str, key: &str) -> String {
    format!(
        "POST /orders/{order_no}/pay HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\
         idempotency-key: {key}\r\nx-user-id: {user}\r\ncontent-length: 0\r\n\r\n"
    )
}

/// The database both services share, and the checks the test runs on it.
enum ChainDb {
    Postgres(TestDb),
    #[cfg(feature = "mysql")]
    MySql(common::mysql::MySqlDb),
}

impl ChainDb {
    /// The `DATABASE_URL` both services get.
    fn url(&self) -> String {
        match self {
            Self::Postgres(db) => schema_url(&db.schema),
            #[cfg(feature = "mysql")]
            Self::MySql(db) => format!("{}/{}", common::mysql::mysql_url(), db.name),
        }
    }

    /// The first column of the first row of `sql`, a count; `{s}` is the schema or database.
    async fn count(&self, sql: &str) -> i64 {
        match self {
            Self::Postgres(db) => db
                .admin
                .query_one(&sql.replace("{s}", &db.schema), &[])
                .await
                .unwrap()
                .get(0),
            #[cfg(feature = "mysql")]
            Self::MySql(db) => {
                sqlx::query_scalar(sqlx::AssertSqlSafe(sql.replace("{s}", &db.name)))
                    .fetch_one(&db.admin)
                    .await
                    .unwrap()
            }
        }
    }

    /// Every order's user, status and number of coupons.
    async fn orders_and_coupons(&self) -> Vec<(i64, String, i64)> {
        let sql = "SELECT o.user_id, o.status, count(c.id) FROM {s}.orders o \
                   LEFT JOIN {s}.coupon_account c ON c.user_id = o.user_id \
                   GROUP BY o.user_id, o.status";
        match self {
            Self::Postgres(db) => db
                .admin
                .query(&sql.replace("{s}", &db.schema), &[])
                .await
                .unwrap()
                .iter()
                .map(|row| (row.get(0), row.get(1), row.get(2)))
                .collect(),
            #[cfg(feature = "mysql")]
            Self::MySql(db) => sqlx::query_as(sqlx::AssertSqlSafe(sql.replace("{s}", &db.name)))
                .fetch_all(&db.admin)
                .await
                .unwrap(),
        }
    }
}

async fn start_consumer(db: &ChainDb, queue: &str) -> tokio::process::Child {
    start_coupon_consumer(&db.url(), queue).await
}

async fn sigkill(child: &mut tokio::process::Child) {
    child.start_kill().unwrap();
    child.wait().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_paid_order_gets_one_coupon_through_kills_and_duplicates() {
    if !common::Database::Postgres.configured() || !rabbitmq_up().await {
        return;
    }
    payment_chain(ChainDb::Postgres(TestDb::bare(1).await)).await;
}

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_paid_order_gets_one_coupon_through_kills_and_duplicates_on_mysql() {
    if !common::Database::MySql.configured() || !rabbitmq_up().await {
        return;
    }
    payment_chain(ChainDb::MySql(common::mysql::MySqlDb::bare(1).await)).await;
}

/// Whether RabbitMQ answers at `AMQP_URL`; under CI it must.
async fn rabbitmq_up() -> bool {
    if lapin::Connection::connect(&amqp_url(), lapin::ConnectionProperties::default())
        .await
        .is_err()
    {
        assert!(std::env::var_os("CI").is_none(), "no RabbitMQ at AMQP_URL");
        eprintln!("skipped: no RabbitMQ at {}", amqp_url());
        return false;
    }
    true
}

async fn payment_chain(db: ChainDb) {
    let queue = unique_name("payment-succeeded");
    let orders_env = [
        ("DATABASE_URL", db.url()),
        ("AMQP_URL", amqp_url()),
        ("PAYMENTS_QUEUE", queue.clone()),
    ];
    let orders_env: Vec<(&str, &str)> = orders_env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let (orders, addr) = start_example("orders", &orders_env).await;
    let mut consumer = start_consumer(&db, &queue).await;
    let addr = Arc::new(RwLock::new(addr));
    let retries = Arc::new(AtomicUsize::new(0));
    let duplicate_pays = Arc::new(AtomicUsize::new(0));
    let progress = Arc::new(AtomicUsize::new(0));

    let clients: Vec<_> = (0..CLIENTS)
        .map(|client| {
            let (addr, retries, duplicate_pays, progress) = (
                Arc::clone(&addr),
                Arc::clone(&retries),
                Arc::clone(&duplicate_pays),
                Arc::clone(&progress),
            );
            tokio::spawn(async move {
                let mut paid = Vec::new();
                for i in (client..ORDERS).step_by(CLIENTS as usize) {
                    let user = 10_000 + i;
                    let (status, body) =
                        until_final(&addr, &create(user, &format!("create-{i}")), &retries).await;
                    assert_eq!(status, 201, "{body}");
                    let order: serde_json::Value = serde_json::from_str(&body).unwrap();
                    let order_no = order["order_no"].as_str().unwrap().to_owned();
                    progress.fetch_add(1, Ordering::Relaxed);
                    if i >= PAID {
                        continue;
                    }
                    // Each pay twice with its key (a retry after a lost answer), every third
                    // also under a second key (a second click).
                    let mut keys = vec![format!("pay-{i}"), format!("pay-{i}")];
                    if i % 3 == 0 {
                        keys.push(format!("pay-again-{i}"));
                    }
                    duplicate_pays.fetch_add(keys.len() - 1, Ordering::Relaxed);
                    for key in keys {
                        let (status, body) =
                            until_final(&addr, &pay(user, &order_no, &key), &retries).await;
                        assert_eq!(status, 200, "{body}");
                        assert!(body.contains("\"PAID\""), "{body}");
                    }
                    paid.push(user);
                }
                paid
            })
        })
        .collect();

    // Faults while the clients run: the orders process is SIGKILLed at a third and at two
    // thirds of the orders and restarted, the consumer once in between (deliveries it had
    // not acknowledged come again).
    let mut orders = orders;
    for (round, at) in [ORDERS / 3, 2 * ORDERS / 3].into_iter().enumerate() {
        while (progress.load(Ordering::Relaxed) as i64) < at {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        sigkill(&mut orders).await;
        if round == 0 {
            sigkill(&mut consumer).await;
        }
        let (restarted, new_addr) = start_example("orders", &orders_env).await;
        orders = restarted;
        *addr.write().await = new_addr;
        if round == 0 {
            consumer = start_consumer(&db, &queue).await;
        }
    }

    let mut paid_users = Vec::new();
    let mut unfinished = 0;
    for client in clients {
        // The kills must land while the clients still run.
        unfinished += usize::from(!client.is_finished());
        paid_users.extend(client.await.unwrap());
    }
    assert!(unfinished > 0, "the clients finished before the last kill");
    assert_eq!(paid_users.len() as i64, PAID);

    let coupons = async || db.count("SELECT count(*) FROM {s}.coupon_account").await;
    let mut last = 0;
    for _ in 0..600 {
        last = coupons().await;
        if last >= PAID {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(last, PAID, "every paid order's coupon arrived");
    // Let any straggler (a message published twice) arrive, then check again.
    tokio::time::sleep(Duration::from_millis(500)).await;

    let per_user = db.orders_and_coupons().await;
    assert_eq!(per_user.len() as i64, ORDERS, "one order per user");
    for (user, status, coupons) in per_user {
        let expected = if paid_users.contains(&user) { 1 } else { 0 };
        assert_eq!(
            (status.as_str(), coupons),
            (if expected == 1 { "PAID" } else { "NEW" }, expected),
            "user {user}"
        );
    }
    let mut pending: i64 = -1;
    for _ in 0..100 {
        pending = db
            .count("SELECT count(*) FROM {s}.idempotency_outbox WHERE state <> 'SENT'")
            .await;
        if pending == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(pending, 0, "the outbox ends with every message sent");
    eprintln!(
        "payment chain: {ORDERS} orders, {PAID} paid, {} duplicate pays, {} client retries, \
         orders killed twice, consumer once, {} coupons",
        duplicate_pays.load(Ordering::Relaxed),
        retries.load(Ordering::Relaxed),
        coupons().await
    );

    drop(orders);
    drop(consumer);
    let connection =
        lapin::Connection::connect(&amqp_url(), lapin::ConnectionProperties::default())
            .await
            .unwrap();
    connection
        .create_channel()
        .await
        .unwrap()
        .queue_delete(queue.as_str().into(), Default::default())
        .await
        .unwrap();
}
