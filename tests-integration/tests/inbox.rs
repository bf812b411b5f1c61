//! The Inbox on every database: once per (consumer group, message id), failures recorded,
//! poison messages given up on.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum_idempotency::inbox::Outcome;
use axum_idempotency::{Error, Inbox, InboxError};
use common::*;
use sha2::{Digest, Sha256};
use tokio::sync::Semaphore;

async fn grant(tx: &mut impl TestTx, user: i64) -> Result<(), Error> {
    tx.insert_order(user, 50).await.map(drop)
}

async fn record(db: &impl TestDatabase, group: &str, id: &str) -> Option<MessageColumns> {
    db.message_record(group, id).await
}

async fn a_message_is_processed_once_and_its_redelivery_is_a_duplicate<D: Driver>() {
    let db = D::db(2).await;
    let inbox = Inbox::new(D::pool(&db), "coupons");
    let runs = &AtomicUsize::new(0);
    let payload = br#"{"user_id":1001,"coupon_code":"NEW_USER_50"}"#;
    for expected in ["processed", "duplicate", "duplicate"] {
        let outcome = inbox
            .process_payload("msg-001", payload, |mut tx| async move {
                runs.fetch_add(1, Ordering::SeqCst);
                grant(&mut tx, 1001).await
            })
            .await
            .unwrap();
        match (expected, outcome) {
            ("processed", Outcome::Processed(())) => {}
            ("duplicate", Outcome::Duplicate { attempts: 1 }) => {}
            (expected, outcome) => panic!("expected {expected}, got {outcome:?}"),
        }
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(db.orders().await, 1);
    let row = record(&db, "coupons", "msg-001").await.unwrap();
    assert_eq!(row.status, "SUCCESS");
    assert_eq!(row.attempts, 1);
    assert_eq!(row.payload_digest, Some(Sha256::digest(payload).to_vec()));
    assert_eq!(row.payload, None, "the payload is not kept by default");
    db.assert_settles().await;
}

async fn the_payload_is_kept_only_when_asked<D: Driver>() {
    let db = D::db(2).await;
    let inbox = Inbox::new(D::pool(&db), "audit").store_payload(true);
    inbox
        .process_payload(
            "m-1",
            b"body",
            |mut tx| async move { grant(&mut tx, 1).await },
        )
        .await
        .unwrap();
    let row = record(&db, "audit", "m-1").await.unwrap();
    assert_eq!(row.payload.as_deref(), Some(&b"body"[..]));
}

async fn consumer_groups_are_independent<D: Driver>() {
    let db = D::db(2).await;
    for group in ["coupons", "points"] {
        let inbox = Inbox::new(D::pool(&db), group);
        let outcome = inbox
            .process("msg-7", |mut tx| async move { grant(&mut tx, 7).await })
            .await
            .unwrap();
        assert_eq!(outcome, Outcome::Processed(()), "{group}");
    }
    assert_eq!(db.orders().await, 2);
}

async fn two_workers_with_the_same_message_run_it_once<D: Driver>() {
    let db = D::db(8).await;
    let inbox = Inbox::new(D::pool(&db), "coupons");
    let runs = Arc::new(AtomicUsize::new(0));
    let start = Arc::new(tokio::sync::Barrier::new(8));
    let workers: Vec<_> = (0..8)
        .map(|_| {
            let (inbox, runs, start) = (inbox.clone(), Arc::clone(&runs), Arc::clone(&start));
            tokio::spawn(async move {
                start.wait().await;
                inbox
                    .process("msg-race", |mut tx| async move {
                        runs.fetch_add(1, Ordering::SeqCst);
                        grant(&mut tx, 1).await?;
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        Ok::<_, Error>(())
                    })
                    .await
                    .unwrap()
            })
        })
        .collect();
    let mut processed = 0;
    for worker in workers {
        match worker.await.unwrap() {
            Outcome::Processed(()) => processed += 1,
            Outcome::Duplicate { .. } => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(processed, 1);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(db.orders().await, 1);
    db.assert_settles().await;
}

async fn failures_roll_back_are_recorded_and_end_in_give_up<D: Driver>() {
    let db = D::db(2).await;
    let inbox = Inbox::new(D::pool(&db), "coupons").max_attempts(3);
    let runs = &AtomicUsize::new(0);

    let first = inbox
        .process("poison", |mut tx| async move {
            runs.fetch_add(1, Ordering::SeqCst);
            grant(&mut tx, 1).await.unwrap();
            Err::<(), _>("coupon service said no")
        })
        .await;
    assert!(
        matches!(
            first,
            Err(InboxError::Failed {
                attempts: 1,
                error: "coupon service said no"
            })
        ),
        "{first:?}"
    );
    assert_eq!(db.orders().await, 0, "the work was rolled back");
    let row = record(&db, "coupons", "poison").await.unwrap();
    assert_eq!(row.status, "FAILED");
    assert_eq!(row.attempts, 1);
    assert_eq!(row.last_error.as_deref(), Some("coupon service said no"));

    let second = inbox
        .process("poison", |mut tx| async move {
            runs.fetch_add(1, Ordering::SeqCst);
            grant(&mut tx, 1).await.unwrap();
            if runs.load(Ordering::SeqCst) > 0 {
                panic!("consumer bug");
            }
            Ok::<(), &str>(())
        })
        .await;
    assert!(
        matches!(&second, Err(InboxError::Panicked { attempts: 2, message }) if message == "consumer bug"),
        "{second:?}"
    );

    let third = inbox
        .process("poison", |_tx| async move {
            runs.fetch_add(1, Ordering::SeqCst);
            Err::<(), _>("still no")
        })
        .await;
    assert!(matches!(third, Err(InboxError::Failed { attempts: 3, .. })));

    let fourth = inbox
        .process("poison", |_tx| async move {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<(), &str>(())
        })
        .await
        .unwrap();
    assert_eq!(
        fourth,
        Outcome::GaveUp {
            attempts: 3,
            last_error: Some("still no".to_owned())
        }
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        3,
        "a given-up message does not run again"
    );
    assert_eq!(db.orders().await, 0);
    db.assert_settles().await;
}

async fn a_retry_after_a_failure_can_succeed<D: Driver>() {
    let db = D::db(2).await;
    let inbox = Inbox::new(D::pool(&db), "coupons");
    let failed = inbox
        .process("flaky", |_tx| async { Err::<(), _>("timeout") })
        .await;
    assert!(matches!(
        failed,
        Err(InboxError::Failed { attempts: 1, .. })
    ));
    let outcome = inbox
        .process("flaky", |mut tx| async move { grant(&mut tx, 2).await })
        .await
        .unwrap();
    assert_eq!(outcome, Outcome::Processed(()));
    let row = record(&db, "coupons", "flaky").await.unwrap();
    assert_eq!(row.status, "SUCCESS");
    assert_eq!(row.attempts, 2);
    assert_eq!(row.last_error, None);
    assert_eq!(
        inbox
            .process("flaky", |_tx| async { Ok::<(), &str>(()) })
            .await
            .unwrap(),
        Outcome::Duplicate { attempts: 2 }
    );
}

async fn invalid_message_ids_are_refused_cleanly<D: Driver>() {
    let db = D::db(1).await;
    let inbox = Inbox::new(D::pool(&db), "coupons");
    let long = "m".repeat(256);
    for id in [
        "",
        long.as_str(),
        "two words",
        "caf\u{e9}",
        "tab\t",
        "nul\0",
    ] {
        let outcome = inbox.process(id, |_tx| async { Ok::<(), &str>(()) }).await;
        assert!(
            matches!(outcome, Err(InboxError::InvalidMessageId(_))),
            "{id:?}: {outcome:?}"
        );
    }
    assert_eq!(db.scalar("SELECT count(*) FROM inbox_messages").await, 0);
}

async fn an_expired_record_lets_the_message_run_again<D: Driver>() {
    let db = D::db(1).await;
    let inbox = Inbox::new(D::pool(&db), "coupons");
    inbox
        .process("old", |mut tx| async move { grant(&mut tx, 1).await })
        .await
        .unwrap();
    db.expire_messages().await;
    let outcome = inbox
        .process("old", |mut tx| async move { grant(&mut tx, 1).await })
        .await
        .unwrap();
    assert_eq!(outcome, Outcome::Processed(()));
    assert_eq!(db.orders().await, 2);
    assert_eq!(db.scalar("SELECT count(*) FROM inbox_messages").await, 1);
}

async fn a_worker_that_waits_too_long_reports_busy<D: Driver>() {
    let db = D::db(2).await;
    let inbox = Inbox::new(D::pool(&db), "coupons").lock_timeout(Duration::from_millis(200));
    let gate = Arc::new(Semaphore::new(0));
    let started = Arc::new(Semaphore::new(0));
    let first = tokio::spawn({
        let (inbox, gate, started) = (inbox.clone(), Arc::clone(&gate), Arc::clone(&started));
        async move {
            inbox
                .process("slow", |mut tx| async move {
                    grant(&mut tx, 1).await?;
                    started.add_permits(1);
                    let _ = gate.acquire().await;
                    Ok::<_, Error>(())
                })
                .await
                .unwrap()
        }
    });
    let _ = started.acquire().await.unwrap();
    let busy = inbox
        .process("slow", |_tx| async { Ok::<(), &str>(()) })
        .await;
    assert!(matches!(busy, Err(InboxError::Busy)), "{busy:?}");
    gate.add_permits(1);
    assert_eq!(first.await.unwrap(), Outcome::Processed(()));
    db.assert_settles().await;
}

async fn a_worker_killed_mid_work_leaves_nothing_and_the_retry_runs_once<D: Driver>() {
    let db = D::db(1).await;
    let inbox = Inbox::new(D::pool(&db), "coupons");
    let inserted = Arc::new(Semaphore::new(0));
    let doomed = tokio::spawn({
        let (inbox, inserted) = (inbox.clone(), Arc::clone(&inserted));
        async move {
            inbox
                .process("killed", |mut tx| async move {
                    grant(&mut tx, 1).await?;
                    inserted.add_permits(1);
                    std::future::pending::<()>().await;
                    Ok::<_, Error>(())
                })
                .await
        }
    });
    let _ = inserted.acquire().await.unwrap();
    doomed.abort();
    db.assert_settles().await;
    assert_eq!(db.orders().await, 0);
    let outcome = inbox
        .process("killed", |mut tx| async move { grant(&mut tx, 1).await })
        .await
        .unwrap();
    assert_eq!(outcome, Outcome::Processed(()));
    assert_eq!(db.orders().await, 1);
}

async fn an_expired_failure_restarts_the_attempt_count<D: Driver>() {
    let db = D::db(1).await;
    let inbox = Inbox::new(D::pool(&db), "coupons").max_attempts(2);
    for _ in 0..2 {
        let _ = inbox
            .process("stale-poison", |_tx| async { Err::<(), _>("no") })
            .await;
    }
    assert!(matches!(
        inbox
            .process("stale-poison", |_tx| async { Ok::<(), &str>(()) })
            .await,
        Ok(Outcome::GaveUp { attempts: 2, .. })
    ));
    db.expire_messages().await;
    // Past retention the message is new again: one more failure is attempt 1, not a give-up.
    let failed = inbox
        .process("stale-poison", |_tx| async { Err::<(), _>("again") })
        .await;
    assert!(
        matches!(failed, Err(InboxError::Failed { attempts: 1, .. })),
        "{failed:?}"
    );
    // And a success over the expired failure records SUCCESS with the work.
    let outcome = inbox
        .process(
            "stale-poison",
            |mut tx| async move { grant(&mut tx, 3).await },
        )
        .await
        .unwrap();
    assert_eq!(outcome, Outcome::Processed(()));
    let row = record(&db, "coupons", "stale-poison").await.unwrap();
    assert_eq!(row.status, "SUCCESS");
    assert_eq!(db.orders().await, 1);
}

/// Two schedulers fire the same slot at once: the job runs once, the other learns it ran.
/// A run that crashed mid-work rolled back, and the next firing runs it.
async fn a_scheduled_slot_runs_once_across_schedulers_and_again_after_a_crash<D: Driver>() {
    let db = D::db(4).await;
    let jobs = Inbox::new(D::pool(&db), "scheduler");
    let runs = Arc::new(AtomicUsize::new(0));

    // Day 1: the first run crashes after its write; nothing of it stays.
    let crashed = jobs
        .run_once("settle", "2026-12-01", |mut tx| async move {
            grant(&mut tx, 1).await?;
            Err::<(), _>(Error::TransactionEnded)
        })
        .await;
    assert!(matches!(
        crashed,
        Err(InboxError::Failed { attempts: 1, .. })
    ));
    assert_eq!(db.orders().await, 0);

    // Two schedulers fire the same slot at once (after a failover, say).
    let start = Arc::new(tokio::sync::Barrier::new(2));
    let firings: Vec<_> = (0..2)
        .map(|_| {
            let (jobs, runs, start) = (jobs.clone(), Arc::clone(&runs), Arc::clone(&start));
            tokio::spawn(async move {
                start.wait().await;
                jobs.run_once("settle", "2026-12-01", |mut tx| async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    grant(&mut tx, 1).await
                })
                .await
                .unwrap()
            })
        })
        .collect();
    let mut outcomes = Vec::new();
    for firing in firings {
        outcomes.push(firing.await.unwrap());
    }
    outcomes.sort_by_key(|o| matches!(o, Outcome::Duplicate { .. }));
    assert!(
        matches!(outcomes[0], Outcome::Processed(())),
        "{outcomes:?}"
    );
    assert!(
        matches!(outcomes[1], Outcome::Duplicate { attempts: 2 }),
        "{outcomes:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(db.orders().await, 1);

    // Another slot of the same job is another run.
    let next_day = jobs
        .run_once("settle", "2026-12-02", |mut tx| async move {
            grant(&mut tx, 2).await
        })
        .await
        .unwrap();
    assert_eq!(next_day, Outcome::Processed(()));
    assert_eq!(db.orders().await, 2);
}

/// A worker waiting for a message while another one fails it sees that failure before it
/// runs: the failed attempt is recorded under the message's lock, so with `max_attempts(1)`
/// the waiting worker gives up instead of running the work a second time.
async fn a_waiting_worker_sees_the_failed_attempt_before_it_runs<D: PgDriver>() {
    let db = TestDb::new(4).await;
    let inbox = Inbox::new(D::pool(&db), "coupons").max_attempts(1);
    let gate = Arc::new(Semaphore::new(0));
    let first = tokio::spawn({
        let (inbox, gate) = (inbox.clone(), Arc::clone(&gate));
        async move {
            inbox
                .process("poison", |mut tx| async move {
                    grant(&mut tx, 1).await?;
                    gate.acquire().await.unwrap().forget();
                    Err::<(), _>(Error::TransactionEnded)
                })
                .await
        }
    });
    // The first worker holds the message's lock.
    eventually("the first worker inside its work", async || {
        gate.available_permits() == 0 && db.advisory_locks().await > 0
    })
    .await;
    let second_ran = Arc::new(AtomicUsize::new(0));
    let second = tokio::spawn({
        let (inbox, second_ran) = (inbox.clone(), Arc::clone(&second_ran));
        async move {
            inbox
                .process("poison", |mut tx| async move {
                    second_ran.fetch_add(1, Ordering::SeqCst);
                    grant(&mut tx, 2).await
                })
                .await
        }
    });
    // The second worker waits for the lock before the first one fails.
    let waiting = "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
                   WHERE l.locktype = 'advisory' AND NOT l.granted AND a.application_name = $1";
    eventually("the second worker waiting for the lock", async || {
        let count: i64 = db
            .admin
            .query_one(waiting, &[&db.schema])
            .await
            .unwrap()
            .get(0);
        count > 0
    })
    .await;
    gate.add_permits(1);
    assert!(matches!(
        first.await.unwrap(),
        Err(InboxError::Failed { attempts: 1, .. })
    ));
    let outcome = second.await.unwrap().unwrap();
    assert!(
        matches!(outcome, Outcome::GaveUp { attempts: 1, .. }),
        "the waiting worker saw the failure: {outcome:?}"
    );
    assert_eq!(
        second_ran.load(Ordering::SeqCst),
        0,
        "and did not run the work"
    );
    assert_eq!(db.orders().await, 0);
    let row = record(&db, "coupons", "poison").await.unwrap();
    assert_eq!((row.status.clone(), row.attempts), ("FAILED".to_owned(), 1));
}

for_each_database! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async a_scheduled_slot_runs_once_across_schedulers_and_again_after_a_crash;
    #[tokio::test]
    async a_message_is_processed_once_and_its_redelivery_is_a_duplicate;
    #[tokio::test]
    async the_payload_is_kept_only_when_asked;
    #[tokio::test]
    async consumer_groups_are_independent;
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async two_workers_with_the_same_message_run_it_once;
    #[tokio::test]
    async failures_roll_back_are_recorded_and_end_in_give_up;
    #[tokio::test]
    async a_retry_after_a_failure_can_succeed;
    #[tokio::test]
    async invalid_message_ids_are_refused_cleanly;
    #[tokio::test]
    async an_expired_record_lets_the_message_run_again;
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async a_worker_that_waits_too_long_reports_busy;
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async a_worker_killed_mid_work_leaves_nothing_and_the_retry_runs_once;
    #[tokio::test]
    async an_expired_failure_restarts_the_attempt_count;
}

for_each_postgres_driver! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async a_waiting_worker_sees_the_failed_attempt_before_it_runs;
}
