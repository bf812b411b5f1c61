//! PostgreSQL failover under load: a pg_auto_failover formation (monitor, primary,
//! standby; `tests/failover/cluster.sh`), two instances of the orders example on the
//! multi-host URL with `target_session_attrs=read-write`, eight clients that retry their
//! keys until a final answer, and an Inbox consumer. About a second into the run the
//! primary's keeper and postmaster are killed with SIGKILL, the monitor promotes the standby,
//! and the old primary's keeper is started again so that it rejoins as a standby.
//!
//! Afterwards, on the new primary: every key answered 2xx has its record and exactly one
//! order row, no key ran twice, every replay repeats the first answer byte for byte, the
//! switch showed only 503 problem documents, every payment has exactly one outbox message,
//! and every Inbox message ran exactly once.
//!
//! The same run then repeats with the standby out of the replication quorum (asynchronous
//! replication), and reports — without asserting — what was lost.
//!
//! Runs only with `AXUM_IDEMPOTENCY_FAILOVER_TESTS=1` (as root or `postgres`, with
//! `pg_autoctl` installed: `postgresql-15-auto-failover`); otherwise it says so and passes.
//! It never touches the PostgreSQL on port 5432.

mod common;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum_idempotency::inbox::Outcome;
use axum_idempotency::{Inbox, InboxError};
use common::*;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_postgres::NoTls;

const KEYS: usize = 2_100;
const WORKERS: usize = 8;
const INBOX_MESSAGES: usize = 1_000;
const INBOX_WORKERS: usize = 2;
/// Attempts per key (50 ms apart, plus the request's own time) before it counts as
/// unanswered.
const MAX_ATTEMPTS: usize = 2_400;

fn enabled() -> bool {
    std::env::var("AXUM_IDEMPOTENCY_FAILOVER_TESTS").as_deref() == Ok("1")
}

// ---------------------------------------------------------------------------------------
// The formation

/// A pg_auto_failover formation in a temporary directory, stopped and removed on drop.
struct Cluster {
    script: PathBuf,
    dir: PathBuf,
    ports: [u16; 2],
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Cluster {
    fn start() -> Self {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/failover/cluster.sh");
        let out = std::process::Command::new("mktemp")
            .args(["-d", "/tmp/axi-failover.XXXXXX"])
            .output()
            .unwrap();
        assert!(out.status.success(), "mktemp failed");
        let dir = PathBuf::from(String::from_utf8(out.stdout).unwrap().trim());
        let mut ports = [0; 3];
        while ports[0] == ports[1] || ports[1] == ports[2] || ports[0] == ports[2] {
            ports = [free_port(), free_port(), free_port()];
        }
        // Built now, so that a failed start is torn down too.
        let cluster = Self {
            script,
            dir,
            ports: [ports[1], ports[2]],
        };
        let started = std::time::Instant::now();
        let [monitor, p1, p2] = ports.map(|p| p.to_string());
        cluster
            .blocking(&["start", &monitor, &p1, &p2])
            .unwrap_or_else(|e| panic!("the formation did not start: {e}"));
        println!(
            "formation up in {:.1} s: monitor :{monitor}, node1 :{p1}, node2 :{p2}",
            started.elapsed().as_secs_f64()
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
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
        } else {
            Err(format!(
                "cluster.sh {}: {}{}",
                args.join(" "),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }

    /// The multi-host URL: whichever node accepts writes.
    fn url(&self, schema: Option<&str>) -> String {
        let [a, b] = self.ports;
        let mut url = format!(
            "postgres://postgres@127.0.0.1:{a},127.0.0.1:{b}/postgres\
             ?target_session_attrs=read-write&connect_timeout=2"
        );
        if let Some(schema) = schema {
            url.push_str(&format!("&options=-c%20search_path%3D{schema}"));
        }
        url
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
// The HTTP client

/// One answer as the client saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Reply {
    status: u16,
    content_type: Option<String>,
    location: Option<String>,
    replayed: bool,
    body: Vec<u8>,
}

impl Reply {
    fn problem(&self) -> bool {
        self.content_type.as_deref() == Some("application/problem+json")
    }

    fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

/// One HTTP/1.1 exchange (the connection closes after it), bounded to 10 s.
async fn exchange(addr: &str, request: &[u8]) -> std::io::Result<Reply> {
    let io = async {
        let mut stream = TcpStream::connect(addr).await?;
        stream.write_all(request).await?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await?;
        Ok::<_, std::io::Error>(raw)
    };
    let raw = tokio::time::timeout(Duration::from_secs(10), io)
        .await
        .map_err(|_| std::io::Error::other("no answer in 10 s"))??;
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| std::io::Error::other("no end of headers"))?;
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let status = head
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other("no status line"))?;
    let header = |name: &str| {
        head.lines().skip(1).find_map(|line| {
            let (n, v) = line.split_once(':')?;
            n.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_owned())
        })
    };
    Ok(Reply {
        status,
        content_type: header("content-type"),
        location: header("location"),
        replayed: header("idempotent-replayed").as_deref() == Some("true"),
        body: raw[split + 4..].to_vec(),
    })
}

fn user_of(i: usize) -> usize {
    1_000 + i % 50
}

fn create_key(mode: &str, i: usize) -> String {
    format!("fo-{mode}-{i}")
}

fn pay_key(mode: &str, i: usize) -> String {
    format!("fo-{mode}-pay-{i}")
}

fn create_request(mode: &str, i: usize) -> Vec<u8> {
    let user = user_of(i);
    let body = format!(r#"{{"user_id": {user}, "amount": {}}}"#, i + 1);
    format!(
        "POST /orders HTTP/1.1\r\nhost: x\r\nconnection: close\r\nidempotency-key: {}\r\n\
         x-user-id: {user}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        create_key(mode, i),
        body.len()
    )
    .into_bytes()
}

fn pay_request(mode: &str, i: usize, order_no: &str) -> Vec<u8> {
    format!(
        "POST /orders/{order_no}/pay HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\
         idempotency-key: {}\r\nx-user-id: {}\r\ncontent-length: 0\r\n\r\n",
        pay_key(mode, i),
        user_of(i)
    )
    .into_bytes()
}

/// What happened to one attempt.
#[derive(Clone, Copy, Debug)]
enum Seen {
    Status { status: u16, problem: bool },
    ConnectionError,
}

/// Every attempt's time (seconds since the start) and outcome.
#[derive(Default)]
struct Log {
    events: Mutex<Vec<(f64, Seen)>>,
}

impl Log {
    fn push(&self, start: Instant, seen: Seen) {
        let t = start.elapsed().as_secs_f64();
        self.events.lock().unwrap().push((t, seen));
    }
}

/// Sends `request` to the instances in turn until an answer other than 409, 503 or a lost
/// connection; `None` after `MAX_ATTEMPTS`.
async fn until_final(
    addrs: &[String; 2],
    first: usize,
    request: &[u8],
    log: &Log,
    start: Instant,
) -> Option<Reply> {
    for attempt in 0..MAX_ATTEMPTS {
        let addr = &addrs[(first + attempt) % 2];
        match exchange(addr, request).await {
            Ok(reply) => {
                log.push(
                    start,
                    Seen::Status {
                        status: reply.status,
                        problem: reply.problem(),
                    },
                );
                if reply.status != 409 && reply.status != 503 {
                    return Some(reply);
                }
            }
            Err(_) => log.push(start, Seen::ConnectionError),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

// ---------------------------------------------------------------------------------------
// Record ids, as the layer computes them

fn record_id(scope: &str, key: &str) -> Vec<u8> {
    let mut hasher = Sha256::new();
    hasher.update(b"axum-idempotency/v1\0");
    hasher.update((scope.len() as u64).to_be_bytes());
    hasher.update(scope.as_bytes());
    hasher.update(key.as_bytes());
    hasher.finalize()[..16].to_vec()
}

fn derive_key(record_id: &[u8], label: &str) -> String {
    let mut hasher = Sha256::new();
    hasher.update(b"axum-idempotency/derive/v1\0");
    hasher.update(record_id);
    hasher.update(label.as_bytes());
    hasher.finalize()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

// ---------------------------------------------------------------------------------------
// One run

fn pool(url: &str, size: usize) -> Pool {
    let manager = Manager::from_config(
        url.parse().unwrap(),
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager)
        .max_size(size)
        .wait_timeout(Some(Duration::from_secs(5)))
        .create_timeout(Some(Duration::from_secs(5)))
        .recycle_timeout(Some(Duration::from_secs(5)))
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .build()
        .unwrap()
}

/// A client on the writable node, after up to 60 s of trying.
async fn primary_client(url: &str) -> tokio_postgres::Client {
    for _ in 0..120 {
        if let Ok((client, connection)) = tokio_postgres::connect(url, NoTls).await {
            tokio::spawn(connection);
            return client;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    panic!("no writable node in 60 s");
}

/// The figures of one run.
#[derive(Debug, Default)]
struct Figures {
    mode: &'static str,
    /// `synchronous_standby_names` on the primary at the start.
    standby_names: String,
    keys: usize,
    created_2xx: usize,
    unanswered: usize,
    final_other: HashMap<u16, usize>,
    pays_2xx: usize,
    pays_other: HashMap<u16, usize>,
    attempts: usize,
    answers_503: usize,
    answers_503_not_problem: usize,
    answers_409: usize,
    other_5xx: usize,
    connection_errors: usize,
    unavailable_seconds: f64,
    promoted_after: f64,
    lagging_seconds: f64,
    acked_while_lagging: usize,
    rejoined_after: f64,
    replays: usize,
    replay_mismatches: usize,
    rows_checked: usize,
    lost_rows: usize,
    lost_records: usize,
    record_mismatches: usize,
    executed_twice: usize,
    orphan_rows: usize,
    outbox_checked: usize,
    outbox_missing: usize,
    outbox_extra: i64,
    unpaid: usize,
    inbox_done: usize,
    inbox_unfinished: usize,
    inbox_errors: usize,
    inbox_twice: usize,
    inbox_lost: usize,
    inbox_records_missing: usize,
}

impl Figures {
    fn print(&self) {
        println!(
            "==== failover run {:?}: synchronous_standby_names {:?} ====",
            self.mode, self.standby_names
        );
        println!(
            "keys {}, 2xx {}, unanswered {}, other final answers {:?}; payments 2xx {}, \
             other final answers {:?}",
            self.keys,
            self.created_2xx,
            self.unanswered,
            self.final_other,
            self.pays_2xx,
            self.pays_other
        );
        println!(
            "attempts {}: 503 {} (not problem documents: {}), 409 {}, other 5xx {}, \
             connection errors {}",
            self.attempts,
            self.answers_503,
            self.answers_503_not_problem,
            self.answers_409,
            self.other_5xx,
            self.connection_errors
        );
        println!(
            "unavailable {:.2} s (first to last non-2xx answer); promoted {:.1} s and \
             rejoined {:.1} s after the kill",
            self.unavailable_seconds, self.promoted_after, self.rejoined_after
        );
        if self.lagging_seconds > 0.0 {
            println!(
                "standby's WAL receiver stopped {:.2} s before the kill: {} 2xx answers meanwhile",
                self.lagging_seconds, self.acked_while_lagging
            );
        }
        println!(
            "replays {} (differing from the first answer {}); rows checked {}: lost rows {}, \
             lost records {}, records differing from the first answer {}, rows of one key \
             twice {}, rows without a 2xx {}",
            self.replays,
            self.replay_mismatches,
            self.rows_checked,
            self.lost_rows,
            self.lost_records,
            self.record_mismatches,
            self.executed_twice,
            self.orphan_rows
        );
        println!(
            "outbox: {} payments checked, {} messages missing, {} extra, {} paid orders not PAID",
            self.outbox_checked, self.outbox_missing, self.outbox_extra, self.unpaid
        );
        println!(
            "inbox: {} messages done ({} unfinished, {} errors retried): processed twice {}, \
             lost {}, records missing {}",
            self.inbox_done,
            self.inbox_unfinished,
            self.inbox_errors,
            self.inbox_twice,
            self.inbox_lost,
            self.inbox_records_missing
        );
    }
}

/// One run named `mode` (its schema and keys); with `lag`, the standby's WAL receiver stops
/// 1.5 s before the kill and is killed after it, so that the standby never gets what the
/// primary sent in between.
async fn run(cluster: &Cluster, mode: &'static str, lag: bool) -> Figures {
    let mut figures = Figures {
        mode,
        keys: KEYS,
        ..Figures::default()
    };
    let schema = format!("failover_{mode}");
    primary_client(&cluster.url(None))
        .await
        .batch_execute(&format!("CREATE SCHEMA {schema}"))
        .await
        .unwrap();
    let url = cluster.url(Some(&schema));
    figures.standby_names = cluster
        .run(&["sync"])
        .await
        .unwrap_or_else(|e| panic!("{e}"));

    // Two instances of the orders example (one after the other: each migrates at start).
    let (_first, a, _log_a) = start_example_logged("orders", &[("DATABASE_URL", &url)]).await;
    let (_second, b, _log_b) = start_example_logged("orders", &[("DATABASE_URL", &url)]).await;
    let addrs = [a, b];

    // The Inbox consumer's own pool and table.
    let inbox_pool = pool(&url, 4);
    inbox_pool
        .get()
        .await
        .unwrap()
        .batch_execute("CREATE TABLE inbox_effects (message_id text NOT NULL)")
        .await
        .unwrap();
    let inbox = Inbox::new(inbox_pool.clone(), "failover-test");

    let start = Instant::now();
    let log = Arc::new(Log::default());
    let next = Arc::new(AtomicUsize::new(0));
    let answers: Arc<Mutex<HashMap<usize, Option<Reply>>>> = Arc::default();
    let pays: Arc<Mutex<HashMap<usize, Option<Reply>>>> = Arc::default();

    let mut clients = Vec::new();
    for worker in 0..WORKERS {
        let (addrs, log, next) = (addrs.clone(), Arc::clone(&log), Arc::clone(&next));
        let (answers, pays) = (Arc::clone(&answers), Arc::clone(&pays));
        clients.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= KEYS {
                    break;
                }
                let reply =
                    until_final(&addrs, worker + i, &create_request(mode, i), &log, start).await;
                let order_no = reply
                    .as_ref()
                    .filter(|r| (200..300).contains(&r.status))
                    .and_then(|r| r.json()["order_no"].as_str().map(str::to_owned));
                answers.lock().unwrap().insert(i, reply);
                // Every second order is paid, under a key of its own.
                if let (Some(order_no), true) = (order_no, i % 2 == 0) {
                    let reply = until_final(
                        &addrs,
                        worker + i,
                        &pay_request(mode, i, &order_no),
                        &log,
                        start,
                    )
                    .await;
                    pays.lock().unwrap().insert(i, reply);
                }
            }
        }));
    }

    // The Inbox consumer: every message until it is done (processed or a duplicate).
    let inbox_next = Arc::new(AtomicUsize::new(0));
    let inbox_errors = Arc::new(AtomicUsize::new(0));
    let inbox_done = Arc::new(AtomicUsize::new(0));
    let mut consumers = Vec::new();
    for _ in 0..INBOX_WORKERS {
        let (inbox, next) = (inbox.clone(), Arc::clone(&inbox_next));
        let (errors, done) = (Arc::clone(&inbox_errors), Arc::clone(&inbox_done));
        consumers.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= INBOX_MESSAGES {
                    break;
                }
                let id = format!("msg-{i}");
                for _ in 0..MAX_ATTEMPTS {
                    let id2 = id.clone();
                    let outcome = inbox
                        .process(&id, |tx| async move {
                            tx.execute("INSERT INTO inbox_effects VALUES ($1)", &[&id2])
                                .await
                        })
                        .await;
                    match outcome {
                        Ok(Outcome::Processed(_) | Outcome::Duplicate { .. }) => {
                            done.fetch_add(1, Ordering::Relaxed);
                            break;
                        }
                        Ok(other) => panic!("inbox message {id}: {other:?}"),
                        Err(
                            InboxError::Store(_) | InboxError::Busy | InboxError::Failed { .. },
                        ) => {
                            errors.fetch_add(1, Ordering::Relaxed);
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                        Err(e) => panic!("inbox message {id}: {e}"),
                    }
                }
            }
        }));
    }

    // The failure: a second into the run, the primary dies; the monitor promotes the
    // standby; a few seconds later the old primary's keeper starts again and it rejoins.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut paused_at = None;
    if lag {
        let standby = cluster
            .run(&["pause-standby"])
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        paused_at = Some(start.elapsed().as_secs_f64());
        println!("{mode}: stopped the WAL receiver of {standby}");
        tokio::time::sleep(Duration::from_millis(1_500)).await;
    }
    let killed_at = Instant::now();
    let killed_t = start.elapsed().as_secs_f64();
    let old = cluster
        .run(&["kill-primary"])
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    if lag {
        // Killed, not resumed: what the primary had sent stays unread, as if the network
        // had lost it (resumed, the receiver would read it from its socket buffer).
        cluster
            .run(&["resume-standby", "discard"])
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }
    println!(
        "{mode}: killed {old} at {:.2} s, {} keys started",
        start.elapsed().as_secs_f64(),
        next.load(Ordering::Relaxed)
    );
    let new = cluster
        .run(&["wait-promoted", &old, "120"])
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    figures.promoted_after = killed_at.elapsed().as_secs_f64();
    println!(
        "{mode}: {new} promoted {:.1} s after the kill",
        figures.promoted_after
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    cluster
        .run(&["rejoin", &old])
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    cluster
        .run(&["wait-healthy", "180"])
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    figures.rejoined_after = killed_at.elapsed().as_secs_f64();
    println!(
        "{mode}: {old} rejoined as standby {:.1} s after the kill",
        figures.rejoined_after
    );

    for client in clients {
        client.await.unwrap();
    }
    for consumer in consumers {
        consumer.await.unwrap();
    }
    println!(
        "{mode}: stream done in {:.1} s",
        start.elapsed().as_secs_f64()
    );
    figures.inbox_done = inbox_done.load(Ordering::Relaxed);
    figures.inbox_unfinished = INBOX_MESSAGES - figures.inbox_done;
    figures.inbox_errors = inbox_errors.load(Ordering::Relaxed);

    // What the clients saw.
    let events = log.events.lock().unwrap().clone();
    figures.attempts = events.len();
    if let Some(paused) = paused_at {
        figures.lagging_seconds = killed_t - paused;
        figures.acked_while_lagging = events
            .iter()
            .filter(|(t, seen)| {
                (paused..killed_t).contains(t)
                    && matches!(
                        seen,
                        Seen::Status {
                            status: 200..=299,
                            ..
                        }
                    )
            })
            .count();
    }
    let mut bad_times = Vec::new();
    for (t, seen) in &events {
        match *seen {
            Seen::Status { status, problem } => match status {
                200..=299 => {}
                503 => {
                    figures.answers_503 += 1;
                    if !problem {
                        figures.answers_503_not_problem += 1;
                    }
                    bad_times.push(*t);
                }
                409 => {
                    figures.answers_409 += 1;
                    bad_times.push(*t);
                }
                500..=599 => {
                    figures.other_5xx += 1;
                    bad_times.push(*t);
                }
                _ => bad_times.push(*t),
            },
            Seen::ConnectionError => {
                figures.connection_errors += 1;
                bad_times.push(*t);
            }
        }
    }
    if let (Some(first), Some(last)) = (
        bad_times.iter().copied().reduce(f64::min),
        bad_times.iter().copied().reduce(f64::max),
    ) {
        figures.unavailable_seconds = last - first;
    }
    let answers = std::mem::take(&mut *answers.lock().unwrap());
    let pays = std::mem::take(&mut *pays.lock().unwrap());
    let created: HashMap<usize, Reply> = answers
        .iter()
        .filter_map(|(i, r)| Some((*i, r.clone()?)))
        .filter(|(_, r)| (200..300).contains(&r.status))
        .collect();
    figures.created_2xx = created.len();
    figures.unanswered = answers.values().filter(|r| r.is_none()).count() + (KEYS - answers.len());
    for reply in answers.values().flatten() {
        if !(200..300).contains(&reply.status) {
            *figures.final_other.entry(reply.status).or_default() += 1;
        }
    }
    let paid: HashMap<usize, Reply> = pays
        .iter()
        .filter_map(|(i, r)| Some((*i, r.clone()?)))
        .filter(|(_, r)| (200..300).contains(&r.status))
        .collect();
    figures.pays_2xx = paid.len();
    for reply in pays.values() {
        match reply {
            Some(r) if (200..300).contains(&r.status) => {}
            Some(r) => *figures.pays_other.entry(r.status).or_default() += 1,
            None => figures.unanswered += 1,
        }
    }

    // Every third key again, to the other instance: the first answer, byte for byte.
    let replay_log = Log::default();
    for (i, first) in &created {
        if i % 3 != 0 {
            continue;
        }
        figures.replays += 1;
        let again = until_final(&addrs, i + 1, &create_request(mode, *i), &replay_log, start).await;
        let same = again.as_ref().is_some_and(|again| {
            again.replayed
                && Reply {
                    replayed: first.replayed,
                    ..again.clone()
                } == *first
        });
        if !same {
            figures.replay_mismatches += 1;
            if figures.replay_mismatches <= 3 {
                let show = |r: &Reply| {
                    format!(
                        "{} {}{}",
                        r.status,
                        String::from_utf8_lossy(&r.body),
                        if r.replayed { " (replayed)" } else { "" }
                    )
                };
                println!(
                    "{mode}: replay of key {i} differs: first {}, again {}",
                    show(first),
                    again.as_ref().map_or_else(|| "no answer".to_owned(), show)
                );
            }
        }
    }

    // The new primary's rows.
    let db = primary_client(&url).await;
    let rows = db
        .query("SELECT order_no, amount, status FROM orders", &[])
        .await
        .unwrap();
    let mut by_amount: HashMap<i64, Vec<(String, String)>> = HashMap::new();
    for row in &rows {
        by_amount
            .entry(row.get(1))
            .or_default()
            .push((row.get(0), row.get(2)));
    }
    figures.executed_twice = by_amount.values().filter(|v| v.len() > 1).count();
    let records: HashMap<Vec<u8>, (i16, Vec<u8>)> = db
        .query(
            "SELECT uuid_send(id), status, body FROM idempotency_records",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), (r.get(1), r.get(2))))
        .collect();
    let create_keys: HashSet<i64> = created.keys().map(|i| *i as i64 + 1).collect();
    figures.orphan_rows = by_amount
        .keys()
        .filter(|amount| !create_keys.contains(amount))
        .count();
    for (i, reply) in &created {
        figures.rows_checked += 1;
        let order_no = reply.json()["order_no"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        match by_amount.get(&(*i as i64 + 1)) {
            Some(found) if found.iter().any(|(no, _)| *no == order_no) => {}
            _ => {
                figures.lost_rows += 1;
                if figures.lost_rows <= 3 {
                    println!("{mode}: key {i} answered {order_no} but has no row");
                }
            }
        }
        match records.get(&record_id(&user_of(*i).to_string(), &create_key(mode, *i))) {
            None => figures.lost_records += 1,
            Some((status, body)) => {
                if *status as u16 != reply.status || *body != reply.body {
                    figures.record_mismatches += 1;
                }
            }
        }
    }

    // The outbox: one message per payment, under the id derived from its record.
    let outbox: HashSet<String> = db
        .query("SELECT message_id FROM idempotency_outbox", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut expected = HashSet::new();
    for i in paid.keys() {
        figures.outbox_checked += 1;
        let id = derive_key(
            &record_id(&user_of(*i).to_string(), &pay_key(mode, *i)),
            "payment-succeeded",
        );
        if !outbox.contains(&id) {
            figures.outbox_missing += 1;
        }
        expected.insert(id);
        let order_no = created[i].json()["order_no"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let is_paid = by_amount
            .get(&(*i as i64 + 1))
            .is_some_and(|v| v.iter().any(|(no, s)| *no == order_no && s == "PAID"));
        if !is_paid {
            figures.unpaid += 1;
        }
    }
    figures.outbox_extra = outbox.difference(&expected).count() as i64;

    // The Inbox: every message's effect exactly once, with its record.
    let effects: HashMap<String, i64> = db
        .query(
            "SELECT message_id, count(*) FROM inbox_effects GROUP BY message_id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let inbox_records: HashSet<String> = db
        .query(
            "SELECT message_id FROM inbox_messages \
             WHERE consumer_group = 'failover-test' AND status = 'SUCCESS'",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    for i in 0..INBOX_MESSAGES {
        let id = format!("msg-{i}");
        match effects.get(&id).copied().unwrap_or(0) {
            0 => figures.inbox_lost += 1,
            1 => {}
            _ => figures.inbox_twice += 1,
        }
        if !inbox_records.contains(&id) {
            figures.inbox_records_missing += 1;
        }
    }
    inbox_pool.close();
    figures
}

/// The guarantees of a run on a synchronous standby: the acknowledged keys, payments and
/// messages are all there, once.
fn assert_durable(f: &Figures) {
    let mode = f.mode;
    assert_eq!(f.unanswered, 0, "{mode}: keys without a final answer");
    assert!(
        f.final_other.is_empty(),
        "{mode}: final answers other than 2xx"
    );
    assert_eq!(f.other_5xx, 0, "{mode}: 5xx answers other than 503");
    assert_eq!(
        f.answers_503_not_problem, 0,
        "{mode}: 503s that are not problem documents"
    );
    assert_eq!(
        f.replay_mismatches, 0,
        "{mode}: replays that differ from the first answer"
    );
    assert_eq!(
        f.lost_rows, 0,
        "{mode}: acknowledged keys without their order row"
    );
    assert_eq!(
        f.lost_records, 0,
        "{mode}: acknowledged keys without their record"
    );
    assert_eq!(
        f.record_mismatches, 0,
        "{mode}: records that differ from the answer"
    );
    assert_eq!(f.executed_twice, 0, "{mode}: keys executed twice");
    assert_eq!(
        f.orphan_rows, 0,
        "{mode}: order rows without an acknowledged key"
    );
    assert_eq!(
        f.outbox_missing, 0,
        "{mode}: payments without their outbox message"
    );
    assert_eq!(
        f.outbox_extra, 0,
        "{mode}: outbox messages without a payment"
    );
    assert_eq!(
        f.unpaid, 0,
        "{mode}: acknowledged payments whose order is not PAID"
    );
    assert_eq!(f.inbox_unfinished, 0, "{mode}: inbox messages never done");
    assert_eq!(f.inbox_twice, 0, "{mode}: inbox messages processed twice");
    assert_eq!(f.inbox_lost, 0, "{mode}: inbox messages lost");
    assert_eq!(
        f.inbox_records_missing, 0,
        "{mode}: inbox messages without their record"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn acknowledged_keys_survive_a_failover_to_a_synchronous_standby() {
    if !enabled() {
        println!("skipped: set AXUM_IDEMPOTENCY_FAILOVER_TESTS=1 to run the failover test");
        return;
    }
    let cluster = tokio::task::spawn_blocking(Cluster::start).await.unwrap();
    let names = cluster.run(&["sync"]).await.unwrap();
    println!("synchronous_standby_names on the primary: {names:?}");
    assert!(!names.is_empty(), "the standby is not synchronous");

    // Synchronous: the standby has every acknowledged commit, even when it lagged.
    let sync = run(&cluster, "sync", false).await;
    sync.print();
    let sync_lag = run(&cluster, "sync_lag", true).await;
    sync_lag.print();

    // Asynchronous: the same runs, reported, not asserted.
    cluster.run(&["set-async"]).await.unwrap();
    let names = cluster.run(&["sync"]).await.unwrap();
    println!("synchronous_standby_names on the primary: {names:?}");
    let asynchronous = run(&cluster, "async", false).await;
    asynchronous.print();
    let async_lag = run(&cluster, "async_lag", true).await;
    async_lag.print();
    for f in [&asynchronous, &async_lag] {
        println!(
            "{}: {} acknowledged keys without their row, {} without their record, {} \
             payments without their message, {} inbox messages lost",
            f.mode, f.lost_rows, f.lost_records, f.outbox_missing, f.inbox_lost
        );
    }

    // The runs were what they claim to be.
    for f in [&sync, &sync_lag] {
        assert!(
            !f.standby_names.is_empty(),
            "{}: no synchronous standby",
            f.mode
        );
    }
    for f in [&asynchronous, &async_lag] {
        assert!(
            f.standby_names.is_empty(),
            "{}: a synchronous standby",
            f.mode
        );
    }
    assert_durable(&sync);
    assert!(
        sync.answers_503 > 0,
        "the switch was not seen: no 503 at all"
    );
    assert_eq!(sync.answers_409, 0, "409 answers");
    assert_eq!(sync.connection_errors, 0, "connection errors");
    assert_durable(&sync_lag);
}
