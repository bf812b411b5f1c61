//! `migrate`: versioned, concurrent-safe, safe to run over a schema another migration tool
//! laid from `migrations/`, and refusing a schema newer than the build.

mod common;

use axum_idempotency::Error;
use common::*;

async fn versions(db: &TestDb) -> Vec<i32> {
    db.admin
        .query(
            &format!(
                "SELECT version FROM {}.axum_idempotency_migrations ORDER BY version",
                db.schema
            ),
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect()
}

async fn concurrent_migrations_apply_each_version_once<D: PgDriver>() {
    let db = TestDb::bare(8).await;
    let runs: Vec<_> = (0..8)
        .map(|_| {
            let pool = D::pool(&db);
            tokio::spawn(async move { axum_idempotency::migrate(&pool).await })
        })
        .collect();
    for run in runs {
        run.await.unwrap().unwrap();
    }
    assert_eq!(versions(&db).await, vec![1, 2]);
    // Running it again is a no-op.
    axum_idempotency::migrate(&D::pool(&db)).await.unwrap();
    assert_eq!(versions(&db).await, vec![1, 2]);
}

/// A user whose own migration tool applied `migrations/` (as the operations guide allows)
/// and who also calls `migrate` loses nothing: the files run again over the existing
/// objects without an error, the rows stay, and the version is recorded.
async fn a_schema_laid_by_another_tool_is_adopted<D: PgDriver>() {
    let db = TestDb::bare(1).await;
    let client = db.pool.get().await.unwrap();
    client
        .batch_execute(include_str!("../../migrations/0001_schema.sql"))
        .await
        .unwrap();
    client
        .batch_execute(
            "INSERT INTO idempotency_records (id, scope, fingerprint, status, headers, body, expires_at)
             VALUES (gen_random_uuid(), '', '\\x00', 201, '', 'kept', now() + interval '1 day');",
        )
        .await
        .unwrap();
    drop(client);
    axum_idempotency::migrate(&D::pool(&db)).await.unwrap();
    assert_eq!(versions(&db).await, vec![1, 2]);
    axum_idempotency::check_schema(&D::pool(&db)).await.unwrap();
    let row = db
        .admin
        .query_one(
            &format!(
                "SELECT state, fencing_token, body FROM {}.idempotency_records",
                db.schema
            ),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "SUCCESS");
    assert_eq!(row.get::<_, i64>(1), 0);
    assert_eq!(row.get::<_, Vec<u8>>(2), b"kept");
}

async fn a_newer_schema_is_refused<D: PgDriver>() {
    let db = TestDb::new(1).await;
    db.admin
        .batch_execute(&format!(
            "INSERT INTO {}.axum_idempotency_migrations (version, name) VALUES (99, 'future')",
            db.schema
        ))
        .await
        .unwrap();
    match axum_idempotency::migrate(&D::pool(&db)).await {
        Err(Error::UnknownSchemaVersion {
            found: 99,
            known: 2,
        }) => {}
        other => panic!("expected UnknownSchemaVersion, got {other:?}"),
    }
    assert!(
        table_is_free_now(format!("{}.axum_idempotency_migrations", db.schema)),
        "the refused migration left its transaction (and its locks) open"
    );
}

/// Whether another session can take `table` exclusively right now. Asked from a thread of
/// its own while this test's runtime is blocked, so nothing the refused call left to run
/// in the background can release a lock first.
fn table_is_free_now(table: String) -> bool {
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let admin = connect(&database_url()).await;
            admin
                .batch_execute(&format!(
                    "BEGIN; LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE NOWAIT; ROLLBACK"
                ))
                .await
                .is_ok()
        })
    })
    .join()
    .unwrap()
}

/// `check_schema` tells, before the first request, whether `migrate` has run: never,
/// fully, or by a newer version.
async fn check_schema_says_whether_migrate_ran<D: PgDriver>() {
    let db = TestDb::bare(2).await;
    let pool = D::pool(&db);
    match axum_idempotency::check_schema(&pool).await {
        Err(error @ Error::SchemaOutdated { found: 0, .. }) => {
            assert!(error.is_schema_missing());
            assert!(error.to_string().contains("migrate"), "{error}");
        }
        other => panic!("expected SchemaOutdated at 0, got {other:?}"),
    }
    axum_idempotency::migrate(&pool).await.unwrap();
    axum_idempotency::check_schema(&pool).await.unwrap();
    db.admin
        .batch_execute(&format!(
            "INSERT INTO {}.axum_idempotency_migrations (version, name) VALUES (999, 'future')",
            db.schema
        ))
        .await
        .unwrap();
    assert!(matches!(
        axum_idempotency::check_schema(&pool).await,
        Err(Error::UnknownSchemaVersion { found: 999, .. })
    ));
}

for_each_driver! {
    #[tokio::test]
    async check_schema_says_whether_migrate_ran;
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async concurrent_migrations_apply_each_version_once;
    #[tokio::test]
    async a_schema_laid_by_another_tool_is_adopted;
    #[tokio::test]
    async a_newer_schema_is_refused;
}
