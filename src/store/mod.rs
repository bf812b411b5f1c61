//! The storage seam: [`Store`], the core every database driver implements (what the HTTP
//! claim needs), the optional abilities on top of it ([`LeaseStore`], [`InboxStore`],
//! [`OutboxStore`], [`MaintenanceStore`]), and [`IdempotentTx`], the one handle every
//! driver hands out.
//!
//! The HTTP adapter, the [`Inbox`](crate::Inbox), lease mode, the outbox relay, the
//! [`Sweeper`](crate::Sweeper) and [`Admin`](crate::Admin) are written once against these
//! traits, each asking for the ability it uses; every SQL statement lives in a driver
//! module (`postgres/` for tokio-postgres over any pool, `sqlx/` for sqlx), in the shared
//! statement texts of [`sql`] with their row decoders in [`rows`], and in the migration
//! files they both run.
//!
//! A driver that cannot pipeline (sqlx) may take more round trips, never weaker
//! semantics: its claim still takes the key's lock before it looks the record up, its
//! COMMIT still carries the record, and its pooled connections never go back to the pool
//! inside a transaction.

mod abilities;
// Lease mode as one upsert (PostgreSQL on either client), written once.
#[cfg(any(feature = "postgres", feature = "sqlx"))]
mod lease_upsert;
pub(crate) mod migrations;
pub(crate) mod queries;
pub(crate) mod rows;
// PostgreSQL's statement texts, shared by its two drivers.
#[cfg(any(feature = "postgres", feature = "sqlx"))]
pub(crate) mod sql;
// The sweeper's one-statement batches, written once.
#[cfg(any(feature = "postgres", feature = "sqlx", feature = "sqlite"))]
pub(crate) mod sweep;
// The three sqlx drivers' handle, written once.
#[cfg(feature = "_sqlx")]
pub(crate) mod sqlx_tx;
mod tx;

pub use self::abilities::{InboxStore, LeaseStore, MaintenanceStore, OutboxStore};
#[cfg(any(feature = "postgres", feature = "sqlx"))]
pub(crate) use self::lease_upsert::UpsertLease;
pub use self::tx::IdempotentTx;
pub(crate) use self::tx::TxHandle;

use std::future::Future;
use std::time::Duration;

use self::queries::{Param, Queries, TxQueries};
use crate::engine::error::Error;
use crate::engine::fingerprint::Fingerprint;
use crate::engine::key::RecordId;
use crate::engine::record::{Claim, CommitError, Completion, Deferred, NewRecord, RecordRow};

/// A database driver the crate's components run on: `PgStore` (feature `postgres`:
/// tokio-postgres over deadpool, bb8 or any `ClientPool`), `SqlxStore` (feature `sqlx`,
/// over a `sqlx::PgPool`), `MySqlStore` (feature `mysql`, over a `sqlx::MySqlPool`) or
/// `SqliteStore` (feature `sqlite`, over a `sqlx::SqlitePool`). This is the core, what the HTTP claim needs; the other
/// components ask for an ability on top of it.
///
/// Sealed: its operations are the crate's business, and a new driver is added in the
/// crate. Components take anything that [`IntoStore`], so users pass their pool.
pub trait Store: Clone + Send + Sync + 'static + sealed::Sealed + Queries {
    /// What a handler or inbox work holds to run statements in the shared transaction.
    #[doc(hidden)]
    type Handle: TxHandle<
            Target = Self::Tx,
            Conn: TxQueries<Statement = Self::Statement, Row = <Self as Queries>::Row>,
        >;
    /// What [`IdempotentTx`] derefs to.
    type Tx: ?Sized;

    /// The driver's name, for diagnostics.
    #[doc(hidden)]
    const DRIVER: &'static str;

    #[doc(hidden)]
    fn set_prepared_statements(&mut self, enabled: bool);

    /// [`ClaimMode::Optimistic`](crate::ClaimMode::Optimistic) with its twins' bound, or
    /// `None` for the locked claim; a store without it keeps the locked claim.
    #[doc(hidden)]
    fn set_optimistic_claim(&mut self, _bound: Option<Duration>) {}

    #[doc(hidden)]
    fn migrate(&self) -> impl Future<Output = Result<(), Error>> + Send;

    /// The highest migration applied (0 when none, or no migration table).
    #[doc(hidden)]
    fn schema_version(&self) -> impl Future<Output = Result<i32, Error>> + Send {
        async move {
            let table = self.query_opt(Self::STATEMENTS.schema_table, &[], rows::first_i64);
            if table.await?.unwrap_or(0) == 0 {
                return Ok(0);
            }
            let version = self.query_opt(Self::STATEMENTS.schema_version, &[], rows::first_i32);
            Ok(version.await?.unwrap_or(0))
        }
    }

    /// Begins a transaction and claims the key: the lock first, then the record in a
    /// snapshot taken after it. With `wait`, the lock is awaited for that long.
    #[doc(hidden)]
    fn claim(
        &self,
        id: RecordId,
        fingerprint: Fingerprint,
        wait: Option<Duration>,
    ) -> impl Future<Output = Result<(Claim, ConnOf<Self>), Error>> + Send;

    /// Inserts the record and commits, the handler's writes with it (or, for a stored 4xx,
    /// without them). On success or conflict the transaction has ended.
    #[doc(hidden)]
    fn commit(
        conn: &mut ConnOf<Self>,
        record: &NewRecord<'_>,
        completion: Completion,
    ) -> impl Future<Output = Result<(), CommitError>> + Send;

    /// What the key's lock found when the driver deferred it to the handler's first
    /// statement.
    #[doc(hidden)]
    fn deferred(_conn: &ConnOf<Self>) -> Deferred {
        Deferred::Granted
    }

    /// Begins a plain transaction: no key, no lock, no record (a route whose layer does not
    /// require a key, and a request that sent none).
    #[doc(hidden)]
    fn begin(&self) -> impl Future<Output = Result<ConnOf<Self>, Error>> + Send;

    /// Commits a plain transaction.
    #[doc(hidden)]
    fn commit_plain(conn: &mut ConnOf<Self>) -> impl Future<Output = Result<(), Error>> + Send {
        conn.tx_commit()
    }

    /// Rolls back and waits until the connection is clean (or discarded).
    #[doc(hidden)]
    fn rollback(conn: ConnOf<Self>) -> impl Future<Output = ()> + Send;

    /// The record of `id` outside any transaction (after the primary key caught a race).
    #[doc(hidden)]
    fn lookup(
        &self,
        id: RecordId,
    ) -> impl Future<Output = Result<Option<RecordRow>, Error>> + Send {
        let statement = Self::STATEMENTS.lookup;
        async move {
            self.query_opt(statement, &[Param::Id(id)], rows::lookup)
                .await
        }
    }

    /// Resolves, with the error to report, once the database is found unreachable while a
    /// handler's (or an Inbox consumer's) statements run, for a driver whose connections
    /// cannot notice a silent link themselves (sqlx: no TCP keepalive or user timeout). The
    /// layer then abandons the handler and answers 503; the Inbox abandons the work and
    /// reports a store error (the message is not acknowledged). Default: never
    /// (tokio-postgres connections fail by their own TCP timeouts).
    #[doc(hidden)]
    fn link_lost(&self) -> impl Future<Output = Error> + Send {
        std::future::pending()
    }
}

/// A store's pooled connection inside a transaction the crate began: what its handle's
/// shared transaction holds.
pub(crate) type ConnOf<S> = <<S as Store>::Handle as TxHandle>::Conn;

/// What the crate's components accept where they need the database: a pool of one of the
/// supported drivers, or a [`Store`] already built from one.
///
/// | you pass | store |
/// | --- | --- |
/// | `deadpool_postgres::Pool` (feature `deadpool`, default) | `PgStore` |
/// | `bb8::Pool<bb8_postgres::PostgresConnectionManager<T>>` (feature `bb8`) | `PgStore` |
/// | any `postgres::ClientPool`, through `PgStore::new` (feature `postgres`) | `PgStore` |
/// | `sqlx::PgPool` (feature `sqlx`) | `SqlxStore` |
/// | `sqlx::MySqlPool` (feature `mysql`) | `MySqlStore` |
/// | `sqlx::SqlitePool` (feature `sqlite`) | `SqliteStore` |
pub trait IntoStore {
    /// The store this pool becomes.
    type Store: Store;
    /// Wraps the pool.
    fn into_store(self) -> Self::Store;
}

impl<S: Store> IntoStore for S {
    type Store = S;

    fn into_store(self) -> S {
        self
    }
}

/// Creates or upgrades the crate's tables through any supported pool. Safe to call from
/// every instance at start-up: concurrent calls wait for each other, and applied versions
/// are recorded in `axum_idempotency_migrations`.
///
/// ```no_run
/// # async fn run(pool: deadpool_postgres::Pool) -> Result<(), axum_idempotency::Error> {
/// axum_idempotency::migrate(&pool).await?;
/// # Ok(()) }
/// ```
pub async fn migrate<P>(pool: &P) -> Result<(), Error>
where
    P: IntoStore + Clone,
{
    pool.clone().into_store().migrate().await
}

/// Checks, without changing anything, that the database behind `pool` holds the schema
/// this version of the crate needs — for a start-up check that tells the operator before
/// the first request does. [`Error::SchemaOutdated`] when `migrate` has not run (or ran
/// from an older version), [`Error::UnknownSchemaVersion`] when a newer version migrated
/// it.
///
/// ```no_run
/// # async fn run(pool: deadpool_postgres::Pool) -> Result<(), axum_idempotency::Error> {
/// if let Err(error) = axum_idempotency::check_schema(&pool).await {
///     eprintln!("not serving: {error}");
///     std::process::exit(1);
/// }
/// # Ok(()) }
/// ```
pub async fn check_schema<P>(pool: &P) -> Result<(), Error>
where
    P: IntoStore + Clone,
{
    let found = pool.clone().into_store().schema_version().await?;
    let known = migrations::latest();
    match found.cmp(&known) {
        std::cmp::Ordering::Less => Err(Error::SchemaOutdated {
            found,
            needed: known,
        }),
        std::cmp::Ordering::Equal => Ok(()),
        std::cmp::Ordering::Greater => Err(Error::UnknownSchemaVersion { found, known }),
    }
}

pub(crate) mod sealed {
    #[allow(unreachable_pub)]
    pub trait Sealed {}
}
