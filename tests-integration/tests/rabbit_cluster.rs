//! The broker half of the chain through a RabbitMQ node failure: a three-node cluster of
//! its own (`tests/rabbit_cluster/cluster.sh`), a quorum queue, the orders example (its
//! outbox relay given the three nodes' URLs) and the coupon consumer example (the crate's
//! `inbox::rabbit::Consumer`) under load from eight clients that pay orders, some twice.
//!
//! Run 1 SIGKILLs the queue's leader node mid-run (the relay and the consumer are connected
//! to the other two) and restarts it; run 2 SIGKILLs the node the relay and the consumer are
//! connected to. Judged on the database afterwards: every paid order has exactly one
//! coupon, no unpaid one has any, the outbox has nothing pending, and the consumer's Inbox
//! recorded each message once. It prints the time from the kill to the first confirm of a
//! message enqueued after it, the re-election and reconnect times, and the duplicates the
//! Inbox absorbed.
//!
//! Runs only with `AXUM_IDEMPOTENCY_RABBIT_CLUSTER_TESTS=1` (as root or `rabbitmq`, with
//! `rabbitmq-server` installed; `.ci/run` sets it); otherwise it says so and passes. It
//! never touches the broker on port 5672.

#![cfg(feature = "rabbitmq")]

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use lapin::options::QueueDeclareOptions;
use lapin::types::{AMQPValue, FieldTable};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const CLIENTS: i64 = 8;
/// Each client's pause between two orders: load, with CPU left for three nodes.
const PACE: Duration = Duration::from_millis(20);

fn enabled() -> bool {
    std::env::var("AXUM_IDEMPOTENCY_RABBIT_CLUSTER_TESTS").as_deref() == Ok("1")
}

// ---------------------------------------------------------------------------------------
// The cluster

/// Three RabbitMQ nodes in a temporary directory, stopped and removed on drop.
struct Cluster {
    script: PathBuf,
    dir: PathBuf,
    amqp: [u16; 3],
}

/// A free loopback port outside the CLI tools' distribution range (35672-35682).
fn free_port(taken: &[u16]) -> u16 {
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if !(35672..=35682).contains(&port) && !taken.contains(&port) {
            return port;
        }
    }
}

impl Cluster {
    fn start() -> Self {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/rabbit_cluster/cluster.sh");
        let out = std::process::Command::new("mktemp")
            .args(["-d", "/tmp/axi-rabbit.XXXXXX"])
            .output()
            .unwrap();
        assert!(out.status.success(), "mktemp failed");
        let dir = PathBuf::from(String::from_utf8(out.stdout).unwrap().trim());
        let mut ports = Vec::new();
        for _ in 0..6 {
            let port = free_port(&ports);
            ports.push(port);
        }
        let cluster = Self {
            script,
            dir,
            amqp: [ports[0], ports[1], ports[2]],
        };
        let started = Instant::now();
        let args: Vec<String> = ports.iter().map(u16::to_string).collect();
        let mut all = vec!["start"];
        all.extend(args.iter().map(String::as_str));
        cluster
            .blocking(&all)
            .unwrap_or_else(|e| panic!("the cluster did not start: {e}"));
        println!(
            "cluster up in {:.1} s: nodes on :{}, :{}, :{}",
            started.elapsed().as_secs_f64(),
            ports[0],
            ports[1],
            ports[2]
        );
        cluster
    }

    fn blocking(&self, args: &[&str]) -> Result<String, String> {
        let out = std::process::Command::new(&self.script)
            .arg(args[0])
            .arg(&self.dir)
            .args(&args[1..])
            .output()
            .map_err(|e| format!("cluster.sh: {e}"))?;
        Self::result(args, out)
    }

    async fn run(&self, args: &[&str]) -> Result<String, String> {
        let out = tokio::process::Command::new(&self.script)
            .arg(args[0])
            .arg(&self.dir)
            .args(&args[1..])
            .kill_on_drop(true)
            .output()
            .await
            .map_err(|e| format!("cluster.sh: {e}"))?;
        Self::result(args, out)
    }

    fn result(args: &[&str], out: std::process::Output) -> Result<String, String> {
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(format!(
                "cluster.sh {}: {}{}",
                args.join(" "),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }

    /// Node `n`'s AMQP URL (1-based).
    fn url(&self, n: usize) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.amqp[n - 1])
    }

    /// The nodes' URLs, comma-separated, starting with node `first`.
    fn urls_from(&self, first: usize) -> String {
        (0..3)
            .map(|i| self.url((first - 1 + i) % 3 + 1))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Which node (1-based) a node name or an Erlang pid `<rabbit-TAG-N@localhost.…>` names.
    fn node_of(text: &str) -> Option<usize> {
        let at = text.find("@localhost")?;
        let n = text[..at].chars().next_back()?.to_digit(10)?;
        Some(n as usize)
    }

    /// The node the quorum queue's leader is on, asked of node `via`.
    async fn leader(&self, via: usize, queue: &str) -> Option<usize> {
        let out = self
            .run(&[
                "ctl",
                &via.to_string(),
                "list_queues",
                "name",
                "leader",
                "--no-table-headers",
            ])
            .await
            .ok()?;
        out.lines()
            .filter_map(|line| line.split_once('\t'))
            .find(|(name, _)| name.trim() == queue)
            .and_then(|(_, leader)| Self::node_of(leader))
    }

    /// How many nodes hold a member of the quorum queue, asked of node `via`.
    async fn members(&self, via: usize, queue: &str) -> usize {
        let out = self
            .run(&[
                "ctl",
                &via.to_string(),
                "list_queues",
                "name",
                "members",
                "--no-table-headers",
            ])
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        out.lines()
            .filter_map(|line| line.split_once('\t'))
            .find(|(name, _)| name.trim() == queue)
            .map_or(0, |(_, members)| members.matches("@localhost").count())
    }

    /// The node the connection named `name` is on, asked of node `via`.
    async fn connection_node(&self, via: usize, name: &str) -> Option<usize> {
        let out = self
            .run(&[
                "ctl",
                &via.to_string(),
                "list_connections",
                "pid",
                "client_properties",
                "--no-table-headers",
            ])
            .await
            .ok()?;
        out.lines()
            .find(|line| line.contains(name))
            .and_then(Self::node_of)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Err(e) = self.blocking(&["stop"]) {
            eprintln!("{e}");
        }
    }
}

// ---------------------------------------------------------------------------------------
// The clients (as in tests/payment_chain.rs)

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

async fn until_final(addr: &str, request: &str) -> (u16, String) {
    for _ in 0..600 {
        match exchange(addr, request).await {
            Ok((409 | 503, _)) | Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
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

/// The coupon consumer example; its output lines, with the time each arrived.
type Lines = Arc<Mutex<Vec<(Instant, String)>>>;

async fn start_consumer(db: &TestDb, urls: &str, queue: &str) -> (tokio::process::Child, Lines) {
    let mut child = tokio::process::Command::new(example_binary("coupon_consumer"))
        .env("DATABASE_URL", schema_url(&db.schema))
        .env("AMQP_URL", urls)
        .env("QUEUE", queue)
        .env("QUEUE_TYPE", "quorum")
        .env("RUST_LOG", "axum_idempotency=info")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if line.contains("waiting on queue") {
                return;
            }
        }
        panic!("the coupon consumer exited before consuming");
    })
    .await
    .expect("the coupon consumer did not start in 30 s");
    let seen: Lines = Arc::default();
    let keep = Arc::clone(&seen);
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            keep.lock().unwrap().push((Instant::now(), line));
        }
    });
    (child, seen)
}

/// Declares the quorum queue on node 1, so that its leader starts there. (Right after the
/// cluster formed, a declaration may be refused while the nodes settle: tried again.)
async fn declare_quorum(cluster: &Cluster, queue: &str) {
    let mut arguments = FieldTable::default();
    arguments.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
    let mut last = None;
    for _ in 0..50 {
        let declared = async {
            let connection =
                lapin::Connection::connect(&cluster.url(1), Default::default()).await?;
            connection
                .create_channel()
                .await?
                .queue_declare(
                    queue.into(),
                    QueueDeclareOptions {
                        durable: true,
                        ..QueueDeclareOptions::default()
                    },
                    arguments.clone(),
                )
                .await?;
            connection.close(200, "declared".into()).await
        }
        .await;
        match declared {
            Ok(()) => return,
            Err(e) => {
                println!("declaring the quorum queue: {e}; trying again");
                last = Some(e);
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("could not declare the quorum queue: {last:?}");
}

#[derive(Debug)]
struct Figures {
    run: &'static str,
    killed: usize,
    leader: usize,
    relay_node: usize,
    consumer_node: usize,
    killed_at_orders: usize,
    first_confirm_after_kill: Duration,
    new_leader: Option<(usize, Duration)>,
    consumer_reconnect: Option<Duration>,
    relay_reconnect: Option<f64>,
    restarted_in: Duration,
    duplicates: usize,
    orders: i64,
    paid: i64,
    messages: i64,
    total: Duration,
}

impl Figures {
    fn print(&self) {
        println!(
            "{}: {} orders, {} paid ({} messages); leader node {}, relay on node {}, \
             consumer on node {}; node {} SIGKILLed after {} orders",
            self.run,
            self.orders,
            self.paid,
            self.messages,
            self.leader,
            self.relay_node,
            self.consumer_node,
            self.killed,
            self.killed_at_orders
        );
        println!(
            "{}: kill → first confirm of a message enqueued after it {:.2} s; new leader {}; \
             relay reconnected {}; consumer reconnected {}; node restarted in {:.1} s; duplicates the Inbox absorbed: \
             {}; run {:.1} s",
            self.run,
            self.first_confirm_after_kill.as_secs_f64(),
            self.new_leader
                .map(|(n, t)| format!("node {n} after ≤ {:.2} s", t.as_secs_f64()))
                .unwrap_or_else(|| "unchanged".to_owned()),
            self.relay_reconnect
                .map(|t| format!("after {t:.2} s"))
                .unwrap_or_else(|| "not needed".to_owned()),
            self.consumer_reconnect
                .map(|t| format!("after {:.2} s", t.as_secs_f64()))
                .unwrap_or_else(|| "not needed".to_owned()),
            self.restarted_in.as_secs_f64(),
            self.duplicates,
            self.total.as_secs_f64()
        );
    }
}

/// One run of the chain; `kill_relay_node` picks the node to kill: the relay's (and the
/// consumer's), or else the queue's leader (the relay and the consumer on the others).
async fn run(cluster: &Cluster, run: &'static str, kill_relay_node: bool) -> Figures {
    let started = Instant::now();
    let db = TestDb::bare(1).await;
    let queue = unique_name("payment-succeeded-q");
    declare_quorum(cluster, &queue).await;
    let leader = cluster.leader(1, &queue).await.expect("the queue's leader");
    let members = cluster.members(1, &queue).await;
    assert_eq!(members, 3, "the quorum queue has a member on every node");
    // The relay starts with the node after the leader, the consumer with the one after that
    // (run 1) or with the relay's (run 2).
    let relay_first = leader % 3 + 1;
    let consumer_first = if kill_relay_node {
        relay_first
    } else {
        relay_first % 3 + 1
    };
    let orders_urls = cluster.urls_from(relay_first);
    let orders_env = [
        ("DATABASE_URL", schema_url(&db.schema)),
        ("AMQP_URL", orders_urls),
        ("PAYMENTS_QUEUE", queue.clone()),
        ("QUEUE_TYPE", "quorum".to_owned()),
        ("RUST_LOG", "axum_idempotency=info".to_owned()),
    ];
    let orders_env: Vec<(&str, &str)> = orders_env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let (orders, addr, orders_log) = start_example_logged("orders", &orders_env).await;
    let (consumer, lines) = start_consumer(&db, &cluster.urls_from(consumer_first), &queue).await;

    // The clients pay until told to stop; four orders in five are paid.
    let progress = Arc::new(AtomicUsize::new(0));
    let next = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let (addr, progress, next, stop) = (
                addr.clone(),
                Arc::clone(&progress),
                Arc::clone(&next),
                Arc::clone(&stop),
            );
            tokio::spawn(async move {
                let mut paid = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let i = next.fetch_add(1, Ordering::Relaxed) as i64;
                    let user = 20_000 + i;
                    let (status, body) = until_final(&addr, &create(user, &format!("c-{i}"))).await;
                    assert_eq!(status, 201, "{body}");
                    let order: serde_json::Value = serde_json::from_str(&body).unwrap();
                    let order_no = order["order_no"].as_str().unwrap().to_owned();
                    if i % 5 != 4 {
                        // A retry of the same key, and every third a second key too.
                        let mut keys = vec![format!("p-{i}"), format!("p-{i}")];
                        if i % 3 == 0 {
                            keys.push(format!("p2-{i}"));
                        }
                        for key in keys {
                            let (status, body) =
                                until_final(&addr, &pay(user, &order_no, &key)).await;
                            assert_eq!(status, 200, "{body}");
                        }
                        paid.push(user);
                    }
                    progress.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(PACE).await;
                }
                paid
            })
        })
        .collect();
    // The relay connects with its first publish.
    let sent = format!(
        "SELECT count(*) FROM {}.idempotency_outbox WHERE state = 'SENT'",
        db.schema
    );
    eventually("a first message confirmed", async || {
        let n: i64 = db.admin.query_one(&sent, &[]).await.unwrap().get(0);
        n > 0
    })
    .await;

    // Who is where, with the chain running.
    let mut relay_node = None;
    let mut consumer_node = None;
    for _ in 0..50 {
        relay_node = cluster
            .connection_node(leader, "axum-idempotency outbox relay")
            .await;
        consumer_node = cluster
            .connection_node(leader, "axum-idempotency inbox consumer")
            .await;
        if relay_node.is_some() && consumer_node.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let relay_node = relay_node.expect("the relay's connection");
    let consumer_node = consumer_node.expect("the consumer's connection");
    assert_eq!(
        relay_node, relay_first,
        "the relay connected to its first node"
    );
    assert_eq!(
        consumer_node, consumer_first,
        "the consumer connected to its first node"
    );
    let killed = if kill_relay_node { relay_node } else { leader };
    let survivor = (1..=3).find(|n| *n != killed).unwrap();

    tokio::time::sleep(Duration::from_secs(1)).await;
    let killed_at_orders = progress.load(Ordering::Relaxed);
    let kill_clock: f64 = db
        .admin
        .query_one("SELECT extract(epoch FROM clock_timestamp())::float8", &[])
        .await
        .unwrap()
        .get(0);
    let kill = Instant::now();
    cluster
        .run(&["kill", &killed.to_string()])
        .await
        .unwrap_or_else(|e| panic!("{e}"));

    // The first message enqueued after the kill that the broker confirmed (SENT), and the
    // new leader, watched side by side.
    let confirmed_after = format!(
        "SELECT count(*) FROM {}.idempotency_outbox \
         WHERE state = 'SENT' AND created_at > to_timestamp($1)",
        db.schema
    );
    let confirm = async {
        loop {
            let n: i64 = db
                .admin
                .query_one(&confirmed_after, &[&kill_clock])
                .await
                .unwrap()
                .get(0);
            if n > 0 {
                return kill.elapsed();
            }
            if kill.elapsed() > Duration::from_secs(60) {
                let states = db
                    .admin
                    .query(
                        &format!(
                            "SELECT state, count(*), max(created_at)::text, to_timestamp($1)::text \
                             FROM {}.idempotency_outbox GROUP BY state",
                            db.schema
                        ),
                        &[&kill_clock],
                    )
                    .await
                    .unwrap();
                for row in states {
                    let (state, n, last, at): (String, i64, String, String) =
                        (row.get(0), row.get(1), row.get(2), row.get(3));
                    println!("outbox {state}: {n}, last enqueued {last}, kill at {at}");
                }
                println!("orders done: {}", progress.load(Ordering::Relaxed));
                let log = orders_log.lock().unwrap().clone();
                let tail: Vec<&str> = log.lines().collect();
                panic!(
                    "nothing confirmed 60 s after the kill; the relay's log:\n{}",
                    tail[tail.len().saturating_sub(30)..].join("\n")
                );
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    let election = async {
        if killed != leader {
            return None;
        }
        loop {
            if let Some(n) = cluster.leader(survivor, &queue).await {
                if n != killed {
                    return Some((n, kill.elapsed()));
                }
            }
            assert!(
                kill.elapsed() < Duration::from_secs(60),
                "no new leader 60 s after the kill"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let (first_confirm_after_kill, new_leader) = tokio::join!(confirm, election);

    let restarting = Instant::now();
    cluster
        .run(&["restart", &killed.to_string()])
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let restarted_in = restarting.elapsed();

    // Load on the restarted cluster for a moment, then the clients finish.
    let at_restart = progress.load(Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);
    let mut paid_users = Vec::new();
    for client in clients {
        paid_users.extend(client.await.unwrap());
    }
    let orders_total = progress.load(Ordering::Relaxed) as i64;
    assert!(
        orders_total as usize > at_restart && at_restart > killed_at_orders,
        "orders were paid while the node was down and after it was back"
    );
    let paid_total = paid_users.len() as i64;

    // Judged on the database.
    let s = &db.schema;
    let count = async |sql: &str| -> i64 { db.admin.query_one(sql, &[]).await.unwrap().get(0) };
    let mut coupons = 0;
    for _ in 0..900 {
        coupons = count(&format!("SELECT count(*) FROM {s}.coupon_account")).await;
        if coupons >= paid_total {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(coupons, paid_total, "every paid order's coupon arrived");
    let mut pending = -1;
    for _ in 0..300 {
        pending = count(&format!(
            "SELECT count(*) FROM {s}.idempotency_outbox WHERE state <> 'SENT'"
        ))
        .await;
        if pending == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(pending, 0, "the outbox has nothing pending");
    // Stragglers (a message published again after its node died) arrive and are absorbed.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let per_user = db
        .admin
        .query(
            &format!(
                "SELECT o.user_id, o.status, count(c.id) FROM {s}.orders o \
                 LEFT JOIN {s}.coupon_account c ON c.user_id = o.user_id \
                 GROUP BY o.user_id, o.status"
            ),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(per_user.len() as i64, orders_total, "one order per user");
    for row in &per_user {
        let (user, status, coupons): (i64, String, i64) = (row.get(0), row.get(1), row.get(2));
        let paid = paid_users.contains(&user);
        assert_eq!(
            (status.as_str(), coupons),
            if paid { ("PAID", 1) } else { ("NEW", 0) },
            "user {user}"
        );
    }
    let messages = count(&format!("SELECT count(*) FROM {s}.idempotency_outbox")).await;
    assert_eq!(messages, paid_total, "one message per paid order");
    let recorded = db
        .admin
        .query_one(
            &format!(
                "SELECT count(*), count(*) FILTER (WHERE status = 'SUCCESS'), \
                        count(DISTINCT c.message_id) \
                 FROM {s}.inbox_messages i JOIN {s}.coupon_account c USING (message_id) \
                 WHERE i.consumer_group = 'coupon-service'"
            ),
            &[],
        )
        .await
        .unwrap();
    let (records, succeeded, distinct): (i64, i64, i64) =
        (recorded.get(0), recorded.get(1), recorded.get(2));
    assert_eq!(
        (records, succeeded, distinct),
        (paid_total, paid_total, paid_total),
        "the Inbox recorded each message once, with its coupon"
    );

    let lines = lines.lock().unwrap().clone();
    let duplicates = lines
        .iter()
        .filter(|(_, l)| l.contains("duplicate; acknowledged"))
        .count();
    let consumer_reconnect = lines
        .iter()
        .find(|(at, l)| *at > kill && l.contains("inbox consumer reconnected"))
        .map(|(at, _)| at.duration_since(kill));
    // The relay's reconnection, from its log's timestamps (UTC, as the database's clock).
    let relay_reconnect = orders_log
        .lock()
        .unwrap()
        .lines()
        .filter(|l| l.contains("outbox relay connected to broker node"))
        .filter_map(seconds_of_day)
        .map(|at| at - kill_clock.rem_euclid(86_400.0))
        .find(|after| *after > 0.0);
    if killed == relay_node {
        assert!(
            relay_reconnect.is_some(),
            "the relay reconnected to another node"
        );
    }
    if killed == consumer_node {
        assert!(
            consumer_reconnect.is_some(),
            "the consumer reconnected to another node"
        );
    }
    drop(orders);
    drop(consumer);
    Figures {
        run,
        killed,
        leader,
        relay_node,
        consumer_node,
        killed_at_orders,
        first_confirm_after_kill,
        new_leader,
        consumer_reconnect,
        relay_reconnect,
        restarted_in,
        duplicates,
        orders: orders_total,
        paid: paid_total,
        messages,
        total: started.elapsed(),
    }
}

/// The time of day, in seconds, of a log line starting `2026-12-01T21:30:53.713097Z`.
fn seconds_of_day(line: &str) -> Option<f64> {
    let time = line.get(11..)?.split('Z').next()?;
    let mut parts = time.split(':');
    let (h, m, s) = (parts.next()?, parts.next()?, parts.next()?);
    Some(h.parse::<f64>().ok()? * 3600.0 + m.parse::<f64>().ok()? * 60.0 + s.parse::<f64>().ok()?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_lost_or_granted_twice_when_a_rabbitmq_node_dies() {
    if !common::Database::Postgres.configured() {
        return;
    }
    if !enabled() {
        println!(
            "skipped: set AXUM_IDEMPOTENCY_RABBIT_CLUSTER_TESTS=1 to run the RabbitMQ cluster test"
        );
        return;
    }
    let cluster = Cluster::start();
    let leader = run(&cluster, "leader killed", false).await;
    leader.print();
    let relay = run(&cluster, "relay's node killed", true).await;
    relay.print();
    assert_ne!(leader.killed, leader.relay_node);
    assert_eq!(relay.killed, relay.relay_node);
}
