//! Maintenance on SQLite: the sweeper's bounded autocommit batches (each `DELETE` or
//! `UPDATE` holds the write lock for one batch only), the stale-lease scan, and the record
//! look-ups of `Admin`.

use ::sqlx::Row;

use super::{SqliteStore, sql};
use crate::engine::archive::ExportStamp;
use crate::engine::error::Error;
use crate::engine::record::{RetentionParams, SweepBatch};
use crate::store::MaintenanceStore;
use crate::store::queries::Text;
use crate::store::sweep::{self, Sweeps};

impl SqliteStore {
    /// An archiving batch: under the write lock (`BEGIN IMMEDIATE`), the batch's rowids,
    /// their records copied into the archive, the same rows deleted, `COMMIT` — so a record
    /// is in one table or the other, never neither; the rows purged.
    async fn purge_archiving(&self, r: RetentionParams) -> Result<u64, Error> {
        use std::fmt::Write as _;

        let success = r.success_grace.as_secs_f64();
        let failure = r.failure_retention.as_secs_f64();
        let mut tx = self.pool.begin_with(sql::BEGIN_IMMEDIATE).await?;
        let rowids: Vec<i64> = self
            .query(sql::EXPIRED_RECORD_ROWIDS)
            .bind(success)
            .bind(failure)
            .bind(success.min(failure))
            .bind(r.limit)
            .fetch_all(&mut *tx)
            .await?
            .iter()
            .map(|row| row.try_get(0))
            .collect::<Result<_, _>>()?;
        if rowids.is_empty() {
            tx.rollback().await?;
            return Ok(0);
        }
        // Integers the database returned: nothing of anyone's reaches the text.
        let mut list = String::from("(");
        for (i, rowid) in rowids.iter().enumerate() {
            let _ = write!(list, "{}{rowid}", if i == 0 { "" } else { "," });
        }
        list.push(')');
        let response = if r.archive.is_some_and(|a| a.keeps_response()) {
            "headers, body, body_key_id"
        } else {
            "NULL, NULL, NULL"
        };
        let archive = format!(
            "{}{list}{}",
            sql::ARCHIVE_RECORDS.replace("{response}", response),
            sql::ARCHIVE_SUFFIX
        );
        ::sqlx::raw_sql(::sqlx::AssertSqlSafe(archive))
            .execute(&mut *tx)
            .await?;
        let deleted = ::sqlx::raw_sql(::sqlx::AssertSqlSafe(format!(
            "DELETE FROM idempotency_records WHERE rowid IN {list}"
        )))
        .execute(&mut *tx)
        .await?
        .rows_affected();
        tx.commit().await?;
        Ok(deleted)
    }
}

/// The sweeper's statements; an archiving purge is [`SqliteStore::purge_archiving`].
const SWEEPS: Sweeps<Text> = Sweeps {
    purge_records: &Text::new(sql::PURGE_RECORDS),
    purge_records_archiving: None,
    purge_messages: &Text::new(sql::PURGE_MESSAGES),
    purge_outbox: &Text::new(sql::PURGE_OUTBOX),
    purge_archive: &Text::new(sql::PURGE_ARCHIVE),
    mark_stale_failed: &Text::new(sql::MARK_STALE_FAILED),
};

impl MaintenanceStore for SqliteStore {
    async fn sweep_batch(&self, batch: SweepBatch) -> Result<u64, Error> {
        match batch {
            SweepBatch::PurgeRecords(r) if r.archive.is_some() => self.purge_archiving(r).await,
            batch => sweep::batch(self, &SWEEPS, batch).await,
        }
    }

    /// Under the write lock (`BEGIN IMMEDIATE`) for the batch only.
    async fn purge_exported(&self, stamps: &[ExportStamp]) -> Result<u64, Error> {
        if stamps.is_empty() {
            return Ok(0);
        }
        let mut tx = self.pool.begin_with(sql::BEGIN_IMMEDIATE).await?;
        let mut deleted = 0;
        for stamp in stamps {
            deleted += self
                .query(sql::PURGE_EXPORTED)
                .bind(&stamp.id.as_bytes()[..])
                .bind(stamp.created_us)
                .bind(stamp.updated_us)
                .execute(&mut *tx)
                .await?
                .rows_affected();
        }
        tx.commit().await?;
        Ok(deleted)
    }
}
