//! Per-request state: what the layer learned about a keyed request, the claim the extractor
//! makes, and the completion the layer runs after the handler.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::body::Body;
use axum::extract::FromRequestParts;
use axum::response::Response;
use bytes::Bytes;
use http::HeaderValue;
use http::request::Parts;
use http_body_util::{BodyExt, Limited};
use tracing::Instrument;

use crate::config::{Config, StoreDecision};
use crate::fingerprint::Fingerprint;
use crate::key::{IdempotencyKey, KeyError, RecordId};
use crate::rejection::{Rejection, RejectionKind};
use crate::store::{self, Claim, CommitError, NewRecord, StoredResponse};
use crate::transaction::{IdempotentTx, SharedTx, TxConn};

/// The response header that marks a replayed response.
pub const REPLAYED_HEADER: &str = "idempotent-replayed";

/// Request extension: a keyed request on a covered method.
#[derive(Clone)]
pub(crate) struct Idempotent(pub(crate) Arc<RequestState>);

/// Request extension: a covered method without a key.
#[derive(Clone, Copy)]
pub(crate) struct KeyMissing;

/// Request extension: a covered method with a malformed key.
#[derive(Clone)]
pub(crate) struct KeyInvalid(pub(crate) KeyError);

/// Request extension: a method the layer does not cover.
#[derive(Clone, Copy)]
pub(crate) struct MethodNotCovered;

/// What the layer knows about one keyed request.
pub(crate) struct RequestState {
    pub(crate) config: Arc<Config>,
    pub(crate) id: RecordId,
    pub(crate) scope: String,
    pub(crate) key: IdempotencyKey,
    pub(crate) fingerprint: Fingerprint,
    pub(crate) tx: Arc<SharedTx>,
    /// Set by the claim: an expired record for this id must be deleted before the insert.
    replaces_expired: AtomicBool,
    claimed: AtomicBool,
}

impl RequestState {
    pub(crate) fn new(
        config: Arc<Config>,
        scope: String,
        key: IdempotencyKey,
        fingerprint: Fingerprint,
    ) -> Self {
        let id = RecordId::new(&scope, &key);
        Self {
            id,
            config,
            scope,
            key,
            fingerprint,
            tx: Arc::new(SharedTx::new(id)),
            replaces_expired: AtomicBool::new(false),
            claimed: AtomicBool::new(false),
        }
    }

    /// Rendered with the default; the layer applies a custom renderer on the way out.
    pub(crate) fn reject(&self, rejection: Rejection) -> Response {
        rejection.problem_response()
    }

    /// The extractor's work: begin, lock, look up — and decide.
    async fn claim(self: &Arc<Self>) -> Result<IdempotentTx, Response> {
        let mut slot = self.tx.slot().await;
        if slot.is_some() {
            // A second extractor in the same handler shares the transaction.
            return Ok(self.tx.handle());
        }
        if self.claimed.swap(true, Ordering::AcqRel) {
            return Err(self.reject(Rejection::new(
                RejectionKind::TransactionLeaked,
                "the idempotent transaction of this request has already ended",
            )));
        }
        let config = &self.config;
        let object = config.pool.get().await.map_err(|e| {
            tracing::warn!(record = %self.id, error = %e, "no connection for the idempotency store");
            self.unavailable(e)
        })?;
        let conn = TxConn::new(object);
        let claim = store::claim(conn.client(), self.id, config.wait_for_in_flight)
            .await
            .map_err(|e| {
                tracing::warn!(record = %self.id, error = %e, "claim failed");
                self.unavailable(e)
            })?;
        match claim {
            Claim::Run { replaces_expired } => {
                tracing::debug!(record = %self.id, replaces_expired, "claimed");
                self.replaces_expired
                    .store(replaces_expired, Ordering::Release);
                *slot = Some(conn);
                Ok(self.tx.handle())
            }
            Claim::InFlight => {
                tracing::debug!(record = %self.id, "in flight");
                Err(self.reject(self.in_flight()))
            }
            Claim::Completed(stored) => {
                // Release the key's lock before answering, so the client's next retry
                // cannot find it still held.
                conn.rollback().await;
                Err(self.answer_repeat(stored))
            }
        }
    }

    fn unavailable(&self, source: impl std::error::Error + Send + Sync + 'static) -> Response {
        self.reject(
            Rejection::new(
                RejectionKind::StoreUnavailable,
                "the idempotency store is unavailable; retry later",
            )
            .with_retry_after(self.config.retry_after)
            .with_source(source),
        )
    }

    fn in_flight(&self) -> Rejection {
        Rejection::new(
            RejectionKind::InFlight,
            "a request with this Idempotency-Key is still being processed",
        )
        .with_retry_after(self.config.retry_after)
    }

    /// A completed record: the stored response if the request is the same, 422 if not.
    fn answer_repeat(&self, stored: StoredResponse) -> Response {
        if stored.fingerprint != self.fingerprint {
            tracing::info!(record = %self.id, "key reused with a different request");
            return self.reject(Rejection::new(
                RejectionKind::KeyReused,
                "this Idempotency-Key was already used for a different request",
            ));
        }
        tracing::debug!(record = %self.id, "replayed");
        let mut response = Response::new(Body::from(stored.body));
        *response.status_mut() = stored.status;
        *response.headers_mut() = stored.headers;
        response
            .headers_mut()
            .insert(REPLAYED_HEADER, HeaderValue::from_static("true"));
        response
    }

    /// Rolls back whatever the handler left open.
    pub(crate) async fn abandon(&self) -> bool {
        match self.tx.take().await {
            Some(conn) => {
                conn.rollback().await;
                true
            }
            None => false,
        }
    }

    /// The layer's work after the handler returned a response: apply the store policy,
    /// then insert the record and commit, or roll back.
    pub(crate) async fn complete<B>(&self, response: Response<B>) -> Response
    where
        B: http_body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<axum::BoxError>,
    {
        let leaked = self.tx.live_handles() > 0;
        // `None` if the handler never claimed (it does not take the extractor, or the
        // extractor answered for it).
        let Some(mut conn) = self.tx.take().await else {
            return response.map(Body::new);
        };
        if leaked {
            tracing::error!(record = %self.id, "handler leaked its IdempotentTx; rolling back");
            conn.rollback().await;
            return self.reject(Rejection::new(
                RejectionKind::TransactionLeaked,
                "the handler kept its transaction handle after returning; its work was rolled back",
            ));
        }
        let decision = (self.config.store_policy)(response.status());
        if decision == StoreDecision::Discard {
            tracing::debug!(record = %self.id, status = %response.status(), "rolled back, not stored");
            conn.rollback().await;
            return response.map(Body::new);
        }
        let (parts, body) = response.into_parts();
        let body = match Limited::new(body, self.config.response_limit)
            .collect()
            .await
        {
            Ok(collected) => collected.to_bytes(),
            Err(e) => {
                conn.rollback().await;
                let rejection = if e.is::<http_body_util::LengthLimitError>() {
                    Rejection::new(
                        RejectionKind::ResponseTooLarge,
                        "the response is larger than the limit for stored responses; the work was rolled back",
                    )
                } else {
                    Rejection::new(
                        RejectionKind::ResponseBodyFailed,
                        "the response body failed while being buffered; the work was rolled back",
                    )
                };
                return self.reject(rejection);
            }
        };
        let headers = store::encode_headers(
            parts
                .headers
                .iter()
                .filter(|(name, _)| self.config.keeps_header(name)),
        );
        let record = NewRecord {
            id: self.id,
            scope: &self.scope,
            raw_key: self.config.store_raw_key.then(|| self.key.as_str()),
            fingerprint: self.fingerprint,
            status: parts.status,
            headers,
            body: &body,
            ttl: self.config.ttl,
        };
        let replaces_expired = self.replaces_expired.load(Ordering::Acquire);
        let outcome = store::insert_and_commit(
            conn.client(),
            &record,
            decision == StoreDecision::StoreWithoutCommit,
            replaces_expired,
        )
        .instrument(tracing::debug_span!("idempotency.commit", record = %self.id))
        .await;
        match outcome {
            Ok(()) => {
                conn.mark_ended();
                tracing::debug!(record = %self.id, status = %parts.status, "committed");
                Response::from_parts(parts, Body::from(body))
            }
            Err(CommitError::Conflict) => {
                // The COMMIT after the failed insert was a ROLLBACK.
                conn.mark_ended();
                tracing::warn!(record = %self.id, "unique-key backstop caught a concurrent request");
                match store::lookup(conn.client(), self.id).await {
                    Ok(Some(stored)) => self.answer_repeat(stored),
                    Ok(None) => self.reject(self.in_flight()),
                    Err(e) => self.unavailable(e),
                }
            }
            Err(CommitError::Failed(e)) => {
                tracing::error!(record = %self.id, error = %e, "commit failed; nothing stored");
                drop(conn);
                self.reject(
                    Rejection::new(
                        RejectionKind::CommitFailed,
                        "the work could not be committed and was not stored; retry the request",
                    )
                    .with_retry_after(self.config.retry_after)
                    .with_source(e),
                )
            }
        }
    }
}

impl std::fmt::Debug for RequestState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestState")
            .field("id", &self.id)
            .field("fingerprint", &self.fingerprint)
            .finish_non_exhaustive()
    }
}

impl<S: Send + Sync> FromRequestParts<S> for IdempotentTx {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        if let Some(Idempotent(state)) = parts.extensions.get::<Idempotent>() {
            let state = Arc::clone(state);
            return state
                .claim()
                .instrument(tracing::debug_span!("idempotency.claim", record = %state.id))
                .await;
        }
        let rejection = if let Some(KeyInvalid(error)) = parts.extensions.get::<KeyInvalid>() {
            Rejection::new(RejectionKind::InvalidKey, error.to_string())
        } else if parts.extensions.get::<KeyMissing>().is_some() {
            Rejection::new(
                RejectionKind::MissingKey,
                "this endpoint requires an Idempotency-Key header",
            )
        } else if parts.extensions.get::<MethodNotCovered>().is_some() {
            Rejection::new(
                RejectionKind::MethodNotCovered,
                format!(
                    "IdempotentTx is used on a {} route, but IdempotencyLayer does not cover {}; \
                     add it with `IdempotencyLayer::methods`",
                    parts.method, parts.method
                ),
            )
        } else {
            Rejection::new(
                RejectionKind::LayerMissing,
                "IdempotentTx needs IdempotencyLayer on this route. Is `IdempotencyLayer` enabled?",
            )
        };
        // Rendered with the default; the layer (when present) re-renders custom rejections.
        Err(rejection.problem_response())
    }
}
