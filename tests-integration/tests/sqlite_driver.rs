#![cfg(feature = "sqlite")]
//! Smoke tests of the SQLite driver through the real layer: one database file per test.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::body::{Body, to_bytes};
use axum::http::{Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Extension, Json, Router};
use axum_idempotency::inbox::Outcome;
use axum_idempotency::outbox::{OutboxMessage, OutboxRelay, Outgoing, PublishError, Publisher};
use axum_idempotency::sqlite::{IdempotentTx, SqliteStore};
use axum_idempotency::{
    Admin, Error, IdempotencyLayer, IdempotentLease, Inbox, InboxError, Sweeper,
};
use serde_json::{Value, json};
use sqlx::SqlitePool;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};
use tokio::sync::Semaphore;
use tower::ServiceExt;

/// A database file of the test's own, removed at the end.
struct TempDb {
    path: PathBuf,
}

impl TempDb {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join("axum-idempotency-sqlite-driver");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{name}-{}.db", std::process::id()));
        let db = Self { path };
        db.remove();
        db
    }

    fn remove(&self) {
        for suffix in ["", "-wal", "-shm"] {
            let mut path = self.path.clone().into_os_string();
            path.push(suffix);
            let _ = std::fs::remove_file(path);
        }
    }

    fn pool(&self, size: u32) -> SqlitePool {
        pool_with(SqliteStore::connect_options(&self.path), size)
    }

    /// A migrated pool with the orders table.
    async fn ready(&self, size: u32) -> SqlitePool {
        let pool = self.pool(size);
        axum_idempotency::migrate(&pool).await.unwrap();
        sqlx::raw_sql(
            "CREATE TABLE orders (id INTEGER PRIMARY KEY AUTOINCREMENT, amount INTEGER NOT NULL)",
        )
        .execute(&pool)
        .await
        .unwrap();
        pool
    }
}

impl Drop for TempDb {
    fn drop(&mut self) {
        self.remove();
    }
}

fn pool_with(options: SqliteConnectOptions, size: u32) -> SqlitePool {
    SqlitePoolOptions::new()
        .max_connections(size)
        .acquire_timeout(Duration::from_secs(20))
        .connect_lazy_with(options)
}

/// Waits until no connection holds SQLite's write lock (one left inside a write transaction
/// would hold it for good).
async fn assert_write_lock_free(path: &Path) {
    use sqlx::Connection;
    let options = SqliteStore::connect_options(path).busy_timeout(Duration::ZERO);
    let mut conn = sqlx::SqliteConnection::connect_with(&options)
        .await
        .unwrap();
    for _ in 0..200 {
        if sqlx::raw_sql("BEGIN IMMEDIATE")
            .execute(&mut conn)
            .await
            .is_ok()
        {
            sqlx::raw_sql("ROLLBACK").execute(&mut conn).await.unwrap();
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("a connection still holds the write lock after 10 s");
}

async fn count(pool: &SqlitePool, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

/// What the handlers saw.
struct Seen {
    calls: AtomicUsize,
    /// A permit per call that started.
    started: Semaphore,
    /// When set, every call waits for a permit before answering.
    gate: Option<Arc<Semaphore>>,
}

impl Default for Seen {
    fn default() -> Self {
        Self {
            calls: AtomicUsize::new(0),
            started: Semaphore::new(0),
            gate: None,
        }
    }
}

async fn create_order(
    Extension(seen): Extension<Arc<Seen>>,
    mut tx: IdempotentTx,
    Json(body): Json<Value>,
) -> Result<Response, Error> {
    seen.calls.fetch_add(1, Ordering::SeqCst);
    seen.started.add_permits(1);
    let id: i64 = sqlx::query_scalar("INSERT INTO orders (amount) VALUES (?) RETURNING id")
        .bind(body["amount"].as_i64().unwrap_or(0))
        .fetch_one(&mut *tx)
        .await?;
    if let Some(id) = body["message"].as_str() {
        tx.enqueue(&OutboxMessage::new("orders", format!("order {id}")).id(id))
            .await?;
    }
    if let Some(gate) = &seen.gate {
        gate.acquire().await.unwrap().forget();
    }
    if body["fail"].as_bool() == Some(true) {
        return Ok(StatusCode::INTERNAL_SERVER_ERROR.into_response());
    }
    if let Some(status) = body["status"].as_u64() {
        let status = StatusCode::from_u16(status as u16).unwrap();
        return Ok((status, "refused").into_response());
    }
    let pad = "x".repeat(body["pad"].as_u64().unwrap_or(0) as usize);
    Ok((
        StatusCode::CREATED,
        [("location", format!("/orders/{id}"))],
        Json(json!({ "id": id, "pad": pad })),
    )
        .into_response())
}

async fn charge(lease: IdempotentLease) -> Response {
    (
        StatusCode::CREATED,
        Json(json!({ "token": lease.fencing_token() })),
    )
        .into_response()
}

fn app(
    pool: SqlitePool,
    seen: Arc<Seen>,
    layer: impl Fn(IdempotencyLayer<SqliteStore>) -> IdempotencyLayer<SqliteStore>,
) -> Router {
    Router::new()
        .route("/orders", post(create_order))
        .route("/charge", post(charge))
        .layer(Extension(seen))
        .layer(layer(IdempotencyLayer::new(pool)))
}

fn request(path: &str, key: &str, body: Value) -> Request<Body> {
    Request::post(path)
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .body(Body::from(body.to_string()))
        .unwrap()
}

async fn send(app: &Router, req: Request<Body>) -> (StatusCode, axum::http::HeaderMap, Vec<u8>) {
    let response = app.clone().oneshot(req).await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let body = to_bytes(response.into_body(), usize::MAX).await.unwrap();
    (status, headers, body.to_vec())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_new_key_runs_once_and_replays_byte_for_byte() {
    let db = TempDb::new("replay");
    let pool = db.ready(4).await;
    let seen = Arc::new(Seen::default());
    let app = app(pool.clone(), seen.clone(), |l| l.response_limit(2 << 20));

    let body = json!({ "amount": 299, "pad": 1024 * 1024 });
    let (status, headers, first) = send(&app, request("/orders", "A1", body.clone())).await;
    assert_eq!(
        status,
        StatusCode::CREATED,
        "{}",
        String::from_utf8_lossy(&first)
    );
    assert!(headers.get("idempotent-replayed").is_none());
    assert_eq!(count(&pool, "SELECT count(*) FROM orders").await, 1);
    assert_eq!(
        count(&pool, "SELECT count(*) FROM idempotency_records").await,
        1
    );

    let (status, headers, again) = send(&app, request("/orders", "A1", body.clone())).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(headers["location"], "/orders/1");
    assert_eq!(again, first, "the 1 MiB body replays byte for byte");
    assert_eq!(seen.calls.load(Ordering::SeqCst), 1);

    let (status, _, _) = send(&app, request("/orders", "A1", json!({ "amount": 1 }))).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);

    // Keys are case-sensitive, and a 255-character key stores and replays.
    let long = "k".repeat(255);
    for key in ["a1", long.as_str()] {
        let (status, headers, _) = send(&app, request("/orders", key, body.clone())).await;
        assert_eq!(status, StatusCode::CREATED, "{key}");
        assert!(headers.get("idempotent-replayed").is_none());
    }
    let (_, headers, _) = send(&app, request("/orders", &long, body.clone())).await;
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(count(&pool, "SELECT count(*) FROM orders").await, 3);
    let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(mode, "wal");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_in_flight_twin_gets_409_then_the_replay() {
    let db = TempDb::new("twin");
    let pool = db.ready(4).await;
    let gate = Arc::new(Semaphore::new(0));
    let seen = Arc::new(Seen {
        gate: Some(gate.clone()),
        ..Seen::default()
    });
    let app = app(pool.clone(), seen.clone(), |l| {
        l.wait_for_in_flight(Duration::from_millis(300))
    });

    let first = tokio::spawn({
        let app = app.clone();
        async move { send(&app, request("/orders", "twin", json!({ "amount": 5 }))).await }
    });
    seen.started.acquire().await.unwrap().forget();
    let started = std::time::Instant::now();
    let (status, _, _) = send(&app, request("/orders", "twin", json!({ "amount": 5 }))).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "the wait is bounded"
    );

    // A twin that waits long enough replays what the holder committed.
    let waiting = tokio::spawn({
        let pool = pool.clone();
        let seen = seen.clone();
        async move {
            let app = crate::app(pool, seen, |l| l.wait_for_in_flight(Duration::from_secs(4)));
            send(&app, request("/orders", "twin", json!({ "amount": 5 }))).await
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    gate.add_permits(1);
    let (status, _, body) = first.await.unwrap();
    assert_eq!(status, StatusCode::CREATED);
    let (status, headers, replayed) = waiting.await.unwrap();
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(replayed, body);
    assert_eq!(seen.calls.load(Ordering::SeqCst), 1);
    assert_eq!(count(&pool, "SELECT count(*) FROM orders").await, 1);
    assert_write_lock_free(&db.path).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thirty_two_concurrent_requests_with_one_key_run_it_once() {
    let db = TempDb::new("storm");
    let pool = db.ready(8).await;
    let seen = Arc::new(Seen::default());
    let app = app(pool.clone(), seen.clone(), |l| l);
    let tasks: Vec<_> = (0..32)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move {
                send(&app, request("/orders", "storm", json!({ "amount": 7 })))
                    .await
                    .0
            })
        })
        .collect();
    for task in tasks {
        let status = task.await.unwrap();
        assert!(
            status == StatusCode::CREATED || status == StatusCode::CONFLICT,
            "{status}"
        );
    }
    assert_eq!(seen.calls.load(Ordering::SeqCst), 1);
    assert_eq!(count(&pool, "SELECT count(*) FROM orders").await, 1);
    assert_eq!(
        count(&pool, "SELECT count(*) FROM idempotency_records").await,
        1
    );
    assert_write_lock_free(&db.path).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failed_handler_leaves_nothing_and_frees_the_key() {
    let db = TempDb::new("fail");
    let pool = db.ready(2).await;
    let seen = Arc::new(Seen::default());
    let app = app(pool.clone(), seen.clone(), |l| l);
    let body = json!({ "amount": 3, "fail": true, "message": "m-fail" });
    let (status, _, _) = send(&app, request("/orders", "f1", body)).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(count(&pool, "SELECT count(*) FROM orders").await, 0);
    assert_eq!(
        count(&pool, "SELECT count(*) FROM idempotency_records").await,
        0
    );
    assert_eq!(
        count(&pool, "SELECT count(*) FROM idempotency_outbox").await,
        0
    );
    // The connections came back outside any transaction: the write lock is free.
    assert_write_lock_free(&db.path).await;

    let (status, _, _) = send(&app, request("/orders", "f1", json!({ "amount": 3 }))).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(seen.calls.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leases_are_fenced_with_tokens_that_never_repeat() {
    let db = TempDb::new("lease");
    let pool = db.ready(2).await;
    let app = app(pool.clone(), Arc::new(Seen::default()), |l| l);
    let (status, _, body) = send(&app, request("/charge", "c1", json!({}))).await;
    assert_eq!(status, StatusCode::CREATED);
    let first: Value = serde_json::from_slice(&body).unwrap();
    let (status, headers, again) = send(&app, request("/charge", "c1", json!({}))).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(again, body);
    let state: String = sqlx::query_scalar("SELECT state FROM idempotency_records")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(state, "SUCCESS");
    // Purged, the key takes a new lease with a higher token.
    sqlx::query("DELETE FROM idempotency_records")
        .execute(&pool)
        .await
        .unwrap();
    let (status, _, body) = send(&app, request("/charge", "c1", json!({}))).await;
    assert_eq!(status, StatusCode::CREATED);
    let second: Value = serde_json::from_slice(&body).unwrap();
    assert!(
        second["token"].as_i64() > first["token"].as_i64(),
        "{first} {second}"
    );
}

/// A publisher that records what it was given, refusing message ids that start with `r`.
#[derive(Clone, Default)]
struct Recorder {
    published: Arc<std::sync::Mutex<Vec<String>>>,
}

impl Publisher for Recorder {
    async fn publish(&self, message: &Outgoing) -> Result<(), PublishError> {
        if message.message_id().starts_with('r') {
            return Err(PublishError::refused("no"));
        }
        self.published
            .lock()
            .unwrap()
            .push(message.message_id().to_owned());
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_outbox_relay_claims_publishes_and_settles() {
    let db = TempDb::new("outbox");
    let pool = db.ready(4).await;
    let app = app(pool.clone(), Arc::new(Seen::default()), |l| l);
    for (key, message) in [("o1", "m1"), ("o2", "m2"), ("o3", "r3")] {
        let body = json!({ "amount": 1, "message": message });
        let (status, _, _) = send(&app, request("/orders", key, body.clone())).await;
        assert_eq!(status, StatusCode::CREATED);
        // A retry replays: the message is not enqueued twice.
        send(&app, request("/orders", key, body)).await;
    }
    // Through the free function, in a transaction of one's own: a duplicate id is a no-op.
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await.unwrap();
    let enqueued =
        axum_idempotency::sqlite::enqueue(&mut *tx, &OutboxMessage::new("orders", "x").id("m1"))
            .await
            .unwrap();
    assert!(enqueued.duplicate);
    let fresh = axum_idempotency::sqlite::enqueue(&mut *tx, &OutboxMessage::new("orders", "x"))
        .await
        .unwrap();
    assert!(
        !fresh.duplicate && fresh.message_id.len() == 36,
        "{fresh:?}"
    );
    tx.commit().await.unwrap();
    assert_eq!(
        count(&pool, "SELECT count(*) FROM idempotency_outbox").await,
        4
    );

    let recorder = Recorder::default();
    let relay = OutboxRelay::new(pool.clone(), recorder.clone()).max_attempts(1);
    let report = relay.run_once().await.unwrap();
    assert_eq!(report.locked, 4);
    assert_eq!(report.published, 3);
    assert_eq!(report.parked, 1);
    assert_eq!(recorder.published.lock().unwrap()[..2], ["m1", "m2"]);
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM idempotency_outbox WHERE state = 'SENT'"
        )
        .await,
        3
    );
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM idempotency_outbox WHERE claim_token IS NOT NULL"
        )
        .await,
        0
    );
    assert_eq!(relay.run_once().await.unwrap().locked, 0);

    // The sweeper's batches run (nothing is old enough to go).
    let report = Sweeper::new(pool.clone()).run_once().await.unwrap();
    assert_eq!(report.purged_outbox, 0);
    assert_eq!(report.purged_records, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn migrate_twice_concurrently_and_refuse_what_cannot_work() {
    let db = TempDb::new("migrate");
    let (a, b) = (db.pool(2), db.pool(2));
    let (x, y) = tokio::join!(axum_idempotency::migrate(&a), axum_idempotency::migrate(&b));
    x.unwrap();
    y.unwrap();
    axum_idempotency::check_schema(&a).await.unwrap();
    assert_eq!(
        count(&a, "SELECT count(*) FROM axum_idempotency_migrations").await,
        2
    );
    axum_idempotency::migrate(&a).await.unwrap();

    // Read-only: one line naming the file.
    let ro = pool_with(SqliteStore::connect_options(&db.path).read_only(true), 1);
    let error = axum_idempotency::migrate(&ro).await.unwrap_err();
    let text = error.to_string();
    eprintln!("read-only: {text}");
    assert!(matches!(error, Error::Unsupported(_)), "{error:?}");
    assert!(
        text.contains(&db.path.display().to_string()) && text.contains("read-only"),
        "{text}"
    );
    assert!(!text.contains('\n'));

    // A directory that does not exist.
    let missing = Path::new("/nonexistent-axum-idempotency-dir/orders.db");
    let error = axum_idempotency::migrate(&pool_with(SqliteStore::connect_options(missing), 1))
        .await
        .unwrap_err();
    eprintln!("missing directory: {error}");
    assert!(matches!(error, Error::Unsupported(_)), "{error:?}");
    assert!(
        error
            .to_string()
            .contains("/nonexistent-axum-idempotency-dir/orders.db"),
        "{error:?}"
    );

    // An in-memory database: one connection works, several are refused.
    let memory: SqliteConnectOptions = "sqlite::memory:".parse().unwrap();
    axum_idempotency::migrate(&pool_with(memory.clone(), 1))
        .await
        .unwrap();
    let error = axum_idempotency::migrate(&pool_with(memory, 4))
        .await
        .unwrap_err();
    eprintln!("in memory: {error}");
    assert!(matches!(error, Error::Unsupported(_)), "{error:?}");

    // No migrations table: version 0.
    let other = TempDb::new("bare");
    let error = axum_idempotency::check_schema(&other.pool(1))
        .await
        .unwrap_err();
    assert!(error.is_schema_missing(), "{error:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stored_4xx_discards_the_handler_writes() {
    let db = TempDb::new("4xx");
    let pool = db.ready(2).await;
    let seen = Arc::new(Seen::default());
    let app = app(pool.clone(), seen.clone(), |l| l);
    let body = json!({ "amount": 3, "status": 404 });
    let (status, _, first) = send(&app, request("/orders", "n1", body.clone())).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(count(&pool, "SELECT count(*) FROM orders").await, 0);
    assert_eq!(
        count(&pool, "SELECT count(*) FROM idempotency_records").await,
        1
    );
    let (status, headers, again) = send(&app, request("/orders", "n1", body)).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(again, first);
    assert_eq!(seen.calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn inbox_admin_and_sweeper_run_on_sqlite() {
    let db = TempDb::new("inbox");
    let pool = db.ready(4).await;
    let inbox = Inbox::new(pool.clone(), "coupons");
    let insert = |mut tx: IdempotentTx| async move {
        sqlx::query("INSERT INTO orders (amount) VALUES (1)")
            .execute(&mut *tx)
            .await
            .map(|_| ())
    };
    let outcome = inbox.process("m-1", insert).await.unwrap();
    assert!(matches!(outcome, Outcome::Processed(())));
    let outcome = inbox.process("m-1", insert).await.unwrap();
    assert!(matches!(outcome, Outcome::Duplicate { .. }), "{outcome:?}");
    // Message ids are case-sensitive.
    let outcome = inbox.process("M-1", insert).await.unwrap();
    assert!(matches!(outcome, Outcome::Processed(())));
    assert_eq!(count(&pool, "SELECT count(*) FROM orders").await, 2);

    // A failed attempt rolls its work back and keeps its attempt and error.
    for attempt in 1..=2 {
        let failed = inbox
            .process("m-2", |mut tx: IdempotentTx| async move {
                sqlx::query("INSERT INTO orders (amount) VALUES (2)")
                    .execute(&mut *tx)
                    .await
                    .unwrap();
                Err::<(), _>("boom")
            })
            .await;
        assert!(
            matches!(failed, Err(InboxError::Failed { .. })),
            "{failed:?}"
        );
        let admin = Admin::new(pool.clone());
        let info = admin
            .inbox_message("coupons", "m-2")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(info.attempts, attempt);
        assert_eq!(info.last_error.as_deref(), Some("boom"));
    }
    assert_eq!(count(&pool, "SELECT count(*) FROM orders").await, 2);

    let admin = Admin::new(pool.clone());
    let page = admin.failed_page("coupons", None, 10).await.unwrap();
    assert_eq!(page.items.len(), 1);
    assert!(admin.reset_attempts("coupons", "m-2").await.unwrap());
    let overview = admin.overview(5).await.unwrap();
    assert_eq!(overview.outbox_pending, 0);

    // A stale lease: listed, released at its token, then purged by the sweeper.
    let app = app(pool.clone(), Arc::new(Seen::default()), |l| l);
    let (status, _, body) = send(&app, request("/charge", "c9", json!({}))).await;
    assert_eq!(status, StatusCode::CREATED);
    let token = serde_json::from_slice::<Value>(&body).unwrap()["token"]
        .as_i64()
        .unwrap();
    sqlx::query(
        "UPDATE idempotency_records SET state = 'PROCESSING', \
         locked_until = unixepoch('subsec') - 10",
    )
    .execute(&pool)
    .await
    .unwrap();
    let stale = admin.stale_page(None, 10).await.unwrap();
    assert_eq!(stale.items.len(), 1);
    let id = stale.items[0].id.clone();
    let record = admin.record(&id).await.unwrap().unwrap();
    assert_eq!(record.fencing_token, token);
    assert!(admin.response(&id).await.unwrap().is_some());
    assert!(admin.release_lease(&id, token).await.unwrap());
    let state: String = sqlx::query_scalar("SELECT state FROM idempotency_records")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(state, "FAILED");
    sqlx::query("UPDATE idempotency_records SET expires_at = unixepoch('subsec') - 10")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("UPDATE inbox_messages SET expires_at = unixepoch('subsec') - 10")
        .execute(&pool)
        .await
        .unwrap();
    let report = Sweeper::new(pool.clone())
        .success_grace(Duration::ZERO)
        .failure_retention(Duration::ZERO)
        .run_once()
        .await
        .unwrap();
    assert_eq!(report.purged_records, 1);
    assert_eq!(report.purged_messages, 3);
}

/// When set, the test below runs as the writer it kills: the path of the database file.
const KILLED_WRITER: &str = "AXUM_IDEMPOTENCY_KILLED_WRITER";

/// The child's side: a request whose handler writes several MiB (more than SQLite's page
/// cache, so uncommitted pages spill into the WAL file) and an outbox message, says so,
/// and holds its transaction open until the parent SIGKILLs the process.
async fn write_until_killed(path: PathBuf) {
    let pool = pool_with(SqliteStore::connect_options(&path), 2);
    let app = Router::new()
        .route(
            "/orders",
            post(|mut tx: IdempotentTx| async move {
                let pad = "x".repeat(4096);
                for amount in 0..2000 {
                    sqlx::query("INSERT INTO orders (amount, pad) VALUES (?, ?)")
                        .bind(amount)
                        .bind(&pad)
                        .execute(&mut *tx)
                        .await?;
                }
                tx.enqueue(&OutboxMessage::new("orders", "order").id("m-killed"))
                    .await?;
                println!("holding the write transaction");
                std::future::pending::<()>().await;
                Ok::<_, Error>(StatusCode::CREATED)
            }),
        )
        .layer(IdempotencyLayer::new(pool));
    send(&app, request("/orders", "killed", json!({}))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_killed_mid_transaction_leaves_nothing_and_the_retry_runs_once() {
    use tokio::io::AsyncBufReadExt;

    if let Some(path) = std::env::var_os(KILLED_WRITER) {
        return write_until_killed(path.into()).await;
    }
    let db = TempDb::new("killed-writer");
    let pool = db.pool(2);
    axum_idempotency::migrate(&pool).await.unwrap();
    sqlx::raw_sql("CREATE TABLE orders (id INTEGER PRIMARY KEY AUTOINCREMENT, amount INTEGER NOT NULL, pad TEXT)")
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;

    let mut child = tokio::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_writer_killed_mid_transaction_leaves_nothing_and_the_retry_runs_once",
            "--nocapture",
        ])
        .env(KILLED_WRITER, &db.path)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if line.contains("holding the write transaction") {
                return;
            }
        }
        panic!("the writer exited before holding its transaction");
    })
    .await
    .expect("the writer did not start its transaction in 60 s");
    let wal = std::fs::metadata(format!("{}-wal", db.path.display())).map_or(0, |m| m.len());
    assert!(
        wal > 1 << 20,
        "the writer's uncommitted pages reached the WAL ({wal} bytes)"
    );
    child.start_kill().unwrap(); // SIGKILL: no rollback, no close
    child.wait().await.unwrap();

    // Nothing of the killed request is visible, and its write lock died with it.
    let pool = db.pool(2);
    assert_write_lock_free(&db.path).await;
    for table in ["orders", "idempotency_records", "idempotency_outbox"] {
        let rows: i64 =
            sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT count(*) FROM {table}")))
                .fetch_one(&pool)
                .await
                .unwrap();
        assert_eq!(rows, 0, "{table} after the kill");
    }
    let integrity: String = sqlx::query_scalar("PRAGMA integrity_check")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(integrity, "ok");

    // The retry runs once, and its answer is what a second retry gets.
    let seen = Arc::new(Seen::default());
    let app = app(pool.clone(), seen.clone(), |l| l);
    let (status, _, first) = send(&app, request("/orders", "killed", json!({ "amount": 7 }))).await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, headers, again) =
        send(&app, request("/orders", "killed", json!({ "amount": 7 }))).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(first, again);
    assert_eq!(seen.calls.load(Ordering::SeqCst), 1);
    assert_eq!(count(&pool, "SELECT count(*) FROM orders").await, 1);
}
