//! The README's PostgreSQL quickstart (tokio-postgres over deadpool): `cargo run --example quickstart_postgres`.
//! (`tests-integration/tests/readme.rs` checks that the README shows the code below as it is.)

use axum::{Json, Router, http::StatusCode, response::IntoResponse, routing::post};
use axum_idempotency::postgres::{
    IdempotentTx,
    deadpool_postgres::{Manager, Pool},
    tokio_postgres,
};
use axum_idempotency::{Error, IdempotencyLayer};
use serde_json::{Value, json};

async fn create_order(
    tx: IdempotentTx,
    Json(body): Json<Value>,
) -> Result<impl IntoResponse, Error> {
    let Some(amount) = body["amount"].as_i64().filter(|amount| *amount > 0) else {
        // 400, stored and replayed like any final answer (422 is the layer's: key reused).
        return Ok((
            StatusCode::BAD_REQUEST,
            Json(json!({ "error": "amount must be > 0" })),
        ));
    };
    // `?`: rolled back, then 503 if the database is unreachable, 500 `database_error` if not.
    let sql = "INSERT INTO quickstart_orders (amount) VALUES ($1) RETURNING id";
    let id: i64 = tx.query_one(sql, &[&amount]).await?.get(0);
    Ok((
        StatusCode::CREATED,
        Json(json!({ "id": id, "amount": amount })),
    ))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt::init(); // RUST_LOG=axum_idempotency=debug shows the crate's logs
    let config: tokio_postgres::Config = "postgres://postgres@127.0.0.1:5432/postgres".parse()?;
    let pool = Pool::builder(Manager::new(config, tokio_postgres::NoTls)).build()?;
    axum_idempotency::migrate(&pool).await?; // the crate's tables; safe on every start
    let table =
        "CREATE TABLE IF NOT EXISTS quickstart_orders (id bigserial PRIMARY KEY, amount int8)";
    pool.get().await?.batch_execute(table).await?;
    let layer = IdempotencyLayer::new(pool);
    let app = Router::new()
        .route("/orders", post(create_order))
        .layer(layer.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    println!("quickstart listening on http://{}", listener.local_addr()?);
    let ctrl_c = async { tokio::signal::ctrl_c().await.unwrap_or_default() };
    axum::serve(listener, app)
        .with_graceful_shutdown(ctrl_c)
        .await?;
    layer.drain().await; // requests whose client went away finish their COMMIT
    Ok(())
}
