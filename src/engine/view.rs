//! What the operator's tools show of the crate's tables: [`RecordInfo`], [`MessageInfo`],
//! [`OutboxInfo`]. Each driver decodes them from the rows of the statements in
//! `store/sql.rs`, with the decoders of `store/rows.rs`.

use std::time::SystemTime;

/// A stored idempotency record, as [`Admin`](crate::Admin) shows it. The response itself is not
/// included, only its size.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RecordInfo {
    /// The record id (first 16 bytes of SHA-256 over scope and key), 32 hex digits. Log
    /// lines and spans show its first 16.
    pub id: String,
    /// The scope the key belongs to (empty when unscoped).
    pub scope: String,
    /// The raw key, when the layer was configured to store it.
    pub key: Option<String>,
    /// `PROCESSING`, `SUCCESS` or `FAILED`.
    pub state: String,
    /// For `FAILED`: whether the next retry runs the handler again.
    pub retryable: bool,
    /// The stored response status (0 while `PROCESSING`, if none was stored).
    pub status: u16,
    /// The request fingerprint: SHA-256 over method, path and query, chosen headers and
    /// body, 64 hex digits. A retry with another fingerprint is refused with 422.
    pub fingerprint: String,
    /// Lease mode: the fencing token of the current holder.
    pub fencing_token: i64,
    /// When the record was first written.
    pub created_at: SystemTime,
    /// When the record last changed.
    pub updated_at: SystemTime,
    /// After this the record is ignored and the key can be used again.
    pub expires_at: SystemTime,
    /// Lease mode: until when the holder's lease runs.
    pub locked_until: Option<SystemTime>,
    /// Size of the stored response headers and body, in bytes.
    pub response_bytes: usize,
}

/// A record the [`Sweeper`](crate::Sweeper) archived, as
/// [`Admin::archived`](crate::Admin::archived) shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ArchivedRecord {
    /// The record as it was when it was purged (`locked_until` is not archived:
    /// always `None`).
    pub record: RecordInfo,
    /// When the sweeper archived it.
    pub archived_at: SystemTime,
    /// Whether its stored response (headers and body) was archived with it
    /// ([`Archive::Records`](crate::Archive::Records)).
    pub response_kept: bool,
    /// The archived response, when it was kept: a body encrypted at rest is opened with the
    /// [`Admin`](crate::Admin)'s body keys, and stays [`ResponseBody::Sealed`] without them.
    pub response: Option<StoredResponse>,
}

/// A consumed message's inbox record, as [`Admin`](crate::Admin) shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct MessageInfo {
    /// The consumer group.
    pub consumer_group: String,
    /// The message id.
    pub message_id: String,
    /// `SUCCESS` or `FAILED`.
    pub status: String,
    /// Attempts so far (for `SUCCESS`: attempts it took).
    pub attempts: u32,
    /// The error of the last failed attempt.
    pub last_error: Option<String>,
    /// SHA-256 of the payload, 64 hex digits, when the consumer passed one.
    pub payload_digest: Option<String>,
    /// When the message was first recorded.
    pub created_at: SystemTime,
    /// When the record last changed.
    pub updated_at: SystemTime,
    /// After this the record is ignored and the message would be processed again.
    pub expires_at: SystemTime,
}

/// An outbox message, as [`Admin`](crate::Admin) shows it. The payload itself is not included, only its
/// size.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct OutboxInfo {
    /// Position in the outbox: commit order within an ordering key.
    pub seq: i64,
    /// The message id the consumer deduplicates on.
    pub message_id: String,
    /// The topic (for RabbitMQ, the routing key).
    pub topic: String,
    /// The ordering key, if any.
    pub ordering_key: Option<String>,
    /// `PENDING`, `SENT` or `FAILED` (parked after its attempts).
    pub state: String,
    /// Attempts the broker refused (for `SENT`: attempts it took).
    pub attempts: u32,
    /// The broker's last refusal.
    pub last_error: Option<String>,
    /// Size of the payload, in bytes.
    pub payload_bytes: usize,
    /// When the message was enqueued.
    pub created_at: SystemTime,
    /// When the broker confirmed it.
    pub sent_at: Option<SystemTime>,
}

/// Which outbox messages [`Admin::outbox_messages`](crate::Admin::outbox_messages) lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum OutboxState {
    /// Waiting for a relay (or for their next attempt).
    Pending,
    /// Confirmed by the broker.
    Sent,
    /// Parked after the broker refused them `max_attempts` times.
    Failed,
}

impl OutboxState {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "PENDING",
            Self::Sent => "SENT",
            Self::Failed => "FAILED",
        }
    }
}

/// One page of a list that [`Admin`](crate::Admin) pages through: its rows and, when more
/// follow, the cursor that starts the next page.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Page<T> {
    /// The rows of this page, at most the limit asked for.
    pub items: Vec<T>,
    /// Pass it as `after` to get the next page; `None` on the last page.
    pub next: Option<String>,
}

impl<T> Page<T> {
    /// A page of `limit` asked for, from `rows` of up to `limit + 1` (each with its cursor):
    /// an extra row means another page follows.
    pub(crate) fn from_rows(mut rows: Vec<(T, String)>, limit: usize) -> Self {
        let more = rows.len() > limit;
        rows.truncate(limit);
        let next = if more {
            rows.last().map(|(_, cursor)| cursor.clone())
        } else {
            None
        };
        Self {
            items: rows.into_iter().map(|(item, _)| item).collect(),
            next,
        }
    }
}

/// The counts on the console's overview, as [`Admin::overview`](crate::Admin::overview)
/// reads them: each from an index, none from a scan of a table.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Overview {
    /// All records, the planner's estimate (as of the table's last `ANALYZE`; InnoDB's
    /// `TABLE_ROWS`; an exact count on SQLite), and never fewer than `processing +
    /// failed`, which are counted exactly.
    pub records_estimate: i64,
    /// Rows of the sweeper's archive (`idempotency_records_archive`), estimated like
    /// `records_estimate` (a count on SQLite).
    pub archived_estimate: i64,
    /// PROCESSING records (lease mode), live leases and stale ones.
    pub processing: i64,
    /// FAILED records (lease mode).
    pub failed: i64,
    /// PROCESSING records whose lease has run out.
    pub stale: i64,
    /// Seconds since the oldest stale lease ran out.
    pub stale_oldest_seconds: Option<f64>,
    /// Outbox messages waiting for a relay.
    pub outbox_pending: i64,
    /// Seconds the oldest pending outbox message has waited.
    pub outbox_oldest_pending_seconds: Option<f64>,
    /// Outbox messages parked after the broker refused them.
    pub outbox_parked: i64,
    /// Consumer groups with FAILED inbox messages (at most 100).
    pub inbox: Vec<InboxFailures>,
}

/// One consumer group's failed inbox messages, on the [`Overview`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct InboxFailures {
    /// The consumer group.
    pub consumer_group: String,
    /// Its FAILED messages.
    pub failed: i64,
    /// Those of them at the give-up threshold or past it: the next delivery does not run
    /// the work again until their attempts are reset.
    pub given_up: i64,
}

/// A record's stored response, as [`Admin::response`](crate::Admin::response) reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoredResponse {
    /// The response headers the layer kept.
    pub headers: http::HeaderMap,
    /// The body.
    pub body: ResponseBody,
}

/// A stored response body: readable, or sealed under a key this view was not given.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ResponseBody {
    /// The body as the client received it (decrypted, if it was stored encrypted).
    Plain(bytes::Bytes),
    /// Encrypted at rest under the key id, and no key for it was given: redacted.
    Sealed {
        /// The id of the key that sealed it.
        key_id: i16,
        /// The sealed size in bytes.
        len: usize,
    },
}

/// A time the database sent as seconds since the Unix epoch.
pub(crate) fn epoch(seconds: f64) -> SystemTime {
    match std::time::Duration::try_from_secs_f64(seconds.abs()) {
        Ok(offset) if seconds >= 0.0 => SystemTime::UNIX_EPOCH + offset,
        Ok(offset) => SystemTime::UNIX_EPOCH - offset,
        Err(_) => SystemTime::UNIX_EPOCH,
    }
}
