//! The Sweeper and the Admin view on every database: batched purges with separate
//! retention, stale leases reported and optionally failed, several sweepers at once, and the
//! troubleshooting look-ups.

mod common;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use axum_idempotency::inbox::Outcome;
use axum_idempotency::{
    Admin, Archive, ArchiveSink, ArchivedRow, BoxError, Error, IdempotencyLayer, Inbox, InboxError,
    KeyError, ResponseBody, Sweeper,
};
use common::recorder::{Capture, Recorder};
use common::*;
use serde_json::json;
use sha2::{Digest, Sha256};
use tokio::sync::Notify;

const MINUTE: f64 = 60.0;
const HOUR: f64 = 3600.0;
const DAY: f64 = 24.0 * HOUR;

/// The fixture rows this file writes straight into the tables, and the columns it reads
/// back, in each database's SQL. Times are offsets in seconds from the database's now
/// (negative: in the past).
trait Fixtures: TestDatabase {
    /// Inserts `n` records in `scope`, created 30 days ago, with a 32-byte fingerprint and
    /// a random id; `locked_in` is the lease's end (`None`: no lease).
    fn insert_records(
        &self,
        n: i64,
        scope: &str,
        state: &str,
        expires_in: f64,
        locked_in: Option<f64>,
    ) -> impl Future<Output = ()> + Send;
    /// Inserts `n` inbox records `m-1` .. `m-n` in `group`, one attempt each.
    fn insert_messages(
        &self,
        n: i64,
        group: &str,
        status: &str,
        expires_in: f64,
    ) -> impl Future<Output = ()> + Send;
    /// The (state, retryable, no lease) of every record in `scope`.
    fn states(&self, scope: &str) -> impl Future<Output = Vec<(String, bool, bool)>> + Send;
    /// Runs a statement in SQL every database speaks; the rows it affected.
    fn affected(&self, sql: &str) -> impl Future<Output = u64> + Send;
    /// The only record of `scope`: its id and fingerprint in lowercase hex.
    fn id_and_fingerprint(&self, scope: &str) -> impl Future<Output = (String, String)> + Send;
}

/// Locks live traffic holds: released (the holder's transaction rolled back) by
/// [`Held::release`].
struct Held(Pin<Box<dyn Future<Output = ()> + Send>>);

impl Held {
    async fn release(self) {
        self.0.await
    }
}

/// Databases with row locks that another session can hold.
trait RowLocks: Fixtures {
    /// From a session of its own, in a READ COMMITTED transaction (the crate's), locks the
    /// record of the smallest id and the inbox record of the smallest key. (On InnoDB the
    /// order must be the primary key's: a sort of the whole table locks every row it read.)
    fn lock_first_rows(&self) -> impl Future<Output = Held> + Send;
}

impl Fixtures for TestDb {
    async fn insert_records(
        &self,
        n: i64,
        scope: &str,
        state: &str,
        expires_in: f64,
        locked_in: Option<f64>,
    ) {
        let locked_until = match locked_in {
            Some(secs) => format!("now() + ({secs}) * interval '1 second'"),
            None => "NULL".to_owned(),
        };
        TestDatabase::execute(
            self,
            &format!(
                "INSERT INTO idempotency_records \
                 (id, scope, fingerprint, state, status, headers, body, created_at, expires_at, \
                  locked_until) \
                 SELECT gen_random_uuid(), '{scope}', sha256(i::text::bytea), '{state}', 201, \
                        '', 'body', now() - interval '30 days', \
                        now() + ({expires_in}) * interval '1 second', {locked_until} \
                 FROM generate_series(1, {n}) AS i"
            ),
        )
        .await;
    }

    async fn insert_messages(&self, n: i64, group: &str, status: &str, expires_in: f64) {
        TestDatabase::execute(
            self,
            &format!(
                "INSERT INTO inbox_messages \
                 (consumer_group, message_id, status, attempts, expires_at) \
                 SELECT '{group}', 'm-' || i, '{status}', 1, \
                        now() + ({expires_in}) * interval '1 second' \
                 FROM generate_series(1, {n}) AS i"
            ),
        )
        .await;
    }

    async fn states(&self, scope: &str) -> Vec<(String, bool, bool)> {
        self.admin
            .query(
                &format!(
                    "SELECT state, retryable, locked_until IS NULL \
                     FROM {}.idempotency_records WHERE scope = $1",
                    self.schema
                ),
                &[&scope],
            )
            .await
            .unwrap()
            .iter()
            .map(|row| (row.get(0), row.get(1), row.get(2)))
            .collect()
    }

    async fn affected(&self, sql: &str) -> u64 {
        self.admin
            .batch_execute(&format!("SET search_path = {}", self.schema))
            .await
            .unwrap();
        self.admin.execute(sql, &[]).await.unwrap()
    }

    async fn id_and_fingerprint(&self, scope: &str) -> (String, String) {
        let row = self
            .admin
            .query_one(
                &format!(
                    "SELECT replace(id::text, '-', ''), encode(fingerprint, 'hex') \
                     FROM {}.idempotency_records WHERE scope = $1",
                    self.schema
                ),
                &[&scope],
            )
            .await
            .unwrap();
        (row.get(0), row.get(1))
    }
}

impl RowLocks for TestDb {
    async fn lock_first_rows(&self) -> Held {
        let live = connect(&database_url()).await;
        live.batch_execute(&format!(
            "SET search_path = {}; \
             BEGIN ISOLATION LEVEL READ COMMITTED; \
             SELECT 1 FROM idempotency_records ORDER BY id LIMIT 1 FOR UPDATE; \
             SELECT 1 FROM inbox_messages ORDER BY consumer_group, message_id LIMIT 1 FOR UPDATE",
            self.schema
        ))
        .await
        .unwrap();
        Held(Box::pin(async move {
            live.batch_execute("ROLLBACK").await.unwrap();
        }))
    }
}

/// `n` (at most 10 000) rows numbered `i` from 1, as a MySQL derived table: the product of
/// four tables of digits, rather than `WITH RECURSIVE`, which MySQL 8 cuts at
/// `cte_max_recursion_depth` (1000 by default).
#[cfg(feature = "mysql")]
fn mysql_series(n: i64) -> String {
    assert!(n <= 10_000, "{n} rows");
    let digits = "(SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 \
                  UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 \
                  UNION ALL SELECT 8 UNION ALL SELECT 9)";
    format!(
        "(SELECT 1 + d0.d + 10 * d1.d + 100 * d2.d + 1000 * d3.d AS i \
          FROM {digits} AS d0 CROSS JOIN {digits} AS d1 CROSS JOIN {digits} AS d2 \
          CROSS JOIN {digits} AS d3) AS series WHERE i <= {n}"
    )
}

/// `secs` from now, in MySQL: DATETIME(6) in UTC.
#[cfg(feature = "mysql")]
fn mysql_in(secs: f64) -> String {
    let micros = (secs * 1e6).round() as i64;
    format!("UTC_TIMESTAMP(6) + INTERVAL {micros} MICROSECOND")
}

#[cfg(feature = "mysql")]
impl Fixtures for common::mysql::MySqlDb {
    async fn insert_records(
        &self,
        n: i64,
        scope: &str,
        state: &str,
        expires_in: f64,
        locked_in: Option<f64>,
    ) {
        let locked_until = locked_in.map_or_else(|| "NULL".to_owned(), mysql_in);
        // The id: 16 bytes, distinct across calls for one scope too (UUID() is per row).
        self.execute(&format!(
            "INSERT INTO idempotency_records \
             (id, scope, fingerprint, state, status, headers, body, created_at, expires_at, \
              locked_until, updated_at) \
             SELECT UNHEX(MD5(CONCAT('{scope}', '-', i, '-', UUID()))), '{scope}', \
                    UNHEX(SHA2(CONCAT(i), 256)), '{state}', 201, '', 'body', \
                    UTC_TIMESTAMP(6) - INTERVAL 30 DAY, {expires_at}, {locked_until}, \
                    UTC_TIMESTAMP(6) \
             FROM {series}",
            expires_at = mysql_in(expires_in),
            series = mysql_series(n),
        ))
        .await;
    }

    async fn insert_messages(&self, n: i64, group: &str, status: &str, expires_in: f64) {
        self.execute(&format!(
            "INSERT INTO inbox_messages \
             (consumer_group, message_id, status, attempts, created_at, updated_at, expires_at) \
             SELECT '{group}', CONCAT('m-', i), '{status}', 1, UTC_TIMESTAMP(6), \
                    UTC_TIMESTAMP(6), {expires_at} \
             FROM {series}",
            expires_at = mysql_in(expires_in),
            series = mysql_series(n),
        ))
        .await;
    }

    async fn states(&self, scope: &str) -> Vec<(String, bool, bool)> {
        let rows: Vec<(String, bool, i64)> = ::sqlx::query_as(
            "SELECT state, retryable, CAST(locked_until IS NULL AS SIGNED) \
             FROM idempotency_records WHERE scope = ?",
        )
        .bind(scope)
        .fetch_all(&self.admin)
        .await
        .unwrap();
        rows.into_iter()
            .map(|(state, retryable, unlocked)| (state, retryable, unlocked != 0))
            .collect()
    }

    async fn affected(&self, sql: &str) -> u64 {
        ::sqlx::query(::sqlx::AssertSqlSafe(sql.to_owned()))
            .execute(&self.admin)
            .await
            .unwrap()
            .rows_affected()
    }

    async fn id_and_fingerprint(&self, scope: &str) -> (String, String) {
        ::sqlx::query_as(
            "SELECT LOWER(HEX(id)), LOWER(HEX(fingerprint)) \
             FROM idempotency_records WHERE scope = ?",
        )
        .bind(scope)
        .fetch_one(&self.admin)
        .await
        .unwrap()
    }
}

#[cfg(feature = "mysql")]
impl RowLocks for common::mysql::MySqlDb {
    async fn lock_first_rows(&self) -> Held {
        use ::sqlx::Connection;
        let mut live = ::sqlx::MySqlConnection::connect_with(&self.options())
            .await
            .unwrap();
        ::sqlx::raw_sql(
            "SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION; \
             SELECT 1 FROM idempotency_records ORDER BY id LIMIT 1 FOR UPDATE; \
             SELECT 1 FROM inbox_messages ORDER BY consumer_group, message_id LIMIT 1 FOR UPDATE",
        )
        .execute(&mut live)
        .await
        .unwrap();
        Held(Box::pin(async move {
            ::sqlx::raw_sql("ROLLBACK")
                .execute(&mut live)
                .await
                .unwrap();
            live.close().await.unwrap();
        }))
    }
}

/// `secs` from now, in SQLite: REAL Unix seconds.
#[cfg(feature = "sqlite")]
fn sqlite_in(secs: f64) -> String {
    format!("(unixepoch('subsec') + ({secs}))")
}

#[cfg(feature = "sqlite")]
impl Fixtures for common::sqlite::SqliteDb {
    async fn insert_records(
        &self,
        n: i64,
        scope: &str,
        state: &str,
        expires_in: f64,
        locked_in: Option<f64>,
    ) {
        let locked_until = locked_in.map_or_else(|| "NULL".to_owned(), sqlite_in);
        self.execute(&format!(
            "WITH RECURSIVE series (i) AS \
             (SELECT 1 UNION ALL SELECT i + 1 FROM series WHERE i < {n}) \
             INSERT INTO idempotency_records \
             (id, scope, fingerprint, state, status, headers, body, created_at, expires_at, \
              locked_until, updated_at) \
             SELECT randomblob(16), '{scope}', randomblob(32), '{state}', 201, x'', \
                    CAST('body' AS BLOB), {created_at}, {expires_at}, {locked_until}, \
                    unixepoch('subsec') \
             FROM series",
            created_at = sqlite_in(-30.0 * DAY),
            expires_at = sqlite_in(expires_in),
        ))
        .await;
    }

    async fn insert_messages(&self, n: i64, group: &str, status: &str, expires_in: f64) {
        self.execute(&format!(
            "WITH RECURSIVE series (i) AS \
             (SELECT 1 UNION ALL SELECT i + 1 FROM series WHERE i < {n}) \
             INSERT INTO inbox_messages (consumer_group, message_id, status, attempts, expires_at) \
             SELECT '{group}', 'm-' || i, '{status}', 1, {expires_at} FROM series",
            expires_at = sqlite_in(expires_in),
        ))
        .await;
    }

    async fn states(&self, scope: &str) -> Vec<(String, bool, bool)> {
        let rows: Vec<(String, i64, i64)> = ::sqlx::query_as(
            "SELECT state, retryable, locked_until IS NULL \
             FROM idempotency_records WHERE scope = ?",
        )
        .bind(scope)
        .fetch_all(&self.admin)
        .await
        .unwrap();
        rows.into_iter()
            .map(|(state, retryable, unlocked)| {
                // An INTEGER boolean: the schema's CHECK keeps it 0 or 1.
                assert!(retryable == 0 || retryable == 1, "retryable = {retryable}");
                (state, retryable == 1, unlocked != 0)
            })
            .collect()
    }

    async fn affected(&self, sql: &str) -> u64 {
        ::sqlx::query(::sqlx::AssertSqlSafe(sql.to_owned()))
            .execute(&self.admin)
            .await
            .unwrap()
            .rows_affected()
    }

    async fn id_and_fingerprint(&self, scope: &str) -> (String, String) {
        ::sqlx::query_as(
            "SELECT lower(hex(id)), lower(hex(fingerprint)) \
             FROM idempotency_records WHERE scope = ?",
        )
        .bind(scope)
        .fetch_one(&self.admin)
        .await
        .unwrap()
    }
}

async fn in_scope(db: &impl TestDatabase, scope: &str) -> i64 {
    db.scalar(&format!(
        "SELECT count(*) FROM idempotency_records WHERE scope = '{scope}'"
    ))
    .await
}

async fn in_group(db: &impl TestDatabase, group: &str) -> i64 {
    db.scalar(&format!(
        "SELECT count(*) FROM inbox_messages WHERE consumer_group = '{group}'"
    ))
    .await
}

async fn messages(db: &impl TestDatabase) -> i64 {
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

async fn batched_purge_removes_exactly_the_expired_rows<D: Driver>()
where
    D::Db: Fixtures,
{
    let db = D::db(2).await;
    db.insert_records(2500, "expired", "SUCCESS", -HOUR, None)
        .await;
    db.insert_records(40, "live", "SUCCESS", HOUR, None).await;
    // Expired long ago, but the lease is still held: never touched.
    db.insert_records(5, "leased", "PROCESSING", -30.0 * DAY, Some(HOUR))
        .await;
    // Expired long ago and the holder is gone: an abandoned attempt, kept like a failure.
    db.insert_records(3, "abandoned", "PROCESSING", -30.0 * DAY, Some(-30.0 * DAY))
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
    db.insert_records(2000, "expired", "SUCCESS", -1.0, None)
        .await;
    let report = sweeper.run_once().await.unwrap();
    assert_eq!(report.purged_records, 2000, "{report:?}");
    assert_eq!(db.records().await, 45);

    let report = sweeper.run_once().await.unwrap();
    assert_eq!(report.purged_records, 0, "nothing left to purge");
    db.assert_settles().await;
}

/// A copy of one record of `scope` in the archive, as a batch that was repeated after a
/// crash would find it (SQL every database speaks).
fn archive_one_of(scope: &str) -> String {
    format!(
        "INSERT INTO idempotency_records_archive (id, scope, idempotency_key, fingerprint, \
         status, headers, body, body_key_id, state, retryable, fencing_token, created_at, \
         updated_at, expires_at) SELECT id, scope, idempotency_key, fingerprint, status, \
         headers, body, body_key_id, state, retryable, fencing_token, created_at, updated_at, \
         expires_at FROM idempotency_records WHERE scope = '{scope}' LIMIT 1"
    )
}

async fn archived(db: &impl TestDatabase, scope: &str, with_response: bool) -> i64 {
    let response = if with_response {
        " AND headers IS NOT NULL AND body IS NOT NULL"
    } else {
        ""
    };
    db.scalar(&format!(
        "SELECT count(*) FROM idempotency_records_archive WHERE scope = '{scope}'{response}"
    ))
    .await
}

async fn archiving_moves_each_expired_record_into_the_archive_once<D: Driver>()
where
    D::Db: Fixtures,
{
    let db = D::db(2).await;
    db.insert_records(30, "old", "SUCCESS", -HOUR, None).await;
    db.insert_records(5, "failed", "FAILED", -30.0 * DAY, None)
        .await;
    db.insert_records(4, "live", "SUCCESS", HOUR, None).await;
    assert_eq!(db.affected(&archive_one_of("old")).await, 1);

    let sweeper = Sweeper::new(D::pool(&db))
        .batch_size(8)
        .archive(Archive::Records);
    let report = sweeper.run_once().await.unwrap();
    assert_eq!(report.purged_records, 35, "{report:?}");
    assert_eq!(report.archived_records, 35, "{report:?}");
    assert_eq!(
        (in_scope(&db, "old").await, in_scope(&db, "failed").await),
        (0, 0)
    );
    assert_eq!(in_scope(&db, "live").await, 4, "live records stay");
    assert_eq!(
        archived(&db, "old", true).await,
        30,
        "each record archived once, with its response, the copy already there included"
    );
    assert_eq!(archived(&db, "failed", true).await, 5);
    assert_eq!(archived(&db, "live", false).await, 0);
    let report = sweeper.run_once().await.unwrap();
    assert_eq!((report.purged_records, report.archived_records), (0, 0));
    db.assert_settles().await;
}

async fn a_metadata_archive_leaves_the_response_out<D: Driver>()
where
    D::Db: Fixtures,
{
    let db = D::db(2).await;
    db.insert_records(6, "old", "SUCCESS", -HOUR, None).await;
    let report = Sweeper::new(D::pool(&db))
        .archive(Archive::Metadata)
        .run_once()
        .await
        .unwrap();
    assert_eq!(report.archived_records, 6, "{report:?}");
    assert_eq!(archived(&db, "old", false).await, 6);
    assert_eq!(archived(&db, "old", true).await, 0, "no headers, no body");
    assert_eq!(
        db.scalar(
            "SELECT count(*) FROM idempotency_records_archive \
             WHERE fingerprint IS NOT NULL AND status = 201 AND state = 'SUCCESS'"
        )
        .await,
        6,
        "the metadata is kept"
    );
}

async fn archived_records_are_purged_after_their_own_retention<D: Driver>()
where
    D::Db: Fixtures,
{
    let db = D::db(2).await;
    db.insert_records(7, "old", "SUCCESS", -HOUR, None).await;
    let keep = Sweeper::new(D::pool(&db))
        .archive(Archive::Records)
        .archive_retention(Duration::from_secs(3600));
    let report = keep.run_once().await.unwrap();
    assert_eq!((report.archived_records, report.purged_archive), (7, 0));
    assert_eq!(archived(&db, "old", true).await, 7);
    let report = Sweeper::new(D::pool(&db))
        .batch_size(3)
        .archive_retention(Duration::ZERO)
        .run_once()
        .await
        .unwrap();
    assert_eq!(report.purged_archive, 7, "{report:?}");
    assert_eq!(archived(&db, "old", false).await, 0);
}

/// An [`ArchiveSink`] for the tests: keeps what it was given, fails while told to, and can
/// stop inside `write` until the test lets it go on.
#[derive(Clone, Default)]
struct TestSink {
    rows: Arc<Mutex<Vec<ArchivedRow>>>,
    failing: Arc<AtomicBool>,
    /// (reached, go): `write` signals the first, then waits for the second.
    pause: Option<(Arc<Notify>, Arc<Notify>)>,
}

impl TestSink {
    fn rows(&self) -> Vec<ArchivedRow> {
        self.rows.lock().unwrap().clone()
    }

    fn in_scope(&self, scope: &str) -> Vec<ArchivedRow> {
        let mut rows = self.rows();
        rows.retain(|row| row.record.scope == scope);
        rows
    }
}

impl ArchiveSink for TestSink {
    async fn write(&self, rows: &[ArchivedRow]) -> Result<(), BoxError> {
        if let Some((reached, go)) = &self.pause {
            reached.notify_one();
            go.notified().await;
        }
        if self.failing.load(Ordering::SeqCst) {
            return Err("the archive's disk is full".into());
        }
        self.rows.lock().unwrap().extend_from_slice(rows);
        Ok(())
    }
}

async fn a_sink_holds_each_expired_record_before_it_is_purged<D: Driver>()
where
    D::Db: Fixtures,
{
    let db = D::db(2).await;
    db.insert_records(30, "old", "SUCCESS", -HOUR, None).await;
    db.insert_records(5, "failed", "FAILED", -30.0 * DAY, None)
        .await;
    db.insert_records(4, "live", "SUCCESS", HOUR, None).await;
    let sink = TestSink::default();
    let sweeper = Sweeper::new(D::pool(&db))
        .batch_size(8)
        .archive_to(sink.clone(), Archive::Records);
    let report = sweeper.run_once().await.unwrap();
    assert_eq!(
        (report.purged_records, report.archived_records),
        (35, 35),
        "{report:?}"
    );
    assert_eq!(
        (in_scope(&db, "old").await, in_scope(&db, "failed").await),
        (0, 0)
    );
    assert_eq!(in_scope(&db, "live").await, 4, "live records stay");
    let rows = sink.rows();
    assert_eq!(
        (sink.in_scope("old").len(), sink.in_scope("failed").len()),
        (30, 5)
    );
    let ids: std::collections::HashSet<_> = rows.iter().map(|r| r.archive_id.clone()).collect();
    assert_eq!(ids.len(), 35, "one stable id per record");
    for row in &rows {
        assert!(
            row.archive_id.starts_with(&format!("{}-", row.record.id)),
            "{row:?}"
        );
        assert_eq!(row.record.status, 201);
        let response = row.response.as_ref().expect("the response is archived");
        assert_eq!(
            (&response.body[..], response.body_key_id),
            (&b"body"[..], None)
        );
    }
    assert_eq!(
        db.scalar("SELECT count(*) FROM idempotency_records_archive")
            .await,
        0,
        "the sink replaces the table"
    );
    let report = sweeper.run_once().await.unwrap();
    assert_eq!(report.purged_records, 0, "{report:?}");
    assert_eq!(sink.rows().len(), 35, "nothing sent twice");
    db.assert_settles().await;
}

/// A failing sink deletes nothing, is counted, leaves the other tables' sweep alone, and
/// its batch goes out on the next run. (A local recorder sees only this thread: the test
/// drives its own single-threaded runtime.)
fn a_failing_sink_deletes_nothing_and_its_batch_is_sent_next_run<D: Driver>()
where
    D::Db: Fixtures,
{
    let capture = Arc::new(Capture::default());
    let recorder = Recorder(Arc::clone(&capture));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            let db = D::db(2).await;
            db.insert_records(6, "old", "SUCCESS", -HOUR, None).await;
            db.insert_messages(2, "g", "SUCCESS", -HOUR).await;
            let sink = TestSink::default();
            sink.failing.store(true, Ordering::SeqCst);
            let sweeper = Sweeper::new(D::pool(&db)).archive_to(sink.clone(), Archive::Metadata);
            let error = sweeper.run_once().await.unwrap_err();
            assert!(matches!(error, Error::Archive(_)), "{error:?}");
            let source = std::error::Error::source(&error).unwrap().to_string();
            assert_eq!(source, "the archive's disk is full");
            assert_eq!(in_scope(&db, "old").await, 6, "nothing deleted");
            assert_eq!(messages(&db).await, 0, "the other tables are still swept");
            let values = capture.values();
            assert_eq!(
                values.get("idempotency_archive_errors_total{archive=sink}"),
                Some(&1.0),
                "{values:?}"
            );
            assert!(
                !values.contains_key("idempotency_sweeper_last_run_timestamp_seconds{}"),
                "a failed run is not a completed pass"
            );

            sink.failing.store(false, Ordering::SeqCst);
            let report = sweeper.run_once().await.unwrap();
            assert_eq!(report.archived_records, 6, "{report:?}");
            assert_eq!(in_scope(&db, "old").await, 0);
            let rows = sink.in_scope("old");
            assert_eq!(rows.len(), 6);
            assert!(
                rows.iter().all(|row| row.response.is_none()),
                "metadata only"
            );
            assert!(rows.iter().all(|row| row.record.fingerprint.len() == 64));
            let values = capture.values();
            assert_eq!(values.get("idempotency_archive_lag_seconds{}"), Some(&0.0));
            assert_eq!(values.get("idempotency_archived_total{}"), Some(&6.0));
        })
    });
}

/// A record that changed between the sink's write and the delete (here its `updated_at`;
/// in service, its key used again) is not deleted: the next run sends it again, under the
/// same archive id, as it is now, and then purges it.
async fn a_record_changed_while_the_sink_writes_stays_and_goes_next_run<D: Driver>()
where
    D::Db: Fixtures,
{
    let db = D::db(2).await;
    db.insert_records(4, "old", "SUCCESS", -HOUR, None).await;
    db.insert_records(1, "touched", "SUCCESS", -HOUR, None)
        .await;
    let (reached, go) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let sink = TestSink {
        pause: Some((Arc::clone(&reached), Arc::clone(&go))),
        ..TestSink::default()
    };
    let sweeper = Sweeper::new(D::pool(&db)).archive_to(sink.clone(), Archive::Records);
    let sweep = tokio::spawn(async move { sweeper.run_once().await });
    reached.notified().await;
    assert_eq!(
        db.affected(
            "UPDATE idempotency_records SET updated_at = expires_at WHERE scope = 'touched'"
        )
        .await,
        1
    );
    go.notify_one();
    let report = sweep.await.unwrap().unwrap();
    assert_eq!(report.purged_records, 4, "{report:?}");
    assert_eq!(
        in_scope(&db, "touched").await,
        1,
        "the changed record stays"
    );

    let again = TestSink {
        rows: Arc::clone(&sink.rows),
        ..TestSink::default()
    };
    let report = Sweeper::new(D::pool(&db))
        .archive_to(again, Archive::Records)
        .run_once()
        .await
        .unwrap();
    assert_eq!(report.purged_records, 1, "{report:?}");
    assert_eq!(in_scope(&db, "touched").await, 0);
    let touched = sink.in_scope("touched");
    assert_eq!(touched.len(), 2, "sent twice: at least once");
    assert_eq!(touched[0].archive_id, touched[1].archive_id, "under one id");
    assert_ne!(touched[0].record.updated_at, touched[1].record.updated_at);
    assert_eq!(touched[1].record.updated_at, touched[1].record.expires_at);
}

/// A key's record archived, then the key used again and its second record archived too:
/// `Admin::archived` finds both, newest first, as they were, while `lookup` finds none.
async fn admin_finds_the_archived_records_of_a_key<D: Driver>()
where
    D::Db: Fixtures,
{
    let db = D::db(4).await;
    let app = router(
        Arc::new(Knobs::default()),
        scoped(
            IdempotencyLayer::new(D::pool(&db))
                .store_raw_key(true)
                .ttl(Duration::from_millis(1)),
        ),
    );
    let sweeper = Sweeper::new(D::pool(&db)).archive(Archive::Records);
    let admin = Admin::new(D::pool(&db));
    let mut answers = Vec::new();
    for amount in [5, 6] {
        let answer = send(&app, scoped_request("alice", "order-1", amount)).await;
        assert_eq!(answer.status, 201);
        answers.push(answer);
        tokio::time::sleep(Duration::from_millis(20)).await;
        let report = sweeper.run_once().await.unwrap();
        assert_eq!(report.archived_records, 1, "{report:?}");
    }
    assert_eq!(admin.lookup("alice", "order-1").await.unwrap(), None);
    let archived = admin.archived("alice", "\"order-1\"").await.unwrap();
    assert_eq!(archived.len(), 2, "{archived:?}");
    for (found, answer) in archived.iter().zip(answers.iter().rev()) {
        assert_eq!(found.record.scope, "alice");
        assert_eq!(found.record.key.as_deref(), Some("order-1"));
        assert_eq!(
            (found.record.state.as_str(), found.record.status),
            ("SUCCESS", 201)
        );
        assert_eq!(found.record.locked_until, None);
        assert!(found.response_kept);
        let response = found.response.as_ref().expect("the archived answer");
        assert_eq!(
            response.body,
            ResponseBody::Plain(answer.body.clone()),
            "the archived answer is the one the client got"
        );
        assert!(
            found.record.response_bytes >= answer.body.len(),
            "{found:?}"
        );
        assert!(found.archived_at >= found.record.created_at, "{found:?}");
    }
    assert!(archived[0].record.created_at > archived[1].record.created_at);
    assert_ne!(
        archived[0].record.fingerprint,
        archived[1].record.fingerprint
    );
    assert!(admin.archived("bob", "order-1").await.unwrap().is_empty());
}

async fn success_is_purged_after_its_grace_and_failures_after_their_retention<D: Driver>()
where
    D::Db: Fixtures,
{
    let db = D::db(2).await;
    let past = -2.0 * MINUTE;
    db.insert_records(10, "success-old", "SUCCESS", past, None)
        .await;
    db.insert_records(11, "success-grace", "SUCCESS", -10.0, None)
        .await;
    db.insert_records(12, "failed-recent", "FAILED", past, None)
        .await;
    db.insert_records(13, "failed-old", "FAILED", -2.0 * DAY, None)
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

async fn default_retention_purges_success_at_expiry_and_keeps_failures_a_week<D: Driver>()
where
    D::Db: Fixtures,
{
    let db = D::db(2).await;
    db.insert_records(3, "success", "SUCCESS", -1.0, None).await;
    db.insert_records(4, "failed-6d", "FAILED", -6.0 * DAY, None)
        .await;
    db.insert_records(5, "failed-8d", "FAILED", -8.0 * DAY, None)
        .await;

    let report = Sweeper::new(D::pool(&db)).run_once().await.unwrap();
    assert_eq!(report.purged_records, 3 + 5, "{report:?}");
    assert_eq!(in_scope(&db, "success").await, 0);
    assert_eq!(in_scope(&db, "failed-6d").await, 4);
    assert_eq!(in_scope(&db, "failed-8d").await, 0);
}

async fn inbox_messages_are_purged_the_same_way<D: Driver>()
where
    D::Db: Fixtures,
{
    let db = D::db(2).await;
    db.insert_messages(30, "success-old", "SUCCESS", -2.0 * MINUTE)
        .await;
    db.insert_messages(6, "success-grace", "SUCCESS", -10.0)
        .await;
    db.insert_messages(5, "success-live", "SUCCESS", HOUR).await;
    db.insert_messages(4, "failed-recent", "FAILED", -2.0 * MINUTE)
        .await;
    db.insert_messages(21, "failed-old", "FAILED", -2.0 * DAY)
        .await;
    db.insert_records(2, "live", "SUCCESS", HOUR, None).await;

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
async fn stale_fixture(db: &impl Fixtures) {
    let expires = HOUR;
    db.insert_records(1, "lapsed-90s", "PROCESSING", expires, Some(-90.0))
        .await;
    db.insert_records(2, "lapsed-30s", "PROCESSING", expires, Some(-30.0))
        .await;
    db.insert_records(1, "lapsed-5s", "PROCESSING", expires, Some(-5.0))
        .await;
    db.insert_records(2, "held", "PROCESSING", expires, Some(MINUTE))
        .await;
    db.insert_records(3, "done", "SUCCESS", expires, None).await;
}

async fn stale_processing_is_reported_and_left_alone_by_default<D: Driver>()
where
    D::Db: Fixtures,
{
    let db = D::db(2).await;
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
        let states = db.states(scope).await;
        assert!(!states.is_empty(), "{scope}");
        for (state, _, unlocked) in states {
            assert_eq!(state, "PROCESSING", "{scope}");
            assert!(!unlocked, "{scope}");
        }
    }

    // Nothing stale: no age at all.
    db.execute("DELETE FROM idempotency_records WHERE scope LIKE 'lapsed%'")
        .await;
    let report = Sweeper::new(D::pool(&db)).run_once().await.unwrap();
    assert_eq!(report.stale_processing, 0);
    assert_eq!(report.oldest_stale, None);
}

async fn stale_processing_is_marked_failed_and_retryable_when_configured<D: Driver>()
where
    D::Db: Fixtures,
{
    let db = D::db(2).await;
    stale_fixture(&db).await;
    db.insert_records(4, "lapsed-2m", "PROCESSING", HOUR, Some(-2.0 * MINUTE))
        .await;
    db.execute("UPDATE idempotency_records SET fencing_token = 7 WHERE state = 'PROCESSING'")
        .await;

    let sweeper = Sweeper::new(D::pool(&db))
        .batch_size(2)
        .mark_stale_failed_after(Duration::from_secs(60));
    let report = sweeper.run_once().await.unwrap();
    assert_eq!(report.stale_processing, 8, "{report:?}");
    assert_eq!(report.marked_failed, 5, "{report:?}");
    for scope in ["lapsed-90s", "lapsed-2m"] {
        let states = db.states(scope).await;
        assert!(!states.is_empty(), "{scope}");
        for state in states {
            assert_eq!(state, ("FAILED".to_owned(), true, true), "{scope}");
        }
    }
    for scope in ["lapsed-30s", "lapsed-5s", "held"] {
        let states = db.states(scope).await;
        assert!(!states.is_empty(), "{scope}");
        for (state, retryable, _) in states {
            assert_eq!(
                (state.as_str(), retryable),
                ("PROCESSING", false),
                "{scope}"
            );
        }
    }

    // The lost holder comes back: its fenced completion finds nothing to complete.
    let completed = db
        .affected(
            "UPDATE idempotency_records SET state = 'SUCCESS' \
             WHERE scope = 'lapsed-90s' AND fencing_token = 7 AND state = 'PROCESSING'",
        )
        .await;
    assert_eq!(completed, 0);

    let report = sweeper.run_once().await.unwrap();
    assert_eq!(report.stale_processing, 3, "{report:?}");
    assert_eq!(report.marked_failed, 0);
}

/// Runs where another session can hold row locks: PostgreSQL and MySQL/MariaDB (SQLite has
/// none; its equivalent is `a_live_writer_holds_the_sweep_back_until_it_ends` below).
async fn rows_locked_by_live_traffic_are_skipped_not_waited_for<D: Driver>()
where
    D::Db: RowLocks,
{
    let db = D::db(2).await;
    db.insert_records(10, "expired", "SUCCESS", -HOUR, None)
        .await;
    db.insert_messages(10, "expired", "SUCCESS", -HOUR).await;
    let held = db.lock_first_rows().await;

    let sweeper = Sweeper::new(D::pool(&db)).batch_size(3);
    let report = tokio::time::timeout(Duration::from_secs(5), sweeper.run_once())
        .await
        .expect("the sweeper waited for a locked row")
        .unwrap();
    assert_eq!(report.purged_records, 9, "{report:?}");
    assert_eq!(report.purged_messages, 9, "{report:?}");

    held.release().await;
    let report = sweeper.run_once().await.unwrap();
    assert_eq!((report.purged_records, report.purged_messages), (1, 1));
}

async fn concurrent_sweepers_purge_each_row_exactly_once<D: Driver>()
where
    D::Db: Fixtures,
{
    let db = D::db(6).await;
    db.insert_records(5000, "expired", "SUCCESS", -HOUR, None)
        .await;
    db.insert_messages(5000, "expired", "FAILED", -30.0 * DAY)
        .await;
    db.insert_records(100, "live", "SUCCESS", HOUR, None).await;

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

async fn a_spawned_sweeper_purges_on_every_tick_and_stops_on_shutdown<D: Driver>()
where
    D::Db: Fixtures,
{
    let db = D::db(2).await;
    db.insert_records(100, "expired", "SUCCESS", -HOUR, None)
        .await;
    let handle = Sweeper::new(D::pool(&db))
        .interval(Duration::from_millis(50))
        .spawn();
    eventually("the first sweep", || async { db.records().await == 0 }).await;

    db.insert_messages(20, "expired", "SUCCESS", -HOUR).await;
    eventually("a later sweep", || async { messages(&db).await == 0 }).await;

    tokio::time::timeout(Duration::from_secs(5), handle.shutdown())
        .await
        .expect("shutdown did not finish");
    db.insert_records(10, "after", "SUCCESS", -HOUR, None).await;
    // Four intervals: a sweeper still running would have purged these.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(db.records().await, 10);
    db.assert_settles().await;
}

async fn shutdown_does_not_wait_for_the_next_interval<D: Driver>()
where
    D::Db: Fixtures,
{
    let db = D::db(2).await;
    db.insert_records(10, "expired", "SUCCESS", -HOUR, None)
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

async fn admin_lookup_finds_a_record_by_scope_and_key<D: Driver>()
where
    D::Db: Fixtures,
{
    let db = D::db(4).await;
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
    let (id, fingerprint) = db.id_and_fingerprint("alice").await;
    assert_eq!(record.id, id);
    assert_eq!(record.fingerprint, fingerprint);
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
    let db = D::db(4).await;
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

async fn admin_stale_lists_processing_rows_past_their_lease_oldest_first<D: Driver>()
where
    D::Db: Fixtures,
{
    let db = D::db(2).await;
    let expires = HOUR;
    db.insert_records(1, "lapsed-10s", "PROCESSING", expires, Some(-10.0))
        .await;
    db.insert_records(1, "lapsed-5m", "PROCESSING", expires, Some(-5.0 * MINUTE))
        .await;
    db.insert_records(1, "lapsed-1m", "PROCESSING", expires, Some(-MINUTE))
        .await;
    db.insert_records(1, "held", "PROCESSING", expires, Some(MINUTE))
        .await;
    db.insert_records(1, "done", "SUCCESS", expires, None).await;
    db.insert_records(1, "failed", "FAILED", expires, None)
        .await;

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
    let db = D::db(2).await;
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

async fn admin_purge_now_uses_the_default_retention<D: Driver>()
where
    D::Db: Fixtures,
{
    let db = D::db(2).await;
    db.insert_records(3, "success", "SUCCESS", -MINUTE, None)
        .await;
    db.insert_records(4, "failed-1d", "FAILED", -DAY, None)
        .await;
    db.insert_records(5, "failed-8d", "FAILED", -8.0 * DAY, None)
        .await;
    db.insert_messages(6, "g", "SUCCESS", -MINUTE).await;

    let report = Admin::new(D::pool(&db)).purge_now().await.unwrap();
    assert_eq!(report.purged_records, 3 + 5, "{report:?}");
    assert_eq!(report.purged_messages, 6, "{report:?}");
    assert_eq!(in_scope(&db, "failed-1d").await, 4);
}

/// A local recorder sees only this thread, so the test drives its own single-threaded
/// runtime instead of `#[tokio::test]`'s.
fn a_sweep_emits_the_documented_metrics<D: Driver>()
where
    D::Db: Fixtures,
{
    let capture = Arc::new(Capture::default());
    let recorder = Recorder(Arc::clone(&capture));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let report = metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            let db = D::db(2).await;
            db.insert_records(3, "expired", "SUCCESS", -HOUR, None)
                .await;
            db.insert_messages(2, "g", "SUCCESS", -HOUR).await;
            let expires = HOUR;
            db.insert_records(1, "lapsed-2m", "PROCESSING", expires, Some(-2.0 * MINUTE))
                .await;
            db.insert_records(1, "lapsed-5s", "PROCESSING", expires, Some(-5.0))
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

/// SQLite's equivalent of `rows_locked_by_live_traffic_are_skipped_not_waited_for`: it has
/// no row locks to skip, only its one write lock, which live traffic's write transaction
/// holds. A batch waits for it (up to the busy timeout, 5 s) and the sweep then purges
/// everything: live traffic holds the sweep back, it does not make it fail.
#[cfg(feature = "sqlite")]
async fn a_live_writer_holds_the_sweep_back_until_it_ends() {
    use ::sqlx::Connection;
    let db = <Sqlite as Driver>::db(2).await;
    db.insert_records(10, "expired", "SUCCESS", -HOUR, None)
        .await;
    db.insert_messages(10, "expired", "SUCCESS", -HOUR).await;
    let mut live =
        ::sqlx::SqliteConnection::connect_with(&common::sqlite::SqliteDb::options_for(&db.path))
            .await
            .unwrap();
    ::sqlx::raw_sql(
        "BEGIN IMMEDIATE; \
         UPDATE idempotency_records SET updated_at = updated_at \
         WHERE rowid = (SELECT min(rowid) FROM idempotency_records)",
    )
    .execute(&mut live)
    .await
    .unwrap();

    let sweeper = Sweeper::new(Sqlite::pool(&db)).batch_size(3);
    let started = tokio::time::Instant::now();
    let sweep = tokio::spawn(async move { sweeper.run_once().await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !sweep.is_finished(),
        "the sweep did not wait for the writer"
    );
    // WAL: reading never waits for the writer.
    assert_eq!(db.records().await, 10);
    ::sqlx::raw_sql("ROLLBACK")
        .execute(&mut live)
        .await
        .unwrap();
    let report = tokio::time::timeout(Duration::from_secs(5), sweep)
        .await
        .expect("the sweep did not finish once the writer ended")
        .unwrap()
        .unwrap();
    assert!(started.elapsed() >= Duration::from_millis(500));
    assert_eq!(
        (report.purged_records, report.purged_messages),
        (10, 10),
        "{report:?}"
    );
    assert_eq!((db.records().await, messages(&db).await), (0, 0));
    live.close().await.unwrap();
    db.assert_settles().await;
}

for_each_database! {
    #[tokio::test]
    async batched_purge_removes_exactly_the_expired_rows;
    #[tokio::test]
    async archiving_moves_each_expired_record_into_the_archive_once;
    #[tokio::test]
    async a_metadata_archive_leaves_the_response_out;
    #[tokio::test]
    async a_sink_holds_each_expired_record_before_it_is_purged;
    #[test]
    sync a_failing_sink_deletes_nothing_and_its_batch_is_sent_next_run;
    #[tokio::test]
    async a_record_changed_while_the_sink_writes_stays_and_goes_next_run;
    #[tokio::test]
    async archived_records_are_purged_after_their_own_retention;
    #[tokio::test]
    async admin_finds_the_archived_records_of_a_key;
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

// Row locks held by another session: PostgreSQL's drivers here, MySQL/MariaDB's below. SQLite
// has no row locks (one writer): its equivalent is
// `sqlite_only::a_live_writer_holds_the_sweep_back_until_it_ends`.
for_each_postgres_driver! {
    #[tokio::test]
    async rows_locked_by_live_traffic_are_skipped_not_waited_for;
}

#[cfg(feature = "mysql")]
mod mysql_only {
    use super::*;
    for_each_driver!(
        @test common::MySql;
        async rows_locked_by_live_traffic_are_skipped_not_waited_for;
        #[tokio::test]
    );
}

#[cfg(feature = "sqlite")]
mod sqlite_only {
    #[tokio::test]
    async fn a_live_writer_holds_the_sweep_back_until_it_ends() {
        super::a_live_writer_holds_the_sweep_back_until_it_ends().await
    }
}
