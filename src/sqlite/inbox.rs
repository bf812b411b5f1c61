//! The Inbox on SQLite: a message's claim under SQLite's write lock (`BEGIN IMMEDIATE`
//! serialises its consumers), and its outcome recorded in the same transaction.

use std::time::Duration;

use ::sqlx::Executor;

use super::conn::SqliteConn;
use super::{SqliteStore, sql};
use crate::engine::error::Error;
use crate::engine::key::RecordId;
use crate::engine::record::InboxClaim;
use crate::store::InboxStore;

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
}
