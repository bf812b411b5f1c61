//! The SQLite side of the shared suite: a database file of the test's own under the
//! system's temporary directory (no server), and the [`Sqlite`] driver.

use std::path::PathBuf;
use std::time::Duration;

use axum_idempotency::sqlite::SqliteStore;
use axum_idempotency::{Error, IdempotentTx};
use sqlx::Connection;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool, SqlitePoolOptions};

use super::drivers::{
    Database, Driver, MessageColumns, MessageRow, RecordColumns, TestDatabase, TestStore,
};
use super::unique_name;

/// The test handler's tables, as [`TEST_TABLES`](super::TEST_TABLES) on PostgreSQL: the
/// children's foreign key is checked at COMMIT (`foreign_keys` is on in the crate's
/// connect options), so the `fail_commit_once` knob can make a COMMIT fail.
pub const TEST_TABLES: &str = "
    CREATE TABLE orders (
        id      INTEGER PRIMARY KEY AUTOINCREMENT,
        user_id INTEGER NOT NULL,
        amount  INTEGER NOT NULL
    );
    CREATE TABLE parents (id INTEGER PRIMARY KEY);
    CREATE TABLE children (
        parent_id INTEGER REFERENCES parents (id) DEFERRABLE INITIALLY DEFERRED
    );";

/// A database file of one test's own, deleted when the test ends.
pub struct SqliteDb {
    pub path: PathBuf,
    pub pool_size: usize,
    /// A pool of one connection outside the tests' pools, for checks.
    pub admin: SqlitePool,
}

impl SqliteDb {
    /// A new, empty database file: nothing migrated.
    pub async fn bare(pool_size: usize) -> Self {
        let dir = std::env::temp_dir().join("axum-idempotency-tests");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{}.db", unique_name("axi")));
        let admin = SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(Self::options_for(&path))
            .await
            .unwrap();
        Self {
            path,
            pool_size,
            admin,
        }
    }

    /// A migrated database with the test tables.
    pub async fn new(pool_size: usize) -> Self {
        let db = Self::bare(pool_size).await;
        axum_idempotency::migrate(&db.admin).await.unwrap();
        sqlx::raw_sql(TEST_TABLES).execute(&db.admin).await.unwrap();
        db
    }

    /// The crate's connect options for `path`.
    pub fn options_for(path: &std::path::Path) -> SqliteConnectOptions {
        SqliteStore::connect_options(path)
    }

    /// A pool over this database of `size` connections.
    pub fn pool(&self, size: usize) -> SqlitePool {
        SqlitePoolOptions::new()
            .max_connections(size as u32)
            .acquire_timeout(Duration::from_secs(10))
            .connect_lazy_with(Self::options_for(&self.path))
    }
}

impl TestDatabase for SqliteDb {
    fn pool_size(&self) -> usize {
        self.pool_size
    }

    async fn scalar(&self, sql: &str) -> i64 {
        sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()))
            .fetch_one(&self.admin)
            .await
            .unwrap()
    }

    async fn execute(&self, sql: &str) {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
            .execute(&self.admin)
            .await
            .unwrap();
    }

    async fn expire_records(&self) {
        self.execute("UPDATE idempotency_records SET expires_at = unixepoch('subsec') - 1")
            .await;
    }

    async fn only_record(&self) -> RecordColumns {
        let (status, body, scope, key, ttl_seconds, fingerprint_len) = sqlx::query_as(
            "SELECT status, body, scope, idempotency_key, \
             CAST(round(expires_at - created_at) AS INTEGER), length(fingerprint) \
             FROM idempotency_records",
        )
        .fetch_one(&self.admin)
        .await
        .unwrap();
        RecordColumns {
            status,
            body,
            scope,
            key,
            ttl_seconds,
            fingerprint_len,
        }
    }

    /// Settled when the write lock is free: a connection left inside a write transaction
    /// would hold it.
    async fn lease_record(&self) -> (String, bool, i64, i16, bool) {
        let (state, retryable, token, status, live): (String, bool, i64, i16, i64) =
            sqlx::query_as(
                "SELECT state, retryable, fencing_token, status, \
                 coalesce(locked_until > unixepoch('subsec'), 0) FROM idempotency_records",
            )
            .fetch_one(&self.admin)
            .await
            .unwrap();
        (state, retryable, token, status, live != 0)
    }

    async fn next_fencing_token(&self, next: i64) {
        self.execute(&format!(
            "UPDATE idempotency_counters SET value = {} WHERE name = 'fencing'",
            next - 1
        ))
        .await;
    }

    async fn message_record(&self, group: &str, message_id: &str) -> Option<MessageColumns> {
        let row: Option<MessageRow> = sqlx::query_as(
            "SELECT status, attempts, last_error, payload_digest, payload \
                 FROM inbox_messages WHERE consumer_group = ? AND message_id = ?",
        )
        .bind(group)
        .bind(message_id)
        .fetch_optional(&self.admin)
        .await
        .unwrap();
        row.map(MessageColumns::from)
    }

    async fn expire_messages(&self) {
        self.execute("UPDATE inbox_messages SET expires_at = unixepoch('subsec') - 1")
            .await;
    }

    async fn assert_settles(&self) {
        let mut conn = sqlx::SqliteConnection::connect_with(
            &Self::options_for(&self.path).busy_timeout(Duration::ZERO),
        )
        .await
        .unwrap();
        for _ in 0..200 {
            if sqlx::raw_sql("BEGIN IMMEDIATE")
                .execute(&mut conn)
                .await
                .is_ok()
            {
                sqlx::raw_sql("ROLLBACK").execute(&mut conn).await.unwrap();
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("a connection still holds SQLite's write lock after 10 s");
    }
}

impl Drop for SqliteDb {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm"] {
            let mut path = self.path.clone().into_os_string();
            path.push(suffix);
            let _ = std::fs::remove_file(path);
        }
    }
}

impl TestStore for SqliteStore {
    async fn insert_order(
        tx: &mut IdempotentTx<Self>,
        user: i64,
        amount: i64,
    ) -> Result<i64, Error> {
        let id =
            sqlx::query_scalar("INSERT INTO orders (user_id, amount) VALUES (?, ?) RETURNING id")
                .bind(user)
                .bind(amount)
                .fetch_one(&mut **tx)
                .await?;
        Ok(id)
    }

    async fn run(tx: &mut IdempotentTx<Self>, sql: &'static str) -> Result<u64, Error> {
        Ok(sqlx::query(sql).execute(&mut **tx).await?.rows_affected())
    }

    async fn text(tx: &mut IdempotentTx<Self>, sql: &'static str) -> Result<String, Error> {
        Ok(sqlx::query_scalar(sql).fetch_one(&mut **tx).await?)
    }
}

/// The SQLite driver over a file of the test's own.
pub struct Sqlite;

impl Driver for Sqlite {
    type Pool = SqlitePool;
    type Store = SqliteStore;
    type Db = SqliteDb;
    const DATABASE: Database = Database::Sqlite;
    const PIPELINED: bool = false;
    const LAZY: bool = false;
    const GUARDED: bool = false;

    async fn db(pool_size: usize) -> SqliteDb {
        SqliteDb::new(pool_size).await
    }

    fn pool(db: &SqliteDb) -> SqlitePool {
        db.pool(db.pool_size)
    }

    fn in_use(pool: &SqlitePool) -> usize {
        pool.size() as usize - pool.num_idle()
    }

    async fn hold(pool: &SqlitePool) -> Box<dyn Send> {
        Box::new(pool.acquire().await.unwrap())
    }
}
