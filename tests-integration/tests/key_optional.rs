//! `key_required(false)`: a request without a key just runs, in a transaction of its own,
//! and leaves no record; one with a key is idempotent as always — on every driver.

mod common;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::http::StatusCode;
use axum::routing::post;
use axum_idempotency::{IdempotencyLayer, IdempotentTx};
use common::*;
use serde_json::json;

async fn without_a_key_the_handler_runs_each_time_and_nothing_is_recorded<D: PgDriver>() {
    let db = TestDb::new(4).await;
    let knobs = Arc::new(Knobs::default());
    let app = router(
        Arc::clone(&knobs),
        IdempotencyLayer::new(D::pool(&db)).key_required(false),
    );
    let body = json!({"amount": 3});
    for _ in 0..2 {
        let answer = send(&app, post_json("/orders", None, &body)).await;
        assert_eq!(answer.status, StatusCode::CREATED, "{:?}", answer.body);
        assert!(answer.headers.get("idempotent-replayed").is_none());
    }
    assert_eq!(knobs.calls(), 2, "the handler ran once per request");
    assert_eq!(db.orders().await, 2, "each request's writes committed");
    assert_eq!(db.records().await, 0, "no record without a key");

    // A key on the same route: full idempotency.
    let first = send(&app, post_json("/orders", Some("opt-1"), &body)).await;
    let retry = send(&app, post_json("/orders", Some("opt-1"), &body)).await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(!first.replayed());
    assert!(retry.replayed());
    assert_eq!(retry.body, first.body);
    assert_eq!(
        (knobs.calls(), db.orders().await, db.records().await),
        (3, 3, 1)
    );

    // A malformed key is still refused.
    let bad = send(&app, post_json("/orders", Some("two words"), &body)).await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert_eq!(bad.problem_code(), "invalid_key");
    db.assert_settles().await;
}

async fn by_default_a_request_without_a_key_is_refused<D: PgDriver>() {
    let db = TestDb::new(2).await;
    let knobs = Arc::new(Knobs::default());
    let app = router(Arc::clone(&knobs), IdempotencyLayer::new(D::pool(&db)));
    let answer = send(&app, post_json("/orders", None, &json!({"amount": 3}))).await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST);
    assert_eq!(answer.problem_code(), "missing_key");
    assert_eq!((knobs.calls(), db.orders().await), (0, 0));
}

/// A handler that gives up on its first statement (a timeout drops it while the server
/// runs it) and answers 200 all the same.
async fn gives_up_on_its_first_statement<S: TestStore>(mut tx: IdempotentTx<S>) -> StatusCode {
    let slow = S::run(
        &mut tx,
        "INSERT INTO orders (user_id, amount) SELECT 7, 7 FROM pg_sleep(0.3)",
    );
    let dropped = tokio::time::timeout(Duration::from_millis(50), slow).await;
    assert!(dropped.is_err(), "the statement outlasts the timeout");
    StatusCode::OK
}

/// Without a key, a transaction whose first statement was dropped midway is still ended
/// as the handler answered (committed) before its connection goes back to the pool: the
/// pool's one connection is not left idle in a transaction, and the next request runs.
async fn a_first_statement_dropped_midway_leaves_no_transaction_open<D: PgDriver>() {
    let db = TestDb::new(1).await;
    let app = Router::new()
        .route("/slow", post(gives_up_on_its_first_statement::<D::Store>))
        .layer(IdempotencyLayer::new(D::pool(&db)).key_required(false));
    let answer = send(&app, post_json("/slow", None, &json!({}))).await;
    assert_eq!(answer.status, StatusCode::OK, "{:?}", answer.body);
    db.assert_settles().await;
    assert_eq!(
        db.orders().await,
        1,
        "the statement committed with the answer"
    );

    let again = send(&app, post_json("/slow", None, &json!({}))).await;
    assert_eq!(again.status, StatusCode::OK, "{:?}", again.body);
    db.assert_settles().await;
    assert_eq!(db.orders().await, 2);

    // With a key, the same: committed with its record, and replayed.
    let keyed = send(&app, post_json("/slow", Some("slow-1"), &json!({}))).await;
    assert_eq!(keyed.status, StatusCode::OK, "{:?}", keyed.body);
    db.assert_settles().await;
    let retry = send(&app, post_json("/slow", Some("slow-1"), &json!({}))).await;
    assert!(retry.replayed(), "{:?}", retry.headers);
    db.assert_settles().await;
    assert_eq!((db.orders().await, db.records().await), (3, 1));
}

for_each_driver! {
    #[tokio::test]
    async a_first_statement_dropped_midway_leaves_no_transaction_open;
    #[tokio::test]
    async without_a_key_the_handler_runs_each_time_and_nothing_is_recorded;
    #[tokio::test]
    async by_default_a_request_without_a_key_is_refused;
}
