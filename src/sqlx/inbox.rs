//! The Inbox on sqlx: a message's claim under its lock, and its outcome recorded in the
//! same transaction.

use std::time::Duration;

use ::sqlx::{Executor, Row};

use super::SqlxStore;
use super::conn::{SqlxConn, statement, timed_out, wait_lock};
use crate::engine::error::Error;
use crate::engine::key::RecordId;
use crate::engine::record::{InboxClaim, InboxWrite};
use crate::store::queries::Queries;
use crate::store::queries::inbox_failure_params;
use crate::store::{InboxStore, sql};

impl InboxStore for SqlxStore {
    async fn inbox_claim(
        &self,
        id: RecordId,
        group: &str,
        message_id: &str,
        wait: Duration,
    ) -> Result<InboxClaim<SqlxConn>, Error> {
        let mut conn = self.begin().await?;
        let link = self.link.clone();
        let locking = wait_lock(conn.connection_mut(), id.lock_key(), wait, self.persistent);
        match link.within(wait, locking).await {
            Err(e) if timed_out(&e) => return Ok(InboxClaim::Busy),
            locked => locked?,
        }
        let lookup = self
            .query(sql::INBOX_LOOKUP)
            .bind(group)
            .bind(message_id)
            .fetch_optional(conn.connection_mut());
        let found = link.within(Duration::ZERO, lookup).await?;
        let savepoint = conn.connection_mut().execute(sql::INBOX_WORK_SAVEPOINT);
        link.within(Duration::ZERO, savepoint).await?;
        Ok(crate::store::rows::inbox_locked(conn, found.as_ref())?)
    }

    async fn inbox_commit(
        conn: &mut SqlxConn,
        write: &InboxWrite<'_>,
        attempts: i32,
    ) -> Result<(), Error> {
        let link = conn.link.clone();
        let record = statement(sql::INBOX_RECORD_SUCCESS, conn.persistent())
            .bind(write.group)
            .bind(write.message_id)
            .bind(attempts)
            .bind(write.payload_digest)
            .bind(write.payload)
            .bind(write.payload_key_id)
            .bind(write.retention.as_secs_f64())
            .execute(conn.connection_mut());
        link.within(Duration::ZERO, record).await?;
        conn.commit().await?;
        Ok(())
    }

    async fn inbox_fail(
        mut conn: SqlxConn,
        write: &InboxWrite<'_>,
        error: &str,
    ) -> Result<Option<i32>, Error> {
        let link = conn.link.clone();
        let undo = conn.connection_mut().execute(sql::INBOX_ROLLBACK_WORK);
        link.within(Duration::ZERO, undo).await?;
        let params = inbox_failure_params(write, error);
        let statement = Self::STATEMENTS.inbox_record_failure;
        let recorded = crate::store::sqlx_tx::bound(statement, &params, conn.persistent());
        let recorded = recorded.fetch_optional(conn.connection_mut());
        let row = link.within(Duration::ZERO, recorded).await?;
        conn.commit().await?;
        Ok(row.map(|row| row.try_get(0)).transpose()?)
    }
}
