//! What the layer leaves in the request extensions, and the extractors that read it: each
//! driver's transaction handle and the driver-neutral [`IdempotentLease`].

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::response::Response;
use http::request::Parts;
use tracing::Instrument;

use crate::engine::key::KeyError;
use crate::engine::telemetry::{self, RequestOutcome};
use crate::http::lease::IdempotentLease;
use crate::http::rejection::{Rejection, RejectionKind};
use crate::http::state::RequestState;
use crate::store::{IdempotentTx, LeaseStore, Store};

/// Request extension: a keyed request on a covered method, for the extractors of the
/// layer's driver.
pub(crate) struct KeyedRequest<D: Store>(pub(crate) Arc<RequestState<D>>);

impl<D: Store> Clone for KeyedRequest<D> {
    fn clone(&self) -> Self {
        Self(Arc::clone(&self.0))
    }
}

/// Request extension: the same request for the driver-neutral lease extractor, and the
/// layer's driver for the diagnostics of an extractor of another driver.
#[derive(Clone)]
pub(crate) struct LeaseClaimant(pub(crate) Arc<dyn Claimant>);

/// What a driver-neutral extractor can do with a keyed request.
pub(crate) trait Claimant: Send + Sync + 'static {
    /// The layer's driver.
    fn driver(&self) -> &'static str;
    /// Claims the key in lease mode.
    fn claim_lease(
        self: Arc<Self>,
    ) -> futures_util::future::BoxFuture<'static, Result<IdempotentLease, Response>>;
}

impl<D: LeaseStore> Claimant for RequestState<D> {
    fn driver(&self) -> &'static str {
        D::DRIVER
    }

    fn claim_lease(
        self: Arc<Self>,
    ) -> futures_util::future::BoxFuture<'static, Result<IdempotentLease, Response>> {
        Box::pin(async move {
            let claimed = self
                .claim_lease_inner()
                .instrument(tracing::debug_span!("idempotency.claim", record = %self.id))
                .await;
            if claimed.is_err() {
                self.release_redis_lock().await;
            }
            claimed
        })
    }
}

/// Request extension: a covered method without a key.
#[derive(Clone, Copy)]
pub(crate) struct KeyMissing;

/// Request extension: a covered method with a malformed key.
#[derive(Clone)]
pub(crate) struct KeyInvalid(pub(crate) KeyError);

/// Request extension: a method the layer does not cover.
#[derive(Clone, Copy)]
pub(crate) struct MethodNotCovered;

/// The request's state for an extractor, or the rejection that says why there is none.
pub(crate) fn request_state<D: Store>(
    parts: &Parts,
    extractor: &str,
) -> Result<Arc<RequestState<D>>, Rejection> {
    if let Some(KeyedRequest(state)) = parts.extensions.get::<KeyedRequest<D>>() {
        return Ok(Arc::clone(state));
    }
    keyed_rejection(parts, extractor, Some(D::DRIVER))
}

/// Why an extractor finds no keyed request: no key, a bad key, a method the layer does not
/// cover, no layer — or (with `driver`) a layer of another driver.
pub(crate) fn keyed_rejection<T>(
    parts: &Parts,
    extractor: &str,
    driver: Option<&str>,
) -> Result<T, Rejection> {
    let rejection = if let (Some(LeaseClaimant(other)), Some(driver)) =
        (parts.extensions.get::<LeaseClaimant>(), driver)
    {
        Rejection::new(
            RejectionKind::LayerMissing,
            format!(
                "{extractor} is the {driver} extractor, but this route's IdempotencyLayer was \
                 built on {}; take that driver's extractor, or build the layer on a {driver} pool",
                other.driver()
            ),
        )
    } else if let Some(KeyInvalid(error)) = parts.extensions.get::<KeyInvalid>() {
        telemetry::request(RequestOutcome::InvalidKey);
        Rejection::new(RejectionKind::InvalidKey, error.to_string())
    } else if parts.extensions.get::<KeyMissing>().is_some() {
        telemetry::request(RequestOutcome::MissingKey);
        Rejection::new(
            RejectionKind::MissingKey,
            "this endpoint requires an Idempotency-Key header",
        )
    } else if parts.extensions.get::<MethodNotCovered>().is_some() {
        Rejection::new(
            RejectionKind::MethodNotCovered,
            format!(
                "{extractor} is used on a {} route, but IdempotencyLayer does not cover {}; \
                 add it with `IdempotencyLayer::methods`",
                parts.method, parts.method
            ),
        )
    } else {
        Rejection::new(
            RejectionKind::LayerMissing,
            format!(
                "{extractor} needs IdempotencyLayer on this route. Is `IdempotencyLayer` enabled?"
            ),
        )
    };
    Err(rejection)
}

/// What a driver's transaction extractor does: find the request's state, claim the key,
/// and free the Redis pre-filter's lock when the claim answers without running the handler.
pub(crate) async fn extract_tx<D: LeaseStore>(
    parts: &Parts,
    extractor: &str,
) -> Result<IdempotentTx<D>, Response> {
    // Rendered with the default; the layer (when present) re-renders custom rejections.
    let state = request_state::<D>(parts, extractor).map_err(|r| r.problem_response())?;
    let claimed = state
        .claim()
        .instrument(tracing::debug_span!("idempotency.claim", record = %state.id))
        .await;
    if claimed.is_err() {
        // Answered without running the handler: the key is free for the next retry.
        state.release_redis_lock().await;
    }
    claimed.map(|handle| IdempotentTx::watched(handle, Arc::clone(&state.work_began)))
}

impl<S: Send + Sync> FromRequestParts<S> for IdempotentLease {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        match parts.extensions.get::<LeaseClaimant>() {
            Some(LeaseClaimant(state)) => Arc::clone(state).claim_lease().await,
            None => keyed_rejection(parts, "IdempotentLease", None)
                .map_err(|r: Rejection| r.problem_response()),
        }
    }
}

impl<S: Send + Sync, D: LeaseStore> FromRequestParts<S> for IdempotentTx<D> {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        extract_tx::<D>(parts, "IdempotentTx").await
    }
}
