//! The README's sqlx quickstart: `cargo run --example quickstart_sqlx --features sqlx`.
//! (`tests-integration/tests/readme.rs` checks that the README shows the code below as it is.)

use axum::{Json, Router, http::StatusCode, response::IntoResponse, routing::post};
use axum_idempotency::sqlx::IdempotentTx;
use axum_idempotency::{Error, IdempotencyLayer};
use serde_json::{Value, json};

async fn create_order(
    mut tx: IdempotentTx,
    Json(body): Json<Value>,
) -> Result<impl IntoResponse, Error> {
    let Some(amount) = body["amount"].as_i64().filter(|amount| *amount > 0) else {
        return Ok((
            StatusCode::BAD_REQUEST,
            Json(json!({ "error": "amount must be > 0" })),
        ));
    };
    // `&mut *tx`: the record's transaction. `?` makes `sqlx::Error` an `Error` (503 or 500).
    let sql = "INSERT INTO quickstart_sqlx_orders (amount) VALUES ($1) RETURNING id";
    let id: i64 = sqlx::query_scalar(sql)
        .bind(amount)
        .fetch_one(&mut *tx)
        .await?;
    Ok((
        StatusCode::CREATED,
        Json(json!({ "id": id, "amount": amount })),
    ))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt::init(); // RUST_LOG=axum_idempotency=debug shows the crate's logs
    let url = "postgres://postgres@127.0.0.1:5432/postgres";
    let pool = sqlx::postgres::PgPoolOptions::new()
        .acquire_timeout(std::time::Duration::from_secs(5)) // sqlx waits 30 s by default
        .connect(url)
        .await
        .map_err(|e| format!("could not connect to {url}: {e}"))?;
    axum_idempotency::migrate(&pool).await?;
    let table =
        "CREATE TABLE IF NOT EXISTS quickstart_sqlx_orders (id bigserial PRIMARY KEY, amount int8)";
    sqlx::raw_sql(table).execute(&pool).await?;
    let layer = IdempotencyLayer::new(pool);
    let app = Router::new()
        .route("/orders", post(create_order))
        .layer(layer.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    let ctrl_c = async { tokio::signal::ctrl_c().await.unwrap_or_default() };
    println!("quickstart listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app)
        .with_graceful_shutdown(ctrl_c)
        .await?;
    layer.drain().await;
    Ok(())
}
