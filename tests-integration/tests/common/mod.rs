//! Shared test fixtures: a private schema per test in the database named by `DATABASE_URL`,
//! and a small order service with knobs for every behaviour under test.

#![allow(dead_code, unreachable_pub, unused_imports)]

pub mod drivers;
#[cfg(feature = "mysql")]
pub mod mysql;
pub mod proxy;
pub mod rabbit;
pub mod raw_http;
pub mod recorder;
#[cfg(feature = "sqlite")]
pub mod sqlite;

pub use drivers::{
    Bb8, Database, Deadpool, Driver, MessageColumns, PgDriver, RecordColumns, Sqlx, TestDatabase,
    TestStore, TestTx,
};
#[cfg(feature = "mysql")]
pub use mysql::MySql;
#[cfg(feature = "sqlite")]
pub use sqlite::Sqlite;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::extract::State;
use axum::http::{Request, Response, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use axum::{Json, Router};
use axum_idempotency::{IdempotencyLayer, IdempotentTx, LeaseStore};
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tokio::sync::Semaphore;
use tokio_postgres::NoTls;
use tower::ServiceExt;

pub fn database_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
}

/// The RabbitMQ the broker tests use: `AMQP_URL`, or the local one.
pub fn amqp_url() -> String {
    std::env::var("AMQP_URL").unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned())
}

/// The tables the test handler (`router`) writes: orders, and a deferred foreign key
/// that can make a COMMIT fail.
pub const TEST_TABLES: &str = "
    CREATE TABLE orders (
        id      bigserial PRIMARY KEY,
        user_id bigint NOT NULL,
        amount  bigint NOT NULL
    );
    CREATE TABLE parents (id bigint PRIMARY KEY);
    CREATE TABLE children (
        parent_id bigint REFERENCES parents (id) DEFERRABLE INITIALLY DEFERRED
    );";

/// A schema of its own for one test, dropped when the test ends.
pub struct TestDb {
    pub schema: String,
    /// The size the test asked for: the deadpool pool's, and that of the pools
    /// [`Driver::pool`] makes.
    pub pool_size: usize,
    /// The search path of those pools: the schema alone, unless the test put another one
    /// before `pg_catalog` ([`TestDb::shadowing`]).
    pub search_path: String,
    pub pool: Pool,
    /// A connection outside the pool, for checks.
    pub admin: tokio_postgres::Client,
}

pub fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!(
        "{prefix}_{}_{}_{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed),
        nanos
    )
}

pub async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .expect("connect to DATABASE_URL: is PostgreSQL running?");
    tokio::spawn(connection);
    client
}

pub fn pool_for(schema: &str, max_size: usize) -> Pool {
    pool_with_search_path(schema, schema, max_size)
}

/// A pool whose connections are named after `schema` and search `search_path`.
pub fn pool_with_search_path(schema: &str, search_path: &str, max_size: usize) -> Pool {
    let mut config: tokio_postgres::Config = database_url().parse().unwrap();
    config.options(format!("-c search_path={search_path}"));
    config.application_name(schema);
    let manager = Manager::from_config(
        config,
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    // A bounded wait: a connection that never comes back fails the test instead of hanging it.
    Pool::builder(manager)
        .max_size(max_size)
        .wait_timeout(Some(Duration::from_secs(10)))
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .build()
        .unwrap()
}

impl TestDb {
    /// An empty schema: nothing migrated, no tables.
    pub async fn bare(pool_size: usize) -> Self {
        let schema = unique_name("axi");
        let admin = connect(&database_url()).await;
        admin
            .batch_execute(&format!("CREATE SCHEMA {schema}"))
            .await
            .unwrap();
        let pool = pool_for(&schema, pool_size);
        Self {
            search_path: schema.clone(),
            schema,
            pool_size,
            pool,
            admin,
        }
    }

    /// A migrated schema with the test tables (`orders`, `parents`, `children`).
    pub async fn new(pool_size: usize) -> Self {
        let db = Self::bare(pool_size).await;
        axum_idempotency::migrate(&db.pool).await.unwrap();
        let client = db.pool.get().await.unwrap();
        client.batch_execute(TEST_TABLES).await.unwrap();
        drop(client);
        db
    }

    /// A migrated schema with the test tables whose pools search it before `pg_catalog`,
    /// so that a function created in it (`shadow_sql`, run first) stands in for a built-in
    /// one of the same name and signature.
    pub async fn shadowing(pool_size: usize, shadow_sql: &str) -> Self {
        let mut db = Self::new(pool_size).await;
        db.admin
            .batch_execute(&format!("SET search_path = {}; {shadow_sql}", db.schema))
            .await
            .unwrap();
        db.search_path = format!("{},pg_catalog", db.schema);
        db.pool.close();
        db.pool = pool_with_search_path(&db.schema, &db.search_path, pool_size);
        db
    }

    /// Runs a scalar query (qualified with this test's schema by search_path).
    pub async fn scalar(&self, sql: &str) -> i64 {
        self.admin
            .batch_execute(&format!("SET search_path = {}", self.schema))
            .await
            .unwrap();
        self.admin.query_one(sql, &[]).await.unwrap().get(0)
    }

    pub async fn orders(&self) -> i64 {
        self.scalar("SELECT count(*) FROM orders").await
    }

    pub async fn records(&self) -> i64 {
        self.scalar("SELECT count(*) FROM idempotency_records")
            .await
    }

    /// Backends of this test's pool that sit inside a transaction without working.
    pub async fn idle_in_transaction(&self) -> i64 {
        self.admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE application_name = $1 AND state LIKE 'idle in transaction%'",
                &[&self.schema],
            )
            .await
            .unwrap()
            .get(0)
    }

    /// Advisory locks held by this test's pool.
    pub async fn advisory_locks(&self) -> i64 {
        self.admin
            .query_one(
                "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
                 WHERE l.locktype = 'advisory' AND a.application_name = $1",
                &[&self.schema],
            )
            .await
            .unwrap()
            .get(0)
    }

    /// Waits until no backend of this pool is in a transaction and no advisory lock is
    /// held; panics after 10 s.
    pub async fn assert_settles(&self) {
        for _ in 0..200 {
            if self.idle_in_transaction().await == 0 && self.advisory_locks().await == 0 {
                let busy: i64 = self
                    .admin
                    .query_one(
                        "SELECT count(*) FROM pg_stat_activity \
                         WHERE application_name = $1 AND state <> 'idle'",
                        &[&self.schema],
                    )
                    .await
                    .unwrap()
                    .get(0);
                if busy == 0 {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!(
            "connections did not settle: {} idle in transaction, {} advisory locks",
            self.idle_in_transaction().await,
            self.advisory_locks().await
        );
    }
}

impl TestDatabase for TestDb {
    fn pool_size(&self) -> usize {
        self.pool_size
    }

    async fn scalar(&self, sql: &str) -> i64 {
        TestDb::scalar(self, sql).await
    }

    async fn execute(&self, sql: &str) {
        self.admin
            .batch_execute(&format!("SET search_path = {}; {sql}", self.schema))
            .await
            .unwrap();
    }

    async fn expire_records(&self) {
        self.execute("UPDATE idempotency_records SET expires_at = now() - interval '1 second'")
            .await;
    }

    async fn only_record(&self) -> RecordColumns {
        let row = self
            .admin
            .query_one(
                &format!(
                    "SELECT status, body, scope, idempotency_key, \
                     extract(epoch from expires_at - created_at)::bigint, \
                     length(fingerprint)::bigint FROM {}.idempotency_records",
                    self.schema
                ),
                &[],
            )
            .await
            .unwrap();
        RecordColumns {
            status: row.get(0),
            body: row.get(1),
            scope: row.get(2),
            key: row.get(3),
            ttl_seconds: row.get(4),
            fingerprint_len: row.get(5),
        }
    }

    async fn lease_record(&self) -> (String, bool, i64, i16, bool) {
        let row = self
            .admin
            .query_one(
                &format!(
                    "SELECT state, retryable, fencing_token, status, \
                     locked_until > now() IS TRUE FROM {}.idempotency_records",
                    self.schema
                ),
                &[],
            )
            .await
            .unwrap();
        (row.get(0), row.get(1), row.get(2), row.get(3), row.get(4))
    }

    async fn next_fencing_token(&self, next: i64) {
        self.execute(&format!(
            "SELECT setval('idempotency_fencing_tokens', {})",
            next - 1
        ))
        .await;
    }

    async fn message_record(&self, group: &str, message_id: &str) -> Option<MessageColumns> {
        let row = self
            .admin
            .query_opt(
                &format!(
                    "SELECT status, attempts, last_error, payload_digest, payload \
                     FROM {}.inbox_messages WHERE consumer_group = $1 AND message_id = $2",
                    self.schema
                ),
                &[&group, &message_id],
            )
            .await
            .unwrap()?;
        Some(MessageColumns {
            status: row.get(0),
            attempts: row.get(1),
            last_error: row.get(2),
            payload_digest: row.get(3),
            payload: row.get(4),
        })
    }

    async fn expire_messages(&self) {
        self.execute("UPDATE inbox_messages SET expires_at = now() - interval '1 second'")
            .await;
    }

    async fn assert_settles(&self) {
        TestDb::assert_settles(self).await
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let schema = self.schema.clone();
        self.pool.close();
        // Dropping runs inside the test's runtime; use a thread with its own.
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async {
                let admin = connect(&database_url()).await;
                let _ = admin
                    .batch_execute(&format!(
                        "SET lock_timeout = '5s'; DROP SCHEMA IF EXISTS {schema} CASCADE"
                    ))
                    .await;
            });
        })
        .join();
    }
}

/// Knobs the test handler obeys, shared with the test.
pub struct Knobs {
    /// Handler invocations.
    pub calls: AtomicUsize,
    /// When set, the handler waits for a permit after inserting its row.
    pub gate: Option<Arc<Semaphore>>,
    /// Set by the handler once its row is inserted.
    pub inserted: Semaphore,
    /// The next call breaks its own COMMIT (a deferred foreign key fails).
    pub fail_commit_once: AtomicBool,
    /// Result of a query made by a leaked handle after the handler returned, or of a
    /// refused COMMIT.
    pub leaked_result: tokio::sync::Mutex<Option<String>>,
}

impl Default for Knobs {
    fn default() -> Self {
        Self {
            calls: AtomicUsize::new(0),
            gate: None,
            inserted: Semaphore::new(0),
            fail_commit_once: AtomicBool::new(false),
            leaked_result: tokio::sync::Mutex::new(None),
        }
    }
}

impl Knobs {
    /// Waits (at most 10 s) until a handler has inserted its row.
    pub async fn wait_inserted(&self) {
        tokio::time::timeout(Duration::from_secs(10), self.inserted.acquire())
            .await
            .expect("the handler did not insert its row in time")
            .unwrap()
            .forget();
    }

    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

/// `POST /orders` with a JSON body `{"amount": n, "status"?: code, "panic"?: true,
/// "leak"?: true, "hang"?: true, "stall_body"?: true, "enqueue"?: topic,
/// "refuse_before_work"?: code}` (`enqueue`: an outbox message to `topic` whose id is the
/// derived key `event`; `refuse_before_work`: answer `code` before the first statement).
async fn create_order<T: TestTx>(
    State(knobs): State<Arc<Knobs>>,
    mut tx: T,
    Json(body): Json<Value>,
) -> Response<Body> {
    let user: i64 = body["user_id"].as_i64().unwrap_or(1);
    let amount: i64 = body["amount"].as_i64().unwrap_or(1);
    if let Some(status) = body["refuse_before_work"].as_u64() {
        // The handler's own validation, before it uses its transaction.
        return StatusCode::from_u16(status as u16).unwrap().into_response();
    }
    // On tokio-postgres the key's lock leaves with this first statement: an in-flight
    // duplicate's statement is refused here (the panic is answered 409 by the layer), so
    // `calls` counts the handlers that got past their first statement.
    let id = tx.insert_order(user, amount).await.expect("insert order");
    knobs.calls.fetch_add(1, Ordering::SeqCst);
    if knobs.fail_commit_once.swap(false, Ordering::SeqCst) {
        tx.run("INSERT INTO children (parent_id) VALUES (-1)")
            .await
            .unwrap();
    }
    if body["try_commit"].as_bool() == Some(true) {
        let refused = tx.run("COMMIT").await.unwrap_err();
        *knobs.leaked_result.lock().await = Some(refused.to_string());
    }
    if let Some(topic) = body["enqueue"].as_str() {
        let id = tx.derive("event");
        let message = axum_idempotency::outbox::OutboxMessage::json(topic, &json!({ "order": id }))
            .unwrap()
            .id(id);
        tx.enqueue_message(&message).await.expect("enqueue");
    }
    let lock_timeout: Option<String> = match body["show_lock_timeout"].as_bool() {
        Some(true) => Some(tx.text("SHOW lock_timeout").await.unwrap()),
        _ => None,
    };
    knobs.inserted.add_permits(1);
    if let Some(gate) = &knobs.gate {
        gate.acquire().await.unwrap().forget();
    }
    if body["hang"].as_bool() == Some(true) {
        std::future::pending::<()>().await;
    }
    if body["panic"].as_bool() == Some(true) {
        panic!("handler panics on purpose");
    }
    if body["leak"].as_bool() == Some(true) {
        let knobs = Arc::clone(&knobs);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let result = tx.run("SELECT 1").await;
            *knobs.leaked_result.lock().await = Some(match result {
                Ok(_) => "ok".to_owned(),
                Err(e) => e.to_string(),
            });
        });
    }
    let status = body["status"]
        .as_u64()
        .and_then(|s| StatusCode::from_u16(s as u16).ok())
        .unwrap_or(StatusCode::CREATED);
    let mut payload = json!({ "id": id, "user_id": user, "amount": amount });
    if let Some(lock_timeout) = lock_timeout {
        payload["lock_timeout"] = json!(lock_timeout);
    }
    if body["stall_body"].as_bool() == Some(true) {
        let stream = futures_util::stream::once(async move {
            Ok::<_, std::io::Error>(bytes::Bytes::from(payload.to_string()))
        })
        .chain(futures_util::stream::pending());
        return (status, Body::from_stream(stream)).into_response();
    }
    (
        status,
        [
            ("location", format!("/orders/{id}")),
            ("set-cookie", "session=secret".to_owned()),
            ("x-not-kept", "volatile".to_owned()),
        ],
        Json(payload),
    )
        .into_response()
}

async fn plain_post() -> &'static str {
    "no idempotency here"
}

/// The test order service on the layer's driver.
pub fn router<S>(knobs: Arc<Knobs>, layer: IdempotencyLayer<S>) -> Router
where
    S: TestStore,
{
    Router::new()
        .route(
            "/orders",
            post(create_order::<IdempotentTx<S>>).get(create_order::<IdempotentTx<S>>),
        )
        .route("/plain", post(plain_post).get(plain_post))
        .layer(layer)
        .with_state(knobs)
}

/// The claim mode `AXUM_IDEMPOTENCY_CLAIM_MODE` names (`locked`, the default, or
/// `optimistic`): the behaviour suite runs in either (`.ci/run` runs it in both).
pub fn claim_mode_from_env<S: LeaseStore>(layer: IdempotencyLayer<S>) -> IdempotencyLayer<S> {
    if optimistic_from_env() {
        layer.claim_mode(axum_idempotency::ClaimMode::Optimistic)
    } else {
        layer
    }
}

/// Whether `AXUM_IDEMPOTENCY_CLAIM_MODE` asks for the optimistic claim.
pub fn optimistic_from_env() -> bool {
    match std::env::var("AXUM_IDEMPOTENCY_CLAIM_MODE").as_deref() {
        Ok("optimistic") => true,
        Ok("locked") | Err(_) => false,
        Ok(other) => panic!("AXUM_IDEMPOTENCY_CLAIM_MODE={other}: `locked` or `optimistic`"),
    }
}

pub fn scoped<S: LeaseStore>(layer: IdempotencyLayer<S>) -> IdempotencyLayer<S> {
    layer.scope(|parts| {
        parts
            .headers
            .get("x-user-id")?
            .to_str()
            .ok()
            .map(str::to_owned)
    })
}

use futures_util::StreamExt;

/// A JSON POST with an optional key.
pub fn post_json(uri: &str, key: Option<&str>, body: &Value) -> Request<Body> {
    let mut builder = Request::post(uri).header("content-type", "application/json");
    if let Some(key) = key {
        builder = builder.header("idempotency-key", key);
    }
    builder.body(Body::from(body.to_string())).unwrap()
}

/// A response with its body read.
pub struct Answer {
    pub status: StatusCode,
    pub headers: axum::http::HeaderMap,
    pub body: bytes::Bytes,
}

impl Answer {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }

    pub fn replayed(&self) -> bool {
        self.headers
            .get("idempotent-replayed")
            .map(|v| v.as_bytes())
            == Some(b"true")
    }

    pub fn problem_code(&self) -> String {
        assert_eq!(
            self.headers["content-type"], "application/problem+json",
            "not a problem document: {:?}",
            self.body
        );
        self.json()["code"].as_str().unwrap_or_default().to_owned()
    }
}

pub async fn send(app: &Router, request: Request<Body>) -> Answer {
    let response = app.clone().oneshot(request).await.unwrap();
    let (parts, body) = response.into_parts();
    Answer {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.unwrap().to_bytes(),
    }
}

/// `target/<profile>/examples/<name>`, built if `cargo test` has not built it yet.
pub fn example_binary(name: &str) -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().and_then(|deps| deps.parent()).unwrap();
    let binary = profile_dir.join("examples").join(name);
    if !binary.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
        let status = std::process::Command::new(cargo)
            .args([
                "build",
                "-p",
                "axum-idempotency",
                "--all-features",
                "--example",
                name,
            ])
            .status()
            .unwrap();
        assert!(status.success(), "building the {name} example failed");
    }
    binary
}

/// The orders example as a child process on an ephemeral port, with these environment
/// variables; returns it and the address it printed. Its output keeps being drained, so
/// it never writes into a closed pipe; it is killed when the handle drops.
pub async fn start_orders_example(env: &[(&str, &str)]) -> (tokio::process::Child, String) {
    start_example("orders", env).await
}

/// Like [`start_orders_example`], for an example of the same contract (`orders_sqlx`).
pub async fn start_example(name: &str, env: &[(&str, &str)]) -> (tokio::process::Child, String) {
    let mut command = tokio::process::Command::new(example_binary(name));
    command
        .env("BIND_ADDR", "127.0.0.1:0")
        // A relay only where the test asks for one (CI exports AMQP_URL).
        .env_remove("AMQP_URL")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true);
    for (name, value) in env {
        command.env(name, value);
    }
    let mut child = command.spawn().unwrap();
    let addr = served_address(&mut child).await;
    (child, addr)
}

/// The address an example printed on stdout once it serves; its stdout keeps being drained
/// after that, so it never writes into a closed pipe.
async fn served_address(child: &mut tokio::process::Child) -> String {
    use tokio::io::AsyncBufReadExt;
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let addr = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if let Some((_, addr)) = line.split_once("listening on http://") {
                return addr.trim().to_owned();
            }
        }
        panic!("the example exited before serving");
    })
    .await
    .expect("the example did not start in 30 s");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    addr
}

/// Like [`start_example`], with the example's stderr (its log) collected into the
/// returned buffer as it is written.
pub async fn start_example_logged(
    name: &str,
    env: &[(&str, &str)],
) -> (tokio::process::Child, String, Arc<std::sync::Mutex<String>>) {
    use tokio::io::AsyncBufReadExt;
    let mut env = env.to_vec();
    env.push(("RUST_LOG", "axum_idempotency=info"));
    let mut command = tokio::process::Command::new(example_binary(name));
    command
        .env("BIND_ADDR", "127.0.0.1:0")
        .env_remove("AMQP_URL")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    for (name, value) in &env {
        command.env(name, value);
    }
    let mut child = command.spawn().unwrap();
    let log = Arc::new(std::sync::Mutex::new(String::new()));
    let mut errors = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    tokio::spawn({
        let log = Arc::clone(&log);
        async move {
            while let Ok(Some(line)) = errors.next_line().await {
                let mut log = log.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        }
    });
    let addr = served_address(&mut child).await;
    (child, addr, log)
}

/// The coupon consumer example on `database_url`, consuming `queue` at `AMQP_URL`, once it
/// says it waits on the queue; its output keeps being drained. Killed when dropped.
#[allow(dead_code)]
pub async fn start_coupon_consumer(database_url: &str, queue: &str) -> tokio::process::Child {
    use tokio::io::AsyncBufReadExt;
    let mut child = tokio::process::Command::new(example_binary("coupon_consumer"))
        .env("DATABASE_URL", database_url)
        .env("AMQP_URL", amqp_url())
        .env("QUEUE", queue)
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
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    child
}

/// `DATABASE_URL` with this test's schema as the search path.
pub fn schema_url(schema: &str) -> String {
    format!("{}?options=-c%20search_path%3D{schema}", database_url())
}

/// Polls `check` every 50 ms until it holds; panics after 10 s.
pub async fn eventually(what: &str, mut check: impl AsyncFnMut() -> bool) {
    for _ in 0..200 {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for {what}");
}

/// Knobs whose handler waits for a permit of the returned gate after its insert.
pub fn gated() -> (Arc<Knobs>, Arc<Semaphore>) {
    let gate = Arc::new(Semaphore::new(0));
    let knobs = Arc::new(Knobs {
        gate: Some(Arc::clone(&gate)),
        ..Knobs::default()
    });
    (knobs, gate)
}

/// How long the partition tests let a request wait on a silently cut link (the examples'
/// `LINK_TIMEOUT`).
pub const LINK_BOUND: Duration = Duration::from_secs(4);

/// A migrated deadpool pool on `url`, set up for silent link cuts as the operations guide
/// says: `detect_dead_peers` and the pool's wait and create timeouts, all [`LINK_BOUND`].
pub async fn dead_peer_pool(url: &str, max_size: usize) -> Pool {
    let mut config: tokio_postgres::Config = url.parse().unwrap();
    axum_idempotency::postgres::detect_dead_peers(&mut config, LINK_BOUND);
    let manager = Manager::from_config(
        config,
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    let pool = Pool::builder(manager)
        .max_size(max_size)
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .wait_timeout(Some(LINK_BOUND))
        .create_timeout(Some(LINK_BOUND))
        .build()
        .unwrap();
    axum_idempotency::migrate(&pool).await.unwrap();
    pool
}

/// A migrated sqlx pool of 4 on `url` whose checkout is bounded by [`LINK_BOUND`].
#[cfg(feature = "sqlx")]
pub async fn bounded_sqlx_pool(url: &str) -> sqlx::PgPool {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(LINK_BOUND)
        .connect(url)
        .await
        .unwrap();
    axum_idempotency::migrate(&pool).await.unwrap();
    pool
}
