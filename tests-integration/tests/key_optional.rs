//! `key_required(false)`: a request without a key just runs, in a transaction of its own,
//! and leaves no record; one with a key is idempotent as always — on every driver.

mod common;

use std::sync::Arc;

use axum::http::StatusCode;
use axum_idempotency::IdempotencyLayer;
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

for_each_driver! {
    #[tokio::test]
    async without_a_key_the_handler_runs_each_time_and_nothing_is_recorded;
    #[tokio::test]
    async by_default_a_request_without_a_key_is_refused;
}
