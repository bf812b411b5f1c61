//! Maintenance on sqlx: the sweeper's autocommit batches, the stale-lease scan, and the
//! record look-ups of `Admin`.

use std::time::Duration;

use ::sqlx::Row;

use super::SqlxStore;
use crate::engine::archive::{ArchivedRow, ExportStamp};
use crate::engine::error::Error;
use crate::engine::record::{RetentionParams, SweepBatch};
use crate::store::sql::export_columns;
use crate::store::{MaintenanceStore, rows, sql};

/// How long one of the sweeper's batches may take before it fails as a lost link (the run
/// ends with the error and the next run tries again): far longer than a batch takes on a
/// healthy server, far shorter than the kernel's wait on a silently cut connection.
const BATCH_BOUND: Duration = Duration::from_secs(30);

impl MaintenanceStore for SqlxStore {
    async fn sweep_batch(&self, batch: SweepBatch) -> Result<u64, Error> {
        let query = match batch {
            SweepBatch::PurgeRecords(r) if r.archive.is_some() => {
                let success = r.success_grace.as_secs_f64();
                let failure = r.failure_retention.as_secs_f64();
                let query = self
                    .query(sql::PURGE_RECORDS_ARCHIVING)
                    .bind(success)
                    .bind(failure)
                    .bind(success.min(failure))
                    .bind(r.limit)
                    .bind(r.archive.is_some_and(|a| a.keeps_response()));
                let purged: i64 = self
                    .on_own_connection_within(BATCH_BOUND, |conn| Box::pin(query.fetch_one(conn)))
                    .await?
                    .try_get(0)?;
                return Ok(purged as u64);
            }
            SweepBatch::PurgeArchive { older_than, limit } => self
                .query(sql::PURGE_ARCHIVE)
                .bind(older_than.as_secs_f64())
                .bind(limit),
            SweepBatch::PurgeRecords(r)
            | SweepBatch::PurgeMessages(r)
            | SweepBatch::PurgeOutbox(r) => {
                let sql = match batch {
                    SweepBatch::PurgeRecords(_) => sql::PURGE_RECORDS,
                    SweepBatch::PurgeMessages(_) => sql::PURGE_MESSAGES,
                    _ => sql::PURGE_OUTBOX,
                };
                let success = r.success_grace.as_secs_f64();
                let failure = r.failure_retention.as_secs_f64();
                self.query(sql)
                    .bind(success)
                    .bind(failure)
                    .bind(success.min(failure))
                    .bind(r.limit)
            }
            SweepBatch::MarkStaleFailed { after, limit } => self
                .query(sql::MARK_STALE_FAILED)
                .bind(after.as_secs_f64())
                .bind(limit),
        };
        let done = self
            .on_own_connection_within(BATCH_BOUND, |conn| Box::pin(query.execute(conn)))
            .await?;
        Ok(done.rows_affected())
    }

    async fn export_batch(&self, r: RetentionParams) -> Result<Vec<ArchivedRow>, Error> {
        let (success, failure) = (
            r.success_grace.as_secs_f64(),
            r.failure_retention.as_secs_f64(),
        );
        let query = self
            .query(sql::EXPORT_RECORDS)
            .bind(success)
            .bind(failure)
            .bind(success.min(failure))
            .bind(r.limit)
            .bind(r.archive.is_some_and(|a| a.keeps_response()));
        self.rows(query, rows::archived_row).await
    }

    async fn purge_exported(&self, stamps: &[ExportStamp]) -> Result<u64, Error> {
        let (ids, created, updated) = export_columns(stamps);
        let query = self
            .query(sql::PURGE_EXPORTED)
            .bind(ids)
            .bind(created)
            .bind(updated);
        let done = self
            .on_own_connection_within(BATCH_BOUND, |conn| Box::pin(query.execute(conn)))
            .await?;
        Ok(done.rows_affected())
    }
}
