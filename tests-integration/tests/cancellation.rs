//! Disconnects, dropped futures and leaked handles: every path ends all-or-nothing, and no
//! pooled connection is handed out again inside a transaction.

mod common;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum_idempotency::IdempotencyLayer;
use common::*;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tower::ServiceExt;

async fn serve(app: Router) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

fn raw_post(key: &str, body: &str) -> String {
    format!(
        "POST /orders HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\n\
         idempotency-key: {key}\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
}

async fn client_disconnect_mid_handler_still_commits_and_the_retry_replays<D: PgDriver>() {
    let db = TestDb::new(1).await;
    let (knobs, gate) = gated();
    let app = router(Arc::clone(&knobs), IdempotencyLayer::new(D::pool(&db)));
    let addr = serve(app.clone()).await;

    let mut socket = tokio::net::TcpStream::connect(addr).await.unwrap();
    socket
        .write_all(raw_post("gone-1", r#"{"amount": 7}"#).as_bytes())
        .await
        .unwrap();
    knobs.wait_inserted().await;
    drop(socket); // the response is lost
    tokio::time::sleep(Duration::from_millis(100)).await;
    gate.add_permits(1);

    eventually("the detached request to commit", async || {
        db.records().await == 1
    })
    .await;
    assert_eq!(db.orders().await, 1);
    db.assert_settles().await;

    gate.add_permits(1);
    let retry = send(
        &app,
        post_json("/orders", Some("gone-1"), &json!({"amount": 7})),
    )
    .await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert!(
        retry.replayed(),
        "the retry gets the response the client never saw"
    );
    assert_eq!(knobs.calls(), 1);
    db.assert_settles().await;
}

async fn client_disconnect_mid_handler_rolls_back_when_not_detached<D: PgDriver>() {
    let db = TestDb::new(1).await;
    let (knobs, gate) = gated();
    let layer = IdempotencyLayer::new(D::pool(&db)).finish_on_disconnect(false);
    let app = router(Arc::clone(&knobs), layer);
    let addr = serve(app.clone()).await;

    let mut socket = tokio::net::TcpStream::connect(addr).await.unwrap();
    socket
        .write_all(raw_post("gone-2", r#"{"amount": 7}"#).as_bytes())
        .await
        .unwrap();
    knobs.wait_inserted().await;
    drop(socket);

    // The server drops the request future; the transaction rolls back.
    db.assert_settles().await;
    assert_eq!(db.orders().await, 0);
    assert_eq!(db.records().await, 0);

    // The only pooled connection is clean: the retry runs in a fresh transaction.
    gate.add_permits(1);
    let mut socket = tokio::net::TcpStream::connect(addr).await.unwrap();
    socket
        .write_all(raw_post("gone-2", r#"{"amount": 7}"#).as_bytes())
        .await
        .unwrap();
    let mut head = [0; 12];
    socket.read_exact(&mut head).await.unwrap();
    assert_eq!(&head, b"HTTP/1.1 201");
    assert_eq!(knobs.calls(), 2);
    assert_eq!(db.orders().await, 1);
    assert_eq!(db.records().await, 1);
    db.assert_settles().await;
}

/// Backends of this test's pool waiting on a heavyweight lock.
async fn waiting_on_lock(db: &TestDb, query_prefix: &str) -> bool {
    let count: i64 = db
        .admin
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 \
             AND wait_event_type = 'Lock' AND query LIKE $2",
            &[&db.schema, &format!("{query_prefix}%")],
        )
        .await
        .unwrap()
        .get(0);
    count > 0
}

/// Drops the request future at one await point, then checks all-or-nothing, a clean
/// connection and a working retry.
async fn assert_all_or_nothing_after_drop(db: &TestDb, app: &Router, knobs: &Knobs, key: &str) {
    db.assert_settles().await;
    let (orders, records) = (db.orders().await, db.records().await);
    assert!(
        (orders, records) == (0, 0) || (orders, records) == (1, 1),
        "half a request survived: {orders} orders, {records} records"
    );
    let calls = knobs.calls();
    let retry = send(app, post_json("/orders", Some(key), &json!({"amount": 1}))).await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert_eq!(retry.replayed(), records == 1);
    assert_eq!(db.orders().await, 1, "executed exactly once in the end");
    assert_eq!(knobs.calls(), calls + usize::from(records == 0));
    db.assert_settles().await;
}

/// Runs one request so the pool's only connection has its statements prepared, then
/// forgets its rows; later requests block where the test wants, not in a PREPARE.
async fn warm_up(db: &TestDb, app: &Router) {
    let answer = send(app, post_json("/orders", Some("warm-up"), &json!({}))).await;
    assert_eq!(answer.status, StatusCode::CREATED);
    db.admin
        .batch_execute(&format!(
            "DELETE FROM {0}.orders; DELETE FROM {0}.idempotency_records",
            db.schema
        ))
        .await
        .unwrap();
}

fn inline_app<D: PgDriver>(db: &TestDb) -> (Router, Arc<Knobs>, D::Pool) {
    let knobs = Arc::new(Knobs::default());
    let pool = D::pool(db);
    let layer = IdempotencyLayer::new(pool.clone()).finish_on_disconnect(false);
    (router(Arc::clone(&knobs), layer), knobs, pool)
}

async fn dropped_while_buffering_the_request_body<D: PgDriver>() {
    let db = TestDb::new(1).await;
    let (app, knobs, pool) = inline_app::<D>(&db);
    let stream = futures_util::stream::once(async {
        Ok::<_, std::io::Error>(bytes::Bytes::from_static(b"{\"amount\":"))
    });
    let stream = futures_util::StreamExt::chain(stream, futures_util::stream::pending());
    let request = Request::post("/orders")
        .header("content-type", "application/json")
        .header("idempotency-key", "drop-body")
        .body(Body::from_stream(stream))
        .unwrap();
    let task = tokio::spawn(app.clone().oneshot(request));
    tokio::time::sleep(Duration::from_millis(200)).await;
    task.abort();
    assert_eq!(knobs.calls(), 0);
    assert_eq!(D::in_use(&pool), 0, "no connection taken");
    assert_all_or_nothing_after_drop(&db, &app, &knobs, "drop-body").await;
}

async fn dropped_while_waiting_for_a_pooled_connection<D: PgDriver>() {
    let db = TestDb::new(1).await;
    let (app, knobs, pool) = inline_app::<D>(&db);
    let held = D::hold(&pool).await;
    let task = tokio::spawn(app.clone().oneshot(post_json(
        "/orders",
        Some("drop-pool"),
        &json!({"amount": 1}),
    )));
    tokio::time::sleep(Duration::from_millis(200)).await;
    task.abort();
    drop(held);
    assert_eq!(knobs.calls(), 0);
    assert_all_or_nothing_after_drop(&db, &app, &knobs, "drop-pool").await;
}

async fn dropped_during_the_claim_round_trip<D: PgDriver>() {
    let db = TestDb::new(1).await;
    let (app, knobs, _pool) = inline_app::<D>(&db);
    warm_up(&db, &app).await;
    let calls = knobs.calls();
    // Hold the table so the claim's lookup of the record blocks.
    let blocker = connect(&database_url()).await;
    blocker
        .batch_execute(&format!(
            "BEGIN; LOCK TABLE {}.idempotency_records IN ACCESS EXCLUSIVE MODE",
            db.schema
        ))
        .await
        .unwrap();
    let task = tokio::spawn(app.clone().oneshot(post_json(
        "/orders",
        Some("drop-claim"),
        &json!({"amount": 1}),
    )));
    // The claim's first read of the record waits for the table: the lookup outside any
    // transaction (tokio-postgres), or the claim function after BEGIN (sqlx).
    eventually("the claim to block", async || {
        waiting_on_lock(&db, "SELECT").await
    })
    .await;
    task.abort();
    blocker.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(knobs.calls(), calls, "the handler never ran");
    db.assert_settles().await;
    assert_eq!((db.orders().await, db.records().await), (0, 0));
    assert_all_or_nothing_after_drop(&db, &app, &knobs, "drop-claim").await;
}

async fn dropped_inside_the_handler<D: PgDriver>() {
    let db = TestDb::new(1).await;
    let (app, knobs, _pool) = inline_app::<D>(&db);
    let task = tokio::spawn(app.clone().oneshot(post_json(
        "/orders",
        Some("drop-handler"),
        &json!({"amount": 1, "hang": true}),
    )));
    knobs.wait_inserted().await;
    task.abort();
    db.assert_settles().await;
    assert_eq!((db.orders().await, db.records().await), (0, 0));
    // The retry is another payload here (no "hang"), so use a fresh key for it.
    assert_all_or_nothing_after_drop(&db, &app, &knobs, "drop-handler-retry").await;
}

async fn dropped_while_buffering_the_response<D: PgDriver>() {
    let db = TestDb::new(1).await;
    let (app, knobs, _pool) = inline_app::<D>(&db);
    let task = tokio::spawn(app.clone().oneshot(post_json(
        "/orders",
        Some("drop-response"),
        &json!({"amount": 1, "stall_body": true}),
    )));
    knobs.wait_inserted().await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    task.abort();
    db.assert_settles().await;
    assert_eq!((db.orders().await, db.records().await), (0, 0));
    assert_all_or_nothing_after_drop(&db, &app, &knobs, "drop-response-retry").await;
}

async fn dropped_during_insert_and_commit<D: PgDriver>() {
    let db = TestDb::new(1).await;
    let (app, knobs, _pool) = inline_app::<D>(&db);
    warm_up(&db, &app).await;
    // SHARE lets the lookup through but blocks the record's INSERT.
    let blocker = connect(&database_url()).await;
    blocker
        .batch_execute(&format!(
            "BEGIN; LOCK TABLE {}.idempotency_records IN SHARE MODE",
            db.schema
        ))
        .await
        .unwrap();
    let task = tokio::spawn(app.clone().oneshot(post_json(
        "/orders",
        Some("drop-commit"),
        &json!({"amount": 1}),
    )));
    eventually("the insert to block", async || {
        waiting_on_lock(&db, "INSERT INTO idempotency_records").await
    })
    .await;
    task.abort();
    blocker.batch_execute("ROLLBACK").await.unwrap();
    db.assert_settles().await;
    if D::PIPELINED {
        // INSERT and COMMIT were already on the wire: this one commits, and the retry
        // replays.
        assert_eq!((db.orders().await, db.records().await), (1, 1));
    } else {
        // Only the INSERT was sent: the dropped transaction rolls back, and the retry runs.
        assert_eq!((db.orders().await, db.records().await), (0, 0));
    }
    assert_all_or_nothing_after_drop(&db, &app, &knobs, "drop-commit").await;
}

async fn leaked_transaction_handle_fails_closed<D: PgDriver>() {
    let db = TestDb::new(1).await;
    let knobs = Arc::new(Knobs::default());
    let app = router(Arc::clone(&knobs), IdempotencyLayer::new(D::pool(&db)));
    let answer = send(
        &app,
        post_json("/orders", Some("leak-1"), &json!({"leak": true})),
    )
    .await;
    assert_eq!(answer.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(answer.problem_code(), "transaction_leaked");
    db.assert_settles().await;
    assert_eq!((db.orders().await, db.records().await), (0, 0));
    eventually("the leaked task to run its query", async || {
        knobs.leaked_result.lock().await.is_some()
    })
    .await;
    let leaked = knobs.leaked_result.lock().await.clone().unwrap();
    if D::GUARDED {
        assert!(
            leaked.contains("already ended"),
            "leaked handle got: {leaked}"
        );
    } else {
        // An sqlx handle owns the connection until it is dropped: its statements run, in a
        // transaction that never commits.
        assert_eq!(leaked, "ok");
        db.assert_settles().await;
        assert_eq!((db.orders().await, db.records().await), (0, 0));
    }
    // Nothing was stored, so the retry runs (and leaks) again.
    let again = send(
        &app,
        post_json("/orders", Some("leak-1"), &json!({"leak": true})),
    )
    .await;
    assert_eq!(again.problem_code(), "transaction_leaked");
    assert_eq!(knobs.calls(), 2);
}

for_each_driver! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async client_disconnect_mid_handler_still_commits_and_the_retry_replays;
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async client_disconnect_mid_handler_rolls_back_when_not_detached;
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async dropped_while_buffering_the_request_body;
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async dropped_while_waiting_for_a_pooled_connection;
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async dropped_during_the_claim_round_trip;
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async dropped_inside_the_handler;
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async dropped_while_buffering_the_response;
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async dropped_during_insert_and_commit;
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async leaked_transaction_handle_fails_closed;
}
