//! Encryption at rest of stored bodies and inbox payloads (feature `encryption`), against
//! real PostgreSQL: the raw columns hold no plaintext, rotated keys still open old records,
//! an unknown key or a damaged ciphertext is a 503 and never garbage, plaintext rows written
//! before encryption was turned on still replay.
#![cfg(feature = "encryption")]

mod common;

use std::sync::Arc;

use axum::Router;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::post;
use axum_idempotency::postgres::PgStore;
use axum_idempotency::{BodyKeys, IdempotencyLayer, IdempotentLease, Inbox};
use common::*;
use serde_json::json;
use sha2::{Digest, Sha256};

const KEY_1: [u8; 32] = [0x11; 32];
const KEY_2: [u8; 32] = [0x22; 32];
/// Distinctive values that end up in the response body.
const AMOUNT: i64 = 987_654_321;
const USER: i64 = 424_242;

fn app(
    db: &TestDb,
    layer: impl FnOnce(IdempotencyLayer<PgStore>) -> IdempotencyLayer<PgStore>,
) -> Router {
    let knobs = Arc::new(Knobs::default());
    router(knobs, layer(IdempotencyLayer::new(db.pool.clone())))
}

fn order(key: &str) -> axum::http::Request<axum::body::Body> {
    post_json(
        "/orders",
        Some(key),
        &json!({"amount": AMOUNT, "user_id": USER}),
    )
}

/// The raw `body` and `body_key_id` of every record, oldest first.
async fn raw_bodies(db: &TestDb) -> Vec<(Vec<u8>, Option<i16>)> {
    db.admin
        .query(
            &format!(
                "SELECT body, body_key_id FROM {}.idempotency_records ORDER BY created_at, id",
                db.schema
            ),
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect()
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

fn assert_no_plaintext(raw: &[u8], plaintext: &[u8]) {
    for needle in [
        AMOUNT.to_string().as_bytes(),
        USER.to_string().as_bytes(),
        b"amount",
        b"user_id",
    ] {
        assert!(
            !contains(raw, needle),
            "stored body contains {:?}",
            String::from_utf8_lossy(needle)
        );
    }
    // Version, key id, nonce, ciphertext of the same length, tag.
    assert_eq!(raw.len(), 1 + 1 + 12 + plaintext.len() + 16);
}

#[tokio::test]
async fn encrypted_body_holds_no_plaintext_and_replays_byte_for_byte() {
    if !common::Database::Postgres.configured() {
        return;
    }
    let db = TestDb::new(4).await;
    let app = app(&db, |l| l.encrypt_bodies(BodyKeys::new(1, KEY_1)));
    let first = send(&app, order("enc-1")).await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(contains(&first.body, AMOUNT.to_string().as_bytes()));

    let rows = raw_bodies(&db).await;
    assert_eq!(rows.len(), 1);
    let (raw, key_id) = &rows[0];
    assert_eq!(*key_id, Some(1));
    assert_eq!(raw[..2], [1, 1], "version 1, key id 1");
    assert_no_plaintext(raw, &first.body);

    let retry = send(&app, order("enc-1")).await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert!(retry.replayed());
    assert_eq!(retry.body, first.body, "byte for byte");
    assert_eq!(retry.headers["location"], first.headers["location"]);
    assert_eq!(db.orders().await, 1);
    db.assert_settles().await;
}

#[tokio::test]
async fn records_under_a_rotated_key_still_replay_and_new_ones_use_the_new_key() {
    if !common::Database::Postgres.configured() {
        return;
    }
    let db = TestDb::new(4).await;
    let before = app(&db, |l| l.encrypt_bodies(BodyKeys::new(1, KEY_1)));
    let old = send(&before, order("rot-old")).await;
    assert_eq!(old.status, StatusCode::CREATED);

    let after = app(&db, |l| {
        l.encrypt_bodies(BodyKeys::new(2, KEY_2).with_old_key(1, KEY_1))
    });
    let replayed = send(&after, order("rot-old")).await;
    assert!(replayed.replayed());
    assert_eq!(replayed.body, old.body);

    let new = send(&after, order("rot-new")).await;
    assert_eq!(new.status, StatusCode::CREATED);
    assert!(!new.replayed());
    let key_ids: Vec<_> = raw_bodies(&db)
        .await
        .into_iter()
        .map(|(_, id)| id)
        .collect();
    assert_eq!(key_ids, vec![Some(1), Some(2)]);
    let again = send(&after, order("rot-new")).await;
    assert!(again.replayed());
    assert_eq!(again.body, new.body);
    assert_eq!(db.orders().await, 2);
    db.assert_settles().await;
}

#[tokio::test]
async fn an_unknown_key_or_a_damaged_ciphertext_is_503_and_never_garbage() {
    if !common::Database::Postgres.configured() {
        return;
    }
    let db = TestDb::new(4).await;
    let writer = app(&db, |l| l.encrypt_bodies(BodyKeys::new(1, KEY_1)));
    assert_eq!(
        send(&writer, order("lost-key")).await.status,
        StatusCode::CREATED
    );

    // Key 1 retired too early, encryption turned off, or the same id with other material.
    let readers = [
        app(&db, |l| l.encrypt_bodies(BodyKeys::new(2, KEY_2))),
        app(&db, |l| l),
        app(&db, |l| l.encrypt_bodies(BodyKeys::new(1, KEY_2))),
    ];
    for reader in &readers {
        let answer = send(reader, order("lost-key")).await;
        assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(answer.problem_code(), "store_unavailable");
    }

    // One flipped bit in the ciphertext.
    db.admin
        .execute(
            &format!(
                "UPDATE {}.idempotency_records SET body = set_byte(body, 20, get_byte(body, 20) # 1)",
                db.schema
            ),
            &[],
        )
        .await
        .unwrap();
    let answer = send(&writer, order("lost-key")).await;
    assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(answer.problem_code(), "store_unavailable");
    assert_eq!(db.orders().await, 1, "the handler never ran again");
    db.assert_settles().await;
}

#[tokio::test]
async fn a_ciphertext_moved_to_another_record_does_not_open() {
    if !common::Database::Postgres.configured() {
        return;
    }
    let db = TestDb::new(4).await;
    let app = app(&db, |l| l.encrypt_bodies(BodyKeys::new(1, KEY_1)));
    let a = send(&app, order("moved-a")).await;
    let b = send(&app, order("moved-b")).await;
    assert_ne!(a.body, b.body);
    // Give record b the sealed body of record a.
    db.admin
        .execute(
            &format!(
                "UPDATE {s}.idempotency_records SET body = \
                 (SELECT body FROM {s}.idempotency_records ORDER BY created_at, id LIMIT 1) \
                 WHERE id = (SELECT id FROM {s}.idempotency_records \
                             ORDER BY created_at DESC, id DESC LIMIT 1)",
                s = db.schema
            ),
            &[],
        )
        .await
        .unwrap();
    let replay_a = send(&app, order("moved-a")).await;
    assert_eq!(replay_a.body, a.body);
    let replay_b = send(&app, order("moved-b")).await;
    assert_eq!(replay_b.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(replay_b.problem_code(), "store_unavailable");
}

#[tokio::test]
async fn plaintext_records_written_before_encryption_still_replay() {
    if !common::Database::Postgres.configured() {
        return;
    }
    let db = TestDb::new(4).await;
    let plain = app(&db, |l| l);
    let legacy = send(&plain, order("legacy-1")).await;
    assert_eq!(legacy.status, StatusCode::CREATED);
    let rows = raw_bodies(&db).await;
    assert_eq!(rows[0].1, None);
    assert_eq!(rows[0].0, legacy.body.to_vec());

    let encrypted = app(&db, |l| l.encrypt_bodies(BodyKeys::new(1, KEY_1)));
    let replayed = send(&encrypted, order("legacy-1")).await;
    assert!(replayed.replayed());
    assert_eq!(replayed.body, legacy.body);
    assert_eq!(db.orders().await, 1);
    db.assert_settles().await;
}

async fn charge(_lease: IdempotentLease) -> impl IntoResponse {
    (
        StatusCode::CREATED,
        format!("{{\"charged\":{AMOUNT},\"user_id\":{USER}}}"),
    )
}

#[tokio::test]
async fn lease_mode_bodies_are_encrypted_too() {
    if !common::Database::Postgres.configured() {
        return;
    }
    let db = TestDb::new(4).await;
    let app = Router::new()
        .route("/charges", post(charge))
        .layer(IdempotencyLayer::new(db.pool.clone()).encrypt_bodies(BodyKeys::new(7, KEY_1)));
    let request = || post_json("/charges", Some("lease-1"), &json!({"amount": 1}));
    let first = send(&app, request()).await;
    assert_eq!(first.status, StatusCode::CREATED);
    let rows = raw_bodies(&db).await;
    let (raw, key_id) = &rows[0];
    assert_eq!(*key_id, Some(7));
    assert!(!contains(raw, AMOUNT.to_string().as_bytes()));
    assert!(!contains(raw, b"charged"));
    let retry = send(&app, request()).await;
    assert!(retry.replayed());
    assert_eq!(retry.body, first.body);
    db.assert_settles().await;
}

async fn inbox_row(db: &TestDb, message_id: &str) -> (Option<Vec<u8>>, Option<i16>, Vec<u8>) {
    let row = db
        .admin
        .query_one(
            &format!(
                "SELECT payload, payload_key_id, payload_digest FROM {}.inbox_messages \
                 WHERE consumer_group = 'billing' AND message_id = $1",
                db.schema
            ),
            &[&message_id],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1), row.get(2))
}

#[tokio::test]
async fn inbox_payloads_are_stored_encrypted() {
    if !common::Database::Postgres.configured() {
        return;
    }
    let db = TestDb::new(2).await;
    let inbox = Inbox::new(db.pool.clone(), "billing")
        .store_payload(true)
        .encrypt_payloads(BodyKeys::new(3, KEY_1));
    let payload = format!("{{\"card\":\"4111111111111111\",\"amount\":{AMOUNT}}}");
    inbox
        .process_payload("m-ok", payload.as_bytes(), |_tx| async move {
            Ok::<_, std::io::Error>(())
        })
        .await
        .unwrap();
    // A failed attempt records the payload too, in its own transaction.
    let failed = inbox
        .process_payload("m-failed", payload.as_bytes(), |_tx| async move {
            Err::<(), _>(std::io::Error::other("declined"))
        })
        .await;
    assert!(failed.is_err());

    for message_id in ["m-ok", "m-failed"] {
        let (stored, key_id, digest) = inbox_row(&db, message_id).await;
        let stored = stored.expect("payload kept");
        assert_eq!(key_id, Some(3), "{message_id}");
        assert_eq!(stored[..2], [1, 3]);
        assert_eq!(stored.len(), 1 + 1 + 12 + payload.len() + 16);
        assert!(!contains(&stored, b"4111111111111111"), "{message_id}");
        assert!(!contains(&stored, AMOUNT.to_string().as_bytes()));
        assert_eq!(digest, Sha256::digest(payload.as_bytes()).to_vec());
    }

    // The duplicate check still works on the digest.
    let duplicate = inbox
        .process_payload("m-ok", payload.as_bytes(), |_tx| async move {
            Ok::<_, std::io::Error>(())
        })
        .await
        .unwrap();
    assert!(matches!(
        duplicate,
        axum_idempotency::inbox::Outcome::Duplicate { .. }
    ));

    // Without `store_payload`, keys or not, no payload is kept at all.
    let digest_only =
        Inbox::new(db.pool.clone(), "billing").encrypt_payloads(BodyKeys::new(3, KEY_1));
    digest_only
        .process_payload("m-digest", payload.as_bytes(), |_tx| async move {
            Ok::<_, std::io::Error>(())
        })
        .await
        .unwrap();
    let (stored, key_id, _) = inbox_row(&db, "m-digest").await;
    assert_eq!((stored, key_id), (None, None));
}
