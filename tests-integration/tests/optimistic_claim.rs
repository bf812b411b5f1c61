//! The optimistic claim's race windows (`ClaimMode::Optimistic`, tokio-postgres over
//! deadpool and bb8), each driven deterministically: an `AFTER INSERT` trigger on the
//! records table holds the inserting transaction open — the record inserted, not
//! committed — until the test opens its gate, so a twin's record insert meets the
//! winner's uncommitted key.
//!
//! The locked claim's counterparts are in `tests/lazy_claim.rs`: there a twin is refused
//! by the key's lock at its first statement and never runs its statements.

mod common;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::http::StatusCode;
use axum_idempotency::{ClaimMode, IdempotencyLayer};
use common::*;
use serde_json::json;

/// A gate on the records table: every record insert waits, its transaction open, until
/// [`open`](Self::open).
struct RecordGate<'a> {
    db: &'a TestDb,
}

impl<'a> RecordGate<'a> {
    async fn install(db: &'a TestDb) -> Self {
        db.admin
            .batch_execute(&format!(
                "CREATE TABLE {0}.gate (open bool NOT NULL); INSERT INTO {0}.gate VALUES (false);
                 CREATE FUNCTION {0}.hold_record() RETURNS trigger LANGUAGE plpgsql AS $$
                 BEGIN
                     WHILE NOT (SELECT open FROM {0}.gate) LOOP
                         PERFORM pg_sleep(0.01);
                     END LOOP;
                     RETURN NULL;
                 END $$;
                 CREATE TRIGGER hold_record AFTER INSERT ON {0}.idempotency_records
                     FOR EACH ROW EXECUTE FUNCTION {0}.hold_record();",
                db.schema
            ))
            .await
            .unwrap();
        Self { db }
    }

    async fn open(&self) {
        self.db
            .admin
            .batch_execute(&format!("UPDATE {}.gate SET open = true", self.db.schema))
            .await
            .unwrap();
    }

    /// Waits until `n` sessions of this test wait on `event` (`PgSleep`: held at the
    /// gate; `transactionid`: a record insert waiting on another's uncommitted key).
    async fn wait_for(&self, event: &str, n: i64) {
        for _ in 0..500 {
            let waiting: i64 = self
                .db
                .admin
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity \
                     WHERE wait_event = $1 AND datname = current_database()",
                    &[&event],
                )
                .await
                .unwrap()
                .get(0);
            if waiting >= n {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("no {n} sessions waited on {event} within 5 s");
    }
}

fn optimistic<S: axum_idempotency::LeaseStore>(layer: IdempotencyLayer<S>) -> IdempotencyLayer<S> {
    layer.claim_mode(ClaimMode::Optimistic)
}

fn app<D: PgDriver>(db: &TestDb, knobs: &Arc<Knobs>, mode: ClaimMode) -> Router {
    router(
        Arc::clone(knobs),
        IdempotencyLayer::new(D::pool(db)).claim_mode(mode),
    )
}

/// The twin's record insert waits on the winner's uncommitted key; the winner commits;
/// the twin's insert fails on the key, its work rolls back, and it is answered with the
/// winner's response, byte for byte. `winner` and `twin` may be in different modes (a
/// rolling deploy): the key decides either way.
async fn twin_waits_on_the_uncommitted_key_then_replays<D: PgDriver>(
    winner: ClaimMode,
    twin: ClaimMode,
) {
    let db = TestDb::new(4).await;
    let gate = RecordGate::install(&db).await;
    let knobs = Arc::new(Knobs::default());
    let (first_app, twin_app) = (app::<D>(&db, &knobs, winner), app::<D>(&db, &knobs, twin));
    let body = json!({"amount": 5});
    let first = tokio::spawn({
        let request = post_json("/orders", Some("twin-1"), &body);
        async move { send(&first_app, request).await }
    });
    gate.wait_for("PgSleep", 1).await;
    let second = tokio::spawn({
        let request = post_json("/orders", Some("twin-1"), &body);
        async move { send(&twin_app, request).await }
    });
    gate.wait_for("transactionid", 1).await;
    assert_eq!(knobs.calls(), 2, "the twin ran its statements");
    assert!(!second.is_finished(), "the twin waits on the winner's key");
    gate.open().await;
    let (first, second) = (first.await.unwrap(), second.await.unwrap());
    assert_eq!(first.status, StatusCode::CREATED, "{:?}", first.body);
    assert!(!first.replayed());
    assert_eq!(second.status, StatusCode::CREATED, "{:?}", second.body);
    assert!(second.replayed(), "the twin is answered from the record");
    assert_eq!(second.body, first.body, "byte for byte");
    assert_eq!(
        (db.orders().await, db.records().await),
        (1, 1),
        "the twin's work rolled back"
    );
    db.assert_settles().await;
}

async fn an_optimistic_twin_waits_on_the_uncommitted_key_then_replays<D: PgDriver>() {
    twin_waits_on_the_uncommitted_key_then_replays::<D>(
        ClaimMode::Optimistic,
        ClaimMode::Optimistic,
    )
    .await;
}

/// A rolling deploy: the winner optimistic (it takes no lock), its twin locked (its lock
/// is free, its look-up sees no committed record): the twin runs, and its record insert
/// meets the winner's key.
async fn a_locked_twin_of_an_optimistic_winner_is_answered_from_its_record<D: PgDriver>() {
    twin_waits_on_the_uncommitted_key_then_replays::<D>(ClaimMode::Optimistic, ClaimMode::Locked)
        .await;
}

/// The other half of the rolling deploy: the winner locked, its twin optimistic (no lock
/// attempt, so the winner's lock does not stop it): the key decides.
async fn an_optimistic_twin_of_a_locked_winner_is_answered_from_its_record<D: PgDriver>() {
    twin_waits_on_the_uncommitted_key_then_replays::<D>(ClaimMode::Locked, ClaimMode::Optimistic)
        .await;
}

/// The winner rolls back (its COMMIT fails on a deferred constraint) while its twin waits
/// on its key: the twin's insert then succeeds and its work commits — the work takes
/// effect once.
async fn a_winner_that_rolls_back_lets_its_waiting_twin_commit<D: PgDriver>() {
    let db = TestDb::new(4).await;
    let gate = RecordGate::install(&db).await;
    let knobs = Arc::new(Knobs::default());
    knobs
        .fail_commit_once
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let app = router(
        Arc::clone(&knobs),
        optimistic(IdempotencyLayer::new(D::pool(&db))),
    );
    let body = json!({"amount": 5});
    let first = tokio::spawn({
        let (app, request) = (app.clone(), post_json("/orders", Some("rb-1"), &body));
        async move { send(&app, request).await }
    });
    gate.wait_for("PgSleep", 1).await;
    let second = tokio::spawn({
        let (app, request) = (app.clone(), post_json("/orders", Some("rb-1"), &body));
        async move { send(&app, request).await }
    });
    gate.wait_for("transactionid", 1).await;
    gate.open().await;
    let (first, second) = (first.await.unwrap(), second.await.unwrap());
    assert!(
        first.status.is_server_error(),
        "the winner's commit failed: {:?}",
        first.body
    );
    assert_eq!(second.status, StatusCode::CREATED, "{:?}", second.body);
    assert!(!second.replayed(), "the twin's own work committed");
    assert_eq!((db.orders().await, db.records().await), (1, 1));
    let retry = send(&app, post_json("/orders", Some("rb-1"), &body)).await;
    assert!(retry.replayed());
    assert_eq!(retry.body, second.body);
    db.assert_settles().await;
}

/// A twin with another payload waits on the winner's key, then is answered 422
/// `key_reused`; nothing of its work commits.
async fn a_twin_with_another_payload_is_answered_422_and_commits_nothing<D: PgDriver>() {
    let db = TestDb::new(4).await;
    let gate = RecordGate::install(&db).await;
    let knobs = Arc::new(Knobs::default());
    let app = router(
        Arc::clone(&knobs),
        optimistic(IdempotencyLayer::new(D::pool(&db))),
    );
    let first = tokio::spawn({
        let request = post_json("/orders", Some("fp-1"), &json!({"amount": 5}));
        let app = app.clone();
        async move { send(&app, request).await }
    });
    gate.wait_for("PgSleep", 1).await;
    let second = tokio::spawn({
        let request = post_json("/orders", Some("fp-1"), &json!({"amount": 6}));
        let app = app.clone();
        async move { send(&app, request).await }
    });
    gate.wait_for("transactionid", 1).await;
    gate.open().await;
    let (first, second) = (first.await.unwrap(), second.await.unwrap());
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(
        second.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{:?}",
        second.body
    );
    assert_eq!(second.problem_code(), "key_reused");
    assert_eq!((db.orders().await, db.records().await), (1, 1));
    assert_eq!(
        db.scalar("SELECT count(*) FROM orders WHERE amount = 6")
            .await,
        0,
        "nothing of the twin's work"
    );
    db.assert_settles().await;
}

/// A twin whose wait on the winner's key passes its bound (here the layer's in-flight
/// wait, 300 ms) is answered 409 `in_flight` with `Retry-After`, its work rolled back,
/// while the winner still runs.
async fn a_twin_past_its_bound_is_answered_409_and_rolls_back<D: PgDriver>() {
    let db = TestDb::new(4).await;
    let gate = RecordGate::install(&db).await;
    let knobs = Arc::new(Knobs::default());
    let layer = optimistic(IdempotencyLayer::new(D::pool(&db)))
        .wait_for_in_flight(Duration::from_millis(300));
    let app = router(Arc::clone(&knobs), layer);
    let body = json!({"amount": 5});
    let first = tokio::spawn({
        let (app, request) = (app.clone(), post_json("/orders", Some("bound-1"), &body));
        async move { send(&app, request).await }
    });
    gate.wait_for("PgSleep", 1).await;
    let started = std::time::Instant::now();
    let second = tokio::time::timeout(
        Duration::from_secs(10),
        send(&app, post_json("/orders", Some("bound-1"), &body)),
    )
    .await
    .expect("the twin's wait was not bounded");
    let waited = started.elapsed();
    assert_eq!(second.status, StatusCode::CONFLICT, "{:?}", second.body);
    assert_eq!(second.problem_code(), "in_flight");
    assert!(second.headers.contains_key("retry-after"));
    assert!(
        waited >= Duration::from_millis(300),
        "answered after {waited:?}"
    );
    assert!(!first.is_finished(), "the winner still runs");
    eprintln!("a twin past its 300 ms bound answered after {waited:?}");
    gate.open().await;
    assert_eq!(first.await.unwrap().status, StatusCode::CREATED);
    assert_eq!((db.orders().await, db.records().await), (1, 1));
    db.assert_settles().await;
}

/// 64 concurrent requests with one key, pool of 16: exactly one order and one record;
/// every answer a 201 (the first, or a replay of it, byte for byte) or 409. Locked, only
/// one handler gets past its first statement; optimistic, every twin runs its statements
/// (and rolls them back).
async fn a_storm_of_one_key_commits_once<D: PgDriver>(mode: ClaimMode) -> usize {
    let db = TestDb::new(16).await;
    let knobs = Arc::new(Knobs::default());
    let app = router(
        Arc::clone(&knobs),
        IdempotencyLayer::new(D::pool(&db)).claim_mode(mode),
    );
    let body = json!({"amount": 7});
    let answers = futures_util::future::join_all((0..64).map(|_| {
        let (app, request) = (app.clone(), post_json("/orders", Some("storm-1"), &body));
        tokio::spawn(async move { send(&app, request).await })
    }))
    .await;
    let mut created = Vec::new();
    for answer in answers {
        let answer = answer.unwrap();
        match answer.status {
            StatusCode::CREATED => created.push(answer.body),
            StatusCode::CONFLICT => assert_eq!(answer.problem_code(), "in_flight"),
            status => panic!("{status}: {:?}", answer.body),
        }
    }
    assert!(!created.is_empty());
    assert!(created.windows(2).all(|w| w[0] == w[1]), "one answer");
    assert_eq!((db.orders().await, db.records().await), (1, 1));
    eprintln!(
        "storm of 64 ({mode:?}): {} handlers past their first statement for one order",
        knobs.calls()
    );
    db.assert_settles().await;
    knobs.calls()
}

async fn a_locked_storm_runs_one_handler_past_its_first_statement<D: PgDriver>() {
    assert_eq!(
        a_storm_of_one_key_commits_once::<D>(ClaimMode::Locked).await,
        1
    );
}

async fn an_optimistic_storm_commits_once<D: PgDriver>() {
    assert!(a_storm_of_one_key_commits_once::<D>(ClaimMode::Optimistic).await >= 1);
}

/// The gate's waits are counted across the database: these tests take turns.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The tests above on the drivers that have the optimistic claim.
macro_rules! on_tokio_postgres {
    ($($name:ident;)*) => {
        mod deadpool {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $name() {
                if !<crate::common::Deadpool as crate::common::Driver>::DATABASE.configured() {
                    return;
                }
                let _turn = super::SERIAL.lock().await;
                super::$name::<crate::common::Deadpool>().await
            })*
        }
        #[cfg(feature = "bb8")]
        mod bb8 {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $name() {
                if !<crate::common::Bb8 as crate::common::Driver>::DATABASE.configured() {
                    return;
                }
                let _turn = super::SERIAL.lock().await;
                super::$name::<crate::common::Bb8>().await
            })*
        }
    };
}

on_tokio_postgres! {
    an_optimistic_twin_waits_on_the_uncommitted_key_then_replays;
    a_locked_twin_of_an_optimistic_winner_is_answered_from_its_record;
    an_optimistic_twin_of_a_locked_winner_is_answered_from_its_record;
    a_winner_that_rolls_back_lets_its_waiting_twin_commit;
    a_twin_with_another_payload_is_answered_422_and_commits_nothing;
    a_twin_past_its_bound_is_answered_409_and_rolls_back;
    a_locked_storm_runs_one_handler_past_its_first_statement;
    an_optimistic_storm_commits_once;
}
