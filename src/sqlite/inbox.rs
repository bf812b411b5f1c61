//! The Inbox on SQLite: a message's claim under SQLite's write lock (`BEGIN IMMEDIATE`
//! serialises its consumers), and its outcome recorded in the same transaction.

use std::time::Duration;

use ::sqlx::{Executor, Row};

use super::conn::{SqliteConn, statement};
use super::{SqliteStore, sql};
use crate::engine::error::Error;
use crate::engine::key::RecordId;
use crate::engine::record::{InboxClaim, InboxWrite};
use crate::store::InboxStore;
use crate::store::queries::Queries;
use crate::store::queries::inbox_failure_params;

impl InboxStore for SqliteStore {
    /// `BEGIN IMMEDIATE` (waiting at most `wait`, or the busy timeout if it comes first:
    /// then [`InboxClaim::Busy`]), the message's record, and the savepoint a failed attempt
    /// rolls back to.
    async fn inbox_claim(
        &self,
        _id: RecordId,
        group: &str,
        message_id: &str,
        wait: Duration,
    ) -> Result<InboxClaim<SqliteConn>, Error> {
        let Some(mut conn) = self.begin_write(Some(wait)).await? else {
            return Ok(InboxClaim::Busy);
        };
        let found = self
            .query(sql::INBOX_LOOKUP)
            .bind(group)
            .bind(message_id)
            .fetch_optional(conn.connection_mut())
            .await?;
        conn.connection_mut()
            .execute(sql::INBOX_WORK_SAVEPOINT)
            .await?;
        Ok(crate::store::rows::inbox_locked(conn, found.as_ref())?)
    }

    async fn inbox_commit(
        conn: &mut SqliteConn,
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

    async fn inbox_fail(
        mut conn: SqliteConn,
        write: &InboxWrite<'_>,
        error: &str,
    ) -> Result<Option<i32>, Error> {
        conn.connection_mut()
            .execute(sql::INBOX_ROLLBACK_WORK)
            .await?;
        let params = inbox_failure_params(write, error);
        let statement = Self::STATEMENTS.inbox_record_failure;
        let rows = crate::store::sqlx_tx::bound(statement, &params, conn.persistent())
            .fetch_all(conn.connection_mut())
            .await?;
        conn.commit().await?;
        Ok(rows.first().map(|row| row.try_get(0)).transpose()?)
    }
}
