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
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use axum_idempotency::mysql::IdempotentTx;
use axum_idempotency::{IdempotencyLayer, IdempotentLease};
use futures_util::{FutureExt, TryStreamExt};
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
/// `batch::claim` on MariaDB (the layer's default: no `wait_for_in_flight`): one text
/// query — `autocommit` off, READ COMMITTED, `START TRANSACTION`, the placeholder (the
/// key's lock, refused at once while a twin holds it) and the savepoint.
fn claim(id: &[u8]) -> String {
    format!(
        "SET SESSION autocommit = 0; SET TRANSACTION ISOLATION LEVEL READ COMMITTED; \
         START TRANSACTION; SET STATEMENT innodb_lock_wait_timeout = 0 FOR \
         INSERT INTO idempotency_records \
         (id, scope, fingerprint, status, headers, body, state, created_at, updated_at, \
          expires_at) VALUES ({id}, '', {fingerprint}, 0, '', '', 'PROCESSING', \
         UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6)); \
         SAVEPOINT axum_idempotency_work",
        id = hex(id),
        fingerprint = hex(FINGERPRINT),
    )
}

/// `batch::complete`: one text query — the savepoint check and the placeholder turned into
/// the record; [`COMMIT_AND_RESTORE`] follows on its own.
fn complete(id: &[u8]) -> String {
    format!(
        "RELEASE SAVEPOINT axum_idempotency_work; UPDATE idempotency_records \
         FORCE INDEX (PRIMARY) SET \
         scope = _utf8mb4 X'', idempotency_key = NULL, fingerprint = {fingerprint}, \
         status = 201, headers = {headers}, body = {body}, body_key_id = NULL, \
         state = 'SUCCESS', retryable = FALSE, locked_until = NULL, \
         created_at = UTC_TIMESTAMP(6), updated_at = UTC_TIMESTAMP(6), \
         expires_at = UTC_TIMESTAMP(6) + INTERVAL 86400000000 MICROSECOND \
         WHERE id = {id} AND state = 'PROCESSING' AND locked_until IS NULL",
        id = hex(id),
        fingerprint = hex(FINGERPRINT),
        headers = hex(HEADERS),
        body = hex(BODY),
    )
}

/// `batch::lease_acquire` on MariaDB for a free key: one text query that writes the
/// PROCESSING record under a fresh token (the query's `last_insert_id`), each lock wait
/// bounded per statement; [`COMMIT_AND_RESTORE`] follows.
fn lease_acquire(id: &[u8]) -> String {
    format!(
        "SET SESSION autocommit = 0; SET TRANSACTION ISOLATION LEVEL READ COMMITTED; \
         START TRANSACTION; SET STATEMENT innodb_lock_wait_timeout = 1 FOR \
         SELECT status, headers, body, fingerprint, expires_at <= UTC_TIMESTAMP(6), state, \
         retryable, CAST(CEIL(TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), locked_until) \
         / 1000000) AS SIGNED), CAST(TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) \
         / 1e6 AS DOUBLE), body_key_id, expires_at <= UTC_TIMESTAMP(6) OR (fingerprint = \
         {fingerprint} AND ((state = 'PROCESSING' AND locked_until <= UTC_TIMESTAMP(6)) \
         OR (state = 'FAILED' AND retryable))), fencing_token FROM idempotency_records \
         WHERE id = {id} FOR UPDATE; \
         SET STATEMENT innodb_lock_wait_timeout = 1 FOR UPDATE idempotency_counters \
         SET value = LAST_INSERT_ID(value + 1) WHERE name = 'fencing'; \
         SET STATEMENT innodb_lock_wait_timeout = 1 FOR \
         INSERT INTO idempotency_records (id, scope, idempotency_key, fingerprint, state, \
         fencing_token, locked_until, status, headers, body, created_at, updated_at, \
         expires_at) VALUES ({id}, _utf8mb4 X'', NULL, {fingerprint}, 'PROCESSING', \
         IF(ROW_COUNT() = 1, LAST_INSERT_ID(), NULL), UTC_TIMESTAMP(6) + INTERVAL 30000000 \
         MICROSECOND, 0, '', '', UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + \
         INTERVAL 86400000000 MICROSECOND)",
        id = hex(id),
        fingerprint = hex(FINGERPRINT),
    )
}

/// `batch::lease_complete` on MariaDB: the fenced `UPDATE`, one autocommit statement.
fn lease_complete(id: &[u8], token: u64) -> String {
    format!(
        "SET STATEMENT innodb_lock_wait_timeout = 1 FOR UPDATE idempotency_records \
         FORCE INDEX (PRIMARY) SET state = _utf8mb4 X'53554343455353', \
         retryable = FALSE, status = 201, headers = {headers}, body = {body}, \
         body_key_id = NULL, locked_until = NULL, updated_at = UTC_TIMESTAMP(6), \
         expires_at = UTC_TIMESTAMP(6) + INTERVAL 86400000000 MICROSECOND \
         WHERE id = {id} AND fencing_token = {token} AND state = 'PROCESSING'",
        id = hex(id),
        headers = hex(HEADERS),
        body = hex(BODY),
    )
}

/// `sql::COMMIT_AND_RESTORE`: the commit, alone.
const COMMIT_AND_RESTORE: &str = "SET SESSION innodb_lock_wait_timeout = \
    COALESCE(CAST(@axum_idempotency_lock_wait AS UNSIGNED), @@SESSION.innodb_lock_wait_timeout), \
    @axum_idempotency_lock_wait = NULL, SESSION autocommit = 1";

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

/// Lease mode: the lease commits first; the business insert runs in its own transaction.
async fn lease(
    _lease: IdempotentLease,
    State(pool): State<MySqlPool>,
    Json(order): Json<NewOrder>,
) -> Response {
    bare(State(pool), Json(order)).await
}

/// The common pattern by hand, for comparison only: commit PROCESSING, run the business
/// transaction, commit SUCCESS with the response — three commits on one pooled connection.
async fn three_commit(
    State(pool): State<MySqlPool>,
    headers: HeaderMap,
    Json(order): Json<NewOrder>,
) -> Response {
    let key = headers["idempotency-key"].as_bytes().to_vec();
    let mut conn = pool.acquire().await.unwrap();
    let claimed = sqlx::query(THREE_COMMIT_CLAIM)
        .bind(&key)
        .execute(&mut *conn)
        .await
        .unwrap();
    if claimed.rows_affected() == 0 {
        return StatusCode::CONFLICT.into_response();
    }
    let mut tx = conn.begin().await.unwrap();
    let done = sqlx::query(INSERT_ORDER)
        .bind(order.user_id)
        .bind(order.amount)
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let response = created(done.last_insert_id() as i64, &order);
    sqlx::query(THREE_COMMIT_FINISH)
        .bind(BODY)
        .bind(&key)
        .execute(&mut *conn)
        .await
        .unwrap();
    response
}

/// The hand-written pattern's statements: its PROCESSING row, and its completion.
const THREE_COMMIT_CLAIM: &str =
    "INSERT IGNORE INTO three_commit_records (k, status) VALUES (?, 'PROCESSING')";
const THREE_COMMIT_FINISH: &str =
    "UPDATE three_commit_records SET status = 'SUCCESS', response = ? WHERE k = ?";

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
         amount BIGINT NOT NULL) ENGINE = InnoDB; \
         CREATE TABLE three_commit_records (k VARBINARY(255) PRIMARY KEY, \
         status VARCHAR(10) NOT NULL, response BLOB NULL) ENGINE = InnoDB",
    )
    .execute(&pool)
    .await
    .unwrap();
    let idempotent = Router::new()
        .route("/orders", post(atomic))
        .route("/lease", post(lease))
        .layer(IdempotencyLayer::new(pool.clone()))
        .with_state(pool.clone());
    let app = Router::new()
        .route("/bare", post(bare))
        .route("/three-commit", post(three_commit))
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
        more: vec![Variant::MySqlLeaseNew, Variant::MySqlThreeCommit],
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
            let done = conn.execute(AssertSqlSafe(complete(&id))).await.unwrap();
            assert_eq!(done.rows_affected(), 1);
            conn.execute(COMMIT_AND_RESTORE).await.unwrap();
            conn.execute(QUEUED_ROLLBACK).await.unwrap();
        }
        Variant::MySqlLeaseNew => {
            // One text query each: the lease's acquisition (committed), the handler's own
            // transaction, the fenced completion (committed).
            let id = Uuid::fresh().0;
            // The token is the counter statement's `last_insert_id`, as the driver reads it.
            let token = conn
                .fetch_many(AssertSqlSafe(lease_acquire(&id)))
                .try_fold(0, |token, item| async move {
                    Ok(match item {
                        sqlx::Either::Left(done) => token.max(done.last_insert_id()),
                        sqlx::Either::Right(_) => token,
                    })
                })
                .await
                .unwrap();
            conn.execute(COMMIT_AND_RESTORE).await.unwrap();
            let mut tx = conn.begin().await.unwrap();
            sqlx::query(INSERT_ORDER)
                .bind(user)
                .bind(amount)
                .execute(&mut *tx)
                .await
                .unwrap();
            tx.commit().await.unwrap();
            let done = conn
                .execute(AssertSqlSafe(lease_complete(&id, token)))
                .await
                .unwrap();
            assert_eq!(done.rows_affected(), 1);
        }
        Variant::MySqlThreeCommit => {
            let key = Uuid::fresh().0;
            sqlx::query(THREE_COMMIT_CLAIM)
                .bind(&key[..])
                .execute(&mut *conn)
                .await
                .unwrap();
            let mut tx = conn.begin().await.unwrap();
            sqlx::query(INSERT_ORDER)
                .bind(user)
                .bind(amount)
                .execute(&mut *tx)
                .await
                .unwrap();
            tx.commit().await.unwrap();
            sqlx::query(THREE_COMMIT_FINISH)
                .bind(BODY)
                .bind(&key[..])
                .execute(&mut *conn)
                .await
                .unwrap();
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
