//! A handler's own failed statement against the crate's own missing schema: the first is
//! that statement's failure (500 `database_error`, nothing about migrating), the second is
//! a misconfiguration that names `migrate` — on every driver.

mod common;

use axum::Router;
use axum::http::StatusCode;
use axum::routing::post;
use axum_idempotency::outbox::OutboxMessage;
use axum_idempotency::{IdempotencyLayer, IdempotentTx};
use common::*;
use serde_json::json;

/// Runs a statement that names a column the handler's own table does not have.
async fn typo<S: TestStore>(
    mut tx: IdempotentTx<S>,
) -> Result<StatusCode, axum_idempotency::Error> {
    S::run(&mut tx, "UPDATE orders SET no_such_column = 1").await?;
    Ok(StatusCode::OK)
}

/// Enqueues an outbox message: the crate's own table, here dropped.
async fn enqueue<S: TestStore>(
    mut tx: IdempotentTx<S>,
) -> Result<StatusCode, axum_idempotency::Error> {
    tx.enqueue(&OutboxMessage::new("topic", "{}")).await?;
    Ok(StatusCode::OK)
}

fn app<D: PgDriver>(db: &TestDb) -> Router {
    Router::new()
        .route("/typo", post(typo::<D::Store>))
        .route("/enqueue", post(enqueue::<D::Store>))
        .layer(IdempotencyLayer::new(D::pool(db)))
}

async fn a_handlers_own_missing_column_is_a_database_error<D: PgDriver>() {
    let db = TestDb::new(2).await;
    let app = app::<D>(&db);
    let answer = send(&app, post_json("/typo", Some("typo-1"), &json!({}))).await;
    assert_eq!(answer.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(answer.problem_code(), "database_error");
    assert!(answer.headers.get("retry-after").is_none());
    let detail = answer.json()["detail"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(!detail.contains("migrate"), "{detail}");
    assert_eq!(db.records().await, 0, "a 5xx stores nothing");
}

async fn the_crates_own_missing_table_names_migrate<D: PgDriver>() {
    let db = TestDb::new(2).await;
    db.admin
        .batch_execute(&format!(
            "DROP TABLE {}.idempotency_outbox CASCADE",
            db.schema
        ))
        .await
        .unwrap();
    let app = app::<D>(&db);
    let answer = send(&app, post_json("/enqueue", Some("outbox-1"), &json!({}))).await;
    assert_eq!(answer.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(answer.problem_code(), "schema_missing");
    let detail = answer.json()["detail"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(detail.contains("migrate"), "{detail}");
}

for_each_driver! {
    #[tokio::test]
    async a_handlers_own_missing_column_is_a_database_error;
    #[tokio::test]
    async the_crates_own_missing_table_names_migrate;
}
