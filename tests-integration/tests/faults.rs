//! Fault injection against real PostgreSQL: the link cut mid-handler and after COMMIT was
//! sent, the backend terminated, the app killed with SIGKILL, the inbox under the same
//! cuts. Every key executes at most once, and its retry ends in exactly one execution.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::http::StatusCode;
use axum_idempotency::inbox::Outcome;
use axum_idempotency::postgres::IdempotentTx;
use axum_idempotency::{Error, IdempotencyLayer, Inbox, InboxError};
use common::proxy::{COMMIT_QUERY, Proxy};
use common::*;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;

const BOUND: Duration = Duration::from_secs(20);

fn assert_5xx(answer: &Answer) {
    assert!(
        answer.status.is_server_error(),
        "expected a 5xx, got {} {:?}",
        answer.status,
        answer.body
    );
}

/// (a) The link drops while the handler holds its transaction open: the client gets a 5xx,
/// nothing commits, and the retry runs once on a fresh connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn link_cut_mid_handler_rolls_back_and_the_retry_runs_once() {
    if !common::Database::Postgres.configured() {
        return;
    }
    let db = TestDb::new(1).await;
    let proxy = Proxy::start().await;
    let pool = proxy.pool(&db.schema, 1);
    let (knobs, gate) = gated();
    let app = router(Arc::clone(&knobs), IdempotencyLayer::new(pool.clone()));
    let body = json!({"amount": 11});

    let first = tokio::spawn({
        let (app, body) = (app.clone(), body.clone());
        async move { send(&app, post_json("/orders", Some("cut-mid"), &body)).await }
    });
    knobs.wait_inserted().await;
    proxy.cut_all();
    gate.add_permits(1);
    let first = tokio::time::timeout(BOUND, first).await.unwrap().unwrap();
    assert_5xx(&first);
    assert_eq!(first.problem_code(), "commit_failed");

    db.assert_settles().await;
    assert_eq!((db.orders().await, db.records().await), (0, 0));

    gate.add_permits(1);
    let retry = tokio::time::timeout(
        BOUND,
        send(&app, post_json("/orders", Some("cut-mid"), &body)),
    )
    .await
    .unwrap();
    assert_eq!(retry.status, StatusCode::CREATED, "{:?}", retry.body);
    assert!(!retry.replayed());
    assert_eq!(knobs.calls(), 2);
    assert_eq!((db.orders().await, db.records().await), (1, 1));
    assert!(proxy.accepted() >= 2, "the pool opened a new connection");
    db.assert_settles().await;
}

/// (b) COMMIT reaches the server but its answer never reaches the app: the outcome is
/// unknown to the app, so the client gets a 5xx; the retry replays the committed result or
/// runs once — never twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn link_cut_after_commit_was_sent_never_runs_twice() {
    if !common::Database::Postgres.configured() {
        return;
    }
    let db = TestDb::new(1).await;
    let proxy = Proxy::start().await;
    let pool = proxy.pool(&db.schema, 1);
    let knobs = Arc::new(Knobs::default());
    let app = router(Arc::clone(&knobs), IdempotencyLayer::new(pool.clone()));
    let body = json!({"amount": 12});

    proxy.cut_on(COMMIT_QUERY, true);
    let first = tokio::time::timeout(
        BOUND,
        send(&app, post_json("/orders", Some("lost-ack"), &body)),
    )
    .await
    .unwrap();
    proxy.wait_fired(BOUND).await;
    assert_5xx(&first);
    assert_eq!(first.problem_code(), "commit_failed");
    db.assert_settles().await;

    let retry = tokio::time::timeout(
        BOUND,
        send(&app, post_json("/orders", Some("lost-ack"), &body)),
    )
    .await
    .unwrap();
    assert!(
        retry.status.is_success(),
        "{} {:?}",
        retry.status,
        retry.body
    );
    assert_eq!(retry.status, StatusCode::CREATED);
    assert_eq!(db.orders().await, 1, "executed exactly once");
    assert_eq!(db.records().await, 1);
    // The COMMIT was forwarded and the server had time to read it: it committed, so the
    // retry is a replay and the handler ran once.
    assert!(retry.replayed(), "the committed result is replayed");
    assert_eq!(knobs.calls(), 1);
    db.assert_settles().await;
}

/// The same cut with the COMMIT withheld: nothing commits, the retry runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn link_cut_before_commit_was_sent_rolls_back_and_the_retry_runs_once() {
    if !common::Database::Postgres.configured() {
        return;
    }
    let db = TestDb::new(1).await;
    let proxy = Proxy::start().await;
    let pool = proxy.pool(&db.schema, 1);
    let knobs = Arc::new(Knobs::default());
    let app = router(Arc::clone(&knobs), IdempotencyLayer::new(pool.clone()));
    let body = json!({"amount": 13});

    proxy.cut_on(COMMIT_QUERY, false);
    let first = tokio::time::timeout(
        BOUND,
        send(&app, post_json("/orders", Some("no-commit"), &body)),
    )
    .await
    .unwrap();
    proxy.wait_fired(BOUND).await;
    assert_5xx(&first);
    assert_eq!(first.problem_code(), "commit_failed");
    db.assert_settles().await;
    assert_eq!((db.orders().await, db.records().await), (0, 0));

    let retry = tokio::time::timeout(
        BOUND,
        send(&app, post_json("/orders", Some("no-commit"), &body)),
    )
    .await
    .unwrap();
    assert_eq!(retry.status, StatusCode::CREATED, "{:?}", retry.body);
    assert!(!retry.replayed());
    assert_eq!(knobs.calls(), 2);
    assert_eq!((db.orders().await, db.records().await), (1, 1));
}

/// (c) The request's backend is terminated mid-handler: 5xx, nothing committed, and the
/// dead connection is not handed out again — the next requests succeed on the same pool of
/// size 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminated_backend_mid_handler_rolls_back_and_is_not_reused() {
    if !common::Database::Postgres.configured() {
        return;
    }
    let db = TestDb::new(1).await;
    let (knobs, gate) = gated();
    let app = router(Arc::clone(&knobs), IdempotencyLayer::new(db.pool.clone()));
    let body = json!({"amount": 14});

    let first = tokio::spawn({
        let (app, body) = (app.clone(), body.clone());
        async move { send(&app, post_json("/orders", Some("killed"), &body)).await }
    });
    knobs.wait_inserted().await;
    let pid: i32 = db
        .admin
        .query_one(
            "SELECT pid FROM pg_stat_activity \
             WHERE application_name = $1 AND state LIKE 'idle in transaction%'",
            &[&db.schema],
        )
        .await
        .unwrap()
        .get(0);
    let terminated: bool = db
        .admin
        .query_one("SELECT pg_terminate_backend($1)", &[&pid])
        .await
        .unwrap()
        .get(0);
    assert!(terminated);
    eventually("the backend to exit", async || {
        db.admin
            .query_opt("SELECT 1 FROM pg_stat_activity WHERE pid = $1", &[&pid])
            .await
            .unwrap()
            .is_none()
    })
    .await;
    gate.add_permits(1);
    let first = tokio::time::timeout(BOUND, first).await.unwrap().unwrap();
    assert_5xx(&first);
    assert_eq!((db.orders().await, db.records().await), (0, 0));

    // The pool's only slot gets a new backend; the retry and another key both run once.
    gate.add_permits(2);
    let retry = tokio::time::timeout(
        BOUND,
        send(&app, post_json("/orders", Some("killed"), &body)),
    )
    .await
    .unwrap();
    assert_eq!(retry.status, StatusCode::CREATED, "{:?}", retry.body);
    let other = tokio::time::timeout(
        BOUND,
        send(&app, post_json("/orders", Some("after"), &body)),
    )
    .await
    .unwrap();
    assert_eq!(other.status, StatusCode::CREATED, "{:?}", other.body);
    assert_eq!(knobs.calls(), 3);
    assert_eq!((db.orders().await, db.records().await), (2, 2));
    let backends: Vec<i32> = db
        .admin
        .query(
            "SELECT pid FROM pg_stat_activity WHERE application_name = $1",
            &[&db.schema],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(backends.len(), 1, "one pooled backend: {backends:?}");
    assert_ne!(backends[0], pid, "the terminated backend is gone");
    db.assert_settles().await;
}

// ---------------------------------------------------------------------------------------
// (e) The example app killed with SIGKILL mid-handler.

/// One HTTP/1.1 exchange: the status, or `None` if the connection broke first.
async fn try_http(addr: &str, request: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect(addr).await.ok()?;
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await.ok()?;
    let status = response.get(9..12)?.parse().ok()?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Some((status, body))
}

fn post_order(key: &str, amount: i64) -> String {
    let body = format!(r#"{{"user_id": 1001, "amount": {amount}}}"#);
    format!(
        "POST /orders HTTP/1.1\r\nhost: x\r\nconnection: close\r\nidempotency-key: {key}\r\n\
         x-user-id: 1001\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn app_killed_mid_handler_the_retry_runs_exactly_once() {
    if !common::Database::Postgres.configured() {
        return;
    }
    let db = TestDb::bare(1).await;
    let (mut child, addr) =
        start_orders_example(&[("DATABASE_URL", &schema_url(&db.schema))]).await;

    // Hold the orders table so the POST waits inside its handler.
    let blocker = connect(&database_url()).await;
    blocker
        .batch_execute(&format!(
            "BEGIN; LOCK TABLE {}.orders IN EXCLUSIVE MODE",
            db.schema
        ))
        .await
        .unwrap();
    let pending = tokio::spawn({
        let addr = addr.clone();
        async move { try_http(&addr, &post_order("sigkill-1", 42)).await }
    });
    let waiting = format!(
        "SELECT count(*) FROM pg_locks WHERE relation = '{}.orders'::regclass AND NOT granted",
        db.schema
    );
    eventually("the handler to block on the orders table", async || {
        let count: i64 = db.admin.query_one(&waiting, &[]).await.unwrap().get(0);
        count > 0
    })
    .await;

    child.start_kill().unwrap(); // SIGKILL
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(!status.success());
    let lost = tokio::time::timeout(BOUND, pending).await.unwrap().unwrap();
    assert!(lost.is_none(), "the client got no answer: {lost:?}");
    blocker.batch_execute("ROLLBACK").await.unwrap();

    let (mut child, addr) =
        start_orders_example(&[("DATABASE_URL", &schema_url(&db.schema))]).await;
    // The killed app's backend ends once it sees its client gone; until then the key may
    // still be in flight (409).
    let mut answer = None;
    for _ in 0..100 {
        match try_http(&addr, &post_order("sigkill-1", 42)).await {
            Some((409, _)) => tokio::time::sleep(Duration::from_millis(100)).await,
            other => {
                answer = other;
                break;
            }
        }
    }
    let (status, body) = answer.expect("the retry got an answer");
    assert_eq!(status, 201, "{body}");
    let orders = db.scalar("SELECT count(*) FROM orders").await;
    assert_eq!(orders, 1, "exactly one order");
    let (status, replay) = try_http(&addr, &post_order("sigkill-1", 42)).await.unwrap();
    assert_eq!((status, replay.as_str()), (201, body.as_str()));
    child.start_kill().unwrap();
    let _ = tokio::time::timeout(Duration::from_secs(10), child.wait()).await;
}

// ---------------------------------------------------------------------------------------
// (f) The inbox under the same cuts.

async fn grant(tx: &IdempotentTx) -> Result<(), Error> {
    tx.execute("INSERT INTO orders (user_id, amount) VALUES (1, 50)", &[])
        .await
        .map(drop)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbox_redelivery_after_a_cut_mid_work_processes_once() {
    if !common::Database::Postgres.configured() {
        return;
    }
    let db = TestDb::new(1).await;
    let proxy = Proxy::start().await;
    let inbox = Inbox::new(proxy.pool(&db.schema, 1), "faults");
    let runs = Arc::new(AtomicUsize::new(0));
    let inserted = Arc::new(Semaphore::new(0));
    let gate = Arc::new(Semaphore::new(0));

    let first = tokio::spawn({
        let (inbox, runs, inserted, gate) = (
            inbox.clone(),
            Arc::clone(&runs),
            Arc::clone(&inserted),
            Arc::clone(&gate),
        );
        async move {
            inbox
                .process("msg-cut", |tx| async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    grant(&tx).await?;
                    inserted.add_permits(1);
                    gate.acquire().await.unwrap().forget();
                    Ok::<_, Error>(())
                })
                .await
        }
    });
    tokio::time::timeout(BOUND, inserted.acquire())
        .await
        .unwrap()
        .unwrap()
        .forget();
    proxy.cut_all();
    gate.add_permits(1);
    let first = tokio::time::timeout(BOUND, first).await.unwrap().unwrap();
    assert!(
        matches!(first, Err(InboxError::Store(_))),
        "the commit fails: {first:?}"
    );
    db.assert_settles().await;
    assert_eq!(db.orders().await, 0);

    for expected in ["processed", "duplicate"] {
        let runs = Arc::clone(&runs);
        let outcome = tokio::time::timeout(
            BOUND,
            inbox.process("msg-cut", |tx| async move {
                runs.fetch_add(1, Ordering::SeqCst);
                grant(&tx).await
            }),
        )
        .await
        .unwrap()
        .unwrap();
        match (expected, outcome) {
            ("processed", Outcome::Processed(())) | ("duplicate", Outcome::Duplicate { .. }) => {}
            (expected, outcome) => panic!("expected {expected}, got {outcome:?}"),
        }
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "the cut run and one redelivery"
    );
    assert_eq!(db.orders().await, 1, "processed exactly once");
    db.assert_settles().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbox_redelivery_after_a_cut_after_commit_processes_once() {
    if !common::Database::Postgres.configured() {
        return;
    }
    let db = TestDb::new(1).await;
    let proxy = Proxy::start().await;
    let inbox = Inbox::new(proxy.pool(&db.schema, 1), "faults");
    let runs = Arc::new(AtomicUsize::new(0));

    proxy.cut_on(COMMIT_QUERY, true);
    let first = tokio::time::timeout(
        BOUND,
        inbox.process("msg-ack", |tx| {
            let runs = Arc::clone(&runs);
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                grant(&tx).await
            }
        }),
    )
    .await
    .unwrap();
    proxy.wait_fired(BOUND).await;
    assert!(
        matches!(first, Err(InboxError::Store(_))),
        "the outcome is unknown to the consumer: {first:?}"
    );
    db.assert_settles().await;

    // The broker redelivers: processed once in all, whichever way the COMMIT went.
    let mut outcomes = Vec::new();
    for _ in 0..2 {
        let runs = Arc::clone(&runs);
        let outcome = tokio::time::timeout(
            BOUND,
            inbox.process("msg-ack", |tx| async move {
                runs.fetch_add(1, Ordering::SeqCst);
                grant(&tx).await
            }),
        )
        .await
        .unwrap()
        .unwrap();
        assert!(
            matches!(outcome, Outcome::Processed(()) | Outcome::Duplicate { .. }),
            "{outcome:?}"
        );
        outcomes.push(outcome);
    }
    assert!(matches!(outcomes[1], Outcome::Duplicate { .. }));
    assert_eq!(db.orders().await, 1, "processed exactly once");
    // The forwarded COMMIT took effect: the redelivery is a duplicate, the work ran once.
    assert!(
        matches!(outcomes[0], Outcome::Duplicate { .. }),
        "{outcomes:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    db.assert_settles().await;
}
