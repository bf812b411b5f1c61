//! The behaviour of the idempotency layer that only PostgreSQL shows, or that these tests
//! check through PostgreSQL's own views: the claim's lock racing a commit, a schema never
//! migrated, a record removed behind the cache's back, a database that is down.

mod common;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::http::StatusCode;
use axum_idempotency::IdempotencyLayer;
use common::*;
use serde_json::json;

fn app<D: PgDriver>(db: &TestDb) -> (Router, Arc<Knobs>) {
    let knobs = Arc::new(Knobs::default());
    let layer = scoped(IdempotencyLayer::new(D::pool(db)));
    (router(Arc::clone(&knobs), layer), knobs)
}

#[tokio::test]
async fn dead_database_is_503_and_keyless_requests_never_touch_it() {
    if !common::Database::Postgres.configured() {
        return;
    }
    // Port 1 refuses connections: a database that is down.
    let mut config: tokio_postgres::Config =
        "postgres://postgres@127.0.0.1:1/postgres".parse().unwrap();
    config.connect_timeout(Duration::from_secs(2));
    let manager = deadpool_postgres::Manager::new(config, tokio_postgres::NoTls);
    let pool = deadpool_postgres::Pool::builder(manager)
        .max_size(2)
        .build()
        .unwrap();
    let knobs = Arc::new(Knobs::default());
    let app = router(Arc::clone(&knobs), IdempotencyLayer::new(pool));

    let answer = send(&app, post_json("/orders", Some("down-1"), &json!({}))).await;
    assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(answer.problem_code(), "store_unavailable");
    assert_eq!(answer.headers["retry-after"], "1");
    assert_eq!(knobs.calls(), 0);

    // Without a key, or on a route without the extractor, nothing needs the database.
    let plain = send(&app, post_json("/plain", Some("down-2"), &json!({}))).await;
    assert_eq!(plain.status, StatusCode::OK);
    let plain = send(&app, post_json("/plain", None, &json!({}))).await;
    assert_eq!(plain.status, StatusCode::OK);
}

#[tokio::test]
async fn handler_cannot_end_the_shared_transaction() {
    if !common::Database::Postgres.configured() {
        return;
    }
    let db = TestDb::new(1).await;
    let (app, knobs) = app::<Deadpool>(&db);
    let answer = send(
        &app,
        post_json("/orders", Some("tc-1"), &json!({"try_commit": true})),
    )
    .await;
    assert_eq!(answer.status, StatusCode::CREATED);
    let refused = knobs.leaked_result.lock().await.clone().unwrap();
    assert!(refused.contains("transaction control"), "{refused}");
    // Record and row still commit together, once.
    assert_eq!((db.orders().await, db.records().await), (1, 1));
    db.assert_settles().await;
}

async fn cached_replays_need_no_database_and_keep_every_check<D: PgDriver>() {
    let db = TestDb::new(2).await;
    let knobs = Arc::new(Knobs::default());
    let layer = scoped(IdempotencyLayer::new(D::pool(&db)))
        .cache_responses(1 << 20)
        .ttl(Duration::from_secs(2));
    let app = router(Arc::clone(&knobs), layer);
    let request = |user: &str, amount: i64| {
        let mut request = post_json("/orders", Some("cached-1"), &json!({"amount": amount}));
        request
            .headers_mut()
            .insert("x-user-id", user.parse().unwrap());
        request
    };
    let first = send(&app, request("alice", 1)).await;
    assert_eq!(first.status, StatusCode::CREATED);
    // Remove the record behind the cache's back: a replay now can only come from memory.
    db.admin
        .batch_execute(&format!("DELETE FROM {}.idempotency_records", db.schema))
        .await
        .unwrap();
    let replay = send(&app, request("alice", 1)).await;
    assert!(replay.replayed());
    assert_eq!(replay.body, first.body);
    assert_eq!(replay.headers["location"], first.headers["location"]);
    // The fingerprint check holds in memory too.
    assert_eq!(
        send(&app, request("alice", 2)).await.problem_code(),
        "key_reused"
    );
    // Another scope never sees it.
    let bob = send(&app, request("bob", 1)).await;
    assert_eq!(bob.status, StatusCode::CREATED);
    assert!(!bob.replayed());
    // Past the record's expiry the cache forgets it and the key runs anew.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let again = send(&app, request("alice", 1)).await;
    assert!(!again.replayed());
    assert_eq!(knobs.calls(), 3);
}

/// The record's primary key is the last line of defence: should a record for the key
/// commit while a request holds the key's lock and runs its handler (a record written by
/// an instance that does not take the lock, or a race the claim did not see), the late
/// request's writes roll back and it answers with the winner's response.
async fn a_record_committed_behind_the_claims_back_is_caught_by_the_primary_key<D: PgDriver>() {
    // The winner's record: the same request, answered in another schema.
    let winner = TestDb::new(2).await;
    let (winner_app, _) = app::<D>(&winner);
    let body = json!({"amount": 7});
    let first = send(
        &winner_app,
        post_json("/orders", Some("behind-the-back"), &body),
    )
    .await;
    assert_eq!(first.status, StatusCode::CREATED);

    let db = TestDb::new(2).await;
    let (knobs, gate) = gated();
    let late_app = router(
        Arc::clone(&knobs),
        scoped(IdempotencyLayer::new(D::pool(&db))),
    );
    let late = tokio::spawn({
        let late_app = late_app.clone();
        let body = body.clone();
        async move {
            send(
                &late_app,
                post_json("/orders", Some("behind-the-back"), &body),
            )
            .await
        }
    });
    // The late request claimed an absent record, holds the lock and has written its order.
    knobs.wait_inserted().await;
    db.admin
        .batch_execute(&format!(
            "INSERT INTO {}.idempotency_records SELECT * FROM {}.idempotency_records",
            db.schema, winner.schema
        ))
        .await
        .unwrap();
    gate.add_permits(1);
    let answer = late.await.unwrap();

    assert_eq!(answer.status, StatusCode::CREATED);
    assert!(answer.replayed(), "the winner's response is replayed");
    assert_eq!(answer.json(), first.json());
    assert_eq!(knobs.calls(), 1);
    assert_eq!(
        (db.orders().await, db.records().await),
        (0, 1),
        "the late request's order was rolled back with its record"
    );
    db.assert_settles().await;
}

/// The race a claim must not lose: a duplicate whose lock attempt comes after the first
/// request committed, but whose statement began before. A claim that looked the record up
/// in the same statement as it took the lock would have a snapshot from before the commit,
/// find no record, get the lock, and run the handler a second time (the primary key would
/// catch it only after). The claim looks again in a statement after the lock, and replays.
///
/// Deterministic: the test's schema shadows `pg_try_advisory_xact_lock(bigint)` with one
/// that sleeps first, and the first request commits while the duplicate sleeps there.
async fn a_duplicate_whose_lock_follows_the_first_commit_replays<D: PgDriver>() {
    let db = TestDb::shadowing(
        4,
        "CREATE FUNCTION pg_try_advisory_xact_lock(bigint) RETURNS boolean \
         LANGUAGE plpgsql VOLATILE AS $$ \
         BEGIN PERFORM pg_catalog.pg_sleep(2); \
         RETURN pg_catalog.pg_try_advisory_xact_lock($1); END $$",
    )
    .await;
    let (knobs, gate) = gated();
    let app = router(Arc::clone(&knobs), IdempotencyLayer::new(D::pool(&db)));
    let body = json!({"amount": 42});
    let first = tokio::spawn({
        let (app, body) = (app.clone(), body.clone());
        async move { send(&app, post_json("/orders", Some("race-1"), &body)).await }
    });
    // The first request holds the key's lock and waits at the gate with its order written.
    knobs.wait_inserted().await;
    let duplicate = tokio::spawn({
        let (app, body) = (app.clone(), body.clone());
        async move { send(&app, post_json("/orders", Some("race-1"), &body)).await }
    });
    // The duplicate's claim is inside the shadowed lock attempt...
    eventually(
        "the duplicate to sleep before its lock attempt",
        async || {
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
        },
    )
    .await;
    // ... when the first request commits and lets go of the lock. (A second permit lets a
    // duplicate that wrongly ran the handler through, to be counted below.)
    gate.add_permits(2);
    let first = first.await.unwrap();
    assert_eq!(first.status, StatusCode::CREATED);
    let duplicate = duplicate.await.unwrap();
    assert_eq!(duplicate.status, StatusCode::CREATED);
    assert!(
        duplicate.replayed(),
        "the duplicate is answered by a replay"
    );
    assert_eq!(duplicate.body, first.body);
    assert_eq!(knobs.calls(), 1, "the handler ran once");
    assert_eq!((db.orders().await, db.records().await), (1, 1));
    db.assert_settles().await;
}

/// A database the crate's schema was never migrated into is a permanent misconfiguration,
/// not an outage: 500 `schema_missing` naming `migrate`, with no `Retry-After`.
async fn a_database_never_migrated_is_a_500_that_names_migrate<D: PgDriver>() {
    let db = TestDb::bare(2).await;
    let (app, knobs) = app::<D>(&db);
    for key in ["never-migrated-1", "never-migrated-2"] {
        let answer = send(&app, post_json("/orders", Some(key), &json!({"amount": 1}))).await;
        assert_eq!(answer.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(answer.problem_code(), "schema_missing");
        assert!(
            answer.headers.get("retry-after").is_none(),
            "retrying cannot help"
        );
        let detail = answer.json()["detail"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        assert!(detail.contains("migrate"), "{detail}");
    }
    assert_eq!(knobs.calls(), 0);
    // Once migrated, the same service works.
    axum_idempotency::migrate(&D::pool(&db)).await.unwrap();
    db.admin
        .batch_execute(&format!("SET search_path = {}; {TEST_TABLES}", db.schema))
        .await
        .unwrap();
    let answer = send(
        &app,
        post_json("/orders", Some("never-migrated-1"), &json!({"amount": 1})),
    )
    .await;
    assert_eq!(answer.status, StatusCode::CREATED);
    db.assert_settles().await;
}

for_each_driver! {
    #[tokio::test]
    async a_database_never_migrated_is_a_500_that_names_migrate;
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async a_duplicate_whose_lock_follows_the_first_commit_replays;
    #[tokio::test]
    async cached_replays_need_no_database_and_keep_every_check;
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async a_record_committed_behind_the_claims_back_is_caught_by_the_primary_key;
}
