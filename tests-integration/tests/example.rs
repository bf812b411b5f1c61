//! The orders example as a user runs it: a child process on an ephemeral port, driven over
//! real HTTP, its `/metrics` read back.

mod common;

use std::time::Duration;

use common::raw_http::*;
use common::*;

/// `POST /orders/{order_no}/pay`: NEW → PAID once, one `payment-succeeded` message in the
/// outbox (no relay runs without `AMQP_URL`), the same answer for a replay and for a second
/// key, 404 for an unknown order, 400 without a key.
async fn pays_once_and_enqueues_one_message(db: &TestDb, addr: &str, order_no: &str) {
    let (status, paid) = http(addr, &pay(order_no, Some("pay-1"))).await;
    assert_eq!(status, 200, "{paid}");
    let paid_json: serde_json::Value = serde_json::from_str(&paid).unwrap();
    assert_eq!(
        paid_json,
        serde_json::json!({"order_no": order_no, "status": "PAID"})
    );
    assert_eq!(
        http(addr, &pay(order_no, Some("pay-1"))).await,
        (200, paid.clone())
    );
    assert_eq!(
        http(addr, &pay(order_no, Some("pay-2"))).await,
        (200, paid.clone())
    );
    let (status, unknown) = http(addr, &pay("ORD-999999", Some("pay-3"))).await;
    assert_eq!(status, 404, "{unknown}");
    assert_eq!(http(addr, &pay(order_no, None)).await.0, 400);

    let rows = db
        .admin
        .query(
            &format!(
                "SELECT message_id, topic, payload, state FROM {}.idempotency_outbox",
                db.schema
            ),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(rows.len(), 1, "one message for one payment");
    let message_id: String = rows[0].get(0);
    assert_eq!(rows[0].get::<_, String>(1), "payment-succeeded");
    let event: serde_json::Value = serde_json::from_slice(rows[0].get::<_, &[u8]>(2)).unwrap();
    assert_eq!(
        event,
        serde_json::json!({"message_id": message_id, "user_id": 1001, "coupon_code": "PAID_THANKS"})
    );
    assert_eq!(rows[0].get::<_, String>(3), "PENDING");
    let status: String = db
        .admin
        .query_one(
            &format!(
                "SELECT status FROM {}.orders WHERE order_no = $1",
                db.schema
            ),
            &[&order_no],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(status, "PAID");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orders_example_serves_idempotent_orders_and_metrics() {
    if !common::Database::Postgres.configured() {
        return;
    }
    serves_idempotent_orders_and_metrics("orders").await;
}

/// The same contract, the same checks, on sqlx.
#[cfg(feature = "sqlx")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orders_sqlx_example_serves_idempotent_orders_and_metrics() {
    if !common::Database::Postgres.configured() {
        return;
    }
    serves_idempotent_orders_and_metrics("orders_sqlx").await;
}

async fn serves_idempotent_orders_and_metrics(example: &str) {
    let db = TestDb::bare(1).await;
    let (mut child, addr) =
        start_example(example, &[("DATABASE_URL", &schema_url(&db.schema))]).await;

    let (status, first) = http(&addr, &post_order("ex-1", 299)).await;
    assert_eq!(status, 201, "{first}");
    let order: serde_json::Value = serde_json::from_str(&first).unwrap();
    assert_eq!(order["amount"], 299);
    let (status, replay) = http(&addr, &post_order("ex-1", 299)).await;
    assert_eq!((status, replay.as_str()), (201, first.as_str()));
    let (status, _) = http(&addr, &post_order("ex-1", 300)).await;
    assert_eq!(status, 422);
    let (status, _) = http(&addr, &post_order("ex-2", 0)).await;
    assert_eq!(
        status, 422,
        "a non-positive amount is refused by the handler"
    );
    let order_no = order["order_no"].as_str().unwrap();
    let (status, fetched) = http(
        &addr,
        &format!("GET /orders/{order_no} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(fetched, first);

    pays_once_and_enqueues_one_message(&db, &addr, order_no).await;

    // Hold the orders table so a first request waits inside its handler; a duplicate
    // then finds the key in flight.
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
        async move { http(&addr, &post_order("ex-3", 5)).await }
    });
    // Wait until the first request is inside its handler, queued behind the lock.
    let waiting = format!(
        "SELECT count(*) FROM pg_locks WHERE relation = '{}.orders'::regclass AND NOT granted",
        db.schema
    );
    for _ in 0..200 {
        let count: i64 = db.admin.query_one(&waiting, &[]).await.unwrap().get(0);
        if count > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (conflict, _) = http(&addr, &post_order("ex-3", 5)).await;
    assert_eq!(conflict, 409, "the duplicate of a request in flight");
    blocker.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(pending.await.unwrap().0, 201);

    let (status, text) = http(
        &addr,
        "GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status, 200);
    // ex-1, ex-3; pay-1, pay-2, pay-3 (stored 404). ex-2's 422 came before the handler's
    // first statement: rolled back, not stored.
    assert_eq!(metric(&text, "executed"), 5, "{text}");
    assert_eq!(metric(&text, "rolled_back"), 1, "{text}");
    assert_eq!(metric(&text, "replayed"), 2, "{text}"); // ex-1, pay-1
    assert_eq!(metric(&text, "missing_key"), 1, "{text}");
    assert_eq!(metric(&text, "payload_mismatch"), 1, "{text}");
    assert!(metric(&text, "in_flight") >= 1, "{text}");
    assert!(text.contains("idempotency_claim_seconds"), "{text}");
    assert!(text.contains("idempotency_commit_seconds"), "{text}");

    // SIGTERM: the example stops cleanly.
    let pid = child.id().unwrap();
    std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "{status:?}");
}

/// The record table dropped under a running service (a schema never migrated, or migrated
/// into another database): every keyed request is a 500 `schema_missing` naming `migrate`,
/// never a 503 the client would retry forever, and the log says once, at error level,
/// what the database said.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_table_is_a_500_naming_migrate_and_logged_once() {
    if !common::Database::Postgres.configured() {
        return;
    }
    let db = TestDb::bare(1).await;
    let (_child, addr, log) =
        start_example_logged("orders", &[("DATABASE_URL", &schema_url(&db.schema))]).await;
    let (status, _) = http(&addr, &post_order("drop-1", 10)).await;
    assert_eq!(status, 201);
    db.admin
        .batch_execute(&format!("DROP TABLE {}.idempotency_records", db.schema))
        .await
        .unwrap();
    for key in ["drop-2", "drop-3"] {
        let (status, body) = http(&addr, &post_order(key, 10)).await;
        assert_eq!(status, 500, "{body}");
        let problem: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(problem["code"], "schema_missing", "{body}");
        assert!(
            problem["detail"].as_str().unwrap().contains("migrate"),
            "{body}"
        );
    }
    eventually("the log line", async || {
        log.lock().unwrap().contains("does not exist")
    })
    .await;
    let log = log.lock().unwrap().clone();
    let lines: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("idempotency schema is missing"))
        .collect();
    assert_eq!(lines.len(), 1, "logged once: {log}");
    assert!(lines[0].contains("ERROR"), "at error level: {}", lines[0]);
    assert!(
        lines[0].contains("relation \"idempotency_records\" does not exist"),
        "with the database's own message: {}",
        lines[0]
    );
}
