//! The behaviour table of the idempotency layer, one test per row, against real PostgreSQL.

mod common;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::routing::post;
use axum::{Json, Router};
use axum_idempotency::postgres::IdempotentTx;
use axum_idempotency::{IdempotencyLayer, RejectionKind};
use common::*;
use serde_json::json;
use tokio::sync::Semaphore;

fn app<D: Driver>(db: &D::Db) -> (Router, Arc<Knobs>) {
    let knobs = Arc::new(Knobs::default());
    let layer = claim_mode_from_env(scoped(IdempotencyLayer::new(D::pool(db))));
    (router(Arc::clone(&knobs), layer), knobs)
}

async fn first_request_commits_record_with_business_rows<D: Driver>() {
    let db = D::db(4).await;
    let (app, knobs) = app::<D>(&db);
    let answer = send(
        &app,
        post_json("/orders", Some("first-1"), &json!({"amount": 299})),
    )
    .await;
    assert_eq!(answer.status, StatusCode::CREATED);
    assert!(!answer.replayed());
    // The answer left after COMMIT: both rows are already visible to another connection.
    assert_eq!(db.orders().await, 1);
    assert_eq!(db.records().await, 1);
    assert_eq!(knobs.calls(), 1);
    let record = db.only_record().await;
    assert_eq!(record.status, 201);
    assert_eq!(record.body, answer.body.to_vec());
    assert_eq!(record.fingerprint_len, 32);
    assert_eq!(record.scope, "");
    assert!(record.key.is_none(), "the raw key is not stored by default");
    assert_eq!(record.ttl_seconds, 24 * 3600);
    db.assert_settles().await;
}

async fn retry_replays_the_stored_response_byte_for_byte<D: Driver>() {
    let db = D::db(4).await;
    let (app, knobs) = app::<D>(&db);
    let first = send(
        &app,
        post_json(
            "/orders",
            Some("replay-1"),
            &json!({"amount": 299, "user_id": 7}),
        ),
    )
    .await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(first.headers["set-cookie"], "session=secret");

    // Same JSON, other key order and whitespace: the same request.
    let request = Request::post("/orders")
        .header("content-type", "application/json")
        .header("idempotency-key", "\"replay-1\"")
        .body(Body::from("{ \"user_id\" : 7,\n  \"amount\": 299 }"))
        .unwrap();
    let retry = send(&app, request).await;
    assert_eq!(retry.status, first.status);
    assert_eq!(retry.body, first.body);
    assert_eq!(retry.headers["content-type"], first.headers["content-type"]);
    assert_eq!(retry.headers["location"], first.headers["location"]);
    assert!(retry.replayed());
    assert!(
        retry.headers.get("set-cookie").is_none(),
        "Set-Cookie is never stored"
    );
    assert!(
        retry.headers.get("x-not-kept").is_none(),
        "only allowlisted headers are stored"
    );
    assert_eq!(knobs.calls(), 1, "the handler does not run for a replay");
    assert_eq!(db.orders().await, 1);
    db.assert_settles().await;
}

async fn same_key_with_another_payload_is_422<D: Driver>() {
    let db = D::db(4).await;
    let (app, knobs) = app::<D>(&db);
    send(
        &app,
        post_json("/orders", Some("reuse-1"), &json!({"amount": 299})),
    )
    .await;
    let answer = send(
        &app,
        post_json("/orders", Some("reuse-1"), &json!({"amount": 399})),
    )
    .await;
    assert_eq!(answer.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(answer.problem_code(), "key_reused");
    assert_eq!(answer.json()["status"], 422);
    assert_eq!(knobs.calls(), 1);
    assert_eq!(db.orders().await, 1);
    db.assert_settles().await;
}

async fn in_flight_duplicate_gets_409_with_retry_after<D: Driver>() {
    let db = D::db(4).await;
    let gate = Arc::new(Semaphore::new(0));
    let knobs = Arc::new(Knobs {
        gate: Some(Arc::clone(&gate)),
        ..Knobs::default()
    });
    let app = router(
        Arc::clone(&knobs),
        IdempotencyLayer::new(D::pool(&db)).retry_after(3),
    );
    let body = json!({"amount": 5});
    let first = tokio::spawn({
        let app = app.clone();
        let body = body.clone();
        async move { send(&app, post_json("/orders", Some("busy-1"), &body)).await }
    });
    knobs.wait_inserted().await;

    let duplicate = send(&app, post_json("/orders", Some("busy-1"), &body)).await;
    assert_eq!(duplicate.status, StatusCode::CONFLICT);
    assert_eq!(duplicate.headers["retry-after"], "3");
    assert_eq!(duplicate.problem_code(), "in_flight");

    gate.add_permits(1);
    let first = first.await.unwrap();
    assert_eq!(first.status, StatusCode::CREATED);
    let later = send(&app, post_json("/orders", Some("busy-1"), &body)).await;
    assert!(later.replayed());
    assert_eq!(later.body, first.body);
    assert_eq!(knobs.calls(), 1);
    assert_eq!(db.orders().await, 1);
    db.assert_settles().await;
}

async fn in_flight_duplicate_can_wait_and_replay<D: Driver>() {
    let db = D::db(4).await;
    let gate = Arc::new(Semaphore::new(0));
    let knobs = Arc::new(Knobs {
        gate: Some(Arc::clone(&gate)),
        ..Knobs::default()
    });
    let layer = IdempotencyLayer::new(D::pool(&db)).wait_for_in_flight(Duration::from_secs(10));
    let app = router(Arc::clone(&knobs), layer);
    // On PostgreSQL the handler reports its `lock_timeout`: the wait's must not reach it.
    let postgres = D::DATABASE == Database::Postgres;
    let body = json!({"amount": 5, "show_lock_timeout": postgres});
    let first = tokio::spawn({
        let (app, body) = (app.clone(), body.clone());
        async move { send(&app, post_json("/orders", Some("wait-1"), &body)).await }
    });
    knobs.wait_inserted().await;
    let duplicate = tokio::spawn({
        let (app, body) = (app.clone(), body.clone());
        async move { send(&app, post_json("/orders", Some("wait-1"), &body)).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !duplicate.is_finished(),
        "the duplicate waits for the first request"
    );
    gate.add_permits(1);
    let first = first.await.unwrap();
    let duplicate = duplicate.await.unwrap();
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(duplicate.status, StatusCode::CREATED);
    assert!(duplicate.replayed());
    assert_eq!(duplicate.body, first.body);
    if postgres {
        assert_eq!(
            first.json()["lock_timeout"],
            "0",
            "the wait's lock timeout does not reach the handler's statements"
        );
    }
    assert_eq!(knobs.calls(), 1);
    db.assert_settles().await;
}

async fn bounded_wait_ends_in_409<D: Driver>() {
    let db = D::db(4).await;
    let gate = Arc::new(Semaphore::new(0));
    let knobs = Arc::new(Knobs {
        gate: Some(Arc::clone(&gate)),
        ..Knobs::default()
    });
    let layer = IdempotencyLayer::new(D::pool(&db)).wait_for_in_flight(Duration::from_millis(200));
    let app = router(Arc::clone(&knobs), layer);
    let body = json!({"amount": 5});
    let first = tokio::spawn({
        let (app, body) = (app.clone(), body.clone());
        async move { send(&app, post_json("/orders", Some("wait-2"), &body)).await }
    });
    knobs.wait_inserted().await;
    let duplicate = send(&app, post_json("/orders", Some("wait-2"), &body)).await;
    assert_eq!(duplicate.status, StatusCode::CONFLICT);
    assert_eq!(duplicate.problem_code(), "in_flight");
    gate.add_permits(1);
    assert_eq!(first.await.unwrap().status, StatusCode::CREATED);
    db.assert_settles().await;
}

async fn missing_key_is_400<D: Driver>() {
    let db = D::db(2).await;
    let (app, knobs) = app::<D>(&db);
    let answer = send(&app, post_json("/orders", None, &json!({"amount": 1}))).await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST);
    assert_eq!(answer.problem_code(), "missing_key");
    assert_eq!(knobs.calls(), 0);
    // Routes that do not take the extractor are not affected.
    let plain = send(&app, post_json("/plain", None, &json!({}))).await;
    assert_eq!(plain.status, StatusCode::OK);
}

async fn malformed_keys_are_400_never_5xx<D: Driver>() {
    let db = D::db(2).await;
    let (app, knobs) = app::<D>(&db);
    let long = "k".repeat(256);
    let cases: Vec<Vec<u8>> = vec![
        b"".to_vec(),
        b"\"\"".to_vec(),
        long.clone().into_bytes(),
        format!("\"{long}\"").into_bytes(),
        "caf\u{e9}".as_bytes().to_vec(),
        b"\xff".to_vec(),
        b"tab\there".to_vec(),
        b"two words".to_vec(),
        b"\"unterminated".to_vec(),
        b"in\"side".to_vec(),
        b"\"bad\\escape\"".to_vec(),
        b"\"k\";V=1".to_vec(),
        b"\"k\" ;v=1".to_vec(),
        b"\"k\";v=".to_vec(),
        b"\"k\"v".to_vec(),
    ];
    for raw in cases {
        let request = Request::post("/orders")
            .header("content-type", "application/json")
            .header(
                "idempotency-key",
                axum::http::HeaderValue::from_bytes(&raw).unwrap(),
            )
            .body(Body::from(r#"{"amount": 1}"#))
            .unwrap();
        let answer = send(&app, request).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "key {raw:?}");
        assert_eq!(answer.problem_code(), "invalid_key", "key {raw:?}");
    }
    // The header twice is ambiguous.
    let request = Request::post("/orders")
        .header("content-type", "application/json")
        .header("idempotency-key", "a")
        .header("idempotency-key", "b")
        .body(Body::from(r#"{"amount": 1}"#))
        .unwrap();
    assert_eq!(send(&app, request).await.problem_code(), "invalid_key");
    assert_eq!(knobs.calls(), 0);
    assert_eq!(db.orders().await, 0);
}

async fn key_parameters_are_checked_and_ignored<D: Driver>() {
    let db = D::db(2).await;
    let (app, knobs) = app::<D>(&db);
    let keyed = |key: &'static str| {
        Request::post("/orders")
            .header("content-type", "application/json")
            .header("idempotency-key", key)
            .body(Body::from(r#"{"amount": 1}"#))
            .unwrap()
    };
    let first = send(&app, keyed(r#""k";v=1"#)).await;
    assert_eq!(first.status, StatusCode::CREATED);
    for same in [r#""k""#, "k", r#""k"; v=2;x;y="a;b";z=?1"#] {
        let again = send(&app, keyed(same)).await;
        assert_eq!(again.status, StatusCode::CREATED, "{same}");
        assert!(again.replayed(), "{same} names the key of \"k\";v=1");
        assert_eq!(again.body, first.body);
    }
    assert_eq!(knobs.calls(), 1);
    assert_eq!(db.records().await, 1);
}

async fn oversized_body_is_413_by_length_and_by_stream<D: Driver>() {
    let db = D::db(2).await;
    let knobs = Arc::new(Knobs::default());
    let app = router(
        Arc::clone(&knobs),
        IdempotencyLayer::new(D::pool(&db)).body_limit(1024),
    );
    let big = format!(r#"{{"amount": 1, "pad": "{}"}}"#, "x".repeat(2000));

    let declared = Request::post("/orders")
        .header("content-type", "application/json")
        .header("content-length", big.len())
        .header("idempotency-key", "big-1")
        .body(Body::from(big.clone()))
        .unwrap();
    let answer = send(&app, declared).await;
    assert_eq!(answer.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(answer.problem_code(), "payload_too_large");

    // No Content-Length: the limit applies while streaming.
    let chunks: Vec<Result<bytes::Bytes, std::io::Error>> = big
        .as_bytes()
        .chunks(100)
        .map(|c| Ok(bytes::Bytes::copy_from_slice(c)))
        .collect();
    let streamed = Request::post("/orders")
        .header("content-type", "application/json")
        .header("idempotency-key", "big-2")
        .body(Body::from_stream(futures_util::stream::iter(chunks)))
        .unwrap();
    let answer = send(&app, streamed).await;
    assert_eq!(answer.status, StatusCode::PAYLOAD_TOO_LARGE);

    assert_eq!(knobs.calls(), 0);
    assert_eq!(db.orders().await, 0);
    assert_eq!(db.records().await, 0);
    // Just under the limit is fine.
    let ok = send(
        &app,
        post_json(
            "/orders",
            Some("big-3"),
            &json!({"amount": 1, "pad": "x".repeat(900)}),
        ),
    )
    .await;
    assert_eq!(ok.status, StatusCode::CREATED);
}

async fn success_commits_and_stores<D: Driver>() {
    let db = D::db(2).await;
    let (app, knobs) = app::<D>(&db);
    for (key, status) in [("ok-200", 200), ("ok-201", 201), ("ok-303", 303)] {
        let answer = send(
            &app,
            post_json("/orders", Some(key), &json!({"status": status})),
        )
        .await;
        assert_eq!(answer.status.as_u16(), status);
        let retry = send(
            &app,
            post_json("/orders", Some(key), &json!({"status": status})),
        )
        .await;
        assert_eq!(retry.status.as_u16(), status);
        assert!(retry.replayed());
    }
    assert_eq!(knobs.calls(), 3);
    assert_eq!(db.orders().await, 3);
    assert_eq!(db.records().await, 3);
}

async fn deterministic_4xx_is_stored_but_its_writes_are_rolled_back<D: Driver>() {
    let db = D::db(2).await;
    let (app, knobs) = app::<D>(&db);
    for (key, status) in [("c-400", 400), ("c-404", 404), ("c-422", 422)] {
        let body = json!({"status": status});
        let answer = send(&app, post_json("/orders", Some(key), &body)).await;
        assert_eq!(answer.status.as_u16(), status);
        let retry = send(&app, post_json("/orders", Some(key), &body)).await;
        assert_eq!(retry.status.as_u16(), status);
        assert!(retry.replayed(), "a deterministic {status} is replayed");
        assert_eq!(retry.body, answer.body);
    }
    assert_eq!(
        knobs.calls(),
        3,
        "retries of a stored 4xx do not run the handler"
    );
    assert_eq!(
        db.orders().await,
        0,
        "the handler's writes were not committed"
    );
    assert_eq!(db.records().await, 3);
    db.assert_settles().await;
}

async fn a_refusal_before_any_work_is_not_stored<D: Driver>() {
    let db = D::db(2).await;
    let (app, knobs) = app::<D>(&db);
    // An extractor's rejection after the claim: no Content-Type, 415.
    let no_content_type = Request::post("/orders")
        .header("idempotency-key", "early-1")
        .body(Body::from(r#"{"amount": 1}"#))
        .unwrap();
    let refused = send(&app, no_content_type).await;
    assert_eq!(refused.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    // The handler's own validation, before its first statement.
    let invalid = send(
        &app,
        post_json(
            "/orders",
            Some("early-2"),
            &json!({"refuse_before_work": 422}),
        ),
    )
    .await;
    assert_eq!(invalid.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(db.records().await, 0, "neither refusal was stored");
    db.assert_settles().await;
    // The corrected requests under the same keys run, and are stored.
    for key in ["early-1", "early-2"] {
        let ok = send(&app, post_json("/orders", Some(key), &json!({"amount": 1}))).await;
        assert_eq!(ok.status, StatusCode::CREATED, "{key}");
        assert!(!ok.replayed());
    }
    assert_eq!(knobs.calls(), 2);
    assert_eq!((db.orders().await, db.records().await), (2, 2));
}

async fn refusals_before_work_are_stored_when_configured<D: Driver>() {
    let db = D::db(2).await;
    let layer = IdempotencyLayer::new(D::pool(&db)).store_rejections_before_work(true);
    let app = router(Arc::new(Knobs::default()), layer);
    let body = json!({"refuse_before_work": 422});
    let first = send(&app, post_json("/orders", Some("early-3"), &body)).await;
    assert_eq!(first.status, StatusCode::UNPROCESSABLE_ENTITY);
    let retry = send(&app, post_json("/orders", Some("early-3"), &body)).await;
    assert_eq!(retry.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(retry.replayed());
    assert_eq!(db.records().await, 1);
}

async fn retryable_failures_roll_back_and_store_nothing<D: Driver>() {
    let db = D::db(2).await;
    let (app, knobs) = app::<D>(&db);
    for status in [500, 502, 503, 408, 409, 425, 429] {
        let key = format!("fail-{status}");
        let body = json!({"status": status});
        let answer = send(&app, post_json("/orders", Some(&key), &body)).await;
        assert_eq!(answer.status.as_u16(), status);
        let retry = send(&app, post_json("/orders", Some(&key), &body)).await;
        assert_eq!(retry.status.as_u16(), status);
        assert!(
            !retry.replayed(),
            "{status} is not stored; the retry runs again"
        );
    }
    assert_eq!(knobs.calls(), 14);
    assert_eq!(db.orders().await, 0);
    assert_eq!(db.records().await, 0);
    db.assert_settles().await;
}

async fn panicking_handler_rolls_back_and_the_retry_runs_again<D: Driver>() {
    let db = D::db(1).await;
    let (app, knobs) = app::<D>(&db);
    let answer = send(
        &app,
        post_json("/orders", Some("panic-1"), &json!({"panic": true})),
    )
    .await;
    assert_eq!(answer.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(answer.problem_code(), "handler_panicked");
    assert_eq!(db.orders().await, 0);
    assert_eq!(db.records().await, 0);
    // The retry (now without the panic trigger would be another payload; same payload
    // panics again, proving it ran again) runs the handler again.
    let again = send(
        &app,
        post_json("/orders", Some("panic-1"), &json!({"panic": true})),
    )
    .await;
    assert_eq!(again.problem_code(), "handler_panicked");
    assert_eq!(knobs.calls(), 2);
    db.assert_settles().await;
    // The single pooled connection came back clean.
    let ok = send(&app, post_json("/orders", Some("panic-2"), &json!({}))).await;
    assert_eq!(ok.status, StatusCode::CREATED);
}

async fn failed_commit_is_503_stores_nothing_and_the_retry_runs<D: Driver>() {
    if D::DATABASE == Database::MySql {
        // InnoDB checks foreign keys per statement and has no deferred constraints: a
        // handler cannot make its own COMMIT fail there.
        eprintln!("not applicable on MySQL: no deferred constraint can fail a COMMIT");
        return;
    }
    let db = D::db(1).await;
    let (app, knobs) = app::<D>(&db);
    knobs.fail_commit_once.store(true, Ordering::SeqCst);
    let body = json!({"amount": 10});
    let answer = send(&app, post_json("/orders", Some("commit-1"), &body)).await;
    assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(answer.problem_code(), "commit_failed");
    assert!(answer.headers.contains_key("retry-after"));
    assert_eq!(db.orders().await, 0);
    assert_eq!(db.records().await, 0);

    let retry = send(&app, post_json("/orders", Some("commit-1"), &body)).await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert!(!retry.replayed());
    assert_eq!(knobs.calls(), 2);
    assert_eq!(db.orders().await, 1);
    db.assert_settles().await;
}

async fn same_key_in_two_scopes_is_two_keys<D: Driver>() {
    let db = D::db(2).await;
    let (app, knobs) = app::<D>(&db);
    let request = |user: &str, amount: i64| {
        let mut request = post_json("/orders", Some("shared-key"), &json!({"amount": amount}));
        request
            .headers_mut()
            .insert("x-user-id", user.parse().unwrap());
        request
    };
    let alice = send(&app, request("alice", 1)).await;
    let bob = send(&app, request("bob", 2)).await;
    assert_eq!(alice.status, StatusCode::CREATED);
    assert_eq!(bob.status, StatusCode::CREATED);
    assert!(!bob.replayed(), "bob never sees alice's response");
    assert_ne!(alice.body, bob.body);
    assert_eq!(send(&app, request("alice", 1)).await.body, alice.body);
    assert_eq!(send(&app, request("bob", 2)).await.body, bob.body);
    // Unscoped requests are a third key space.
    let unscoped = send(
        &app,
        post_json("/orders", Some("shared-key"), &json!({"amount": 3})),
    )
    .await;
    assert_eq!(unscoped.status, StatusCode::CREATED);
    assert!(!unscoped.replayed());
    assert_eq!(knobs.calls(), 3);
    assert_eq!(db.records().await, 3);
}

async fn expired_record_is_treated_as_absent<D: Driver>() {
    let db = D::db(2).await;
    let (app, knobs) = app::<D>(&db);
    let body = json!({"amount": 10});
    let first = send(&app, post_json("/orders", Some("old-1"), &body)).await;
    db.expire_records().await;
    let again = send(&app, post_json("/orders", Some("old-1"), &body)).await;
    assert_eq!(again.status, StatusCode::CREATED);
    assert!(!again.replayed());
    assert_ne!(again.body, first.body, "a new order was created");
    assert_eq!(knobs.calls(), 2);
    assert_eq!(db.orders().await, 2);
    assert_eq!(db.records().await, 1, "the expired record was replaced");
    let replay = send(&app, post_json("/orders", Some("old-1"), &body)).await;
    assert!(replay.replayed());
    assert_eq!(replay.body, again.body);
}

async fn configured_ttl_sets_expiry_and_raw_key_is_opt_in<D: Driver>() {
    let db = D::db(2).await;
    let knobs = Arc::new(Knobs::default());
    let layer = IdempotencyLayer::new(D::pool(&db))
        .ttl(Duration::from_secs(3600))
        .store_raw_key(true);
    let app = router(knobs, layer);
    send(&app, post_json("/orders", Some("ttl-1"), &json!({}))).await;
    let record = db.only_record().await;
    assert_eq!(record.key.as_deref(), Some("ttl-1"));
    assert_eq!(record.ttl_seconds, 3600);
}

async fn extractor_without_the_layer_is_a_500_that_names_the_layer<D: Driver>() {
    async fn handler(_tx: IdempotentTx, Json(_): Json<serde_json::Value>) -> StatusCode {
        StatusCode::CREATED
    }
    let app = Router::new().route("/orders", post(handler));
    let answer = send(&app, post_json("/orders", Some("k"), &json!({}))).await;
    assert_eq!(answer.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(answer.problem_code(), "layer_missing");
    assert!(
        answer.json()["detail"]
            .as_str()
            .unwrap()
            .contains("IdempotencyLayer")
    );
}

async fn extractor_on_an_uncovered_method_is_a_500<D: Driver>() {
    let db = D::db(2).await;
    let (app, knobs) = app::<D>(&db);
    let request = Request::get("/orders")
        .header("content-type", "application/json")
        .header("idempotency-key", "get-1")
        .body(Body::from("{}"))
        .unwrap();
    let answer = send(&app, request).await;
    assert_eq!(answer.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(answer.problem_code(), "method_not_covered");
    assert_eq!(knobs.calls(), 0);
}

async fn sixty_four_concurrent_requests_with_one_key_execute_once<D: Driver>() {
    let db = D::db(16).await;
    let (app, knobs) = app::<D>(&db);
    let body = json!({"amount": 42});
    let start = Arc::new(tokio::sync::Barrier::new(64));
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let (app, body, start) = (app.clone(), body.clone(), Arc::clone(&start));
            tokio::spawn(async move {
                start.wait().await;
                send(&app, post_json("/orders", Some("storm-1"), &body)).await
            })
        })
        .collect();
    let mut created = Vec::new();
    let mut conflicts = 0;
    for task in tasks {
        let answer = task.await.unwrap();
        match answer.status {
            StatusCode::CREATED => created.push(answer),
            StatusCode::CONFLICT => {
                assert_eq!(answer.problem_code(), "in_flight");
                conflicts += 1;
            }
            other => panic!("unexpected {other}: {:?}", answer.body),
        }
    }
    if optimistic_from_env() && D::LAZY {
        // The optimistic claim (tokio-postgres): every twin that reached the database
        // before the winner committed ran its statements and rolled them back.
        assert!(knobs.calls() >= 1);
    } else {
        // The locked claim: one handler got past its first statement.
        assert_eq!(knobs.calls(), 1);
    }
    assert_eq!(db.orders().await, 1);
    assert_eq!(db.records().await, 1);
    assert_eq!(created.iter().filter(|a| !a.replayed()).count(), 1);
    assert!(created.iter().all(|a| a.body == created[0].body));
    assert_eq!(created.len() + conflicts, 64);
    db.assert_settles().await;
}

async fn custom_rejections_replace_the_problem_document<D: Driver>() {
    let db = D::db(2).await;
    let knobs = Arc::new(Knobs::default());
    let layer = IdempotencyLayer::new(D::pool(&db)).on_rejection(|rejection| {
        let kind = rejection.kind();
        let body = format!("custom:{}", kind.code());
        let status = if kind == RejectionKind::MissingKey {
            StatusCode::PRECONDITION_REQUIRED
        } else {
            rejection.status()
        };
        axum::response::IntoResponse::into_response((status, body))
    });
    let app = router(knobs, layer);
    let missing = send(&app, post_json("/orders", None, &json!({}))).await;
    assert_eq!(missing.status, StatusCode::PRECONDITION_REQUIRED);
    assert_eq!(missing.body, "custom:missing_key");
    send(&app, post_json("/orders", Some("c-1"), &json!({"a": 1}))).await;
    let reused = send(&app, post_json("/orders", Some("c-1"), &json!({"a": 2}))).await;
    assert_eq!(reused.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(reused.body, "custom:key_reused");
}

async fn ignored_json_fields_do_not_change_the_fingerprint<D: Driver>() {
    let db = D::db(2).await;
    let knobs = Arc::new(Knobs::default());
    let layer = IdempotencyLayer::new(D::pool(&db)).ignore_json_field("/sent_at");
    let app = router(Arc::clone(&knobs), layer);
    let first = send(
        &app,
        post_json(
            "/orders",
            Some("ig-1"),
            &json!({"amount": 1, "sent_at": "10:00"}),
        ),
    )
    .await;
    let retry = send(
        &app,
        post_json(
            "/orders",
            Some("ig-1"),
            &json!({"amount": 1, "sent_at": "10:05"}),
        ),
    )
    .await;
    assert!(retry.replayed());
    assert_eq!(retry.body, first.body);
    let other = send(
        &app,
        post_json(
            "/orders",
            Some("ig-1"),
            &json!({"amount": 2, "sent_at": "10:05"}),
        ),
    )
    .await;
    assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(knobs.calls(), 1);
}

async fn deadline_covers_handler_and_commit<D: Driver>() {
    let db = D::db(1).await;
    let knobs = Arc::new(Knobs::default());
    let layer = IdempotencyLayer::new(D::pool(&db)).handler_timeout(Duration::from_secs(1));
    let app = router(Arc::clone(&knobs), layer);
    // A handler that never returns, and one whose response body never ends.
    for (key, body) in [
        ("slow-1", json!({"hang": true})),
        ("slow-2", json!({"stall_body": true})),
    ] {
        let answer = send(&app, post_json("/orders", Some(key), &body)).await;
        assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE, "{key}");
        assert_eq!(answer.problem_code(), "handler_timed_out");
        assert!(answer.headers.contains_key("retry-after"));
    }
    db.assert_settles().await;
    assert_eq!((db.orders().await, db.records().await), (0, 0));
    let ok = send(&app, post_json("/orders", Some("slow-3"), &json!({}))).await;
    assert_eq!(ok.status, StatusCode::CREATED);
}

for_each_database! {
    #[tokio::test]
    async first_request_commits_record_with_business_rows;
    #[tokio::test]
    async retry_replays_the_stored_response_byte_for_byte;
    #[tokio::test]
    async same_key_with_another_payload_is_422;
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async in_flight_duplicate_gets_409_with_retry_after;
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async in_flight_duplicate_can_wait_and_replay;
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async bounded_wait_ends_in_409;
    #[tokio::test]
    async missing_key_is_400;
    #[tokio::test]
    async malformed_keys_are_400_never_5xx;
    #[tokio::test]
    async key_parameters_are_checked_and_ignored;
    #[tokio::test]
    async oversized_body_is_413_by_length_and_by_stream;
    #[tokio::test]
    async success_commits_and_stores;
    #[tokio::test]
    async deterministic_4xx_is_stored_but_its_writes_are_rolled_back;
    #[tokio::test]
    async a_refusal_before_any_work_is_not_stored;
    #[tokio::test]
    async refusals_before_work_are_stored_when_configured;
    #[tokio::test]
    async retryable_failures_roll_back_and_store_nothing;
    #[tokio::test]
    async panicking_handler_rolls_back_and_the_retry_runs_again;
    #[tokio::test]
    async failed_commit_is_503_stores_nothing_and_the_retry_runs;
    #[tokio::test]
    async same_key_in_two_scopes_is_two_keys;
    #[tokio::test]
    async expired_record_is_treated_as_absent;
    #[tokio::test]
    async configured_ttl_sets_expiry_and_raw_key_is_opt_in;
    #[tokio::test]
    async extractor_without_the_layer_is_a_500_that_names_the_layer;
    #[tokio::test]
    async extractor_on_an_uncovered_method_is_a_500;
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async sixty_four_concurrent_requests_with_one_key_execute_once;
    #[tokio::test]
    async custom_rejections_replace_the_problem_document;
    #[tokio::test]
    async ignored_json_fields_do_not_change_the_fingerprint;
    #[tokio::test]
    async deadline_covers_handler_and_commit;
}
