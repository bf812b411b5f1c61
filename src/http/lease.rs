//! Lease mode: idempotency for handlers whose side effects leave the database.
//!
//! Atomic mode ([`IdempotentTx`](crate::IdempotentTx)) makes the record and the handler's
//! rows commit together — but a call to a payment gateway or an email cannot be rolled
//! back, and holding a transaction open across it is wrong. A handler that takes
//! [`IdempotentLease`] instead follows the PROCESSING → SUCCESS | FAILED state machine:
//!
//! 1. the claim commits a `PROCESSING` record at once, with a lease (`locked_until`,
//!    [`IdempotencyLayer::lease`](crate::IdempotencyLayer::lease)) and a fencing token;
//!    duplicates get 409 with `Retry-After` while the lease holds;
//! 2. the handler does its work, passing [`IdempotentLease::derive_key`] values to
//!    every outside call so that they are idempotent too;
//! 3. the layer finishes the record with an update fenced by the token: `SUCCESS` with
//!    the response, or `FAILED` — replayed for a deterministic 4xx, retryable for a 5xx,
//!    408/409/425/429, a panic or a timeout;
//! 4. a holder that crashed leaves a lease that runs out; the next retry takes the key over
//!    with a new token, and the old holder's late completion is refused (409
//!    `lease_lost`), never overwriting the newer result.

use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use http::StatusCode;
use tracing::Instrument;

use crate::engine::crypto::StoredBody;
use crate::engine::key::{RecordId, derive_key};
use crate::engine::record::{LeaseClaim, LeaseEnd, encode_headers};
use crate::engine::telemetry::{self, RequestOutcome};
use crate::http::config::StoreDecision;
use crate::http::rejection::{Rejection, RejectionKind};
use crate::http::state::RequestState;
use crate::store::LeaseStore;

/// The extractor that makes a route idempotent in lease mode.
///
/// ```no_run
/// use axum::{Json, http::StatusCode};
/// use axum_idempotency::IdempotentLease;
///
/// async fn charge(lease: IdempotentLease, Json(order): Json<serde_json::Value>) -> StatusCode {
///     // The same value on every retry of this operation, so the gateway charges once.
///     let charge_key = lease.derive_key("charge");
///     let sent = reqwest_like_post("https://gateway.example/charges", &charge_key, &order).await;
///     if sent { StatusCode::CREATED } else { StatusCode::BAD_GATEWAY } // 502: retry may run again
/// }
/// # async fn reqwest_like_post(_: &str, _: &str, _: &serde_json::Value) -> bool { true }
/// ```
pub struct IdempotentLease {
    id: RecordId,
    token: i64,
}

impl IdempotentLease {
    pub(crate) fn new(id: RecordId, token: i64) -> Self {
        Self { id, token }
    }

    /// The fencing token of this lease: drawn from a database sequence when the key is
    /// first leased, and higher at every takeover, so a later holder of a key always has a
    /// higher token than an earlier one — even if the key's record was purged in between.
    /// Pass it to downstream systems that can reject stale writers.
    pub fn fencing_token(&self) -> i64 {
        self.token
    }

    /// A stable key for one downstream effect of this operation: the same on every retry of
    /// the same (scope, Idempotency-Key), different for every `label`. Send it as the
    /// `Idempotency-Key` of a downstream HTTP call or as the id of a published message.
    pub fn derive_key(&self, label: &str) -> String {
        derive_key(self.id, label)
    }
}

impl fmt::Debug for IdempotentLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotentLease")
            .field("record", &self.id)
            .field("token", &self.token)
            .finish()
    }
}

/// Lease mode's steps of a keyed request: the claim that commits PROCESSING, and the fenced
/// completion.
impl<D: LeaseStore> RequestState<D> {
    /// Lease mode, the extractor's work: commit a PROCESSING record (or take over an
    /// abandoned one) with a fresh fencing token.
    pub(crate) async fn claim_lease_inner(self: &Arc<Self>) -> Result<IdempotentLease, Response> {
        self.first_claim().map_err(|r| self.reject(r))?;
        if let Some(answer) = self.answer_from_cache() {
            return Err(answer);
        }
        let lock = self.config.lease.min(self.config.handler_timeout);
        if let Some(answer) = self.answer_before_store(Some(lock)).await {
            return Err(answer);
        }
        let started = Instant::now();
        let claim = self
            .config
            .store
            .lease_acquire(
                &self.record(StatusCode::ACCEPTED, Vec::new(), StoredBody::plain(&[])),
                self.config.lease,
            )
            .await
            .map_err(|e| {
                tracing::warn!(record = %self.id, error = %crate::engine::error::Chain(&e), "lease claim failed");
                self.unavailable(e)
            })?;
        telemetry::claim_time("lease", started);
        match claim {
            LeaseClaim::Acquired { token, took_over } => {
                tracing::debug!(record = %self.id, token, took_over, "lease acquired");
                if took_over {
                    telemetry::lease_takeover();
                }
                *self.lease.lock().unwrap_or_else(|e| e.into_inner()) = Some(token);
                Ok(IdempotentLease::new(self.id, token))
            }
            LeaseClaim::Existing(existing) => Err(self.answer_existing(existing).await),
            LeaseClaim::Raced => {
                telemetry::request(RequestOutcome::InFlight);
                Err(self.reject(self.in_flight(1)))
            }
        }
    }

    pub(crate) fn lease_token(&self) -> Option<i64> {
        *self.lease.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Best effort: a lease whose holder failed becomes a retryable failure.
    pub(crate) async fn end_lease_quietly(&self, token: i64) {
        let record = self.record(
            StatusCode::INTERNAL_SERVER_ERROR,
            Vec::new(),
            StoredBody::plain(&[]),
        );
        let ended = self
            .config
            .store
            .lease_complete(&record, token, LeaseEnd::RetryableFailure)
            .await;
        if let Err(error) = ended {
            tracing::warn!(record = %self.id, error = &error as &dyn std::error::Error,
                "could not mark the lease failed; it will expire");
        }
    }

    /// Lease mode: write the holder's result, fenced by its token.
    pub(crate) async fn complete_lease<B>(&self, token: i64, response: Response<B>) -> Response
    where
        B: http_body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<axum::BoxError>,
    {
        let end = match (self.config.store_policy)(response.status()) {
            StoreDecision::Commit => LeaseEnd::Success,
            StoreDecision::StoreWithoutCommit => LeaseEnd::FinalFailure,
            StoreDecision::Discard => LeaseEnd::RetryableFailure,
        };
        let (parts, body) = match self.buffer_response(response).await {
            Ok(buffered) => buffered,
            Err(rejection) => {
                self.end_lease_quietly(token).await;
                telemetry::request(RequestOutcome::RolledBack);
                return self.reject(rejection);
            }
        };
        let kept = self.kept_headers(&parts.headers);
        let sealed = match self.seal(&body) {
            Ok(sealed) => sealed,
            Err(rejection) => {
                self.end_lease_quietly(token).await;
                telemetry::request(RequestOutcome::RolledBack);
                return self.reject(rejection);
            }
        };
        let record = self.record(parts.status, encode_headers(kept.iter()), sealed);
        let started = Instant::now();
        let completed = self
            .config
            .store
            .lease_complete(&record, token, end)
            .instrument(tracing::debug_span!("idempotency.commit", record = %self.id))
            .await;
        telemetry::commit_time("lease", started);
        match completed {
            Ok(true) => {
                tracing::debug!(record = %self.id, token, ?end, "lease completed");
                match end {
                    LeaseEnd::RetryableFailure => telemetry::request(RequestOutcome::RolledBack),
                    _ => {
                        telemetry::request(RequestOutcome::Executed);
                        if token > 1 && end == LeaseEnd::Success {
                            telemetry::retry_success("lease");
                        }
                        self.remember(parts.status, &kept, &body, self.remaining_ttl())
                            .await;
                    }
                }
                Response::from_parts(parts, Body::from(body))
            }
            Ok(false) => {
                tracing::error!(record = %self.id, token,
                    "stale fencing token: the lease was taken over; result not stored");
                telemetry::request(RequestOutcome::LeaseLost);
                self.reject(
                    Rejection::new(
                        RejectionKind::LeaseLost,
                        "this request's lease expired and another request took the key over; \
                         retry to get the current result",
                    )
                    .with_retry_after(self.config.retry_after),
                )
            }
            Err(e) => {
                tracing::error!(record = %self.id, error = %crate::engine::error::Chain(&e), "could not store the lease result");
                telemetry::request(RequestOutcome::StoreError);
                self.reject(
                    Rejection::new(
                        RejectionKind::CommitFailed,
                        "the result could not be stored; the key is released when its lease expires",
                    )
                    .with_retry_after(self.config.retry_after)
                    .with_source(e),
                )
            }
        }
    }
}
