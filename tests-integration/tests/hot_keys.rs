//! The hot-key limiter (`IdempotencyLayer::key_attempt_limit`) against a real PostgreSQL:
//! a key past its attempts for the second gets 429 before the database is asked, other
//! keys keep going, and a storm of retries on one key over real HTTP leaves another
//! client's orders alone.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use axum_idempotency::{IdempotencyLayer, IdempotentLease};
use common::recorder::{Capture, Recorder};
use common::*;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

fn as_user(user: &str, key: &str, body: &Value) -> axum::http::Request<axum::body::Body> {
    let mut request = post_json("/orders", Some(key), body);
    request
        .headers_mut()
        .insert("x-user-id", user.parse().unwrap());
    request
}

/// Most attempts of one key that `limit` lets through while `elapsed` passes: one
/// window per started second, plus the one open when the layer was built.
fn most_admitted(limit: usize, elapsed: Duration) -> usize {
    limit * (elapsed.as_secs() as usize + 2)
}

fn assert_limited(answer: &Answer) {
    assert_eq!(answer.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(answer.headers["retry-after"], "1");
    assert_eq!(answer.problem_code(), "too_many_attempts");
}

/// Ten attempts of one key in a row with a limit of 3: the first runs the handler, two
/// more are replayed from PostgreSQL, the rest get 429 `too_many_attempts` with
/// `Retry-After: 1`, counted in `idempotency_requests_total`. Other keys, and the same key
/// in another scope, have counts of their own; the next second admits the key again.
#[test]
fn a_key_past_its_attempts_gets_429_before_postgres() {
    if !common::Database::Postgres.configured() {
        return;
    }
    let capture = Arc::new(Capture::default());
    let recorder = Recorder(Arc::clone(&capture));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let limited_metric = || {
        capture
            .values()
            .get("idempotency_requests_total{outcome=too_many_attempts}")
            .copied()
            .unwrap_or(0.0)
    };
    metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            let db = TestDb::new(2).await;
            let knobs = Arc::new(Knobs::default());
            let started = Instant::now();
            let app = router(
                Arc::clone(&knobs),
                scoped(IdempotencyLayer::new(db.pool.clone())).key_attempt_limit(3),
            );
            let body = json!({"amount": 5});
            let mut answers = Vec::new();
            for _ in 0..10 {
                answers.push(send(&app, as_user("alice", "hot", &body)).await);
            }
            let cold = send(&app, as_user("alice", "cold", &body)).await;
            let other_scope = send(&app, as_user("bob", "hot", &body)).await;
            let elapsed = started.elapsed();

            assert_eq!(answers[0].status, StatusCode::CREATED);
            assert!(!answers[0].replayed());
            let (limited, admitted): (Vec<_>, Vec<_>) = answers
                .iter()
                .partition(|answer| answer.status == StatusCode::TOO_MANY_REQUESTS);
            for answer in &admitted {
                assert_eq!(answer.status, StatusCode::CREATED);
                assert_eq!(answer.body, answers[0].body);
            }
            for answer in &limited {
                assert_limited(answer);
            }
            assert!(admitted.len() <= most_admitted(3, elapsed));
            if elapsed < Duration::from_secs(1) {
                assert_eq!(
                    admitted.len(),
                    3,
                    "one window: exactly the limit got through"
                );
            } else {
                eprintln!("slow machine ({elapsed:?}): exact counts not checked");
            }
            assert_eq!(limited_metric(), limited.len() as f64);
            assert_eq!(
                cold.status,
                StatusCode::CREATED,
                "another key is not limited"
            );
            assert!(!cold.replayed());
            assert_eq!(
                other_scope.status,
                StatusCode::CREATED,
                "another scope neither"
            );
            assert!(!other_scope.replayed());
            assert_eq!(knobs.calls(), 3);
            assert_eq!(db.orders().await, 3);

            // The next second admits the key again.
            tokio::time::sleep(Duration::from_millis(1100)).await;
            let later = send(&app, as_user("alice", "hot", &body)).await;
            assert_eq!(later.status, StatusCode::CREATED);
            assert!(later.replayed());
            assert_eq!(knobs.calls(), 3);
            db.assert_settles().await;
        })
    });
}

/// Replays from the in-process cache cost no database trip: they are neither counted nor
/// limited, and neither is the 422 the cache gives another request under the key.
#[tokio::test]
async fn replays_from_the_in_process_cache_are_not_limited() {
    if !common::Database::Postgres.configured() {
        return;
    }
    let db = TestDb::new(2).await;
    let knobs = Arc::new(Knobs::default());
    let layer = IdempotencyLayer::new(db.pool.clone())
        .cache_responses(1 << 20)
        .key_attempt_limit(1);
    let app = router(Arc::clone(&knobs), layer);
    let body = json!({"amount": 9});
    let first = send(&app, post_json("/orders", Some("cached"), &body)).await;
    assert_eq!(first.status, StatusCode::CREATED);
    for _ in 0..20 {
        let replay = send(&app, post_json("/orders", Some("cached"), &body)).await;
        assert_eq!(replay.status, StatusCode::CREATED);
        assert!(replay.replayed());
        assert_eq!(replay.body, first.body);
    }
    let other = send(
        &app,
        post_json("/orders", Some("cached"), &json!({"amount": 1})),
    )
    .await;
    assert_eq!(other.problem_code(), "key_reused");
    assert_eq!(knobs.calls(), 1);
    db.assert_settles().await;
}

async fn charge(_lease: IdempotentLease, Json(body): Json<Value>) -> (StatusCode, Json<Value>) {
    (StatusCode::CREATED, Json(body))
}

/// Lease mode's claim is limited the same way: with a limit of 1, the second attempt of
/// the key in the same second gets 429 instead of a replay from PostgreSQL.
#[tokio::test]
async fn lease_mode_is_limited_too() {
    if !common::Database::Postgres.configured() {
        return;
    }
    let db = TestDb::new(2).await;
    let started = Instant::now();
    let app = Router::new()
        .route("/charges", post(charge))
        .layer(IdempotencyLayer::new(db.pool.clone()).key_attempt_limit(1));
    let body = json!({"amount": 3});
    let first = send(&app, post_json("/charges", Some("lease-hot"), &body)).await;
    let second = send(&app, post_json("/charges", Some("lease-hot"), &body)).await;
    let other = send(&app, post_json("/charges", Some("lease-cold"), &body)).await;
    let elapsed = started.elapsed();
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(other.status, StatusCode::CREATED);
    if elapsed < Duration::from_secs(1) {
        assert_limited(&second);
    } else {
        eprintln!("slow machine ({elapsed:?}): the second attempt fell in another second");
    }
    db.assert_settles().await;
}

// ---------------------------------------------------------------------------------------
// The storm over real HTTP.

/// One keep-alive HTTP/1.1 connection.
struct Conn {
    stream: BufReader<TcpStream>,
}

/// What the storm keeps of an answer.
struct Reply {
    status: u16,
    retry_after: Option<String>,
    body: Vec<u8>,
}

impl Conn {
    async fn open(addr: std::net::SocketAddr) -> Self {
        let stream = TcpStream::connect(addr).await.unwrap();
        stream.set_nodelay(true).unwrap();
        Self {
            stream: BufReader::new(stream),
        }
    }

    async fn post(&mut self, key: &str, body: &str) -> Reply {
        self.post_to("/orders", key, body).await
    }

    async fn post_to(&mut self, path: &str, key: &str, body: &str) -> Reply {
        let request = format!(
            "POST {path} HTTP/1.1\r\nhost: x\r\nidempotency-key: {key}\r\n\
             content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        self.stream
            .get_mut()
            .write_all(request.as_bytes())
            .await
            .unwrap();
        let mut line = String::new();
        self.stream.read_line(&mut line).await.unwrap();
        let status: u16 = line
            .split(' ')
            .nth(1)
            .and_then(|code| code.parse().ok())
            .unwrap_or_else(|| panic!("no status line: {line:?}"));
        let (mut length, mut chunked, mut retry_after) = (0, false, None);
        loop {
            line.clear();
            self.stream.read_line(&mut line).await.unwrap();
            let header = line.trim_end();
            if header.is_empty() {
                break;
            }
            let Some((name, value)) = header.split_once(':') else {
                continue;
            };
            let value = value.trim();
            match name.to_ascii_lowercase().as_str() {
                "content-length" => length = value.parse().unwrap(),
                "transfer-encoding" => chunked = value.eq_ignore_ascii_case("chunked"),
                "retry-after" => retry_after = Some(value.to_owned()),
                _ => {}
            }
        }
        let mut body = Vec::new();
        if chunked {
            loop {
                line.clear();
                self.stream.read_line(&mut line).await.unwrap();
                let size = usize::from_str_radix(line.trim_end(), 16).unwrap();
                let mut chunk = vec![0; size + 2];
                self.stream.read_exact(&mut chunk).await.unwrap();
                if size == 0 {
                    break;
                }
                body.extend_from_slice(&chunk[..size]);
            }
        } else {
            body.resize(length, 0);
            self.stream.read_exact(&mut body).await.unwrap();
        }
        Reply {
            status,
            retry_after,
            body,
        }
    }
}

/// The test order service on a real socket; the server stops when the handle drops.
async fn serve(app: Router) -> (std::net::SocketAddr, AbortOnDrop) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    (addr, AbortOnDrop(server))
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The other client: orders with fresh keys, one after another on one connection, until
/// `stop` is set or `max` were sent. Returns each answer's status and latency.
async fn other_client(
    addr: std::net::SocketAddr,
    tag: &str,
    max: usize,
    stop: &AtomicBool,
) -> Vec<(u16, Duration)> {
    let mut conn = Conn::open(addr).await;
    let mut answers = Vec::new();
    for n in 0..max {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let started = Instant::now();
        let reply = conn
            .post(
                &format!("{tag}-{n}"),
                &json!({"user_id": 1, "amount": n}).to_string(),
            )
            .await;
        answers.push((reply.status, started.elapsed()));
    }
    answers
}

fn p99(answers: &[(u16, Duration)]) -> Duration {
    let mut latencies: Vec<_> = answers.iter().map(|(_, latency)| *latency).collect();
    latencies.sort();
    let rank = (latencies.len() * 99).div_ceil(100).max(1);
    latencies.get(rank - 1).copied().unwrap_or_default()
}

/// Attempts per second of the storm, over all its connections.
const STORM_RATE: u32 = 2_000;
const STORM_CONNECTIONS: u32 = 64;
const STORM_FOR: Duration = Duration::from_secs(2);

/// What a storm and the other client during it saw.
struct Storm {
    hot: Vec<Reply>,
    took: Duration,
    other: Vec<(u16, Duration)>,
}

/// `STORM_CONNECTIONS` connections send `key` at `STORM_RATE` attempts a second in all,
/// for `STORM_FOR` (each at most its share of attempts), while the other client orders.
async fn storm(addr: std::net::SocketAddr, key: &str, user: i64, tag: &str) -> Storm {
    let body = json!({"user_id": user, "amount": 7}).to_string();
    let period = Duration::from_secs(1) * STORM_CONNECTIONS / STORM_RATE;
    let per_connection = (STORM_FOR.as_millis() / period.as_millis()) as usize + 1;
    let mut conns = Vec::new();
    for _ in 0..STORM_CONNECTIONS {
        conns.push(Conn::open(addr).await);
    }
    let started = Instant::now();
    let deadline = tokio::time::Instant::now() + STORM_FOR;
    let hammers: Vec<_> = conns
        .into_iter()
        .enumerate()
        .map(|(n, mut conn)| {
            let (key, body) = (key.to_owned(), body.clone());
            tokio::spawn(async move {
                // Spread the connections' ticks over the period.
                let offset = period * n as u32 / STORM_CONNECTIONS;
                let mut ticks =
                    tokio::time::interval_at(tokio::time::Instant::now() + offset, period);
                ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                let mut replies = Vec::new();
                for _ in 0..per_connection {
                    ticks.tick().await;
                    if tokio::time::Instant::now() >= deadline {
                        break;
                    }
                    replies.push(conn.post(&key, &body).await);
                }
                replies
            })
        })
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let other = tokio::spawn({
        let (stop, tag) = (Arc::clone(&stop), tag.to_owned());
        async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            other_client(addr, &tag, 10_000, &stop).await
        }
    });
    let mut hot = Vec::new();
    for hammer in hammers {
        hot.extend(hammer.await.unwrap());
    }
    let took = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    let other = other.await.unwrap();
    Storm { hot, took, other }
}

fn tally(replies: &[Reply]) -> std::collections::BTreeMap<u16, usize> {
    let mut counts = std::collections::BTreeMap::new();
    for reply in replies {
        *counts.entry(reply.status).or_default() += 1;
    }
    counts
}

/// 64 connections send one key 2 000 times a second for 2 s over real HTTP, against a
/// pool of 8, while another client creates orders. With `key_attempt_limit(20)`: every
/// answer to the hot key is 201, 409 or 429 (never 5xx), its handler ran once, at most 20
/// of its attempts per second reached the database, and every order of the other client
/// succeeded. The other client's p99 latency, unloaded and during the storm with and
/// without the limiter, is printed, not asserted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storm_on_one_key_leaves_other_keys_alone() {
    if !common::Database::Postgres.configured() {
        return;
    }
    const LIMIT: usize = 20;
    let db = TestDb::new(8).await;
    let knobs = Arc::new(Knobs::default());

    // Without the limiter first, on a pool of its own.
    let open_pool = pool_for(&db.schema, 8);
    let (open_addr, open_server) = serve(router(
        Arc::clone(&knobs),
        IdempotencyLayer::new(open_pool.clone()),
    ))
    .await;
    let unloaded_open = other_client(open_addr, "open-quiet", 100, &AtomicBool::new(false)).await;
    let open = storm(open_addr, "hot-open", 998, "open-storm").await;
    drop(open_server);

    let (addr, _server) = serve(router(
        Arc::clone(&knobs),
        IdempotencyLayer::new(db.pool.clone()).key_attempt_limit(LIMIT as u32),
    ))
    .await;
    let unloaded = other_client(addr, "quiet", 100, &AtomicBool::new(false)).await;
    let limited = storm(addr, "hot-limited", 999, "storm").await;

    let counts = tally(&limited.hot);
    let refused = counts.get(&429).copied().unwrap_or(0);
    let reached = limited.hot.len() - refused;
    eprintln!(
        "with key_attempt_limit({LIMIT}): {} hot-key attempts in {:?}: {counts:?}; {reached} \
         reached the database ({:.1}/s)",
        limited.hot.len(),
        limited.took,
        reached as f64 / limited.took.as_secs_f64()
    );
    eprintln!(
        "without a limit: {} hot-key attempts in {:?}: {:?}",
        open.hot.len(),
        open.took,
        tally(&open.hot)
    );
    eprintln!(
        "other client p99: unloaded {:?} (limited server) / {:?} (open server); \
         during the storm {:?} with the limiter ({} orders), {:?} without ({} orders)",
        p99(&unloaded),
        p99(&unloaded_open),
        p99(&limited.other),
        limited.other.len(),
        p99(&open.other),
        open.other.len()
    );

    for reply in &limited.hot {
        assert!(
            matches!(reply.status, 201 | 409 | 429),
            "hot key answered {}: {}",
            reply.status,
            String::from_utf8_lossy(&reply.body)
        );
        if reply.status == 429 {
            assert_eq!(reply.retry_after.as_deref(), Some("1"));
            let problem: Value = serde_json::from_slice(&reply.body).unwrap();
            assert_eq!(problem["code"], "too_many_attempts");
        }
    }
    assert!(
        limited.hot.len() >= 1000,
        "the storm sent {} attempts",
        limited.hot.len()
    );
    assert!(refused > 0, "the limiter refused nothing");
    assert!(
        counts.get(&201).copied().unwrap_or(0) >= 1,
        "the hot key ran: {counts:?}"
    );
    // Each answer that is not 429 came from the database (no cache, no Redis here).
    assert!(
        reached <= most_admitted(LIMIT, limited.took),
        "{reached} attempts reached the database in {:?}",
        limited.took
    );
    assert_eq!(
        db.scalar("SELECT count(*) FROM orders WHERE user_id = 999")
            .await,
        1,
        "the hot key's handler ran once"
    );
    for (status, _) in unloaded.iter().chain(&limited.other) {
        assert_eq!(*status, 201, "the other client's orders all succeed");
    }
    assert!(!limited.other.is_empty());
    drop(_server);
    open_pool.close();
}

/// The storm's handler: the order's insert with `?` on the crate's error (a duplicate's
/// refused statement is answered by the layer), counted once past it.
async fn storm_order(
    axum::extract::State(knobs): axum::extract::State<Arc<Knobs>>,
    tx: axum_idempotency::postgres::IdempotentTx,
    Json(body): Json<Value>,
) -> Result<(StatusCode, Json<Value>), axum_idempotency::Error> {
    let (user, amount) = (body["user_id"].as_i64(), body["amount"].as_i64());
    let row = tx
        .query_one(
            "INSERT INTO orders (user_id, amount) VALUES ($1, $2) RETURNING id",
            &[&user, &amount],
        )
        .await?;
    knobs.calls.fetch_add(1, Ordering::SeqCst);
    let id: i64 = row.get(0);
    Ok((
        StatusCode::CREATED,
        Json(json!({ "id": id, "amount": amount })),
    ))
}

/// One storm's answers: status, latency and body of each of its requests.
type StormAnswers = Vec<(u16, Duration, Vec<u8>)>;

/// `conns` send one new key at the same instant; every answer.
async fn one_key_storm(conns: &mut [Conn], key: &str, body: &str) -> StormAnswers {
    let barrier = Arc::new(tokio::sync::Barrier::new(conns.len()));
    futures_util::future::join_all(conns.iter_mut().map(|conn| {
        let barrier = Arc::clone(&barrier);
        async move {
            barrier.wait().await;
            let started = Instant::now();
            let reply = conn.post_to("/storm/orders", key, body).await;
            (reply.status, started.elapsed(), reply.body)
        }
    }))
    .await
}

/// What one claim mode did over a run of storms.
struct StormRun {
    /// Handler calls (got past the first statement) per storm.
    calls: Vec<usize>,
    storm: Vec<(u16, Duration)>,
    other: Vec<(u16, Duration)>,
    quiet: Vec<(u16, Duration)>,
}

const STORMS: usize = 20;
const STORM_WIDTH: usize = 64;

/// `STORMS` storms of `STORM_WIDTH` requests with one new key each, against a pool of 16,
/// while another client orders. Asserts the guarantee for every storm: never a 5xx, one
/// order committed, every 201 the same answer.
async fn storms_in(mode: axum_idempotency::ClaimMode, db: &TestDb, user: i64) -> StormRun {
    // The storm's handler calls are counted apart from the other client's.
    let knobs = Arc::new(Knobs::default());
    let layer = IdempotencyLayer::new(db.pool.clone()).claim_mode(mode);
    let app = Router::new()
        .route("/storm/orders", post(storm_order))
        .layer(layer.clone())
        .with_state(Arc::clone(&knobs))
        .merge(router(Arc::new(Knobs::default()), layer));
    let (addr, _server) = serve(app).await;
    let quiet = other_client(addr, &format!("quiet-{user}"), 200, &AtomicBool::new(false)).await;
    let mut conns = Vec::new();
    for _ in 0..STORM_WIDTH {
        conns.push(Conn::open(addr).await);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let other = tokio::spawn({
        let stop = Arc::clone(&stop);
        async move { other_client(addr, &format!("busy-{user}"), 100_000, &stop).await }
    });
    let body = json!({"user_id": user, "amount": 7}).to_string();
    let (mut calls, mut storm) = (Vec::new(), Vec::new());
    for n in 0..STORMS {
        let before = knobs.calls();
        let key = format!("storm-{user}-{n}");
        let answers = one_key_storm(&mut conns, &key, &body).await;
        calls.push(knobs.calls() - before);
        let first = answers
            .iter()
            .find(|(status, ..)| *status == 201)
            .map(|(_, _, body)| body.clone());
        for (status, _, reply) in &answers {
            assert!(
                matches!(status, 201 | 409),
                "{mode:?}: a storm answered {status}: {}",
                String::from_utf8_lossy(reply)
            );
            if *status == 201 {
                assert_eq!(Some(reply), first.as_ref(), "{mode:?}: a 201 that differs");
            }
        }
        storm.extend(answers.into_iter().map(|(status, took, _)| (status, took)));
    }
    stop.store(true, Ordering::Relaxed);
    let other = other.await.unwrap();
    assert_eq!(
        db.scalar(&format!(
            "SELECT count(*) FROM orders WHERE user_id = {user}"
        ))
        .await,
        STORMS as i64,
        "{mode:?}: one order per storm"
    );
    for (status, _) in other.iter().chain(&quiet) {
        assert_eq!(
            *status, 201,
            "{mode:?}: the other client's orders all succeed"
        );
    }
    StormRun {
        calls,
        storm,
        other,
        quiet,
    }
}

/// A storm of one new key, 64 requests at the same instant against a pool of 16, twenty
/// times in each claim mode, beside another client creating orders: one order per storm
/// and never a 5xx in either mode. Printed (not asserted): the handler calls per storm
/// (locked: the one that holds the key; optimistic: every twin that ran before the
/// winner's commit, its work rolled back), the storm's p99 and the other client's p99
/// quiet and during the storms. `cargo test --release --all-features --test hot_keys
/// storm_of_one_new_key -- --nocapture` gives the figures in BENCHMARKS.md.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storm_of_one_new_key_in_each_claim_mode() {
    use axum_idempotency::ClaimMode;
    if !common::Database::Postgres.configured() {
        return;
    }
    let db = TestDb::new(16).await;
    for (mode, user) in [(ClaimMode::Locked, 501), (ClaimMode::Optimistic, 502)] {
        let run = storms_in(mode, &db, user).await;
        let count = |status| run.storm.iter().filter(|(s, _)| *s == status).count();
        let mean = run.calls.iter().sum::<usize>() as f64 / run.calls.len() as f64;
        eprintln!(
            "{mode:?}: handler calls per storm mean {mean:.1}, max {}; storm answers 201 {} / \
             409 {}, p99 {:?}; other client p99 quiet {:?}, during the storms {:?} ({} orders)",
            run.calls.iter().max().unwrap(),
            count(201),
            count(409),
            p99(&run.storm),
            p99(&run.quiet),
            p99(&run.other),
            run.other.len()
        );
        if mode == ClaimMode::Locked {
            // Only the request holding the key gets past its first statement.
            assert!(run.calls.iter().all(|&calls| calls == 1), "{:?}", run.calls);
        }
    }
}
