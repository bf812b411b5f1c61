//! Archive sinks: where the [`Sweeper`](crate::Sweeper) sends the records it purges when
//! they should go somewhere other than the built-in `idempotency_records_archive` table —
//! a file of JSON lines, object storage, a log pipeline.
//!
//! A sink batch runs in three steps, none of which holds a lock or a transaction across
//! the sink: the batch's expired records are read; the sink writes them; the records are
//! deleted, each only if it is still the one that was written (same record id, creation
//! and update time). So nothing is deleted before the sink holds it, a sink that fails
//! deletes nothing (the error is counted, logged and the batch retried on the next run),
//! and a record that changed in between (its key used again) stays. Delivery is
//! at least once: a crash between the write and the delete, or two sweepers reading the
//! same batch, send a record again — with the same [`ArchivedRow::archive_id`], so the
//! sink can drop the repeat.

use std::future::Future;
use std::pin::Pin;

use bytes::Bytes;

use crate::engine::key::RecordId;
use crate::engine::view::RecordInfo;

/// The error a sink returns; kept as the source of [`Error::Archive`](crate::Error::Archive).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A record the sweeper is about to purge, as an [`ArchiveSink`] receives it.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ArchivedRow {
    /// The same for every delivery of this record, and different for every record: the
    /// record id and its creation time in microseconds since the Unix epoch,
    /// `{id}-{created_us}`. A key used again after its record was purged is a new row.
    pub archive_id: String,
    /// The record as it is being purged.
    pub record: RecordInfo,
    /// Its stored response, with [`Archive::Records`](crate::Archive::Records); `None`
    /// with [`Archive::Metadata`](crate::Archive::Metadata).
    pub response: Option<ArchivedResponse>,
    pub(crate) stamp: ExportStamp,
}

/// A stored response as the sink receives it: a body encrypted at rest stays sealed.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ArchivedResponse {
    /// The response headers the layer kept.
    pub headers: http::HeaderMap,
    /// The body as stored: sealed under [`body_key_id`](Self::body_key_id) when set.
    pub body: Bytes,
    /// The id of the key the body is sealed under; `None`: the body is plain.
    pub body_key_id: Option<i16>,
}

/// What identifies the version of a record a sink was given: the purge deletes the record
/// only while all three still match.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[doc(hidden)]
pub struct ExportStamp {
    pub(crate) id: RecordId,
    pub(crate) created_us: i64,
    pub(crate) updated_us: i64,
}

/// Somewhere the [`Sweeper`](crate::Sweeper) writes records before it purges them (see
/// [`Sweeper::archive_to`](crate::Sweeper::archive_to)).
///
/// `write` returns once the rows are durable where the sink keeps them; an error leaves
/// every row of the batch in the table, to be sent again on the next run. Rows may arrive
/// more than once: drop repeats by [`ArchivedRow::archive_id`].
///
/// # Example
///
/// ```
/// use std::sync::Mutex;
///
/// use axum_idempotency::{ArchiveSink, ArchivedRow, BoxError};
///
/// /// Keeps the ids it was given (a real sink writes somewhere durable).
/// #[derive(Default)]
/// struct Ids(Mutex<Vec<String>>);
///
/// impl ArchiveSink for Ids {
///     async fn write(&self, rows: &[ArchivedRow]) -> Result<(), BoxError> {
///         let mut ids = self.0.lock().unwrap();
///         ids.extend(rows.iter().map(|row| row.archive_id.clone()));
///         Ok(())
///     }
/// }
/// ```
pub trait ArchiveSink: Send + Sync + 'static {
    /// Writes one batch.
    fn write(&self, rows: &[ArchivedRow]) -> impl Future<Output = Result<(), BoxError>> + Send;
}

type WriteFuture<'a> = Pin<Box<dyn Future<Output = Result<(), BoxError>> + Send + 'a>>;

/// [`ArchiveSink`] as a trait object.
pub(crate) trait DynSink: Send + Sync {
    fn write_dyn<'a>(&'a self, rows: &'a [ArchivedRow]) -> WriteFuture<'a>;
}

impl<S: ArchiveSink> DynSink for S {
    fn write_dyn<'a>(&'a self, rows: &'a [ArchivedRow]) -> WriteFuture<'a> {
        Box::pin(self.write(rows))
    }
}

impl std::fmt::Debug for dyn DynSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ArchiveSink")
    }
}
