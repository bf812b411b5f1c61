//! The storage seam: the one narrow trait each database driver implements.
//!
//! The HTTP adapter, the [`Inbox`](crate::Inbox), lease mode, the
//! [`Sweeper`](crate::Sweeper) and [`Admin`](crate::Admin) are written once against
//! [`Store`]; every SQL statement lives in a driver module ([`crate::postgres`] for
//! tokio-postgres over any pool, `crate::sqlx` for sqlx) and in the shared statement texts
//! of [`sql`] and the migration files they both run.
//!
//! A driver that cannot pipeline (sqlx) may take more round trips, never weaker
//! semantics: its claim still takes the key's lock before it looks the record up, its
//! COMMIT still carries the record, and its pooled connections never go back to the pool
//! inside a transaction.

pub(crate) mod migrations;
pub(crate) mod sql;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::Error;
use crate::admin::OutboxInfo;
use crate::admin::{MessageInfo, RecordInfo};
use crate::engine::fingerprint::Fingerprint;
use crate::engine::key::RecordId;
use crate::engine::outbox::{OutboxBatch, Settlement};
use crate::engine::record::{
    Backlog, Claim, CommitError, Completion, InboxClaim, InboxWrite, LeaseClaim, LeaseEnd,
    NewRecord, RecordRow, SweepBatch,
};
use crate::engine::shared_tx::SharedTx;

/// A database driver the crate's components run on: [`PgStore`](crate::postgres::PgStore)
/// (tokio-postgres over deadpool, bb8 or any [`ClientPool`](crate::postgres::ClientPool))
/// or `SqlxStore` (feature `sqlx`, over a `sqlx::PgPool`).
///
/// Sealed: its operations are the crate's business, and a new driver is added in the
/// crate. Components take anything that [`IntoStore`], so users pass their pool.
pub trait Store: Clone + Send + Sync + 'static + sealed::Sealed {
    /// A pooled connection inside a transaction the crate began.
    #[doc(hidden)]
    type Conn: Send + Sync + 'static;
    /// What a handler or inbox work holds to run statements in the shared transaction.
    #[doc(hidden)]
    type Handle: Send + 'static;

    /// The driver's name, for diagnostics.
    #[doc(hidden)]
    const DRIVER: &'static str;

    #[doc(hidden)]
    fn set_prepared_statements(&mut self, enabled: bool);

    #[doc(hidden)]
    fn migrate(&self) -> impl Future<Output = Result<(), Error>> + Send;

    /// The highest migration applied (0 when none, or no migration table).
    #[doc(hidden)]
    fn schema_version(&self) -> impl Future<Output = Result<i32, Error>> + Send;

    /// Begins a transaction and claims the key: the lock first, then the record in a
    /// snapshot taken after it. With `wait`, the lock is awaited for that long.
    #[doc(hidden)]
    fn claim(
        &self,
        id: RecordId,
        fingerprint: Fingerprint,
        wait: Option<Duration>,
    ) -> impl Future<Output = Result<(Claim, Self::Conn), Error>> + Send;

    /// Inserts the record and commits, the handler's writes with it (or, for a stored 4xx,
    /// without them). On success or conflict the transaction has ended.
    #[doc(hidden)]
    fn commit(
        conn: &mut Self::Conn,
        record: &NewRecord<'_>,
        completion: Completion,
    ) -> impl Future<Output = Result<(), CommitError>> + Send;

    /// Rolls back and waits until the connection is clean (or discarded).
    #[doc(hidden)]
    fn rollback(conn: Self::Conn) -> impl Future<Output = ()> + Send;

    /// The record of `id` outside any transaction (after the primary key caught a race).
    #[doc(hidden)]
    fn lookup(&self, id: RecordId)
    -> impl Future<Output = Result<Option<RecordRow>, Error>> + Send;

    /// Lease mode: commits a PROCESSING record, or takes over a replaceable one.
    #[doc(hidden)]
    fn lease_acquire(
        &self,
        record: &NewRecord<'_>,
        lease: Duration,
    ) -> impl Future<Output = Result<LeaseClaim, Error>> + Send;

    /// Lease mode: the holder's fenced completion; `false` if the lease was taken over.
    #[doc(hidden)]
    fn lease_complete(
        &self,
        record: &NewRecord<'_>,
        token: i64,
        end: LeaseEnd,
    ) -> impl Future<Output = Result<bool, Error>> + Send;

    /// Begins a message's transaction, waits (bounded) for its lock, reads its record and
    /// takes the savepoint a failed attempt rolls back to.
    #[doc(hidden)]
    fn inbox_claim(
        &self,
        id: RecordId,
        group: &str,
        message_id: &str,
        wait: Duration,
    ) -> impl Future<Output = Result<InboxClaim<Self::Conn>, Error>> + Send;

    /// Records success and commits with the consumer's work.
    #[doc(hidden)]
    fn inbox_commit(
        conn: &mut Self::Conn,
        write: &InboxWrite<'_>,
        attempts: i32,
    ) -> impl Future<Output = Result<(), Error>> + Send;

    /// Rolls the consumer's work back to the savepoint taken after the message's lock,
    /// records the failed attempt under that lock and commits; `None` if the message has
    /// succeeded (it cannot, under the lock).
    #[doc(hidden)]
    fn inbox_fail(
        conn: Self::Conn,
        write: &InboxWrite<'_>,
        error: &str,
    ) -> impl Future<Output = Result<Option<i32>, Error>> + Send;

    /// Records a failed attempt in a transaction of its own (when the work kept its
    /// transaction); `None` if the message has meanwhile succeeded.
    #[doc(hidden)]
    fn inbox_record_failure(
        &self,
        write: &InboxWrite<'_>,
        error: &str,
    ) -> impl Future<Output = Result<Option<i32>, Error>> + Send;

    /// One autocommit batch of the sweeper; the rows it affected.
    #[doc(hidden)]
    fn sweep_batch(&self, batch: SweepBatch) -> impl Future<Output = Result<u64, Error>> + Send;

    #[doc(hidden)]
    fn stale_summary(&self) -> impl Future<Output = Result<Backlog, Error>> + Send;

    /// Ids of the stalest PROCESSING records, the stalest first.
    #[doc(hidden)]
    fn stale_ids(&self, limit: i64) -> impl Future<Output = Result<Vec<Vec<u8>>, Error>> + Send;

    #[doc(hidden)]
    fn record_info(
        &self,
        id: RecordId,
    ) -> impl Future<Output = Result<Option<RecordInfo>, Error>> + Send;

    #[doc(hidden)]
    fn stale_records(
        &self,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<RecordInfo>, Error>> + Send;

    #[doc(hidden)]
    fn message_info(
        &self,
        group: &str,
        message_id: &str,
    ) -> impl Future<Output = Result<Option<MessageInfo>, Error>> + Send;

    #[doc(hidden)]
    fn failed_messages(
        &self,
        group: &str,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<MessageInfo>, Error>> + Send;

    /// Begins a transaction and locks the oldest pending outbox messages that are due, at
    /// most `limit`, skipping those another relay holds; `None` (and the transaction
    /// ended) when there are none.
    #[doc(hidden)]
    fn outbox_lock_batch(
        &self,
        limit: i64,
    ) -> impl Future<Output = Result<Option<OutboxBatch<Self::Conn>>, Error>> + Send;

    /// Marks a locked batch's confirmed messages SENT and its refused ones retried or
    /// parked, and commits; the number parked.
    #[doc(hidden)]
    fn outbox_settle(
        conn: Self::Conn,
        settlement: &Settlement<'_>,
    ) -> impl Future<Output = Result<u64, Error>> + Send;

    #[doc(hidden)]
    fn outbox_pending(&self) -> impl Future<Output = Result<Backlog, Error>> + Send;

    #[doc(hidden)]
    fn outbox_messages(
        &self,
        state: &str,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<OutboxInfo>, Error>> + Send;

    /// Puts a parked message back in the queue; whether one was parked under that id.
    #[doc(hidden)]
    fn outbox_requeue(&self, message_id: &str) -> impl Future<Output = Result<bool, Error>> + Send;

    /// A new handle on a transaction that holds a connection; `None` if the driver hands
    /// the connection out exclusively and another handle holds it.
    #[doc(hidden)]
    fn handle(shared: &Arc<SharedTx<Self::Conn>>) -> Option<Self::Handle>;
}

/// What the crate's components accept where they need the database: a pool of one of the
/// supported drivers, or a [`Store`] already built from one.
///
/// | you pass | store |
/// | --- | --- |
/// | `deadpool_postgres::Pool` (feature `deadpool`, default) | [`PgStore`](crate::postgres::PgStore) |
/// | `bb8::Pool<bb8_postgres::PostgresConnectionManager<T>>` (feature `bb8`) | [`PgStore`](crate::postgres::PgStore) |
/// | any [`ClientPool`](crate::postgres::ClientPool), through [`PgStore::new`](crate::postgres::PgStore::new) | [`PgStore`](crate::postgres::PgStore) |
/// | `sqlx::PgPool` (feature `sqlx`) | `SqlxStore` |
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
