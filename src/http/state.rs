//! Per-request state: what the layer learned about a keyed request, the claim the extractor
//! makes, and the completion the layer runs after the handler.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use axum::response::Response;
use http::StatusCode;

use std::time::Instant;

use crate::engine::crypto::{self, StoredBody};
use crate::engine::fingerprint::Fingerprint;
use crate::engine::key::{IdempotencyKey, RecordId};
use crate::engine::record::NewRecord;
use crate::engine::shared_tx::SharedTx;
use crate::http::config::Config;
use crate::http::rejection::{Rejection, RejectionKind};
use crate::store::{ConnOf, LeaseStore, Store};

/// An id of its own for a request without a key (for its log lines and derived keys):
/// unique in the process and across restarts.
fn unkeyed_id() -> RecordId {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_nanos());
    RecordId::from_parts("axum-idempotency/unkeyed", &format!("{now}-{n}"))
}

/// What the layer knows about one keyed request.
pub(crate) struct RequestState<D: Store> {
    pub(crate) config: Arc<Config<D>>,
    pub(crate) id: RecordId,
    pub(crate) scope: String,
    /// `None`: a request without a key on a layer that does not require one; its handler's
    /// transaction is a plain one, and nothing is recorded.
    pub(crate) key: Option<IdempotencyKey>,
    pub(crate) fingerprint: Fingerprint,
    /// Atomic mode: the shared transaction.
    pub(crate) tx: Arc<SharedTx<ConnOf<D>>>,
    /// Atomic mode, set by the claim: a record for this id must be deleted before the insert.
    pub(crate) replaces: AtomicBool,
    /// Lease mode: the fencing token of the lease this request holds.
    pub(crate) lease: std::sync::Mutex<Option<i64>>,
    pub(crate) claimed: AtomicBool,
    /// Atomic mode: the handler reached its transaction (set by the `IdempotentTx` handle).
    pub(crate) work_began: Arc<AtomicBool>,
    /// When the layer took the request: the earliest its record's lifetime can start.
    pub(crate) started: Instant,
    /// This request holds the Redis front line's in-flight lock.
    #[cfg(feature = "redis")]
    pub(crate) redis_lock: AtomicBool,
}

impl<D: LeaseStore> RequestState<D> {
    pub(crate) fn new(
        config: Arc<Config<D>>,
        scope: String,
        key: Option<IdempotencyKey>,
        fingerprint: Fingerprint,
    ) -> Self {
        let id = match &key {
            Some(key) => RecordId::new(&scope, key),
            None => unkeyed_id(),
        };
        Self {
            id,
            config,
            scope,
            key,
            fingerprint,
            tx: Arc::new(SharedTx::new(id)),
            replaces: AtomicBool::new(false),
            lease: std::sync::Mutex::new(None),
            claimed: AtomicBool::new(false),
            work_began: Arc::new(AtomicBool::new(false)),
            started: Instant::now(),
            #[cfg(feature = "redis")]
            redis_lock: AtomicBool::new(false),
        }
    }

    /// Rendered with the default; the layer applies a custom renderer on the way out.
    pub(crate) fn reject(&self, rejection: Rejection) -> Response {
        rejection.problem_response()
    }

    pub(crate) fn record<'a>(
        &'a self,
        status: StatusCode,
        headers: Vec<u8>,
        body: StoredBody<'a>,
    ) -> NewRecord<'a> {
        NewRecord {
            id: self.id,
            scope: &self.scope,
            raw_key: self
                .key
                .as_ref()
                .filter(|_| self.config.store_raw_key)
                .map(IdempotencyKey::as_str),
            fingerprint: self.fingerprint,
            status,
            headers,
            body,
            ttl: self.config.ttl,
        }
    }

    /// The body as it is to be stored: sealed when the layer encrypts bodies.
    pub(crate) fn seal<'a>(&self, body: &'a [u8]) -> Result<StoredBody<'a>, Rejection> {
        crypto::seal_body(self.config.body_keys.as_ref(), self.id, body).map_err(|e| {
            tracing::error!(record = %self.id, error = %e, "could not encrypt the response");
            Rejection::new(
                RejectionKind::CommitFailed,
                "the response could not be encrypted for storage; the work was rolled back",
            )
            .with_source(crate::engine::error::Error::Encryption(e))
        })
    }
}

/// A request dropped before it ended (cancelled with `finish_on_disconnect(false)`) gives
/// its Redis lock back rather than leave it to expire.
#[cfg(feature = "redis")]
impl<D: Store> Drop for RequestState<D> {
    fn drop(&mut self) {
        if *self.redis_lock.get_mut() {
            if let Some(front) = &self.config.redis {
                front.release_in_background(self.id);
            }
        }
    }
}

impl<D: Store> std::fmt::Debug for RequestState<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestState")
            .field("id", &self.id)
            .field("fingerprint", &self.fingerprint)
            .finish_non_exhaustive()
    }
}
