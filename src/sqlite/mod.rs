//! The SQLite driver (feature `sqlite`, sqlx 0.9 with its bundled SQLite): [`SqliteStore`]
//! over an `sqlx::SqlitePool`, and [`IdempotentTx`], the extractor whose handle derefs to
//! the shared transaction's `SqliteConnection`, so handlers write
//! `sqlx::query(..).execute(&mut *tx)`. No database server: one file, shared by every
//! process that opens it.
//!
//! ```no_run
//! use axum::{Json, Router, http::StatusCode, routing::post};
//! use axum_idempotency::IdempotencyLayer;
//! use axum_idempotency::sqlite::{IdempotentTx, SqliteStore};
//!
//! async fn create_order(mut tx: IdempotentTx) -> Result<(StatusCode, Json<i64>), StatusCode> {
//!     let id: i64 = sqlx::query_scalar("INSERT INTO orders (amount) VALUES (?) RETURNING id")
//!         .bind(299_i64)
//!         .fetch_one(&mut *tx)
//!         .await
//!         .map_err(|_| StatusCode::INTERNAL_SERVER_ERROR)?;
//!     Ok((StatusCode::CREATED, Json(id)))
//! }
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! // The settings the crate needs: the file created if missing, WAL, a 5 s busy timeout,
//! // `synchronous = NORMAL`, foreign keys on.
//! let pool = sqlx::SqlitePool::connect_with(SqliteStore::connect_options("orders.db")).await?;
//! // Creates the tables, switches the file to WAL, and checks that it takes writes.
//! axum_idempotency::migrate(&pool).await?;
//! let app: Router = Router::new()
//!     .route("/orders", post(create_order))
//!     .layer(IdempotencyLayer::new(pool));
//! # Ok(()) }
//! ```
//!
//! A pool of your own works too (`IdempotencyLayer::new(pool)` takes any `SqlitePool`);
//! [`migrate`](crate::migrate) switches its file to WAL and refuses, with one line naming
//! the file, a database it cannot write to (a read-only file, `mode=ro`, a directory that
//! does not exist) or a pool of several connections to an in-memory database.
//!
//! # How SQLite's one writer is used
//!
//! - Every write transaction of the crate begins `BEGIN IMMEDIATE`: it takes SQLite's write
//!   lock first, waiting for it up to the connection's busy timeout (the pool's
//!   `busy_timeout`, 5 s by default), and never upgrades a read transaction to a write
//!   one (that fails `SQLITE_BUSY` at once in WAL mode). A busy wait that expires is
//!   `SQLITE_BUSY`, which [`Error::is_transient`](crate::Error::is_transient) classes as
//!   transient: the layer answers 503 with `Retry-After`.
//! - The claim: the record is first looked up outside any transaction (WAL readers never
//!   wait), which answers a replay, a 422, or a 409 for a live lease; otherwise
//!   `BEGIN IMMEDIATE`, which is the key's lock (it waits for a twin's COMMIT), and the
//!   record is looked up again under it. A twin never sees its holder's uncommitted
//!   record: a twin in the same process as its holder is answered 409 at once (the
//!   process keeps the keys its requests hold, per database file), as on PostgreSQL; a twin
//!   in another process on the same file waits for the write lock and then replays what
//!   the holder committed. Either way the handler never runs twice. With
//!   [`wait_for_in_flight(d)`](crate::IdempotencyLayer::wait_for_in_flight), the wait is
//!   cut at `d` (at least 50 ms; or the busy timeout, whichever comes first) and the twin
//!   answered 409; without it, the busy timeout is the bound (then 503). The lock is the
//!   database's, not the key's: requests for other keys, and every other write, queue
//!   behind a running handler too, so keep handlers short.
//! - The cut is a timer around `BEGIN IMMEDIATE`, not a change of the connection's busy
//!   timeout: a connection never goes back to the pool with its settings changed. A
//!   `BEGIN IMMEDIATE` the timer gave up on keeps waiting on its connection (which the pool
//!   gets back only after it, and its immediate `ROLLBACK`, finished).
//! - The lease, the inbox claim, the relay's batch claim and its settlement are write
//!   transactions begun the same way; the sweeper's batches, the lease's fenced
//!   completion and `Admin`'s actions are single autocommit statements; every look-up is a
//!   plain read.
//! - The outbox relay **claims** its batch rather than holding a transaction while it
//!   publishes (that would hold the one write lock, and stop every request, for as long as
//!   the broker takes): a short transaction gives the due rows a claim token and
//!   `claimed_until` (now + 120 s), and the settlement, fenced by that token, marks them and
//!   clears it. Several relays skip each other's claimed rows; a relay that dies mid-batch
//!   leaves its rows to the others once the claim lapses (published again at worst: the
//!   consumer's [`Inbox`](crate::Inbox) deduplicates). An idle relay only reads. No `LISTEN`
//!   here: the relay polls.
//! - Fencing tokens come from a counter row that only goes up, so they never repeat, even
//!   after a purge; outbox `seq` is `AUTOINCREMENT` for the same reason. With one writer,
//!   producers of one ordering key commit in `seq` order without a lock of their own.
//! - Times are REAL Unix seconds computed by SQLite (`unixepoch('subsec')`) in each
//!   statement, never by the application.
//!
//! Several processes may share the file: SQLite's file locks arbitrate, and a process killed
//! mid-transaction leaves nothing half-written. The file must be on a local disk (WAL needs
//! shared memory between the processes).
//!
//! Do not end the shared transaction yourself through `&mut *tx` (nested
//! `sqlx::Connection::begin` savepoints are fine), and do not give the pool's connect
//! options a `journal_mode` other than WAL: a connection that sets another takes the whole
//! file out of WAL.

mod conn;
mod in_flight;
mod inbox;
mod lease;
mod maintenance;
mod migrate;
mod outbox;
mod sql;
mod store;

use std::path::Path;
use std::time::Duration;

/// The SQLite driver's hold on the shared transaction: what
/// [`IdempotentTx`] keeps, exclusively, for as long as it lives (it derefs to the
/// transaction's `SqliteConnection`).
pub type SqliteTx = crate::store::sqlx_tx::SqlxTx<conn::SqliteConn>;

/// The `sqlx` this driver is built with: the `SqlitePool` given to `IdempotencyLayer::new`
/// must come from this version.
pub use ::sqlx;

/// The [`IdempotentTx`](crate::IdempotentTx) extractor on SQLite: it derefs to the shared
/// transaction's `SqliteConnection`, so `&mut *tx` is an executor.
pub type IdempotentTx = crate::store::IdempotentTx<SqliteStore>;

use ::sqlx::SqlitePool;
use ::sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};

use crate::store::IntoStore;

/// The SQLite [`Store`](crate::Store): an `sqlx::SqlitePool` and the crate's
/// prepared-statement setting. Cloning it is a reference-count bump.
#[derive(Clone, Debug)]
pub struct SqliteStore {
    pool: SqlitePool,
    persistent: bool,
    /// The keys this process's requests hold on the pool's file.
    in_flight: std::sync::Arc<in_flight::InFlight>,
}

impl SqliteStore {
    /// A store over `pool`.
    pub fn new(pool: SqlitePool) -> Self {
        let in_flight = in_flight::InFlight::of(pool.connect_options().get_filename());
        Self {
            pool,
            persistent: true,
            in_flight,
        }
    }

    /// The connect options the crate needs for the database file at `path`: the file
    /// created if missing, WAL journal mode, a 5 s busy timeout (the longest a write waits
    /// for SQLite's write lock), `synchronous = NORMAL` (durable in WAL mode up to the last
    /// checkpointed commit on power loss, never corrupt) and foreign keys on. Change
    /// anything but the journal mode on the value returned.
    ///
    /// ```no_run
    /// use axum_idempotency::sqlite::SqliteStore;
    ///
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let pool = sqlx::sqlite::SqlitePoolOptions::new()
    ///     .max_connections(8)
    ///     .connect_with(SqliteStore::connect_options("/var/lib/orders/orders.db"))
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn connect_options(path: impl AsRef<Path>) -> SqliteConnectOptions {
        SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(Duration::from_secs(5))
            .synchronous(SqliteSynchronous::Normal)
            .foreign_keys(true)
    }
}

impl crate::store::sealed::Sealed for SqliteStore {}

/// Enqueues an outbox message through any SQLite executor — `&mut *tx` of a transaction
/// of yours, so it commits or rolls back with it (inside an idempotent handler, use
/// [`IdempotentTx::enqueue`](crate::IdempotentTx::enqueue) instead). Run
/// [`migrate`](crate::migrate) first. Begin that transaction with `BEGIN IMMEDIATE`
/// (`pool.begin_with("BEGIN IMMEDIATE")`) if it reads before it writes.
///
/// ```no_run
/// use axum_idempotency::outbox::OutboxMessage;
///
/// # async fn run(pool: sqlx::SqlitePool) -> Result<(), Box<dyn std::error::Error>> {
/// let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
/// sqlx::query("UPDATE orders SET status = 'PAID' WHERE order_no = ?")
///     .bind("ORD-7")
///     .execute(&mut *tx)
///     .await?;
/// axum_idempotency::sqlite::enqueue(
///     &mut *tx,
///     &OutboxMessage::new("payment-succeeded", r#"{"order_no":"ORD-7"}"#).id("ORD-7-paid"),
/// )
/// .await?;
/// tx.commit().await?; // the UPDATE and the message, together
/// # Ok(()) }
/// ```
pub async fn enqueue<'c, E>(
    executor: E,
    message: &crate::engine::outbox::OutboxMessage,
) -> Result<crate::engine::outbox::Enqueued, crate::engine::error::Error>
where
    E: ::sqlx::Executor<'c, Database = ::sqlx::Sqlite>,
{
    outbox::enqueue(executor, message, true)
        .await
        .map_err(crate::engine::error::Error::of_crate_statement)
}

impl IntoStore for SqlitePool {
    type Store = SqliteStore;

    fn into_store(self) -> SqliteStore {
        SqliteStore::new(self)
    }
}
