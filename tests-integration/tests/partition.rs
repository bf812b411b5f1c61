//! A silent link cut between the service and its PostgreSQL: the server runs alone in a
//! network namespace behind a veth pair (`tests/partition/netns.sh`), and the link is cut
//! with `iptables -j DROP` in both directions inside it — no RST, no ICMP, the fault a
//! switch or a security group delivers. On each driver (tokio-postgres over deadpool and
//! over bb8, sqlx) and through both orders examples, every answer during the cut is
//! bounded, nothing is lost or done twice, and the service heals as soon as the link is
//! back.
//!
//! Opt-in: it needs root, iproute2, iptables and PostgreSQL's binaries, and makes a
//! namespace of its own. `AXUM_IDEMPOTENCY_PARTITION_TESTS=1 cargo test --all-features
//! --test partition` (`.ci/run` sets it). The test of a healthy slow handler needs none of
//! that and runs always.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{Request, StatusCode};
use axum::routing;
use axum_idempotency::postgres::IdempotentTx;
use axum_idempotency::{IdempotencyLayer, IntoStore};
use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tower::ServiceExt;

/// The example's `LINK_TIMEOUT` (4 s) and a second of slack: no answer during a cut may
/// take longer.
const BOUND: Duration = Duration::from_secs(5);

/// How long the link stays cut while clients keep sending, in the examples' test.
const STEADY_CUT: Duration = Duration::from_secs(30);

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

fn opted_in() -> bool {
    let opted_in = std::env::var_os("AXUM_IDEMPOTENCY_PARTITION_TESTS").is_some();
    if !opted_in {
        eprintln!("skipped: set AXUM_IDEMPOTENCY_PARTITION_TESTS=1 (root, iproute2, iptables)");
    }
    opted_in
}

/// One namespace for the whole binary: its tests take turns.
static NAMESPACE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_cut_costs_seconds_and_heals_at_once() {
    silent_cut("orders").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_cut_costs_seconds_and_heals_at_once_on_sqlx() {
    silent_cut("orders_sqlx").await;
}

/// The behaviour table of a silent cut, driven from outside against `example`.
async fn silent_cut(example: &str) {
    if !opted_in() {
        return;
    }
    let _turn = NAMESPACE.lock().await;
    let net = Partitioned::up();
    let (_orders, addr) = start_example(example, &[("DATABASE_URL", &net.url)]).await;

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
            eprintln!("{example} {round}: {status} after {took:?}");
            assert_eq!(status, 503, "{round}: {body}");
            assert!(body.contains("store_unavailable"), "{round}: {body}");
            assert!(retry_after.is_some(), "{round}: 503 without Retry-After");
            assert!(took <= BOUND, "{round}: answered after {took:?}");
        }
    }
    // A second instance started while the link is cut fails within the bound, in one
    // line naming the database's host and port.
    let started = Instant::now();
    let output = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::process::Command::new(example_binary(example))
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
    // Eight clients keep sending fresh keys until the cut has lasted 30 s: every answer
    // within the bound, however long the link has been dead.
    let clients: Vec<_> = (0..8)
        .map(|client| {
            let addr = addr.clone();
            tokio::spawn(async move {
                let mut answers = Vec::new();
                while cut_at.elapsed() < STEADY_CUT {
                    let key = format!("steady-{client}-{}", answers.len());
                    let (status, _, body, took) = post(&addr, &key).await;
                    assert_eq!(status, 503, "steady: {body}");
                    answers.push(took);
                }
                answers
            })
        })
        .collect();
    let mut steady = Vec::new();
    for client in clients {
        steady.extend(client.await.unwrap());
    }
    let slowest = steady.iter().max().copied().unwrap_or_default();
    eprintln!(
        "{example} steady: {} answers from 8 clients through a {:?} cut, the slowest after \
         {slowest:?}",
        steady.len(),
        cut_at.elapsed()
    );
    assert!(slowest <= BOUND, "steady: answered after {slowest:?}");
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

/// The handler of [`a_commit_whose_answer_is_lost_is_replayed_and_one_never_sent_runs_once`]:
/// one row per run, and, when told, the cut made just before it returns — so the record's
/// insert and the `COMMIT` are sent into it.
#[derive(Clone, Default)]
struct Work {
    calls: Arc<AtomicUsize>,
    cut: Arc<Mutex<Option<&'static str>>>,
}

async fn work(
    State(work): State<Work>,
    Path(key): Path<String>,
    tx: IdempotentTx,
) -> Result<StatusCode, axum_idempotency::Error> {
    work.calls.fetch_add(1, Ordering::SeqCst);
    tx.execute("INSERT INTO cut_work (key) VALUES ($1)", &[&key])
        .await?;
    let cut = work.cut.lock().unwrap().take();
    if let Some(action) = cut {
        tokio::task::spawn_blocking(move || Partitioned::script(action))
            .await
            .unwrap();
    }
    Ok(StatusCode::CREATED)
}

/// A keyed `POST /work/{key}`: status, whether it was replayed, the body, how long it took.
async fn send_work(app: &Router, key: &str) -> (u16, bool, String, Duration) {
    let started = Instant::now();
    let request = Request::post(format!("/work/{key}"))
        .header("idempotency-key", format!("\"{key}\""))
        .body(Body::empty())
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let took = started.elapsed();
    let status = response.status().as_u16();
    let replayed = response.headers().get("idempotent-replayed").is_some();
    let body = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    (
        status,
        replayed,
        String::from_utf8_lossy(&body).into_owned(),
        took,
    )
}

/// The outcome that is not known: the link cut after the handler's work, so the record's
/// insert and the `COMMIT` go into it.
///
/// - Only the server's replies dropped: the server receives the `COMMIT` and commits; the
///   client gets 503 within the bound; after the heal the retry is answered from the
///   record, and the work ran once.
/// - Both directions dropped: the `COMMIT` never arrives. The client gets 503 within the
///   bound; the server's backend keeps the transaction (and the key's lock) open until its
///   keepalive (here 2 s idle, 1 s interval, 3 probes) finds the client gone. Until then a
///   retry is answered 409 `in_flight` with `Retry-After` (never a second run, never a
///   wait); then it runs, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_whose_answer_is_lost_is_replayed_and_one_never_sent_runs_once() {
    if !opted_in() {
        return;
    }
    let _turn = NAMESPACE.lock().await;
    let net = Partitioned::up();
    // One connection, warmed by a first request: the record's insert is prepared on it, so
    // the cut request's insert and COMMIT leave together, in one write.
    let pool = dead_peer_pool(&net.url, 1).await;
    let db = connect(&net.url).await;
    db.batch_execute("CREATE TABLE cut_work (key text NOT NULL)")
        .await
        .unwrap();
    let state = Work::default();
    let app = Router::new()
        .route("/work/{key}", routing::post(work))
        .with_state(state.clone())
        .layer(IdempotencyLayer::new(pool.clone()));
    let rows = async |key: &str| -> i64 {
        let db = connect(&net.url).await;
        db.query_one("SELECT count(*) FROM cut_work WHERE key = $1", &[&key])
            .await
            .unwrap()
            .get(0)
    };

    let (status, _, body, _) = send_work(&app, "warm").await;
    assert_eq!(status, 201, "{body}");

    // The COMMIT arrives, its answer does not.
    *state.cut.lock().unwrap() = Some("cut-replies");
    let (status, _, body, took) = send_work(&app, "answer-lost").await;
    assert_eq!(status, 503, "{body}");
    assert!(took <= BOUND, "answered after {took:?}");
    eprintln!("commit answer lost: 503 after {took:?}: {body}");
    net.heal();
    let (status, replayed, body, _) = send_work(&app, "answer-lost").await;
    assert_eq!(
        (status, replayed),
        (201, true),
        "the retry is replayed: {body}"
    );
    assert_eq!(state.calls.load(Ordering::SeqCst), 2, "the work ran once");
    assert_eq!(rows("answer-lost").await, 1);

    // The COMMIT never arrives.
    *state.cut.lock().unwrap() = Some("cut");
    let cut_at = Instant::now();
    let (status, _, body, took) = send_work(&app, "commit-lost").await;
    assert_eq!(status, 503, "{body}");
    assert!(took <= BOUND, "answered after {took:?}");
    eprintln!("commit never sent: 503 after {took:?}: {body}");
    net.heal();
    let healed_at = Instant::now();
    let mut refused = 0;
    let ran = loop {
        let (status, replayed, body, took) = send_work(&app, "commit-lost").await;
        assert!(took <= BOUND, "a retry answered after {took:?}");
        match status {
            201 => {
                assert!(!replayed, "nothing was committed to replay: {body}");
                break (cut_at.elapsed(), healed_at.elapsed());
            }
            409 => {
                assert!(body.contains("in_flight"), "{body}");
                refused += 1;
            }
            // The first request on a connection the pool still held from before the cut.
            503 => assert!(body.contains("store_unavailable"), "{body}"),
            _ => panic!("a retry got {status}: {body}"),
        }
        assert!(
            healed_at.elapsed() < Duration::from_secs(20),
            "the key stayed blocked past 20 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(state.calls.load(Ordering::SeqCst), 4, "the retry ran once");
    assert_eq!(
        rows("commit-lost").await,
        1,
        "the first attempt left nothing"
    );
    eprintln!(
        "commit never sent: the retry ran {:?} after the cut, {:?} after the heal \
         ({refused} retries answered 409 before)",
        ran.0, ran.1
    );

    // Without the server's settings its backend keeps the vanished client's transaction,
    // and the key, until something else ends it: a retry meanwhile is answered 409
    // `in_flight`, never a second run.
    let db = connect(&net.url).await;
    for statement in [
        "ALTER SYSTEM SET tcp_user_timeout = 0",
        "ALTER SYSTEM SET tcp_keepalives_idle = 0",
        "SELECT pg_reload_conf()",
    ] {
        db.batch_execute(statement).await.unwrap();
    }
    drop(db);
    pool.retain(|_, _| false);
    *state.cut.lock().unwrap() = Some("cut");
    let cut_at = Instant::now();
    let (status, _, body, took) = send_work(&app, "server-holds").await;
    assert_eq!(status, 503, "{body}");
    assert!(took <= BOUND, "answered after {took:?}");
    net.heal();
    let healed_at = Instant::now();
    let mut refused = 0;
    loop {
        let (status, replayed, body, took) = send_work(&app, "server-holds").await;
        assert!(took <= BOUND, "a retry answered after {took:?}");
        match status {
            201 => {
                assert!(!replayed, "{body}");
                break;
            }
            409 => {
                assert!(body.contains("in_flight"), "{body}");
                refused += 1;
            }
            _ => panic!("a retry got {status}: {body}"),
        }
        assert!(
            healed_at.elapsed() < Duration::from_secs(60),
            "the key stayed held past a minute after the heal"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        rows("server-holds").await,
        1,
        "the held attempt left nothing"
    );
    eprintln!(
        "without the server's keepalive and user timeout: the retry ran {:?} after the cut, \
         {:?} after the heal ({refused} retries answered 409 before)",
        cut_at.elapsed(),
        healed_at.elapsed()
    );
}

/// The handler of [`a_statement_in_flight_during_a_cut_is_answered_within_the_bound`]: one
/// row per run; when told, the link is cut just before its statement is sent.
async fn cut_then_write<S: TestStore>(
    State(work): State<Work>,
    mut tx: axum_idempotency::IdempotentTx<S>,
) -> Result<StatusCode, axum_idempotency::Error> {
    work.calls.fetch_add(1, Ordering::SeqCst);
    let cut = work.cut.lock().unwrap().take();
    if let Some(action) = cut {
        tokio::task::spawn_blocking(move || Partitioned::script(action))
            .await
            .unwrap();
    }
    S::run(&mut tx, "INSERT INTO cut_work DEFAULT VALUES").await?;
    Ok(StatusCode::CREATED)
}

/// A link cut while the handler's statement is in flight: the request is answered 503
/// within the bound, nothing of it commits, and its retry after the heal runs once — on
/// each driver, with the pool settings its guide recommends; a key whose answer the
/// in-process cache holds is replayed from it during the cut.
async fn statement_in_flight<S: TestStore>(
    driver: &str,
    net: &Partitioned,
    pool: impl IntoStore<Store = S>,
) {
    let net_url = net.url.clone();
    let db = connect(&net_url).await;
    db.batch_execute(
        "DROP TABLE IF EXISTS cut_work; CREATE TABLE cut_work (id bigserial PRIMARY KEY)",
    )
    .await
    .unwrap();
    let state = Work::default();
    let app = Router::new()
        .route("/work/{key}", routing::post(cut_then_write::<S>))
        .with_state(state.clone())
        .layer(IdempotencyLayer::new(pool).cache_responses(1 << 20));
    let rows = async || -> i64 {
        let db = connect(&net_url).await;
        db.query_one("SELECT count(*) FROM cut_work", &[])
            .await
            .unwrap()
            .get(0)
    };
    let (status, _, body, _) = send_work(&app, "warm").await;
    assert_eq!(status, 201, "{driver}: {body}");

    *state.cut.lock().unwrap() = Some("cut");
    let (status, _, body, took) = send_work(&app, "in-flight").await;
    eprintln!("{driver}: statement in flight during the cut: {status} after {took:?}: {body}");
    assert_eq!(status, 503, "{driver}: {body}");
    assert!(body.contains("store_unavailable"), "{driver}: {body}");
    assert!(took <= BOUND, "{driver}: answered after {took:?}");
    // A key whose answer is in the in-process cache is replayed from it during the cut.
    let (status, replayed, body, took) = send_work(&app, "warm").await;
    eprintln!("{driver}: a cached key during the cut: {status} after {took:?}");
    assert_eq!((status, replayed), (201, true), "{driver}: {body}");
    assert!(took <= Duration::from_millis(500), "{driver}: {took:?}");
    // A fresh key during the cut: bounded too.
    let (status, _, body, took) = send_work(&app, "during").await;
    eprintln!("{driver}: new key during the cut: {status} after {took:?}");
    assert_eq!(status, 503, "{driver}: {body}");
    assert!(took <= BOUND, "{driver}: answered after {took:?}");

    net.heal();
    let healed_at = Instant::now();
    let (status, replayed, body, _) = send_work(&app, "in-flight").await;
    let first = healed_at.elapsed();
    eprintln!("{driver}: the retry after the heal: {status} after {first:?}");
    assert_eq!((status, replayed), (201, false), "{driver}: {body}");
    assert!(first <= Duration::from_secs(2), "{driver}: {first:?}");
    assert_eq!(
        state.calls.load(Ordering::SeqCst),
        3,
        "{driver}: ran once more"
    );
    assert_eq!(
        rows().await,
        2,
        "{driver}: nothing of the cut attempt committed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_in_flight_during_a_cut_is_answered_within_the_bound() {
    if !opted_in() {
        return;
    }
    let _turn = NAMESPACE.lock().await;
    let net = Partitioned::up();
    let pool = dead_peer_pool(&net.url, 4).await;
    statement_in_flight("deadpool", &net, pool).await;
}

#[cfg(feature = "bb8")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_in_flight_during_a_cut_is_answered_within_the_bound_on_bb8() {
    if !opted_in() {
        return;
    }
    let _turn = NAMESPACE.lock().await;
    let net = Partitioned::up();
    let pool = bb8::Pool::builder()
        .max_size(4)
        .connection_timeout(LINK_BOUND)
        .build(bb8_postgres::PostgresConnectionManager::new(
            {
                let mut config: tokio_postgres::Config = net.url.parse().unwrap();
                axum_idempotency::postgres::detect_dead_peers(&mut config, LINK_BOUND);
                config
            },
            tokio_postgres::NoTls,
        ))
        .await
        .unwrap();
    axum_idempotency::migrate(&pool).await.unwrap();
    statement_in_flight("bb8", &net, pool).await;
}

#[cfg(feature = "sqlx")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_in_flight_during_a_cut_is_answered_within_the_bound_on_sqlx() {
    if !opted_in() {
        return;
    }
    let _turn = NAMESPACE.lock().await;
    let net = Partitioned::up();
    let pool = bounded_sqlx_pool(&net.url).await;
    statement_in_flight("sqlx", &net, pool).await;
}

/// The handler of [`a_handler_running_long_on_a_healthy_link_is_left_alone_on_sqlx`]: a
/// statement that runs past the link timeout, then a row.
#[cfg(feature = "sqlx")]
async fn slow_write(
    State(work): State<Work>,
    mut tx: axum_idempotency::sqlx::IdempotentTx,
) -> Result<StatusCode, axum_idempotency::Error> {
    work.calls.fetch_add(1, Ordering::SeqCst);
    sqlx::query("SELECT pg_sleep(2.5)")
        .execute(&mut *tx)
        .await
        .map_err(axum_idempotency::Error::from)?;
    sqlx::query("INSERT INTO slow_work_sqlx DEFAULT VALUES")
        .execute(&mut *tx)
        .await
        .map_err(axum_idempotency::Error::from)?;
    Ok(StatusCode::CREATED)
}

/// The sqlx driver watches the link while a handler runs; a statement that runs long on a
/// healthy link (2.5 s against a 1 s link timeout) is not mistaken for a cut. Needs no
/// namespace: it runs in every test run.
#[cfg(feature = "sqlx")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_running_long_on_a_healthy_link_is_left_alone_on_sqlx() {
    use axum_idempotency::sqlx::SqlxStore;
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    axum_idempotency::migrate(&pool).await.unwrap();
    sqlx::raw_sql(
        "DROP TABLE IF EXISTS slow_work_sqlx; \
         CREATE TABLE slow_work_sqlx (id bigserial PRIMARY KEY)",
    )
    .execute(&pool)
    .await
    .unwrap();
    let state = Work::default();
    let store = SqlxStore::new(pool.clone()).link_timeout(Duration::from_secs(1));
    let app = Router::new()
        .route("/work/{key}", routing::post(slow_write))
        .with_state(state.clone())
        .layer(IdempotencyLayer::new(store));
    let key = format!("slow-{}", std::process::id());
    let (status, _, body, took) = send_work(&app, &key).await;
    assert_eq!(status, 201, "answered after {took:?}: {body}");
    let (status, replayed, _, _) = send_work(&app, &key).await;
    assert_eq!((status, replayed), (201, true));
    assert_eq!(state.calls.load(Ordering::SeqCst), 1);
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM slow_work_sqlx")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(rows, 1);
}

/// The handler of [`lease_mode_across_a_cut`]: its work is outside the database; when
/// told, the link is cut before it returns (so the lease's completion meets the cut).
async fn leased_call(
    State(work): State<Work>,
    _lease: axum_idempotency::IdempotentLease,
) -> StatusCode {
    work.calls.fetch_add(1, Ordering::SeqCst);
    let cut = work.cut.lock().unwrap().take();
    if let Some(action) = cut {
        tokio::task::spawn_blocking(move || Partitioned::script(action))
            .await
            .unwrap();
    }
    StatusCode::CREATED
}

/// Lease mode across a cut: the completion that meets the cut and a new key's lease are
/// both answered 503 within the bound; after the heal a fresh key succeeds at once, and
/// the key whose result could not be stored is refused 409 (never run twice at once) until
/// its lease expires, then taken over and run again — lease mode's at-least-once.
async fn lease_mode_across_a_cut<S: TestStore>(
    driver: &str,
    net: &Partitioned,
    pool: impl IntoStore<Store = S>,
) {
    const LEASE: Duration = Duration::from_secs(3);
    let state = Work::default();
    let app = Router::new()
        .route("/work/{key}", routing::post(leased_call))
        .with_state(state.clone())
        .layer(IdempotencyLayer::new(pool).lease(LEASE));
    let (status, _, body, _) = send_work(&app, "lease-warm").await;
    assert_eq!(status, 201, "{driver}: {body}");

    *state.cut.lock().unwrap() = Some("cut");
    let (status, _, body, took) = send_work(&app, "lease-cut").await;
    eprintln!("{driver}, lease mode: completion during the cut: {status} after {took:?}: {body}");
    assert_eq!(status, 503, "{driver}: {body}");
    assert!(took <= BOUND, "{driver}: answered after {took:?}");
    let (status, _, body, took) = send_work(&app, "lease-during").await;
    eprintln!("{driver}, lease mode: new key during the cut: {status} after {took:?}");
    assert_eq!(status, 503, "{driver}: {body}");
    assert!(body.contains("store_unavailable"), "{driver}: {body}");
    assert!(took <= BOUND, "{driver}: answered after {took:?}");

    net.heal();
    let healed_at = Instant::now();
    let (status, _, body, _) = send_work(&app, "lease-fresh").await;
    let first = healed_at.elapsed();
    eprintln!("{driver}, lease mode: a fresh key after the heal: {status} after {first:?}");
    assert_eq!(status, 201, "{driver}: {body}");
    assert!(first <= Duration::from_secs(2), "{driver}: {first:?}");
    let mut refused = 0;
    loop {
        let (status, replayed, body, took) = send_work(&app, "lease-cut").await;
        assert!(took <= BOUND, "{driver}: a retry answered after {took:?}");
        match status {
            201 => {
                assert!(!replayed, "{driver}: {body}");
                break;
            }
            409 => refused += 1,
            _ => panic!("{driver}: a retry got {status}: {body}"),
        }
        assert!(
            healed_at.elapsed() < LEASE + BOUND,
            "{driver}: the lease was not taken over after it expired"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!(
        "{driver}, lease mode: the cut key ran again {:?} after the heal ({refused} retries \
         answered 409 before)",
        healed_at.elapsed()
    );
    // warm, cut, fresh, the takeover: the new key refused during the cut never ran.
    assert_eq!(state.calls.load(Ordering::SeqCst), 4, "{driver}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_mode_answers_within_the_bound_during_a_cut() {
    if !opted_in() {
        return;
    }
    let _turn = NAMESPACE.lock().await;
    let net = Partitioned::up();
    let pool = dead_peer_pool(&net.url, 4).await;
    lease_mode_across_a_cut("deadpool", &net, pool).await;
}

#[cfg(feature = "sqlx")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_mode_answers_within_the_bound_during_a_cut_on_sqlx() {
    if !opted_in() {
        return;
    }
    let _turn = NAMESPACE.lock().await;
    let net = Partitioned::up();
    let pool = bounded_sqlx_pool(&net.url).await;
    lease_mode_across_a_cut("sqlx", &net, pool).await;
}

/// Records what the relay publishes; the broker is not what these tests cut.
#[derive(Clone, Default)]
struct Collected(Arc<Mutex<Vec<String>>>);

impl axum_idempotency::outbox::Publisher for Collected {
    async fn publish(
        &self,
        message: &axum_idempotency::outbox::Outgoing,
    ) -> Result<(), axum_idempotency::outbox::PublishError> {
        self.0.lock().unwrap().push(message.message_id().to_owned());
        Ok(())
    }
}

impl Collected {
    /// Waits up to `within` for `id` to be published; how long it took.
    async fn wait_for(&self, id: &str, within: Duration) -> Option<Duration> {
        let started = Instant::now();
        while started.elapsed() < within {
            if self.0.lock().unwrap().iter().any(|m| m == id) {
                return Some(started.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    }
}

/// A relay that polls once a minute and is woken by its `LISTEN` connection: after a 25 s
/// silent cut its listener has noticed the dead link and listens again, so a message
/// committed after the heal goes out in seconds, not at the next poll.
async fn listener_across_a_cut<S: TestStore>(
    driver: &str,
    net: &Partitioned,
    pool: impl IntoStore<Store = S>,
    listener: axum_idempotency::outbox::Listener,
) {
    const POLL: Duration = Duration::from_secs(60);
    let published = Collected::default();
    let relay = axum_idempotency::outbox::OutboxRelay::new(pool, published.clone())
        .poll_interval(POLL)
        .listen(listener)
        .spawn();
    let enqueue = async |id: &str| {
        let db = connect(&net.url).await;
        axum_idempotency::postgres::enqueue(
            &db,
            &axum_idempotency::outbox::OutboxMessage::new("cut", "{}").id(id),
        )
        .await
        .unwrap();
    };
    // Its first batch runs at once; its LISTEN is up once that has settled.
    tokio::time::sleep(Duration::from_millis(500)).await;
    enqueue("before").await;
    let woken = published.wait_for("before", Duration::from_secs(10)).await;
    assert!(
        woken.is_some(),
        "{driver}: the listener never woke the relay"
    );

    net.cut();
    tokio::time::sleep(Duration::from_secs(25)).await;
    net.heal();
    let healed_at = Instant::now();
    enqueue("after").await;
    let took = published.wait_for("after", POLL / 2).await;
    eprintln!(
        "{driver}: LISTEN wake-up before the cut {woken:?}; after a 25 s cut, a commit \
         {:?} after the heal went out {took:?} later",
        healed_at.elapsed()
    );
    assert!(
        took.is_some(),
        "{driver}: the listener stayed deaf after the heal (only polling would deliver)"
    );
    relay.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_listens_again_after_a_cut() {
    if !opted_in() {
        return;
    }
    let _turn = NAMESPACE.lock().await;
    let net = Partitioned::up();
    let pool = dead_peer_pool(&net.url, 4).await;
    // The listener's own config: it applies `DEAD_LISTENER_AFTER` itself.
    let listener = axum_idempotency::outbox::Listener::postgres(net.url.parse().unwrap());
    listener_across_a_cut("deadpool", &net, pool, listener).await;
}

#[cfg(feature = "sqlx")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_listens_again_after_a_cut_on_sqlx() {
    if !opted_in() {
        return;
    }
    let _turn = NAMESPACE.lock().await;
    let net = Partitioned::up();
    let pool = bounded_sqlx_pool(&net.url).await;
    let listener = axum_idempotency::outbox::Listener::sqlx(&pool);
    listener_across_a_cut("sqlx", &net, pool, listener).await;
}
