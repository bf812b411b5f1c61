//! Maintenance on sqlx: the sweeper's autocommit batches, the stale-lease scan, and the
//! record look-ups of `Admin`.

use std::time::Duration;

use super::SqlxStore;
use crate::engine::archive::ExportStamp;
use crate::engine::error::Error;
use crate::engine::record::SweepBatch;
use crate::store::queries::Text;
use crate::store::sql::export_columns;
use crate::store::sweep::{self, Sweeps};
use crate::store::{MaintenanceStore, sql};

/// How long one of the sweeper's batches may take before it fails as a lost link (the run
/// ends with the error and the next run tries again): far longer than a batch takes on a
/// healthy server, far shorter than the kernel's wait on a silently cut connection.
pub(super) const BATCH_BOUND: Duration = Duration::from_secs(30);

/// The sweeper's statements, the texts the tokio-postgres driver runs.
const SWEEPS: Sweeps<Text> = Sweeps {
    purge_records: &Text::new(sql::PURGE_RECORDS),
    purge_records_archiving: Some(&Text::new(sql::PURGE_RECORDS_ARCHIVING)),
    purge_messages: &Text::new(sql::PURGE_MESSAGES),
    purge_outbox: &Text::new(sql::PURGE_OUTBOX),
    purge_archive: &Text::new(sql::PURGE_ARCHIVE),
    mark_stale_failed: &Text::new(sql::MARK_STALE_FAILED),
};

impl MaintenanceStore for SqlxStore {
    async fn sweep_batch(&self, batch: SweepBatch) -> Result<u64, Error> {
        sweep::batch(self, &SWEEPS, batch).await
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
