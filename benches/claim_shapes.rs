//! Claim shapes, the database alone: the statements of one request in atomic mode,
//! driven from 16 connections with no HTTP and no layer, in the shapes the claim could
//! take, beside the bare business transaction in the same process.
//!
//! ```sh
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres \
//!     cargo bench --bench claim_shapes --all-features                 # every shape, 3 rounds of 6 s
//! cargo bench --bench claim_shapes --all-features -- bare shipped sqlx-shipped   # some shapes
//! CLAIM_SHAPES_SECONDS=8 cargo bench --bench claim_shapes --all-features
//! ```
//!
//! Each round runs every shape in turn; a shape's ratio is to `bare` of the same round.
//! The shapes:
//!
//! | shape | statements (`[…]` pipelined in one round trip) |
//! |---|---|
//! | `bare` | `BEGIN`, insert, `COMMIT` |
//! | `shipped` | lookup, [`BEGIN`, lock attempt, lookup], insert, [record insert, `COMMIT`] (tokio-postgres today) |
//! | `no-first-lookup` | [`BEGIN`, lock attempt, lookup], insert, [record insert, `COMMIT`] |
//! | `compound` | lookup, `BEGIN; lock; lookup` as one simple-protocol message with the values inlined, insert, [record insert, `COMMIT`] |
//! | `compound-commit` | as `compound`, the record insert and `COMMIT` one simple-protocol message too |
//! | `replay` | the lookup of a completed record, autocommit (tokio-postgres today) |
//! | `replay-simple` | the same lookup in the simple protocol |
//! | `replay-in-tx` | [`BEGIN`, lock attempt, lookup, `ROLLBACK`]: a replay without the first lookup |
//! | `sqlx-bare` | `bare` on sqlx (`pool.begin()`, insert, `commit()`) |
//! | `sqlx-shipped` | sqlx today: checkout, lookup, `BEGIN` on that connection, claim function, insert, record insert, `COMMIT` |
//! | `sqlx-begin-first` | sqlx before: `pool.begin()`, claim function, insert, record insert, `COMMIT` |
//! | `sqlx-replay` | sqlx today: checkout, lookup |
//! | `sqlx-replay-begin-first` | sqlx before: `pool.begin()`, claim function, `ROLLBACK` |

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio_postgres::NoTls;
use tokio_postgres::types::{IsNull, ToSql, Type, to_sql_checked};

const SHAPES: &[&str] = &[
    "bare",
    "shipped",
    "no-first-lookup",
    "compound",
    "compound-commit",
    "replay",
    "replay-simple",
    "replay-in-tx",
    "sqlx-bare",
    "sqlx-shipped",
    "sqlx-begin-first",
    "sqlx-replay",
    "sqlx-replay-begin-first",
];
const SCHEMA: &str = "bench_claim_shapes";
const CONNECTIONS: usize = 16;

/// A record id, sent as `uuid` by both drivers.
#[derive(Debug, Clone, Copy)]
struct Uuid([u8; 16]);

impl ToSql for Uuid {
    fn to_sql(
        &self,
        _ty: &Type,
        out: &mut bytes::BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        out.extend_from_slice(&self.0);
        Ok(IsNull::No)
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::UUID
    }

    to_sql_checked!();
}

impl sqlx::Type<sqlx::Postgres> for Uuid {
    fn type_info() -> sqlx::postgres::PgTypeInfo {
        sqlx::postgres::PgTypeInfo::with_oid(sqlx::postgres::types::Oid(2950))
    }
}

impl sqlx::Encode<'_, sqlx::Postgres> for Uuid {
    fn encode_by_ref(
        &self,
        buf: &mut sqlx::postgres::PgArgumentBuffer,
    ) -> Result<sqlx::encode::IsNull, sqlx::error::BoxDynError> {
        buf.extend_from_slice(&self.0);
        Ok(sqlx::encode::IsNull::No)
    }
}

impl Uuid {
    /// A fresh id, spread over the key space like the SHA-256 ids the crate writes.
    fn fresh() -> Self {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mix = |mut z: u64| {
            // splitmix64
            z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        let mut id = [0; 16];
        id[..8].copy_from_slice(&mix(n ^ (u64::from(std::process::id()) << 32)).to_be_bytes());
        id[8..].copy_from_slice(&mix(n.rotate_left(17)).to_be_bytes());
        Self(id)
    }

    fn lock_key(self) -> i64 {
        i64::from_be_bytes(self.0[..8].try_into().unwrap())
    }

    /// The canonical text form, for statements with the values inlined.
    fn text(self) -> String {
        let h = hex(&self.0);
        format!(
            "{}-{}-{}-{}-{}",
            &h[0..8],
            &h[8..12],
            &h[12..16],
            &h[16..20],
            &h[20..]
        )
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

const COLUMNS: &str = "status, headers, body, fingerprint, expires_at <= now(), \
    state, retryable, ceil(extract(epoch FROM locked_until - now()))::int4, \
    extract(epoch FROM expires_at - now())::float8, body_key_id";
const LOOKUP: &str = "SELECT status, headers, body, fingerprint, expires_at <= now(), \
    state, retryable, ceil(extract(epoch FROM locked_until - now()))::int4, \
    extract(epoch FROM expires_at - now())::float8, body_key_id \
    FROM idempotency_records WHERE id = $1";
const LOCK_EXPR: &str = "('idempotency_records'::regclass::oid::int8 << 32)";
const TRY_LOCK: &str = "SELECT pg_try_advisory_xact_lock(($1 # \
    ('idempotency_records'::regclass::oid::int8 << 32)))";
const CLAIM: &str = "SELECT * FROM axum_idempotency_claim_v2($1, ($2 # \
    ('idempotency_records'::regclass::oid::int8 << 32)))";
const INSERT_RECORD: &str = "INSERT INTO idempotency_records \
    (id, scope, idempotency_key, fingerprint, status, headers, body, body_key_id, expires_at) \
    VALUES ($1, '', NULL, $2, 201, $3, $4, NULL, now() + make_interval(secs => 86400))";
const INSERT_ORDER: &str = "INSERT INTO orders (user_id, amount) VALUES ($1, $2) RETURNING id";
const HEADERS: &[u8] = b"\x00\x0ccontent-type\x00\x00\x00\x10application/json";
const FINGERPRINT: &[u8] = &[7; 32];
const BODY: &[u8] = br#"{"id":1,"user_id":1,"amount":2}"#;

/// `BEGIN`, the lock attempt and the lookup as one simple-protocol message: each
/// statement still takes its own snapshot.
fn compound_claim(id: Uuid) -> String {
    format!(
        "BEGIN; SELECT pg_try_advisory_xact_lock(({} # {LOCK_EXPR})); \
         SELECT {COLUMNS} FROM idempotency_records WHERE id = '{}'",
        id.lock_key(),
        id.text()
    )
}

async fn tokio_postgres_shape(client: &deadpool_postgres::Client, shape: &str, replay: Uuid) {
    let order = client.prepare_cached(INSERT_ORDER).await.unwrap();
    let lookup = client.prepare_cached(LOOKUP).await.unwrap();
    let try_lock = client.prepare_cached(TRY_LOCK).await.unwrap();
    let insert = client.prepare_cached(INSERT_RECORD).await.unwrap();
    let (user, amount) = (1_i64, 2_i64);
    let finish = |id: Uuid| {
        let insert = &insert;
        async move {
            let params: [&(dyn ToSql + Sync); 4] = [&id, &FINGERPRINT, &HEADERS, &BODY];
            let (inserted, committed) = tokio::join!(
                biased;
                client.execute(insert, &params),
                client.batch_execute("COMMIT"),
            );
            inserted.unwrap();
            committed.unwrap();
        }
    };
    match shape {
        "bare" => {
            client.batch_execute("BEGIN").await.unwrap();
            client.query_one(&order, &[&user, &amount]).await.unwrap();
            client.batch_execute("COMMIT").await.unwrap();
        }
        "shipped" | "no-first-lookup" => {
            let id = Uuid::fresh();
            if shape == "shipped" {
                client.query_opt(&lookup, &[&id]).await.unwrap();
            }
            let key = id.lock_key();
            let lock_params: [&(dyn ToSql + Sync); 1] = [&key];
            let lookup_params: [&(dyn ToSql + Sync); 1] = [&id];
            let (begun, locked, found) = tokio::join!(
                biased;
                client.batch_execute("BEGIN"),
                client.query_one(&try_lock, &lock_params),
                client.query_opt(&lookup, &lookup_params),
            );
            begun.unwrap();
            locked.unwrap();
            found.unwrap();
            client.query_one(&order, &[&user, &amount]).await.unwrap();
            finish(id).await;
        }
        "compound" | "compound-commit" => {
            let id = Uuid::fresh();
            client.query_opt(&lookup, &[&id]).await.unwrap();
            client.simple_query(&compound_claim(id)).await.unwrap();
            client.query_one(&order, &[&user, &amount]).await.unwrap();
            if shape == "compound" {
                finish(id).await;
            } else {
                let record_and_commit = format!(
                    "INSERT INTO idempotency_records (id, scope, idempotency_key, fingerprint, \
                     status, headers, body, body_key_id, expires_at) VALUES ('{}', '', NULL, \
                     '\\x{}', 201, '\\x{}', '\\x{}', NULL, now() + make_interval(secs => 86400)); \
                     COMMIT",
                    id.text(),
                    hex(FINGERPRINT),
                    hex(HEADERS),
                    hex(BODY)
                );
                client.simple_query(&record_and_commit).await.unwrap();
            }
        }
        "replay" => {
            client.query_opt(&lookup, &[&replay]).await.unwrap();
        }
        "replay-simple" => {
            let text = format!(
                "SELECT {COLUMNS} FROM idempotency_records WHERE id = '{}'",
                replay.text()
            );
            client.simple_query(&text).await.unwrap();
        }
        "replay-in-tx" => {
            let key = replay.lock_key();
            let lock_params: [&(dyn ToSql + Sync); 1] = [&key];
            let lookup_params: [&(dyn ToSql + Sync); 1] = [&replay];
            let (begun, locked, found, rolled_back) = tokio::join!(
                biased;
                client.batch_execute("BEGIN"),
                client.query_one(&try_lock, &lock_params),
                client.query_opt(&lookup, &lookup_params),
                client.batch_execute("ROLLBACK"),
            );
            begun.unwrap();
            locked.unwrap();
            found.unwrap();
            rolled_back.unwrap();
        }
        _ => unreachable!("{shape}"),
    }
}

async fn sqlx_shape(pool: &sqlx::PgPool, shape: &str, replay: Uuid) {
    let (user, amount) = (1_i64, 2_i64);
    match shape {
        "sqlx-bare" => {
            let mut tx = pool.begin().await.unwrap();
            sqlx::query(INSERT_ORDER)
                .bind(user)
                .bind(amount)
                .fetch_one(&mut *tx)
                .await
                .unwrap();
            tx.commit().await.unwrap();
        }
        "sqlx-shipped" | "sqlx-begin-first" => {
            let id = Uuid::fresh();
            let mut tx = if shape == "sqlx-begin-first" {
                pool.begin().await.unwrap()
            } else {
                let mut conn = pool.acquire().await.unwrap();
                sqlx::query(LOOKUP)
                    .bind(id)
                    .fetch_optional(&mut *conn)
                    .await
                    .unwrap();
                sqlx::Transaction::begin(conn, None).await.unwrap()
            };
            sqlx::query(CLAIM)
                .bind(id)
                .bind(id.lock_key())
                .fetch_one(&mut *tx)
                .await
                .unwrap();
            sqlx::query(INSERT_ORDER)
                .bind(user)
                .bind(amount)
                .fetch_one(&mut *tx)
                .await
                .unwrap();
            sqlx::query(INSERT_RECORD)
                .bind(id)
                .bind(FINGERPRINT)
                .bind(HEADERS)
                .bind(BODY)
                .execute(&mut *tx)
                .await
                .unwrap();
            tx.commit().await.unwrap();
        }
        "sqlx-replay" => {
            let mut conn = pool.acquire().await.unwrap();
            sqlx::query(LOOKUP)
                .bind(replay)
                .fetch_optional(&mut *conn)
                .await
                .unwrap();
        }
        "sqlx-replay-begin-first" => {
            let mut tx = pool.begin().await.unwrap();
            sqlx::query(CLAIM)
                .bind(replay)
                .bind(replay.lock_key())
                .fetch_one(&mut *tx)
                .await
                .unwrap();
            tx.rollback().await.unwrap();
        }
        _ => unreachable!("{shape}"),
    }
}

#[tokio::main]
async fn main() {
    let mut shapes: Vec<String> = std::env::args()
        .skip(1)
        .filter(|arg| !arg.starts_with("--"))
        .collect();
    if shapes.is_empty() {
        shapes = SHAPES.iter().map(|s| s.to_string()).collect();
    }
    if let Some(unknown) = shapes.iter().find(|s| !SHAPES.contains(&s.as_str())) {
        panic!("unknown shape {unknown}; the shapes: {SHAPES:?}");
    }
    if !shapes.iter().any(|s| s == "bare") {
        shapes.insert(0, "bare".to_owned());
    }
    let seconds: u64 = std::env::var("CLAIM_SHAPES_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(6);
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned());
    let (admin, connection) = tokio_postgres::connect(&url, NoTls)
        .await
        .expect("connect to DATABASE_URL");
    tokio::spawn(connection);
    admin
        .batch_execute(&format!(
            "DROP SCHEMA IF EXISTS {SCHEMA} CASCADE; CREATE SCHEMA {SCHEMA}"
        ))
        .await
        .unwrap();
    let mut config: tokio_postgres::Config = url.parse().unwrap();
    config.options(format!("-c search_path={SCHEMA}"));
    let manager = Manager::from_config(
        config,
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    let pool = Pool::builder(manager)
        .max_size(CONNECTIONS)
        .build()
        .unwrap();
    axum_idempotency::migrate(&pool).await.unwrap();
    let client = pool.get().await.unwrap();
    client
        .batch_execute(
            "CREATE TABLE orders (id bigserial PRIMARY KEY, user_id bigint NOT NULL, \
             amount bigint NOT NULL)",
        )
        .await
        .unwrap();
    // One completed record per connection to replay.
    let mut replays = Vec::new();
    for _ in 0..CONNECTIONS {
        let id = Uuid::fresh();
        client
            .execute(INSERT_RECORD, &[&id, &FINGERPRINT, &HEADERS, &BODY])
            .await
            .unwrap();
        replays.push(id);
    }
    drop(client);
    let sqlx_options: sqlx::postgres::PgConnectOptions = url.parse().unwrap();
    let sqlx_pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(CONNECTIONS as u32)
        .connect_with(sqlx_options.options([("search_path", SCHEMA)]))
        .await
        .unwrap();

    let mut rates: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for round in 1..=3 {
        for shape in &shapes {
            let shape: &'static str = SHAPES.iter().find(|s| *s == shape).unwrap();
            let started = Instant::now();
            let duration = Duration::from_secs(seconds);
            let workers: Vec<_> = replays
                .iter()
                .map(|&replay| {
                    let (pool, sqlx_pool) = (pool.clone(), sqlx_pool.clone());
                    tokio::spawn(async move {
                        let client = pool.get().await.unwrap();
                        let mut done = 0_u64;
                        while started.elapsed() < duration {
                            if shape.starts_with("sqlx") {
                                sqlx_shape(&sqlx_pool, shape, replay).await;
                            } else {
                                tokio_postgres_shape(&client, shape, replay).await;
                            }
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
            let rate = total as f64 / started.elapsed().as_secs_f64();
            eprintln!("round {round}: {shape} {rate:.0}/s");
            rates.entry(shape).or_default().push(rate);
        }
    }
    println!("| shape | round 1 /s | round 2 /s | round 3 /s | × bare (per round) |");
    println!("|---|---|---|---|---|");
    let bare = rates["bare"].clone();
    for shape in &shapes {
        let shape_rates = &rates[shape.as_str()];
        let per_round: Vec<String> = shape_rates.iter().map(|r| format!("{r:.0}")).collect();
        let ratios: Vec<String> = shape_rates
            .iter()
            .zip(&bare)
            .map(|(rate, bare)| format!("{:.2}", rate / bare))
            .collect();
        println!(
            "| {shape} | {} | {} |",
            per_round.join(" | "),
            ratios.join(" / ")
        );
    }
    admin
        .batch_execute(&format!("DROP SCHEMA {SCHEMA} CASCADE"))
        .await
        .unwrap();
}
