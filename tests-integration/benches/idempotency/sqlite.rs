//! SQLite (feature `sqlite`): the driver's server — `sqlite-bare`, `sqlite-new`,
//! `sqlite-replay` on an `sqlx::SqlitePool` of 32 over a file in a temporary directory,
//! opened with `SqliteStore::connect_options` (WAL, a 5 s busy timeout,
//! `synchronous = NORMAL`) — and its ceiling: the statements the driver sends for each path
//! (the texts of `src/sqlite/sql.rs`), from `concurrency` connections of their own with the
//! same options, with no HTTP and no layer.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use axum_idempotency::IdempotencyLayer;
use axum_idempotency::sqlite::{IdempotentTx, SqliteStore};
use futures_util::FutureExt;
use sqlx::sqlite::SqlitePoolOptions;
use sqlx::{Connection, SqliteConnection, SqlitePool};
use tokio::sync::Barrier;

use super::support::{BODY, FINGERPRINT, HEADERS, Uuid};
use super::{NewOrder, OtherDatabase, Variant, created};

const INSERT_ORDER: &str = "INSERT INTO orders (user_id, amount) VALUES (?1, ?2) RETURNING id";

// The driver's statements (`src/sqlite/sql.rs`), in the order a new key sends them.

/// `sql::LOOKUP`: the look-up outside any transaction (and a replay's one statement), and
/// again under the write lock.
const LOOKUP: &str = "SELECT status, headers, body, fingerprint, \
    expires_at <= unixepoch('subsec'), state, retryable, \
    CAST(locked_until - unixepoch('subsec') AS INTEGER) \
        + (locked_until - unixepoch('subsec') > CAST(locked_until - unixepoch('subsec') AS INTEGER)), \
    CAST(expires_at - unixepoch('subsec') AS REAL), body_key_id \
    FROM idempotency_records WHERE id = ?1";
/// `sql::BEGIN_IMMEDIATE`: the claim's transaction takes SQLite's write lock first.
const BEGIN_IMMEDIATE: &str = "BEGIN IMMEDIATE";
/// `sql::INSERT`: the record, before `COMMIT`.
const INSERT_RECORD: &str = "INSERT INTO idempotency_records \
    (id, scope, idempotency_key, fingerprint, status, headers, body, body_key_id, \
     created_at, updated_at, expires_at) \
    VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, unixepoch('subsec'), unixepoch('subsec'), \
            unixepoch('subsec') + ?9)";

/// The baseline: the handler's own transaction (`pool.begin()`: `BEGIN`, the insert,
/// `COMMIT`), no layer.
async fn bare(State(pool): State<SqlitePool>, Json(order): Json<NewOrder>) -> Response {
    let inserted = async {
        let mut tx = pool.begin().await?;
        let id: i64 = sqlx::query_scalar(INSERT_ORDER)
            .bind(order.user_id)
            .bind(order.amount)
            .fetch_one(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok::<_, sqlx::Error>(id)
    }
    .await;
    match inserted {
        Ok(id) => created(id, &order),
        Err(_) => StatusCode::SERVICE_UNAVAILABLE.into_response(),
    }
}

/// Atomic mode: the same insert, in the layer's transaction.
async fn atomic(mut tx: IdempotentTx, Json(order): Json<NewOrder>) -> Response {
    let inserted: Result<i64, _> = sqlx::query_scalar(INSERT_ORDER)
        .bind(order.user_id)
        .bind(order.amount)
        .fetch_one(&mut *tx)
        .await;
    match inserted {
        Ok(id) => created(id, &order),
        Err(_) => StatusCode::SERVICE_UNAVAILABLE.into_response(),
    }
}

/// The server and ceiling on a fresh file in a temporary directory (removed by the
/// cleanup).
pub(super) async fn database() -> (OtherDatabase, SocketAddr) {
    let dir = std::env::temp_dir().join(format!("axum-idempotency-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bench.db");
    let pool = SqlitePoolOptions::new()
        .max_connections(32)
        .connect_with(SqliteStore::connect_options(&path))
        .await
        .unwrap();
    axum_idempotency::migrate(&pool).await.unwrap();
    sqlx::raw_sql(
        "CREATE TABLE orders (id INTEGER PRIMARY KEY, user_id INTEGER NOT NULL, \
         amount INTEGER NOT NULL)",
    )
    .execute(&pool)
    .await
    .unwrap();
    let version: String = sqlx::query_scalar("SELECT sqlite_version()")
        .fetch_one(&pool)
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
    let file = path.clone();
    let database = OtherDatabase {
        name: "sqlite",
        about: format!(
            "SQLite {version} (sqlx's bundled), a file in {}, WAL, sqlx pool of 32",
            dir.display()
        ),
        bare: Variant::SqliteBare,
        new: Variant::SqliteNew,
        replay: Variant::SqliteReplay,
        more: Vec::new(),
        ceiling: Box::new(move |variant, concurrency, duration| {
            rate(
                file.clone(),
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
                remove(&dir);
            }
            .boxed()
        }),
    };
    (database, addr)
}

fn remove(dir: &Path) {
    if let Err(error) = std::fs::remove_dir_all(dir) {
        eprintln!("sqlite: could not remove {}: {error}", dir.display());
    }
}

/// Requests per second of `variant`'s statements alone, from `concurrency` connections,
/// each warmed up (its statements prepared) before the clock starts. A statement that
/// fails (`SQLITE_BUSY` after the busy timeout) is not counted.
async fn rate(
    path: PathBuf,
    pool: SqlitePool,
    variant: Variant,
    concurrency: usize,
    duration: Duration,
) -> f64 {
    // Completed records to replay: ones the HTTP runs wrote.
    let replay_ids: Vec<Vec<u8>> =
        sqlx::query_scalar("SELECT id FROM idempotency_records WHERE state = 'SUCCESS' LIMIT ?1")
            .bind(concurrency as i64)
            .fetch_all(&pool)
            .await
            .unwrap();
    let replay_ids = Arc::new(replay_ids);
    let barrier = Arc::new(Barrier::new(concurrency + 1));
    let workers: Vec<_> = (0..concurrency)
        .map(|worker| {
            let (path, barrier, replay_ids) = (path.clone(), barrier.clone(), replay_ids.clone());
            tokio::spawn(async move {
                let replay = replay_ids.get(worker % replay_ids.len().max(1));
                let mut conn = SqliteConnection::connect_with(&SqliteStore::connect_options(&path))
                    .await
                    .unwrap();
                let _ = one(&mut conn, variant, replay).await;
                barrier.wait().await;
                let started = Instant::now();
                let (mut done, mut failed) = (0_u64, 0_u64);
                while started.elapsed() < duration {
                    match one(&mut conn, variant, replay).await {
                        Ok(()) => done += 1,
                        Err(_) => failed += 1,
                    }
                }
                let finished = Instant::now();
                let _ = conn.close().await;
                (done, failed, finished)
            })
        })
        .collect();
    barrier.wait().await;
    let started = Instant::now();
    let (mut total, mut failures) = (0, 0);
    let mut last = started;
    for worker in workers {
        let (done, failed, finished) = worker.await.unwrap();
        total += done;
        failures += failed;
        last = last.max(finished);
    }
    if failures > 0 {
        eprintln!(
            "sqlite: {failures} of {variant:?}'s database-alone requests failed at concurrency {concurrency}"
        );
    }
    total as f64 / (last - started).as_secs_f64()
}

/// One request's statements, as the driver sends them for `variant`.
async fn one(
    conn: &mut SqliteConnection,
    variant: Variant,
    replay: Option<&Vec<u8>>,
) -> Result<(), sqlx::Error> {
    let (user, amount) = (1_i64, 2_i64);
    match variant {
        Variant::SqliteBare => {
            // `pool.begin()`: `BEGIN` (deferred: the insert takes the write lock); the
            // insert; `COMMIT`.
            let mut tx = conn.begin().await?;
            let _: i64 = sqlx::query_scalar(INSERT_ORDER)
                .bind(user)
                .bind(amount)
                .fetch_one(&mut *tx)
                .await?;
            tx.commit().await?;
        }
        Variant::SqliteNew => {
            let id = Uuid::fresh().0;
            let found = sqlx::query(LOOKUP)
                .bind(&id[..])
                .fetch_optional(&mut *conn)
                .await?;
            assert!(found.is_none());
            let mut tx = conn.begin_with(BEGIN_IMMEDIATE).await?;
            sqlx::query(LOOKUP)
                .bind(&id[..])
                .fetch_optional(&mut *tx)
                .await?;
            let _: i64 = sqlx::query_scalar(INSERT_ORDER)
                .bind(user)
                .bind(amount)
                .fetch_one(&mut *tx)
                .await?;
            sqlx::query(INSERT_RECORD)
                .bind(&id[..])
                .bind("")
                .bind(None::<&str>)
                .bind(FINGERPRINT)
                .bind(201_i16)
                .bind(HEADERS)
                .bind(BODY)
                .bind(None::<i16>)
                .bind(86_400.0_f64)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
        }
        Variant::SqliteReplay => {
            let id = replay.expect("a completed record to replay");
            sqlx::query(LOOKUP)
                .bind(&id[..])
                .fetch_one(&mut *conn)
                .await?;
        }
        other => unreachable!("{other:?} is not a SQLite variant"),
    }
    Ok(())
}
