//! The records as the engine sees them, whatever the driver: what a claim can find, what a
//! completion writes, and the codec for stored response headers.
//!
//! Drivers read rows into these types and the engine decides on them, so the rules (what
//! replays, what may be replaced, what counts as in flight) are written once.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};

use crate::engine::crypto::StoredBody;
use crate::engine::fingerprint::Fingerprint;
use crate::engine::key::RecordId;

/// A completed response as stored.
#[derive(Debug)]
pub(crate) struct StoredResponse {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    /// As stored: sealed when `body_key_id` is set (see [`crate::engine::crypto`]).
    pub(crate) body: Bytes,
    /// The key the body is sealed under; `None` for plaintext.
    pub(crate) body_key_id: Option<i16>,
    /// How long the record stays live.
    pub(crate) expires_in: Duration,
}

/// The columns of an idempotency record that a claim or a lookup reads, as a driver
/// decoded them.
#[derive(Debug)]
pub struct RecordRow {
    pub(crate) status: i16,
    pub(crate) headers: Vec<u8>,
    pub(crate) body: Vec<u8>,
    pub(crate) fingerprint: Vec<u8>,
    pub(crate) expired: bool,
    pub(crate) state: String,
    pub(crate) retryable: bool,
    /// Whole seconds left on a lease (`None` without one).
    pub(crate) lease_left: Option<i32>,
    /// Seconds until `expires_at`.
    pub(crate) expires_in: f64,
    pub(crate) body_key_id: Option<i16>,
}

/// A record found for the key.
#[derive(Debug)]
pub struct Existing {
    pub(crate) fingerprint: Fingerprint,
    /// Past its `expires_at`: treated as absent.
    pub(crate) expired: bool,
    pub(crate) kind: ExistingKind,
}

#[derive(Debug)]
pub(crate) enum ExistingKind {
    /// A final response to replay: SUCCESS, or a FAILED lease that is not retryable.
    Completed(StoredResponse),
    /// A lease-mode holder is still within its lease; seconds left.
    Leased { retry_after: u32 },
    /// Free to be taken over: a lease that ran out, or a retryable failure.
    Replaceable,
}

impl Existing {
    /// Whether a request with `fingerprint` may run in place of this record.
    pub(crate) fn can_be_replaced_by(&self, fingerprint: Fingerprint) -> bool {
        self.expired
            || (matches!(self.kind, ExistingKind::Replaceable) && self.fingerprint == fingerprint)
    }
}

impl From<RecordRow> for Existing {
    fn from(row: RecordRow) -> Self {
        let completed = |row: RecordRow| {
            ExistingKind::Completed(StoredResponse {
                // A status outside 100..=999 can only come from a hand-edited row.
                status: u16::try_from(row.status)
                    .ok()
                    .and_then(|s| StatusCode::from_u16(s).ok())
                    .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
                headers: decode_headers(&row.headers),
                body: Bytes::from(row.body),
                body_key_id: row.body_key_id,
                expires_in: Duration::try_from_secs_f64(row.expires_in).unwrap_or_default(),
            })
        };
        let fingerprint = Fingerprint(row.fingerprint.as_slice().try_into().unwrap_or([0; 32]));
        let expired = row.expired;
        let kind = match row.state.as_str() {
            "SUCCESS" => completed(row),
            "FAILED" if !row.retryable => completed(row),
            "PROCESSING" if row.lease_left.is_some_and(|left| left > 0) => ExistingKind::Leased {
                retry_after: row
                    .lease_left
                    .and_then(|left| u32::try_from(left).ok())
                    .unwrap_or(1),
            },
            _ => ExistingKind::Replaceable,
        };
        Self {
            fingerprint,
            expired,
            kind,
        }
    }
}

/// What the claim found.
#[derive(Debug)]
pub enum Claim {
    /// The lock is ours and the key is free: run the handler. `replaces` says a record for
    /// the id is still in the table (expired, or replaceable) and must be deleted first.
    Run { replaces: bool },
    /// Another transaction holds the lock: the key is in flight.
    InFlight,
    /// A record that this request may not replace; `holds_lock` says whether the key's
    /// lock was taken (and must be released before answering).
    Existing {
        existing: Existing,
        holds_lock: bool,
    },
}

impl Claim {
    /// The answer a lookup outside any transaction can give on its own: a live record that
    /// is final (replayed, or 422 to another request) or held by a lease-mode holder within
    /// its lease (409). Such a record cannot change under the answer — a final one never
    /// changes, and a lease is answered 409 whatever happens next. `None`: the key may be
    /// free, so the claim must take the lock and look again.
    pub(crate) fn from_peek(found: Option<RecordRow>) -> Option<Self> {
        let existing = Existing::from(found?);
        let settled = !existing.expired
            && matches!(
                existing.kind,
                ExistingKind::Completed(_) | ExistingKind::Leased { .. }
            );
        settled.then_some(Self::Existing {
            existing,
            holds_lock: false,
        })
    }

    /// The claim's decision once the record (if any) was read.
    pub(crate) fn decide(locked: bool, found: Option<RecordRow>, fingerprint: Fingerprint) -> Self {
        match (locked, found) {
            (false, None) => Self::InFlight,
            (true, None) => Self::Run { replaces: false },
            (holds_lock, Some(row)) => {
                let existing = Existing::from(row);
                if holds_lock && existing.can_be_replaced_by(fingerprint) {
                    Self::Run { replaces: true }
                } else {
                    Self::Existing {
                        existing,
                        holds_lock,
                    }
                }
            }
        }
    }
}

/// The record written with the handler's work.
#[derive(Debug)]
pub struct NewRecord<'a> {
    pub(crate) id: RecordId,
    pub(crate) scope: &'a str,
    pub(crate) raw_key: Option<&'a str>,
    pub(crate) fingerprint: Fingerprint,
    pub(crate) status: StatusCode,
    pub(crate) headers: Vec<u8>,
    pub(crate) body: StoredBody<'a>,
    pub(crate) ttl: Duration,
}

/// How the completion treats the handler's writes.
#[derive(Debug, Clone, Copy)]
pub struct Completion {
    /// A stored 4xx: roll the handler's writes back, take the key's lock again (waiting at
    /// most this long) in a new transaction, and store the response there.
    pub(crate) discard_handler_writes: Option<Duration>,
    /// A record for the id is still in the table and must be deleted first.
    #[cfg_attr(
        not(any(feature = "postgres", feature = "sqlx", feature = "sqlite")),
        allow(dead_code)
    )]
    pub(crate) replaces: bool,
}

/// Why the final insert-and-commit did not commit.
#[derive(Debug)]
pub enum CommitError {
    /// The primary key already holds a live record: a concurrent request won. The
    /// transaction has been rolled back.
    Conflict,
    /// The key's lock, taken with the record's insert (a handler that sent no
    /// statement), was held by another request: nothing was stored.
    InFlight,
    /// The insert or the COMMIT failed — or its answer was lost, so the outcome is
    /// unknown: nothing stored, or committed and replayable.
    Failed(crate::engine::error::Error),
}

/// What the key's lock, sent with the handler's first statement by a driver that defers
/// `BEGIN` to it, found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deferred {
    /// Nothing deferred, or the lock was granted and the key is free: the handler runs.
    Granted,
    /// Another request holds the key: answered as an in-flight duplicate.
    InFlight,
    /// The lock was granted but a record committed before it: answered from that record.
    Found,
    /// `BEGIN`, the lock or the look-up failed (the handler's statement got that error):
    /// answered 503, as a claim that failed before the handler ran.
    Failed,
}

/// What a lease claim found.
#[derive(Debug)]
pub enum LeaseClaim {
    /// The lease is ours, under this fencing token; `took_over` says an earlier record for
    /// the key (an expired lease, a retryable failure, an expired record) was replaced.
    Acquired { token: i64, took_over: bool },
    /// A record this request may not take over.
    Existing(Existing),
    /// The record changed between the two statements; try again shortly.
    Raced,
}

impl LeaseClaim {
    /// The decision when the upsert did not take the key: the record read beside it.
    #[cfg_attr(
        not(any(feature = "postgres", feature = "sqlx", feature = "mysql")),
        allow(dead_code)
    )]
    pub(crate) fn not_acquired(found: Option<RecordRow>, fingerprint: Fingerprint) -> Self {
        match found.map(Existing::from) {
            Some(existing) if !existing.can_be_replaced_by(fingerprint) => Self::Existing(existing),
            _ => Self::Raced,
        }
    }
}

/// The final state a lease holder writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseEnd {
    Success,
    /// Replayed to retries like a success.
    FinalFailure,
    /// The next retry runs again.
    RetryableFailure,
}

impl LeaseEnd {
    /// The record's `state` column.
    pub(crate) fn state(self) -> &'static str {
        match self {
            Self::Success => "SUCCESS",
            Self::FinalFailure | Self::RetryableFailure => "FAILED",
        }
    }

    /// The record's `retryable` column.
    pub(crate) fn retryable(self) -> bool {
        self == Self::RetryableFailure
    }
}

/// The inbox record of a message, as found under its lock.
#[derive(Debug)]
pub struct InboxRecord {
    pub(crate) succeeded: bool,
    pub(crate) attempts: i32,
    pub(crate) last_error: Option<String>,
    /// Within the retention window; an expired record counts as absent.
    pub(crate) live: bool,
    pub(crate) payload_digest: Option<Vec<u8>>,
}

/// The inbox claim's answer.
#[derive(Debug)]
pub enum InboxClaim<C> {
    /// Another worker held the message's lock past the wait.
    Busy,
    /// The lock is ours, in this transaction; the record, if there is one.
    Locked(C, Option<InboxRecord>),
}

/// What the inbox writes about a message.
#[derive(Debug)]
pub struct InboxWrite<'a> {
    pub(crate) group: &'a str,
    pub(crate) message_id: &'a str,
    pub(crate) payload_digest: Option<&'a [u8]>,
    /// Sealed when `payload_key_id` is set.
    pub(crate) payload: Option<&'a [u8]>,
    pub(crate) payload_key_id: Option<i16>,
    pub(crate) retention: Duration,
}

/// One batched statement of the sweeper.
#[derive(Debug, Clone, Copy)]
pub enum SweepBatch {
    /// Expired idempotency records past their state's retention.
    PurgeRecords(RetentionParams),
    /// Expired inbox records past their state's retention.
    PurgeMessages(RetentionParams),
    /// Settled outbox messages past their retention (`success_grace`: SENT ones after
    /// their confirm, `failure_retention`: parked ones).
    PurgeOutbox(RetentionParams),
    /// PROCESSING records whose lease ended more than this long ago become FAILED and
    /// retryable.
    MarkStaleFailed { after: Duration, limit: i64 },
    /// Archived records archived more than this long ago.
    PurgeArchive { older_than: Duration, limit: i64 },
}

/// Retention settings for one purge batch.
#[derive(Debug, Clone, Copy)]
pub struct RetentionParams {
    pub(crate) success_grace: Duration,
    pub(crate) failure_retention: Duration,
    pub(crate) limit: i64,
    /// Records only: write each purged record to `idempotency_records_archive` first, in
    /// the same transaction.
    pub(crate) archive: Option<Archive>,
}

/// What the [`Sweeper`](crate::Sweeper) keeps of a record it purges, in the table
/// `idempotency_records_archive` (see [`Sweeper::archive`](crate::Sweeper::archive)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Archive {
    /// The whole record, its stored response (status, headers and body; a body encrypted
    /// at rest stays sealed under its key id) among it.
    Records,
    /// The record without its response headers and body: scope, key (when the layer
    /// keeps it), fingerprint, status, state, fencing token and timestamps. For responses
    /// that carry personal data.
    Metadata,
}

impl Archive {
    /// Whether the response's headers and body are archived.
    pub(crate) fn keeps_response(self) -> bool {
        self == Self::Records
    }
}

/// Rows waiting on something, and how long the oldest has waited, in seconds: records
/// past their lease (the stale-lease gauges), or outbox messages not yet published.
#[derive(Debug, Clone, Copy, Default)]
pub struct Backlog {
    pub(crate) count: i64,
    pub(crate) oldest_seconds: Option<f64>,
}

/// A record's stored response as read for the operator: headers, body, body key id.
#[derive(Debug, Clone, Default)]
pub struct StoredRow {
    pub(crate) headers: Vec<u8>,
    pub(crate) body: Vec<u8>,
    pub(crate) body_key_id: Option<i16>,
}

/// Encodes kept headers as length-prefixed (name, value) pairs.
pub(crate) fn encode_headers<'a>(
    headers: impl Iterator<Item = (&'a HeaderName, &'a HeaderValue)>,
) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, value) in headers {
        let (name, value) = (name.as_str().as_bytes(), value.as_bytes());
        // Header lines this long never reach a handler; skip rather than truncate.
        let (Ok(name_len), Ok(value_len)) = (u16::try_from(name.len()), u32::try_from(value.len()))
        else {
            continue;
        };
        out.extend_from_slice(&name_len.to_be_bytes());
        out.extend_from_slice(name);
        out.extend_from_slice(&value_len.to_be_bytes());
        out.extend_from_slice(value);
    }
    out
}

/// Decodes [`encode_headers`]' format; a damaged entry ends the list, and so does an entry
/// past what a `HeaderMap` can hold (only a hand-edited row has that many names).
pub(crate) fn decode_headers(mut bytes: &[u8]) -> HeaderMap {
    fn take<'a>(bytes: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
        if bytes.len() < n {
            return None;
        }
        let (head, tail) = bytes.split_at(n);
        *bytes = tail;
        Some(head)
    }
    let mut headers = HeaderMap::new();
    while !bytes.is_empty() {
        let entry = (|| {
            let name_len = u16::from_be_bytes(take(&mut bytes, 2)?.try_into().ok()?);
            let name = HeaderName::from_bytes(take(&mut bytes, name_len.into())?).ok()?;
            let value_len = u32::from_be_bytes(take(&mut bytes, 4)?.try_into().ok()?);
            let value = HeaderValue::from_bytes(take(&mut bytes, value_len as usize)?).ok()?;
            Some((name, value))
        })();
        // `append` panics once the map is full (2^15 slots, about 24,000 distinct names).
        match entry.map(|(name, value)| headers.try_append(name, value)) {
            Some(Ok(_)) => {}
            Some(Err(_)) | None => break,
        }
    }
    headers
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip() {
        let mut headers = HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("application/json"));
        headers.append("link", HeaderValue::from_static("</a>; rel=a"));
        headers.append("link", HeaderValue::from_static("</b>; rel=b"));
        headers.insert("x-opaque", HeaderValue::from_bytes(b"\xe9t\xe9").unwrap());
        let decoded = decode_headers(&encode_headers(headers.iter()));
        assert_eq!(decoded, headers);
    }

    #[test]
    fn damaged_headers_decode_without_panicking() {
        let encoded = encode_headers(
            [(
                HeaderName::from_static("location"),
                HeaderValue::from_static("/orders/1"),
            )]
            .iter()
            .map(|(n, v)| (n, v)),
        );
        for cut in 0..encoded.len() {
            let _ = decode_headers(&encoded[..cut]);
        }
        assert_eq!(decode_headers(&[0xff; 7]).len(), 0);
    }

    #[test]
    fn too_many_header_names_end_the_list_instead_of_panicking() {
        // More distinct names than a HeaderMap can hold: only a hand-edited row has them.
        let mut encoded = Vec::new();
        for i in 0..40_000u32 {
            let name = format!("x{i}");
            encoded.extend_from_slice(&u16::try_from(name.len()).unwrap().to_be_bytes());
            encoded.extend_from_slice(name.as_bytes());
            encoded.extend_from_slice(&1u32.to_be_bytes());
            encoded.push(b'v');
        }
        let decoded = decode_headers(&encoded);
        assert!(decoded.keys_len() > 20_000, "{}", decoded.keys_len());
        assert!(decoded.keys_len() < 40_000, "{}", decoded.keys_len());
        assert_eq!(decoded.get("x0"), Some(&HeaderValue::from_static("v")));
        // What was kept re-encodes and decodes to itself.
        assert_eq!(decode_headers(&encode_headers(decoded.iter())), decoded);
    }

    fn row(state: &str, fingerprint: [u8; 32]) -> RecordRow {
        RecordRow {
            status: 201,
            headers: Vec::new(),
            body: b"{}".to_vec(),
            fingerprint: fingerprint.to_vec(),
            expired: false,
            state: state.to_owned(),
            retryable: true,
            lease_left: None,
            expires_in: 60.0,
            body_key_id: None,
        }
    }

    #[test]
    fn a_peek_settles_only_final_and_leased_records() {
        assert!(Claim::from_peek(None).is_none());
        assert!(matches!(
            Claim::from_peek(Some(row("SUCCESS", [1; 32]))),
            Some(Claim::Existing {
                holds_lock: false,
                ..
            })
        ));
        let mut failed = row("FAILED", [1; 32]);
        failed.retryable = false;
        assert!(Claim::from_peek(Some(failed)).is_some());
        // A retryable failure or an abandoned lease may be taken over: lock first.
        assert!(Claim::from_peek(Some(row("FAILED", [1; 32]))).is_none());
        assert!(Claim::from_peek(Some(row("PROCESSING", [1; 32]))).is_none());
        let mut leased = row("PROCESSING", [1; 32]);
        leased.lease_left = Some(5);
        assert!(Claim::from_peek(Some(leased)).is_some());
        // An expired record counts as absent.
        let mut expired = row("SUCCESS", [1; 32]);
        expired.expired = true;
        assert!(Claim::from_peek(Some(expired)).is_none());
    }

    #[test]
    fn the_claim_decides_from_lock_and_record() {
        let mine = Fingerprint([1; 32]);
        assert!(matches!(Claim::decide(false, None, mine), Claim::InFlight));
        assert!(matches!(
            Claim::decide(true, None, mine),
            Claim::Run { replaces: false }
        ));
        // A completed record replays, locked or not.
        for locked in [false, true] {
            assert!(matches!(
                Claim::decide(locked, Some(row("SUCCESS", [1; 32])), mine),
                Claim::Existing { holds_lock, .. } if holds_lock == locked
            ));
        }
        // A retryable failure of the same request is replaced under the lock only.
        assert!(matches!(
            Claim::decide(true, Some(row("FAILED", [1; 32])), mine),
            Claim::Run { replaces: true }
        ));
        assert!(matches!(
            Claim::decide(true, Some(row("FAILED", [2; 32])), mine),
            Claim::Existing { .. }
        ));
    }
}
