//! The Inbox on sqlx: a message's claim under its lock, and its outcome recorded in the
//! same transaction.

use std::time::Duration;

use ::sqlx::Executor;

use super::SqlxStore;
use super::conn::{SqlxConn, timed_out, wait_lock};
use crate::engine::error::Error;
use crate::engine::key::RecordId;
use crate::engine::record::InboxClaim;
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
}
