//! Maintenance on tokio-postgres: the sweeper's autocommit batches, the stale-lease scan,
//! and the record look-ups of `Admin`.

use super::PgStore;
use super::statement::{self, Sql};
use crate::engine::archive::ExportStamp;
use crate::engine::error::Error;
use crate::engine::record::SweepBatch;
use crate::store::MaintenanceStore;
use crate::store::sql::export_columns;
use crate::store::sweep::{self, Sweeps};

/// The sweeper's statements.
const SWEEPS: Sweeps<Sql> = Sweeps {
    purge_records: &statement::PURGE_RECORDS,
    purge_records_archiving: Some(&statement::PURGE_RECORDS_ARCHIVING),
    purge_messages: &statement::PURGE_MESSAGES,
    purge_outbox: &statement::PURGE_OUTBOX,
    purge_archive: &statement::PURGE_ARCHIVE,
    mark_stale_failed: &statement::MARK_STALE_FAILED,
};

impl MaintenanceStore for PgStore {
    async fn sweep_batch(&self, batch: SweepBatch) -> Result<u64, Error> {
        sweep::batch(self, &SWEEPS, batch).await
    }

    async fn purge_exported(&self, stamps: &[ExportStamp]) -> Result<u64, Error> {
        let (ids, created, updated) = export_columns(stamps);
        self.execute(&statement::PURGE_EXPORTED, &[&ids, &created, &updated])
            .await
    }
}
