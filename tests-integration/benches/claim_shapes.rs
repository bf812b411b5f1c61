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

use tokio_postgres::types::ToSql;

mod support;

use support::{
    BODY, CLAIM, COLUMNS, FINGERPRINT, HEADERS, INSERT_ORDER, INSERT_RECORD, LOCK_EXPR, LOOKUP,
    TRY_LOCK, Uuid, hex,
};

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
    let (pool, admin) = support::fresh_schema(SCHEMA, CONNECTIONS).await;
    let client = pool.get().await.unwrap();
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
    let sqlx_options: sqlx::postgres::PgConnectOptions = support::database_url().parse().unwrap();
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
