//! `migrate` on SQLite: the start-up check of the database file (it must take writes and
//! be in WAL mode), then the migration files in one `BEGIN IMMEDIATE` transaction.

use std::time::Duration;

use ::sqlx::pool::PoolConnection;
use ::sqlx::sqlite::Sqlite;
use ::sqlx::{Connection, Row, SqliteConnection, SqlitePool};

use super::conn::{SQLITE_CANTOPEN, SQLITE_READONLY, is_busy, primary_code, statement};
use super::sql;
use crate::engine::error::Error;
use crate::store::migrations;
use crate::store::sqlx_tx::{MigrationTable, apply_migrations};

/// How long `migrate` keeps asking for WAL while other connections hold the file (the
/// switch takes an exclusive lock that SQLite's busy timeout does not wait for).
const WAL_SWITCH_TRIES: u32 = 100;
const WAL_SWITCH_PAUSE: Duration = Duration::from_millis(50);

/// Switches the file to WAL, checks with a real write that it takes writes, applies the
/// migrations its schema lacks, and refuses an in-memory database shared by several
/// pooled connections. Every misconfiguration is one [`Error::Unsupported`] line naming
/// the file. Concurrent calls (other processes too) wait for each other on the write lock;
/// the tables are created once.
pub(super) async fn run(pool: &SqlitePool) -> Result<(), Error> {
    let path = pool.connect_options().get_filename().display().to_string();
    let startup = |e: ::sqlx::Error| startup_error(&path, e);
    let mut conn = acquire(pool).await.map_err(startup)?;
    let mode = journal_mode_wal(&mut conn).await.map_err(startup)?;
    let mut tx = conn
        .begin_with(sql::BEGIN_IMMEDIATE)
        .await
        .map_err(startup)?;
    match apply(&mut tx).await {
        Ok(()) => tx.commit().await.map_err(startup)?,
        Err(error) => {
            // Roll back before answering, so the write lock is free by the time the caller
            // sees the error.
            if let Err(rollback) = tx.rollback().await {
                tracing::debug!(error = %rollback, "ROLLBACK failed");
            }
            return Err(match error {
                Error::Sqlx(e) => startup(e),
                other => other,
            });
        }
    }
    match mode.as_str() {
        "wal" => Ok(()),
        "memory" if pool.options().get_max_connections() == 1 => Ok(()),
        "memory" => Err(Error::Unsupported(format!(
            "the SQLite database {path} is in memory, which a pool of {} connections cannot \
             share safely: use a database file (SqliteStore::connect_options(path)), or, for \
             tests, a pool of max_connections(1)",
            pool.options().get_max_connections()
        ))),
        other => Err(Error::Unsupported(format!(
            "the SQLite database {path} stays in journal mode `{other}` after \
             PRAGMA journal_mode = WAL: axum-idempotency needs WAL (readers that never wait \
             for the writer); use a file on a local disk, and connect options without \
             another journal_mode (SqliteStore::connect_options(path))"
        ))),
    }
}

/// A connection from `pool`, asked again while another connection switches a new file to
/// WAL: sqlx runs the connect options' `PRAGMA journal_mode = WAL` as it opens each
/// connection, and two connections opening a fresh file at once can meet `SQLITE_BUSY`
/// there.
async fn acquire(pool: &SqlitePool) -> Result<PoolConnection<Sqlite>, ::sqlx::Error> {
    let mut tries = 0;
    loop {
        match pool.acquire().await {
            Ok(conn) => return Ok(conn),
            Err(e) if is_busy(&e) && tries < WAL_SWITCH_TRIES => {
                tries += 1;
                tokio::time::sleep(WAL_SWITCH_PAUSE).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// `PRAGMA journal_mode = WAL` on `conn`, asked again while other connections hold the
/// file; the mode in force after it.
async fn journal_mode_wal(conn: &mut PoolConnection<Sqlite>) -> Result<String, ::sqlx::Error> {
    let mut tries = 0;
    loop {
        match statement(sql::JOURNAL_MODE_WAL, false)
            .fetch_one(&mut **conn)
            .await
        {
            Ok(row) => return Ok(row.try_get::<String, _>(0)?.to_ascii_lowercase()),
            Err(e) if is_busy(&e) && tries < WAL_SWITCH_TRIES => {
                tries += 1;
                tokio::time::sleep(WAL_SWITCH_PAUSE).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// The pending migrations in `tx`, or a write that changes nothing when there are none: a
/// read-only database fails here, at start-up, not on its first request.
async fn apply(tx: &mut SqliteConnection) -> Result<(), Error> {
    let table = MigrationTable {
        create: sql::CREATE_MIGRATIONS_TABLE,
        version: sql::SCHEMA_VERSION,
        record: sql::RECORD_MIGRATION,
    };
    let (current, applied) = apply_migrations::<Sqlite>(tx, &table, migrations::SQLITE).await?;
    if applied == 0 {
        statement(sql::PROBE_WRITE, false)
            .bind(current)
            .execute(&mut *tx)
            .await?;
    }
    Ok(())
}

/// A database the crate cannot use, as one line naming the file; other errors as they are.
fn startup_error(path: &str, error: ::sqlx::Error) -> Error {
    let reason = error
        .as_database_error()
        .map(|e| e.message().to_owned())
        .unwrap_or_else(|| error.to_string());
    match primary_code(&error) {
        Some(SQLITE_READONLY) => Error::Unsupported(format!(
            "the SQLite database {path} is read-only ({reason}): axum-idempotency writes to \
             it; open it read-write (no mode=ro) and make the file, its -wal and -shm files \
             and its directory writable"
        )),
        Some(SQLITE_CANTOPEN) => Error::Unsupported(format!(
            "cannot open the SQLite database {path} ({reason}): check that its directory \
             exists and is writable"
        )),
        _ => Error::Sqlx(error),
    }
}
