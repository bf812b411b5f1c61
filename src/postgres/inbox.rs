//! The Inbox on tokio-postgres: a message's claim under its lock, and its outcome
//! recorded in the same transaction.

use std::time::Duration;

use tokio_postgres::types::ToSql;

use super::PgStore;
use super::conn::{TxConn, begin_wait_and_look_up};
use super::statement::{self, Db};
use crate::engine::error::Error;
use crate::engine::key::RecordId;
use crate::engine::record::{InboxClaim, InboxWrite};
use crate::store::queries::{TxQueries, inbox_failure_params};
use crate::store::{InboxStore, sql};

impl InboxStore for PgStore {
    /// One round trip once prepared.
    async fn inbox_claim(
        &self,
        id: RecordId,
        group: &str,
        message_id: &str,
        wait: Duration,
    ) -> Result<InboxClaim<TxConn>, Error> {
        let conn = TxConn::new(self.checkout().await?, self.prepared);
        let db = self.db(conn.pooled());
        let lookup_params: [&(dyn ToSql + Sync); 2] = [&group, &message_id];
        let Some(found) = begin_wait_and_look_up(
            db,
            id.lock_key(),
            wait,
            &statement::INBOX_LOOKUP,
            &lookup_params,
            Some(sql::INBOX_WORK_SAVEPOINT),
        )
        .await?
        else {
            return Ok(InboxClaim::Busy);
        };
        Ok(crate::store::rows::inbox_locked(conn, found.as_ref())?)
    }

    /// Pipelined in one round trip.
    async fn inbox_commit(
        conn: &mut TxConn,
        write: &InboxWrite<'_>,
        attempts: i32,
    ) -> Result<(), Error> {
        let db = Db::new(conn.pooled(), conn.prepared());
        let statement = db.prepare(&statement::INBOX_RECORD_SUCCESS).await?;
        let retention = write.retention.as_secs_f64();
        let params: [&(dyn ToSql + Sync); 7] = [
            &write.group,
            &write.message_id,
            &attempts,
            &write.payload_digest,
            &write.payload,
            &write.payload_key_id,
            &retention,
        ];
        let (written, committed) = tokio::join!(
            biased;
            db.execute(&statement, &params),
            db.client().batch_execute("COMMIT"),
        );
        written?;
        committed?;
        conn.mark_ended();
        Ok(())
    }

    /// Back to the savepoint first (the work may have left the transaction aborted, and
    /// nothing else runs in an aborted one), then the record and `COMMIT` pipelined.
    async fn inbox_fail(
        mut conn: TxConn,
        write: &InboxWrite<'_>,
        error: &str,
    ) -> Result<Option<i32>, Error> {
        conn.tx_rollback_work().await?;
        let db = Db::new(conn.pooled(), conn.prepared());
        let statement = db.prepare(&statement::INBOX_RECORD_FAILURE).await?;
        let params = inbox_failure_params(write, error);
        let params: Vec<&(dyn ToSql + Sync)> = params.iter().map(|p| p as _).collect();
        let (row, committed) = tokio::join!(
            biased;
            db.query_opt(&statement, &params),
            db.client().batch_execute("COMMIT"),
        );
        let row = row?;
        committed?;
        conn.mark_ended();
        Ok(row.map(|row| row.try_get(0)).transpose()?)
    }
}
