//! Maintenance on MySQL/MariaDB: the sweeper's bounded batches (each a short READ
//! COMMITTED transaction — no gap locks blocking new records — that locks its batch with
//! `FOR UPDATE SKIP LOCKED` and deletes or marks exactly those rows by their primary keys, its
//! lock waits bounded to one second), the stale-lease scan, and the record look-ups of `Admin`.

use std::fmt::Write as _;

use ::sqlx::mysql::{MySql, MySqlArguments, MySqlRow};
use ::sqlx::query::Query;
use ::sqlx::{AssertSqlSafe, Row};

use super::MySqlStore;
use super::conn::micros;
use super::sql;
use crate::engine::archive::ExportStamp;
use crate::engine::error::Error;
use crate::engine::key::hex;
use crate::engine::record::SweepBatch;
use crate::store::MaintenanceStore;

/// Rows settled per round trip: a batch's statements are sent as one multi-statement text
/// of at most this many, far below the server's `max_allowed_packet` even for the longest
/// inbox keys.
const ROWS_PER_ROUND_TRIP: usize = 256;

/// The primary key of a sweep batch's table, as its locking `SELECT` returns it.
#[derive(Clone, Copy)]
enum Key {
    /// `idempotency_records.id`.
    RecordId,
    /// `inbox_messages (consumer_group, message_id)`.
    Message,
    /// `idempotency_outbox.seq`.
    Seq,
    /// `idempotency_records_archive (id, created_at)`, the time as the `SELECT` formatted it.
    Archived,
}

/// One statement a sweep batch runs for each locked key: `prefix`, the key's equality,
/// `suffix`; the rows of the statements marked `counted` are the batch's.
struct PerKey {
    prefix: &'static str,
    suffix: &'static str,
    counted: bool,
}

impl PerKey {
    const fn counted(prefix: &'static str) -> Self {
        Self {
            prefix,
            suffix: "",
            counted: true,
        }
    }
}

impl Key {
    /// Appends the equality on `row`'s key (`id = X'…'`): its values are the bytes and
    /// numbers the batch's own `SELECT` returned, written as hexadecimal and integer
    /// literals, so no text of anyone's reaches the statement.
    fn push_condition(self, text: &mut String, row: &MySqlRow) -> Result<(), ::sqlx::Error> {
        match self {
            Self::RecordId => {
                text.push_str("id = ");
                push_hex(text, &row.try_get::<Vec<u8>, _>(0)?);
            }
            Self::Message => {
                text.push_str("consumer_group = ");
                push_hex(text, &row.try_get::<Vec<u8>, _>(0)?);
                text.push_str(" AND message_id = ");
                push_hex(text, &row.try_get::<Vec<u8>, _>(1)?);
            }
            Self::Seq => {
                let _ = write!(text, "seq = {}", row.try_get::<i64, _>(0)?);
            }
            Self::Archived => {
                text.push_str("id = ");
                push_hex(text, &row.try_get::<Vec<u8>, _>(0)?);
                // `DATE_FORMAT`'s digits, dashes, colons, a space and a dot: nothing to escape.
                let created: String = row.try_get(1)?;
                if !created
                    .bytes()
                    .all(|b| b.is_ascii_digit() || b" -:.".contains(&b))
                {
                    return Err(::sqlx::Error::Protocol(format!(
                        "unexpected archived created_at {created:?}"
                    )));
                }
                let _ = write!(text, " AND created_at = '{created}'");
            }
        }
        Ok(())
    }
}

/// Appends `bytes` as a hexadecimal string literal, `X'…'` (valid for no bytes too).
fn push_hex(text: &mut String, bytes: &[u8]) {
    text.push_str("X'");
    text.push_str(&hex(bytes));
    text.push('\'');
}

impl MySqlStore {
    /// One sweep batch, in a short READ COMMITTED transaction of its own (lock waits bounded
    /// to 1 s): `select` locks the batch's keys (`FOR UPDATE SKIP LOCKED`, so it never waits
    /// for a row a live request holds), one statement per key (`prefix`, ending in `WHERE `,
    /// and the key's equality) deletes or marks exactly those rows, and `COMMIT`; the rows
    /// affected. An empty batch ends its transaction after the `SELECT`.
    ///
    /// One statement per key, never `WHERE id IN (…)`: when the list covers most of what is
    /// left of a table, InnoDB plans a table scan, which locks each row it reads, so it
    /// waits for the very rows live traffic holds and the `SELECT` skipped (and two sweepers
    /// deadlock). An equality on the primary key reads, and locks, its one row.
    async fn sweep_locked(
        &self,
        select: Query<'static, MySql, MySqlArguments>,
        key: Key,
        statements: &[PerKey],
    ) -> Result<u64, Error> {
        let mut conn = self.begin_internal(1).await?;
        let keys = select.fetch_all(conn.connection_mut()).await?;
        if keys.is_empty() {
            conn.reset().await;
            return Ok(0);
        }
        let mut affected = 0;
        for chunk in keys.chunks(ROWS_PER_ROUND_TRIP) {
            for statement in statements {
                let mut text = String::new();
                for row in chunk {
                    text.push_str(statement.prefix);
                    key.push_condition(&mut text, row)?;
                    text.push_str(statement.suffix);
                    text.push_str(";\n");
                }
                let done = ::sqlx::raw_sql(AssertSqlSafe(text))
                    .execute(conn.connection_mut())
                    .await?;
                if statement.counted {
                    affected += done.rows_affected();
                }
            }
        }
        conn.finish(true).await?;
        Ok(affected)
    }
}

impl MaintenanceStore for MySqlStore {
    async fn sweep_batch(&self, batch: SweepBatch) -> Result<u64, Error> {
        match batch {
            SweepBatch::PurgeRecords(r)
            | SweepBatch::PurgeMessages(r)
            | SweepBatch::PurgeOutbox(r) => {
                let archived_then_purged = |copy| {
                    [
                        PerKey {
                            prefix: copy,
                            suffix: sql::ARCHIVE_ONE_SUFFIX,
                            counted: false,
                        },
                        PerKey::counted(sql::PURGE_RECORDS_ONE),
                    ]
                };
                let records = archived_then_purged(sql::ARCHIVE_RECORD_ONE);
                let metadata = archived_then_purged(sql::ARCHIVE_METADATA_ONE);
                let (select, key, statements): (_, _, &[PerKey]) = match batch {
                    SweepBatch::PurgeRecords(r) => (
                        sql::PURGE_RECORDS,
                        Key::RecordId,
                        match r.archive {
                            Some(archive) if archive.keeps_response() => &records,
                            Some(_) => &metadata,
                            None => &[PerKey::counted(sql::PURGE_RECORDS_ONE)],
                        },
                    ),
                    SweepBatch::PurgeMessages(_) => (
                        sql::PURGE_MESSAGES,
                        Key::Message,
                        &[PerKey::counted(sql::PURGE_MESSAGES_ONE)],
                    ),
                    _ => (
                        sql::PURGE_OUTBOX,
                        Key::Seq,
                        &[PerKey::counted(sql::PURGE_OUTBOX_ONE)],
                    ),
                };
                let success = micros(r.success_grace);
                let failure = micros(r.failure_retention);
                let select = self
                    .query(select)
                    .bind(success.min(failure))
                    .bind(success)
                    .bind(failure)
                    .bind(r.limit);
                self.sweep_locked(select, key, statements).await
            }
            SweepBatch::MarkStaleFailed { after, limit } => {
                let select = self
                    .query(sql::MARK_STALE_FAILED)
                    .bind(micros(after))
                    .bind(limit);
                let statements = [PerKey::counted(sql::MARK_STALE_FAILED_ONE)];
                self.sweep_locked(select, Key::RecordId, &statements).await
            }
            SweepBatch::PurgeArchive { older_than, limit } => {
                let select = self
                    .query(sql::PURGE_ARCHIVE)
                    .bind(micros(older_than))
                    .bind(limit);
                let statements = [PerKey::counted(sql::PURGE_ARCHIVE_ONE)];
                self.sweep_locked(select, Key::Archived, &statements).await
            }
        }
    }

    /// One statement per record (see [`MySqlStore::sweep_locked`] for why never `IN (…)`),
    /// sent [`ROWS_PER_ROUND_TRIP`] at a time in one short transaction, lock waits bounded
    /// to one second.
    async fn purge_exported(&self, stamps: &[ExportStamp]) -> Result<u64, Error> {
        if stamps.is_empty() {
            return Ok(0);
        }
        let mut conn = self.begin_internal(1).await?;
        let mut deleted = 0;
        for chunk in stamps.chunks(ROWS_PER_ROUND_TRIP) {
            // The id's bytes and two integers: nothing of anyone's reaches the text.
            let mut text = String::new();
            for stamp in chunk {
                text.push_str(sql::PURGE_EXPORTED_ONE);
                text.push_str("id = ");
                push_hex(&mut text, stamp.id.as_bytes());
                text.push_str(
                    &sql::PURGE_EXPORTED_TIMES
                        .replace("{created}", &stamp.created_us.to_string())
                        .replace("{updated}", &stamp.updated_us.to_string()),
                );
                text.push_str(";\n");
            }
            deleted += ::sqlx::raw_sql(AssertSqlSafe(text))
                .execute(conn.connection_mut())
                .await?
                .rows_affected();
        }
        conn.finish(true).await?;
        Ok(deleted)
    }
}
