//! Lease mode (side effects outside the database) and derived keys, on every database.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Extension;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use axum_idempotency::{IdempotencyLayer, IdempotentLease, IdempotentTx, Inbox, OutcomeUnknown};
use common::recorder::{Capture, Recorder};
use common::*;
use serde_json::{Value, json};
use tokio::sync::{Mutex, Semaphore};
use tower::ServiceExt;

/// What the handlers saw, shared with the test.
struct Seen {
    calls: AtomicUsize,
    started: Semaphore,
    /// Call n (from 1) waits for a permit of `gates[n - 1]`, if there is one, before
    /// answering.
    gates: Vec<Arc<Semaphore>>,
    derived: Mutex<Vec<String>>,
}

impl Seen {
    /// With `first_waits`, the first call waits for a permit before answering.
    fn new(first_waits: Option<Arc<Semaphore>>) -> Arc<Self> {
        Self::gated(first_waits.into_iter().collect())
    }

    fn gated(gates: Vec<Arc<Semaphore>>) -> Arc<Self> {
        Arc::new(Self {
            calls: AtomicUsize::new(0),
            started: Semaphore::new(0),
            gates,
            derived: Mutex::new(Vec::new()),
        })
    }

    async fn wait_started(&self) {
        tokio::time::timeout(Duration::from_secs(10), self.started.acquire())
            .await
            .unwrap()
            .unwrap()
            .forget();
    }
}

/// A payment call: the side effect is outside the database.
async fn charge(
    Extension(seen): Extension<Arc<Seen>>,
    lease: IdempotentLease,
    Json(body): Json<Value>,
) -> Response {
    let attempt = seen.calls.fetch_add(1, Ordering::SeqCst) + 1;
    seen.derived.lock().await.push(lease.derive_key("charge"));
    seen.started.add_permits(1);
    if let Some(gate) = seen.gates.get(attempt - 1) {
        gate.acquire().await.unwrap().forget();
    }
    if body["hang"].as_bool() == Some(true) && attempt == 1 {
        std::future::pending::<()>().await;
    }
    if body["panic_first"].as_bool() == Some(true) && attempt == 1 {
        panic!("gateway client bug");
    }
    if body["unknown_first"].as_bool() == Some(true) && attempt == 1 {
        // Sent, and no answer: the effect may have happened.
        return (StatusCode::GATEWAY_TIMEOUT, OutcomeUnknown, "no answer").into_response();
    }
    if let Some(bytes) = body["answer_bytes"].as_u64() {
        let answer = format!("{attempt}:{}", "x".repeat(bytes as usize));
        return (StatusCode::CREATED, answer).into_response();
    }
    let status = match (body["fail_first"].as_u64(), attempt) {
        (Some(code), 1) => StatusCode::from_u16(code as u16).unwrap(),
        _ => StatusCode::CREATED,
    };
    let answer = json!({"attempt": attempt, "token": lease.fencing_token()});
    (status, Json(answer)).into_response()
}

/// An atomic handler that records its derived key and fails the first time.
async fn order<T: TestTx>(
    Extension(seen): Extension<Arc<Seen>>,
    tx: T,
    Json(_): Json<Value>,
) -> StatusCode {
    let attempt = seen.calls.fetch_add(1, Ordering::SeqCst) + 1;
    seen.derived.lock().await.push(tx.derive("coupon"));
    seen.derived.lock().await.push(tx.derive("email"));
    if attempt == 1 {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::CREATED
    }
}

/// A handler that takes both modes' extractors.
async fn both<T: TestTx>(
    Extension(seen): Extension<Arc<Seen>>,
    mut tx: T,
    _lease: IdempotentLease,
) -> StatusCode {
    seen.calls.fetch_add(1, Ordering::SeqCst);
    tx.insert_order(1, 1).await.unwrap();
    StatusCode::CREATED
}

fn app<D: Driver>(
    db: &D::Db,
    seen: &Arc<Seen>,
    layer: impl FnOnce(IdempotencyLayer<D::Store>) -> IdempotencyLayer<D::Store>,
) -> Router {
    Router::new()
        .route("/charges", post(charge))
        .route("/orders", post(order::<IdempotentTx<D::Store>>))
        .route("/both", post(both::<IdempotentTx<D::Store>>))
        .layer(layer(IdempotencyLayer::new(D::pool(db))))
        .layer(Extension(Arc::clone(seen)))
}

/// The only record's (state, retryable, fencing token, status, lease still running).
async fn record(db: &impl TestDatabase) -> (String, bool, i64, i16, bool) {
    db.lease_record().await
}

async fn lease_commits_processing_first_and_success_after<D: Driver>() {
    let db = D::db(2).await;
    let seen = Seen::new(None);
    let app = app::<D>(&db, &seen, |l| l);
    let answer = send(
        &app,
        post_json("/charges", Some("pay-1"), &json!({"amount": 10})),
    )
    .await;
    assert_eq!(answer.status, StatusCode::CREATED);
    assert_eq!(answer.json()["token"], 1);
    assert_eq!(
        record(&db).await,
        ("SUCCESS".to_owned(), false, 1, 201, false)
    );
    let retry = send(
        &app,
        post_json("/charges", Some("pay-1"), &json!({"amount": 10})),
    )
    .await;
    assert!(retry.replayed());
    assert_eq!(retry.body, answer.body);
    let other = send(
        &app,
        post_json("/charges", Some("pay-1"), &json!({"amount": 11})),
    )
    .await;
    assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(seen.calls.load(Ordering::SeqCst), 1);
}

async fn duplicate_during_the_lease_gets_409<D: Driver>() {
    let db = D::db(2).await;
    let gate = Arc::new(Semaphore::new(0));
    let seen = Seen::new(Some(Arc::clone(&gate)));
    let app = app::<D>(&db, &seen, |l| l.lease(Duration::from_secs(30)));
    let first = tokio::spawn({
        let app = app.clone();
        async move { send(&app, post_json("/charges", Some("pay-2"), &json!({}))).await }
    });
    seen.wait_started().await;
    // The claim committed at once: PROCESSING is visible to everyone, with a live lease.
    assert_eq!(
        record(&db).await,
        ("PROCESSING".to_owned(), false, 1, 0, true)
    );

    let duplicate = send(&app, post_json("/charges", Some("pay-2"), &json!({}))).await;
    assert_eq!(duplicate.status, StatusCode::CONFLICT);
    assert_eq!(duplicate.problem_code(), "in_flight");
    let retry_after: u32 = duplicate.headers["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        (25..=30).contains(&retry_after),
        "Retry-After follows the lease: {retry_after}"
    );

    gate.add_permits(1);
    assert_eq!(first.await.unwrap().status, StatusCode::CREATED);
    assert!(
        send(&app, post_json("/charges", Some("pay-2"), &json!({})))
            .await
            .replayed()
    );
    assert_eq!(seen.calls.load(Ordering::SeqCst), 1);
}

async fn a_crashed_holder_is_taken_over_after_its_lease_expires<D: Driver>() {
    let db = D::db(2).await;
    let seen = Seen::new(None);
    let app = app::<D>(&db, &seen, |l| {
        l.lease(Duration::from_secs(1)).finish_on_disconnect(false)
    });
    let crashed = tokio::spawn(app.clone().oneshot(post_json(
        "/charges",
        Some("pay-3"),
        &json!({"hang": true}),
    )));
    seen.wait_started().await;
    crashed.abort(); // the holder dies without finishing
    let early = send(
        &app,
        post_json("/charges", Some("pay-3"), &json!({"hang": true})),
    )
    .await;
    assert_eq!(early.status, StatusCode::CONFLICT, "the lease still holds");

    tokio::time::sleep(Duration::from_millis(1100)).await;
    let retry = send(
        &app,
        post_json("/charges", Some("pay-3"), &json!({"hang": true})),
    )
    .await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert_eq!(retry.json()["attempt"], 2);
    // Every claim draws from the sequence, the refused one in between too.
    let token = retry.json()["token"].as_i64().unwrap();
    assert!(
        token > 1,
        "the takeover's token {token} is above the first holder's 1"
    );
    assert_eq!(
        record(&db).await,
        ("SUCCESS".to_owned(), false, token, 201, false)
    );
    let derived = seen.derived.lock().await.clone();
    assert_eq!(derived.len(), 2);
    assert_eq!(
        derived[0], derived[1],
        "the downstream key is the same on the takeover"
    );
    assert!(
        send(
            &app,
            post_json("/charges", Some("pay-3"), &json!({"hang": true}))
        )
        .await
        .replayed()
    );
}

async fn a_slow_holder_cannot_overwrite_the_newer_result<D: Driver>() {
    let db = D::db(4).await;
    let gate = Arc::new(Semaphore::new(0));
    let seen = Seen::new(Some(Arc::clone(&gate)));
    let app = app::<D>(&db, &seen, |l| l.lease(Duration::from_secs(1)));
    let slow = tokio::spawn({
        let app = app.clone();
        async move { send(&app, post_json("/charges", Some("pay-4"), &json!({}))).await }
    });
    seen.wait_started().await;
    tokio::time::sleep(Duration::from_millis(1100)).await;

    let takeover = send(&app, post_json("/charges", Some("pay-4"), &json!({}))).await;
    assert_eq!(takeover.status, StatusCode::CREATED);
    assert_eq!(takeover.json(), json!({"attempt": 2, "token": 2}));

    gate.add_permits(1);
    let slow = slow.await.unwrap();
    assert_eq!(slow.status, StatusCode::CONFLICT);
    assert_eq!(slow.problem_code(), "lease_lost");
    let stored = send(&app, post_json("/charges", Some("pay-4"), &json!({}))).await;
    assert!(stored.replayed());
    assert_eq!(stored.body, takeover.body, "the newer result stands");
    assert_eq!(
        record(&db).await,
        ("SUCCESS".to_owned(), false, 2, 201, false)
    );
}

/// A PROCESSING record can disappear while its holder still runs: the sweeper purges a
/// record long past its expiry whatever its state. The next holder's token comes from a
/// sequence, never the old holder's again, so the old holder's completion cannot land on
/// the new lease.
async fn a_holder_whose_record_was_purged_cannot_complete_the_next_lease<D: Driver>() {
    let db = D::db(4).await;
    let (old_gate, new_gate) = (Arc::new(Semaphore::new(0)), Arc::new(Semaphore::new(0)));
    let seen = Seen::gated(vec![Arc::clone(&old_gate), Arc::clone(&new_gate)]);
    let app = app::<D>(&db, &seen, |l| l);
    let request = || post_json("/charges", Some("pay-9"), &json!({}));
    let old = tokio::spawn({
        let app = app.clone();
        async move { send(&app, request()).await }
    });
    seen.wait_started().await;
    let (_, _, old_token, _, _) = record(&db).await;
    db.execute("DELETE FROM idempotency_records").await;
    let new = tokio::spawn({
        let app = app.clone();
        async move { send(&app, request()).await }
    });
    seen.wait_started().await;
    let (state, _, new_token, _, _) = record(&db).await;
    assert_eq!(state, "PROCESSING");
    assert!(new_token > old_token, "{new_token} after {old_token}");

    old_gate.add_permits(1);
    let old = old.await.unwrap();
    assert_eq!(old.status, StatusCode::CONFLICT);
    assert_eq!(old.problem_code(), "lease_lost");
    new_gate.add_permits(1);
    let new = new.await.unwrap();
    assert_eq!(new.status, StatusCode::CREATED);
    assert_eq!(new.json(), json!({"attempt": 2, "token": new_token}));
    let stored = send(&app, request()).await;
    assert!(stored.replayed());
    assert_eq!(stored.body, new.body, "the new holder's result stands");
}

async fn final_failures_replay_and_retryable_failures_run_again<D: Driver>() {
    let db = D::db(2).await;
    let seen = Seen::new(None);
    let app = app::<D>(&db, &seen, |l| l);
    // A deterministic 422: FAILED, not retryable, replayed.
    let rejected = send(
        &app,
        post_json("/charges", Some("pay-5"), &json!({"fail_first": 422})),
    )
    .await;
    assert_eq!(rejected.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        record(&db).await,
        ("FAILED".to_owned(), false, 1, 422, false)
    );
    let again = send(
        &app,
        post_json("/charges", Some("pay-5"), &json!({"fail_first": 422})),
    )
    .await;
    assert!(again.replayed());
    assert_eq!(again.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(seen.calls.load(Ordering::SeqCst), 1);
}

async fn retryable_failures_and_panics_let_the_retry_take_over<D: Driver>() {
    for (key, body) in [
        ("pay-6", json!({"fail_first": 503})),
        ("pay-7", json!({"panic_first": true})),
    ] {
        let db = D::db(2).await;
        let seen = Seen::new(None);
        let app = app::<D>(&db, &seen, |l| l);
        let failed = send(&app, post_json("/charges", Some(key), &body)).await;
        assert!(failed.status.is_server_error(), "{key}: {}", failed.status);
        assert_eq!(
            record(&db).await,
            (
                "FAILED".to_owned(),
                true,
                1,
                failed.status.as_u16() as i16,
                false
            )
        );
        let retry = send(&app, post_json("/charges", Some(key), &body)).await;
        assert_eq!(retry.status, StatusCode::CREATED, "{key}");
        assert!(!retry.replayed());
        assert_eq!(retry.json()["token"], 2);
        assert_eq!(seen.calls.load(Ordering::SeqCst), 2);
    }
}

async fn derived_keys_are_stable_per_operation_and_distinct_per_label<D: Driver>() {
    let db = D::db(2).await;
    let seen = Seen::new(None);
    let app = app::<D>(&db, &seen, |l| l);
    // The first attempt fails (503, rolled back); the retry runs again.
    assert_eq!(
        send(&app, post_json("/orders", Some("op-1"), &json!({})))
            .await
            .status,
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(
        send(&app, post_json("/orders", Some("op-1"), &json!({})))
            .await
            .status,
        StatusCode::CREATED
    );
    assert_eq!(
        send(&app, post_json("/orders", Some("op-2"), &json!({})))
            .await
            .status,
        StatusCode::CREATED
    );
    let derived = seen.derived.lock().await.clone();
    let [coupon1, email1, coupon1_retry, email1_retry, coupon2, _] = derived.as_slice() else {
        panic!("unexpected {derived:?}");
    };
    assert_eq!(
        coupon1, coupon1_retry,
        "same operation, same key on every retry"
    );
    assert_eq!(email1, email1_retry);
    assert_ne!(coupon1, email1, "labels give different keys");
    assert_ne!(coupon1, coupon2, "operations give different keys");
    assert_eq!(coupon1.len(), 32);
    axum_idempotency::IdempotencyKey::parse(coupon1.as_bytes())
        .expect("usable as an Idempotency-Key");

    // The inbox derives from (consumer group, message id), the same on every redelivery.
    let inbox = Inbox::new(D::pool(&db), "coupons");
    let seen_keys = Arc::new(Mutex::new(Vec::new()));
    for attempt in 0..2 {
        let seen_keys = Arc::clone(&seen_keys);
        let _ = inbox
            .process("msg-1", |tx| async move {
                seen_keys.lock().await.push(tx.derive("coupon"));
                if attempt == 0 {
                    Err("first attempt fails")
                } else {
                    Ok(())
                }
            })
            .await;
    }
    let keys = seen_keys.lock().await.clone();
    assert_eq!(keys.len(), 2);
    assert_eq!(keys[0], keys[1]);
    assert_ne!(keys[0], *coupon1);
}

/// Takeovers are counted by what the claim did, not by the token's value: tokens come
/// from a sequence, so a first lease's token may well be above 1.
fn only_a_takeover_counts_as_one<D: Driver>() {
    let capture = Arc::new(Capture::default());
    let recorder = Recorder(Arc::clone(&capture));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let takeovers = || {
        capture
            .values()
            .get("idempotency_lease_takeovers_total{}")
            .copied()
            .unwrap_or(0.0)
    };
    metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            let db = D::db(2).await;
            let seen = Seen::new(None);
            let app = app::<D>(&db, &seen, |l| l);
            let body = json!({"fail_first": 503});
            let failed = send(&app, post_json("/charges", Some("pay-10"), &body)).await;
            assert_eq!(failed.status, StatusCode::SERVICE_UNAVAILABLE);
            assert_eq!(takeovers(), 0.0, "a first lease is no takeover");
            let retry = send(&app, post_json("/charges", Some("pay-10"), &body)).await;
            assert_eq!(retry.status, StatusCode::CREATED);
            assert_eq!(takeovers(), 1.0, "the retry took the failed lease over");

            // A first lease whose token is well above 1.
            db.next_fencing_token(42).await;
            let fresh = send(&app, post_json("/charges", Some("pay-11"), &json!({}))).await;
            assert_eq!(fresh.status, StatusCode::CREATED);
            assert_eq!(fresh.json()["token"], 42);
            assert_eq!(
                takeovers(),
                1.0,
                "a first lease is no takeover, whatever its token"
            );
        })
    });
}

/// A handler that takes `IdempotentTx` and `IdempotentLease` is refused with its own code
/// and message, runs nothing and leaves nothing behind.
async fn a_handler_with_both_extractors_is_refused_with_its_own_code<D: Driver>() {
    let db = D::db(2).await;
    let seen = Seen::new(None);
    let app = app::<D>(&db, &seen, |layer| layer);
    let answer = send(&app, post_json("/both", Some("both-1"), &json!({}))).await;
    assert_eq!(answer.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(answer.problem_code(), "conflicting_extractors");
    let detail = answer.json()["detail"].as_str().unwrap().to_owned();
    assert!(
        detail.contains("IdempotentTx") && detail.contains("IdempotentLease"),
        "{detail}"
    );
    assert_eq!(
        seen.calls.load(Ordering::SeqCst),
        0,
        "the handler did not run"
    );
    assert_eq!((db.orders().await, db.records().await), (0, 0));
    db.assert_settles().await;
}

/// A holder that cannot tell whether its effect happened (`OutcomeUnknown`) stores nothing
/// and keeps the key until its lease runs out: a repeat meanwhile is 409 with the seconds
/// left, the first repeat after it runs again with a higher fencing token.
async fn an_unknown_outcome_holds_the_key_until_the_lease_runs_out<D: Driver>() {
    let db = D::db(2).await;
    let seen = Seen::new(None);
    let app = app::<D>(&db, &seen, |l| l.lease(Duration::from_secs(2)));
    let request = || {
        post_json(
            "/charges",
            Some("pay-unknown"),
            &json!({"unknown_first": true}),
        )
    };
    let first = send(&app, request()).await;
    assert_eq!(first.status, StatusCode::GATEWAY_TIMEOUT);
    assert!(!first.replayed());
    let (state, _, token, _, live) = record(&db).await;
    assert_eq!((state.as_str(), token, live), ("PROCESSING", 1, true));

    let during = send(&app, request()).await;
    assert_eq!(during.status, StatusCode::CONFLICT);
    assert_eq!(during.problem_code(), "in_flight");
    let retry_after: u32 = during.headers["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        (1..=2).contains(&retry_after),
        "the seconds left: {retry_after}"
    );
    assert_eq!(seen.calls.load(Ordering::SeqCst), 1, "not run while held");

    tokio::time::sleep(Duration::from_millis(2200)).await;
    let after = send(&app, request()).await;
    assert_eq!(after.status, StatusCode::CREATED);
    let token_after = after.json()["token"].as_i64().unwrap();
    assert!(
        token_after > token,
        "a higher fencing token: {token_after} after {token}"
    );
    assert_eq!(seen.calls.load(Ordering::SeqCst), 2);
    assert!(send(&app, request()).await.replayed());
    assert_eq!(seen.calls.load(Ordering::SeqCst), 2);
}

/// With `wait_for_in_flight`, a twin waits for the holder and replays its answer; the
/// handler runs once.
async fn a_twin_waits_for_the_holder_and_replays<D: Driver>() {
    let db = D::db(2).await;
    let gate = Arc::new(Semaphore::new(0));
    let seen = Seen::new(Some(Arc::clone(&gate)));
    let app = app::<D>(&db, &seen, |l| {
        l.wait_for_in_flight(Duration::from_secs(10))
    });
    let request = || post_json("/charges", Some("pay-wait"), &json!({}));
    let first = tokio::spawn({
        let app = app.clone();
        async move { send(&app, request()).await }
    });
    seen.wait_started().await;
    let twin = tokio::spawn({
        let app = app.clone();
        async move { send(&app, request()).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    gate.add_permits(1);
    let (first, twin) = (first.await.unwrap(), twin.await.unwrap());
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(twin.status, StatusCode::CREATED);
    assert!(twin.replayed());
    assert_eq!(twin.body, first.body);
    assert_eq!(seen.calls.load(Ordering::SeqCst), 1);
}

/// An answer larger than `response_limit` goes out whole and is kept without its body: a
/// repeat gets the status, an empty body and `Idempotent-Body-Omitted`, and never runs again.
async fn an_answer_over_the_limit_is_kept_without_its_body<D: Driver>() {
    let db = D::db(2).await;
    let seen = Seen::new(None);
    let app = app::<D>(&db, &seen, |l| l.response_limit(1000));
    let request = || post_json("/charges", Some("pay-big"), &json!({"answer_bytes": 5000}));
    let first = send(&app, request()).await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(first.body.len(), 5002, "answered whole");
    assert!(!first.headers.contains_key("idempotent-body-omitted"));
    for _ in 0..2 {
        let repeat = send(&app, request()).await;
        assert_eq!(repeat.status, StatusCode::CREATED);
        assert!(repeat.replayed());
        assert_eq!(repeat.headers["idempotent-body-omitted"], "true");
        assert!(repeat.body.is_empty(), "{:?}", repeat.body);
        assert_eq!(
            repeat.headers["content-type"], first.headers["content-type"],
            "kept headers are replayed"
        );
    }
    assert_eq!(seen.calls.load(Ordering::SeqCst), 1, "never run again");
    let (state, ..) = record(&db).await;
    assert_eq!(state, "SUCCESS");
}

for_each_database! {
    #[tokio::test]
    async a_handler_with_both_extractors_is_refused_with_its_own_code;
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async an_unknown_outcome_holds_the_key_until_the_lease_runs_out;
    #[tokio::test]
    async an_answer_over_the_limit_is_kept_without_its_body;
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async a_twin_waits_for_the_holder_and_replays;
    #[tokio::test]
    async lease_commits_processing_first_and_success_after;
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async duplicate_during_the_lease_gets_409;
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async a_crashed_holder_is_taken_over_after_its_lease_expires;
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async a_slow_holder_cannot_overwrite_the_newer_result;
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async a_holder_whose_record_was_purged_cannot_complete_the_next_lease;
    #[tokio::test]
    async final_failures_replay_and_retryable_failures_run_again;
    #[tokio::test]
    async retryable_failures_and_panics_let_the_retry_take_over;
    #[tokio::test]
    async derived_keys_are_stable_per_operation_and_distinct_per_label;
    #[test]
    sync only_a_takeover_counts_as_one;
}
