//! The MySQL/MariaDB side of the shared suite: a database of the test's own on the server
//! `MYSQL_URL` names (dropped when the test ends), and the [`MySql`] driver.

use std::str::FromStr;
use std::time::Duration;

use axum_idempotency::mysql::MySqlStore;
use axum_idempotency::{Error, IdempotentTx};
use sqlx::mysql::{MySqlConnectOptions, MySqlPool, MySqlPoolOptions};

use super::drivers::{
    Database, Driver, MessageColumns, MessageRow, RecordColumns, TestDatabase, TestStore,
};
use super::unique_name;

/// The server's URL (no database): `MYSQL_URL`, e.g. `mysql://root@127.0.0.1:3306`.
pub fn mysql_url() -> String {
    std::env::var("MYSQL_URL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306".to_owned())
}

/// The test handler's tables. InnoDB has no deferred constraints: the `fail_commit_once`
/// knob is not used on MySQL.
pub const TEST_TABLES: &str = "
    CREATE TABLE orders (
        id      BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
        user_id BIGINT NOT NULL,
        amount  BIGINT NOT NULL
    ) ENGINE = InnoDB;
    CREATE TABLE parents (id BIGINT PRIMARY KEY) ENGINE = InnoDB;
    CREATE TABLE children (
        parent_id BIGINT,
        FOREIGN KEY (parent_id) REFERENCES parents (id)
    ) ENGINE = InnoDB;";

/// A database of one test's own, dropped when the test ends.
pub struct MySqlDb {
    pub name: String,
    pub pool_size: usize,
    /// A small pool outside the tests' pools, for checks.
    pub admin: MySqlPool,
}

impl MySqlDb {
    /// The connect options of this test's database.
    pub fn options(&self) -> MySqlConnectOptions {
        MySqlConnectOptions::from_str(&mysql_url())
            .unwrap()
            .database(&self.name)
    }

    /// A new, empty database: nothing migrated.
    pub async fn bare(pool_size: usize) -> Self {
        let name = unique_name("axi");
        let server = MySqlConnectOptions::from_str(&mysql_url()).unwrap();
        let mut conn = <sqlx::MySqlConnection as sqlx::Connection>::connect_with(&server)
            .await
            .expect("connect to MYSQL_URL: is MariaDB running?");
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "CREATE DATABASE {name} CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci"
        )))
        .execute(&mut conn)
        .await
        .unwrap();
        let options = server.database(&name);
        let admin = MySqlPoolOptions::new()
            .max_connections(2)
            .connect_with(options)
            .await
            .unwrap();
        Self {
            name,
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

    /// A pool over this database of `size` connections.
    pub fn pool(&self, size: usize) -> MySqlPool {
        MySqlPoolOptions::new()
            .max_connections(size as u32)
            .acquire_timeout(Duration::from_secs(10))
            .connect_lazy_with(self.options())
    }

    /// Transactions open on this database (InnoDB's view).
    pub async fn open_transactions(&self) -> i64 {
        sqlx::query_scalar(
            "SELECT count(*) FROM information_schema.INNODB_TRX t \
             JOIN information_schema.PROCESSLIST p ON p.ID = t.trx_mysql_thread_id \
             WHERE p.DB = ? AND p.ID <> CONNECTION_ID()",
        )
        .bind(&self.name)
        .fetch_one(&self.admin)
        .await
        .unwrap()
    }
}

impl TestDatabase for MySqlDb {
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
        self.execute(
            "UPDATE idempotency_records SET expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND",
        )
        .await;
    }

    async fn only_record(&self) -> RecordColumns {
        let (status, body, scope, key, ttl_seconds, fingerprint_len) = sqlx::query_as(
            "SELECT status, body, scope, idempotency_key, \
             CAST(ROUND(TIMESTAMPDIFF(MICROSECOND, created_at, expires_at) / 1000000) AS SIGNED), \
             CAST(LENGTH(fingerprint) AS SIGNED) FROM idempotency_records",
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

    async fn lease_record(&self) -> (String, bool, i64, i16, bool) {
        let (state, retryable, token, status, live): (String, bool, i64, i16, i64) =
            sqlx::query_as(
                "SELECT state, retryable, fencing_token, status, \
                 CAST(COALESCE(locked_until > UTC_TIMESTAMP(6), 0) AS SIGNED) FROM idempotency_records",
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
        self.execute("UPDATE inbox_messages SET expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND")
            .await;
    }

    async fn assert_settles(&self) {
        // InnoDB refreshes its INNODB_TRX view only when it was not read for 0.1 s: polling
        // faster would read the same snapshot forever.
        for _ in 0..40 {
            if self.open_transactions().await == 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let open: Vec<(i64, String, String, Option<String>, String)> = sqlx::query_as(
            "SELECT CAST(p.ID AS SIGNED), CAST(t.trx_state AS CHAR), CAST(p.COMMAND AS CHAR), \
             CAST(t.trx_query AS CHAR), CAST(t.trx_started AS CHAR) \
             FROM information_schema.INNODB_TRX t \
             JOIN information_schema.PROCESSLIST p ON p.ID = t.trx_mysql_thread_id \
             WHERE p.DB = ? AND p.ID <> CONNECTION_ID()",
        )
        .bind(&self.name)
        .fetch_all(&self.admin)
        .await
        .unwrap();
        panic!(
            "connections did not settle: transactions open (thread, state, command, query, started): {open:?}"
        );
    }
}

impl Drop for MySqlDb {
    fn drop(&mut self) {
        let name = self.name.clone();
        // Dropping runs inside the test's runtime; use a thread with its own.
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async {
                let server = MySqlConnectOptions::from_str(&mysql_url()).unwrap();
                if let Ok(mut conn) =
                    <sqlx::MySqlConnection as sqlx::Connection>::connect_with(&server).await
                {
                    // A session the test left open (a panic mid-transaction) would hold
                    // the drop's metadata lock for ever: end every other session first.
                    let others: Vec<i64> = sqlx::query_scalar(
                        "SELECT CAST(ID AS SIGNED) FROM information_schema.PROCESSLIST \
                         WHERE DB = ? AND ID <> CONNECTION_ID()",
                    )
                    .bind(&name)
                    .fetch_all(&mut conn)
                    .await
                    .unwrap_or_default();
                    for id in others {
                        let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(format!("KILL CONNECTION {id}")))
                            .execute(&mut conn)
                            .await;
                    }
                    let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                        "SET SESSION lock_wait_timeout = 10; DROP DATABASE IF EXISTS {name}"
                    )))
                    .execute(&mut conn)
                    .await;
                }
            });
        })
        .join();
    }
}

impl TestStore for MySqlStore {
    async fn insert_order(
        tx: &mut IdempotentTx<Self>,
        user: i64,
        amount: i64,
    ) -> Result<i64, Error> {
        let done = sqlx::query("INSERT INTO orders (user_id, amount) VALUES (?, ?)")
            .bind(user)
            .bind(amount)
            .execute(&mut **tx)
            .await?;
        Ok(done.last_insert_id() as i64)
    }

    async fn run(tx: &mut IdempotentTx<Self>, sql: &'static str) -> Result<u64, Error> {
        Ok(sqlx::query(sql).execute(&mut **tx).await?.rows_affected())
    }

    async fn text(tx: &mut IdempotentTx<Self>, sql: &'static str) -> Result<String, Error> {
        Ok(sqlx::query_scalar(sql).fetch_one(&mut **tx).await?)
    }
}

/// The MySQL/MariaDB driver over a database of the test's own.
pub struct MySql;

impl Driver for MySql {
    type Pool = MySqlPool;
    type Store = MySqlStore;
    type Db = MySqlDb;
    const DATABASE: Database = Database::MySql;
    const PIPELINED: bool = false;
    const LAZY: bool = false;
    const GUARDED: bool = false;

    async fn db(pool_size: usize) -> MySqlDb {
        MySqlDb::new(pool_size).await
    }

    fn pool(db: &MySqlDb) -> MySqlPool {
        db.pool(db.pool_size)
    }

    fn in_use(pool: &MySqlPool) -> usize {
        pool.size() as usize - pool.num_idle()
    }

    async fn hold(pool: &MySqlPool) -> Box<dyn Send> {
        Box::new(pool.acquire().await.unwrap())
    }
}
