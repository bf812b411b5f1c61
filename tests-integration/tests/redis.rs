//! The Redis front line (feature `redis`) against a real Redis and a real PostgreSQL.
//!
//! Most tests use the Redis at `REDIS_URL` (default `redis://127.0.0.1:6379`), each under a
//! key prefix of its own. The outage tests start a private `redis-server` on a free port so
//! they can stop it without disturbing anyone. Without a reachable Redis (or without
//! `redis-server`), a test says it was skipped and passes — unless `CI` is set.

#![cfg(feature = "redis")]

mod common;

use std::collections::{HashMap, HashSet};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use axum_idempotency::redis::aio::MultiplexedConnection;
use axum_idempotency::redis::{self, AsyncCommands};
use axum_idempotency::{IdempotencyLayer, IdempotentLease};
use common::*;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::sync::Semaphore;

fn redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

/// Says the test is skipped, when `CI` is unset; fails it when set.
fn skip(test: &str, why: &str) {
    if std::env::var_os("CI").is_some() {
        panic!("{test}: {why}; CI needs it");
    }
    eprintln!("{test}: skipped: {why}");
}

/// The shared Redis and a connection for checks, or `None` when it is not reachable.
async fn shared_redis(test: &str) -> Option<(redis::Client, MultiplexedConnection)> {
    let url = redis_url();
    let client = redis::Client::open(url.as_str()).expect("REDIS_URL");
    let connected = tokio::time::timeout(Duration::from_secs(2), async {
        let mut conn = client.get_multiplexed_async_connection().await?;
        redis::cmd("PING").query_async::<String>(&mut conn).await?;
        Ok::<_, redis::RedisError>(conn)
    })
    .await;
    match connected {
        Ok(Ok(conn)) => Some((client, conn)),
        Ok(Err(e)) => {
            skip(test, &format!("no Redis at {url} ({e})"));
            None
        }
        Err(_) => {
            skip(test, &format!("no answer from Redis at {url}"));
            None
        }
    }
}

/// The key prefix of one test.
fn fresh_prefix() -> String {
    unique_name("axi-redis")
}

/// The record id of (scope, key) as the crate computes it, in hex.
fn record_hex(scope: &str, key: &str) -> String {
    let mut hasher = Sha256::new();
    hasher.update(b"axum-idempotency/v1\0");
    hasher.update((scope.len() as u64).to_be_bytes());
    hasher.update(scope.as_bytes());
    hasher.update(key.as_bytes());
    hasher.finalize()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn resp_key(prefix: &str, scope: &str, key: &str) -> String {
    format!("{prefix}:resp:{}", record_hex(scope, key))
}

fn lock_key(prefix: &str, scope: &str, key: &str) -> String {
    format!("{prefix}:lock:{}", record_hex(scope, key))
}

async fn keys(conn: &mut MultiplexedConnection, pattern: String) -> Vec<String> {
    conn.keys(pattern).await.unwrap()
}

/// Lock keys left under `prefix`, waiting a little for background releases.
async fn locks_left(conn: &mut MultiplexedConnection, prefix: &str) -> Vec<String> {
    let mut left = Vec::new();
    for _ in 0..20 {
        left = keys(conn, format!("{prefix}:lock:*")).await;
        if left.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    left
}

/// How long the tests' records (and so their Redis keys) live.
const TTL: Duration = Duration::from_secs(600);

/// An app instance: its own layer (own connection to Redis) on the shared database.
fn instance(db: &TestDb, knobs: &Arc<Knobs>, client: &redis::Client, prefix: &str) -> Router {
    let layer = scoped(IdempotencyLayer::new(db.pool.clone()))
        .ttl(TTL)
        .redis(client.clone())
        .redis_prefix(prefix);
    router(Arc::clone(knobs), layer)
}

/// Deletes the test's keys from the shared Redis.
async fn forget(conn: &mut MultiplexedConnection, prefix: &str) {
    let left = keys(conn, format!("{prefix}:*")).await;
    if !left.is_empty() {
        let _: () = conn.del(left).await.unwrap();
    }
}

fn as_user(user: &str, key: &str, body: &Value) -> axum::http::Request<axum::body::Body> {
    let mut request = post_json("/orders", Some(key), body);
    request
        .headers_mut()
        .insert("x-user-id", user.parse().unwrap());
    request
}

async fn delete_records(db: &TestDb) {
    db.admin
        .batch_execute(&format!("DELETE FROM {}.idempotency_records", db.schema))
        .await
        .unwrap();
}

#[tokio::test]
async fn replays_come_from_redis_on_another_instance_with_no_database_record() {
    if !common::Database::Postgres.configured() {
        return;
    }
    const TEST: &str = "replays_come_from_redis_on_another_instance_with_no_database_record";
    let Some((client, mut conn)) = shared_redis(TEST).await else {
        return;
    };
    let db = TestDb::new(4).await;
    let knobs = Arc::new(Knobs::default());
    let prefix = fresh_prefix();
    let a = instance(&db, &knobs, &client, &prefix);
    let b = instance(&db, &knobs, &client, &prefix);

    let first = send(&a, as_user("alice", "redis-1", &json!({"amount": 5}))).await;
    assert_eq!(first.status, StatusCode::CREATED);
    let stored: Option<Vec<u8>> = conn
        .get(resp_key(&prefix, "alice", "redis-1"))
        .await
        .unwrap();
    assert!(stored.is_some(), "the completed response is in Redis");
    let ttl: i64 = conn
        .pttl(resp_key(&prefix, "alice", "redis-1"))
        .await
        .unwrap();
    assert!(
        ttl > 590_000 && ttl <= 600_000,
        "kept for the record's lifetime, not {ttl} ms"
    );
    assert!(locks_left(&mut conn, &prefix).await.is_empty());

    // Remove the record behind Redis' back: a replay now can only come from Redis.
    delete_records(&db).await;
    let replay = send(&b, as_user("alice", "redis-1", &json!({"amount": 5}))).await;
    assert_eq!(replay.status, StatusCode::CREATED);
    assert!(replay.replayed());
    assert_eq!(replay.body, first.body);
    assert_eq!(replay.headers["location"], first.headers["location"]);
    assert_eq!(replay.headers["content-type"], "application/json");
    assert!(replay.headers.get("set-cookie").is_none());
    assert!(replay.headers.get("x-not-kept").is_none());
    assert_eq!(knobs.calls(), 1);
    assert_eq!(db.records().await, 0, "nothing was written to PostgreSQL");

    // A replay from PostgreSQL puts the response (back) into Redis for every instance.
    let second = send(&a, as_user("alice", "redis-2", &json!({"amount": 6}))).await;
    assert_eq!(second.status, StatusCode::CREATED);
    let _: () = conn
        .del(resp_key(&prefix, "alice", "redis-2"))
        .await
        .unwrap();
    let from_db = send(&b, as_user("alice", "redis-2", &json!({"amount": 6}))).await;
    assert!(from_db.replayed());
    delete_records(&db).await;
    let from_redis = send(&a, as_user("alice", "redis-2", &json!({"amount": 6}))).await;
    assert!(from_redis.replayed());
    assert_eq!(from_redis.body, second.body);
    assert_eq!(knobs.calls(), 2);
    assert_eq!(db.orders().await, 2);
    assert!(locks_left(&mut conn, &prefix).await.is_empty());
    db.assert_settles().await;
    forget(&mut conn, &prefix).await;
}

#[tokio::test]
async fn scope_key_and_fingerprint_checks_hold_in_redis() {
    if !common::Database::Postgres.configured() {
        return;
    }
    const TEST: &str = "scope_key_and_fingerprint_checks_hold_in_redis";
    let Some((client, mut conn)) = shared_redis(TEST).await else {
        return;
    };
    let db = TestDb::new(4).await;
    let knobs = Arc::new(Knobs::default());
    let prefix = fresh_prefix();
    let a = instance(&db, &knobs, &client, &prefix);
    let b = instance(&db, &knobs, &client, &prefix);

    let first = send(&a, as_user("alice", "checks-1", &json!({"amount": 1}))).await;
    assert_eq!(first.status, StatusCode::CREATED);
    delete_records(&db).await;

    // Same key, other payload: 422 from Redis, as PostgreSQL would answer.
    let reused = send(&b, as_user("alice", "checks-1", &json!({"amount": 2}))).await;
    assert_eq!(reused.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(reused.problem_code(), "key_reused");
    // Same JSON in another key order: the same request, replayed.
    let same = send(
        &b,
        post_json_raw_user("alice", "checks-1", r#"{ "amount" : 1 }"#),
    )
    .await;
    assert!(same.replayed());
    // Another scope never sees it.
    let bob = send(&b, as_user("bob", "checks-1", &json!({"amount": 1}))).await;
    assert_eq!(bob.status, StatusCode::CREATED);
    assert!(!bob.replayed());
    // Another key is another operation.
    let other = send(&b, as_user("alice", "checks-2", &json!({"amount": 1}))).await;
    assert!(!other.replayed());
    // Another prefix (another service on its own database) does not share responses.
    let other_prefix = fresh_prefix();
    let elsewhere = instance(&db, &knobs, &client, &other_prefix);
    let fresh = send(
        &elsewhere,
        as_user("alice", "checks-1", &json!({"amount": 1})),
    )
    .await;
    assert_eq!(fresh.status, StatusCode::CREATED);
    assert!(!fresh.replayed());
    assert_eq!(knobs.calls(), 4);

    // A value that does not decode is ignored: PostgreSQL answers, and Redis is repaired.
    let bob_key = resp_key(&prefix, "bob", "checks-1");
    let _: () = conn.set(&bob_key, b"not a response").await.unwrap();
    let bob_again = send(&a, as_user("bob", "checks-1", &json!({"amount": 1}))).await;
    assert!(bob_again.replayed());
    assert_eq!(bob_again.body, bob.body);
    let repaired: Vec<u8> = conn.get(&bob_key).await.unwrap();
    assert_eq!(repaired[0], 1, "a well-formed response was written back");
    assert_eq!(knobs.calls(), 4);
    assert!(locks_left(&mut conn, &prefix).await.is_empty());
    forget(&mut conn, &prefix).await;
    forget(&mut conn, &other_prefix).await;
}

fn post_json_raw_user(user: &str, key: &str, raw: &str) -> axum::http::Request<axum::body::Body> {
    axum::http::Request::post("/orders")
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .header("x-user-id", user)
        .body(axum::body::Body::from(raw.to_owned()))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_duplicates_get_409_from_redis_without_asking_postgres() {
    if !common::Database::Postgres.configured() {
        return;
    }
    const TEST: &str = "in_flight_duplicates_get_409_from_redis_without_asking_postgres";
    let Some((client, mut conn)) = shared_redis(TEST).await else {
        return;
    };
    // One connection, held by the first request's transaction: a duplicate that asked
    // PostgreSQL would wait for it (10 s, then 503).
    let db = TestDb::new(1).await;
    let gate = Arc::new(Semaphore::new(0));
    let knobs = Arc::new(Knobs {
        gate: Some(Arc::clone(&gate)),
        ..Knobs::default()
    });
    let prefix = fresh_prefix();
    let a = instance(&db, &knobs, &client, &prefix);
    let b = instance(&db, &knobs, &client, &prefix);

    let first = tokio::spawn({
        let a = a.clone();
        async move { send(&a, as_user("alice", "busy-1", &json!({"amount": 1}))).await }
    });
    knobs.wait_inserted().await;
    let lock = lock_key(&prefix, "alice", "busy-1");
    let expiry: i64 = conn.pttl(&lock).await.unwrap();
    assert!(
        expiry > 55_000 && expiry <= 61_000,
        "the lock lives for the handler deadline plus a margin, not {expiry} ms"
    );

    for app in [&b, &a] {
        let started = Instant::now();
        let duplicate = send(app, as_user("alice", "busy-1", &json!({"amount": 1}))).await;
        assert_eq!(duplicate.status, StatusCode::CONFLICT);
        assert_eq!(duplicate.problem_code(), "in_flight");
        assert_eq!(duplicate.headers["retry-after"], "1");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "answered without waiting for the pool: {:?}",
            started.elapsed()
        );
    }
    // Other keys are not held up by Redis (they wait for the pool like before).
    assert_eq!(knobs.calls(), 1);

    gate.add_permits(1);
    let first = first.await.unwrap();
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(
        locks_left(&mut conn, &prefix).await.is_empty(),
        "released when done"
    );
    let retry = send(&b, as_user("alice", "busy-1", &json!({"amount": 1}))).await;
    assert!(retry.replayed());
    assert_eq!(retry.body, first.body);
    assert_eq!(knobs.calls(), 1);
    db.assert_settles().await;
    forget(&mut conn, &prefix).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_for_in_flight_goes_on_to_postgres_and_replays() {
    if !common::Database::Postgres.configured() {
        return;
    }
    const TEST: &str = "waiting_for_in_flight_goes_on_to_postgres_and_replays";
    let Some((client, mut conn)) = shared_redis(TEST).await else {
        return;
    };
    let db = TestDb::new(4).await;
    let gate = Arc::new(Semaphore::new(0));
    let knobs = Arc::new(Knobs {
        gate: Some(Arc::clone(&gate)),
        ..Knobs::default()
    });
    let prefix = fresh_prefix();
    let layer = scoped(IdempotencyLayer::new(db.pool.clone()))
        .ttl(TTL)
        .redis(client.clone())
        .redis_prefix(&prefix)
        .wait_for_in_flight(Duration::from_secs(5));
    let app = router(Arc::clone(&knobs), layer);
    let first = tokio::spawn({
        let app = app.clone();
        async move { send(&app, as_user("alice", "wait-1", &json!({"amount": 1}))).await }
    });
    knobs.wait_inserted().await;
    assert!(
        keys(&mut conn, format!("{prefix}:lock:*")).await.is_empty(),
        "no pre-filter lock when duplicates wait"
    );
    let second = tokio::spawn({
        let app = app.clone();
        async move { send(&app, as_user("alice", "wait-1", &json!({"amount": 1}))).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    gate.add_permits(1);
    let (first, second) = (first.await.unwrap(), second.await.unwrap());
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(second.replayed(), "waited and replayed, not 409");
    assert_eq!(second.body, first.body);
    assert_eq!(knobs.calls(), 1);
    forget(&mut conn, &prefix).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_are_released_on_every_path_and_expire_on_their_own() {
    if !common::Database::Postgres.configured() {
        return;
    }
    const TEST: &str = "locks_are_released_on_every_path_and_expire_on_their_own";
    let Some((client, mut conn)) = shared_redis(TEST).await else {
        return;
    };
    let db = TestDb::new(4).await;
    let knobs = Arc::new(Knobs::default());
    let prefix = fresh_prefix();
    let layer = scoped(IdempotencyLayer::new(db.pool.clone()))
        .ttl(TTL)
        .redis(client.clone())
        .redis_prefix(&prefix)
        .handler_timeout(Duration::from_millis(500));
    let app = router(Arc::clone(&knobs), layer);

    // 5xx: rolled back, not stored; the retry runs again at once.
    let failed = send(&app, as_user("u", "paths-1", &json!({"status": 503}))).await;
    assert_eq!(failed.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        locks_left(&mut conn, &prefix).await.is_empty(),
        "after a 5xx"
    );
    let retried = send(&app, as_user("u", "paths-1", &json!({"status": 503}))).await;
    assert!(!retried.replayed());
    assert_eq!(knobs.calls(), 2);

    // A panic.
    let panicked = send(&app, as_user("u", "paths-2", &json!({"panic": true}))).await;
    assert_eq!(panicked.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(
        locks_left(&mut conn, &prefix).await.is_empty(),
        "after a panic"
    );

    // The deadline.
    let hung = send(&app, as_user("u", "paths-3", &json!({"hang": true}))).await;
    assert_eq!(hung.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        locks_left(&mut conn, &prefix).await.is_empty(),
        "after the deadline"
    );

    // Answers PostgreSQL gives without running the handler: replay and 422.
    let done = send(&app, as_user("u", "paths-4", &json!({"amount": 1}))).await;
    assert_eq!(done.status, StatusCode::CREATED);
    let _: () = conn.del(resp_key(&prefix, "u", "paths-4")).await.unwrap();
    let reused = send(&app, as_user("u", "paths-4", &json!({"amount": 2}))).await;
    assert_eq!(reused.problem_code(), "key_reused");
    assert!(
        locks_left(&mut conn, &prefix).await.is_empty(),
        "after a 422"
    );
    let replayed = send(&app, as_user("u", "paths-4", &json!({"amount": 1}))).await;
    assert!(replayed.replayed());
    let _: () = conn.del(resp_key(&prefix, "u", "paths-4")).await.unwrap();
    let replayed = send(&app, as_user("u", "paths-4", &json!({"amount": 1}))).await;
    assert!(replayed.replayed());
    assert!(
        locks_left(&mut conn, &prefix).await.is_empty(),
        "after a replay"
    );

    // A lock left by a crashed instance only delays the key until it expires.
    let stale = lock_key(&prefix, "u", "paths-5");
    let _: () = redis::cmd("SET")
        .arg(&stale)
        .arg(1)
        .arg("PX")
        .arg(400)
        .query_async(&mut conn)
        .await
        .unwrap();
    let refused = send(&app, as_user("u", "paths-5", &json!({"amount": 1}))).await;
    assert_eq!(refused.status, StatusCode::CONFLICT);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let ran = send(&app, as_user("u", "paths-5", &json!({"amount": 1}))).await;
    assert_eq!(ran.status, StatusCode::CREATED);
    assert!(locks_left(&mut conn, &prefix).await.is_empty());
    db.assert_settles().await;
    forget(&mut conn, &prefix).await;
}

/// A payment-style handler in lease mode.
async fn charge(
    State((calls, gate)): State<(Arc<AtomicUsize>, Arc<Semaphore>)>,
    lease: IdempotentLease,
    Json(_): Json<Value>,
) -> Response {
    let call = calls.fetch_add(1, Ordering::SeqCst) + 1;
    if call == 1 {
        gate.acquire().await.unwrap().forget();
    }
    (
        StatusCode::CREATED,
        Json(json!({"call": call, "token": lease.fencing_token()})),
    )
        .into_response()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_mode_uses_the_front_line_too() {
    if !common::Database::Postgres.configured() {
        return;
    }
    const TEST: &str = "lease_mode_uses_the_front_line_too";
    let Some((client, mut conn)) = shared_redis(TEST).await else {
        return;
    };
    let db = TestDb::new(4).await;
    let prefix = fresh_prefix();
    let calls = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(Semaphore::new(0));
    let app = |lease: Duration| {
        let layer = IdempotencyLayer::new(db.pool.clone())
            .ttl(TTL)
            .redis(client.clone())
            .redis_prefix(&prefix)
            .lease(lease);
        Router::new()
            .route("/charges", post(charge))
            .layer(layer)
            .with_state((Arc::clone(&calls), Arc::clone(&gate)))
    };
    let (a, b) = (app(Duration::from_secs(5)), app(Duration::from_secs(5)));
    let first = tokio::spawn({
        let a = a.clone();
        async move { send(&a, post_json("/charges", Some("pay-1"), &json!({}))).await }
    });
    let lock = lock_key(&prefix, "", "pay-1");
    let mut held = false;
    for _ in 0..200 {
        if conn.exists(&lock).await.unwrap() {
            held = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(held, "the lease holder took the Redis lock");
    let expiry: i64 = conn.pttl(&lock).await.unwrap();
    assert!(
        expiry > 4_000 && expiry <= 6_000,
        "lease plus margin, not {expiry} ms"
    );
    let duplicate = send(&b, post_json("/charges", Some("pay-1"), &json!({}))).await;
    assert_eq!(duplicate.status, StatusCode::CONFLICT);
    gate.add_permits(1);
    let first = first.await.unwrap();
    assert_eq!(first.status, StatusCode::CREATED);
    delete_records(&db).await;
    let replay = send(&b, post_json("/charges", Some("pay-1"), &json!({}))).await;
    assert!(replay.replayed());
    assert_eq!(replay.body, first.body);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert!(locks_left(&mut conn, &prefix).await.is_empty());
    forget(&mut conn, &prefix).await;
}

/// A `redis-server` of the test's own on a free port, with nothing kept on disk.
struct OwnRedis {
    port: u16,
    child: Option<tokio::process::Child>,
}

impl OwnRedis {
    /// `None` when `redis-server` cannot be run here.
    async fn start(test: &str) -> Option<Self> {
        for _ in 0..5 {
            let port = {
                let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
                listener.local_addr().unwrap().port()
            };
            let mut redis = Self { port, child: None };
            match redis.spawn().await {
                Ok(true) => return Some(redis),
                Ok(false) => continue,
                Err(e) => {
                    skip(test, &format!("cannot run redis-server ({e})"));
                    return None;
                }
            }
        }
        panic!("{test}: redis-server did not come up on any free port");
    }

    /// Starts (or restarts) the server on its port; `Ok(false)` if it did not answer.
    async fn spawn(&mut self) -> std::io::Result<bool> {
        let child = tokio::process::Command::new("redis-server")
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--save", ""])
            .args(["--appendonly", "no"])
            .args(["--daemonize", "no"])
            .args(["--dir", &std::env::temp_dir().to_string_lossy()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()?;
        self.child = Some(child);
        let client = self.client();
        for _ in 0..100 {
            let ping = async {
                let mut conn = client.get_multiplexed_async_connection().await?;
                redis::cmd("PING").query_async::<String>(&mut conn).await
            };
            if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_millis(200), ping).await {
                return Ok(true);
            }
            if let Some(Ok(Some(_))) = self.child.as_mut().map(|c| c.try_wait()) {
                self.child = None;
                return Ok(false); // exited: the port was taken meanwhile
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.stop().await;
        Ok(false)
    }

    fn client(&self) -> redis::Client {
        redis::Client::open(format!("redis://127.0.0.1:{}", self.port)).unwrap()
    }

    async fn conn(&self) -> MultiplexedConnection {
        self.client()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    }

    /// Kills the server at once, as a crash would.
    async fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill().await;
        }
    }

    /// Sends a signal to the server (its own process, by id).
    fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().and_then(|c| c.id()).expect("running");
        let status = std::process::Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(pid.to_string())
            .status()
            .unwrap();
        assert!(status.success());
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        if let Some(child) = &self.child {
            if let Some(pid) = child.id() {
                // A stopped server is let go on before the kill on drop.
                let _ = std::process::Command::new("kill")
                    .arg("-CONT")
                    .arg(pid.to_string())
                    .status();
            }
        }
    }
}

/// What one request got.
struct Seen {
    key: String,
    status: StatusCode,
    body: bytes::Bytes,
    code: Option<String>,
    took: Duration,
}

async fn timed(app: &Router, key: &str) -> Seen {
    let started = Instant::now();
    let answer = send(app, post_json("/orders", Some(key), &json!({"amount": 1}))).await;
    let code = (answer.status != StatusCode::CREATED).then(|| answer.json()["code"].to_string());
    Seen {
        key: key.to_owned(),
        status: answer.status,
        body: answer.body,
        code,
        took: started.elapsed(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_stopped_mid_run_slows_requests_down_but_never_fails_or_repeats_them() {
    if !common::Database::Postgres.configured() {
        return;
    }
    const TEST: &str = "redis_stopped_mid_run_slows_requests_down_but_never_fails_or_repeats_them";
    let Some(mut server) = OwnRedis::start(TEST).await else {
        return;
    };
    let db = TestDb::new(16).await;
    let knobs = Arc::new(Knobs::default());
    let prefix = fresh_prefix();
    let instances: Vec<Router> = (0..2)
        .map(|_| {
            let layer = IdempotencyLayer::new(db.pool.clone())
                .redis(server.client())
                .redis_prefix(&prefix)
                .redis_timeout(Duration::from_millis(100));
            router(Arc::clone(&knobs), layer)
        })
        .collect();

    let stop = Arc::new(AtomicBool::new(false));
    let done_keys = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let mut workers = Vec::new();
    for worker in 0..8u64 {
        let (instances, stop, done_keys) =
            (instances.clone(), Arc::clone(&stop), Arc::clone(&done_keys));
        workers.push(tokio::spawn(async move {
            let mut seen = Vec::new();
            let mut rng = worker.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
            let mut next = move || {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                rng
            };
            let mut n = 0;
            // Bounded in count and time.
            while !stop.load(Ordering::Relaxed) && n < 2_000 {
                n += 1;
                // A fresh key, sent to both instances at once (a client retrying early).
                let key = format!("w{worker}-{n}");
                let (x, y) = tokio::join!(timed(&instances[0], &key), timed(&instances[1], &key));
                if x.status.is_success() || y.status.is_success() {
                    done_keys.lock().unwrap().push(key);
                }
                seen.push(x);
                seen.push(y);
                // A retry of some completed key, on either instance.
                let retry = {
                    let done = done_keys.lock().unwrap();
                    done.get((next() as usize) % done.len().max(1)).cloned()
                };
                if let Some(key) = retry {
                    let app = &instances[(next() % 2) as usize];
                    seen.push(timed(app, &key).await);
                }
            }
            seen
        }));
    }

    let phase = Duration::from_millis(1200);
    tokio::time::sleep(phase).await;
    let before_stop = keys(&mut server.conn().await, format!("{prefix}:resp:*"))
        .await
        .len();
    server.stop().await;
    let stopped_at = Instant::now();
    tokio::time::sleep(phase * 2).await;
    assert!(
        server.spawn().await.unwrap(),
        "redis-server restarts on its port"
    );
    let restarted_at = Instant::now();
    tokio::time::sleep(phase * 2).await;
    stop.store(true, Ordering::Relaxed);
    let mut seen = Vec::new();
    for worker in workers {
        seen.extend(worker.await.unwrap());
    }
    let after_restart = keys(&mut server.conn().await, format!("{prefix}:resp:*"))
        .await
        .len();

    // Every key ends with its one execution: retry any key that only ever saw 409.
    let mut by_key: HashMap<String, Vec<&Seen>> = HashMap::new();
    for s in &seen {
        by_key.entry(s.key.clone()).or_default().push(s);
    }
    let mut late = Vec::new();
    for (key, answers) in &by_key {
        if !answers.iter().any(|s| s.status.is_success()) {
            for _ in 0..50 {
                let s = timed(&instances[0], key).await;
                let ok = s.status.is_success();
                late.push(s);
                if ok {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    let mut all: Vec<&Seen> = seen.iter().chain(late.iter()).collect();
    all.sort_by(|x, y| x.key.cmp(&y.key));

    let mut statuses: HashMap<StatusCode, usize> = HashMap::new();
    let mut bodies: HashMap<&str, &bytes::Bytes> = HashMap::new();
    for s in &all {
        *statuses.entry(s.status).or_default() += 1;
        match s.status {
            StatusCode::CREATED => {
                let first = bodies.entry(&s.key).or_insert(&s.body);
                assert_eq!(*first, &s.body, "key {} answered with two bodies", s.key);
            }
            StatusCode::CONFLICT => {
                assert_eq!(s.code.as_deref(), Some("\"in_flight\""), "key {}", s.key);
            }
            other => panic!(
                "key {}: unexpected {other} {:?} after {:?}",
                s.key, s.body, s.took
            ),
        }
    }
    let distinct: HashSet<&str> = all.iter().map(|s| s.key.as_str()).collect();
    let slowest = all.iter().map(|s| s.took).max().unwrap_or_default();
    eprintln!(
        "{TEST}: {} requests, {} keys, {statuses:?}, slowest {slowest:?}; \
         {before_stop} responses in Redis before the stop, {after_restart} after the restart \
         (stopped {:?}, restarted {:?} before the end)",
        all.len(),
        distinct.len(),
        stopped_at.elapsed(),
        restarted_at.elapsed(),
    );
    assert_eq!(bodies.len(), distinct.len(), "every key got its 2xx");
    assert_eq!(
        db.orders().await,
        distinct.len() as i64,
        "no duplicate execution"
    );
    assert_eq!(db.records().await, distinct.len() as i64);
    assert_eq!(
        knobs.calls(),
        distinct.len(),
        "each key ran its handler once"
    );
    assert!(before_stop > 0, "Redis served before it was stopped");
    assert!(
        after_restart > 0,
        "the layers went back to Redis after its restart"
    );
    assert!(
        slowest < Duration::from_secs(5),
        "no request waited long: {slowest:?}"
    );
    db.assert_settles().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_redis_costs_a_timeout_now_and_then_not_one_per_request() {
    if !common::Database::Postgres.configured() {
        return;
    }
    const TEST: &str = "a_hung_redis_costs_a_timeout_now_and_then_not_one_per_request";
    let Some(server) = OwnRedis::start(TEST).await else {
        return;
    };
    let db = TestDb::new(4).await;
    let knobs = Arc::new(Knobs::default());
    let prefix = fresh_prefix();
    let timeout = Duration::from_millis(150);
    let layer = IdempotencyLayer::new(db.pool.clone())
        .redis(server.client())
        .redis_prefix(&prefix)
        .redis_timeout(timeout);
    let app = router(Arc::clone(&knobs), layer);
    assert_eq!(timed(&app, "hung-0").await.status, StatusCode::CREATED);

    server.signal("STOP");
    let started = Instant::now();
    let mut slow = 0;
    for n in 1..=40 {
        let s = timed(&app, &format!("hung-{n}")).await;
        assert_eq!(s.status, StatusCode::CREATED, "{:?}", s.body);
        if s.took >= timeout {
            slow += 1;
        }
        let again = timed(&app, &format!("hung-{n}")).await;
        assert_eq!(again.status, StatusCode::CREATED);
        assert_eq!(again.body, s.body, "replayed by PostgreSQL");
    }
    let elapsed = started.elapsed();
    eprintln!("{TEST}: {slow} of 80 requests waited for the hung Redis in {elapsed:?}");
    assert!(slow >= 1, "the hung Redis was asked at least once");
    // One timeout, then one per back-off second at most (a reconnect attempt).
    let allowed = 2 + elapsed.as_secs() as usize;
    assert!(
        slow <= allowed,
        "{slow} requests waited for the hung Redis in {elapsed:?} (allowed {allowed})"
    );
    server.signal("CONT");
    // After the back-off the layer uses Redis again.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let mut conn = server.conn().await;
    let mut back = false;
    for n in 0..20 {
        let key = format!("back-{n}");
        assert_eq!(timed(&app, &key).await.status, StatusCode::CREATED);
        if conn.exists(resp_key(&prefix, "", &key)).await.unwrap() {
            back = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(back, "Redis is used again once it answers");
    assert_eq!(
        db.orders().await,
        knobs.calls() as i64,
        "no duplicate execution"
    );
    assert_eq!(db.records().await, knobs.calls() as i64);
}

#[tokio::test]
async fn an_unreachable_redis_changes_nothing_but_speed() {
    if !common::Database::Postgres.configured() {
        return;
    }
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).unwrap();
    let db = TestDb::new(4).await;
    let knobs = Arc::new(Knobs::default());
    let app = instance(&db, &knobs, &client, &fresh_prefix());
    let started = Instant::now();
    for n in 0..20 {
        let key = format!("nowhere-{n}");
        let first = send(&app, as_user("u", &key, &json!({"amount": n}))).await;
        assert_eq!(first.status, StatusCode::CREATED);
        let again = send(&app, as_user("u", &key, &json!({"amount": n}))).await;
        assert!(again.replayed());
        assert_eq!(again.body, first.body);
        let reused = send(&app, as_user("u", &key, &json!({"amount": -1}))).await;
        assert_eq!(reused.problem_code(), "key_reused");
    }
    assert_eq!(knobs.calls(), 20);
    assert_eq!(db.orders().await, 20);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "no request waited for Redis: {:?}",
        started.elapsed()
    );
    db.assert_settles().await;
}

/// An instance with the hot-key limit counted in the shared Redis.
fn limited_instance(
    db: &TestDb,
    knobs: &Arc<Knobs>,
    client: &redis::Client,
    prefix: &str,
    per_second: u32,
) -> Router {
    let layer = scoped(IdempotencyLayer::new(db.pool.clone()))
        .ttl(TTL)
        .redis(client.clone())
        .redis_prefix(prefix)
        .key_attempt_limit_shared(per_second);
    router(Arc::clone(knobs), layer)
}

/// `key_attempt_limit_shared`: attempts that would reach PostgreSQL are counted in Redis,
/// across instances — a handler that answers 503 stores nothing, so every attempt would
/// run it again; past the limit the answer is 429 whichever instance it lands on, and a
/// refused attempt leaves no lock. Replays from Redis are not counted.
#[tokio::test]
async fn the_shared_attempt_limit_counts_across_instances() {
    if !common::Database::Postgres.configured() {
        return;
    }
    const TEST: &str = "the_shared_attempt_limit_counts_across_instances";
    let Some((client, mut conn)) = shared_redis(TEST).await else {
        return;
    };
    let db = TestDb::new(4).await;
    let knobs = Arc::new(Knobs::default());
    let prefix = fresh_prefix();
    let a = limited_instance(&db, &knobs, &client, &prefix, 3);
    let b = limited_instance(&db, &knobs, &client, &prefix, 3);

    let failing = json!({"amount": 1, "status": 503});
    let started = Instant::now();
    let mut statuses = Vec::new();
    for n in 0..8 {
        let app = if n % 2 == 0 { &a } else { &b };
        let answer = send(app, as_user("u", "shared-hot", &failing)).await;
        if answer.status == StatusCode::TOO_MANY_REQUESTS {
            assert_eq!(answer.headers["retry-after"], "1");
            assert_eq!(answer.problem_code(), "too_many_attempts");
        } else {
            assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
        }
        statuses.push(answer.status.as_u16());
    }
    let elapsed = started.elapsed();
    let ran = statuses.iter().filter(|status| **status == 503).count();
    assert_eq!(knobs.calls(), ran);
    if elapsed < Duration::from_secs(1) {
        assert_eq!(statuses, [503, 503, 503, 429, 429, 429, 429, 429]);
        let hits = format!("{prefix}:hits:{}", record_hex("u", "shared-hot"));
        let pttl: i64 = conn.pttl(&hits).await.unwrap();
        assert!(
            pttl > 0 && pttl <= 1000,
            "the counter expires within a second: {pttl}"
        );
    } else {
        eprintln!("{TEST}: slow machine ({elapsed:?}): exact counts not checked");
        assert!(ran <= 3 * (elapsed.as_secs() as usize + 1), "{statuses:?}");
    }
    assert!(locks_left(&mut conn, &prefix).await.is_empty());

    // A completed key is replayed from Redis: not counted, not limited.
    let ok = json!({"amount": 2});
    let first = send(&a, as_user("u", "shared-done", &ok)).await;
    assert_eq!(first.status, StatusCode::CREATED);
    for n in 0..10 {
        let app = if n % 2 == 0 { &a } else { &b };
        let replay = send(app, as_user("u", "shared-done", &ok)).await;
        assert_eq!(replay.status, StatusCode::CREATED);
        assert!(replay.replayed());
    }
    db.assert_settles().await;
    forget(&mut conn, &prefix).await;
}

/// Without a Redis that answers, the shared limit fails open to each instance's own count:
/// never an error answer, still at most the limit per second through this instance.
#[tokio::test]
async fn an_unreachable_redis_leaves_the_attempt_limit_in_process() {
    if !common::Database::Postgres.configured() {
        return;
    }
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).unwrap();
    let db = TestDb::new(2).await;
    let knobs = Arc::new(Knobs::default());
    let started = Instant::now();
    let app = limited_instance(&db, &knobs, &client, &fresh_prefix(), 2);
    let body = json!({"amount": 4});
    let mut statuses = Vec::new();
    for _ in 0..6 {
        let answer = send(&app, as_user("u", "local-hot", &body)).await;
        statuses.push(answer.status.as_u16());
    }
    let elapsed = started.elapsed();
    assert!(
        statuses.iter().all(|status| matches!(status, 201 | 429)),
        "{statuses:?}"
    );
    assert_eq!(knobs.calls(), 1);
    if elapsed < Duration::from_secs(1) {
        assert_eq!(statuses, [201, 201, 429, 429, 429, 429]);
    } else {
        eprintln!("slow machine ({elapsed:?}): exact counts not checked");
    }
    db.assert_settles().await;
}
