//! The Sweeper and the Admin view against real PostgreSQL: batched purges with separate
//! retention, stale leases reported and optionally failed, several sweepers at once, and the
//! troubleshooting look-ups.

mod common;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum_idempotency::inbox::Outcome;
use axum_idempotency::{Admin, Error, IdempotencyLayer, Inbox, InboxError, KeyError, Sweeper};
use common::recorder::{Capture, Recorder};
use common::*;
use serde_json::json;
use sha2::{Digest, Sha256};

/// Runs statements on the test's own connection, inside its schema.
async fn exec(db: &TestDb, sql: &str) {
    db.admin
        .batch_execute(&format!("SET search_path = {}; {sql}", db.schema))
        .await
        .unwrap();
}

/// Inserts `n` records in `scope`, straight into the table. `expires_at` and `locked_until`
/// are SQL expressions.
async fn insert_records(
    db: &TestDb,
    n: i64,
    scope: &str,
    state: &str,
    expires_at: &str,
    locked_until: &str,
) {
    exec(
        db,
        &format!(
            "INSERT INTO idempotency_records \
             (id, scope, fingerprint, state, status, headers, body, created_at, expires_at, \
              locked_until) \
             SELECT gen_random_uuid(), '{scope}', sha256(i::text::bytea), '{state}', 201, '', \
                    'body', now() - interval '30 days', {expires_at}, {locked_until} \
             FROM generate_series(1, {n}) AS i"
        ),
    )
    .await;
}

/// Inserts `n` inbox records in `group`.
async fn insert_messages(db: &TestDb, n: i64, group: &str, status: &str, expires_at: &str) {
    exec(
        db,
        &format!(
            "INSERT INTO inbox_messages (consumer_group, message_id, status, attempts, expires_at) \
             SELECT '{group}', 'm-' || i, '{status}', 1, {expires_at} \
             FROM generate_series(1, {n}) AS i"
        ),
    )
    .await;
}

async fn in_scope(db: &TestDb, scope: &str) -> i64 {
    db.scalar(&format!(
        "SELECT count(*) FROM idempotency_records WHERE scope = '{scope}'"
    ))
    .await
}

async fn in_group(db: &TestDb, group: &str) -> i64 {
    db.scalar(&format!(
        "SELECT count(*) FROM inbox_messages WHERE consumer_group = '{group}'"
    ))
    .await
}

async fn messages(db: &TestDb) -> i64 {
    db.scalar("SELECT count(*) FROM inbox_messages").await
}

/// Polls `check` every 20 ms until it holds; panics after 10 s.
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..500 {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for {what}");
}

async fn batched_purge_removes_exactly_the_expired_rows<D: Driver>() {
    let db = TestDb::new(2).await;
    insert_records(
        &db,
        2500,
        "expired",
        "SUCCESS",
        "now() - interval '1 hour'",
        "NULL",
    )
    .await;
    insert_records(
        &db,
        40,
        "live",
        "SUCCESS",
        "now() + interval '1 hour'",
        "NULL",
    )
    .await;
    // Expired long ago, but the lease is still held: never touched.
    insert_records(
        &db,
        5,
        "leased",
        "PROCESSING",
        "now() - interval '30 days'",
        "now() + interval '1 hour'",
    )
    .await;
    // Expired long ago and the holder is gone: an abandoned attempt, kept like a failure.
    insert_records(
        &db,
        3,
        "abandoned",
        "PROCESSING",
        "now() - interval '30 days'",
        "now() - interval '30 days'",
    )
    .await;

    let sweeper = Sweeper::new(D::pool(&db)).batch_size(1000);
    let report = sweeper.run_once().await.unwrap();
    assert_eq!(report.purged_records, 2503, "{report:?}");
    assert_eq!(report.purged_messages, 0);
    assert_eq!(in_scope(&db, "expired").await, 0);
    assert_eq!(in_scope(&db, "abandoned").await, 0);
    assert_eq!(in_scope(&db, "live").await, 40);
    assert_eq!(in_scope(&db, "leased").await, 5);

    // An exact multiple of the batch size: the loop stops on the empty batch after it.
    insert_records(
        &db,
        2000,
        "expired",
        "SUCCESS",
        "now() - interval '1 second'",
        "NULL",
    )
    .await;
    let report = sweeper.run_once().await.unwrap();
    assert_eq!(report.purged_records, 2000, "{report:?}");
    assert_eq!(db.records().await, 45);

    let report = sweeper.run_once().await.unwrap();
    assert_eq!(report.purged_records, 0, "nothing left to purge");
    db.assert_settles().await;
}

async fn success_is_purged_after_its_grace_and_failures_after_their_retention<D: Driver>() {
    let db = TestDb::new(2).await;
    let past = "now() - interval '2 minutes'";
    insert_records(&db, 10, "success-old", "SUCCESS", past, "NULL").await;
    insert_records(
        &db,
        11,
        "success-grace",
        "SUCCESS",
        "now() - interval '10 seconds'",
        "NULL",
    )
    .await;
    insert_records(&db, 12, "failed-recent", "FAILED", past, "NULL").await;
    insert_records(
        &db,
        13,
        "failed-old",
        "FAILED",
        "now() - interval '2 days'",
        "NULL",
    )
    .await;

    let report = Sweeper::new(D::pool(&db))
        .batch_size(4)
        .success_grace(Duration::from_secs(60))
        .failure_retention(Duration::from_secs(24 * 3600))
        .run_once()
        .await
        .unwrap();
    assert_eq!(report.purged_records, 10 + 13, "{report:?}");
    assert_eq!(in_scope(&db, "success-old").await, 0);
    assert_eq!(in_scope(&db, "success-grace").await, 11);
    assert_eq!(in_scope(&db, "failed-recent").await, 12);
    assert_eq!(in_scope(&db, "failed-old").await, 0);
}

async fn default_retention_purges_success_at_expiry_and_keeps_failures_a_week<D: Driver>() {
    let db = TestDb::new(2).await;
    insert_records(
        &db,
        3,
        "success",
        "SUCCESS",
        "now() - interval '1 second'",
        "NULL",
    )
    .await;
    insert_records(
        &db,
        4,
        "failed-6d",
        "FAILED",
        "now() - interval '6 days'",
        "NULL",
    )
    .await;
    insert_records(
        &db,
        5,
        "failed-8d",
        "FAILED",
        "now() - interval '8 days'",
        "NULL",
    )
    .await;

    let report = Sweeper::new(D::pool(&db)).run_once().await.unwrap();
    assert_eq!(report.purged_records, 3 + 5, "{report:?}");
    assert_eq!(in_scope(&db, "success").await, 0);
    assert_eq!(in_scope(&db, "failed-6d").await, 4);
    assert_eq!(in_scope(&db, "failed-8d").await, 0);
}

async fn inbox_messages_are_purged_the_same_way<D: Driver>() {
    let db = TestDb::new(2).await;
    insert_messages(
        &db,
        30,
        "success-old",
        "SUCCESS",
        "now() - interval '2 minutes'",
    )
    .await;
    insert_messages(
        &db,
        6,
        "success-grace",
        "SUCCESS",
        "now() - interval '10 seconds'",
    )
    .await;
    insert_messages(
        &db,
        5,
        "success-live",
        "SUCCESS",
        "now() + interval '1 hour'",
    )
    .await;
    insert_messages(
        &db,
        4,
        "failed-recent",
        "FAILED",
        "now() - interval '2 minutes'",
    )
    .await;
    insert_messages(&db, 21, "failed-old", "FAILED", "now() - interval '2 days'").await;
    insert_records(
        &db,
        2,
        "live",
        "SUCCESS",
        "now() + interval '1 hour'",
        "NULL",
    )
    .await;

    let report = Sweeper::new(D::pool(&db))
        .batch_size(7)
        .success_grace(Duration::from_secs(60))
        .failure_retention(Duration::from_secs(24 * 3600))
        .run_once()
        .await
        .unwrap();
    assert_eq!(report.purged_messages, 30 + 21, "{report:?}");
    assert_eq!(report.purged_records, 0);
    assert_eq!(in_group(&db, "success-old").await, 0);
    assert_eq!(in_group(&db, "success-grace").await, 6);
    assert_eq!(in_group(&db, "success-live").await, 5);
    assert_eq!(in_group(&db, "failed-recent").await, 4);
    assert_eq!(in_group(&db, "failed-old").await, 0);
    assert_eq!(db.records().await, 2);
}

/// PROCESSING records: one lease ended 90 s ago, two 30 s ago, one 5 s ago; two still held.
async fn stale_fixture(db: &TestDb) {
    let expires = "now() + interval '1 hour'";
    insert_records(
        db,
        1,
        "lapsed-90s",
        "PROCESSING",
        expires,
        "now() - interval '90 seconds'",
    )
    .await;
    insert_records(
        db,
        2,
        "lapsed-30s",
        "PROCESSING",
        expires,
        "now() - interval '30 seconds'",
    )
    .await;
    insert_records(
        db,
        1,
        "lapsed-5s",
        "PROCESSING",
        expires,
        "now() - interval '5 seconds'",
    )
    .await;
    insert_records(
        db,
        2,
        "held",
        "PROCESSING",
        expires,
        "now() + interval '1 minute'",
    )
    .await;
    insert_records(db, 3, "done", "SUCCESS", expires, "NULL").await;
}

async fn states(db: &TestDb, scope: &str) -> Vec<(String, bool, bool)> {
    db.admin
        .query(
            &format!(
                "SELECT state, retryable, locked_until IS NULL \
                 FROM {}.idempotency_records WHERE scope = $1",
                db.schema
            ),
            &[&scope],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1), row.get(2)))
        .collect()
}

async fn stale_processing_is_reported_and_left_alone_by_default<D: Driver>() {
    let db = TestDb::new(2).await;
    stale_fixture(&db).await;

    let report = Sweeper::new(D::pool(&db)).run_once().await.unwrap();
    assert_eq!(report.stale_processing, 4, "{report:?}");
    let oldest = report.oldest_stale.expect("an oldest age");
    assert!(
        oldest >= Duration::from_secs(90) && oldest < Duration::from_secs(120),
        "{oldest:?}"
    );
    assert_eq!(report.marked_failed, 0);
    assert_eq!(report.purged_records, 0);
    for scope in ["lapsed-90s", "lapsed-30s", "lapsed-5s", "held"] {
        for (state, _, unlocked) in states(&db, scope).await {
            assert_eq!(state, "PROCESSING", "{scope}");
            assert!(!unlocked, "{scope}");
        }
    }

    // Nothing stale: no age at all.
    exec(
        &db,
        "DELETE FROM idempotency_records WHERE scope LIKE 'lapsed%'",
    )
    .await;
    let report = Sweeper::new(D::pool(&db)).run_once().await.unwrap();
    assert_eq!(report.stale_processing, 0);
    assert_eq!(report.oldest_stale, None);
}

async fn stale_processing_is_marked_failed_and_retryable_when_configured<D: Driver>() {
    let db = TestDb::new(2).await;
    stale_fixture(&db).await;
    insert_records(
        &db,
        4,
        "lapsed-2m",
        "PROCESSING",
        "now() + interval '1 hour'",
        "now() - interval '2 minutes'",
    )
    .await;
    exec(
        &db,
        "UPDATE idempotency_records SET fencing_token = 7 WHERE state = 'PROCESSING'",
    )
    .await;

    let sweeper = Sweeper::new(D::pool(&db))
        .batch_size(2)
        .mark_stale_failed_after(Duration::from_secs(60));
    let report = sweeper.run_once().await.unwrap();
    assert_eq!(report.stale_processing, 8, "{report:?}");
    assert_eq!(report.marked_failed, 5, "{report:?}");
    for scope in ["lapsed-90s", "lapsed-2m"] {
        for state in states(&db, scope).await {
            assert_eq!(state, ("FAILED".to_owned(), true, true), "{scope}");
        }
    }
    for scope in ["lapsed-30s", "lapsed-5s", "held"] {
        for (state, retryable, _) in states(&db, scope).await {
            assert_eq!(
                (state.as_str(), retryable),
                ("PROCESSING", false),
                "{scope}"
            );
        }
    }

    // The lost holder comes back: its fenced completion finds nothing to complete.
    let completed = db
        .admin
        .execute(
            &format!(
                "UPDATE {}.idempotency_records SET state = 'SUCCESS' \
                 WHERE scope = 'lapsed-90s' AND fencing_token = 7 AND state = 'PROCESSING'",
                db.schema
            ),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(completed, 0);

    let report = sweeper.run_once().await.unwrap();
    assert_eq!(report.stale_processing, 3, "{report:?}");
    assert_eq!(report.marked_failed, 0);
}

async fn rows_locked_by_live_traffic_are_skipped_not_waited_for<D: Driver>() {
    let db = TestDb::new(2).await;
    insert_records(
        &db,
        10,
        "expired",
        "SUCCESS",
        "now() - interval '1 hour'",
        "NULL",
    )
    .await;
    insert_messages(&db, 10, "expired", "SUCCESS", "now() - interval '1 hour'").await;
    let mut live = connect(&database_url()).await;
    live.batch_execute(&format!("SET search_path = {}", db.schema))
        .await
        .unwrap();
    let tx = live.transaction().await.unwrap();
    tx.batch_execute(
        "SELECT 1 FROM idempotency_records ORDER BY id LIMIT 1 FOR UPDATE; \
         SELECT 1 FROM inbox_messages ORDER BY message_id LIMIT 1 FOR UPDATE",
    )
    .await
    .unwrap();

    let sweeper = Sweeper::new(D::pool(&db)).batch_size(3);
    let report = tokio::time::timeout(Duration::from_secs(5), sweeper.run_once())
        .await
        .expect("the sweeper waited for a locked row")
        .unwrap();
    assert_eq!(report.purged_records, 9, "{report:?}");
    assert_eq!(report.purged_messages, 9, "{report:?}");

    tx.rollback().await.unwrap();
    let report = sweeper.run_once().await.unwrap();
    assert_eq!((report.purged_records, report.purged_messages), (1, 1));
}

async fn concurrent_sweepers_purge_each_row_exactly_once<D: Driver>() {
    let db = TestDb::new(6).await;
    insert_records(
        &db,
        5000,
        "expired",
        "SUCCESS",
        "now() - interval '1 hour'",
        "NULL",
    )
    .await;
    insert_messages(&db, 5000, "expired", "FAILED", "now() - interval '30 days'").await;
    insert_records(
        &db,
        100,
        "live",
        "SUCCESS",
        "now() + interval '1 hour'",
        "NULL",
    )
    .await;

    let sweeper = Sweeper::new(D::pool(&db)).batch_size(200);
    let (a, b) = (sweeper.clone(), sweeper.clone());
    let (a, b) = tokio::join!(
        tokio::spawn(async move { a.run_once().await }),
        tokio::spawn(async move { b.run_once().await }),
    );
    let (a, b) = (a.unwrap().unwrap(), b.unwrap().unwrap());
    assert_eq!(a.purged_records + b.purged_records, 5000, "{a:?} {b:?}");
    assert_eq!(a.purged_messages + b.purged_messages, 5000, "{a:?} {b:?}");
    assert_eq!(db.records().await, 100);
    assert_eq!(messages(&db).await, 0);
    db.assert_settles().await;
}

async fn a_spawned_sweeper_purges_on_every_tick_and_stops_on_shutdown<D: Driver>() {
    let db = TestDb::new(2).await;
    insert_records(
        &db,
        100,
        "expired",
        "SUCCESS",
        "now() - interval '1 hour'",
        "NULL",
    )
    .await;
    let handle = Sweeper::new(D::pool(&db))
        .interval(Duration::from_millis(50))
        .spawn();
    eventually("the first sweep", || async { db.records().await == 0 }).await;

    insert_messages(&db, 20, "expired", "SUCCESS", "now() - interval '1 hour'").await;
    eventually("a later sweep", || async { messages(&db).await == 0 }).await;

    tokio::time::timeout(Duration::from_secs(5), handle.shutdown())
        .await
        .expect("shutdown did not finish");
    insert_records(
        &db,
        10,
        "after",
        "SUCCESS",
        "now() - interval '1 hour'",
        "NULL",
    )
    .await;
    // Four intervals: a sweeper still running would have purged these.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(db.records().await, 10);
    db.assert_settles().await;
}

async fn shutdown_does_not_wait_for_the_next_interval<D: Driver>() {
    let db = TestDb::new(2).await;
    insert_records(
        &db,
        10,
        "expired",
        "SUCCESS",
        "now() - interval '1 hour'",
        "NULL",
    )
    .await;
    let handle = Sweeper::new(D::pool(&db))
        .interval(Duration::from_secs(3600))
        .spawn();
    eventually("the immediate first sweep", || async {
        db.records().await == 0
    })
    .await;
    tokio::time::timeout(Duration::from_secs(2), handle.shutdown())
        .await
        .expect("shutdown waited for the interval");
}

fn scoped_request(user: &str, key: &str, amount: i64) -> axum::http::Request<axum::body::Body> {
    let mut request = post_json("/orders", Some(key), &json!({ "amount": amount }));
    request
        .headers_mut()
        .insert("x-user-id", user.parse().unwrap());
    request
}

async fn admin_lookup_finds_a_record_by_scope_and_key<D: Driver>() {
    let db = TestDb::new(4).await;
    let app = router(
        Arc::new(Knobs::default()),
        scoped(IdempotencyLayer::new(D::pool(&db)).store_raw_key(true)),
    );
    let before = SystemTime::now() - Duration::from_secs(5);
    let answer = send(&app, scoped_request("alice", "order-1", 5)).await;
    assert_eq!(answer.status, 201);
    let admin = Admin::new(D::pool(&db));

    let record = admin
        .lookup("alice", "order-1")
        .await
        .unwrap()
        .expect("the record");
    assert_eq!(record.scope, "alice");
    assert_eq!(record.key.as_deref(), Some("order-1"));
    assert_eq!(record.state, "SUCCESS");
    assert_eq!(record.status, 201);
    assert!(!record.retryable);
    assert!(record.response_bytes >= answer.body.len(), "{record:?}");
    assert!(record.created_at >= before && record.created_at <= SystemTime::now());
    assert!(record.expires_at > SystemTime::now());
    assert_eq!(record.locked_until, None);
    let row = db
        .admin
        .query_one(
            &format!(
                "SELECT replace(id::text, '-', ''), encode(fingerprint, 'hex') \
                 FROM {}.idempotency_records WHERE scope = 'alice'",
                db.schema
            ),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(record.id, row.get::<_, String>(0));
    assert_eq!(record.fingerprint, row.get::<_, String>(1));
    assert_eq!(record.fingerprint.len(), 64);

    // The quoted header form names the same record.
    let quoted = admin.lookup("alice", "\"order-1\"").await.unwrap();
    assert_eq!(quoted.as_ref(), Some(&record));

    // Another scope, another key: nothing.
    assert_eq!(admin.lookup("bob", "order-1").await.unwrap(), None);
    assert_eq!(admin.lookup("alice", "order-2").await.unwrap(), None);

    // A key the layer would refuse is an error, not a panic and not "absent".
    for (bad, expected) in [
        ("", KeyError::Empty),
        ("\"unterminated", KeyError::BrokenQuoting),
        ("caf\u{e9}", KeyError::InvalidCharacter { position: 3 }),
    ] {
        match admin.lookup("alice", bad).await {
            Err(Error::InvalidKey(error)) => assert_eq!(error, expected, "{bad:?}"),
            other => panic!("{bad:?}: expected InvalidKey, got {other:?}"),
        }
    }
    let too_long = "k".repeat(300);
    assert!(matches!(
        admin.lookup("alice", &too_long).await,
        Err(Error::InvalidKey(KeyError::TooLong { .. }))
    ));
}

async fn admin_lookup_shows_no_key_unless_the_layer_stores_it<D: Driver>() {
    let db = TestDb::new(4).await;
    let app = router(
        Arc::new(Knobs::default()),
        IdempotencyLayer::new(D::pool(&db)),
    );
    let answer = send(
        &app,
        post_json("/orders", Some("k-2"), &json!({ "amount": 1 })),
    )
    .await;
    assert_eq!(answer.status, 201);
    let record = Admin::new(D::pool(&db))
        .lookup("", "k-2")
        .await
        .unwrap()
        .expect("the record, unscoped");
    assert_eq!(record.key, None);
    assert_eq!(record.scope, "");
}

async fn admin_stale_lists_processing_rows_past_their_lease_oldest_first<D: Driver>() {
    let db = TestDb::new(2).await;
    let expires = "now() + interval '1 hour'";
    insert_records(
        &db,
        1,
        "lapsed-10s",
        "PROCESSING",
        expires,
        "now() - interval '10 seconds'",
    )
    .await;
    insert_records(
        &db,
        1,
        "lapsed-5m",
        "PROCESSING",
        expires,
        "now() - interval '5 minutes'",
    )
    .await;
    insert_records(
        &db,
        1,
        "lapsed-1m",
        "PROCESSING",
        expires,
        "now() - interval '1 minute'",
    )
    .await;
    insert_records(
        &db,
        1,
        "held",
        "PROCESSING",
        expires,
        "now() + interval '1 minute'",
    )
    .await;
    insert_records(&db, 1, "done", "SUCCESS", expires, "NULL").await;
    insert_records(&db, 1, "failed", "FAILED", expires, "NULL").await;

    let admin = Admin::new(D::pool(&db));
    let stale = admin.stale(10).await.unwrap();
    let scopes: Vec<_> = stale.iter().map(|r| r.scope.as_str()).collect();
    assert_eq!(scopes, ["lapsed-5m", "lapsed-1m", "lapsed-10s"]);
    let now = SystemTime::now();
    for record in &stale {
        assert_eq!(record.state, "PROCESSING");
        assert!(record.locked_until.expect("a lease") < now);
        assert_eq!(record.id.len(), 32);
    }
    let first_two = admin.stale(2).await.unwrap();
    assert_eq!(first_two, stale[..2]);
    assert!(admin.stale(0).await.unwrap().is_empty());
}

async fn admin_shows_inbox_messages_and_failed_ones<D: Driver>() {
    let db = TestDb::new(2).await;
    let inbox = Inbox::new(D::pool(&db), "coupons");
    let payload = b"{\"user_id\":1}";
    let outcome = inbox
        .process_payload("m-ok", payload, |_tx| async move { Ok::<_, Error>(()) })
        .await
        .unwrap();
    assert_eq!(outcome, Outcome::Processed(()));
    for _ in 0..2 {
        let failed = inbox
            .process("m-bad", |_tx| async move {
                Err::<(), _>("coupon service said no")
            })
            .await;
        assert!(
            matches!(failed, Err(InboxError::Failed { .. })),
            "{failed:?}"
        );
    }
    let admin = Admin::new(D::pool(&db));

    let ok = admin
        .inbox_message("coupons", "m-ok")
        .await
        .unwrap()
        .expect("the message");
    assert_eq!(ok.consumer_group, "coupons");
    assert_eq!(ok.message_id, "m-ok");
    assert_eq!(ok.status, "SUCCESS");
    assert_eq!(ok.attempts, 1);
    assert_eq!(ok.last_error, None);
    let digest: String = Sha256::digest(payload)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(ok.payload_digest, Some(digest));
    assert!(ok.expires_at > SystemTime::now());

    assert_eq!(admin.inbox_message("coupons", "nope").await.unwrap(), None);
    assert_eq!(admin.inbox_message("points", "m-ok").await.unwrap(), None);

    let failed = admin.failed_messages("coupons", 10).await.unwrap();
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(failed[0].message_id, "m-bad");
    assert_eq!(failed[0].status, "FAILED");
    assert_eq!(failed[0].attempts, 2);
    assert_eq!(
        failed[0].last_error.as_deref(),
        Some("coupon service said no")
    );
    assert!(
        admin
            .failed_messages("points", 10)
            .await
            .unwrap()
            .is_empty()
    );
}

async fn admin_purge_now_uses_the_default_retention<D: Driver>() {
    let db = TestDb::new(2).await;
    insert_records(
        &db,
        3,
        "success",
        "SUCCESS",
        "now() - interval '1 minute'",
        "NULL",
    )
    .await;
    insert_records(
        &db,
        4,
        "failed-1d",
        "FAILED",
        "now() - interval '1 day'",
        "NULL",
    )
    .await;
    insert_records(
        &db,
        5,
        "failed-8d",
        "FAILED",
        "now() - interval '8 days'",
        "NULL",
    )
    .await;
    insert_messages(&db, 6, "g", "SUCCESS", "now() - interval '1 minute'").await;

    let report = Admin::new(D::pool(&db)).purge_now().await.unwrap();
    assert_eq!(report.purged_records, 3 + 5, "{report:?}");
    assert_eq!(report.purged_messages, 6, "{report:?}");
    assert_eq!(in_scope(&db, "failed-1d").await, 4);
}

/// A local recorder sees only this thread, so the test drives its own single-threaded
/// runtime instead of `#[tokio::test]`'s.
fn a_sweep_emits_the_documented_metrics<D: Driver>() {
    let capture = Arc::new(Capture::default());
    let recorder = Recorder(Arc::clone(&capture));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let report = metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            let db = TestDb::new(2).await;
            insert_records(
                &db,
                3,
                "expired",
                "SUCCESS",
                "now() - interval '1 hour'",
                "NULL",
            )
            .await;
            insert_messages(&db, 2, "g", "SUCCESS", "now() - interval '1 hour'").await;
            let expires = "now() + interval '1 hour'";
            insert_records(
                &db,
                1,
                "lapsed-2m",
                "PROCESSING",
                expires,
                "now() - interval '2 minutes'",
            )
            .await;
            insert_records(
                &db,
                1,
                "lapsed-5s",
                "PROCESSING",
                expires,
                "now() - interval '5 seconds'",
            )
            .await;
            Sweeper::new(D::pool(&db))
                .mark_stale_failed_after(Duration::from_secs(60))
                .run_once()
                .await
                .unwrap()
        })
    });
    assert_eq!(report.marked_failed, 1, "{report:?}");
    let values = capture.values();
    let value = |key: &str| {
        *values
            .get(key)
            .unwrap_or_else(|| panic!("{key} was not emitted: {values:?}"))
    };
    assert_eq!(
        value("idempotency_purged_total{table=idempotency_records}"),
        3.0
    );
    assert_eq!(value("idempotency_purged_total{table=inbox_messages}"), 2.0);
    assert_eq!(value("idempotency_stale_processing{}"), 2.0);
    let oldest = value("idempotency_stale_processing_oldest_seconds{}");
    assert!((120.0..150.0).contains(&oldest), "{oldest}");
    assert_eq!(value("idempotency_stale_marked_failed_total{}"), 1.0);
}

for_each_driver! {
    #[tokio::test]
    async batched_purge_removes_exactly_the_expired_rows;
    #[tokio::test]
    async success_is_purged_after_its_grace_and_failures_after_their_retention;
    #[tokio::test]
    async default_retention_purges_success_at_expiry_and_keeps_failures_a_week;
    #[tokio::test]
    async inbox_messages_are_purged_the_same_way;
    #[tokio::test]
    async stale_processing_is_reported_and_left_alone_by_default;
    #[tokio::test]
    async stale_processing_is_marked_failed_and_retryable_when_configured;
    #[tokio::test]
    async rows_locked_by_live_traffic_are_skipped_not_waited_for;
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async concurrent_sweepers_purge_each_row_exactly_once;
    #[tokio::test]
    async a_spawned_sweeper_purges_on_every_tick_and_stops_on_shutdown;
    #[tokio::test]
    async shutdown_does_not_wait_for_the_next_interval;
    #[tokio::test]
    async admin_lookup_finds_a_record_by_scope_and_key;
    #[tokio::test]
    async admin_lookup_shows_no_key_unless_the_layer_stores_it;
    #[tokio::test]
    async admin_stale_lists_processing_rows_past_their_lease_oldest_first;
    #[tokio::test]
    async admin_shows_inbox_messages_and_failed_ones;
    #[tokio::test]
    async admin_purge_now_uses_the_default_retention;
    #[test]
    sync a_sweep_emits_the_documented_metrics;
}
