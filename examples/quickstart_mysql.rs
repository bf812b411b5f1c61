//! The README's MySQL/MariaDB quickstart: `cargo run --example quickstart_mysql --features mysql`.
//! (`tests-integration/tests/readme.rs` checks that the README shows the code below as it is.)

use axum::{Json, Router, http::StatusCode, response::IntoResponse, routing::post};
use axum_idempotency::mysql::{IdempotentTx, sqlx};
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
    // `&mut *tx`: the record's transaction (READ COMMITTED). `?`: 503 or 500, rolled back.
    let sql = "INSERT INTO quickstart_orders (amount) VALUES (?)";
    let id = sqlx::query(sql)
        .bind(amount)
        .execute(&mut *tx)
        .await?
        .last_insert_id();
    Ok((
        StatusCode::CREATED,
        Json(json!({ "id": id, "amount": amount })),
    ))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt::init(); // RUST_LOG=axum_idempotency=debug shows the crate's logs
    let pool = sqlx::MySqlPool::connect("mysql://root@127.0.0.1:3306/test").await?;
    axum_idempotency::migrate(&pool).await?; // also checks the server's version and settings
    let table = "CREATE TABLE IF NOT EXISTS quickstart_orders \
                 (id BIGINT AUTO_INCREMENT PRIMARY KEY, amount BIGINT) ENGINE = InnoDB";
    sqlx::query(table).execute(&pool).await?;
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
    layer.drain().await;
    Ok(())
}
