//! The sweeper's batches where each is one autocommit statement (PostgreSQL on either
//! client, SQLite), written once over the query seam: a dialect gives its texts in
//! [`Sweeps`]. MySQL sweeps in its own way (a locking read, then one
//! statement per key) and does not use this.

use super::queries::{Param, Queries, retention_params};
use super::rows;
use crate::engine::error::Error;
use crate::engine::record::SweepBatch;

/// A dialect's statements of the sweeper. The purges take the success grace, the failure
/// retention, the earlier of the two and the batch's limit
/// ([`retention_params`](super::queries::retention_params)); the archiving purge also takes
/// whether the archive keeps the response.
#[derive(Debug)]
pub(crate) struct Sweeps<S: ?Sized + 'static> {
    /// Expired records past their state's retention.
    pub(crate) purge_records: &'static S,
    /// [`purge_records`](Self::purge_records) that copies each record to the archive first
    /// and returns how many it purged; `None` where the dialect archives in a transaction
    /// of its own (the driver's `sweep_batch` handles that batch before this module).
    pub(crate) purge_records_archiving: Option<&'static S>,
    /// Expired inbox records.
    pub(crate) purge_messages: &'static S,
    /// Sent and parked outbox messages past their retention.
    pub(crate) purge_outbox: &'static S,
    /// Archived records older than an age. Age, limit.
    pub(crate) purge_archive: &'static S,
    /// PROCESSING records past their lease by a margin. Margin, limit.
    pub(crate) mark_stale_failed: &'static S,
}

/// One of the sweeper's batches; the rows it affected.
pub(crate) async fn batch<Q: Queries>(
    store: &Q,
    sweeps: &Sweeps<Q::Statement>,
    batch: SweepBatch,
) -> Result<u64, Error> {
    let (statement, params) = match batch {
        SweepBatch::PurgeRecords(r) if r.archive.is_some() => {
            let Some(statement) = sweeps.purge_records_archiving else {
                return Err(Error::InvalidArgument(
                    "this database archives in a transaction of its own",
                ));
            };
            let params = retention_params(r);
            let purged = store
                .batch_rows(statement, &params, rows::first_i64)
                .await?;
            let purged = purged.into_iter().next().unwrap_or(0);
            return Ok(u64::try_from(purged).unwrap_or(0));
        }
        SweepBatch::PurgeRecords(r) => (sweeps.purge_records, retention_params(r)),
        SweepBatch::PurgeMessages(r) => (sweeps.purge_messages, retention_params(r)),
        SweepBatch::PurgeOutbox(r) => (sweeps.purge_outbox, retention_params(r)),
        SweepBatch::PurgeArchive { older_than, limit } => {
            let params = [Param::Duration(older_than), Param::I64(limit)];
            return store.batch_affected(sweeps.purge_archive, &params).await;
        }
        SweepBatch::MarkStaleFailed { after, limit } => {
            let params = [Param::Duration(after), Param::I64(limit)];
            return store
                .batch_affected(sweeps.mark_stale_failed, &params)
                .await;
        }
    };
    store.batch_affected(statement, &params[..4]).await
}
