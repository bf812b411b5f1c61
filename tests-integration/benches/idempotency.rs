//! End-to-end benchmark: the same create-order handler with and without the layer, over
//! real HTTP on loopback, against the real PostgreSQL at `DATABASE_URL` — and, after its
//! table, against MySQL/MariaDB at `MYSQL_URL` (feature `mysql`, when the variable is set)
//! and SQLite on a file in a temporary directory (feature `sqlite`).
//!
//! ```text
//! cargo bench --bench idempotency --all-features                 # full run (a few minutes)
//! cargo bench --bench idempotency --all-features -- --quick      # smoke run, one round
//! cargo bench --bench idempotency --all-features -- --scale 10000000   # + 10 million records
//! cargo bench --bench idempotency --all-features -- --sweep 1000000    # + a purge under load, then one archiving
//! cargo bench --bench idempotency --all-features -- --only new,replay  # bare and these
//! cargo bench --bench idempotency --all-features -- --rounds 5         # default 3
//! cargo bench --bench idempotency --all-features -- --seconds 8        # each run 8 s long
//! cargo bench --bench idempotency --all-features -- --concurrency 16   # default 1,16,64
//! cargo bench --bench idempotency --all-features -- --scale 10000000 --lever brin  # a table change first
//! cargo bench --bench idempotency --all-features -- --network-delay-us 500  # a 1 ms network
//! MYSQL_URL=mysql://root@127.0.0.1:3306 cargo bench --bench idempotency --all-features  # + MySQL
//! cargo bench --bench idempotency --all-features -- --only sqlite-new,sqlite-replay  # SQLite's
//! ```
//!
//! Every variant runs in this one process against one PostgreSQL, and each is reported
//! as a ratio to `bare` at the same concurrency, taken within one round of all variants;
//! the round with the median ratio is printed, so the figures survive a noisy machine.
//! Beside each row, the same statements run without HTTP (the `ceiling` module): what the
//! database alone allows for that path, and the share of it the whole path reaches.
//!
//! With `--network-delay-us N`, every PostgreSQL connection (the servers', the ceiling's)
//! passes a proxy that delays each direction by N µs (`support::delay_proxy`), and the
//! bench prints the `SELECT 1` round trip with and without it and the proxy's CPU; MySQL and
//! SQLite are left out of that run.
//!
//! MySQL/MariaDB and SQLite each get a table of their own after PostgreSQL's: their
//! `bare`, `new` and `replay` (`mysql-*`, `sqlite-*`), every round printed, each round's
//! ratios taken against that database's own `bare` of the same round, and each round's
//! database-alone rates (the `mysql` and `sqlite` modules' ceilings) measured right after
//! its HTTP runs. SQLite also gets `sqlite-bare` and `sqlite-new` at concurrency 1, 4 and
//! 16: what its one writer does to a route whose handler holds the transaction.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use axum_idempotency::postgres::IdempotentTx;
use axum_idempotency::postgres::PgStore;
use axum_idempotency::{IdempotencyLayer, IdempotentLease, Sweeper};
use deadpool_postgres::Pool;
use futures_util::future::BoxFuture;
use serde::Deserialize;
use serde_json::json;

mod support;

use support::http::Connection;

#[cfg(feature = "mysql")]
#[path = "idempotency/mysql.rs"]
mod on_mysql;
#[cfg(feature = "sqlite")]
#[path = "idempotency/sqlite.rs"]
mod on_sqlite;

use support::INSERT_ORDER;

#[derive(Deserialize)]
struct NewOrder {
    user_id: i64,
    amount: i64,
}

fn created(id: i64, order: &NewOrder) -> Response {
    (
        StatusCode::CREATED,
        Json(json!({"id": id, "user_id": order.user_id, "amount": order.amount})),
    )
        .into_response()
}

/// The baseline: the business insert in its own transaction, no idempotency.
async fn bare(State(pool): State<Pool>, Json(order): Json<NewOrder>) -> Response {
    let mut client = pool.get().await.unwrap();
    let insert = client.prepare_cached(INSERT_ORDER).await.unwrap();
    let tx = client.transaction().await.unwrap();
    let row = tx
        .query_one(&insert, &[&order.user_id, &order.amount])
        .await
        .unwrap();
    tx.commit().await.unwrap();
    created(row.get(0), &order)
}

/// `bare` with `BEGIN` pipelined into the insert: two round trips, the fewest a handler
/// of its own can spend.
async fn bare_pipelined(State(pool): State<Pool>, Json(order): Json<NewOrder>) -> Response {
    let client = pool.get().await.unwrap();
    let insert = client.prepare_cached(INSERT_ORDER).await.unwrap();
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&order.user_id, &order.amount];
    let (begun, row) = tokio::join!(
        biased;
        client.batch_execute("BEGIN"),
        client.query_one(&insert, &params),
    );
    begun.unwrap();
    let row = row.unwrap();
    client.batch_execute("COMMIT").await.unwrap();
    created(row.get(0), &order)
}

/// Atomic mode: the same insert, in the layer's transaction.
async fn atomic(tx: IdempotentTx, Json(order): Json<NewOrder>) -> Response {
    let insert = tx.prepare_cached(INSERT_ORDER).await.unwrap();
    let row = tx
        .query_one(&insert, &[&order.user_id, &order.amount])
        .await
        .unwrap();
    created(row.get(0), &order)
}

/// Lease mode: the claim commits first; the business insert runs in its own transaction.
async fn lease(
    _lease: IdempotentLease,
    State(pool): State<Pool>,
    Json(order): Json<NewOrder>,
) -> Response {
    bare(State(pool), Json(order)).await
}

/// The common pattern, for comparison only: commit PROCESSING, run the business
/// transaction, commit SUCCESS with the response — three commits.
async fn three_commit(
    State(pool): State<Pool>,
    headers: HeaderMap,
    Json(order): Json<NewOrder>,
) -> Response {
    let key = headers["idempotency-key"].to_str().unwrap().to_owned();
    let mut client = pool.get().await.unwrap();
    let claim = client
        .prepare_cached(
            "INSERT INTO three_commit_records (key, status, fingerprint) VALUES ($1, 'PROCESSING', $2) \
             ON CONFLICT (key) DO NOTHING",
        )
        .await
        .unwrap();
    let fingerprint = format!("{}:{}", order.user_id, order.amount);
    if client.execute(&claim, &[&key, &fingerprint]).await.unwrap() == 0 {
        let row = client
            .query_one(
                "SELECT status, response FROM three_commit_records WHERE key = $1",
                &[&key],
            )
            .await
            .unwrap();
        let status: String = row.get(0);
        let body: Option<Vec<u8>> = row.get(1);
        return match (status.as_str(), body) {
            ("SUCCESS", Some(body)) => (StatusCode::CREATED, body).into_response(),
            _ => StatusCode::CONFLICT.into_response(),
        };
    }
    let insert = client.prepare_cached(INSERT_ORDER).await.unwrap();
    let tx = client.transaction().await.unwrap();
    let row = tx
        .query_one(&insert, &[&order.user_id, &order.amount])
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let id: i64 = row.get(0);
    let body = json!({"id": id, "user_id": order.user_id, "amount": order.amount}).to_string();
    let finish = client
        .prepare_cached(
            "UPDATE three_commit_records SET status = 'SUCCESS', response = $2 WHERE key = $1",
        )
        .await
        .unwrap();
    client
        .execute(&finish, &[&key, &body.as_bytes()])
        .await
        .unwrap();
    (
        StatusCode::CREATED,
        [("content-type", "application/json")],
        body,
    )
        .into_response()
}

fn app(pool: Pool, layer: IdempotencyLayer<PgStore>) -> Router {
    let optimistic = Router::new()
        .route("/orders-optimistic", post(atomic))
        .layer(
            layer
                .clone()
                .claim_mode(axum_idempotency::ClaimMode::Optimistic),
        )
        .with_state(pool.clone());
    let idempotent = Router::new()
        .route("/orders", post(atomic))
        .route("/lease", post(lease))
        .layer(layer)
        .with_state(pool.clone())
        .merge(optimistic);
    Router::new()
        .route("/bare", post(bare))
        .route("/bare-pipelined", post(bare_pipelined))
        .route("/three-commit", post(three_commit))
        .with_state(pool)
        .merge(idempotent)
}

/// The sqlx driver's server: the same two routes on an `sqlx::PgPool`.
#[cfg(feature = "sqlx")]
mod on_sqlx {
    use super::{INSERT_ORDER, NewOrder, created};
    use axum::extract::State;
    use axum::response::Response;
    use axum::routing::post;
    use axum::{Json, Router};
    use axum_idempotency::IdempotencyLayer;
    use axum_idempotency::sqlx::IdempotentTx;
    use sqlx::PgPool;

    /// The baseline on sqlx: the business insert in its own transaction.
    async fn bare(State(pool): State<PgPool>, Json(order): Json<NewOrder>) -> Response {
        let mut tx = pool.begin().await.unwrap();
        let id: i64 = sqlx::query_scalar(INSERT_ORDER)
            .bind(order.user_id)
            .bind(order.amount)
            .fetch_one(&mut *tx)
            .await
            .unwrap();
        tx.commit().await.unwrap();
        created(id, &order)
    }

    /// Atomic mode on sqlx.
    async fn atomic(mut tx: IdempotentTx, Json(order): Json<NewOrder>) -> Response {
        let id: i64 = sqlx::query_scalar(INSERT_ORDER)
            .bind(order.user_id)
            .bind(order.amount)
            .fetch_one(&mut *tx)
            .await
            .unwrap();
        created(id, &order)
    }

    pub(super) async fn server(url: &str, schema: &str) -> std::net::SocketAddr {
        let options: sqlx::postgres::PgConnectOptions = url.parse().unwrap();
        let options = options.options([("search_path", schema)]);
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(32)
            .connect_with(options)
            .await
            .unwrap();
        let idempotent = Router::new()
            .route("/orders", post(atomic))
            .layer(IdempotencyLayer::new(pool.clone()))
            .with_state(pool.clone());
        let app = Router::new()
            .route("/bare", post(bare))
            .with_state(pool)
            .merge(idempotent);
        super::serve(app).await
    }
}

/// The database alone: each variant's statements as the crate (or the harness) sends them —
/// the same texts, prepared, pipelined where the crate pipelines — from `concurrency`
/// connections, with no HTTP and no layer. A variant's HTTP rate over its ceiling says how
/// close the whole path is to what PostgreSQL allows for the same work.
mod ceiling {
    use std::time::{Duration, Instant};

    use deadpool_postgres::Pool;
    use tokio_postgres::types::ToSql;

    use super::Variant;
    use super::support::{
        CLAIM, EXISTS, FINGERPRINT, HEADERS, INSERT_RECORD, LOOKUP, TRY_LOCK, Uuid,
    };

    const LEASE_ACQUIRE: &str = "INSERT INTO idempotency_records AS r \
        (id, scope, idempotency_key, fingerprint, state, fencing_token, locked_until, \
         status, headers, body, expires_at) \
        VALUES ($1, '', NULL, $2, 'PROCESSING', nextval('idempotency_fencing_tokens'), \
                now() + make_interval(secs => 30), 0, '', '', now() + make_interval(secs => 86400)) \
        ON CONFLICT (id) DO NOTHING RETURNING fencing_token, xmax <> '0'::xid";
    const LEASE_COMPLETE: &str = "UPDATE idempotency_records SET \
        state = 'SUCCESS', retryable = false, status = 201, headers = $3, body = $4, \
        body_key_id = NULL, locked_until = NULL, updated_at = now(), \
        expires_at = now() + make_interval(secs => 86400) \
        WHERE id = $1 AND fencing_token = $2 AND state = 'PROCESSING'";
    const THREE_CLAIM: &str = "INSERT INTO three_commit_records (key, status, fingerprint) \
        VALUES ($1, 'PROCESSING', $2) ON CONFLICT (key) DO NOTHING";
    const THREE_FINISH: &str =
        "UPDATE three_commit_records SET status = 'SUCCESS', response = $2 WHERE key = $1";

    /// Requests per second of `variant`'s statements alone, `None` for a variant with no
    /// PostgreSQL work (the caches, and the other databases', measured by their modules).
    pub(super) async fn rate(
        pool: &Pool,
        variant: Variant,
        concurrency: usize,
        duration: Duration,
    ) -> Option<f64> {
        if matches!(variant, Variant::CachedReplay | Variant::RedisReplay) || !variant.on_postgres()
        {
            return None;
        }
        // Completed records to replay: the newest ones the HTTP runs wrote.
        let replay_ids: Vec<Uuid> = pool
            .get()
            .await
            .unwrap()
            .query(
                "SELECT uuid_send(id) FROM idempotency_records WHERE state = 'SUCCESS' LIMIT $1",
                &[&(concurrency as i64)],
            )
            .await
            .unwrap()
            .iter()
            .map(|row| Uuid(row.get::<_, &[u8]>(0).try_into().unwrap()))
            .collect();
        let started = Instant::now();
        let workers: Vec<_> = (0..concurrency)
            .map(|worker| {
                let pool = pool.clone();
                let replay = replay_ids.get(worker % replay_ids.len().max(1)).copied();
                tokio::spawn(async move {
                    let client = pool.get().await.unwrap();
                    let mut done = 0_u64;
                    while started.elapsed() < duration {
                        one(&client, variant, worker, done, replay).await;
                        done += 1;
                    }
                    done
                })
            })
            .collect();
        let mut total = 0;
        for worker in workers {
            total += worker.await.unwrap();
        }
        Some(total as f64 / started.elapsed().as_secs_f64())
    }

    /// One request's statements.
    async fn one(
        client: &deadpool_postgres::Client,
        variant: Variant,
        worker: usize,
        n: u64,
        replay: Option<Uuid>,
    ) {
        let insert_order = client.prepare_cached(super::INSERT_ORDER).await.unwrap();
        let body = br#"{"id":1,"user_id":1,"amount":2}"#.as_slice();
        let user = 1_i64;
        let amount = 2_i64;
        match variant {
            Variant::Bare | Variant::SqlxBare => {
                client.batch_execute("BEGIN").await.unwrap();
                client
                    .query_one(&insert_order, &[&user, &amount])
                    .await
                    .unwrap();
                client.batch_execute("COMMIT").await.unwrap();
            }
            Variant::New => {
                // The shipped shape: the look-up alone; [BEGIN, try-lock, the look-up under
                // the lock, the handler's insert]; [record, COMMIT].
                let id = Uuid::fresh();
                let (lookup, try_lock, exists, insert) = (
                    client.prepare_cached(LOOKUP).await.unwrap(),
                    client.prepare_cached(TRY_LOCK).await.unwrap(),
                    client.prepare_cached(EXISTS).await.unwrap(),
                    client.prepare_cached(INSERT_RECORD).await.unwrap(),
                );
                client.query_opt(&lookup, &[&id]).await.unwrap();
                let key = id.lock_key();
                let lock_params: [&(dyn ToSql + Sync); 1] = [&key];
                let id_params: [&(dyn ToSql + Sync); 1] = [&id];
                let order_params: [&(dyn ToSql + Sync); 2] = [&user, &amount];
                let (begin, locked, found, order) = tokio::join!(
                    biased;
                    client.batch_execute("BEGIN"),
                    client.query_one(&try_lock, &lock_params),
                    client.query_opt(&exists, &id_params),
                    client.query_one(&insert_order, &order_params),
                );
                begin.unwrap();
                locked.unwrap();
                found.unwrap();
                order.unwrap();
                let fingerprint = FINGERPRINT;
                let insert_params: [&(dyn ToSql + Sync); 4] = [&id, &fingerprint, &HEADERS, &body];
                let (inserted, committed) = tokio::join!(
                    biased;
                    client.execute(&insert, &insert_params),
                    client.batch_execute("COMMIT"),
                );
                inserted.unwrap();
                committed.unwrap();
            }
            Variant::NewOptimistic => {
                // The optimistic shape: the look-up alone; [BEGIN, the twins' bound, the
                // handler's insert]; [record, COMMIT].
                let id = Uuid::fresh();
                let (lookup, set_timeout, insert) = (
                    client.prepare_cached(LOOKUP).await.unwrap(),
                    client
                        .prepare_cached("SELECT set_config('lock_timeout', $1, true)")
                        .await
                        .unwrap(),
                    client.prepare_cached(INSERT_RECORD).await.unwrap(),
                );
                client.query_opt(&lookup, &[&id]).await.unwrap();
                let timeout = "60000ms";
                let timeout_params: [&(dyn ToSql + Sync); 1] = [&timeout];
                let order_params: [&(dyn ToSql + Sync); 2] = [&user, &amount];
                let (begin, timeout_set, order) = tokio::join!(
                    biased;
                    client.batch_execute("BEGIN"),
                    client.query_one(&set_timeout, &timeout_params),
                    client.query_one(&insert_order, &order_params),
                );
                begin.unwrap();
                timeout_set.unwrap();
                order.unwrap();
                let fingerprint = FINGERPRINT;
                let insert_params: [&(dyn ToSql + Sync); 4] = [&id, &fingerprint, &HEADERS, &body];
                let (inserted, committed) = tokio::join!(
                    biased;
                    client.execute(&insert, &insert_params),
                    client.batch_execute("COMMIT"),
                );
                inserted.unwrap();
                committed.unwrap();
            }
            Variant::BarePipelined => {
                let order_params: [&(dyn ToSql + Sync); 2] = [&user, &amount];
                let (begin, order) = tokio::join!(
                    biased;
                    client.batch_execute("BEGIN"),
                    client.query_one(&insert_order, &order_params),
                );
                begin.unwrap();
                order.unwrap();
                client.batch_execute("COMMIT").await.unwrap();
            }
            Variant::SqlxNew => {
                // One statement a round trip: the lookup, then the claim function after BEGIN.
                let id = Uuid::fresh();
                let (lookup, claim, insert) = (
                    client.prepare_cached(LOOKUP).await.unwrap(),
                    client.prepare_cached(CLAIM).await.unwrap(),
                    client.prepare_cached(INSERT_RECORD).await.unwrap(),
                );
                client.query_opt(&lookup, &[&id]).await.unwrap();
                client.batch_execute("BEGIN").await.unwrap();
                client
                    .query_one(&claim, &[&id, &id.lock_key()])
                    .await
                    .unwrap();
                client
                    .query_one(&insert_order, &[&user, &amount])
                    .await
                    .unwrap();
                let fingerprint = FINGERPRINT;
                client
                    .execute(&insert, &[&id, &fingerprint, &HEADERS, &body])
                    .await
                    .unwrap();
                client.batch_execute("COMMIT").await.unwrap();
            }
            Variant::Replay | Variant::SqlxReplay => {
                let lookup = client.prepare_cached(LOOKUP).await.unwrap();
                client
                    .query_opt(&lookup, &[&replay.unwrap()])
                    .await
                    .unwrap();
            }
            Variant::LeaseNew => {
                let id = Uuid::fresh();
                let (acquire, complete) = (
                    client.prepare_cached(LEASE_ACQUIRE).await.unwrap(),
                    client.prepare_cached(LEASE_COMPLETE).await.unwrap(),
                );
                let fingerprint = FINGERPRINT;
                let token: i64 = client
                    .query_one(&acquire, &[&id, &fingerprint])
                    .await
                    .unwrap()
                    .get(0);
                client.batch_execute("BEGIN").await.unwrap();
                client
                    .query_one(&insert_order, &[&user, &amount])
                    .await
                    .unwrap();
                client.batch_execute("COMMIT").await.unwrap();
                client
                    .execute(&complete, &[&id, &token, &HEADERS, &body])
                    .await
                    .unwrap();
            }
            Variant::ThreeCommit => {
                let key = format!("ceiling-{}-{worker}-{n}", std::process::id());
                let (claim, finish) = (
                    client.prepare_cached(THREE_CLAIM).await.unwrap(),
                    client.prepare_cached(THREE_FINISH).await.unwrap(),
                );
                client.execute(&claim, &[&key, &"1:2"]).await.unwrap();
                client.batch_execute("BEGIN").await.unwrap();
                client
                    .query_one(&insert_order, &[&user, &amount])
                    .await
                    .unwrap();
                client.batch_execute("COMMIT").await.unwrap();
                client.execute(&finish, &[&key, &body]).await.unwrap();
            }
            Variant::CachedReplay
            | Variant::RedisReplay
            | Variant::MySqlBare
            | Variant::MySqlNew
            | Variant::MySqlReplay
            | Variant::MySqlLeaseNew
            | Variant::MySqlThreeCommit
            | Variant::SqliteBare
            | Variant::SqliteNew
            | Variant::SqliteReplay => {}
        }
    }
}

async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

/// A keep-alive HTTP/1.1 client on one connection.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[cfg_attr(not(all(feature = "mysql", feature = "sqlite")), allow(dead_code))]
enum Variant {
    Bare,
    BarePipelined,
    New,
    NewOptimistic,
    Replay,
    LeaseNew,
    ThreeCommit,
    CachedReplay,
    RedisReplay,
    SqlxBare,
    SqlxNew,
    SqlxReplay,
    MySqlBare,
    MySqlNew,
    MySqlReplay,
    MySqlLeaseNew,
    MySqlThreeCommit,
    SqliteBare,
    SqliteNew,
    SqliteReplay,
}

impl Variant {
    /// What the variant's ratio is taken against: `bare` on its own driver.
    fn baseline(self) -> Self {
        match self {
            Self::SqlxNew | Self::SqlxReplay => Self::SqlxBare,
            Self::MySqlBare
            | Self::MySqlNew
            | Self::MySqlReplay
            | Self::MySqlLeaseNew
            | Self::MySqlThreeCommit => Self::MySqlBare,
            Self::SqliteBare | Self::SqliteNew | Self::SqliteReplay => Self::SqliteBare,
            _ => Self::Bare,
        }
    }

    /// Whether the variant runs against PostgreSQL (the first table).
    fn on_postgres(self) -> bool {
        !matches!(
            self,
            Self::MySqlBare
                | Self::MySqlNew
                | Self::MySqlReplay
                | Self::MySqlLeaseNew
                | Self::MySqlThreeCommit
                | Self::SqliteBare
                | Self::SqliteNew
                | Self::SqliteReplay
        )
    }

    fn name(self) -> &'static str {
        match self {
            Self::SqlxBare => "sqlx-bare",
            Self::SqlxNew => "sqlx-new",
            Self::SqlxReplay => "sqlx-replay",
            Self::Bare => "bare",
            Self::BarePipelined => "bare-pipelined",
            Self::New => "new",
            Self::NewOptimistic => "new-optimistic",
            Self::Replay => "replay",
            Self::LeaseNew => "lease-new",
            Self::ThreeCommit => "three-commit",
            Self::CachedReplay => "cached-replay",
            Self::RedisReplay => "redis-replay",
            Self::MySqlBare => "mysql-bare",
            Self::MySqlNew => "mysql-new",
            Self::MySqlReplay => "mysql-replay",
            Self::MySqlLeaseNew => "mysql-lease-new",
            Self::MySqlThreeCommit => "mysql-three-commit",
            Self::SqliteBare => "sqlite-bare",
            Self::SqliteNew => "sqlite-new",
            Self::SqliteReplay => "sqlite-replay",
        }
    }
}

struct Figures {
    rps: f64,
    peak_rss_mib: f64,
    /// Every request's latency, sorted.
    latencies: Vec<Duration>,
    /// Answers other than 201 (MySQL and SQLite only: a PostgreSQL variant stops the bench
    /// at the first); not in `rps` or `latencies`.
    errors: usize,
}

impl Figures {
    fn p50(&self) -> Duration {
        quantile(&self.latencies, 0.50)
    }

    fn p99(&self) -> Duration {
        quantile(&self.latencies, 0.99)
    }
}

/// The latency at quantile `q` of sorted `latencies`.
fn quantile(latencies: &[Duration], q: f64) -> Duration {
    if latencies.is_empty() {
        return Duration::ZERO;
    }
    latencies[((latencies.len() as f64 * q) as usize).min(latencies.len() - 1)]
}

static KEYS: AtomicU64 = AtomicU64::new(0);

fn fresh_key() -> String {
    format!(
        "bench-{}-{}",
        std::process::id(),
        KEYS.fetch_add(1, Ordering::Relaxed)
    )
}

fn body_for(n: u64) -> String {
    format!(r#"{{"user_id": {}, "amount": {}}}"#, n % 1000, 1 + n % 500)
}

/// Resets the peak resident set size, so each variant reports its own.
fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

fn peak_rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|value| {
            value
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<f64>()
                .ok()
        })
        .map_or(0.0, |kib| kib / 1024.0)
}

/// Completed keys to replay: one per connection, created through `addr`.
async fn completed_keys(addr: SocketAddr, count: usize) -> Vec<(String, String)> {
    let mut connection = Connection::open(addr).await;
    let mut keys = Vec::new();
    for i in 0..count {
        let (key, body) = (fresh_key(), body_for(i as u64));
        assert_eq!(connection.post("/orders", Some(&key), &body).await, 201);
        keys.push((key, body));
    }
    keys
}

/// The servers under test: plain layer, in-process cache, Redis front line, and the other
/// drivers'.
#[derive(Clone, Copy)]
struct Servers {
    plain: SocketAddr,
    cached: SocketAddr,
    redis: Option<SocketAddr>,
    sqlx: Option<SocketAddr>,
    mysql: Option<SocketAddr>,
    sqlite: Option<SocketAddr>,
}

/// How long a run lasts: a number of requests, or (`--seconds`) a time.
#[derive(Clone, Copy, Debug)]
enum Load {
    Requests(usize),
    Seconds(Duration),
}

async fn run(variant: Variant, servers: Servers, concurrency: usize, load: Load) -> Figures {
    let target = match variant {
        Variant::CachedReplay => servers.cached,
        Variant::RedisReplay => servers.redis.expect("built without the redis feature"),
        Variant::SqlxBare | Variant::SqlxNew | Variant::SqlxReplay => {
            servers.sqlx.expect("built without the sqlx feature")
        }
        Variant::MySqlBare
        | Variant::MySqlNew
        | Variant::MySqlReplay
        | Variant::MySqlLeaseNew
        | Variant::MySqlThreeCommit => servers
            .mysql
            .expect("built without the mysql feature, or no MYSQL_URL"),
        Variant::SqliteBare | Variant::SqliteNew | Variant::SqliteReplay => {
            servers.sqlite.expect("built without the sqlite feature")
        }
        _ => servers.plain,
    };
    let replay_keys = match variant {
        Variant::Replay
        | Variant::CachedReplay
        | Variant::RedisReplay
        | Variant::SqlxReplay
        | Variant::MySqlReplay
        | Variant::SqliteReplay => completed_keys(target, concurrency).await,
        _ => Vec::new(),
    };
    let (per_connection, deadline) = match load {
        Load::Requests(requests) => (requests.div_ceil(concurrency), None),
        Load::Seconds(duration) => (usize::MAX, Some(duration)),
    };
    reset_peak_rss();
    let started = Instant::now();
    let workers: Vec<_> = (0..concurrency)
        .map(|worker| {
            let replay = replay_keys.get(worker).cloned();
            tokio::spawn(async move {
                let mut connection = Connection::open(target).await;
                let mut latencies = Vec::with_capacity(per_connection.min(1 << 16));
                let mut errors = 0;
                for i in 0..per_connection {
                    if deadline.is_some_and(|deadline| started.elapsed() >= deadline) {
                        break;
                    }
                    let n = (worker * per_connection + i) as u64;
                    let sent = Instant::now();
                    let status = match variant {
                        Variant::Bare
                        | Variant::SqlxBare
                        | Variant::MySqlBare
                        | Variant::SqliteBare => connection.post("/bare", None, &body_for(n)).await,
                        Variant::BarePipelined => {
                            connection.post("/bare-pipelined", None, &body_for(n)).await
                        }
                        Variant::New
                        | Variant::SqlxNew
                        | Variant::MySqlNew
                        | Variant::SqliteNew => {
                            connection
                                .post("/orders", Some(&fresh_key()), &body_for(n))
                                .await
                        }
                        Variant::NewOptimistic => {
                            connection
                                .post("/orders-optimistic", Some(&fresh_key()), &body_for(n))
                                .await
                        }
                        Variant::LeaseNew | Variant::MySqlLeaseNew => {
                            connection
                                .post("/lease", Some(&fresh_key()), &body_for(n))
                                .await
                        }
                        Variant::ThreeCommit | Variant::MySqlThreeCommit => {
                            connection
                                .post("/three-commit", Some(&fresh_key()), &body_for(n))
                                .await
                        }
                        Variant::Replay
                        | Variant::CachedReplay
                        | Variant::RedisReplay
                        | Variant::SqlxReplay
                        | Variant::MySqlReplay
                        | Variant::SqliteReplay => {
                            let (key, body) = replay.as_ref().unwrap();
                            connection.post("/orders", Some(key), body).await
                        }
                    };
                    if status != 201 && !variant.on_postgres() {
                        // A 503 (a lock or busy wait that ran out): counted, not timed.
                        errors += 1;
                        continue;
                    }
                    latencies.push(sent.elapsed());
                    assert_eq!(status, 201, "{variant:?} answered {status}");
                }
                (latencies, errors)
            })
        })
        .collect();
    let mut latencies = Vec::new();
    let mut errors = 0;
    for worker in workers {
        let (worker_latencies, worker_errors) = worker.await.unwrap();
        latencies.extend(worker_latencies);
        errors += worker_errors;
    }
    let elapsed = started.elapsed();
    latencies.sort_unstable();
    Figures {
        rps: latencies.len() as f64 / elapsed.as_secs_f64(),
        peak_rss_mib: peak_rss_mib(),
        latencies,
        errors,
    }
}

fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1000.0)
}

/// A layer with the Redis front line, when built with `--features redis` and Redis answers
/// at `REDIS_URL`.
#[cfg(feature = "redis")]
async fn redis_server(pool: &Pool) -> Option<SocketAddr> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
    let client = axum_idempotency::redis::Client::open(url).ok()?;
    let layer = IdempotencyLayer::new(pool.clone())
        .redis(client)
        .redis_prefix(format!("bench-{}", std::process::id()));
    Some(serve(app(pool.clone(), layer)).await)
}

#[cfg(not(feature = "redis"))]
async fn redis_server(_pool: &Pool) -> Option<SocketAddr> {
    None
}

/// The sqlx driver's server, when built with `--features sqlx`.
async fn sqlx_server(schema: &str) -> Option<SocketAddr> {
    #[cfg(feature = "sqlx")]
    {
        Some(on_sqlx::server(&support::database_url(), schema).await)
    }
    #[cfg(not(feature = "sqlx"))]
    {
        let _ = schema;
        None
    }
}

async fn setup(schema: &str) -> (Pool, tokio_postgres::Client) {
    let (pool, admin) = support::fresh_schema(schema, 32).await;
    pool.get()
        .await
        .unwrap()
        .batch_execute(
            "CREATE TABLE three_commit_records (key text PRIMARY KEY, status text NOT NULL,
                 fingerprint text NOT NULL, response bytea);",
        )
        .await
        .unwrap();
    (pool, admin)
}

struct Options {
    quick: bool,
    scale: Option<u64>,
    /// Variants to run besides `bare` (all when empty).
    only: Vec<String>,
    /// Expired records to load and purge under load, without the scale run.
    sweep: Option<u64>,
    /// Rounds of every variant per concurrency; the median ratio is reported.
    rounds: usize,
    /// Seconds per run of a variant instead of a number of requests.
    seconds: Option<u64>,
    /// Concurrencies to run (default 1, 16 and 64).
    concurrency: Option<Vec<usize>>,
    /// A change to the record table tried before the runs (`brin`: the expiry index as
    /// BRIN; `no-expiry-index`: none; `fillfactor`: 90).
    lever: Option<String>,
    /// Every PostgreSQL connection through a proxy delaying each direction this long.
    network_delay: Option<Duration>,
}

/// The argument after `flag`, if the flag was given.
fn flag_value<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    let at = args.iter().position(|a| a == flag)?;
    Some(
        args.get(at + 1)
            .unwrap_or_else(|| panic!("{flag} takes a value")),
    )
}

fn options() -> Options {
    let args: Vec<String> = std::env::args().collect();
    let number = |flag: &str| {
        flag_value(&args, flag).map(|n| {
            n.parse::<u64>()
                .unwrap_or_else(|_| panic!("{flag} takes a number"))
        })
    };
    let quick = args.iter().any(|a| a == "--quick");
    Options {
        quick,
        scale: number("--scale"),
        only: flag_value(&args, "--only")
            .map(|names| names.split(',').map(str::to_owned).collect())
            .unwrap_or_default(),
        sweep: number("--sweep"),
        rounds: number("--rounds").map_or(if quick { 1 } else { 3 }, |n| n.max(1) as usize),
        seconds: number("--seconds"),
        lever: flag_value(&args, "--lever").map(str::to_owned),
        network_delay: number("--network-delay-us").map(Duration::from_micros),
        concurrency: flag_value(&args, "--concurrency").map(|list| {
            list.split(',')
                .map(|n| n.parse().expect("--concurrency takes numbers"))
                .collect()
        }),
    }
}

/// The median round trip of `SELECT 1` on one connection to `url`.
async fn select_1_round_trip(url: &str) -> Duration {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connect to DATABASE_URL");
    tokio::spawn(connection);
    let statement = client.prepare("SELECT 1").await.unwrap();
    let mut times = Vec::with_capacity(500);
    for _ in 0..500 {
        let started = Instant::now();
        client.query_one(&statement, &[]).await.unwrap();
        times.push(started.elapsed());
    }
    times.sort();
    times[times.len() / 2]
}

async fn table_sizes(admin: &tokio_postgres::Client, schema: &str) -> (i64, i64, i64) {
    let row = admin
        .query_one(
            &format!(
                "SELECT count(*), pg_table_size('{schema}.idempotency_records'), \
                 pg_indexes_size('{schema}.idempotency_records') FROM {schema}.idempotency_records"
            ),
            &[],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1), row.get(2))
}

#[tokio::main]
async fn main() {
    let options = options();
    let schema = format!("bench_{}", std::process::id());
    if let Some(delay) = options.network_delay {
        let direct = select_1_round_trip(&support::direct_database_url()).await;
        support::through_delay_proxy(delay);
        let proxied = select_1_round_trip(&support::database_url()).await;
        println!(
            "network: every PostgreSQL connection through a proxy delaying each direction \
             {} µs; `SELECT 1` round trip (median of 500): {} ms direct, {} ms through the proxy",
            delay.as_micros(),
            ms(direct),
            ms(proxied)
        );
    }
    let (pool, admin) = setup(&schema).await;
    if let Some(lever) = &options.lever {
        let change = match lever.as_str() {
            "brin" => {
                "DROP INDEX idempotency_records_expires_at_idx; \
                       CREATE INDEX idempotency_records_expires_at_idx \
                       ON idempotency_records USING brin (expires_at)"
            }
            "no-expiry-index" => "DROP INDEX idempotency_records_expires_at_idx",
            "fillfactor" => "ALTER TABLE idempotency_records SET (fillfactor = 90)",
            other => panic!("unknown --lever {other}: brin, no-expiry-index or fillfactor"),
        };
        admin
            .batch_execute(&format!(
                "SET search_path = {schema}; {change}; RESET search_path"
            ))
            .await
            .unwrap();
        println!("lever: {lever}");
    }
    let plain = serve(app(pool.clone(), IdempotencyLayer::new(pool.clone()))).await;
    let cached = serve(app(
        pool.clone(),
        IdempotencyLayer::new(pool.clone()).cache_responses(64 << 20),
    ))
    .await;
    let redis = redis_server(&pool).await;
    let sqlx = sqlx_server(&schema).await;
    // The network mode measures PostgreSQL only.
    let (others, mysql, sqlite) = if options.network_delay.is_some() {
        (Vec::new(), None, None)
    } else {
        other_databases(&options).await
    };
    let servers = Servers {
        plain,
        cached,
        redis,
        sqlx,
        mysql,
        sqlite,
    };

    let mut variants = vec![
        Variant::Bare,
        Variant::BarePipelined,
        Variant::New,
        Variant::NewOptimistic,
        Variant::Replay,
        Variant::LeaseNew,
        Variant::ThreeCommit,
        Variant::CachedReplay,
    ];
    if redis.is_some() {
        variants.push(Variant::RedisReplay);
    }
    if sqlx.is_some() {
        variants.extend([Variant::SqlxBare, Variant::SqlxNew, Variant::SqlxReplay]);
    }
    if !options.only.is_empty() {
        variants.retain(|v| {
            *v == Variant::Bare
                || *v == Variant::SqlxBare && sqlx.is_some()
                || options.only.iter().any(|o| o == v.name())
        });
    }
    let (requests, default_concurrencies): (usize, &[usize]) = if options.quick {
        (200, &[1, 16])
    } else {
        (3000, &[1, 16, 64])
    };
    let concurrencies = options
        .concurrency
        .as_deref()
        .unwrap_or(default_concurrencies);
    println!(
        "| variant | concurrency | requests/s | p50 ms | p99 ms | ratio to its driver's bare | database alone req/s | × database alone | peak RSS MiB |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for &concurrency in concurrencies {
        let load = match options.seconds {
            Some(seconds) => Load::Seconds(Duration::from_secs(seconds)),
            None if concurrency == 1 => Load::Requests(requests / 3),
            None => Load::Requests(requests),
        };
        // Warm up every path (connections, prepared statements) before measuring.
        for &variant in &variants {
            run(
                variant,
                servers,
                concurrency,
                Load::Requests(concurrency * 5),
            )
            .await;
        }
        // Rounds of every variant in turn. A variant's ratio to `bare` is the median of its
        // ratios within each round; its requests/s, p50 and p99 are those of its median
        // round by requests/s.
        let mut rounds = Vec::with_capacity(options.rounds);
        let (proxy_cpu, started) = (support::delay_proxy::cpu_seconds(), Instant::now());
        for _ in 0..options.rounds {
            let mut round = Vec::with_capacity(variants.len());
            for &variant in &variants {
                round.push(run(variant, servers, concurrency, load).await);
            }
            rounds.push(round);
        }
        if options.network_delay.is_some() {
            eprintln!(
                "c={concurrency}: the delay proxy used {:.0} % of one core during the rounds",
                100.0 * (support::delay_proxy::cpu_seconds() - proxy_cpu)
                    / started.elapsed().as_secs_f64()
            );
        }
        let median = |mut values: Vec<f64>| {
            values.sort_by(f64::total_cmp);
            values[values.len() / 2]
        };
        for (i, &variant) in variants.iter().enumerate() {
            let base = variants
                .iter()
                .position(|v| *v == variant.baseline())
                .unwrap_or(0);
            let ratio = median(rounds.iter().map(|r| r[i].rps / r[base].rps).collect());
            let mut by_rps: Vec<&Figures> = rounds.iter().map(|r| &r[i]).collect();
            by_rps.sort_by(|a, b| a.rps.total_cmp(&b.rps));
            let figures = by_rps[by_rps.len() / 2];
            let peak = rounds
                .iter()
                .map(|round| round[i].peak_rss_mib)
                .fold(0.0, f64::max);
            // The same statements without HTTP, for as long as a run of 3 000 requests at
            // bare's rate takes (or `--seconds`), after the HTTP rounds.
            let ceiling_time = match load {
                Load::Seconds(duration) => duration,
                Load::Requests(_) => Duration::from_secs(2),
            };
            let ceiling = ceiling::rate(&pool, variant, concurrency, ceiling_time).await;
            let (alone, share) = match ceiling {
                Some(alone) => (format!("{alone:.0}"), format!("{:.2}", figures.rps / alone)),
                None => ("—".to_owned(), "—".to_owned()),
            };
            println!(
                "| {} | {} | {:.0} | {} | {} | {:.2} | {} | {} | {:.1} |",
                variant.name(),
                concurrency,
                figures.rps,
                ms(figures.p50()),
                ms(figures.p99()),
                ratio,
                alone,
                share,
                peak
            );
        }
        // Every round, not only the medians (on stderr, beside the table).
        for (i, &variant) in variants.iter().enumerate() {
            let base = variants
                .iter()
                .position(|v| *v == variant.baseline())
                .unwrap_or(0);
            let each: Vec<String> = rounds
                .iter()
                .map(|r| format!("{:.0} ({:.2})", r[i].rps, r[i].rps / r[base].rps))
                .collect();
            eprintln!(
                "c={concurrency} {}: req/s (ratio to its driver's bare) per round: {}",
                variant.name(),
                each.join(", ")
            );
        }
    }
    if let Some(records) = options.scale {
        scale_run(&admin, &schema, &pool, servers, records).await;
    } else if let Some(records) = options.sweep {
        for mode in [SweepMode::Delete, SweepMode::Table, SweepMode::Sink] {
            println!("\nloading {records} expired records …");
            load(&admin, &schema, records, "now() - interval '1 hour'").await;
            purge_under_load(&pool, servers, mode).await;
        }
        let size: i64 = admin
            .query_one(
                &format!("SELECT pg_total_relation_size('{schema}.idempotency_records_archive')"),
                &[],
            )
            .await
            .unwrap()
            .get(0);
        println!(
            "archive: {:.1} MiB for {records} records",
            size as f64 / (1 << 20) as f64
        );
    }
    for (database, variants) in others {
        other_database_run(
            &database,
            &variants,
            servers,
            &options,
            concurrencies,
            requests,
        )
        .await;
        (database.cleanup)().await;
    }
    admin
        .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await
        .unwrap();
}

/// A database besides PostgreSQL: its three variants, served by its module's server, and
/// its module's ceiling for them.
#[cfg_attr(not(any(feature = "mysql", feature = "sqlite")), allow(dead_code))]
struct OtherDatabase {
    name: &'static str,
    /// What ran: the server's version, the database or file, the pool.
    about: String,
    bare: Variant,
    new: Variant,
    replay: Variant,
    /// Further paths, run when `--only` names them.
    more: Vec<Variant>,
    /// Requests/s of a variant's statements alone at a concurrency, for a duration.
    #[allow(clippy::type_complexity)]
    ceiling: Box<dyn Fn(Variant, usize, Duration) -> BoxFuture<'static, f64>>,
    /// Drops what the bench created (the MySQL database, the SQLite file).
    cleanup: Box<dyn FnOnce() -> BoxFuture<'static, ()>>,
}

/// The other databases this build and environment have (MySQL when built with `mysql` and
/// `MYSQL_URL` answers, SQLite when built with `sqlite`), each with the variants `--only`
/// selects (its `bare` first; a database none of whose variants is named is left out), and
/// their servers' addresses.
async fn other_databases(
    options: &Options,
) -> (
    Vec<(OtherDatabase, Vec<Variant>)>,
    Option<SocketAddr>,
    Option<SocketAddr>,
) {
    let selected =
        |v: Variant| options.only.is_empty() || options.only.iter().any(|o| o == v.name());
    #[allow(unused_mut)]
    let mut others: Vec<OtherDatabase> = Vec::new();
    #[allow(unused_mut)]
    let mut mysql = None;
    #[cfg(feature = "mysql")]
    if let Some((database, addr)) = on_mysql::database().await {
        mysql = Some(addr);
        others.push(database);
    }
    #[cfg(feature = "sqlite")]
    let sqlite = {
        let (database, addr) = on_sqlite::database().await;
        others.push(database);
        Some(addr)
    };
    #[cfg(not(feature = "sqlite"))]
    let sqlite = None;
    let mut chosen = Vec::new();
    for database in others {
        let mut variants: Vec<Variant> = [database.new, database.replay]
            .into_iter()
            .filter(|&v| selected(v))
            .chain(
                database
                    .more
                    .iter()
                    .copied()
                    .filter(|v| options.only.iter().any(|o| o == v.name())),
            )
            .collect();
        if variants.is_empty() && !selected(database.bare) {
            (database.cleanup)().await;
            continue;
        }
        variants.insert(0, database.bare);
        chosen.push((database, variants));
    }
    (chosen, mysql, sqlite)
}

/// One round of a database's variants: each one's HTTP figures, then, when measured, the
/// same statements alone (`None` when not).
struct Round {
    variants: Vec<Variant>,
    http: Vec<Figures>,
    alone: Vec<Option<f64>>,
}

impl Round {
    fn at(&self, variant: Variant) -> Option<usize> {
        self.variants.iter().position(|v| *v == variant)
    }
}

/// `rounds` rounds of `variants` at `concurrency` (after a warm-up of every path), each
/// round's HTTP runs followed, with `ceiling_time`, by each variant's ceiling.
async fn database_rounds(
    database: &OtherDatabase,
    variants: &[Variant],
    servers: Servers,
    concurrency: usize,
    load: Load,
    rounds: usize,
    ceiling_time: Option<Duration>,
) -> Vec<Round> {
    for &variant in variants {
        run(
            variant,
            servers,
            concurrency,
            Load::Requests(concurrency * 5),
        )
        .await;
    }
    let mut all = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let mut http = Vec::with_capacity(variants.len());
        for &variant in variants {
            http.push(run(variant, servers, concurrency, load).await);
        }
        let mut alone = Vec::with_capacity(variants.len());
        for &variant in variants {
            alone.push(match ceiling_time {
                Some(time) => Some((database.ceiling)(variant, concurrency, time).await),
                None => None,
            });
        }
        all.push(Round {
            variants: variants.to_vec(),
            http,
            alone,
        });
    }
    all
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// How long a run lasts at `concurrency`, and its ceilings.
fn loads(options: &Options, concurrency: usize, requests: usize) -> (Load, Duration) {
    match options.seconds {
        Some(seconds) => (
            Load::Seconds(Duration::from_secs(seconds)),
            Duration::from_secs(seconds),
        ),
        None if concurrency == 1 => (Load::Requests(requests / 3), Duration::from_secs(2)),
        None => (Load::Requests(requests), Duration::from_secs(2)),
    }
}

/// A database's table at every concurrency (every round, then the medians), and for
/// SQLite the one-writer table.
async fn other_database_run(
    database: &OtherDatabase,
    variants: &[Variant],
    servers: Servers,
    options: &Options,
    concurrencies: &[usize],
    requests: usize,
) {
    let bare = database.bare;
    let mut measured: Vec<(usize, Vec<Round>)> = Vec::new();
    println!("\n### {}: {}", database.name, database.about);
    for &concurrency in concurrencies {
        let (load, ceiling_time) = loads(options, concurrency, requests);
        let rounds = database_rounds(
            database,
            variants,
            servers,
            concurrency,
            load,
            options.rounds,
            Some(ceiling_time),
        )
        .await;
        println!(
            "\n| {} c={concurrency} | round | requests/s | p50 ms | p99 ms | non-201 | ratio to {} | database alone req/s | database alone ratio to {} | × database alone |",
            database.name,
            bare.name(),
            bare.name()
        );
        println!("|---|---|---|---|---|---|---|---|---|---|");
        // Per round: (ratio, database-alone ratio, share) of each variant.
        let mut per_variant: Vec<Vec<[f64; 6]>> = vec![Vec::new(); variants.len()];
        for (r, round) in rounds.iter().enumerate() {
            let base = round.at(bare).unwrap();
            for (i, &variant) in variants.iter().enumerate() {
                let figures = &round.http[i];
                let alone = round.alone[i].unwrap_or(f64::NAN);
                let ratio = figures.rps / round.http[base].rps;
                let alone_ratio = alone / round.alone[base].unwrap_or(f64::NAN);
                let share = figures.rps / alone;
                per_variant[i].push([
                    figures.rps,
                    figures.p50().as_secs_f64() * 1000.0,
                    figures.p99().as_secs_f64() * 1000.0,
                    ratio,
                    alone,
                    alone_ratio,
                ]);
                println!(
                    "| {} | {} | {:.0} | {} | {} | {} | {:.2} | {:.0} | {:.2} | {:.2} |",
                    variant.name(),
                    r + 1,
                    figures.rps,
                    ms(figures.p50()),
                    ms(figures.p99()),
                    figures.errors,
                    ratio,
                    alone,
                    alone_ratio,
                    share
                );
            }
        }
        if rounds.len() > 1 {
            for (i, &variant) in variants.iter().enumerate() {
                let column = |c: usize| median(per_variant[i].iter().map(|row| row[c]).collect());
                let shares = per_variant[i].iter().map(|row| row[0] / row[4]).collect();
                let errors: usize = rounds.iter().map(|round| round.http[i].errors).sum();
                println!(
                    "| {} | median | {:.0} | {:.2} | {:.2} | {} in all | {:.2} | {:.0} | {:.2} | {:.2} |",
                    variant.name(),
                    column(0),
                    column(1),
                    column(2),
                    errors,
                    column(3),
                    column(4),
                    column(5),
                    median(shares)
                );
            }
        }
        measured.push((concurrency, rounds));
    }
    if database.name == "sqlite" && variants.contains(&database.new) {
        one_writer(database, servers, options, requests, measured).await;
    }
}

/// SQLite's one writer: `sqlite-bare` and `sqlite-new` at concurrency 1, 4 and 16 (the
/// rounds of the main table reused where it ran that concurrency).
async fn one_writer(
    database: &OtherDatabase,
    servers: Servers,
    options: &Options,
    requests: usize,
    mut measured: Vec<(usize, Vec<Round>)>,
) {
    let (bare, new) = (database.bare, database.new);
    println!(
        "\n| {} one writer | round | {} req/s | p50 ms | p99 ms | {} req/s | p50 ms | p99 ms | non-201 | {} ÷ {} |",
        database.name,
        bare.name(),
        new.name(),
        new.name(),
        bare.name()
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for concurrency in [1, 4, 16] {
        let rounds = match measured.iter().position(|(c, _)| *c == concurrency) {
            Some(at) => measured.swap_remove(at).1,
            None => {
                let (load, _) = loads(options, concurrency, requests);
                database_rounds(
                    database,
                    &[bare, new],
                    servers,
                    concurrency,
                    load,
                    options.rounds,
                    None,
                )
                .await
            }
        };
        let mut ratios = Vec::new();
        for (r, round) in rounds.iter().enumerate() {
            let (b, n) = (
                &round.http[round.at(bare).unwrap()],
                &round.http[round.at(new).unwrap()],
            );
            ratios.push(n.rps / b.rps);
            println!(
                "| c={concurrency} | {} | {:.0} | {} | {} | {:.0} | {} | {} | {} | {:.2} |",
                r + 1,
                b.rps,
                ms(b.p50()),
                ms(b.p99()),
                n.rps,
                ms(n.p50()),
                ms(n.p99()),
                b.errors + n.errors,
                n.rps / b.rps
            );
        }
        if rounds.len() > 1 {
            println!(
                "| c={concurrency} | median | | | | | | | | {:.2} |",
                median(ratios)
            );
        }
    }
}

/// The article's scale: millions of existing records, then a purge under load.
async fn scale_run(
    admin: &tokio_postgres::Client,
    schema: &str,
    pool: &Pool,
    servers: Servers,
    records: u64,
) {
    // The empty-table figures, measured here so that the WAL counters cover them alone.
    let mut empty = Vec::new();
    for variant in [Variant::New, Variant::Replay] {
        empty.push(measured_with_wal(admin, schema, variant, servers).await);
    }
    println!("\nloading {records} records …");
    let started = Instant::now();
    load(admin, schema, records, "now() + interval '3 days'").await;
    let (count, table, indexes) = table_sizes(admin, schema).await;
    let per_million = |bytes: i64| bytes as f64 / (count as f64 / 1e6) / (1024.0 * 1024.0);
    println!(
        "loaded in {:.0} s: {count} records, table {:.0} MiB/million, indexes {:.0} MiB/million",
        started.elapsed().as_secs_f64(),
        per_million(table),
        per_million(indexes)
    );
    println!(
        "\n| variant (c=16) | table | req/s | ratio to empty | WAL bytes/request | full-page images/request | checkpoints | heap hit | index hit |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for (variant, before) in [Variant::New, Variant::Replay].into_iter().zip(&empty) {
        let after = measured_with_wal(admin, schema, variant, servers).await;
        for (table, figures) in [("empty", before), ("loaded", &after)] {
            println!(
                "| {} | {table} | {:.0} | {:.2} | {:.0} | {:.2} | {} | {:.4} | {:.4} |",
                variant.name(),
                figures.rps,
                figures.rps / before.rps,
                figures.wal_bytes,
                figures.fpi,
                figures.checkpoints,
                figures.heap_hit,
                figures.index_hit
            );
        }
    }

    // Purge a million expired records while serving new requests.
    admin
        .batch_execute(&format!(
            "UPDATE {schema}.idempotency_records SET expires_at = now() - interval '1 hour' \
             WHERE id IN (SELECT id FROM {schema}.idempotency_records LIMIT 1000000)"
        ))
        .await
        .unwrap();
    admin
        .batch_execute(&format!("VACUUM ANALYZE {schema}.idempotency_records"))
        .await
        .unwrap();
    purge_under_load(pool, servers, SweepMode::Delete).await;
}

/// Requests/s and what each request cost the server: WAL bytes and full-page images
/// written, checkpoints that ran, and how often the table's and its indexes' pages were
/// found in shared buffers (the benchmark should have the server to itself).
struct WalFigures {
    rps: f64,
    wal_bytes: f64,
    fpi: f64,
    checkpoints: i64,
    heap_hit: f64,
    index_hit: f64,
}

/// The server's cumulative counters that [`WalFigures`] are the differences of: WAL
/// position, full-page images, checkpoints, the table's heap blocks hit and read, its
/// indexes' blocks hit and read.
async fn counters(admin: &tokio_postgres::Client, schema: &str) -> [f64; 7] {
    let row = admin
        .query_one(
            &format!(
                "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::float8, \
                 (SELECT wal_fpi::float8 FROM pg_stat_wal), \
                 (SELECT (checkpoints_timed + checkpoints_req)::float8 FROM pg_stat_bgwriter), \
                 (SELECT coalesce(heap_blks_hit, 0)::float8 FROM pg_statio_user_tables \
                  WHERE schemaname = '{schema}' AND relname = 'idempotency_records'), \
                 (SELECT coalesce(heap_blks_read, 0)::float8 FROM pg_statio_user_tables \
                  WHERE schemaname = '{schema}' AND relname = 'idempotency_records'), \
                 (SELECT coalesce(sum(idx_blks_hit), 0)::float8 FROM pg_statio_user_indexes \
                  WHERE schemaname = '{schema}' AND relname = 'idempotency_records'), \
                 (SELECT coalesce(sum(idx_blks_read), 0)::float8 FROM pg_statio_user_indexes \
                  WHERE schemaname = '{schema}' AND relname = 'idempotency_records')"
            ),
            &[],
        )
        .await
        .unwrap();
    std::array::from_fn(|i| row.get(i))
}

async fn measured_with_wal(
    admin: &tokio_postgres::Client,
    schema: &str,
    variant: Variant,
    servers: Servers,
) -> WalFigures {
    // The statistics collector reports with a delay; let the previous run's numbers land.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let before = counters(admin, schema).await;
    let figures = run(variant, servers, 16, Load::Requests(3000)).await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    let after = counters(admin, schema).await;
    let requests = figures.latencies.len() as f64;
    let delta = |i: usize| after[i] - before[i];
    let ratio = |hit: f64, read: f64| {
        if hit + read > 0.0 {
            hit / (hit + read)
        } else {
            1.0
        }
    };
    WalFigures {
        rps: figures.rps,
        wal_bytes: delta(0) / requests,
        fpi: delta(1) / requests,
        checkpoints: delta(2) as i64,
        heap_hit: ratio(delta(3), delta(4)),
        index_hit: ratio(delta(5), delta(6)),
    }
}

/// Inserts `records` records (not through HTTP) expiring at the SQL expression `expires`,
/// then vacuums and analyzes the table.
async fn load(admin: &tokio_postgres::Client, schema: &str, records: u64, expires: &str) {
    let batch = 1_000_000;
    let mut loaded = 0;
    while loaded < records {
        let n = batch.min(records - loaded);
        admin
            .batch_execute(&format!(
                "INSERT INTO {schema}.idempotency_records \
                   (id, scope, fingerprint, status, headers, body, created_at, expires_at) \
                 SELECT gen_random_uuid(), 'tenant-' || (g % 1000), \
                        decode(md5(g::text) || md5((g + 1)::text), 'hex'), 201, \
                        '\\x000c636f6e74656e742d74797065000000106170706c69636174696f6e2f6a736f6e', \
                        convert_to('{{\"id\":' || g || ',\"user_id\":7,\"amount\":100}}', 'UTF8'), \
                        now(), {expires} \
                 FROM generate_series({loaded}, {}) AS g",
                loaded + n - 1
            ))
            .await
            .unwrap();
        loaded += n;
    }
    admin
        .batch_execute(&format!("VACUUM ANALYZE {schema}.idempotency_records"))
        .await
        .unwrap();
}

/// Runs the sweeper, with its defaults, over every expired record (of a freshly vacuumed
/// table) while serving `new` at concurrency 16, and compares the p99 of all requests served during the purge with a
/// quiet run just before it.
/// What `--sweep` does with the records it purges.
#[derive(Clone, Copy)]
enum SweepMode {
    /// The defaults: delete.
    Delete,
    /// `Sweeper::archive(Archive::Records)`: into `idempotency_records_archive`.
    Table,
    /// `Sweeper::archive_to(JsonLinesInMemory, Archive::Records)`: each row serialized.
    Sink,
}

/// An archive sink that serializes every row as a JSON line and keeps only the count of
/// bytes: the export path's own cost, with no disk behind it.
struct JsonLinesInMemory(std::sync::atomic::AtomicU64);

impl axum_idempotency::ArchiveSink for JsonLinesInMemory {
    async fn write(
        &self,
        rows: &[axum_idempotency::ArchivedRow],
    ) -> Result<(), axum_idempotency::BoxError> {
        let mut bytes = 0;
        for row in rows {
            let body = row
                .response
                .as_ref()
                .map(|r| String::from_utf8_lossy(&r.body));
            let line = serde_json::json!({
                "archive_id": row.archive_id,
                "scope": row.record.scope,
                "state": row.record.state,
                "status": row.record.status,
                "fingerprint": row.record.fingerprint,
                "body": body,
            });
            bytes += serde_json::to_vec(&line)?.len() as u64 + 1;
        }
        self.0
            .fetch_add(bytes, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }
}

async fn purge_under_load(pool: &Pool, servers: Servers, mode: SweepMode) {
    let quiet = run(Variant::New, servers, 16, Load::Requests(3000)).await;
    let records = axum_idempotency::Archive::Records;
    let (sweeper, label) = match mode {
        SweepMode::Delete => (Sweeper::new(pool.clone()), "defaults"),
        SweepMode::Table => (Sweeper::new(pool.clone()).archive(records), "archiving"),
        SweepMode::Sink => (
            Sweeper::new(pool.clone()).archive_to(JsonLinesInMemory(Default::default()), records),
            "archiving into a sink",
        ),
    };
    let purge = tokio::spawn(async move {
        let started = Instant::now();
        let report = sweeper.run_once().await.unwrap();
        (report.purged_records, started.elapsed())
    });
    let mut during = Vec::new();
    let mut serving = Duration::ZERO;
    while !purge.is_finished() {
        let figures = run(Variant::New, servers, 16, Load::Requests(1000)).await;
        serving += Duration::from_secs_f64(figures.latencies.len() as f64 / figures.rps);
        during.extend(figures.latencies);
    }
    let (purged, took) = purge.await.unwrap();
    during.sort_unstable();
    let served = during.len();
    let p99 = quantile(&during, 0.99);
    println!(
        "\nsweeper ({label}) purged {purged} records in {:.1} s ({:.0} rows/s) while serving \
         `new` at c=16: p99 {} ms over {served} requests (quiet {} ms, ratio {:.2}), \
         {:.0} req/s (quiet {:.0})",
        took.as_secs_f64(),
        purged as f64 / took.as_secs_f64(),
        ms(p99),
        ms(quiet.p99()),
        p99.as_secs_f64() / quiet.p99().as_secs_f64(),
        served as f64 / serving.as_secs_f64(),
        quiet.rps
    );
}
