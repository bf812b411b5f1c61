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
//!    `lease_lost`), never overwriting the newer result;
//! 5. a holder that cannot tell whether its side effect happened answers with
//!    [`OutcomeUnknown`] in its response's extensions: the record is left as the claim
//!    wrote it, and the key stays held until the lease runs out, as for a crashed holder.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use http::StatusCode;
use http_body_util::BodyExt;
use tracing::Instrument;

use crate::engine::crypto::StoredBody;
use crate::engine::key::{BODY_OMITTED_HEADER, RecordId, derive_key};
use crate::engine::record::{ExistingKind, LeaseClaim, LeaseEnd, encode_headers};
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

/// A lease-mode response extension: this holder cannot tell whether its side effect took
/// place (its call to another service timed out, or the connection closed after the request
/// was sent). The layer then stores nothing and leaves the key held until its lease runs
/// out: a repeat meanwhile gets 409 `in_flight` with `Retry-After` (the seconds left), and
/// the first repeat after it takes the key over with a higher fencing token and runs again.
/// So a downstream that must never act twice checks the fencing token or the derived key.
///
/// Without it, a 5xx frees the key at once (the store policy's retryable failure), which is
/// right when the call surely did not happen (the connection was refused).
///
/// ```no_run
/// use axum::http::StatusCode;
/// use axum::response::{IntoResponse, Response};
/// use axum_idempotency::{IdempotentLease, OutcomeUnknown};
///
/// async fn charge(lease: IdempotentLease) -> Response {
///     match call_gateway(&lease.derive_key("charge"), lease.fencing_token()).await {
///         Ok(()) => StatusCode::CREATED.into_response(),
///         // Sent, and no answer: the charge may have happened.
///         Err(Sent) => (StatusCode::GATEWAY_TIMEOUT, OutcomeUnknown, "no answer").into_response(),
///     }
/// }
/// # struct Sent;
/// # async fn call_gateway(_: &str, _: i64) -> Result<(), Sent> { Ok(()) }
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OutcomeUnknown;

impl axum::response::IntoResponseParts for OutcomeUnknown {
    type Error = std::convert::Infallible;

    fn into_response_parts(
        self,
        mut parts: axum::response::ResponseParts,
    ) -> Result<axum::response::ResponseParts, Self::Error> {
        parts.extensions_mut().insert(self);
        Ok(parts)
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
        // With `wait_for_in_flight`, a twin waits (polling the record) for the holder to
        // finish or its lease to run out, then claims again: a replay, or a takeover.
        let wait_until = self
            .config
            .wait_for_in_flight
            .map(|wait| Instant::now() + wait);
        let mut claim = self.acquire_lease().await?;
        while let Some(until) = wait_until {
            let held = match &claim {
                LeaseClaim::Existing(existing) => {
                    matches!(existing.kind, ExistingKind::Leased { .. })
                        && existing.fingerprint == self.fingerprint
                }
                LeaseClaim::Raced => true,
                LeaseClaim::Acquired { .. } => false,
            };
            if !held {
                break;
            }
            let finished = self.wait_for_holder(until).await;
            // Claimed again either way: a replay or a takeover, or the seconds left now.
            claim = self.acquire_lease().await?;
            if !finished {
                break;
            }
        }
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

    /// One lease claim: PROCESSING committed with a fresh token, or the record found.
    async fn acquire_lease(&self) -> Result<LeaseClaim, Response> {
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
        Ok(claim)
    }

    /// Polls the record until its holder is done or its lease ran out (`true`: claim
    /// again), or until `until` (`false`).
    async fn wait_for_holder(&self, until: Instant) -> bool {
        let mut pause = Duration::from_millis(10);
        loop {
            let now = Instant::now();
            if now >= until {
                return false;
            }
            tokio::time::sleep(pause.min(until - now)).await;
            pause = (pause * 2).min(Duration::from_millis(200));
            match self.config.store.lookup(self.id).await {
                Ok(Some(row)) if row.state == "PROCESSING" && row.lease_left.unwrap_or(0) > 0 => {}
                Ok(_) => return true,
                // The claim that follows reports the store's state.
                Err(_) => return true,
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
        if response.extensions().get::<OutcomeUnknown>().is_some() {
            // Nothing is written: the record stays PROCESSING until its lease runs out.
            tracing::warn!(record = %self.id, token, status = %response.status(),
                "the holder's outcome is unknown; the key stays held until its lease runs out");
            telemetry::request(RequestOutcome::OutcomeUnknown);
            return response.map(Body::new);
        }
        let end = match (self.config.store_policy)(response.status()) {
            StoreDecision::Commit => LeaseEnd::Success,
            StoreDecision::StoreWithoutCommit => LeaseEnd::FinalFailure,
            StoreDecision::Discard => LeaseEnd::RetryableFailure,
        };
        // The whole body, whatever its size: the side effect happened once, so an answer too
        // large to store is still answered, and kept without its body.
        let (parts, body) = response.into_parts();
        let body = match body.map_err(Into::<axum::BoxError>::into).collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(_) => {
                self.end_lease_quietly(token).await;
                telemetry::request(RequestOutcome::RolledBack);
                return self.reject(Rejection::new(
                    RejectionKind::ResponseBodyFailed,
                    "the response body failed while being buffered; the key is free for a retry",
                ));
            }
        };
        let mut kept = self.kept_headers(&parts.headers);
        let omitted = body.len() > self.config.response_limit;
        if omitted {
            tracing::warn!(record = %self.id, bytes = body.len(), limit = self.config.response_limit,
                "the response is larger than the limit for stored responses; kept without its body");
            kept.insert(
                http::HeaderName::from_static(BODY_OMITTED_HEADER),
                http::HeaderValue::from_static("true"),
            );
        }
        let stored: &[u8] = if omitted { &[] } else { &body };
        let sealed = match self.seal(stored) {
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
                        let stored = Bytes::copy_from_slice(stored);
                        self.remember(parts.status, &kept, &stored, self.remaining_ttl())
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
