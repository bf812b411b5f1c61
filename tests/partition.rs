//! A silent link cut between the orders example (tokio-postgres over deadpool) and its
//! PostgreSQL: the server runs alone in a network namespace behind a veth pair
//! (`tests/partition/netns.sh`), and the link is cut with `iptables -j DROP` in both
//! directions inside it — no RST, no ICMP, the fault a switch or a security group
//! delivers. Every answer during the cut is bounded, nothing is lost or done twice, and the
//! service heals as soon as the link is back.
//!
//! Opt-in: it needs root, iproute2, iptables and PostgreSQL's binaries, and makes a
//! namespace of its own. `AXUM_IDEMPOTENCY_PARTITION_TESTS=1 cargo test --all-features
//! --test partition` (`.ci/run` sets it).

mod common;

use std::time::{Duration, Instant};

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The example's `LINK_TIMEOUT` (4 s) and a second of slack: no answer during a cut may
/// take longer.
const BOUND: Duration = Duration::from_secs(5);

/// The namespace and its PostgreSQL; removed on drop.
struct Partitioned {
    url: String,
}

impl Partitioned {
    fn script(action: &str) -> String {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/partition/netns.sh");
        let output = std::process::Command::new("bash")
            .args([script, action])
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "netns.sh {action}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).unwrap()
    }

    fn up() -> Self {
        Self {
            url: Self::script("up").trim().to_owned(),
        }
    }

    fn cut(&self) {
        Self::script("cut");
    }

    fn heal(&self) {
        Self::script("heal");
    }
}

impl Drop for Partitioned {
    fn drop(&mut self) {
        Self::script("down");
    }
}

/// A keyed `POST /orders` as user 1001; its status, `Retry-After` and body, and how long
/// the answer took.
async fn post(addr: &str, key: &str) -> (u16, Option<String>, String, Duration) {
    let started = Instant::now();
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(raw_http::post_order(key, 5).as_bytes())
        .await
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let elapsed = started.elapsed();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    let retry_after = head
        .lines()
        .find_map(|line| line.strip_prefix("retry-after: "))
        .map(str::to_owned);
    (
        head[9..12].parse().unwrap(),
        retry_after,
        body.to_owned(),
        elapsed,
    )
}

/// `n` keyed posts at once, keys `{prefix}-0` …
async fn wave(addr: &str, prefix: &str, n: usize) -> Vec<(u16, Option<String>, String, Duration)> {
    let posts: Vec<_> = (0..n)
        .map(|i| {
            let (addr, key) = (addr.to_owned(), format!("{prefix}-{i}"));
            tokio::spawn(async move { post(&addr, &key).await })
        })
        .collect();
    let mut answers = Vec::with_capacity(n);
    for post in posts {
        answers.push(post.await.unwrap());
    }
    answers
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_cut_costs_seconds_and_heals_at_once() {
    if std::env::var_os("AXUM_IDEMPOTENCY_PARTITION_TESTS").is_none() {
        eprintln!("skipped: set AXUM_IDEMPOTENCY_PARTITION_TESTS=1 (root, iproute2, iptables)");
        return;
    }
    let net = Partitioned::up();
    let (_orders, addr) = start_example("orders", &[("DATABASE_URL", &net.url)]).await;

    // Warm: the pool holds connections that will be cut mid-use and idle.
    for (status, _, body, _) in wave(&addr, "warm", 8).await {
        assert_eq!(status, 201, "{body}");
    }

    net.cut();
    let cut_at = Instant::now();
    // Eight clients during the cut, twice: first on pooled connections whose peer went
    // silent, then on the fresh connections the pool tries to make.
    for round in ["cut-a", "cut-b"] {
        for (status, retry_after, body, took) in wave(&addr, round, 8).await {
            assert_eq!(status, 503, "{round}: {body}");
            assert!(body.contains("store_unavailable"), "{round}: {body}");
            assert!(retry_after.is_some(), "{round}: 503 without Retry-After");
            assert!(took <= BOUND, "{round}: answered after {took:?}");
            eprintln!("{round}: 503 after {took:?}");
        }
    }
    // A second instance started while the link is cut fails within the bound, in one
    // line naming the database's host and port.
    let started = Instant::now();
    let output = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::process::Command::new(example_binary("orders"))
            .env("DATABASE_URL", &net.url)
            .env("BIND_ADDR", "127.0.0.1:0")
            .env("RUST_LOG", "off")
            .env_remove("AMQP_URL")
            .env_remove("ADMIN_PASSWORD")
            .output(),
    )
    .await
    .expect("the example neither served nor exited in 30 s")
    .unwrap();
    let took = started.elapsed();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(took <= BOUND, "start-up failed after {took:?}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("10.77.0.2:5432"), "{stderr}");
    eprintln!(
        "start-up during the cut: failed after {took:?}: {}",
        stderr.trim()
    );
    let cut_for = cut_at.elapsed();

    net.heal();
    let healed_at = Instant::now();
    let (status, _, body, _) = post(&addr, "after-heal").await;
    let first_success = healed_at.elapsed();
    assert_eq!(status, 201, "{body}");
    assert!(
        first_success <= Duration::from_secs(2),
        "the first request after the heal took {first_success:?}"
    );
    // The pool serves its whole size at once after the heal.
    for (status, _, body, _) in wave(&addr, "healed", 16).await {
        assert_eq!(status, 201, "{body}");
    }
    // The keys refused during the cut run now, once each.
    for round in ["cut-a", "cut-b"] {
        for (status, _, body, _) in wave(&addr, round, 8).await {
            assert_eq!(status, 201, "{round}: {body}");
        }
        for (status, _, body, _) in wave(&addr, round, 8).await {
            assert_eq!(status, 201, "{round} again: {body}");
        }
    }
    let db = connect(&net.url).await;
    let orders: i64 = db
        .query_one("SELECT count(*) FROM orders", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        orders,
        8 + 1 + 16 + 16,
        "one order per key, none from the cut"
    );
    eprintln!("partition: cut for {cut_for:?}, first success {first_success:?} after the heal");
}
