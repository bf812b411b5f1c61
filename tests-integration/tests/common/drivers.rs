//! The drivers every behaviour, cancellation, inbox and lease test runs against, and the
//! handle operations the test handlers need, written once for all of them.
//!
//! A test is written once as `async fn name<D: Driver>()` and listed in
//! [`for_each_driver!`](crate::for_each_driver), which makes one test of it per driver:
//! `deadpool::name`, `bb8::name`, `sqlx::name`.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::FromRequestParts;
use axum::response::Response;
use axum_idempotency::outbox::{Enqueued, OutboxMessage};
use axum_idempotency::postgres::PgStore;
use axum_idempotency::{
    Error, IdempotentTx, InboxStore, IntoStore, LeaseStore, MaintenanceStore, OutboxStore,
};

use super::{Knobs, TestDb, database_url};

/// The statements the test handlers run, for each driver's handle.
pub trait TestStore: LeaseStore + InboxStore + OutboxStore + MaintenanceStore {
    /// Inserts an order and returns its id.
    fn insert_order(
        tx: &mut IdempotentTx<Self>,
        user: i64,
        amount: i64,
    ) -> impl Future<Output = Result<i64, Error>> + Send;
    /// Runs a statement without parameters; the rows it affected.
    fn run(
        tx: &mut IdempotentTx<Self>,
        sql: &'static str,
    ) -> impl Future<Output = Result<u64, Error>> + Send;
    /// A one-text-column query, such as `SHOW lock_timeout`.
    fn text(
        tx: &mut IdempotentTx<Self>,
        sql: &'static str,
    ) -> impl Future<Output = Result<String, Error>> + Send;
}

/// What the test handlers do through a driver's transaction handle.
pub trait TestTx:
    FromRequestParts<Arc<Knobs>, Rejection = Response>
    + FromRequestParts<(), Rejection = Response>
    + Send
    + Sync
    + 'static
{
    /// Inserts an order and returns its id.
    fn insert_order(
        &mut self,
        user: i64,
        amount: i64,
    ) -> impl Future<Output = Result<i64, Error>> + Send;
    /// Runs a statement without parameters; the rows it affected.
    fn run(&mut self, sql: &'static str) -> impl Future<Output = Result<u64, Error>> + Send;
    /// A one-text-column query, such as `SHOW lock_timeout`.
    fn text(&mut self, sql: &'static str) -> impl Future<Output = Result<String, Error>> + Send;
    /// [`IdempotentTx::derive_key`](axum_idempotency::IdempotentTx::derive_key).
    fn derive(&self, label: &str) -> String;
    /// [`IdempotentTx::enqueue`](axum_idempotency::IdempotentTx::enqueue).
    fn enqueue_message(
        &mut self,
        message: &OutboxMessage,
    ) -> impl Future<Output = Result<Enqueued, Error>> + Send;
}

impl<S: TestStore> TestTx for IdempotentTx<S> {
    async fn insert_order(&mut self, user: i64, amount: i64) -> Result<i64, Error> {
        S::insert_order(self, user, amount).await
    }

    async fn run(&mut self, sql: &'static str) -> Result<u64, Error> {
        S::run(self, sql).await
    }

    async fn text(&mut self, sql: &'static str) -> Result<String, Error> {
        S::text(self, sql).await
    }

    fn derive(&self, label: &str) -> String {
        self.derive_key(label)
    }

    async fn enqueue_message(&mut self, message: &OutboxMessage) -> Result<Enqueued, Error> {
        self.enqueue(message).await
    }
}

impl TestStore for PgStore {
    async fn insert_order(
        tx: &mut IdempotentTx<Self>,
        user: i64,
        amount: i64,
    ) -> Result<i64, Error> {
        let row = tx
            .query_one(
                "INSERT INTO orders (user_id, amount) VALUES ($1, $2) RETURNING id",
                &[&user, &amount],
            )
            .await?;
        Ok(row.get(0))
    }

    async fn run(tx: &mut IdempotentTx<Self>, sql: &'static str) -> Result<u64, Error> {
        tx.execute(sql, &[]).await
    }

    async fn text(tx: &mut IdempotentTx<Self>, sql: &'static str) -> Result<String, Error> {
        Ok(tx.query_one(sql, &[]).await?.get(0))
    }
}

#[cfg(feature = "sqlx")]
impl TestStore for axum_idempotency::sqlx::SqlxStore {
    async fn insert_order(
        tx: &mut IdempotentTx<Self>,
        user: i64,
        amount: i64,
    ) -> Result<i64, Error> {
        let id =
            sqlx::query_scalar("INSERT INTO orders (user_id, amount) VALUES ($1, $2) RETURNING id")
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

/// The database a driver talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Database {
    Postgres,
    MySql,
    Sqlite,
}

impl Database {
    /// Whether this database's suite runs: PostgreSQL's with `DATABASE_URL` set, MariaDB's
    /// with `MYSQL_URL` set, SQLite's always (it needs no server). In CI (`CI` set) a
    /// missing URL fails the test instead: no suite is skipped there.
    pub fn configured(self) -> bool {
        let variable = match self {
            Self::Postgres => "DATABASE_URL",
            Self::MySql => "MYSQL_URL",
            Self::Sqlite => return true,
        };
        if std::env::var_os(variable).is_some() {
            return true;
        }
        assert!(
            std::env::var_os("CI").is_none(),
            "{variable} is unset: CI runs the {self:?} suite"
        );
        eprintln!("skipped: {variable} is unset (the {self:?} suite)");
        false
    }
}

/// What every database's test fixture offers the tests written once for all of them.
pub trait TestDatabase: Send + Sync + 'static {
    /// The size the test asked for, of the pools [`Driver::pool`] makes.
    fn pool_size(&self) -> usize;
    /// A query of one integer, in SQL every database speaks (`SELECT count(*) FROM ..`).
    fn scalar(&self, sql: &str) -> impl Future<Output = i64> + Send;
    /// A statement without results, in SQL every database speaks.
    fn execute(&self, sql: &str) -> impl Future<Output = ()> + Send;
    /// Moves every idempotency record's expiry one second into the past.
    fn expire_records(&self) -> impl Future<Output = ()> + Send;
    /// The only record's (status, body, scope, raw key, whole seconds from creation to
    /// expiry, fingerprint length).
    fn only_record(&self) -> impl Future<Output = RecordColumns> + Send;
    /// The only record's (state, retryable, fencing token, status, lease still running).
    fn lease_record(&self) -> impl Future<Output = (String, bool, i64, i16, bool)> + Send;
    /// Makes `next` the next fencing token a lease draws.
    fn next_fencing_token(&self, next: i64) -> impl Future<Output = ()> + Send;
    /// An inbox message's record.
    fn message_record(
        &self,
        group: &str,
        message_id: &str,
    ) -> impl Future<Output = Option<MessageColumns>> + Send;
    /// Moves every inbox record's expiry one second into the past.
    fn expire_messages(&self) -> impl Future<Output = ()> + Send;
    /// Waits until no connection of the test's pools holds a transaction or a lock;
    /// panics after 10 s.
    fn assert_settles(&self) -> impl Future<Output = ()> + Send;

    fn orders(&self) -> impl Future<Output = i64> + Send {
        self.scalar("SELECT count(*) FROM orders")
    }

    fn records(&self) -> impl Future<Output = i64> + Send {
        self.scalar("SELECT count(*) FROM idempotency_records")
    }
}

/// One idempotency record's columns, as [`TestDatabase::only_record`] reads them.
#[derive(Debug)]
pub struct RecordColumns {
    pub status: i16,
    pub body: Vec<u8>,
    pub scope: String,
    pub key: Option<String>,
    pub ttl_seconds: i64,
    pub fingerprint_len: i64,
}

/// An inbox record's columns, as [`TestDatabase::message_record`] reads them.
#[derive(Debug)]
pub struct MessageColumns {
    pub status: String,
    pub attempts: i32,
    pub last_error: Option<String>,
    pub payload_digest: Option<Vec<u8>>,
    pub payload: Option<Vec<u8>>,
}

/// [`MessageColumns`] as a tuple, the way the sqlx fixtures read it.
pub type MessageRow = (
    String,
    i32,
    Option<String>,
    Option<Vec<u8>>,
    Option<Vec<u8>>,
);

impl From<MessageRow> for MessageColumns {
    fn from((status, attempts, last_error, payload_digest, payload): MessageRow) -> Self {
        Self {
            status,
            attempts,
            last_error,
            payload_digest,
            payload,
        }
    }
}

/// A driver over PostgreSQL, whose tests use [`TestDb`] and its PostgreSQL-only checks.
pub trait PgDriver: Driver<Db = TestDb> {}

impl<D: Driver<Db = TestDb>> PgDriver for D {}

/// One of the drivers under test.
pub trait Driver: Send + Sync + 'static {
    /// What the application hands the crate.
    type Pool: IntoStore<Store = Self::Store> + Clone + Send + Sync + 'static;
    type Store: TestStore;
    /// The test's database.
    type Db: TestDatabase;
    /// The database behind the driver.
    const DATABASE: Database;
    /// Whether the record's INSERT and the COMMIT leave in one round trip, so a future
    /// dropped while the INSERT waits still commits.
    const PIPELINED: bool;
    /// Whether the claim of a free key defers `BEGIN` and the key's lock to the handler's
    /// first statement (tokio-postgres), rather than take them before the handler runs.
    const LAZY: bool;
    /// Whether the handle sees the SQL it runs (refusing COMMIT and friends) and is cut off
    /// from the transaction once the handler returned.
    const GUARDED: bool;

    /// A migrated database of the test's own with the test tables (`orders`, `parents`,
    /// `children`), its pools `pool_size` large.
    fn db(pool_size: usize) -> impl Future<Output = Self::Db> + Send;
    /// A pool over this test's database, as large as the test's own.
    fn pool(db: &Self::Db) -> Self::Pool;
    /// Connections checked out of `pool`.
    fn in_use(pool: &Self::Pool) -> usize;
    /// Checks a connection out of `pool` and keeps it until the value is dropped.
    fn hold(pool: &Self::Pool) -> impl Future<Output = Box<dyn Send>> + Send;
}

/// tokio-postgres over deadpool: the test's own pool.
pub struct Deadpool;

impl Driver for Deadpool {
    type Pool = deadpool_postgres::Pool;
    type Store = axum_idempotency::postgres::PgStore;
    type Db = TestDb;
    const DATABASE: Database = Database::Postgres;
    const PIPELINED: bool = true;
    const LAZY: bool = true;
    const GUARDED: bool = true;

    async fn db(pool_size: usize) -> TestDb {
        TestDb::new(pool_size).await
    }

    fn pool(db: &TestDb) -> Self::Pool {
        db.pool.clone()
    }

    fn in_use(pool: &Self::Pool) -> usize {
        let status = pool.status();
        status.size - status.available
    }

    async fn hold(pool: &Self::Pool) -> Box<dyn Send> {
        Box::new(pool.get().await.unwrap())
    }
}

/// tokio-postgres over bb8.
pub struct Bb8;

#[cfg(feature = "bb8")]
impl Driver for Bb8 {
    type Pool = bb8::Pool<bb8_postgres::PostgresConnectionManager<tokio_postgres::NoTls>>;
    type Store = axum_idempotency::postgres::PgStore;
    type Db = TestDb;
    const DATABASE: Database = Database::Postgres;
    const PIPELINED: bool = true;
    const LAZY: bool = true;
    const GUARDED: bool = true;

    async fn db(pool_size: usize) -> TestDb {
        TestDb::new(pool_size).await
    }

    fn pool(db: &TestDb) -> Self::Pool {
        let mut config: tokio_postgres::Config = database_url().parse().unwrap();
        config.options(format!("-c search_path={}", db.search_path));
        config.application_name(&db.schema);
        bb8::Pool::builder()
            .max_size(db.pool_size as u32)
            .connection_timeout(Duration::from_secs(10))
            .build_unchecked(bb8_postgres::PostgresConnectionManager::new(
                config,
                tokio_postgres::NoTls,
            ))
    }

    fn in_use(pool: &Self::Pool) -> usize {
        let state = pool.state();
        (state.connections - state.idle_connections) as usize
    }

    async fn hold(pool: &Self::Pool) -> Box<dyn Send> {
        Box::new(pool.get_owned().await.unwrap())
    }
}

/// sqlx.
pub struct Sqlx;

#[cfg(feature = "sqlx")]
impl Driver for Sqlx {
    type Pool = sqlx::PgPool;
    type Store = axum_idempotency::sqlx::SqlxStore;
    type Db = TestDb;
    const DATABASE: Database = Database::Postgres;
    const PIPELINED: bool = false;
    const LAZY: bool = false;
    const GUARDED: bool = false;

    async fn db(pool_size: usize) -> TestDb {
        TestDb::new(pool_size).await
    }

    fn pool(db: &TestDb) -> Self::Pool {
        let options: sqlx::postgres::PgConnectOptions = database_url().parse().unwrap();
        let options = options
            .options([("search_path", db.search_path.as_str())])
            .application_name(&db.schema);
        sqlx::postgres::PgPoolOptions::new()
            .max_connections(db.pool_size as u32)
            .acquire_timeout(Duration::from_secs(10))
            .connect_lazy_with(options)
    }

    fn in_use(pool: &Self::Pool) -> usize {
        pool.size() as usize - pool.num_idle()
    }

    async fn hold(pool: &Self::Pool) -> Box<dyn Send> {
        Box::new(pool.acquire().await.unwrap())
    }
}

/// Makes one test per PostgreSQL driver of each listed `async fn name<D: PgDriver>()` (or,
/// marked `sync`, `fn name<D: PgDriver>()`), with the attributes given before it: tests of
/// what only PostgreSQL does, or that check it through [`TestDb`]'s PostgreSQL views.
#[macro_export]
macro_rules! for_each_driver {
    ($($(#[$attr:meta])* $kind:ident $name:ident;)*) => {
        mod deadpool {
            $($crate::for_each_driver!(@test $crate::common::Deadpool; $kind $name; $(#[$attr])*);)*
        }
        #[cfg(feature = "bb8")]
        mod bb8 {
            $($crate::for_each_driver!(@test $crate::common::Bb8; $kind $name; $(#[$attr])*);)*
        }
        #[cfg(feature = "sqlx")]
        mod sqlx {
            $($crate::for_each_driver!(@test $crate::common::Sqlx; $kind $name; $(#[$attr])*);)*
        }
    };
    (@test $driver:ty; async $name:ident; $(#[$attr:meta])*) => {
        $(#[$attr])*
        async fn $name() {
            if !<$driver as $crate::common::Driver>::DATABASE.configured() {
                return;
            }
            super::$name::<$driver>().await
        }
    };
    (@test $driver:ty; sync $name:ident; $(#[$attr:meta])*) => {
        $(#[$attr])*
        fn $name() {
            if !<$driver as $crate::common::Driver>::DATABASE.configured() {
                return;
            }
            super::$name::<$driver>()
        }
    };
}

/// Like [`for_each_driver!`], for tests written once for every database
/// (`async fn name<D: Driver>()`, through [`TestDatabase`]): one test per PostgreSQL
/// driver, and `mysql::name` and `sqlite::name`.
#[macro_export]
macro_rules! for_each_database {
    ($($(#[$attr:meta])* $kind:ident $name:ident;)*) => {
        $crate::for_each_driver! { $($(#[$attr])* $kind $name;)* }
        #[cfg(feature = "mysql")]
        mod mysql {
            $($crate::for_each_driver!(@test $crate::common::MySql; $kind $name; $(#[$attr])*);)*
        }
        #[cfg(feature = "sqlite")]
        mod sqlite {
            $($crate::for_each_driver!(@test $crate::common::Sqlite; $kind $name; $(#[$attr])*);)*
        }
    };
}

/// [`for_each_driver!`] in a file whose other tests are [`for_each_database!`]'s: the
/// PostgreSQL-only tests, as `postgres_only::deadpool::name` and so on.
#[macro_export]
macro_rules! for_each_postgres_driver {
    ($($list:tt)*) => {
        mod postgres_only {
            use super::*;
            $crate::for_each_driver! { $($list)* }
        }
    };
}
