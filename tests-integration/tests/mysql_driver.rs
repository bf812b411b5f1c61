#![cfg(feature = "mysql")]
//! Smoke tests of the MySQL/MariaDB driver through the real layer, against the server at
//! `MYSQL_URL` (default `mysql://root@127.0.0.1:3306`). Each test creates its own database
//! (`axi_<unique>`) and drops it at the end.
//!
//! Run with `cargo test --no-default-features --features mysql --test mysql_driver`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::http::{Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use axum_idempotency::mysql::IdempotentTx;
use axum_idempotency::{IdempotencyLayer, IdempotentLease, Inbox, Sweeper};
use http_body_util::BodyExt;
use sqlx::{Connection, Executor, MySqlPool};
use tokio::sync::{Notify, Semaphore};
use tower::ServiceExt;

fn server_url() -> String {
    std::env::var("MYSQL_URL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306".to_owned())
}

/// A database of this test's own, dropped by [`Db::drop_database`].
struct Db {
    name: String,
    pool: MySqlPool,
}

impl Db {
    async fn new() -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let name = format!(
            "axi_{}_{}_{}",
            std::process::id(),
            nanos,
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let mut admin = sqlx::MySqlConnection::connect(&server_url()).await.unwrap();
        admin
            .execute(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .await
            .unwrap();
        admin.close().await.unwrap();
        let pool = sqlx::mysql::MySqlPoolOptions::new()
            .max_connections(40)
            .connect(&format!("{}/{name}", server_url()))
            .await
            .unwrap();
        Self { name, pool }
    }

    async fn migrated() -> Self {
        let db = Self::new().await;
        axum_idempotency::migrate(&db.pool).await.unwrap();
        db.pool
            .execute(
                "CREATE TABLE orders (id BIGINT AUTO_INCREMENT PRIMARY KEY, amount BIGINT NOT NULL) \
                 ENGINE = InnoDB",
            )
            .await
            .unwrap();
        db
    }

    async fn count(&self, sql: &'static str) -> i64 {
        sqlx::query_scalar::<_, i64>(sql)
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }

    async fn orders(&self) -> i64 {
        self.count("SELECT COUNT(*) FROM orders").await
    }

    async fn records(&self) -> i64 {
        self.count("SELECT COUNT(*) FROM idempotency_records").await
    }

    async fn drop_database(self) {
        self.pool.close().await;
        let mut admin = sqlx::MySqlConnection::connect(&server_url()).await.unwrap();
        admin
            .execute(sqlx::AssertSqlSafe(format!("DROP DATABASE {}", self.name)))
            .await
            .unwrap();
    }
}

fn request(key: &str, body: &str) -> Request<Body> {
    Request::post("/orders")
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(Body::from(body.to_owned()))
        .unwrap()
}

async fn send(app: &Router, key: &str, body: &str) -> (StatusCode, Response<Bytes>) {
    let response = app.clone().oneshot(request(key, body)).await.unwrap();
    let (parts, body) = response.into_parts();
    let bytes = body.collect().await.unwrap().to_bytes();
    (parts.status, Response::from_parts(parts, bytes))
}

fn replayed(response: &Response<Bytes>) -> bool {
    response
        .headers()
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true")
}

#[derive(serde::Deserialize)]
struct NewOrder {
    amount: i64,
}

async fn create_order(mut tx: IdempotentTx, Json(order): Json<NewOrder>) -> Response {
    let done = sqlx::query("INSERT INTO orders (amount) VALUES (?)")
        .bind(order.amount)
        .execute(&mut *tx)
        .await
        .unwrap();
    (
        StatusCode::CREATED,
        Json(serde_json::json!({ "id": done.last_insert_id(), "amount": order.amount })),
    )
        .into_response()
}

fn orders_app(pool: &MySqlPool) -> Router {
    Router::new()
        .route("/orders", post(create_order))
        .layer(IdempotencyLayer::new(pool.clone()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_key_runs_once_and_replays_byte_for_byte() {
    let db = Db::migrated().await;
    let app = orders_app(&db.pool);

    let (status, first) = send(&app, "k-1", r#"{"amount":5}"#).await;
    assert_eq!(status, StatusCode::CREATED);
    assert!(!replayed(&first));
    assert_eq!(db.orders().await, 1);
    assert_eq!(
        db.count("SELECT COUNT(*) FROM idempotency_records WHERE state = 'SUCCESS'")
            .await,
        1
    );

    let (status, again) = send(&app, "k-1", r#"{"amount":5}"#).await;
    assert_eq!(status, StatusCode::CREATED);
    assert!(replayed(&again));
    assert_eq!(again.body(), first.body());
    assert_eq!(
        again.headers().get("content-type"),
        first.headers().get("content-type")
    );
    assert_eq!(db.orders().await, 1);

    let (status, _) = send(&app, "k-1", r#"{"amount":6}"#).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(db.orders().await, 1);

    // Keys differ by case and trailing characters: three keys, three orders.
    for key in ["A1", "a1", "a1."] {
        let (status, response) = send(&app, key, r#"{"amount":1}"#).await;
        assert_eq!(status, StatusCode::CREATED, "{key}");
        assert!(!replayed(&response), "{key}");
    }
    assert_eq!(db.orders().await, 4);
    // The session the crate changed went back clean: autocommit is on for the pool.
    for _ in 0..5 {
        let autocommit: i64 = sqlx::query_scalar("SELECT @@SESSION.autocommit")
            .fetch_one(&db.pool)
            .await
            .unwrap();
        assert_eq!(autocommit, 1);
        let timeout: u64 = sqlx::query_scalar("SELECT @@SESSION.innodb_lock_wait_timeout")
            .fetch_one(&db.pool)
            .await
            .unwrap();
        assert_eq!(timeout, 50);
    }
    // ... and sqlx counts no transaction on them: a plain `begin` on each works.
    let mut held = Vec::new();
    for _ in 0..6 {
        let conn = db.pool.acquire().await.unwrap();
        assert!(!conn.is_in_transaction());
        held.push(conn);
    }
    for conn in &mut held {
        let tx = conn.begin().await.unwrap();
        tx.rollback().await.unwrap();
    }
    drop(held);
    db.drop_database().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_body_and_a_long_key_replay_byte_identically() {
    let db = Db::migrated().await;
    let body: Vec<u8> = (0..(1 << 20))
        .map(|i: u32| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let body = Bytes::from(body);
    let served = body.clone();
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let app = Router::new()
        .route(
            "/orders",
            post(move |mut tx: IdempotentTx| {
                let served = served.clone();
                let counted = counted.clone();
                async move {
                    counted.fetch_add(1, Ordering::SeqCst);
                    sqlx::query("INSERT INTO orders (amount) VALUES (1)")
                        .execute(&mut *tx)
                        .await
                        .unwrap();
                    (
                        StatusCode::OK,
                        [("content-type", "application/octet-stream")],
                        served,
                    )
                }
            }),
        )
        .layer(IdempotencyLayer::new(db.pool.clone()).response_limit(2 << 20));
    let key = "K".repeat(255);
    let (status, first) = send(&app, &key, "{}").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(first.body(), &body);
    let (status, again) = send(&app, &key, "{}").await;
    assert_eq!(status, StatusCode::OK);
    assert!(replayed(&again));
    assert_eq!(again.body().len(), body.len());
    assert!(again.body() == &body, "the replayed body differs");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let stored: i64 = db
        .count("SELECT CAST(LENGTH(body) AS SIGNED) FROM idempotency_records")
        .await;
    assert_eq!(stored, 1 << 20);
    db.drop_database().await;
}

/// A handler held on a semaphore, counting its runs.
fn gated_app(
    pool: &MySqlPool,
    layer: IdempotencyLayer<axum_idempotency::mysql::MySqlStore>,
) -> (Router, Arc<Semaphore>, Arc<Notify>, Arc<AtomicUsize>) {
    let _ = pool;
    let gate = Arc::new(Semaphore::new(0));
    let entered = Arc::new(Notify::new());
    let runs = Arc::new(AtomicUsize::new(0));
    let (g, e, r) = (gate.clone(), entered.clone(), runs.clone());
    let app = Router::new()
        .route(
            "/orders",
            post(move |mut tx: IdempotentTx| {
                let (g, e, r) = (g.clone(), e.clone(), r.clone());
                async move {
                    r.fetch_add(1, Ordering::SeqCst);
                    sqlx::query("INSERT INTO orders (amount) VALUES (7)")
                        .execute(&mut *tx)
                        .await
                        .unwrap();
                    e.notify_one();
                    g.acquire().await.unwrap().forget();
                    (StatusCode::CREATED, "made")
                }
            }),
        )
        .layer(layer);
    (app, gate, entered, runs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_flight_twin_gets_409_at_once_or_waits_for_the_replay() {
    let db = Db::migrated().await;
    let (app, gate, entered, runs) = gated_app(&db.pool, IdempotencyLayer::new(db.pool.clone()));
    let first = tokio::spawn({
        let app = app.clone();
        async move { send(&app, "twin", "{}").await.0 }
    });
    entered.notified().await;
    let started = Instant::now();
    let (status, _) = send(&app, "twin", "{}").await;
    let took = started.elapsed();
    assert_eq!(status, StatusCode::CONFLICT);
    assert!(took < Duration::from_millis(900), "409 took {took:?}");
    println!("in-flight twin answered 409 in {took:?}");
    gate.add_permits(1);
    assert_eq!(first.await.unwrap(), StatusCode::CREATED);
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // With a wait: the twin waits for the holder and replays what it committed.
    let layer = IdempotencyLayer::new(db.pool.clone()).wait_for_in_flight(Duration::from_secs(5));
    let (app, gate, entered, runs) = gated_app(&db.pool, layer);
    let first = tokio::spawn({
        let app = app.clone();
        async move { send(&app, "waited", "{}").await.0 }
    });
    entered.notified().await;
    let twin = tokio::spawn({
        let app = app.clone();
        async move { send(&app, "waited", "{}").await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    gate.add_permits(1);
    assert_eq!(first.await.unwrap(), StatusCode::CREATED);
    let (status, response) = twin.await.unwrap();
    assert_eq!(status, StatusCode::CREATED);
    assert!(replayed(&response));
    assert_eq!(response.body().as_ref(), b"made");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(db.orders().await, 2);
    db.drop_database().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_two_concurrent_requests_make_one_order() {
    let db = Db::migrated().await;
    let app = orders_app(&db.pool);
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let app = app.clone();
        tasks.push(tokio::spawn(async move {
            send(&app, "same", r#"{"amount":3}"#).await.0
        }));
    }
    let mut statuses = Vec::new();
    for task in tasks {
        statuses.push(task.await.unwrap());
    }
    assert!(
        statuses
            .iter()
            .all(|s| *s == StatusCode::CREATED || *s == StatusCode::CONFLICT),
        "{statuses:?}"
    );
    assert!(statuses.contains(&StatusCode::CREATED));
    assert_eq!(db.orders().await, 1);
    assert_eq!(db.records().await, 1);
    db.drop_database().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_500_leaves_nothing_and_a_stored_4xx_discards_the_writes() {
    let db = Db::migrated().await;
    let app = Router::new()
        .route(
            "/orders",
            post(
                |mut tx: IdempotentTx, Json(order): Json<NewOrder>| async move {
                    sqlx::query("INSERT INTO orders (amount) VALUES (?)")
                        .bind(order.amount)
                        .execute(&mut *tx)
                        .await
                        .unwrap();
                    match order.amount {
                        500 => (StatusCode::INTERNAL_SERVER_ERROR, "boom"),
                        400 => (StatusCode::BAD_REQUEST, "refused"),
                        _ => (StatusCode::CREATED, "made"),
                    }
                },
            ),
        )
        .layer(IdempotencyLayer::new(db.pool.clone()));
    let (status, _) = send(&app, "fails", r#"{"amount":500}"#).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(db.orders().await, 0);
    assert_eq!(db.records().await, 0);

    let (status, _) = send(&app, "refused", r#"{"amount":400}"#).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(
        db.orders().await,
        0,
        "a stored 4xx keeps none of the handler's writes"
    );
    assert_eq!(db.records().await, 1);
    let (status, again) = send(&app, "refused", r#"{"amount":400}"#).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(replayed(&again));
    assert_eq!(again.body().as_ref(), b"refused");
    db.drop_database().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadlock_the_handler_swallows_leaves_nothing_and_answers_503() {
    let db = Db::migrated().await;
    db.pool
        .execute(
            "CREATE TABLE locks (id INT PRIMARY KEY, v INT NOT NULL) ENGINE = InnoDB; \
             INSERT INTO locks VALUES (1, 0), (2, 0); \
             CREATE TABLE ballast (id INT AUTO_INCREMENT PRIMARY KEY, v INT) ENGINE = InnoDB",
        )
        .await
        .unwrap();
    let locked_first = Arc::new(Notify::new());
    let other_waits = Arc::new(Notify::new());
    // The other transaction: heavy (so InnoDB picks the handler as the victim), holds row 2,
    // then waits for row 1.
    let other = tokio::spawn({
        let pool = db.pool.clone();
        let (locked_first, other_waits) = (locked_first.clone(), other_waits.clone());
        async move {
            let mut tx = pool.begin().await.unwrap();
            for _ in 0..20 {
                sqlx::query("INSERT INTO ballast (v) VALUES (1), (2), (3), (4), (5)")
                    .execute(&mut *tx)
                    .await
                    .unwrap();
            }
            sqlx::query("UPDATE locks SET v = v + 1 WHERE id = 2")
                .execute(&mut *tx)
                .await
                .unwrap();
            locked_first.notified().await;
            other_waits.notify_one();
            let result = sqlx::query("UPDATE locks SET v = v + 1 WHERE id = 1")
                .execute(&mut *tx)
                .await;
            tx.rollback().await.unwrap();
            result.is_ok()
        }
    });
    let deadlocked = Arc::new(AtomicUsize::new(0));
    let seen = deadlocked.clone();
    let app = Router::new()
        .route(
            "/orders",
            post(move |mut tx: IdempotentTx| {
                let (locked_first, other_waits, seen) =
                    (locked_first.clone(), other_waits.clone(), seen.clone());
                async move {
                    sqlx::query("INSERT INTO orders (amount) VALUES (1)")
                        .execute(&mut *tx)
                        .await
                        .unwrap();
                    sqlx::query("UPDATE locks SET v = v + 1 WHERE id = 1")
                        .execute(&mut *tx)
                        .await
                        .unwrap();
                    locked_first.notify_one();
                    other_waits.notified().await;
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    let crossed = sqlx::query("UPDATE locks SET v = v + 1 WHERE id = 2")
                        .execute(&mut *tx)
                        .await;
                    if let Err(e) = &crossed {
                        // Swallowed: the handler goes on as if nothing happened.
                        println!("handler's statement failed: {e}");
                        seen.fetch_add(1, Ordering::SeqCst);
                    }
                    sqlx::query("INSERT INTO orders (amount) VALUES (2)")
                        .execute(&mut *tx)
                        .await
                        .unwrap();
                    (StatusCode::CREATED, "made")
                }
            }),
        )
        .layer(IdempotencyLayer::new(db.pool.clone()));
    let (status, response) = send(&app, "deadlock", "{}").await;
    assert!(
        other.await.unwrap(),
        "the other transaction should have won"
    );
    assert_eq!(
        deadlocked.load(Ordering::SeqCst),
        1,
        "the handler was the victim"
    );
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(response.headers().contains_key("retry-after"));
    assert_eq!(db.orders().await, 0, "nothing of the request remains");
    assert_eq!(db.records().await, 0);
    // The key is free: the retry runs once.
    let app = orders_app(&db.pool);
    let (status, _) = send(&app, "deadlock", r#"{"amount":1}"#).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(db.orders().await, 1);
    db.drop_database().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_connection_leaves_nothing_and_the_retry_runs_once() {
    let db = Db::migrated().await;
    let kill = Arc::new(Notify::new());
    let killed = Arc::new(Notify::new());
    let victim = Arc::new(std::sync::Mutex::new(0_u64));
    let (k, kd, v) = (kill.clone(), killed.clone(), victim.clone());
    let app = Router::new()
        .route(
            "/orders",
            post(move |mut tx: IdempotentTx| {
                let (k, kd, v) = (k.clone(), kd.clone(), v.clone());
                async move {
                    sqlx::query("INSERT INTO orders (amount) VALUES (1)")
                        .execute(&mut *tx)
                        .await
                        .unwrap();
                    let id: u64 = sqlx::query_scalar("SELECT CONNECTION_ID()")
                        .fetch_one(&mut *tx)
                        .await
                        .unwrap();
                    *v.lock().unwrap() = id;
                    k.notify_one();
                    kd.notified().await;
                    (StatusCode::CREATED, "made")
                }
            }),
        )
        .layer(IdempotencyLayer::new(db.pool.clone()));
    let request = tokio::spawn({
        let app = app.clone();
        async move { send(&app, "killed", "{}").await }
    });
    kill.notified().await;
    let id = *victim.lock().unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!("KILL {id}")))
        .execute(&db.pool)
        .await
        .unwrap();
    killed.notify_one();
    let (status, response) = request.await.unwrap();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(response.headers().contains_key("retry-after"));
    assert_eq!(db.orders().await, 0);
    assert_eq!(db.records().await, 0);
    let app = orders_app(&db.pool);
    let (status, _) = send(&app, "killed", r#"{"amount":1}"#).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(db.orders().await, 1);
    db.drop_database().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_mode_commits_processing_then_success_with_tokens_that_never_repeat() {
    let db = Db::migrated().await;
    let app = Router::new()
        .route(
            "/orders",
            post(|lease: IdempotentLease| async move {
                (StatusCode::CREATED, lease.fencing_token().to_string())
            }),
        )
        .layer(IdempotencyLayer::new(db.pool.clone()));
    let (status, first) = send(&app, "lease-1", "{}").await;
    assert_eq!(status, StatusCode::CREATED);
    let token: i64 = std::str::from_utf8(first.body()).unwrap().parse().unwrap();
    assert!(token >= 1);
    let (status, again) = send(&app, "lease-1", "{}").await;
    assert_eq!(status, StatusCode::CREATED);
    assert!(replayed(&again));
    assert_eq!(again.body(), first.body());
    assert_eq!(
        db.count("SELECT COUNT(*) FROM idempotency_records WHERE state = 'SUCCESS'")
            .await,
        1
    );
    // Purged, the key leases again with a higher token.
    db.pool
        .execute("DELETE FROM idempotency_records")
        .await
        .unwrap();
    let (status, second) = send(&app, "lease-1", "{}").await;
    assert_eq!(status, StatusCode::CREATED);
    let second: i64 = std::str::from_utf8(second.body()).unwrap().parse().unwrap();
    assert!(second > token, "{second} after {token}");
    db.drop_database().await;
}

/// A lease's answer too large to travel inlined (over 1 MiB with its headers) is stored by
/// the bound completion, and replayed byte for byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_whose_answer_is_over_a_mebibyte_replays_byte_identically() {
    let db = Db::migrated().await;
    let body = Bytes::from(
        (0..(1 << 20) + 17)
            .map(|i: u32| (i.wrapping_mul(2_654_435_761) >> 11) as u8)
            .collect::<Vec<u8>>(),
    );
    let served = body.clone();
    let app = Router::new()
        .route(
            "/orders",
            post(move |_lease: IdempotentLease| {
                let served = served.clone();
                async move { (StatusCode::CREATED, served) }
            }),
        )
        .layer(IdempotencyLayer::new(db.pool.clone()).response_limit(2 << 20));
    let (status, first) = send(&app, "big-lease", "{}").await;
    assert_eq!(status, StatusCode::CREATED);
    assert!(first.body() == &body);
    let (status, again) = send(&app, "big-lease", "{}").await;
    assert_eq!(status, StatusCode::CREATED);
    assert!(replayed(&again));
    assert!(again.body() == &body, "the replayed body differs");
    assert_eq!(
        db.count(
            "SELECT CAST(LENGTH(body) AS SIGNED) FROM idempotency_records WHERE state = 'SUCCESS'"
        )
        .await,
        (1 << 20) + 17
    );
    db.drop_database().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_twice_at_once_and_check_schema() {
    let db = Db::new().await;
    let unmigrated = axum_idempotency::check_schema(&db.pool).await.unwrap_err();
    assert!(unmigrated.to_string().contains("version 0"), "{unmigrated}");
    let (a, b) = tokio::join!(
        axum_idempotency::migrate(&db.pool),
        axum_idempotency::migrate(&db.pool)
    );
    a.unwrap();
    b.unwrap();
    axum_idempotency::migrate(&db.pool).await.unwrap();
    axum_idempotency::check_schema(&db.pool).await.unwrap();
    assert_eq!(
        db.count("SELECT COUNT(*) FROM axum_idempotency_migrations")
            .await,
        2
    );
    assert_eq!(
        db.count("SELECT COUNT(*) FROM idempotency_counters").await,
        1
    );
    db.drop_database().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbox_ids_and_groups_are_case_and_space_sensitive() {
    let db = Db::migrated().await;
    for group in ["G1", "g1", "g1 "] {
        let inbox = Inbox::new(db.pool.clone(), group);
        // Message ids are printable ASCII without spaces; groups may end in one.
        for id in ["A1", "a1", "a1."] {
            let outcome = inbox
                .process(id, |mut tx: IdempotentTx| async move {
                    sqlx::query("INSERT INTO orders (amount) VALUES (1)")
                        .execute(&mut *tx)
                        .await
                        .map_err(|e| e.to_string())
                })
                .await;
            assert!(
                matches!(outcome, Ok(axum_idempotency::inbox::Outcome::Processed(_))),
                "{group:?} {id:?}: {outcome:?}"
            );
        }
        // Delivered again: duplicates.
        let again = inbox
            .process(
                "a1.",
                |_tx: IdempotentTx| async move { Ok::<_, String>(()) },
            )
            .await;
        assert!(matches!(
            again,
            Ok(axum_idempotency::inbox::Outcome::Duplicate { .. })
        ));
    }
    assert_eq!(db.orders().await, 9);
    assert_eq!(
        db.count("SELECT COUNT(*) FROM inbox_messages WHERE status = 'SUCCESS'")
            .await,
        9
    );
    db.drop_database().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purging_many_expired_rows_does_not_block_new_keys() {
    let db = Db::migrated().await;
    // 20 000 records expired an hour ago.
    for chunk in 0..20 {
        let mut values = Vec::new();
        for i in 0..1000 {
            values.push(format!(
                "(UNHEX(MD5('expired-{chunk}-{i}')), 's', REPEAT('f', 32), 201, '', 'x', \
                 UTC_TIMESTAMP(6) - INTERVAL 2 HOUR, UTC_TIMESTAMP(6) - INTERVAL 2 HOUR, \
                 UTC_TIMESTAMP(6) - INTERVAL 1 HOUR)"
            ));
        }
        let sql = format!(
            "INSERT INTO idempotency_records (id, scope, fingerprint, status, headers, body, \
             created_at, updated_at, expires_at) VALUES {}",
            values.join(", ")
        );
        db.pool.execute(sqlx::AssertSqlSafe(sql)).await.unwrap();
    }
    let app = orders_app(&db.pool);
    let measure = |label: &'static str, app: Router| async move {
        let mut worst = Duration::ZERO;
        let mut total = Duration::ZERO;
        for i in 0..40 {
            let started = Instant::now();
            let (status, _) = send(&app, &format!("{label}-{i}"), r#"{"amount":1}"#).await;
            let took = started.elapsed();
            assert_eq!(status, StatusCode::CREATED);
            worst = worst.max(took);
            total += took;
        }
        (total / 40, worst)
    };
    let (idle_mean, idle_worst) = measure("idle", app.clone()).await;
    let sweeper = Sweeper::new(db.pool.clone())
        .batch_size(500)
        .success_grace(Duration::ZERO)
        .failure_retention(Duration::ZERO);
    let purging = tokio::spawn(async move {
        let mut purged = 0;
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(20) {
            let report = sweeper.run_once().await.unwrap();
            let n = format!("{report:?}");
            purged += 1;
            if n.contains("records: 0") && purged > 3 {
                break;
            }
        }
        purged
    });
    let (busy_mean, busy_worst) = measure("busy", app.clone()).await;
    let rounds = purging.await.unwrap();
    println!(
        "new-key latency: idle mean {idle_mean:?} worst {idle_worst:?}; while purging \
         ({rounds} sweeps) mean {busy_mean:?} worst {busy_worst:?}"
    );
    assert!(
        busy_worst < Duration::from_secs(2),
        "a new key stalled {busy_worst:?}"
    );
    let left = db
        .count("SELECT COUNT(*) FROM idempotency_records WHERE expires_at < UTC_TIMESTAMP(6)")
        .await;
    println!("expired rows left: {left}");
    assert_eq!(db.records().await - left, 80);
    db.drop_database().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_enqueue_is_idempotent_and_the_relay_batch_locks_rows() {
    use axum_idempotency::outbox::OutboxMessage;
    let db = Db::migrated().await;
    let mut tx = db.pool.begin().await.unwrap();
    let first = axum_idempotency::mysql::enqueue(
        &mut tx,
        &OutboxMessage::new("A1", "one").id("m-1").ordering_key("k"),
    )
    .await
    .unwrap();
    assert!(!first.duplicate);
    let again =
        axum_idempotency::mysql::enqueue(&mut tx, &OutboxMessage::new("A1", "one").id("m-1"))
            .await
            .unwrap();
    assert!(again.duplicate);
    let generated = axum_idempotency::mysql::enqueue(&mut tx, &OutboxMessage::new("a1 ", "two"))
        .await
        .unwrap();
    assert!(!generated.duplicate);
    assert_eq!(generated.message_id.len(), 36);
    // Case-sensitive ids: `M-1` is another message.
    let other = axum_idempotency::mysql::enqueue(&mut tx, &OutboxMessage::new("a1", "x").id("M-1"))
        .await
        .unwrap();
    assert!(!other.duplicate);
    tx.commit().await.unwrap();
    assert_eq!(
        db.count("SELECT COUNT(*) FROM idempotency_outbox WHERE state = 'PENDING'")
            .await,
        3
    );
    assert_eq!(
        db.count("SELECT COUNT(DISTINCT topic) FROM idempotency_outbox")
            .await,
        3
    );
    db.drop_database().await;
}

struct RefusesBad;

impl axum_idempotency::outbox::Publisher for RefusesBad {
    async fn publish(
        &self,
        message: &axum_idempotency::outbox::Outgoing,
    ) -> Result<(), axum_idempotency::outbox::PublishError> {
        if message.topic() == "bad" {
            Err(axum_idempotency::outbox::PublishError::refused("no route"))
        } else {
            Ok(())
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_settles_and_admin_reads_every_table() {
    use axum_idempotency::outbox::{OutboxMessage, OutboxRelay};
    use axum_idempotency::{Admin, OutboxState};
    let db = Db::migrated().await;
    let mut tx = db.pool.begin().await.unwrap();
    for (topic, id) in [("good", "m-1"), ("bad", "m-2"), ("good", "m-3")] {
        axum_idempotency::mysql::enqueue(
            &mut tx,
            &OutboxMessage::new(topic, "x").id(id).ordering_key(id),
        )
        .await
        .unwrap();
    }
    tx.commit().await.unwrap();
    let relay = OutboxRelay::new(db.pool.clone(), RefusesBad).max_attempts(1);
    let report = relay.run_once().await.unwrap();
    assert_eq!((report.locked, report.published, report.refused), (3, 2, 1));
    assert_eq!(report.parked, 1);
    assert!(relay.run_once().await.unwrap().locked == 0);

    // A failed inbox message, a record and a stale lease for the look-ups.
    let inbox = Inbox::new(db.pool.clone(), "grp");
    let failed = inbox
        .process("msg-1", |_tx: IdempotentTx| async move {
            Err::<(), _>("it broke")
        })
        .await;
    assert!(failed.is_err());
    let app = orders_app(&db.pool);
    assert_eq!(
        send(&app, "admin-1", r#"{"amount":1}"#).await.0,
        StatusCode::CREATED
    );
    db.pool
        .execute(
            "INSERT INTO idempotency_records (id, scope, fingerprint, status, headers, body, \
             state, fencing_token, locked_until, created_at, updated_at, expires_at) VALUES \
             (UNHEX(MD5('stale')), 's', REPEAT('f', 32), 0, '', '', 'PROCESSING', 7, \
              UTC_TIMESTAMP(6) - INTERVAL 1 MINUTE, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), \
              UTC_TIMESTAMP(6) + INTERVAL 1 HOUR)",
        )
        .await
        .unwrap();

    let admin = Admin::new(db.pool.clone());
    let overview = admin.overview(1).await.unwrap();
    println!("{overview:?}");
    assert_eq!(overview.outbox_parked, 1);
    assert_eq!(overview.stale, 1);
    let parked = admin
        .outbox_messages(OutboxState::Failed, 10)
        .await
        .unwrap();
    assert_eq!(parked.len(), 1);
    assert_eq!(parked[0].message_id, "m-2");
    assert!(
        admin
            .outbox_page(OutboxState::Failed, None, 10)
            .await
            .unwrap()
            .items
            .len()
            == 1
    );
    assert!(admin.requeue_outbox("m-2").await.unwrap());
    let stale = admin.stale_page(None, 10).await.unwrap();
    assert_eq!(stale.items.len(), 1);
    let id = stale.items[0].id.clone();
    assert_eq!(admin.stale(10).await.unwrap().len(), 1);
    assert!(admin.record(&id).await.unwrap().is_some());
    assert!(admin.response(&id).await.unwrap().is_some());
    assert!(!admin.release_lease(&id, 6).await.unwrap());
    assert!(admin.release_lease(&id, 7).await.unwrap());
    assert!(admin.delete_record(&id, 7).await.unwrap());
    let messages = admin.failed_page("grp", None, 10).await.unwrap();
    assert_eq!(messages.items.len(), 1);
    assert_eq!(messages.items[0].attempts, 1);
    assert_eq!(admin.failed_messages("grp", 10).await.unwrap().len(), 1);
    assert!(admin.inbox_message("grp", "msg-1").await.unwrap().is_some());
    assert!(admin.reset_attempts("grp", "msg-1").await.unwrap());
    let report = admin.purge_now().await.unwrap();
    println!("{report:?}");
    db.drop_database().await;
}

/// A caller's future dropped while its `BEGIN` was in flight leaves its pooled connection
/// inside a transaction sqlx does not count (it counts one only once `BEGIN`'s answer has
/// arrived). The same state, made on purpose: `BEGIN` sent as a plain statement on a pooled
/// connection of a one-connection pool, a write in it, the connection back in the pool. The
/// layer's claim meets it (1568 when it sets the next transaction's isolation), closes it —
/// the stray write rolled back with it — and serves the request on a new connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooled_connection_left_inside_a_transaction_costs_no_answer() {
    let db = Db::migrated().await;
    let pool = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(1)
        .connect(&format!("{}/{}", server_url(), db.name))
        .await
        .unwrap();
    let stray_connection_id = {
        let mut conn = pool.acquire().await.unwrap();
        conn.execute("BEGIN").await.unwrap();
        conn.execute("INSERT INTO orders (amount) VALUES (99)")
            .await
            .unwrap();
        assert!(
            !conn.is_in_transaction(),
            "sqlx does not count a BEGIN sent as a statement"
        );
        sqlx::query_scalar::<_, u64>("SELECT CONNECTION_ID()")
            .fetch_one(&mut *conn)
            .await
            .unwrap()
    };
    let app = orders_app(&pool);
    let (status, response) = send(&app, "dirty-1", r#"{"amount":5}"#).await;
    assert_eq!(
        status,
        StatusCode::CREATED,
        "{:?}",
        String::from_utf8_lossy(response.body())
    );
    let (status, again) = send(&app, "dirty-1", r#"{"amount":5}"#).await;
    assert_eq!(status, StatusCode::CREATED);
    assert!(replayed(&again));
    let amounts: Vec<i64> = sqlx::query_scalar("SELECT amount FROM orders ORDER BY id")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(
        amounts,
        [5],
        "the stray write was rolled back with its connection"
    );
    let now_id = sqlx::query_scalar::<_, u64>("SELECT CONNECTION_ID()")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_ne!(
        now_id, stray_connection_id,
        "the dirty connection was closed"
    );
    // Again: every claim that meets such a connection discards it.
    {
        let mut conn = pool.acquire().await.unwrap();
        conn.execute("BEGIN").await.unwrap();
    }
    let (status, _) = send(&app, "dirty-2", r#"{"amount":6}"#).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(db.orders().await, 2);
    pool.close().await;
    db.drop_database().await;
}

/// The commands one pooled connection sends, as a proxy between it and the server sees
/// them: each client packet that starts a command (sequence id 0), named by its type, with
/// the first words of a text query.
struct CommandLog {
    addr: std::net::SocketAddr,
    log: Arc<std::sync::Mutex<Vec<String>>>,
}

impl CommandLog {
    async fn start(upstream: &str) -> Self {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let upstream = upstream.to_owned();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let log = Arc::new(std::sync::Mutex::new(Vec::new()));
        let shared = log.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let server = tokio::net::TcpStream::connect(&upstream).await.unwrap();
                let (mut client_read, mut client_write) = client.into_split();
                let (mut server_read, mut server_write) = server.into_split();
                tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut server_read, &mut client_write).await;
                });
                let log = shared.clone();
                tokio::spawn(async move {
                    let mut pending = Vec::new();
                    let mut buf = vec![0; 1 << 16];
                    loop {
                        let n = match client_read.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        pending.extend_from_slice(&buf[..n]);
                        while pending.len() >= 4 {
                            let len = usize::from(pending[0])
                                | usize::from(pending[1]) << 8
                                | usize::from(pending[2]) << 16;
                            if pending.len() < 4 + len {
                                break;
                            }
                            let packet: Vec<u8> = pending.drain(..4 + len).collect();
                            if packet[3] == 0 && len > 0 {
                                let name = match packet[4] {
                                    0x03 => {
                                        let text = String::from_utf8_lossy(&packet[5..]);
                                        let words: Vec<&str> =
                                            text.split_whitespace().take(4).collect();
                                        format!("query: {} …", words.join(" "))
                                    }
                                    0x0e => "ping".to_owned(),
                                    0x16 => "prepare".to_owned(),
                                    0x17 => "execute (prepared)".to_owned(),
                                    0x19 => "close statement".to_owned(),
                                    0x01 => "quit".to_owned(),
                                    other => format!("command {other:#04x}"),
                                };
                                log.lock().unwrap().push(name);
                            }
                        }
                        if server_write.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        Self { addr, log }
    }

    /// The commands logged since the last call, once the connection has been quiet for
    /// 200 ms (the pool's release check runs after the response).
    async fn take(&self) -> Vec<String> {
        let mut seen = usize::MAX;
        loop {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let now = self.log.lock().unwrap().len();
            if now == seen {
                return std::mem::take(&mut *self.log.lock().unwrap());
            }
            seen = now;
        }
    }
}

/// Round trips per path, counted on the wire (a one-connection pool behind a proxy that
/// logs each command) and printed. A command that expects an answer is a round trip;
/// `ping` is the pool's own check on checkout and release; a text query of several
/// statements is one round trip.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trips_per_path_counted_on_the_wire() {
    let db = Db::migrated().await;
    let server: sqlx::mysql::MySqlConnectOptions = server_url().parse().unwrap();
    let proxy = CommandLog::start(&format!("{}:{}", server.get_host(), server.get_port())).await;
    let options = server
        .host("127.0.0.1")
        .port(proxy.addr.port())
        .database(&db.name)
        .ssl_mode(sqlx::mysql::MySqlSslMode::Disabled);
    let pool = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(1)
        .connect_with(options)
        .await
        .unwrap();
    let app = orders_app(&pool);
    // Warm up: the connection prepares its statements once.
    assert_eq!(
        send(&app, "warm", r#"{"amount":1}"#).await.0,
        StatusCode::CREATED
    );
    proxy.take().await;
    let mut report = Vec::new();
    let mut path = async |name: &str, key: &str| {
        let (status, _) = send(&app, key, r#"{"amount":1}"#).await;
        let commands = proxy.take().await;
        let answered: Vec<&String> = commands
            .iter()
            .filter(|c| c.as_str() != "ping" && c.as_str() != "close statement")
            .collect();
        println!(
            "{name} ({status}): {} round trips besides the pool's pings",
            answered.len()
        );
        for command in &commands {
            println!("    {command}");
        }
        report.push((name.to_owned(), answered.len(), commands));
        status
    };
    assert_eq!(path("new key", "rt-new").await, StatusCode::CREATED);
    assert_eq!(path("replay", "rt-new").await, StatusCode::CREATED);
    let (_, new_trips, new_commands) = &report[0];
    // The look-up, the claim, the handler's insert, the completion, the commit alone — and
    // the no-op `ROLLBACK` sqlx queues when its count of the transaction is reset, sent with
    // the pool's release check.
    let request_path = new_commands
        .iter()
        .filter(|c| c.as_str() != "ping" && c.as_str() != "query: ROLLBACK …")
        .count();
    assert!(
        request_path <= 5,
        "a new key takes at most 5 round trips before its answer: {new_commands:#?}"
    );
    assert!(*new_trips <= 6, "{new_commands:#?}");
    assert_eq!(
        report[1].1, 1,
        "a replay is its look-up: {:#?}",
        report[1].2
    );
    pool.close().await;
    db.drop_database().await;
}
