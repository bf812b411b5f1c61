//! Hostile input against the layer and real PostgreSQL: oversized and malformed requests,
//! slow bodies, a hot key, scope isolation, and what the stored headers may contain.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderValue, Request, StatusCode, header};
use axum::routing::post;
use axum::{Json, Router};
use axum_idempotency::IdempotencyLayer;
use axum_idempotency::postgres::IdempotentTx;
use axum_idempotency::postgres::PgStore;
use common::*;
use serde_json::{Value, json};
use tokio::sync::Semaphore;

fn app(layer: IdempotencyLayer<PgStore>) -> (Router, Arc<Knobs>) {
    let knobs = Arc::new(Knobs::default());
    (router(Arc::clone(&knobs), layer), knobs)
}

fn with_user(mut request: Request<Body>, user: Option<&str>) -> Request<Body> {
    if let Some(user) = user {
        request
            .headers_mut()
            .insert("x-user-id", HeaderValue::from_str(user).unwrap());
    }
    request
}

/// A body that yields one byte every `every`, forever.
fn trickle(every: Duration) -> Body {
    let stream = futures_util::stream::unfold((), move |()| async move {
        tokio::time::sleep(every).await;
        Some((Ok::<_, std::io::Error>(bytes::Bytes::from_static(b" ")), ()))
    });
    Body::from_stream(stream)
}

#[tokio::test]
async fn oversized_keys_are_400_problem_documents() {
    if !common::Database::Postgres.configured() {
        return;
    }
    let db = TestDb::new(2).await;
    let (app, knobs) = app(IdempotencyLayer::new(db.pool.clone()));
    let long = "k".repeat(300);
    let escaped = "\\\\".repeat(200);
    let huge = "k".repeat(16 * 1024);
    for raw in [
        long.clone(),
        format!("\"{long}\""),
        // 200 escaped backslashes: 402 bytes on the wire, 200 characters: accepted.
        format!("\"{escaped}{long}\""),
        huge.clone(),
        format!("\"{huge}\""),
    ] {
        let request = Request::post("/orders")
            .header("content-type", "application/json")
            .header("idempotency-key", HeaderValue::from_str(&raw).unwrap())
            .body(Body::from(r#"{"amount": 1}"#))
            .unwrap();
        let answer = send(&app, request).await;
        assert_eq!(
            answer.status,
            StatusCode::BAD_REQUEST,
            "{} bytes",
            raw.len()
        );
        assert_eq!(answer.problem_code(), "invalid_key");
    }
    // 255 characters, some escaped, is the longest key that is accepted.
    let longest = format!("\"{}{}\"", "\\\\".repeat(100), "k".repeat(155));
    let request = Request::post("/orders")
        .header("content-type", "application/json")
        .header("idempotency-key", HeaderValue::from_str(&longest).unwrap())
        .body(Body::from(r#"{"amount": 1}"#))
        .unwrap();
    assert_eq!(send(&app, request).await.status, StatusCode::CREATED);
    assert_eq!(knobs.calls(), 1);
    assert_eq!(db.orders().await, 1);
    db.assert_settles().await;
}

#[tokio::test]
async fn oversized_bodies_are_413_never_5xx() {
    if !common::Database::Postgres.configured() {
        return;
    }
    let db = TestDb::new(2).await;
    let (app, knobs) = app(IdempotencyLayer::new(db.pool.clone()).body_limit(1024));
    let big = format!(r#"{{"amount": 1, "pad": "{}"}}"#, "x".repeat(4096));
    let requests = [
        // Declared and true length over the limit.
        Request::post("/orders")
            .header("content-type", "application/json")
            .header("idempotency-key", "big-declared")
            .body(Body::from(big.clone()))
            .unwrap(),
        // An absurd declared length, with a tiny body.
        Request::post("/orders")
            .header("content-type", "application/json")
            .header("content-length", u64::MAX.to_string())
            .header("idempotency-key", "big-absurd")
            .body(Body::from(r#"{"amount": 1}"#))
            .unwrap(),
        // A declared length that lies: small on the label, large in the stream.
        Request::post("/orders")
            .header("content-type", "application/json")
            .header("content-length", "10")
            .header("idempotency-key", "big-lying")
            .body(Body::from_stream(futures_util::stream::iter(
                big.as_bytes()
                    .chunks(64)
                    .map(|c| Ok::<_, std::io::Error>(bytes::Bytes::copy_from_slice(c)))
                    .collect::<Vec<_>>(),
            )))
            .unwrap(),
        // An endless stream.
        Request::post("/orders")
            .header("content-type", "application/json")
            .header("idempotency-key", "big-endless")
            .body(Body::from_stream(futures_util::stream::repeat_with(|| {
                Ok::<_, std::io::Error>(bytes::Bytes::from_static(&[b' '; 512]))
            })))
            .unwrap(),
    ];
    for request in requests {
        let key = request.headers()["idempotency-key"].clone();
        let answer = send(&app, request).await;
        assert_eq!(answer.status, StatusCode::PAYLOAD_TOO_LARGE, "{key:?}");
        assert_eq!(answer.problem_code(), "payload_too_large", "{key:?}");
    }
    assert_eq!(knobs.calls(), 0);
    assert_eq!(db.orders().await, 0);
    assert_eq!(db.records().await, 0);
    db.assert_settles().await;
}

#[tokio::test]
async fn hostile_json_bodies_are_4xx_or_stable_never_5xx() {
    if !common::Database::Postgres.configured() {
        return;
    }
    let db = TestDb::new(2).await;
    let (app, knobs) = app(IdempotencyLayer::new(db.pool.clone()));
    let digits = format!("1{}", "0".repeat(399));
    let bodies: Vec<Vec<u8>> = vec![
        "[".repeat(100_000).into_bytes(),
        "{\"a\":".repeat(50_000).into_bytes(),
        format!("{}{}", "[".repeat(200), "]".repeat(200)).into_bytes(),
        br#"{"amount": 1e999999}"#.to_vec(),
        format!(r#"{{"amount": {digits}}}"#).into_bytes(),
        br#"{"amount": 1, "amount": 2}"#.to_vec(),
        b"{\"amount\": 1, \"note\": \"\xff\xfe\"}".to_vec(),
        b"\xff\xfe\xfd".to_vec(),
    ];
    for (i, body) in bodies.into_iter().enumerate() {
        let key = format!("hostile-{i}");
        let request = || {
            Request::post("/orders")
                .header("content-type", "application/json")
                .header("idempotency-key", key.as_str())
                .body(Body::from(body.clone()))
                .unwrap()
        };
        let first = send(&app, request()).await;
        assert!(
            first.status.is_client_error() || first.status.is_success(),
            "body {i}: {} {:?}",
            first.status,
            first.body
        );
        // The retry gets the same answer: a stable fingerprint, never 422 or 5xx.
        let retry = send(&app, request()).await;
        assert_eq!(retry.status, first.status, "body {i}");
        assert_eq!(retry.body, first.body, "body {i}");
    }
    // Only the duplicate-key document is valid input for the handler.
    assert_eq!(knobs.calls(), 1);
    assert_eq!(db.orders().await, 1);
    db.assert_settles().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slow_body_is_cut_by_body_timeout_and_holds_no_connection() {
    if !common::Database::Postgres.configured() {
        return;
    }
    let db = TestDb::new(1).await;
    let timeout = Duration::from_millis(600);
    let (app, knobs) = app(IdempotencyLayer::new(db.pool.clone()).body_timeout(timeout));
    // Open the pool's only connection first, so the check below measures holding, not
    // connecting.
    let warm = send(
        &app,
        post_json("/orders", Some("warm"), &json!({"amount": 1})),
    )
    .await;
    assert_eq!(warm.status, StatusCode::CREATED);

    let started = Instant::now();
    let slow = tokio::spawn({
        let app = app.clone();
        async move {
            let request = Request::post("/orders")
                .header("content-type", "application/json")
                .header("idempotency-key", "slow-1")
                .body(trickle(Duration::from_millis(200)))
                .unwrap();
            send(&app, request).await
        }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        db.pool.status().available,
        1,
        "the trickling request holds no pooled connection"
    );
    let other = send(
        &app,
        post_json("/orders", Some("fast-1"), &json!({"amount": 2})),
    )
    .await;
    assert_eq!(other.status, StatusCode::CREATED);
    assert!(
        !slow.is_finished(),
        "the other key was served while the body was still trickling"
    );

    let slow = slow.await.unwrap();
    let elapsed = started.elapsed();
    assert_eq!(slow.status, StatusCode::REQUEST_TIMEOUT);
    assert_eq!(slow.problem_code(), "body_timeout");
    assert!(
        elapsed >= timeout && elapsed < timeout + Duration::from_secs(2),
        "cut after {elapsed:?}"
    );
    assert_eq!(knobs.calls(), 2);
    assert_eq!(db.records().await, 2);
    db.assert_settles().await;
}

/// A handler for the hot-key test: only requests that ask for it wait at the gate.
struct Hot {
    calls: AtomicUsize,
    inserted: Semaphore,
    gate: Semaphore,
}

async fn hot_order(
    State(hot): State<Arc<Hot>>,
    tx: IdempotentTx,
    Json(body): Json<Value>,
) -> (StatusCode, Json<Value>) {
    let user = body["user_id"].as_i64().unwrap_or(1);
    // An in-flight duplicate's first statement is refused (the key's lock leaves with it):
    // `calls` counts the handlers that got past it.
    let row = tx
        .query_one(
            "INSERT INTO orders (user_id, amount) VALUES ($1, 1) RETURNING id",
            &[&user],
        )
        .await
        .expect("insert order");
    hot.calls.fetch_add(1, Ordering::SeqCst);
    let id: i64 = row.get(0);
    if body["gated"].as_bool() == Some(true) {
        hot.inserted.add_permits(1);
        hot.gate.acquire().await.unwrap().forget();
    }
    (
        StatusCode::CREATED,
        Json(json!({ "id": id, "user_id": user })),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn hot_key_burst_leaves_the_pool_serving_other_keys() {
    if !common::Database::Postgres.configured() {
        return;
    }
    const BURST: usize = 500;
    let started = Instant::now();
    let db = TestDb::new(4).await;
    let hot = Arc::new(Hot {
        calls: AtomicUsize::new(0),
        inserted: Semaphore::new(0),
        gate: Semaphore::new(0),
    });
    let app = Router::new()
        .route("/orders", post(hot_order))
        .layer(IdempotencyLayer::new(db.pool.clone()))
        .with_state(Arc::clone(&hot));
    let body = json!({"user_id": 1, "gated": true});

    // The first request takes the key and holds it (and one connection) at the gate.
    let first = tokio::spawn({
        let (app, body) = (app.clone(), body.clone());
        async move { send(&app, post_json("/orders", Some("hot-1"), &body)).await }
    });
    tokio::time::timeout(Duration::from_secs(10), hot.inserted.acquire())
        .await
        .expect("the first request did not take the key")
        .unwrap()
        .forget();

    let start = Arc::new(tokio::sync::Barrier::new(BURST + 1));
    let burst: Vec<_> = (0..BURST)
        .map(|_| {
            let (app, body, start) = (app.clone(), body.clone(), Arc::clone(&start));
            tokio::spawn(async move {
                start.wait().await;
                send(&app, post_json("/orders", Some("hot-1"), &body)).await
            })
        })
        .collect();
    start.wait().await;

    // Another key, sent into the burst, is served while the hot key is still held.
    let other = tokio::time::timeout(
        Duration::from_secs(10),
        send(
            &app,
            post_json("/orders", Some("cold-1"), &json!({"user_id": 2})),
        ),
    )
    .await
    .expect("another key was not served during the burst");
    assert_eq!(other.status, StatusCode::CREATED);
    assert!(!other.replayed());
    assert!(!first.is_finished(), "the hot key was held throughout");

    hot.gate.add_permits(1);
    let first = first.await.unwrap();
    assert_eq!(first.status, StatusCode::CREATED);
    let (mut conflicts, mut replays) = (0, 0);
    for task in burst {
        let answer = task.await.unwrap();
        match answer.status {
            StatusCode::CONFLICT => {
                assert_eq!(answer.problem_code(), "in_flight");
                conflicts += 1;
            }
            StatusCode::CREATED if answer.replayed() => {
                assert_eq!(answer.body, first.body);
                replays += 1;
            }
            other => panic!("unexpected {other}: {:?}", answer.body),
        }
    }
    assert_eq!(conflicts + replays, BURST);
    assert_eq!(
        hot.calls.load(Ordering::SeqCst),
        2,
        "hot key once, cold key once"
    );
    assert_eq!(
        db.scalar("SELECT count(*) FROM orders WHERE user_id = 1")
            .await,
        1
    );
    assert_eq!(db.records().await, 2);
    db.assert_settles().await;
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "took {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_key_never_replays_across_scopes() {
    if !common::Database::Postgres.configured() {
        return;
    }
    for cached in [false, true] {
        let db = TestDb::new(2).await;
        let mut layer = scoped(IdempotencyLayer::new(db.pool.clone()));
        if cached {
            layer = layer.cache_responses(1024 * 1024);
        }
        let (app, knobs) = app(layer);
        let body = json!({"amount": 7});
        let request =
            |user: Option<&str>| with_user(post_json("/orders", Some("same-key"), &body), user);
        // Unscoped (the scope function says None), then two principals: three key spaces.
        let unscoped = send(&app, request(None)).await;
        let alice = send(&app, request(Some("alice"))).await;
        let bob = send(&app, request(Some("bob"))).await;
        for answer in [&unscoped, &alice, &bob] {
            assert_eq!(answer.status, StatusCode::CREATED, "cached={cached}");
            assert!(
                !answer.replayed(),
                "cached={cached}: another scope's answer"
            );
        }
        assert_ne!(unscoped.body, alice.body);
        assert_ne!(alice.body, bob.body);
        assert_ne!(unscoped.body, bob.body);
        // Each retry replays its own scope's answer, whatever was sent in between.
        for _ in 0..2 {
            for (user, original) in [
                (None, &unscoped),
                (Some("alice"), &alice),
                (Some("bob"), &bob),
            ] {
                let retry = send(&app, request(user)).await;
                assert!(retry.replayed(), "cached={cached} {user:?}");
                assert_eq!(retry.body, original.body, "cached={cached} {user:?}");
            }
        }
        assert_eq!(knobs.calls(), 3, "cached={cached}");
        assert_eq!(db.records().await, 3, "cached={cached}");
        let scopes: Vec<String> = db
            .admin
            .query(
                &format!(
                    "SELECT scope FROM {}.idempotency_records ORDER BY scope",
                    db.schema
                ),
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|row| row.get(0))
            .collect();
        assert_eq!(scopes, ["", "alice", "bob"], "cached={cached}");
        db.assert_settles().await;
    }
}

#[tokio::test]
async fn stored_headers_come_only_from_the_allowlist() {
    if !common::Database::Postgres.configured() {
        return;
    }
    let db = TestDb::new(2).await;
    let layer = IdempotencyLayer::new(db.pool.clone())
        .keep_header(header::SET_COOKIE)
        .keep_header(header::CACHE_CONTROL);
    let (app, _knobs) = app(layer);
    let body = json!({"amount": 3});
    let first = send(&app, post_json("/orders", Some("cookie-1"), &body)).await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(first.headers["set-cookie"], "session=secret");
    assert_eq!(first.headers["x-not-kept"], "volatile");

    let raw: Vec<u8> = db
        .admin
        .query_one(
            &format!("SELECT headers FROM {}.idempotency_records", db.schema),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let contains = |needle: &[u8]| raw.windows(needle.len()).any(|w| w == needle);
    for secret in [
        &b"session=secret"[..],
        b"set-cookie",
        b"x-not-kept",
        b"volatile",
    ] {
        assert!(
            !contains(secret),
            "{:?} is in the stored headers",
            String::from_utf8_lossy(secret)
        );
    }
    assert!(contains(b"location"), "Location is always kept");

    let retry = send(&app, post_json("/orders", Some("cookie-1"), &body)).await;
    assert!(retry.replayed());
    assert_eq!(retry.headers["location"], first.headers["location"]);
    assert!(retry.headers.get("set-cookie").is_none());
    assert!(retry.headers.get("x-not-kept").is_none());
    db.assert_settles().await;
}
