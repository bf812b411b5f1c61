//! PostgreSQL stopped hard and restarted during a stream of requests.
//!
//! This stops the shared server (`pg_ctlcluster ... stop -m immediate`), so it runs only
//! when `AXUM_IDEMPOTENCY_DISRUPTIVE_TESTS=1` says the server may be stopped (`.ci/run`
//! sets it); otherwise it says it was skipped and passes. It is the only test in its
//! binary: nothing else of this binary runs while the server is down. A guard starts the
//! server again even if the test panics.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::post;
use axum::{Json, Router};
use axum_idempotency::IdempotencyLayer;
use axum_idempotency::postgres::IdempotentTx;
use common::*;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use serde_json::{Value, json};
use tokio_postgres::NoTls;

/// Runs `pg_ctlcluster <newest version> main <action>` (as the cluster's owner, which
/// `pg_ctlcluster` arranges when run as root).
fn pg_ctlcluster(args: &str) -> bool {
    std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql | sort -V | tail -1) main {args}"
        ))
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// Waits (at most 60 s) until the server accepts connections.
fn wait_ready() -> bool {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let ready = std::process::Command::new("pg_isready")
            .args(["-h", "127.0.0.1", "-p", "5432", "-t", "2"])
            .stdout(std::process::Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if ready {
            return true;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    false
}

/// Stops the server; dropped (also on panic), starts it again and waits until it is ready.
struct Stopped {
    restarted: bool,
}

impl Stopped {
    fn now() -> Self {
        assert!(
            pg_ctlcluster("stop -m immediate"),
            "could not stop PostgreSQL"
        );
        Self { restarted: false }
    }

    fn start(&mut self) {
        self.restarted = true;
        assert!(pg_ctlcluster("start"), "could not start PostgreSQL");
        assert!(wait_ready(), "PostgreSQL did not come back in 60 s");
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        if !self.restarted {
            let _ = pg_ctlcluster("start");
            let _ = wait_ready();
        }
    }
}

/// A pool that fails fast while the server is down.
fn fast_pool(schema: &str, max_size: usize) -> Pool {
    let mut config: tokio_postgres::Config = database_url().parse().unwrap();
    config.options(format!("-c search_path={schema}"));
    config.application_name(schema);
    config.connect_timeout(Duration::from_secs(2));
    let manager = Manager::from_config(
        config,
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager)
        .max_size(max_size)
        .wait_timeout(Some(Duration::from_secs(2)))
        .create_timeout(Some(Duration::from_secs(2)))
        .recycle_timeout(Some(Duration::from_secs(2)))
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .build()
        .unwrap()
}

/// `POST /orders`: inserts an order; a database error in the handler becomes a 503 problem
/// document of the app's own (the shared test handler panics instead).
async fn create_order(tx: IdempotentTx, Json(body): Json<Value>) -> axum::response::Response {
    let amount = body["amount"].as_i64().unwrap_or(1);
    match tx
        .query_one(
            "INSERT INTO orders (user_id, amount) VALUES (1, $1) RETURNING id",
            &[&amount],
        )
        .await
    {
        Ok(row) => (
            StatusCode::CREATED,
            Json(json!({ "id": row.get::<_, i64>(0), "amount": amount })),
        )
            .into_response(),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            [
                ("content-type", "application/problem+json"),
                ("retry-after", "1"),
            ],
            json!({ "status": 503, "code": HANDLER_DB_ERROR, "detail": e.to_string() }).to_string(),
        )
            .into_response(),
    }
}

const HANDLER_DB_ERROR: &str = "handler_database_error";

async fn count(sql: &str) -> i64 {
    let admin = connect(&database_url()).await;
    admin.query_one(sql, &[]).await.unwrap().get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_restart_during_a_stream_of_requests() {
    if !common::Database::Postgres.configured() {
        return;
    }
    if std::env::var_os("AXUM_IDEMPOTENCY_DISRUPTIVE_TESTS").is_none_or(|v| v != "1") {
        eprintln!(
            "postgres_restart_during_a_stream_of_requests: skipped; it stops and restarts the \
             PostgreSQL server, set AXUM_IDEMPOTENCY_DISRUPTIVE_TESTS=1 to run it"
        );
        return;
    }
    let test_started = Instant::now();
    assert!(
        tokio::task::spawn_blocking(wait_ready).await.unwrap(),
        "PostgreSQL is not running"
    );
    let db = TestDb::new(1).await;
    let pool = fast_pool(&db.schema, 4);
    let app = Router::new()
        .route("/orders", post(create_order))
        .layer(IdempotencyLayer::new(pool.clone()));

    // Four clients send requests with fresh keys until told to stop; every answer is kept.
    let stop = Arc::new(AtomicBool::new(false));
    let answers = Arc::new(tokio::sync::Mutex::new(Vec::<(String, Answer)>::new()));
    let clients: Vec<_> = (0..4)
        .map(|client| {
            let (app, stop, answers) = (app.clone(), Arc::clone(&stop), Arc::clone(&answers));
            tokio::spawn(async move {
                let mut n = 0;
                while !stop.load(Ordering::SeqCst) {
                    let key = format!("k-{client}-{n}");
                    n += 1;
                    let request = post_json("/orders", Some(&key), &json!({"amount": n}));
                    let answer = tokio::time::timeout(Duration::from_secs(15), send(&app, request))
                        .await
                        .expect("a request hung while PostgreSQL was down");
                    let pause = if answer.status.is_success() { 5 } else { 50 };
                    answers.lock().await.push((key, answer));
                    tokio::time::sleep(Duration::from_millis(pause)).await;
                }
            })
        })
        .collect();

    let successes = async |answers: &tokio::sync::Mutex<Vec<(String, Answer)>>| {
        answers
            .lock()
            .await
            .iter()
            .filter(|(_, a)| a.status.is_success())
            .count()
    };
    let failures = async |answers: &tokio::sync::Mutex<Vec<(String, Answer)>>| {
        answers
            .lock()
            .await
            .iter()
            .filter(|(_, a)| !a.status.is_success())
            .count()
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while successes(&answers).await < 20 {
        assert!(Instant::now() < deadline, "no traffic before the stop");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let committed_before = {
        let answers = answers.lock().await;
        answers
            .iter()
            .filter(|(_, a)| a.status.is_success())
            .map(|(k, _)| k.clone())
            .collect::<Vec<_>>()
    };

    // Down: hard stop, requests keep coming.
    let stop_started = Instant::now();
    let mut stopped = tokio::task::spawn_blocking(Stopped::now).await.unwrap();
    let failed_before = failures(&answers).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while failures(&answers).await < failed_before + 10 {
        assert!(
            Instant::now() < deadline,
            "requests did not fail fast while PostgreSQL was down"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stopped = tokio::task::spawn_blocking(move || {
        stopped.start();
        stopped
    })
    .await
    .unwrap();
    drop(stopped);
    let down_for = stop_started.elapsed();
    let restarted = Instant::now();

    // Up again: the same pool and app recover without a restart.
    let succeeded_before = successes(&answers).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while successes(&answers).await < succeeded_before + 20 {
        assert!(
            Instant::now() < deadline,
            "the pool did not recover after the restart"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let recovered_in = restarted.elapsed();
    stop.store(true, Ordering::SeqCst);
    for client in clients {
        tokio::time::timeout(Duration::from_secs(20), client)
            .await
            .unwrap()
            .unwrap();
    }

    // Every failure is a clean 503 problem document: the layer's (no connection, or the
    // COMMIT failed), or the handler's own when its query met the crash.
    let answers = std::mem::take(&mut *answers.lock().await);
    let mut codes = BTreeMap::<String, usize>::new();
    for (key, answer) in &answers {
        if answer.status.is_success() {
            assert_eq!(answer.status, StatusCode::CREATED, "{key}");
            continue;
        }
        assert_eq!(
            answer.status,
            StatusCode::SERVICE_UNAVAILABLE,
            "{key}: {:?}",
            answer.body
        );
        let code = answer.problem_code();
        assert!(
            code == "store_unavailable" || code == "commit_failed" || code == HANDLER_DB_ERROR,
            "{key}: {code}"
        );
        assert!(answer.headers.contains_key("retry-after"), "{key}");
        *codes.entry(code).or_default() += 1;
    }

    // Committed records survived the crash (each also replays below).
    let schema = &db.schema;
    let records = count(&format!(
        "SELECT count(*) FROM {schema}.idempotency_records"
    ))
    .await;
    assert!(records >= committed_before.len() as i64);
    let succeeded: Vec<&(String, Answer)> = answers
        .iter()
        .filter(|(_, a)| a.status.is_success())
        .collect();
    let orders = count(&format!("SELECT count(*) FROM {schema}.orders")).await;
    let records = count(&format!(
        "SELECT count(*) FROM {schema}.idempotency_records"
    ))
    .await;
    // A COMMIT the crash cut off may have taken effect without its answer; those keys are
    // among the failed ones and show up as replays below.
    assert!(
        orders >= succeeded.len() as i64,
        "{orders} orders for {} keys answered 2xx: a committed record was lost",
        succeeded.len()
    );
    assert_eq!(orders, records, "every order has its record");

    // Every 2xx replays identically; every failed key runs now, or replays if its COMMIT
    // took effect unseen. In the end each key executed exactly once.
    for (key, answer) in &answers {
        let n: i64 = key.rsplit('-').next().unwrap().parse::<i64>().unwrap() + 1;
        let retry = send(&app, post_json("/orders", Some(key), &json!({"amount": n}))).await;
        assert_eq!(retry.status, StatusCode::CREATED, "{key}: {:?}", retry.body);
        if answer.status.is_success() {
            assert!(retry.replayed(), "{key}");
            assert_eq!(retry.body, answer.body, "{key}");
        }
    }
    let keys = answers.len() as i64;
    let orders = count(&format!("SELECT count(*) FROM {schema}.orders")).await;
    let records = count(&format!(
        "SELECT count(*) FROM {schema}.idempotency_records"
    ))
    .await;
    assert_eq!((orders, records), (keys, keys), "one execution per key");
    eprintln!(
        "postgres_restart: {keys} keys, {} answered 2xx, failures {codes:?}; down for \
         {down_for:?}, 20 successes {recovered_in:?} after the restart; {:?} in all",
        succeeded.len(),
        test_started.elapsed()
    );
    drop(db);
}
