//! Maintenance on tokio-postgres: the sweeper's autocommit batches, the stale-lease scan,
//! and the record look-ups of `Admin`.

use super::PgStore;
use super::statement;
use crate::engine::archive::{ArchivedRow, ExportStamp};
use crate::engine::error::Error;
use crate::engine::key::RecordId;
use crate::engine::record::{Backlog, RetentionParams, StoredRow, SweepBatch};
use crate::engine::view::{ArchivedRecord, RecordInfo};
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

    async fn stale_summary(&self) -> Result<Backlog, Error> {
        self.backlog(&statement::STALE_SUMMARY).await
    }

    async fn stale_ids(&self, limit: i64) -> Result<Vec<Vec<u8>>, Error> {
        self.rows(&statement::STALE_IDS, &[&limit], |row| row.try_get(0))
            .await
    }

    async fn record_info(&self, id: RecordId) -> Result<Option<RecordInfo>, Error> {
        Ok(self
            .rows(&statement::ADMIN_RECORD, &[&id], rows::record_info)
            .await?
            .pop())
    }

    async fn archived_records(
        &self,
        id: RecordId,
    ) -> Result<Vec<(ArchivedRecord, Option<StoredRow>)>, Error> {
        self.rows(&statement::ADMIN_ARCHIVED, &[&id], rows::archived_record)
            .await
    }

    async fn stale_records(&self, limit: i64) -> Result<Vec<RecordInfo>, Error> {
        self.rows(&statement::ADMIN_STALE, &[&limit], rows::record_info)
            .await
    }

    async fn stale_page(
        &self,
        after: (i64, RecordId),
        limit: i64,
    ) -> Result<Vec<(RecordInfo, i64)>, Error> {
        self.rows(
            &statement::ADMIN_STALE_PAGE,
            &[&after.0, &after.1, &limit],
            rows::stale_row,
        )
        .await
    }

    async fn record_response(&self, id: RecordId) -> Result<Option<StoredRow>, Error> {
        Ok(self
            .rows(&statement::ADMIN_RECORD_RESPONSE, &[&id], rows::stored_row)
            .await?
            .pop())
    }

    async fn release_lease(&self, id: RecordId, token: i64) -> Result<bool, Error> {
        self.execute(&statement::ADMIN_RELEASE_LEASE, &[&id, &token])
            .await
            .map(|n| n == 1)
    }

    async fn delete_record(&self, id: RecordId, token: i64) -> Result<bool, Error> {
        self.execute(&statement::ADMIN_DELETE_RECORD, &[&id, &token])
            .await
            .map(|n| n == 1)
    }

    async fn record_counts(&self) -> Result<[i64; 4], Error> {
        Ok(self
            .rows(&statement::ADMIN_RECORD_COUNTS, &[], rows::record_counts)
            .await?
            .pop()
            .unwrap_or_default())
    }
}
