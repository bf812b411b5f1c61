//! The row decoders, written once for every driver: each reads the columns of one
//! statement of [`sql`](super::sql) in that statement's order, through [`Row`], which each
//! driver implements for its own row type with `impl_row!`.

use crate::engine::archive::{ArchivedResponse, ArchivedRow, ExportStamp};
use crate::engine::key::{RecordId, hex};
use crate::engine::outbox::Outgoing;
use crate::engine::record::decode_headers;
use crate::engine::record::{Backlog, InboxClaim, InboxRecord, RecordRow, StoredRow};
use crate::engine::view::InboxFailures;
use crate::engine::view::{ArchivedRecord, MessageInfo, OutboxInfo, RecordInfo, epoch};

/// A driver's result row, read by column position.
pub trait Row {
    /// The driver's decoding error.
    type Error;
    fn text(&self, i: usize) -> Result<String, Self::Error>;
    fn opt_text(&self, i: usize) -> Result<Option<String>, Self::Error>;
    fn bytes(&self, i: usize) -> Result<Vec<u8>, Self::Error>;
    fn opt_bytes(&self, i: usize) -> Result<Option<Vec<u8>>, Self::Error>;
    fn boolean(&self, i: usize) -> Result<bool, Self::Error>;
    fn i16(&self, i: usize) -> Result<i16, Self::Error>;
    fn opt_i16(&self, i: usize) -> Result<Option<i16>, Self::Error>;
    fn i32(&self, i: usize) -> Result<i32, Self::Error>;
    fn opt_i32(&self, i: usize) -> Result<Option<i32>, Self::Error>;
    fn i64(&self, i: usize) -> Result<i64, Self::Error>;
    fn f64(&self, i: usize) -> Result<f64, Self::Error>;
    fn opt_f64(&self, i: usize) -> Result<Option<f64>, Self::Error>;
}

/// Implements [`Row`] for a driver's row type whose `try_get(usize)` decodes every column
/// type the crate reads (`tokio_postgres::Row`, `sqlx::postgres::PgRow` with `sqlx::Row`
/// in scope).
macro_rules! impl_row {
    ($row:ty, $error:ty) => {
        impl $crate::store::rows::Row for $row {
            type Error = $error;
            $crate::store::rows::impl_row!(@get $error; text String, opt_text Option<String>,
                bytes Vec<u8>, opt_bytes Option<Vec<u8>>, boolean bool, i16 i16,
                opt_i16 Option<i16>, i32 i32, opt_i32 Option<i32>, i64 i64, f64 f64,
                opt_f64 Option<f64>);
        }
    };
    (@get $error:ty; $($name:ident $ty:ty),*) => {
        $(fn $name(&self, i: usize) -> Result<$ty, $error> {
            self.try_get(i)
        })*
    };
}
pub(crate) use impl_row;

/// A count and the age in seconds of the oldest (`STALE_SUMMARY`, `OUTBOX_PENDING`,
/// `OUTBOX_PARKED`).
pub(crate) fn backlog<R: Row>(row: &R) -> Result<Backlog, R::Error> {
    Ok(Backlog {
        count: row.i64(0)?,
        oldest_seconds: row.opt_f64(1)?,
    })
}

/// The columns of `INBOX_LOOKUP`: succeeded, attempts, last error, live, payload digest.
pub(crate) fn inbox_record<R: Row>(row: &R) -> Result<InboxRecord, R::Error> {
    Ok(InboxRecord {
        succeeded: row.boolean(0)?,
        attempts: row.i32(1)?,
        last_error: row.opt_text(2)?,
        live: row.boolean(3)?,
        payload_digest: row.opt_bytes(4)?,
    })
}

/// A message's claim under its lock: the transaction's connection, and the record the
/// lookup `found`, decoded by [`inbox_record`].
pub(crate) fn inbox_locked<R: Row, C>(
    conn: C,
    found: Option<&R>,
) -> Result<InboxClaim<C>, R::Error> {
    let record = found.map(inbox_record).transpose()?;
    Ok(InboxClaim::Locked(conn, record))
}

/// The columns of `OUTBOX_LOCK_BATCH`: seq, message id, topic, ordering key, content type,
/// payload, attempts, age in seconds.
pub(crate) fn outgoing<R: Row>(row: &R) -> Result<Outgoing, R::Error> {
    Ok(Outgoing {
        seq: row.i64(0)?,
        message_id: row.text(1)?,
        topic: row.text(2)?,
        ordering_key: row.opt_text(3)?,
        content_type: row.opt_text(4)?,
        payload: row.bytes(5)?,
        attempts: row.i32(6)?,
        age_seconds: row.f64(7)?,
    })
}

/// A first column of `int4` (`SCHEMA_VERSION`).
pub(crate) fn first_i32<R: Row>(row: &R) -> Result<i32, R::Error> {
    row.i32(0)
}

/// A first column of `int8` (`SCHEMA_TABLE`).
pub(crate) fn first_i64<R: Row>(row: &R) -> Result<i64, R::Error> {
    row.i64(0)
}

/// A first column of bytes (`STALE_IDS`).
pub(crate) fn first_bytes<R: Row>(row: &R) -> Result<Vec<u8>, R::Error> {
    row.bytes(0)
}

/// The columns of a record's look-up ([`Statements::lookup`](super::queries::Statements)).
pub(crate) fn lookup<R: Row>(row: &R) -> Result<RecordRow, R::Error> {
    record_row(row, 9)
}

/// The columns of [`lookup`]'s statement, but for `body_key_id`, which is at
/// `body_key_id`: the claim function returns them with `locked` and `found` before it.
pub(crate) fn record_row<R: Row>(row: &R, body_key_id: usize) -> Result<RecordRow, R::Error> {
    Ok(RecordRow {
        status: row.i16(0)?,
        headers: row.bytes(1)?,
        body: row.bytes(2)?,
        fingerprint: row.bytes(3)?,
        expired: row.boolean(4)?,
        state: row.text(5)?,
        retryable: row.boolean(6)?,
        lease_left: row.opt_i32(7)?,
        expires_in: row.f64(8)?,
        body_key_id: row.opt_i16(body_key_id)?,
    })
}

/// The columns of [`sql::ADMIN_RECORD`](super::sql::ADMIN_RECORD) and
/// [`sql::ADMIN_STALE`](super::sql::ADMIN_STALE) (`select_record!`).
pub(crate) fn record_info<R: Row>(row: &R) -> Result<RecordInfo, R::Error> {
    Ok(RecordInfo {
        id: hex(&row.bytes(0)?),
        scope: row.text(1)?,
        key: row.opt_text(2)?,
        state: row.text(3)?,
        retryable: row.boolean(4)?,
        status: u16::try_from(row.i16(5)?).unwrap_or(0),
        fingerprint: hex(&row.bytes(6)?),
        fencing_token: row.i64(7)?,
        created_at: epoch(row.f64(8)?),
        updated_at: epoch(row.f64(9)?),
        expires_at: epoch(row.f64(10)?),
        locked_until: row.opt_f64(11)?.map(epoch),
        response_bytes: usize::try_from(row.i64(12)?).unwrap_or(usize::MAX),
    })
}

/// The columns of an export query (`EXPORT_RECORDS`): [`record_info`]'s, then the
/// creation and update times in whole microseconds (the purge's match), and the response's
/// headers, body and body key id (all `NULL` when the response is not archived).
pub(crate) fn archived_row<R: Row>(row: &R) -> Result<ArchivedRow, R::Error> {
    let record = record_info(row)?;
    let stamp = ExportStamp {
        id: RecordId::from_slice(&row.bytes(0)?),
        created_us: row.i64(13)?,
        updated_us: row.i64(14)?,
    };
    let response = match (row.opt_bytes(15)?, row.opt_bytes(16)?) {
        (Some(headers), Some(body)) => Some(ArchivedResponse {
            headers: decode_headers(&headers),
            body: body.into(),
            body_key_id: row.opt_i16(17)?,
        }),
        _ => None,
    };
    Ok(ArchivedRow {
        archive_id: format!("{}-{}", record.id, stamp.created_us),
        record,
        response,
        stamp,
    })
}

/// The columns of an archived-record query: [`record_info`]'s, then `archived_at` (epoch
/// seconds), the archived body's length as a nullable float (`NULL`: not kept), and the
/// archived headers, body and body key id (for [`Admin`](crate::Admin) to open).
pub(crate) fn archived_record<R: Row>(
    row: &R,
) -> Result<(ArchivedRecord, Option<StoredRow>), R::Error> {
    let stored = match (row.opt_bytes(15)?, row.opt_bytes(16)?) {
        (Some(headers), Some(body)) => Some(StoredRow {
            headers,
            body,
            body_key_id: row.opt_i16(17)?,
        }),
        _ => None,
    };
    let archived = ArchivedRecord {
        record: record_info(row)?,
        archived_at: epoch(row.f64(13)?),
        response_kept: row.opt_f64(14)?.is_some(),
        response: None,
    };
    Ok((archived, stored))
}

/// The columns of [`sql::ADMIN_MESSAGE`](super::sql::ADMIN_MESSAGE) and
/// [`sql::ADMIN_FAILED_MESSAGES`](super::sql::ADMIN_FAILED_MESSAGES) (`select_message!`).
pub(crate) fn message_info<R: Row>(row: &R) -> Result<MessageInfo, R::Error> {
    Ok(MessageInfo {
        consumer_group: row.text(0)?,
        message_id: row.text(1)?,
        status: row.text(2)?,
        attempts: u32::try_from(row.i32(3)?).unwrap_or(0),
        last_error: row.opt_text(4)?,
        payload_digest: row.opt_bytes(5)?.as_deref().map(hex),
        created_at: epoch(row.f64(6)?),
        updated_at: epoch(row.f64(7)?),
        expires_at: epoch(row.f64(8)?),
    })
}

/// The columns of [`sql::ADMIN_OUTBOX`](super::sql::ADMIN_OUTBOX).
pub(crate) fn outbox_info<R: Row>(row: &R) -> Result<OutboxInfo, R::Error> {
    Ok(OutboxInfo {
        seq: row.i64(0)?,
        message_id: row.text(1)?,
        topic: row.text(2)?,
        ordering_key: row.opt_text(3)?,
        state: row.text(4)?,
        attempts: u32::try_from(row.i32(5)?).unwrap_or(0),
        last_error: row.opt_text(6)?,
        payload_bytes: usize::try_from(row.i64(7)?).unwrap_or(usize::MAX),
        created_at: epoch(row.f64(8)?),
        sent_at: row.opt_f64(9)?.map(epoch),
    })
}

/// The columns of [`sql::ADMIN_STALE_PAGE`](super::sql::ADMIN_STALE_PAGE): a record and its
/// cursor.
pub(crate) fn stale_row<R: Row>(row: &R) -> Result<(RecordInfo, i64), R::Error> {
    Ok((record_info(row)?, row.i64(13)?))
}

/// The columns of [`sql::ADMIN_FAILED_PAGE`](super::sql::ADMIN_FAILED_PAGE): a message and
/// its cursor.
pub(crate) fn failed_row<R: Row>(row: &R) -> Result<(MessageInfo, i64), R::Error> {
    Ok((message_info(row)?, row.i64(9)?))
}

/// The columns of [`sql::ADMIN_FAILED_GROUPS`](super::sql::ADMIN_FAILED_GROUPS).
pub(crate) fn inbox_failures<R: Row>(row: &R) -> Result<InboxFailures, R::Error> {
    Ok(InboxFailures {
        consumer_group: row.text(0)?,
        failed: row.i64(1)?,
        given_up: row.i64(2)?,
    })
}

/// The columns of [`sql::ADMIN_RECORD_RESPONSE`](super::sql::ADMIN_RECORD_RESPONSE).
pub(crate) fn stored_row<R: Row>(row: &R) -> Result<StoredRow, R::Error> {
    Ok(StoredRow {
        headers: row.bytes(0)?,
        body: row.bytes(1)?,
        body_key_id: row.opt_i16(2)?,
    })
}

/// The columns of [`sql::ADMIN_RECORD_COUNTS`](super::sql::ADMIN_RECORD_COUNTS).
pub(crate) fn record_counts<R: Row>(row: &R) -> Result<[i64; 4], R::Error> {
    Ok([row.i64(0)?, row.i64(1)?, row.i64(2)?, row.i64(3)?])
}
