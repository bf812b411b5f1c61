//! The client middleware (feature `client`) against the orders example over real HTTP:
//! a lost answer, a lost COMMIT answer, an in-flight duplicate, a reused key, a streamed
//! body, and `examples/order_client.rs` itself.

#![cfg(feature = "client")]

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum_idempotency::client::{ClientError, IdempotencyMiddleware, IdempotentResponseExt};
use common::proxy::{COMMIT_QUERY, Proxy};
use common::*;
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};

/// The request's last byte: the JSON body's closing brace (nothing before it has one). A
/// proxy rule on it forwards the whole request, then withholds the answer and cuts.
const REQUEST_END: &[u8] = b"}";

fn client() -> ClientWithMiddleware {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    ClientBuilder::new(http)
        .with(
            IdempotencyMiddleware::new()
                .backoff(Duration::from_millis(50), Duration::from_millis(500))
                .deadline(Duration::from_secs(15)),
        )
        .build()
}

/// `POST /orders` for user 1001, with the caller's own key or none.
async fn post_order(
    client: &ClientWithMiddleware,
    base: &str,
    key: Option<&str>,
    amount: i64,
) -> reqwest_middleware::Result<reqwest::Response> {
    let mut request = client
        .post(format!("{base}/orders"))
        .header("content-type", "application/json")
        .header("x-user-id", "1001")
        .body(format!(r#"{{"user_id": 1001, "amount": {amount}}}"#));
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    request.send().await
}

/// The outcome the middleware recorded: (replayed, tries).
fn outcome(response: &reqwest::Response) -> (bool, u32) {
    let outcome = response.idempotency().expect("the middleware ran");
    (outcome.replayed(), outcome.tries())
}

fn metric(text: &str, outcome: &str) -> u64 {
    let prefix = format!("idempotency_requests_total{{outcome=\"{outcome}\"}} ");
    text.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .map_or(0, |value| value.trim().parse().unwrap())
}

/// The orders example on its own schema, and a proxy in front of it that can cut.
async fn example_behind_proxy(db: &TestDb) -> (tokio::process::Child, String, Proxy) {
    let (child, addr) = start_orders_example(&[("DATABASE_URL", &schema_url(&db.schema))]).await;
    let upstream: SocketAddr = addr.parse().unwrap();
    let proxy = Proxy::to(upstream).await;
    (child, addr, proxy)
}

/// The first answer is lost after the server committed: the middleware retries with the
/// same (generated) key and gets the stored answer back; one order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_answer_is_retried_with_the_same_key_and_replayed() {
    if !common::Database::Postgres.configured() {
        return;
    }
    let db = TestDb::bare(1).await;
    let (_child, _addr, proxy) = example_behind_proxy(&db).await;
    let base = format!("http://127.0.0.1:{}", proxy.port());
    proxy.cut_on(REQUEST_END, true);

    let response = post_order(&client(), &base, None, 299).await.unwrap();
    proxy.wait_fired(Duration::from_secs(5)).await;
    assert_eq!(response.status(), 201);
    assert_eq!(outcome(&response), (true, 2), "replayed, on the second try");
    let key = response.idempotency().unwrap().key().unwrap().to_owned();
    assert_eq!(uuid_version(&key), 4, "a generated UUID v4: {key}");
    let order = json(response).await;
    assert_eq!(order["amount"], 299);
    assert_eq!(db.orders().await, 1, "exactly one order");
    assert_eq!(db.records().await, 1, "one key: both tries sent the same");
    assert_eq!(proxy.accepted(), 2, "two tries, two connections");
}

/// The server committed but lost PostgreSQL's answer to the COMMIT: it answers 503
/// (`commit_failed`), the middleware retries with the same key, the retry finds the
/// record and replays it; one order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_503_after_a_lost_commit_answer_is_retried_and_replayed() {
    if !common::Database::Postgres.configured() {
        return;
    }
    let db = TestDb::bare(1).await;
    let pg = Proxy::start().await;
    let url: tokio_postgres::Config = database_url().parse().unwrap();
    let database_url = format!(
        "postgres://{}@127.0.0.1:{}/{}?options=-c%20search_path%3D{}",
        url.get_user().unwrap_or("postgres"),
        pg.port(),
        url.get_dbname().unwrap_or("postgres"),
        db.schema
    );
    let (_child, addr) = start_orders_example(&[("DATABASE_URL", &database_url)]).await;
    pg.cut_on(COMMIT_QUERY, true);

    let response = post_order(&client(), &format!("http://{addr}"), None, 17)
        .await
        .unwrap();
    pg.wait_fired(Duration::from_secs(5)).await;
    assert_eq!(response.status(), 201);
    assert_eq!(outcome(&response), (true, 2), "a 503, then the replay");
    assert_eq!(db.orders().await, 1, "exactly one order");
}

/// A duplicate of a request still running gets 409 with `Retry-After: 1`; the middleware
/// waits that long, retries with the caller's key (never replaced) and gets the replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_flight_duplicate_waits_for_retry_after_and_gets_the_replay() {
    if !common::Database::Postgres.configured() {
        return;
    }
    let db = TestDb::bare(1).await;
    let (_child, addr) = start_orders_example(&[("DATABASE_URL", &schema_url(&db.schema))]).await;
    let base = format!("http://{addr}");
    let key = "in-flight-1";

    // Hold the orders table so the first request waits inside its handler.
    let blocker = connect(&database_url()).await;
    blocker
        .batch_execute(&format!(
            "BEGIN; LOCK TABLE {}.orders IN EXCLUSIVE MODE",
            db.schema
        ))
        .await
        .unwrap();
    let first = tokio::spawn({
        let base = base.clone();
        async move {
            let plain = ClientBuilder::new(reqwest::Client::new()).build();
            post_order(&plain, &base, Some(key), 40).await.unwrap()
        }
    });
    let waiting = format!(
        "SELECT count(*) FROM pg_locks WHERE relation = '{}.orders'::regclass AND NOT granted",
        db.schema
    );
    eventually(
        "the first request to block on the orders table",
        async || {
            let count: i64 = db.admin.query_one(&waiting, &[]).await.unwrap().get(0);
            count > 0
        },
    )
    .await;

    let started = Instant::now();
    let duplicate = tokio::spawn({
        let base = base.clone();
        async move { post_order(&client(), &base, Some(key), 40).await.unwrap() }
    });
    // The duplicate's first try got its 409: let the first request finish.
    let metrics = format!("{base}/metrics");
    eventually("the duplicate's 409", async || {
        let text = reqwest::get(&metrics).await.unwrap().text().await.unwrap();
        metric(&text, "in_flight") >= 1
    })
    .await;
    blocker.batch_execute("ROLLBACK").await.unwrap();

    assert_eq!(first.await.unwrap().status(), 201);
    let response = duplicate.await.unwrap();
    let waited = started.elapsed();
    assert_eq!(response.status(), 201);
    assert_eq!(outcome(&response), (true, 2), "a 409, then the replay");
    assert_eq!(response.idempotency().unwrap().key(), Some(key));
    assert!(
        waited >= Duration::from_secs(1),
        "Retry-After: 1 was honoured: {waited:?}"
    );
    assert_eq!(db.orders().await, 1, "exactly one order");
}

/// A 422 (the key reused with another request, or the handler's own) is the caller's bug:
/// returned at once, after one try. Each logical request gets a key of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_422_is_returned_at_once_after_one_try() {
    if !common::Database::Postgres.configured() {
        return;
    }
    let db = TestDb::bare(1).await;
    let (_child, addr) = start_orders_example(&[("DATABASE_URL", &schema_url(&db.schema))]).await;
    let base = format!("http://{addr}");
    let client = client();

    let created = post_order(&client, &base, Some("reused-1"), 10)
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    assert_eq!(outcome(&created), (false, 1));

    let started = Instant::now();
    let reused = post_order(&client, &base, Some("reused-1"), 11)
        .await
        .unwrap();
    assert_eq!(reused.status(), 422);
    assert_eq!(outcome(&reused), (false, 1), "no retry");
    assert!(started.elapsed() < Duration::from_secs(1));
    let problem = json(reused).await;
    assert_eq!(problem["code"], "key_reused");

    let refused = post_order(&client, &base, None, 0).await.unwrap();
    assert_eq!(refused.status(), 422);
    assert_eq!(outcome(&refused), (false, 1), "no retry");
    let refused_key = refused.idempotency().unwrap().key().map(str::to_owned);
    let problem = json(refused).await;
    assert_eq!(problem["code"], "invalid_amount");

    let other = post_order(&client, &base, None, 12).await.unwrap();
    assert_eq!(other.status(), 201);
    assert_ne!(
        refused_key.as_deref(),
        other.idempotency().unwrap().key(),
        "one key per logical request"
    );
    assert_eq!(db.orders().await, 2);
}

/// A streamed body cannot be sent twice: a clear error, and nothing sent.
#[tokio::test]
async fn a_streamed_body_is_refused_before_anything_is_sent() {
    if !common::Database::Postgres.configured() {
        return;
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let body = reqwest::Body::wrap(http_body_util::Full::new(bytes_of(
        r#"{"user_id": 1001, "amount": 5}"#,
    )));
    let error = client()
        .post(format!("http://{addr}/orders"))
        .body(body)
        .send()
        .await
        .unwrap_err();
    assert!(
        matches!(ClientError::find(&error), Some(ClientError::StreamedBody)),
        "{error:?}"
    );
    assert!(error.to_string().contains("streamed"), "{error}");
    let accepted = tokio::time::timeout(Duration::from_millis(200), listener.accept()).await;
    assert!(accepted.is_err(), "no connection was made");
}

/// `examples/order_client.rs` through a proxy that loses the first answer: the order is
/// created once, the answer is the replay, the example says so and exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_order_client_example_creates_one_order_across_a_lost_answer() {
    if !common::Database::Postgres.configured() {
        return;
    }
    let db = TestDb::bare(1).await;
    let (_child, _addr, proxy) = example_behind_proxy(&db).await;
    proxy.cut_on(REQUEST_END, true);

    let output = tokio::process::Command::new(example_binary("order_client"))
        .args(["--url", &format!("http://127.0.0.1:{}", proxy.port())])
        .args(["--user", "1001", "--amount", "299"])
        .env("HTTP_TIMEOUT_MS", "2000")
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8(output.stdout).unwrap();
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(output.status.success(), "{stdout}\n{stderr}");
    let (status_line, body) = stdout.split_once('\n').unwrap();
    assert_eq!(status_line, "HTTP/1.1 201 Created");
    let order: serde_json::Value = serde_json::from_str(body.trim()).unwrap();
    assert_eq!(
        (order["user_id"].as_i64(), order["amount"].as_i64()),
        (Some(1001), Some(299))
    );
    assert_eq!(stderr.trim(), "replayed=true tries=2");
    assert_eq!(db.orders().await, 1, "exactly one order");

    // A 422 exits 1.
    let output = tokio::process::Command::new(example_binary("order_client"))
        .args(["--url", &format!("http://127.0.0.1:{}", proxy.port())])
        .args(["--user", "1001", "--amount", "0"])
        .output()
        .await
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(stderr.trim(), "replayed=false tries=1");
}

async fn json(response: reqwest::Response) -> serde_json::Value {
    serde_json::from_slice(&response.bytes().await.unwrap()).unwrap()
}

fn bytes_of(text: &'static str) -> bytes::Bytes {
    bytes::Bytes::from_static(text.as_bytes())
}

fn uuid_version(key: &str) -> u32 {
    assert_eq!(key.len(), 36, "{key}");
    key[14..15].parse().unwrap()
}

/// A retried answer's body is read before the retry, so the retry goes out on the same
/// connection instead of a new one.
#[tokio::test]
async fn a_retry_reuses_the_connection_of_the_answer_it_retries() {
    if !common::Database::Postgres.configured() {
        return;
    }
    use std::collections::HashSet;
    use std::sync::{Arc, Mutex};

    use axum::extract::ConnectInfo;
    use axum::http::StatusCode;

    let peers: Arc<Mutex<Vec<SocketAddr>>> = Arc::default();
    let seen = Arc::clone(&peers);
    let app = axum::Router::new().route(
        "/orders",
        axum::routing::post(move |ConnectInfo(peer): ConnectInfo<SocketAddr>| {
            let seen = Arc::clone(&seen);
            async move {
                let mut seen = seen.lock().unwrap();
                seen.push(peer);
                if seen.len() < 3 {
                    // A problem document a few kilobytes long, like a verbose gateway's.
                    (StatusCode::SERVICE_UNAVAILABLE, "x".repeat(32 << 10))
                } else {
                    (StatusCode::CREATED, "{}".to_owned())
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    let response = post_order(&client(), &format!("http://{addr}"), Some("k"), 5)
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    assert_eq!(outcome(&response), (false, 3));
    let peers = peers.lock().unwrap();
    let connections: HashSet<_> = peers.iter().collect();
    assert_eq!(connections.len(), 1, "three tries on {peers:?}");
}
