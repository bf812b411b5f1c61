//! The README's SQLite quickstart: `cargo run --example quickstart_sqlite --features sqlite`.
//! (`tests-integration/tests/readme.rs` checks that the README shows the code below as it is.)

use axum::{Json, Router, http::StatusCode, response::IntoResponse, routing::post};
use axum_idempotency::sqlite::{IdempotentTx, SqliteStore, sqlx};
use axum_idempotency::{Error, IdempotencyLayer};
use serde_json::{Value, json};

async fn create_order(
    mut tx: IdempotentTx,
    Json(body): Json<Value>,
) -> Result<impl IntoResponse, Error> {
    let Some(amount) = body["amount"].as_i64().filter(|amount| *amount > 0) else {
        // 400, stored and replayed like any final answer (422 is the layer's: key reused).
        return Ok((
            StatusCode::BAD_REQUEST,
            Json(json!({ "error": "amount must be > 0" })),
        ));
    };
    // `&mut *tx`: the record's transaction. `?` makes `sqlx::Error` an `Error` (503 or 500).
    let sql = "INSERT INTO quickstart_orders (amount) VALUES (?) RETURNING id";
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
    // The file is created if missing, in WAL mode, with a busy timeout: what the crate needs.
    let options = SqliteStore::connect_options("quickstart.db");
    let pool = sqlx::SqlitePool::connect_with(options).await?;
    axum_idempotency::migrate(&pool).await?; // the crate's tables; safe on every start
    let table =
        "CREATE TABLE IF NOT EXISTS quickstart_orders (id INTEGER PRIMARY KEY, amount INTEGER)";
    sqlx::raw_sql(table).execute(&pool).await?;
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
