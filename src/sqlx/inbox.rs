//! The Inbox on sqlx: a message's claim under its lock, and its outcome recorded in the
//! same transaction.

use std::time::Duration;

use ::sqlx::postgres::{PgArguments, Postgres};
use ::sqlx::query::Query;
use ::sqlx::{Executor, Row};

use super::SqlxStore;
use super::store::{SqlxConn, statement, timed_out, wait_lock};
use crate::Error;
use crate::engine::key::RecordId;
use crate::engine::record::{InboxClaim, InboxRecord, InboxWrite};
use crate::store::sql;

pub(super) async fn claim(
    store: &SqlxStore,
    id: RecordId,
    group: &str,
    message_id: &str,
    wait: Duration,
) -> Result<InboxClaim<SqlxConn>, Error> {
    let mut conn = store.begin().await?;
    match wait_lock(conn.connection_mut(), id.lock_key(), wait, store.persistent).await {
        Err(e) if timed_out(&e) => return Ok(InboxClaim::Busy),
        locked => locked?,
    }
    let found = store
        .query(sql::INBOX_LOOKUP)
        .bind(group)
        .bind(message_id)
        .fetch_optional(conn.connection_mut())
        .await?;
    conn.connection_mut()
        .execute(sql::INBOX_WORK_SAVEPOINT)
        .await?;
    let record = match found {
        Some(row) => Some(InboxRecord {
            succeeded: row.try_get(0)?,
            attempts: row.try_get(1)?,
            last_error: row.try_get(2)?,
            live: row.try_get(3)?,
            payload_digest: row.try_get(4)?,
        }),
        None => None,
    };
    Ok(InboxClaim::Locked(conn, record))
}

pub(super) async fn commit(
    conn: &mut SqlxConn,
    write: &InboxWrite<'_>,
    attempts: i32,
) -> Result<(), Error> {
    statement(sql::INBOX_RECORD_SUCCESS, conn.persistent())
        .bind(write.group)
        .bind(write.message_id)
        .bind(attempts)
        .bind(write.payload_digest)
        .bind(write.payload)
        .bind(write.payload_key_id)
        .bind(write.retention.as_secs_f64())
        .execute(conn.connection_mut())
        .await?;
    conn.commit().await?;
    Ok(())
}

pub(super) async fn fail(
    mut conn: SqlxConn,
    write: &InboxWrite<'_>,
    error: &str,
) -> Result<Option<i32>, Error> {
    conn.connection_mut()
        .execute(sql::INBOX_ROLLBACK_WORK)
        .await?;
    let row = failure(write, error, conn.persistent())
        .fetch_optional(conn.connection_mut())
        .await?;
    conn.commit().await?;
    Ok(row.map(|row| row.try_get(0)).transpose()?)
}

pub(super) async fn record_failure(
    store: &SqlxStore,
    write: &InboxWrite<'_>,
    error: &str,
) -> Result<Option<i32>, Error> {
    let row = failure(write, error, store.persistent)
        .fetch_optional(&store.pool)
        .await?;
    Ok(row.map(|row| row.try_get(0)).transpose()?)
}

/// `sql::INBOX_RECORD_FAILURE` with its parameters bound.
fn failure(
    write: &InboxWrite<'_>,
    error: &str,
    persistent: bool,
) -> Query<'static, Postgres, PgArguments> {
    statement(sql::INBOX_RECORD_FAILURE, persistent)
        .bind(write.group)
        .bind(write.message_id)
        .bind(write.payload_digest)
        .bind(write.payload)
        .bind(write.payload_key_id)
        .bind(error)
        .bind(write.retention.as_secs_f64())
}
