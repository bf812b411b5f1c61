//! Maintenance on tokio-postgres: the sweeper's autocommit batches, the stale-lease scan,
//! and the record look-ups of `Admin`.

use super::PgStore;
use super::statement;
use crate::engine::archive::{ArchivedRow, ExportStamp};
use crate::engine::error::Error;
use crate::engine::record::{RetentionParams, SweepBatch};
use crate::store::sql::export_columns;
use crate::store::{MaintenanceStore, rows};

impl MaintenanceStore for PgStore {
    async fn sweep_batch(&self, batch: SweepBatch) -> Result<u64, Error> {
        let conn = self.checkout().await?;
        let db = self.db(&*conn);
        let affected = match batch {
            SweepBatch::PurgeRecords(r) if r.archive.is_some() => {
                let success = r.success_grace.as_secs_f64();
                let failure = r.failure_retention.as_secs_f64();
                let earliest = success.min(failure);
                let keep = r.archive.is_some_and(|a| a.keeps_response());
                let statement = db.prepare(&statement::PURGE_RECORDS_ARCHIVING).await?;
                let purged: i64 = db
                    .query_one(
                        &statement,
                        &[&success, &failure, &earliest, &r.limit, &keep],
                    )
                    .await?
                    .try_get(0)?;
                purged as u64
            }
            SweepBatch::PurgeArchive { older_than, limit } => {
                let statement = db.prepare(&statement::PURGE_ARCHIVE).await?;
                db.execute(&statement, &[&older_than.as_secs_f64(), &limit])
                    .await?
            }
            SweepBatch::PurgeRecords(r)
            | SweepBatch::PurgeMessages(r)
            | SweepBatch::PurgeOutbox(r) => {
                let sql = match batch {
                    SweepBatch::PurgeRecords(_) => &statement::PURGE_RECORDS,
                    SweepBatch::PurgeMessages(_) => &statement::PURGE_MESSAGES,
                    _ => &statement::PURGE_OUTBOX,
                };
                let success = r.success_grace.as_secs_f64();
                let failure = r.failure_retention.as_secs_f64();
                let earliest = success.min(failure);
                let statement = db.prepare(sql).await?;
                db.execute(&statement, &[&success, &failure, &earliest, &r.limit])
                    .await?
            }
            SweepBatch::MarkStaleFailed { after, limit } => {
                let statement = db.prepare(&statement::MARK_STALE_FAILED).await?;
                db.execute(&statement, &[&after.as_secs_f64(), &limit])
                    .await?
            }
        };
        Ok(affected)
    }

    async fn export_batch(&self, r: RetentionParams) -> Result<Vec<ArchivedRow>, Error> {
        let (success, failure) = (
            r.success_grace.as_secs_f64(),
            r.failure_retention.as_secs_f64(),
        );
        let keep = r.archive.is_some_and(|a| a.keeps_response());
        self.rows(
            &statement::EXPORT_RECORDS,
            &[&success, &failure, &success.min(failure), &r.limit, &keep],
            rows::archived_row,
        )
        .await
    }

    async fn purge_exported(&self, stamps: &[ExportStamp]) -> Result<u64, Error> {
        let (ids, created, updated) = export_columns(stamps);
        self.execute(&statement::PURGE_EXPORTED, &[&ids, &created, &updated])
            .await
    }
}
