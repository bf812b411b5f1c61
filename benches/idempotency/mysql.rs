//! MySQL/MariaDB (feature `mysql`, `MYSQL_URL`): the driver's server — `mysql-bare`,
//! `mysql-new`, `mysql-replay` on an `sqlx::MySqlPool` of 32, in a database of the bench's
//! own — and its ceiling: the commands the driver sends for each path (the texts of
//! `src/mysql/sql.rs` and `src/mysql/batch.rs`, prepared or not as the driver sends them,
//! one round trip each), from `concurrency` connections of their own, with no HTTP and no
//! layer.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use axum_idempotency::IdempotencyLayer;
use axum_idempotency::mysql::IdempotentTx;
use futures_util::FutureExt;
use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
use sqlx::{AssertSqlSafe, Connection, Executor, MySqlConnection, MySqlPool};
use tokio::sync::Barrier;

use super::support::{BODY, FINGERPRINT, HEADERS, Uuid};
use super::{NewOrder, OtherDatabase, Variant, created};

/// The handler's insert: no `RETURNING` in MySQL, the id is the result's `last_insert_id`.
const INSERT_ORDER: &str = "INSERT INTO orders (user_id, amount) VALUES (?, ?)";

// The driver's statements (`src/mysql/sql.rs`), in the order a new key sends them.

/// `sql::LOOKUP`: the look-up outside any transaction, and a replay's one statement.
const LOOKUP: &str = "SELECT status, headers, body, fingerprint, expires_at <= UTC_TIMESTAMP(6), state, \
    retryable, CAST(CEIL(TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), locked_until) \
    / 1000000) AS SIGNED), \
    CAST(TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) / 1e6 AS DOUBLE), \
    body_key_id FROM idempotency_records WHERE id = ?";
/// `batch::claim` (the layer's default: no `wait_for_in_flight`, so a lock wait of 1 s):
/// one text query — the session settings, `START TRANSACTION`, the key's row lock, the
/// placeholder, the savepoint and the lock wait restored.
fn claim(id: &[u8]) -> String {
    format!(
        "SET @axum_idempotency_lock_wait = @@SESSION.innodb_lock_wait_timeout, \
         SESSION innodb_lock_wait_timeout = 1, SESSION autocommit = 0; \
         SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION; \
         SELECT 1 FROM idempotency_records WHERE id = {id} FOR UPDATE NOWAIT; \
         INSERT INTO idempotency_records \
         (id, scope, fingerprint, status, headers, body, state, created_at, updated_at, \
          expires_at) VALUES ({id}, '', {fingerprint}, 0, '', '', 'PROCESSING', \
         UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6)); \
         SAVEPOINT axum_idempotency_work; SET SESSION innodb_lock_wait_timeout = \
         COALESCE(@axum_idempotency_lock_wait, @@SESSION.innodb_lock_wait_timeout)",
        id = hex(id),
        fingerprint = hex(FINGERPRINT),
    )
}

/// `batch::complete`: one text query — the savepoint check, the placeholder turned into
/// the record, and the commit (`autocommit` back on) with the session restored.
fn complete(id: &[u8]) -> String {
    format!(
        "RELEASE SAVEPOINT axum_idempotency_work; UPDATE idempotency_records SET \
         scope = _utf8mb4 X'', idempotency_key = NULL, fingerprint = {fingerprint}, \
         status = 201, headers = {headers}, body = {body}, body_key_id = NULL, \
         state = 'SUCCESS', retryable = FALSE, locked_until = NULL, \
         created_at = UTC_TIMESTAMP(6), updated_at = UTC_TIMESTAMP(6), \
         expires_at = UTC_TIMESTAMP(6) + INTERVAL 86400000000 MICROSECOND \
         WHERE id = {id} AND state = 'PROCESSING' AND locked_until IS NULL; \
         SET SESSION innodb_lock_wait_timeout = COALESCE(@axum_idempotency_lock_wait, \
         @@SESSION.innodb_lock_wait_timeout), @axum_idempotency_lock_wait = NULL, \
         SESSION autocommit = IF(ROW_COUNT() = 1, 1, 2)",
        id = hex(id),
        fingerprint = hex(FINGERPRINT),
        headers = hex(HEADERS),
        body = hex(BODY),
    )
}

/// `X'…'`.
fn hex(bytes: &[u8]) -> String {
    let digits: String = bytes.iter().map(|b| format!("{b:02X}")).collect();
    format!("X'{digits}'")
}

/// The `ROLLBACK` sqlx queues when the driver resets its count of the transaction after
/// the completion (`src/mysql/conn.rs`, `MySqlConn::settle`): a no-op on the server, sent
/// when the connection goes back to the pool, before the pool's release ping.
const QUEUED_ROLLBACK: &str = "ROLLBACK";

/// The baseline: the handler's own transaction (`BEGIN`, the insert, `COMMIT`), no layer.
async fn bare(State(pool): State<MySqlPool>, Json(order): Json<NewOrder>) -> Response {
    let inserted = async {
        let mut tx = pool.begin().await?;
        let done = sqlx::query(INSERT_ORDER)
            .bind(order.user_id)
            .bind(order.amount)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok::<_, sqlx::Error>(done.last_insert_id() as i64)
    }
    .await;
    match inserted {
        Ok(id) => created(id, &order),
        Err(_) => StatusCode::SERVICE_UNAVAILABLE.into_response(),
    }
}

/// Atomic mode: the same insert, in the layer's transaction.
async fn atomic(mut tx: IdempotentTx, Json(order): Json<NewOrder>) -> Response {
    let inserted = sqlx::query(INSERT_ORDER)
        .bind(order.user_id)
        .bind(order.amount)
        .execute(&mut *tx)
        .await;
    match inserted {
        Ok(done) => created(done.last_insert_id() as i64, &order),
        Err(_) => StatusCode::SERVICE_UNAVAILABLE.into_response(),
    }
}

/// The server and ceiling at `MYSQL_URL`, in a fresh database of the bench's own (dropped
/// by the cleanup); `None` without `MYSQL_URL`, or when it does not answer.
pub(super) async fn database() -> Option<(OtherDatabase, SocketAddr)> {
    let url = std::env::var("MYSQL_URL").ok()?;
    let admin_options: MySqlConnectOptions = url.parse().expect("MYSQL_URL: a mysql:// URL");
    let mut admin = match MySqlConnection::connect_with(&admin_options).await {
        Ok(admin) => admin,
        Err(error) => {
            println!("\nmysql: left out, MYSQL_URL does not answer: {error}");
            return None;
        }
    };
    let name = format!("axum_idempotency_bench_{}", std::process::id());
    admin
        .execute(AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS {name}; CREATE DATABASE {name}"
        )))
        .await
        .unwrap();
    let version: String = sqlx::query_scalar("SELECT VERSION()")
        .fetch_one(&mut admin)
        .await
        .unwrap();
    let options = admin_options.database(&name);
    let pool = MySqlPoolOptions::new()
        .max_connections(32)
        .connect_with(options.clone())
        .await
        .unwrap();
    axum_idempotency::migrate(&pool).await.unwrap();
    sqlx::raw_sql(
        "CREATE TABLE orders (id BIGINT AUTO_INCREMENT PRIMARY KEY, user_id BIGINT NOT NULL, \
         amount BIGINT NOT NULL) ENGINE = InnoDB",
    )
    .execute(&pool)
    .await
    .unwrap();
    let idempotent = Router::new()
        .route("/orders", post(atomic))
        .layer(IdempotencyLayer::new(pool.clone()))
        .with_state(pool.clone());
    let app = Router::new()
        .route("/bare", post(bare))
        .with_state(pool.clone())
        .merge(idempotent);
    let addr = super::serve(app).await;
    let ceiling_pool = pool.clone();
    let database = OtherDatabase {
        name: "mysql",
        about: format!("{version}, database `{name}`, sqlx pool of 32"),
        bare: Variant::MySqlBare,
        new: Variant::MySqlNew,
        replay: Variant::MySqlReplay,
        ceiling: Box::new(move |variant, concurrency, duration| {
            rate(
                options.clone(),
                ceiling_pool.clone(),
                variant,
                concurrency,
                duration,
            )
            .boxed()
        }),
        cleanup: Box::new(move || {
            async move {
                pool.close().await;
                admin
                    .execute(AssertSqlSafe(format!("DROP DATABASE {name}")))
                    .await
                    .unwrap();
            }
            .boxed()
        }),
    };
    Some((database, addr))
}

/// Requests per second of `variant`'s statements alone, from `concurrency` connections,
/// each warmed up (its statements prepared) before the clock starts.
async fn rate(
    options: MySqlConnectOptions,
    pool: MySqlPool,
    variant: Variant,
    concurrency: usize,
    duration: Duration,
) -> f64 {
    // Completed records to replay: ones the HTTP runs wrote.
    let replay_ids: Vec<Vec<u8>> =
        sqlx::query_scalar("SELECT id FROM idempotency_records WHERE state = 'SUCCESS' LIMIT ?")
            .bind(concurrency as i64)
            .fetch_all(&pool)
            .await
            .unwrap();
    let replay_ids = Arc::new(replay_ids);
    let barrier = Arc::new(Barrier::new(concurrency + 1));
    let workers: Vec<_> = (0..concurrency)
        .map(|worker| {
            let (options, barrier, replay_ids) =
                (options.clone(), barrier.clone(), replay_ids.clone());
            tokio::spawn(async move {
                let replay = replay_ids.get(worker % replay_ids.len().max(1));
                let mut conn = MySqlConnection::connect_with(&options).await.unwrap();
                one(&mut conn, variant, replay).await;
                barrier.wait().await;
                let started = Instant::now();
                let mut done = 0_u64;
                while started.elapsed() < duration {
                    one(&mut conn, variant, replay).await;
                    done += 1;
                }
                let finished = Instant::now();
                let _ = conn.close().await;
                (done, finished)
            })
        })
        .collect();
    barrier.wait().await;
    let started = Instant::now();
    let mut total = 0;
    let mut last = started;
    for worker in workers {
        let (done, finished) = worker.await.unwrap();
        total += done;
        last = last.max(finished);
    }
    total as f64 / (last - started).as_secs_f64()
}

/// One request's statements, as the driver sends them for `variant`.
async fn one(conn: &mut MySqlConnection, variant: Variant, replay: Option<&Vec<u8>>) {
    let (user, amount) = (1_i64, 2_i64);
    match variant {
        Variant::MySqlBare => {
            // `pool.begin()`: `BEGIN`; the insert; `COMMIT`.
            let mut tx = conn.begin().await.unwrap();
            sqlx::query(INSERT_ORDER)
                .bind(user)
                .bind(amount)
                .execute(&mut *tx)
                .await
                .unwrap();
            tx.commit().await.unwrap();
        }
        Variant::MySqlNew => {
            let id = Uuid::fresh().0;
            let found = sqlx::query(LOOKUP)
                .bind(&id[..])
                .fetch_optional(&mut *conn)
                .await
                .unwrap();
            assert!(found.is_none());
            conn.execute(AssertSqlSafe(claim(&id))).await.unwrap();
            sqlx::query(INSERT_ORDER)
                .bind(user)
                .bind(amount)
                .execute(&mut *conn)
                .await
                .unwrap();
            conn.execute(AssertSqlSafe(complete(&id))).await.unwrap();
            conn.execute(QUEUED_ROLLBACK).await.unwrap();
        }
        Variant::MySqlReplay => {
            let id = replay.expect("a completed record to replay");
            sqlx::query(LOOKUP)
                .bind(&id[..])
                .fetch_one(&mut *conn)
                .await
                .unwrap();
        }
        other => unreachable!("{other:?} is not a MySQL variant"),
    }
}
