//! The MySQL/MariaDB driver on a three-node MariaDB Galera cluster of its own
//! (`tests/galera/cluster.sh`: three `mariadbd` with galera-4 on loopback ports, never the
//! server on 3306). One cluster serves every scenario, in turn:
//!
//! 1. twins of one key sent at once to two instances of the orders example on two nodes:
//!    one order per key, answers 201 (fresh or replayed), 409 or 503 only, and every 201
//!    names the order that is in the database;
//! 2. a key committed on node 1 and retried on node 2 at once: a replay, every time (the
//!    claim reads causally on a Galera node);
//! 3. lease mode on two nodes at once: every fencing token unique;
//! 4. both instances under load while node 2 is SIGKILLed and rejoins by IST: every key ends
//!    with one order and one record, nothing lost;
//! 5. the coupon chain with a relay on each of two nodes (`SKIP LOCKED` is node-local, so a
//!    message may be published twice) and the consumer on the third: one coupon per paid
//!    order.
//!
//! Runs only with `AXUM_IDEMPOTENCY_GALERA_TESTS=1` (as root, with `mariadb-server` and
//! `galera-4` installed); otherwise it says so and passes.

#![cfg(all(feature = "mysql", feature = "rabbitmq"))]

mod common;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::http::StatusCode;
use axum::routing::post;
use axum_idempotency::{IdempotencyLayer, IdempotentLease};
use common::*;
use sqlx::{Executor, MySqlPool};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn enabled() -> bool {
    std::env::var("AXUM_IDEMPOTENCY_GALERA_TESTS").as_deref() == Ok("1")
}

/// The orders example's database, created on node 1 (the cluster replicates it).
const DB: &str = "galera_orders";

/// A three-node cluster in a temporary directory, stopped and removed on drop.
struct Cluster {
    script: PathBuf,
    dir: PathBuf,
    base: u16,
}

impl Cluster {
    fn start() -> Self {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/galera/cluster.sh");
        let out = std::process::Command::new("mktemp")
            .args(["-d", "/tmp/axi-galera.XXXXXX"])
            .output()
            .unwrap();
        assert!(out.status.success(), "mktemp failed");
        let dir = PathBuf::from(String::from_utf8(out.stdout).unwrap().trim());
        // The servers run as the mysql user, which must reach their directories.
        std::process::Command::new("chmod")
            .args(["755", dir.to_str().unwrap()])
            .status()
            .unwrap();
        let base = free_base();
        let cluster = Self { script, dir, base };
        let started = Instant::now();
        cluster.run(&["start", &base.to_string()]);
        println!(
            "cluster started in {:.1} s",
            started.elapsed().as_secs_f64()
        );
        cluster
    }

    fn run(&self, args: &[&str]) {
        let mut all = vec![args[0], self.dir.to_str().unwrap()];
        all.extend(&args[1..]);
        let out = std::process::Command::new(&self.script)
            .args(&all)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "cluster.sh {}: {}{}",
            all.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    async fn run_async(&self, args: &[&str]) {
        let mut all = vec![args[0].to_owned(), self.dir.to_str().unwrap().to_owned()];
        all.extend(args[1..].iter().map(|a| (*a).to_owned()));
        let out = tokio::process::Command::new(&self.script)
            .args(&all)
            .output()
            .await
            .unwrap();
        assert!(
            out.status.success(),
            "cluster.sh {}: {}",
            all.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Node `n`'s server URL (1..=3).
    fn server(&self, n: u16) -> String {
        format!("mysql://root@127.0.0.1:{}", self.base + n - 1)
    }

    fn url(&self, n: u16) -> String {
        format!("{}/{DB}", self.server(n))
    }

    async fn pool(&self, n: u16, max: u32) -> MySqlPool {
        sqlx::mysql::MySqlPoolOptions::new()
            .max_connections(max)
            .acquire_timeout(Duration::from_secs(5))
            .connect(&self.url(n))
            .await
            .unwrap()
    }

    /// A connection to node `n` whose reads see everything the cluster committed.
    async fn reader(&self, n: u16) -> MySqlPool {
        sqlx::mysql::MySqlPoolOptions::new()
            .max_connections(2)
            .after_connect(|conn, _| {
                Box::pin(async move {
                    conn.execute("SET SESSION wsrep_sync_wait = 1").await?;
                    Ok(())
                })
            })
            .connect(&self.url(n))
            .await
            .unwrap()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = std::process::Command::new(&self.script)
            .args(["stop", self.dir.to_str().unwrap()])
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A base port whose twelve ports (SQL, group, IST, SST of three nodes) are free.
fn free_base() -> u16 {
    let offsets = [0, 1, 2, 11, 12, 13, 21, 22, 23, 31, 32, 33];
    let seed = std::process::id() as u16;
    for attempt in 0..200u16 {
        let base = 21_000 + (seed.wrapping_add(attempt * 97) % 400) * 50;
        if offsets
            .iter()
            .all(|o| std::net::TcpListener::bind(("127.0.0.1", base + o)).is_ok())
        {
            return base;
        }
    }
    panic!("no free ports for the cluster");
}

/// One HTTP/1.1 exchange: status, `Idempotent-Replayed`, body.
async fn exchange(addr: &str, request: &str) -> std::io::Result<(u16, bool, String)> {
    let mut stream = TcpStream::connect(addr).await?;
    stream.write_all(request.as_bytes()).await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    let status = response
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other("no status line"))?;
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let replayed = head
        .to_ascii_lowercase()
        .contains("idempotent-replayed: true");
    Ok((status, replayed, body.to_owned()))
}

fn create(user: i64, amount: i64, key: &str) -> String {
    let body = format!(r#"{{"user_id": {user}, "amount": {amount}}}"#);
    format!(
        "POST /orders HTTP/1.1\r\nhost: x\r\nconnection: close\r\nidempotency-key: {key}\r\n\
         x-user-id: {user}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
}

fn order_no(body: &str) -> String {
    let order: serde_json::Value = serde_json::from_str(body).unwrap();
    order["order_no"].as_str().unwrap().to_owned()
}

/// The orders example on node `n`, its address and its log.
async fn orders_on(
    cluster: &Cluster,
    n: u16,
    extra: &[(&str, &str)],
) -> (tokio::process::Child, String) {
    let (child, addr, _log) = orders_logged(cluster, n, extra).await;
    (child, addr)
}

/// [`orders_on`], with the instance's log.
async fn orders_logged(
    cluster: &Cluster,
    n: u16,
    extra: &[(&str, &str)],
) -> (tokio::process::Child, String, Arc<std::sync::Mutex<String>>) {
    let url = cluster.url(n);
    let mut env = vec![("DATABASE_URL", url.as_str())];
    env.extend_from_slice(extra);
    start_example_logged("orders", &env).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn galera_cluster() {
    if !enabled() {
        eprintln!("skipped: set AXUM_IDEMPOTENCY_GALERA_TESTS=1 to run the Galera tests");
        return;
    }
    let cluster = Cluster::start();
    let admin = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(1)
        .connect(&cluster.server(1))
        .await
        .unwrap();
    admin
        .execute(sqlx::AssertSqlSafe(format!("CREATE DATABASE {DB}")))
        .await
        .unwrap();
    // Each instance migrates at start (the second finds the tables).
    let (_a, a, log_a) = orders_logged(&cluster, 1, &[]).await;
    let (_b, b, log_b) = orders_logged(&cluster, 2, &[]).await;
    let reader = cluster.reader(3).await;

    twins_across_nodes(&a, &b, &reader).await;
    let caught: usize = [&log_a, &log_b]
        .iter()
        .map(|log| {
            log.lock()
                .unwrap()
                .matches("twin on another Galera node won")
                .count()
        })
        .sum();
    println!("twins across nodes: {caught} commits answered OK and caught by the read-back");
    replays_across_nodes(&a, &b).await;
    fencing_tokens_across_nodes(&cluster).await;
    drop((_a, _b));
    node_killed_under_load(&cluster, &reader).await;
    coupon_chain_across_nodes(&cluster, &reader).await;
}

/// The orders of `amount`, and whether each 201 named one of them.
async fn orders_of(reader: &MySqlPool, amount: i64) -> Vec<String> {
    sqlx::query_scalar("SELECT order_no FROM orders WHERE amount = ?")
        .bind(amount)
        .fetch_all(reader)
        .await
        .unwrap()
}

/// Scenario 1: 100 keys, each sent at the same instant to the instance on node 1 and the
/// one on node 2.
async fn twins_across_nodes(a: &str, b: &str, reader: &MySqlPool) {
    const KEYS: i64 = 100;
    let mut answers: HashMap<u16, usize> = HashMap::new();
    let mut fresh = 0;
    let mut named = Vec::new();
    for i in 0..KEYS {
        let (amount, key) = (1_000 + i, format!("twin-{i}"));
        let request = create(7, amount, &key);
        let (x, y) = tokio::join!(exchange(a, &request), exchange(b, &request));
        let (x, y) = (x.unwrap(), y.unwrap());
        for (status, replayed, body) in [x, y] {
            *answers.entry(status).or_default() += 1;
            assert!(
                matches!(status, 201 | 409 | 503),
                "twin {key}: {status} {body}"
            );
            if status == 201 {
                fresh += usize::from(!replayed);
                named.push((amount, order_no(&body)));
            }
        }
    }
    for i in 0..KEYS {
        let orders = orders_of(reader, 1_000 + i).await;
        assert!(orders.len() <= 1, "key twin-{i}: {} orders", orders.len());
    }
    for (amount, order) in &named {
        let orders = orders_of(reader, *amount).await;
        if orders.as_slice() != std::slice::from_ref(order) {
            let records: Vec<(Vec<u8>, String)> =
                sqlx::query_as("SELECT body, state FROM idempotency_records WHERE body LIKE ?")
                    .bind(format!("%\"amount\":{amount}%"))
                    .fetch_all(reader)
                    .await
                    .unwrap();
            for (body, state) in records {
                println!("record: {state} {}", String::from_utf8_lossy(&body));
            }
            let all: Vec<(String, i64)> =
                sqlx::query_as("SELECT order_no, amount FROM orders ORDER BY order_no")
                    .fetch_all(reader)
                    .await
                    .unwrap();
            println!("orders: {} rows", all.len());
        }
        assert_eq!(
            orders.as_slice(),
            std::slice::from_ref(order),
            "a 201 named {order}, which is not the order in the database"
        );
    }
    // The retries: each key ends with exactly its one order.
    for i in 0..KEYS {
        let request = create(7, 1_000 + i, &format!("twin-{i}"));
        let mut last = 0;
        for attempt in 0..100 {
            let addr = if attempt % 2 == 0 { a } else { b };
            let (status, _, body) = exchange(addr, &request).await.unwrap();
            last = status;
            if status == 201 {
                assert_eq!(orders_of(reader, 1_000 + i).await, [order_no(&body)]);
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(last, 201, "key twin-{i} never answered 201");
    }
    let mut counts: Vec<_> = answers.into_iter().collect();
    counts.sort();
    println!(
        "twins across nodes: {KEYS} keys, answers {counts:?}, {fresh} fresh 201s, every 201 names \
         the order in the database, one order per key"
    );
}

/// Scenario 2: 200 keys, each committed through node 1 and sent to node 2 the moment its
/// answer arrives.
async fn replays_across_nodes(a: &str, b: &str) {
    const KEYS: usize = 200;
    let workers: Vec<_> = (0..8)
        .map(|w| {
            let (a, b) = (a.to_owned(), b.to_owned());
            tokio::spawn(async move {
                let mut replays = 0;
                for i in (w..KEYS).step_by(8) {
                    let request = create(8, 5_000 + i as i64, &format!("across-{i}"));
                    let (status, _, first) = exchange(&a, &request).await.unwrap();
                    assert_eq!(status, 201, "{first}");
                    let (status, replayed, again) = exchange(&b, &request).await.unwrap();
                    assert_eq!(
                        (status, replayed),
                        (201, true),
                        "key across-{i} on node 2: {again}"
                    );
                    assert_eq!(order_no(&again), order_no(&first));
                    replays += 1;
                }
                replays
            })
        })
        .collect();
    let mut replays = 0;
    for worker in workers {
        replays += worker.await.unwrap();
    }
    assert_eq!(replays, KEYS);
    println!(
        "replays across nodes: {KEYS} keys committed on node 1, all {KEYS} replayed on node 2"
    );
}

/// Scenario 3: lease mode through node 1 and node 2 at once; every token drawn is unique.
async fn fencing_tokens_across_nodes(cluster: &Cluster) {
    const PER_NODE: usize = 100;
    let tokens = Arc::new(std::sync::Mutex::new(Vec::new()));
    let unavailable = Arc::new(AtomicUsize::new(0));
    let mut apps = Vec::new();
    for n in [1, 2] {
        let pool = cluster.pool(n, 8).await;
        let tokens = tokens.clone();
        let app = Router::new()
            .route(
                "/lease",
                post(move |lease: IdempotentLease| {
                    let tokens = tokens.clone();
                    async move {
                        tokens.lock().unwrap().push(lease.fencing_token());
                        StatusCode::CREATED
                    }
                }),
            )
            .layer(IdempotencyLayer::new(pool));
        apps.push(app);
    }
    let runs: Vec<_> = apps
        .into_iter()
        .enumerate()
        .map(|(node, app)| {
            let unavailable = unavailable.clone();
            tokio::spawn(async move {
                for i in 0..PER_NODE {
                    let key = format!("lease-{node}-{i}");
                    for _ in 0..100 {
                        let answer = send(
                            &app,
                            post_json("/lease", Some(&key), &serde_json::json!({})),
                        )
                        .await;
                        match answer.status {
                            StatusCode::CREATED => break,
                            StatusCode::SERVICE_UNAVAILABLE => {
                                unavailable.fetch_add(1, Ordering::Relaxed);
                                tokio::time::sleep(Duration::from_millis(20)).await;
                            }
                            other => panic!("lease {key}: {other} {:?}", answer.body),
                        }
                    }
                }
            })
        })
        .collect();
    for run in runs {
        run.await.unwrap();
    }
    let tokens = tokens.lock().unwrap().clone();
    let unique: HashSet<i64> = tokens.iter().copied().collect();
    assert_eq!(tokens.len(), 2 * PER_NODE, "every lease acquired");
    assert_eq!(
        unique.len(),
        tokens.len(),
        "fencing tokens repeated across nodes"
    );
    println!(
        "fencing tokens: {} leases on two nodes at once, {} unique tokens, {} answers 503 \
         (the counter's row conflicting at certification) retried",
        tokens.len(),
        unique.len(),
        unavailable.load(Ordering::Relaxed)
    );
}

/// Scenario 4: eight clients over both instances while node 2 is killed and rejoins.
async fn node_killed_under_load(cluster: &Cluster, reader: &MySqlPool) {
    const KEYS: usize = 1_200;
    const WORKERS: usize = 8;
    let (_a, a) = orders_on(cluster, 1, &[]).await;
    let (_b, b) = orders_on(cluster, 2, &[]).await;
    let done = Arc::new(AtomicUsize::new(0));
    let unavailable = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let workers: Vec<_> = (0..WORKERS)
        .map(|w| {
            let (a, b, done, unavailable) =
                (a.clone(), b.clone(), done.clone(), unavailable.clone());
            tokio::spawn(async move {
                let mut answers = Vec::new();
                let mut slowest = Duration::ZERO;
                for i in (w..KEYS).step_by(WORKERS) {
                    let request = create(9, 10_000 + i as i64, &format!("kill-{i}"));
                    let mut first: Option<String> = None;
                    // Half the clients start on the instance whose node dies; a client that
                    // meets an error tries the other instance with the same key.
                    let mut on_b = w % 2 == 0;
                    for attempt in 0.. {
                        assert!(attempt < 1_200, "key kill-{i} unanswered");
                        let addr = if on_b { &b } else { &a };
                        let sent = Instant::now();
                        let answer =
                            tokio::time::timeout(Duration::from_secs(15), exchange(addr, &request))
                                .await;
                        slowest = slowest.max(sent.elapsed());
                        match answer {
                            Ok(Ok((201, _, body))) => {
                                let order = order_no(&body);
                                if let Some(first) = &first {
                                    assert_eq!(first, &order);
                                }
                                first = Some(order);
                                break;
                            }
                            Ok(Ok((status, _, body))) => {
                                assert!(
                                    matches!(status, 409 | 503),
                                    "key kill-{i}: {status} {body}"
                                );
                                unavailable.fetch_add(1, Ordering::Relaxed);
                                on_b = !on_b;
                            }
                            _ => on_b = !on_b,
                        }
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    answers.push((10_000 + i as i64, first.unwrap()));
                    done.fetch_add(1, Ordering::Relaxed);
                }
                (answers, slowest)
            })
        })
        .collect();
    while done.load(Ordering::Relaxed) < KEYS / 4 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let killed_at = done.load(Ordering::Relaxed);
    cluster.run_async(&["kill", "2"]).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let rejoin = Instant::now();
    cluster.run_async(&["restart", "2"]).await;
    let rejoined_in = rejoin.elapsed();
    let rejoined_at = done.load(Ordering::Relaxed);
    let mut answers = Vec::new();
    let mut slowest = Duration::ZERO;
    let mut unfinished = 0;
    for worker in workers {
        unfinished += usize::from(!worker.is_finished());
        let (mine, s) = worker.await.unwrap();
        answers.extend(mine);
        slowest = slowest.max(s);
    }
    assert!(
        unfinished > 0,
        "the clients finished before the node came back"
    );
    assert_eq!(answers.len(), KEYS);
    let mut duplicates = 0;
    let mut lost = 0;
    for (amount, order) in &answers {
        let orders = orders_of(reader, *amount).await;
        duplicates += orders.len().saturating_sub(1);
        lost += usize::from(!orders.contains(order));
    }
    let records: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM idempotency_records WHERE body LIKE '%\"user_id\":9,%' \
         AND state = 'SUCCESS'",
    )
    .fetch_one(reader)
    .await
    .unwrap();
    // Every node agrees once node 2 is back.
    for n in [1, 2] {
        let node = cluster.reader(n).await;
        let count: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM orders WHERE amount >= 10000")
            .fetch_one(&node)
            .await
            .unwrap();
        assert_eq!(count, KEYS as i64, "node {n} disagrees");
    }
    println!(
        "node 2 SIGKILLed after {killed_at} of {KEYS} keys, rejoined (IST) in {:.1} s with \
         {rejoined_at} done: {KEYS} keys, {duplicates} duplicates, {lost} lost, {records} \
         records, {} answers 409/503 retried, slowest answer {:.2} s, whole run {:.1} s",
        rejoined_in.as_secs_f64(),
        unavailable.load(Ordering::Relaxed),
        slowest.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    assert_eq!((duplicates, lost), (0, 0));
    assert_eq!(records, KEYS as i64, "one record per key");
}

/// Scenario 5: orders paid through both instances, each with a relay on its own node; the
/// coupon consumer on node 3 grants one coupon per paid order.
async fn coupon_chain_across_nodes(cluster: &Cluster, reader: &MySqlPool) {
    const ORDERS: i64 = 150;
    let queue = unique_name("galera-payments");
    let amqp = amqp_url();
    let relay = [
        ("AMQP_URL", amqp.as_str()),
        ("PAYMENTS_QUEUE", queue.as_str()),
    ];
    let (_a, a) = orders_on(cluster, 1, &relay).await;
    let (_b, b) = orders_on(cluster, 2, &relay).await;
    let mut consumer = start_coupon_consumer(&cluster.url(3), &queue).await;

    for i in 0..ORDERS {
        let user = 50_000 + i;
        let (status, _, body) = exchange(&a, &create(user, 20_000 + i, &format!("chain-{i}")))
            .await
            .unwrap();
        assert_eq!(status, 201, "{body}");
        let order = order_no(&body);
        // Paid through both nodes at once, under one key: one payment, one message.
        let pay = format!(
            "POST /orders/{order}/pay HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\
             idempotency-key: pay-{i}\r\nx-user-id: {user}\r\ncontent-length: 0\r\n\r\n"
        );
        let mut paid = false;
        for _ in 0..100 {
            let (x, y) = tokio::join!(exchange(&a, &pay), exchange(&b, &pay));
            for (status, _, body) in [x.unwrap(), y.unwrap()] {
                assert!(
                    matches!(status, 200 | 409 | 503),
                    "pay {order}: {status} {body}"
                );
                paid |= status == 200;
            }
            if paid {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(paid, "order {order} never paid");
    }
    let coupons = async || -> i64 {
        sqlx::query_scalar("SELECT COUNT(*) FROM coupon_account WHERE user_id >= 50000")
            .fetch_one(reader)
            .await
            .unwrap_or(0)
    };
    let mut last = 0;
    for _ in 0..600 {
        last = coupons().await;
        if last >= ORDERS {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let per_user: Vec<(i64, i64)> = sqlx::query_as(
        "SELECT user_id, CAST(COUNT(*) AS SIGNED) FROM coupon_account WHERE user_id >= 50000 \
         GROUP BY user_id",
    )
    .fetch_all(reader)
    .await
    .unwrap();
    let messages: i64 =
        sqlx::query_scalar("SELECT CAST(COUNT(*) AS SIGNED) FROM idempotency_outbox")
            .fetch_one(reader)
            .await
            .unwrap();
    println!(
        "coupon chain: {ORDERS} orders paid through two nodes at once, {messages} outbox \
         messages, {} users with a coupon (last count {last})",
        per_user.len()
    );
    assert_eq!(
        per_user.len() as i64,
        ORDERS,
        "a coupon for every paid order"
    );
    assert!(
        per_user.iter().all(|(_, n)| *n == 1),
        "one coupon per paid order: {per_user:?}"
    );
    consumer.start_kill().ok();
}
