//! `migrate` on MySQL/MariaDB: the start-up check of the server (its version, its packet
//! limit), then the migration files, serialised by a `GET_LOCK` on a connection of its own.

use ::sqlx::{Executor, MySql, MySqlConnection, MySqlPool, Row};

use super::conn::statement;
use crate::engine::error::Error;
use crate::store::migrations;
use crate::store::sqlx_tx::{MigrationTable, apply_migrations};

/// The table of applied migration versions.
const CREATE_MIGRATIONS_TABLE: &str = "CREATE TABLE IF NOT EXISTS axum_idempotency_migrations (
        version    INT          NOT NULL PRIMARY KEY,
        name       VARCHAR(255) NOT NULL,
        applied_at DATETIME(6)  NOT NULL
    ) ENGINE = InnoDB";
/// Serialises concurrent `migrate` calls on one server (a session lock, on a connection
/// of its own, released before that connection goes back). `?` lock name, seconds.
const MIGRATION_LOCK: &str = "SELECT GET_LOCK(?, ?)";
/// Releases [`MIGRATION_LOCK`]. `?` lock name.
const MIGRATION_UNLOCK: &str = "SELECT RELEASE_LOCK(?)";
/// Records an applied version. `?` version, name.
/// (A row another node's `migrate` wrote at the same time is kept: `GET_LOCK` is
/// node-local on Galera, and every migration statement is safe to run twice.)
const RECORD_MIGRATION: &str = "INSERT INTO axum_idempotency_migrations \
    (version, name, applied_at) VALUES (?, ?, UTC_TIMESTAMP(6)) \
    ON DUPLICATE KEY UPDATE version = version";
/// The server's version and packet limit, checked by `migrate`.
const SERVER_SETTINGS: &str = "SELECT VERSION(), CAST(@@GLOBAL.max_allowed_packet AS SIGNED)";
/// Whether the server is a Galera node: one row (`wsrep_on`, `ON`) on a MariaDB Galera
/// node, `OFF` on a MariaDB without it, none on MySQL.
pub(super) const WSREP_ON: &str = "SHOW GLOBAL VARIABLES LIKE 'wsrep_on'";
/// The server's version, which names MariaDB.
pub(super) const VERSION: &str = "SELECT VERSION()";
/// A Galera node's settings the crate relies on: `binlog_format`, `innodb_autoinc_lock_mode`
/// and the node's default `wsrep_sync_wait`.
const GALERA_SETTINGS: &str = "SELECT @@GLOBAL.binlog_format, \
    CAST(@@GLOBAL.innodb_autoinc_lock_mode AS SIGNED), CAST(@@GLOBAL.wsrep_sync_wait AS SIGNED)";
/// The name of the migration lock (`GET_LOCK` names are per server).
const LOCK_NAME: &str = "axum_idempotency_migrate";
/// How long a `migrate` waits for another one, in seconds.
const LOCK_WAIT_SECONDS: i64 = 300;
/// The packet limit below which `migrate` warns: a stored response (body and headers)
/// travels in one packet.
const MIN_PACKET: i64 = 16 * 1024 * 1024;

/// Checks the server, then applies the migrations the database lacks under the migration
/// lock. The lock is session-scoped, so it is taken on a connection of its own and released
/// before that connection goes back; on any error the connection is closed instead, which
/// releases the lock.
pub(super) async fn run(pool: &MySqlPool) -> Result<(), Error> {
    let mut conn = pool.acquire().await?;
    check_server(&mut conn).await?;
    let locked: Option<i64> = statement(MIGRATION_LOCK, false)
        .bind(LOCK_NAME)
        .bind(LOCK_WAIT_SECONDS)
        .fetch_one(&mut *conn)
        .await?
        .try_get(0)?;
    if locked != Some(1) {
        return Err(Error::Unsupported(format!(
            "another axum_idempotency::migrate held the lock {LOCK_NAME} for more than \
             {LOCK_WAIT_SECONDS} s; let it finish (or end its session) and run migrate again"
        )));
    }
    match apply(&mut conn).await {
        Ok(()) => {
            let released = statement(MIGRATION_UNLOCK, false)
                .bind(LOCK_NAME)
                .fetch_one(&mut *conn)
                .await;
            if released.is_err() {
                conn.close_on_drop();
            }
            Ok(())
        }
        Err(error) => {
            // Closing the session releases its lock.
            conn.close_on_drop();
            Err(error)
        }
    }
}

/// The server's version (MariaDB 10.6 / MySQL 8.0 or later) and its packet limit.
async fn check_server(conn: &mut MySqlConnection) -> Result<(), Error> {
    let row = statement(SERVER_SETTINGS, false)
        .fetch_one(&mut *conn)
        .await?;
    let version: String = row.try_get(0)?;
    let packet: i64 = row.try_get(1)?;
    if let Some(problem) = unsupported_version(&version) {
        return Err(Error::Unsupported(problem));
    }
    if packet < MIN_PACKET {
        tracing::warn!(
            max_allowed_packet = packet,
            "max_allowed_packet is below 16 MiB: a stored response (body and headers) larger \
             than it cannot be stored; raise max_allowed_packet on the server"
        );
    }
    check_galera(conn).await
}

/// On a Galera node: row-based replication (without it the node replicates nothing the
/// crate writes) and interleaved auto-increments (else concurrent inserts on two nodes
/// conflict on the table's auto-increment lock).
async fn check_galera(conn: &mut MySqlConnection) -> Result<(), Error> {
    let on: Option<String> = match conn.fetch_optional(WSREP_ON).await? {
        Some(row) => Some(row.try_get(1)?),
        None => None,
    };
    if !on.is_some_and(|on| on.eq_ignore_ascii_case("ON")) {
        return Ok(());
    }
    let row = conn.fetch_one(GALERA_SETTINGS).await?;
    let binlog_format: String = row.try_get(0)?;
    let autoinc_lock_mode: i64 = row.try_get(1)?;
    let sync_wait: i64 = row.try_get(2)?;
    if !binlog_format.eq_ignore_ascii_case("ROW") {
        return Err(Error::Unsupported(format!(
            "this Galera node runs binlog_format={binlog_format}; Galera replicates only \
             row-based events: set binlog_format=ROW on every node"
        )));
    }
    if autoinc_lock_mode != 2 {
        tracing::warn!(
            innodb_autoinc_lock_mode = autoinc_lock_mode,
            "Galera wants innodb_autoinc_lock_mode=2 (interleaved): with another mode, inserts \
             into an AUTO_INCREMENT table (the outbox) on two nodes at once conflict"
        );
    }
    tracing::info!(
        wsrep_sync_wait = sync_wait,
        "a Galera node: the claim reads with wsrep_sync_wait=1, so a key committed on another \
         node is replayed here; other reads keep the node's setting"
    );
    Ok(())
}

/// Why a server of this `VERSION()` cannot run the crate, if it cannot.
fn unsupported_version(version: &str) -> Option<String> {
    let mut numbers = version
        .split(|c: char| !c.is_ascii_digit())
        .filter(|part| !part.is_empty())
        .map(|part| part.parse::<u32>().unwrap_or(0));
    let major = numbers.next().unwrap_or(0);
    let minor = numbers.next().unwrap_or(0);
    let mariadb = version.to_ascii_lowercase().contains("mariadb");
    let (name, needed) = if mariadb {
        ("MariaDB", (10, 6))
    } else {
        ("MySQL", (8, 0))
    };
    ((major, minor) < needed).then(|| {
        format!(
            "the database server is {name} {version}; axum-idempotency needs MariaDB 10.6 or \
             MySQL 8.0 or later (for NOWAIT, SKIP LOCKED and CHECK constraints): upgrade the server"
        )
    })
}

/// The pending migrations, each file's statements in one multi-statement round trip (DDL
/// commits implicitly; every statement is safe to repeat).
async fn apply(conn: &mut MySqlConnection) -> Result<(), Error> {
    let table = MigrationTable {
        create: CREATE_MIGRATIONS_TABLE,
        version: super::sql::SCHEMA_VERSION,
        record: RECORD_MIGRATION,
    };
    apply_migrations::<MySql>(conn, &table, migrations::MYSQL).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::unsupported_version;

    #[test]
    fn old_servers_are_refused_in_one_line() {
        assert!(unsupported_version("10.11.19-MariaDB-0+deb12u1").is_none());
        assert!(unsupported_version("10.6.2-MariaDB").is_none());
        assert!(unsupported_version("11.4.2-MariaDB").is_none());
        assert!(unsupported_version("8.0.36").is_none());
        assert!(unsupported_version("8.4.0").is_none());
        let old = unsupported_version("10.5.9-MariaDB").expect("refused");
        assert!(old.contains("MariaDB 10.6") && !old.contains('\n'), "{old}");
        assert!(unsupported_version("5.7.44").is_some());
        // A MariaDB that reports a MySQL-compatible prefix.
        assert!(unsupported_version("5.5.5-10.4.1-MariaDB").is_some());
    }
}
