//! What an archive sink receives: the rows the [`Sweeper`](crate::Sweeper) is about to
//! purge ([`ArchivedRow`]), and what identifies the version of each it was given. The sink
//! trait itself is `ops/archive.rs`.

use bytes::Bytes;

use crate::engine::key::RecordId;
use crate::engine::view::RecordInfo;

/// The error a sink returns; kept as the source of [`Error::Archive`](crate::Error::Archive).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A record the sweeper is about to purge, as an [`ArchiveSink`](crate::ArchiveSink) receives it.
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
