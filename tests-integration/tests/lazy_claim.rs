//! The race windows of a claim that defers `BEGIN` and the key's lock to the handler's
//! first statement (tokio-postgres): each one driven deterministically, on every driver.
//! A driver that claims before the handler runs (sqlx) meets the same requests with the
//! answers of its own order of events, asserted beside them.

mod common;

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum_idempotency::{IdempotencyLayer, IdempotentTx};
use common::*;
use serde_json::json;
use sha2::{Digest, Sha256};
use tokio::sync::Semaphore;

/// Takes, on the test's admin session, the advisory lock the layer takes for `key`
/// (unscoped): the record id's first 8 bytes, with the records table's oid mixed into the
/// high half. Returns the lock key, for the unlock.
async fn hold_key(db: &TestDb, key: &str) -> i64 {
    let mut hasher = Sha256::new();
    hasher.update(b"axum-idempotency/v1\0");
    hasher.update(0_u64.to_be_bytes());
    hasher.update(key.as_bytes());
    let digest = hasher.finalize();
    let raw = i64::from_be_bytes(digest[..8].try_into().unwrap());
    let table = format!("{}.idempotency_records", db.schema);
    let lock: i64 = db
        .admin
        .query_one(
            "SELECT $1 # ($2::text::regclass::oid::int8 << 32)",
            &[&raw, &table],
        )
        .await
        .unwrap()
        .get(0);
    db.admin
        .query_one("SELECT pg_advisory_lock($1)", &[&lock])
        .await
        .unwrap();
    lock
}

async fn release_key(db: &TestDb, lock: i64) {
    db.admin
        .query_one("SELECT pg_advisory_unlock($1)", &[&lock])
        .await
        .unwrap();
}

/// The gate a waiting handler stops at, and the permits it leaves on arrival.
#[derive(Clone)]
struct Gate {
    open: Arc<Semaphore>,
    arrived: Arc<Semaphore>,
}

/// A handler that runs no statement: it answers `202` (or `404`, with `x-missing`), after
/// waiting at the gate when `x-wait` is set.
async fn no_statement<S: TestStore>(
    State(gate): State<Gate>,
    headers: HeaderMap,
    tx: IdempotentTx<S>,
) -> (StatusCode, String) {
    drop(tx);
    if headers.contains_key("x-wait") {
        gate.arrived.add_permits(1);
        gate.open.acquire().await.unwrap().forget();
    }
    if headers.contains_key("x-missing") {
        return (StatusCode::NOT_FOUND, "no such order".to_owned());
    }
    (StatusCode::ACCEPTED, "accepted".to_owned())
}

fn no_statement_app<D: PgDriver>(db: &TestDb) -> (Router, Gate) {
    no_statement_app_with::<D>(db, |layer| layer)
}

fn no_statement_app_with<D: PgDriver>(
    db: &TestDb,
    layer: impl FnOnce(IdempotencyLayer<D::Store>) -> IdempotencyLayer<D::Store>,
) -> (Router, Gate) {
    let gate = Gate {
        open: Arc::new(Semaphore::new(0)),
        arrived: Arc::new(Semaphore::new(0)),
    };
    let app = Router::new()
        .route("/noop", post(no_statement::<D::Store>))
        .layer(layer(IdempotencyLayer::new(D::pool(db))))
        .with_state(gate.clone());
    (app, gate)
}

fn noop(key: &str) -> axum::http::Request<axum::body::Body> {
    post_json("/noop", Some(key), &json!({}))
}

/// The key is held by another session when the handler's first statement leaves: that
/// statement's result is withheld, the request is answered 409 `in_flight`, and what the
/// statement wrote rolls back. Once the key is free, the retry runs.
async fn a_first_statement_that_meets_a_held_key_is_answered_409<D: PgDriver>() {
    let db = TestDb::new(4).await;
    let knobs = Arc::new(Knobs::default());
    let app = router(Arc::clone(&knobs), IdempotencyLayer::new(D::pool(&db)));
    let key = hold_key(&db, "held-1").await;
    let answer = send(
        &app,
        post_json("/orders", Some("held-1"), &json!({"amount": 5})),
    )
    .await;
    assert_eq!(answer.status, StatusCode::CONFLICT, "{:?}", answer.body);
    assert_eq!(answer.problem_code(), "in_flight");
    assert!(answer.headers.contains_key("retry-after"));
    assert_eq!(
        knobs.calls(),
        0,
        "the handler never got past its first statement"
    );
    assert_eq!((db.orders().await, db.records().await), (0, 0));
    release_key(&db, key).await;
    let retry = send(
        &app,
        post_json("/orders", Some("held-1"), &json!({"amount": 5})),
    )
    .await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert_eq!((db.orders().await, db.records().await), (1, 1));
    db.assert_settles().await;
}

/// The handler's own unique constraint is hit by the first statement because a twin
/// committed between this request's look-up and its lock: the look-up under the lock finds
/// the twin's record, so the request is answered from it (a replay), not with the
/// handler's failure.
async fn a_business_row_conflict_with_a_committed_twin_replays<D: PgDriver>() {
    let db = TestDb::shadowing(
        4,
        "CREATE FUNCTION pg_try_advisory_xact_lock(bigint) RETURNS boolean \
         LANGUAGE plpgsql VOLATILE AS $$ \
         BEGIN PERFORM pg_catalog.pg_sleep(2); \
         RETURN pg_catalog.pg_try_advisory_xact_lock($1); END $$",
    )
    .await;
    db.admin
        .batch_execute(&format!(
            "CREATE UNIQUE INDEX orders_one_per_user ON {}.orders (user_id)",
            db.schema
        ))
        .await
        .unwrap();
    let (knobs, gate) = gated();
    let app = router(Arc::clone(&knobs), IdempotencyLayer::new(D::pool(&db)));
    let body = json!({"user_id": 7, "amount": 42});
    let first = tokio::spawn({
        let (app, body) = (app.clone(), body.clone());
        async move { send(&app, post_json("/orders", Some("twin-1"), &body)).await }
    });
    knobs.wait_inserted().await;
    let duplicate = tokio::spawn({
        let (app, body) = (app.clone(), body.clone());
        async move { send(&app, post_json("/orders", Some("twin-1"), &body)).await }
    });
    // The duplicate sleeps in its lock attempt (after its look-up found nothing) ...
    eventually("the duplicate to sleep before its lock", async || {
        db.admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE application_name = $1 AND wait_event = 'PgSleep'",
                &[&db.schema],
            )
            .await
            .unwrap()
            .get::<_, i64>(0)
            == 1
    })
    .await;
    // ... when the first request commits its order, whose user the index allows once.
    gate.add_permits(2);
    let first = first.await.unwrap();
    assert_eq!(first.status, StatusCode::CREATED);
    let duplicate = duplicate.await.unwrap();
    assert_eq!(
        duplicate.status,
        StatusCode::CREATED,
        "{:?}",
        duplicate.body
    );
    assert!(duplicate.replayed(), "answered from the twin's record");
    assert_eq!(duplicate.body, first.body);
    assert_eq!(knobs.calls(), 1);
    assert_eq!((db.orders().await, db.records().await), (1, 1));
    db.assert_settles().await;
}

/// A handler that sends no statement: its record, the key's lock and `COMMIT` leave in
/// one pipeline. A key held by another session stores nothing and is answered 409; a free
/// one is stored, and (with `store_rejections_before_work`, since a 4xx before any
/// statement is otherwise not stored) a stored 4xx is replayed like any other.
async fn a_handler_without_statements_stores_its_answer_under_the_lock<D: PgDriver>() {
    let db = TestDb::new(4).await;
    let (app, _gate) =
        no_statement_app_with::<D>(&db, |layer| layer.store_rejections_before_work(true));
    let key = hold_key(&db, "quiet-1").await;
    let held = send(&app, noop("quiet-1")).await;
    assert_eq!(held.status, StatusCode::CONFLICT);
    assert_eq!(held.problem_code(), "in_flight");
    assert_eq!(db.records().await, 0, "nothing stored under a held key");
    release_key(&db, key).await;
    let stored = send(&app, noop("quiet-1")).await;
    assert_eq!(stored.status, StatusCode::ACCEPTED);
    assert!(!stored.replayed());
    let replay = send(&app, noop("quiet-1")).await;
    assert_eq!(replay.status, StatusCode::ACCEPTED);
    assert!(replay.replayed());
    assert_eq!(replay.body, stored.body);
    let mut missing = noop("quiet-2");
    missing
        .headers_mut()
        .insert("x-missing", "1".parse().unwrap());
    assert_eq!(send(&app, missing).await.status, StatusCode::NOT_FOUND);
    assert!(send(&app, noop("quiet-2")).await.replayed(), "a stored 404");
    assert_eq!(db.records().await, 2);
    db.assert_settles().await;
}

/// Two requests with one key whose handlers send no statement: the first waits after its
/// claim while the second runs. With the lock deferred to the insert, the second commits
/// and the first one's insert meets the primary key: it is answered from the second's
/// record. A driver that locks before the handler answers the second 409 instead.
async fn the_record_insert_refused_by_the_key_is_answered_from_the_twin<D: PgDriver>() {
    let db = TestDb::new(4).await;
    let (app, gate) = no_statement_app::<D>(&db);
    let first = tokio::spawn({
        let app = app.clone();
        async move {
            let mut request = noop("pk-1");
            request.headers_mut().insert("x-wait", "1".parse().unwrap());
            send(&app, request).await
        }
    });
    // The first request waits at the gate, after its claim.
    gate.arrived.acquire().await.unwrap().forget();
    let second = send(&app, noop("pk-1")).await;
    gate.open.add_permits(1);
    let first = first.await.unwrap();
    if D::LAZY {
        assert_eq!(second.status, StatusCode::ACCEPTED);
        assert!(!second.replayed());
        assert_eq!(first.status, StatusCode::ACCEPTED);
        assert!(
            first.replayed(),
            "the first is answered from the second's record"
        );
    } else {
        assert_eq!(second.status, StatusCode::CONFLICT);
        assert_eq!(first.status, StatusCode::ACCEPTED);
        assert!(!first.replayed());
    }
    assert_eq!(db.records().await, 1);
    db.assert_settles().await;
}

/// A handler whose first statement updates one row, waiting at the gate afterwards when
/// `x-wait` is set.
async fn bump<S: TestStore>(
    State(gate): State<Gate>,
    headers: HeaderMap,
    mut tx: IdempotentTx<S>,
) -> StatusCode {
    if tx
        .run("UPDATE counters SET n = n + 1 WHERE id = 1")
        .await
        .is_err()
    {
        return StatusCode::INTERNAL_SERVER_ERROR;
    }
    if headers.contains_key("x-wait") {
        gate.arrived.add_permits(1);
        gate.open.acquire().await.unwrap().forget();
    }
    StatusCode::OK
}

/// A duplicate whose first statement needs a row its in-flight twin has locked: the key's
/// lock, answered first in the same pipeline, is refused, and the statement waiting on the
/// row is cancelled, so the duplicate is answered 409 while the twin still runs (a driver
/// that locks the key before the handler answers it without sending the statement).
async fn a_first_statement_waiting_on_its_twins_row_is_cancelled_and_answered_409<D: PgDriver>() {
    let db = TestDb::new(4).await;
    db.admin
        .batch_execute(&format!(
            "CREATE TABLE {0}.counters (id int PRIMARY KEY, n int NOT NULL); \
             INSERT INTO {0}.counters VALUES (1, 0)",
            db.schema
        ))
        .await
        .unwrap();
    let gate = Gate {
        open: Arc::new(Semaphore::new(0)),
        arrived: Arc::new(Semaphore::new(0)),
    };
    let app = Router::new()
        .route("/bump", post(bump::<D::Store>))
        .layer(IdempotencyLayer::new(D::pool(&db)))
        .with_state(gate.clone());
    let first = tokio::spawn({
        let app = app.clone();
        async move {
            let mut request = post_json("/bump", Some("row-1"), &json!({}));
            request.headers_mut().insert("x-wait", "1".parse().unwrap());
            send(&app, request).await
        }
    });
    gate.arrived.acquire().await.unwrap().forget();
    let started = std::time::Instant::now();
    let duplicate = tokio::spawn({
        let app = app.clone();
        async move { send(&app, post_json("/bump", Some("row-1"), &json!({}))).await }
    });
    let duplicate = duplicate.await.unwrap();
    eprintln!(
        "a duplicate whose statement waited on its twin's row answered after {:?}",
        started.elapsed()
    );
    assert_eq!(duplicate.status, StatusCode::CONFLICT);
    assert_eq!(duplicate.problem_code(), "in_flight");
    assert!(
        !first.is_finished(),
        "answered while the twin still holds its row"
    );
    gate.open.add_permits(1);
    assert_eq!(first.await.unwrap().status, StatusCode::OK);
    assert_eq!(db.scalar("SELECT n::int8 FROM counters").await, 1);
    let retry = send(&app, post_json("/bump", Some("row-1"), &json!({}))).await;
    assert!(retry.replayed());
    db.assert_settles().await;
}

/// What a `prepared` handler met, in order.
type Steps = Arc<std::sync::Mutex<Vec<&'static str>>>;

/// Prepares `SELECT 1` with `prepare_cached`, then runs it; records which step the claim
/// refused.
async fn prepared(
    State(steps): State<Steps>,
    tx: axum_idempotency::postgres::IdempotentTx,
) -> Result<StatusCode, axum_idempotency::Error> {
    let statement = tx.prepare_cached("SELECT 1").await.inspect_err(|_| {
        steps.lock().unwrap().push("prepare refused");
    })?;
    steps.lock().unwrap().push("prepared");
    tx.query_one(&statement, &[]).await.inspect_err(|_| {
        steps.lock().unwrap().push("query refused");
    })?;
    Ok(StatusCode::CREATED)
}

/// deadpool keeps a statement cache per connection: `prepare_cached` of a statement the
/// connection prepared before is handed over without a round trip, so the claim rides with
/// the statement that runs, and `prepare_cached` then `query` costs the handler's own round
/// trips. With the key held by another session, the prepare succeeds and the query is the
/// step refused; the request is answered 409 and the retry runs once the key is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cached_prepare_leaves_the_claim_to_the_first_statement() {
    if !common::Database::Postgres.configured() {
        return;
    }
    let db = TestDb::new(1).await;
    let steps = Steps::default();
    let app = Router::new()
        .route("/prepared", post(prepared))
        .layer(IdempotencyLayer::new(db.pool.clone()))
        .with_state(Arc::clone(&steps));
    let first = send(&app, post_json("/prepared", Some("warm-1"), &json!({}))).await;
    assert_eq!(first.status, StatusCode::CREATED, "{:?}", first.body);
    assert_eq!(std::mem::take(&mut *steps.lock().unwrap()), ["prepared"]);

    let lock = hold_key(&db, "held-2").await;
    let held = send(&app, post_json("/prepared", Some("held-2"), &json!({}))).await;
    assert_eq!(held.status, StatusCode::CONFLICT, "{:?}", held.body);
    assert_eq!(held.problem_code(), "in_flight");
    assert_eq!(
        std::mem::take(&mut *steps.lock().unwrap()),
        ["prepared", "query refused"],
        "the cached statement was handed over without the claim"
    );
    release_key(&db, lock).await;
    let retry = send(&app, post_json("/prepared", Some("held-2"), &json!({}))).await;
    assert_eq!(retry.status, StatusCode::CREATED, "{:?}", retry.body);
    assert_eq!(db.records().await, 2);
    db.assert_settles().await;
}

for_each_driver! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async a_first_statement_waiting_on_its_twins_row_is_cancelled_and_answered_409;
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async a_first_statement_that_meets_a_held_key_is_answered_409;
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async a_business_row_conflict_with_a_committed_twin_replays;
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async a_handler_without_statements_stores_its_answer_under_the_lock;
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async the_record_insert_refused_by_the_key_is_answered_from_the_twin;
}
