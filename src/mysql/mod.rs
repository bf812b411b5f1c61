//! The MySQL/MariaDB driver (feature `mysql`, sqlx 0.9): [`MySqlStore`] over an
//! `sqlx::MySqlPool`, and [`IdempotentTx`], the extractor whose handle derefs to the shared
//! transaction's `MySqlConnection`, so handlers write `sqlx::query(..).execute(&mut *tx)`.
//! Written for MySQL 8.0 and MariaDB 10.6 or later; tested on MariaDB 10.11.
//!
//! ```no_run
//! use axum::{Json, Router, http::StatusCode, routing::post};
//! use axum_idempotency::IdempotencyLayer;
//! use axum_idempotency::mysql::IdempotentTx;
//!
//! async fn create_order(mut tx: IdempotentTx) -> Result<(StatusCode, Json<u64>), StatusCode> {
//!     let done = sqlx::query("INSERT INTO orders (amount) VALUES (?)")
//!         .bind(299_i64)
//!         .execute(&mut *tx)
//!         .await
//!         .map_err(|_| StatusCode::INTERNAL_SERVER_ERROR)?;
//!     Ok((StatusCode::CREATED, Json(done.last_insert_id())))
//! }
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let pool = sqlx::MySqlPool::connect("mysql://root@127.0.0.1:3306/shop").await?;
//! axum_idempotency::migrate(&pool).await?;
//! let app: Router = Router::new()
//!     .route("/orders", post(create_order))
//!     .layer(IdempotencyLayer::new(pool));
//! # Ok(()) }
//! ```
//!
//! # How the key is held
//!
//! The record's primary key arbitrates, with the record's row inserted at the start of the
//! request's transaction. The claim first looks the record up outside any transaction (a
//! replay, a 422 or a 409 for a leased key needs nothing more). For a new key it then sends
//! one text query of several statements: it begins a READ COMMITTED transaction with
//! `autocommit = 0` and holds the key. On MariaDB the placeholder's insert is the lock:
//! bounded by `SET STATEMENT innodb_lock_wait_timeout = 0`, a twin's uncommitted
//! placeholder refuses it at once (409, as on PostgreSQL), and with
//! [`wait_for_in_flight`](crate::IdempotencyLayer) it waits that long instead. On MySQL,
//! whose lock wait timeout cannot be 0, the key's locking read (`SELECT ... FOR UPDATE
//! NOWAIT`, or `FOR UPDATE` with the session's timeout set for the claim and restored
//! before the handler) comes first. The claim inserts a placeholder row for the key
//! (PROCESSING, no lease), which InnoDB holds locked until the transaction ends, so every
//! twin waits for it or is refused, and takes a savepoint (a stored 4xx rolls back to it
//! and keeps the key). A duplicate-key error at the placeholder means a record the
//! look-up did not see (one committed since, or one the claim may replace): the claim reads
//! it under its lock and answers from it, or replaces it. After the handler, one more text
//! query checks the savepoint and turns the placeholder into the record (an `UPDATE` by the
//! primary key), and the commit follows as a statement of its own. Values travel inlined as
//! literals — bytes as hex, text as hex with its character set, never request text spliced
//! into SQL; a record over 1 MiB is written with a bound statement instead.
//! `GET_LOCK` is not used for requests or messages: it is session-scoped (it outlives the
//! transaction and leaks through the pool) and node-local in a Galera cluster. No lock
//! outlives its request.
//!
//! A new key costs five round trips before its answer — the look-up, the claim, the
//! handler's own statements, the completion, the commit — and sqlx's no-op `ROLLBACK` with
//! the pool's release check; a replay costs the look-up. Why the commit travels alone:
//! on Galera a commit that shares its text query with other statements can be answered OK
//! although certification rolled it back (`tests-integration/tests/galera/commit_errors.py` measures each
//! shape). Why the placeholder (a second write of the record's row): it is what answers an
//! in-flight twin 409 at once; `tests-integration/benches/mysql-shapes/` measures each shape in the database
//! alone.
//!
//! A pooled connection that comes out of the pool inside a transaction nobody ended — a
//! caller's future dropped while its `BEGIN` was in flight leaves one, as sqlx counts a
//! transaction only once `BEGIN`'s answer has arrived — refuses the claim's first
//! `SET TRANSACTION` (1568). The claim closes it (which rolls that transaction back) and
//! starts again on another connection.
//!
//! # A transaction the server took away
//!
//! In MySQL a failed statement does not abort the transaction, and after a deadlock (1213)
//! — or a lock wait timeout with `innodb_rollback_on_timeout` — the session has no
//! transaction any more: later statements would autocommit, and a `COMMIT` would succeed
//! with nothing in it. So the request's connection runs with `autocommit = 0` from the
//! claim until the connection is clean again: what a handler sends after such a loss opens
//! a new transaction, which the crate rolls back. Before the record, the completion checks
//! that its savepoint still exists (`RELEASE SAVEPOINT` fails when the transaction is
//! gone) and that the placeholder's `UPDATE` matched it; either way a lost transaction is
//! answered 503 with `Retry-After` (a transient error), and nothing of the request
//! remains. The commit is `autocommit` turned back on (which commits), in the same
//! statement as the restored lock wait timeout; a rollback restores the session in its
//! round trip. On any other path — an error, a dropped future, a panic — the connection is
//! closed instead of going back to the pool, and the server rolls its transaction back.
//!
//! # Isolation, and MariaDB 11.6's snapshot isolation
//!
//! Every transaction of the crate runs READ COMMITTED (`SET TRANSACTION ISOLATION LEVEL`
//! before each `START TRANSACTION`: the next transaction only, nothing leaks), so a locking
//! read sees what a twin committed, and the sweeper's batches take no gap locks that
//! would block new records. InnoDB's `DELETE` and `UPDATE` cannot skip a locked row, so
//! each sweep batch is a short transaction of its own: a `SELECT ... FOR UPDATE SKIP
//! LOCKED` of the batch's keys (never waiting for a row a live request holds), one
//! `DELETE` (or `UPDATE`) per key by its primary key, sent together, and `COMMIT`. (An
//! `IN` list of the keys would do when the table is large, but when it covers most of
//! what is left InnoDB plans a table scan, which locks, and so waits for, the very rows
//! the `SELECT` skipped.) MariaDB 11.6 turns on
//! `innodb_snapshot_isolation`, which adds error 1020 ("Record has changed since last
//! read") under REPEATABLE READ; it does not apply to READ COMMITTED, and
//! [`Error::is_transient`](crate::Error::is_transient) treats 1020 as transient should a
//! handler's own REPEATABLE READ transaction meet it.
//!
//! # Inbox, outbox, lease mode
//!
//! The [`Inbox`](crate::Inbox)'s in-flight state (PostgreSQL's advisory lock) is the
//! message's row lock: the claim upserts the message's row (a PENDING placeholder for a new
//! message, never committed as it is) and holds it locked for the consumer's transaction; a
//! concurrent delivery's upsert waits for it, bounded by the inbox's lock timeout (whole
//! seconds, at least 1), and is then answered from the committed record, or busy. The
//! outbox's per-ordering-key lock is a row lock on `idempotency_outbox_keys`, upserted
//! before the message's insert. Fencing tokens come from a one-row counter
//! (`idempotency_counters`, `LAST_INSERT_ID(value + 1)`) that never goes back, even after a
//! record was purged. Every crate statement that may wait for a row lock is bounded:
//! `NOWAIT`, `SKIP LOCKED`, or a lock wait timeout set for it and restored.
//!
//! # Start-up check
//!
//! [`migrate`](crate::migrate) refuses a server older than MariaDB 10.6 / MySQL 8.0 with
//! one [`Error::Unsupported`](crate::Error::Unsupported) line, and logs a warning when
//! `max_allowed_packet` is below 16 MiB (a stored response, with its headers, must fit in
//! one packet). Concurrent `migrate` calls wait for each other on a `GET_LOCK` held by a
//! connection of their own, released (or that connection closed) before they return.
//!
//! # Galera
//!
//! On a Galera node (`wsrep_on`, asked once per store) the claim's locking read waits
//! until the node has applied what the cluster committed before it (`wsrep_sync_wait = 1`
//! for that read only), so a key committed on another node a moment ago is replayed here
//! rather than run again. Twins on two nodes each hold only their own node's row lock; the
//! one whose commit certifies second is rolled back (error 1213) and answered from the
//! winner's record (409 while this node has not applied it yet). After the commit the
//! record is read back: a rolled-back transaction must never be answered as committed,
//! whatever Galera reported. `migrate` refuses a node without `binlog_format=ROW` and warns
//! without `innodb_autoinc_lock_mode=2`. 1047 ("WSREP has not yet prepared node for
//! application use") and 1180 are transient. The operations guide's "Galera" section has
//! the settings and what a client sees while a node leaves.
//!
//! Do not end the transaction yourself through `&mut *tx` (nested `sqlx::Connection::begin`
//! savepoints are fine).

mod batch;
mod conn;
mod inbox;
mod lease;
mod maintenance;
mod migrate;
mod outbox;
mod sql;
mod store;

/// The MySQL/MariaDB driver's hold on the shared transaction: what
/// [`IdempotentTx`] keeps, exclusively, for as long as it lives (it derefs to the
/// transaction's `MySqlConnection`).
pub type MySqlTx = crate::store::sqlx_tx::SqlxTx<conn::MySqlConn>;

/// The `sqlx` this driver is built with: the `MySqlPool` given to `IdempotencyLayer::new`
/// must come from this version.
pub use ::sqlx;

/// The [`IdempotentTx`](crate::IdempotentTx) extractor on MySQL/MariaDB: it derefs to the
/// shared transaction's `MySqlConnection`, so `&mut *tx` is an executor.
pub type IdempotentTx = crate::store::IdempotentTx<MySqlStore>;

use ::sqlx::MySqlPool;

use crate::store::IntoStore;

/// The MySQL/MariaDB [`Store`](crate::Store): an `sqlx::MySqlPool` and the crate's
/// prepared-statement setting. Cloning it is a reference-count bump.
#[derive(Clone, Debug)]
pub struct MySqlStore {
    pool: MySqlPool,
    persistent: bool,
    /// What the server is, asked once, on the first claim.
    server: std::sync::Arc<tokio::sync::OnceCell<conn::Server>>,
}

impl MySqlStore {
    /// A store over `pool`.
    pub fn new(pool: MySqlPool) -> Self {
        Self {
            pool,
            persistent: true,
            server: Default::default(),
        }
    }
}

impl crate::store::sealed::Sealed for MySqlStore {}

/// Enqueues an outbox message through a MySQL/MariaDB connection — `&mut *tx` of a plain
/// `sqlx::Transaction` of yours, so it commits or rolls back with it (inside an idempotent
/// handler, use [`IdempotentTx::enqueue`] instead). Run [`migrate`](crate::migrate) first.
///
/// ```no_run
/// use axum_idempotency::outbox::OutboxMessage;
///
/// # async fn run(pool: sqlx::MySqlPool) -> Result<(), Box<dyn std::error::Error>> {
/// let mut tx = pool.begin().await?;
/// sqlx::query("UPDATE orders SET status = 'PAID' WHERE order_no = ?")
///     .bind("ORD-7")
///     .execute(&mut *tx)
///     .await?;
/// axum_idempotency::mysql::enqueue(
///     &mut *tx,
///     &OutboxMessage::new("payment-succeeded", r#"{"order_no":"ORD-7"}"#).id("ORD-7-paid"),
/// )
/// .await?;
/// tx.commit().await?; // the UPDATE and the message, together
/// # Ok(()) }
/// ```
pub async fn enqueue(
    conn: &mut ::sqlx::MySqlConnection,
    message: &crate::engine::outbox::OutboxMessage,
) -> Result<crate::engine::outbox::Enqueued, crate::engine::error::Error> {
    outbox::enqueue(conn, message, true)
        .await
        .map_err(crate::engine::error::Error::of_crate_statement)
}

impl IntoStore for MySqlPool {
    type Store = MySqlStore;

    fn into_store(self) -> MySqlStore {
        MySqlStore::new(self)
    }
}
