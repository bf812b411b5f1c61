//! The [`Idempotency`] service.

use std::any::Any;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use futures_util::FutureExt;
use http::Request;
use tower_service::Service;
use tracing::Instrument;

use super::body::buffer_body;
use super::{IdempotencyLayer, ResponseFuture};
use crate::engine::key::{IDEMPOTENCY_KEY, IdempotencyKey, KeyError};
use crate::engine::telemetry::{self, RequestOutcome};
use crate::http::config::Config;
use crate::http::extract::{KeyInvalid, KeyMissing, KeyedRequest, LeaseClaimant, MethodNotCovered};
use crate::http::rejection::{Rejection, RejectionKind, finalize};
use crate::http::state::RequestState;
use crate::store::{IntoStore, LeaseStore, Store};

/// The middleware built by [`IdempotencyLayer`], over the driver `D`.
pub struct Idempotency<S, D: Store> {
    inner: S,
    config: Arc<Config<D>>,
}

impl<S: Clone, D: Store> Clone for Idempotency<S, D> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            config: Arc::clone(&self.config),
        }
    }
}

impl<S: std::fmt::Debug, D: Store + std::fmt::Debug> std::fmt::Debug for Idempotency<S, D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Idempotency")
            .field("inner", &self.inner)
            .field("config", &self.config)
            .finish()
    }
}

impl<D: LeaseStore> Idempotency<(), D> {
    /// Shortcut for [`IdempotencyLayer::new`].
    ///
    /// ```no_run
    /// # fn f(pool: deadpool_postgres::Pool) {
    /// use axum_idempotency::Idempotency;
    ///
    /// let layer = Idempotency::layer(pool);
    /// # }
    /// ```
    pub fn layer<P: IntoStore<Store = D>>(pool: P) -> IdempotencyLayer<D> {
        IdempotencyLayer::new(pool)
    }
}

impl<S, D: LeaseStore> Idempotency<S, D> {
    pub(crate) fn new(inner: S, config: Arc<Config<D>>) -> Self {
        Self { inner, config }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Consumes the middleware, returning the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, D, B, ResBody> Service<Request<B>> for Idempotency<S, D>
where
    D: LeaseStore,
    S: Service<Request<Body>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<axum::BoxError>,
{
    type Response = Response;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        let config = &self.config;
        let key = if !config.covers(req.method()) {
            req.extensions_mut().insert(MethodNotCovered);
            None
        } else {
            let mut values = req.headers().get_all(IDEMPOTENCY_KEY).iter();
            match (values.next(), values.next()) {
                (None, _) if !config.key_required => {
                    // No key, and none needed: the handler runs in a plain transaction.
                    req.extensions_mut().insert(KeyMissing);
                    let clone = self.inner.clone();
                    let inner = std::mem::replace(&mut self.inner, clone);
                    return ResponseFuture::idempotent(Box::pin(run_unkeyed(
                        inner,
                        Arc::clone(config),
                        req,
                    )));
                }
                (None, _) => {
                    req.extensions_mut().insert(KeyMissing);
                    None
                }
                (Some(_), Some(_)) => {
                    req.extensions_mut().insert(KeyInvalid(KeyError::Repeated));
                    None
                }
                (Some(value), None) => match IdempotencyKey::from_header(value) {
                    Ok(key) => Some(key),
                    Err(e) => {
                        req.extensions_mut().insert(KeyInvalid(e));
                        None
                    }
                },
            }
        };
        let Some(key) = key else {
            return ResponseFuture::passthrough(
                self.inner.call(req.map(Body::new)),
                config.on_rejection.clone(),
            );
        };
        // The instance that was driven to readiness goes into the future.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        ResponseFuture::idempotent(Box::pin(run(inner, Arc::clone(config), key, req)))
    }
}

/// A keyed request on a covered method, from body buffering to the final answer.
async fn run<S, D, B, ResBody>(
    mut inner: S,
    config: Arc<Config<D>>,
    key: IdempotencyKey,
    req: Request<B>,
) -> Result<Response, S::Error>
where
    D: LeaseStore,
    S: Service<Request<Body>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<axum::BoxError>,
{
    let (mut parts, body) = req.into_parts();
    let body = match buffer_body(&config, &parts.headers, body).await {
        Ok(body) => body,
        Err(rejection) => {
            telemetry::request(RequestOutcome::BodyRejected);
            return Ok(finalize(
                rejection.problem_response(),
                config.on_rejection.as_ref(),
            ));
        }
    };
    let scope = config
        .scope
        .as_ref()
        .and_then(|scope| scope(&parts))
        .unwrap_or_default();
    let fingerprint = config.fingerprint.compute(&parts, &body);
    let state = Arc::new(RequestState::new(
        Arc::clone(&config),
        scope,
        Some(key),
        fingerprint,
    ));
    // A replay from the in-process cache: no handler, no task.
    if let Some(answer) = state.cached_replay() {
        return Ok(finalize(answer, config.on_rejection.as_ref()));
    }
    parts.extensions.insert(KeyedRequest(Arc::clone(&state)));
    parts
        .extensions
        .insert(LeaseClaimant(Arc::clone(&state) as _));
    let handler = inner.call(Request::from_parts(parts, Body::from(body)));
    finish_request(config, handler, state).await
}

/// A request without a key on a layer that does not require one: its handler's
/// transaction is a plain one, and nothing is recorded. The body is not buffered.
async fn run_unkeyed<S, D, B, ResBody>(
    mut inner: S,
    config: Arc<Config<D>>,
    req: Request<B>,
) -> Result<Response, S::Error>
where
    D: LeaseStore,
    S: Service<Request<Body>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<axum::BoxError>,
{
    let (mut parts, body) = req.into_parts();
    let state = Arc::new(RequestState::new(
        Arc::clone(&config),
        String::new(),
        None,
        crate::engine::fingerprint::Fingerprint([0; 32]),
    ));
    parts.extensions.insert(KeyedRequest(Arc::clone(&state)));
    let handler = inner.call(Request::from_parts(parts, Body::new(body)));
    finish_request(config, handler, state).await
}

/// Runs the handler (detached, unless configured otherwise) and completes its request.
async fn finish_request<F, D, ResBody, E>(
    config: Arc<Config<D>>,
    handler: F,
    state: Arc<RequestState<D>>,
) -> Result<Response, E>
where
    D: LeaseStore,
    F: std::future::Future<Output = Result<Response<ResBody>, E>> + Send + 'static,
    E: Send + 'static,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<axum::BoxError>,
{
    let outcome = if config.finish_on_disconnect {
        // Detached: dropping this future (client gone) does not cancel the work.
        match config.tasks.spawn(execute(handler, state)).await {
            Ok(outcome) => outcome,
            Err(e) if e.is_panic() => Outcome::Panicked(e.into_panic()),
            Err(_) => Outcome::Done(Ok(Rejection::new(
                RejectionKind::StoreUnavailable,
                "the server is shutting down; retry the request",
            )
            .with_retry_after(config.retry_after)
            .problem_response())),
        }
    } else {
        execute(handler, state).await
    };
    match outcome {
        Outcome::Done(result) => {
            result.map(|response| finalize(response, config.on_rejection.as_ref()))
        }
        // No transaction was involved: behave as if the layer were not there.
        Outcome::Panicked(payload) => std::panic::resume_unwind(payload),
    }
}

enum Outcome<E> {
    Done(Result<Response, E>),
    Panicked(Box<dyn Any + Send>),
}

/// Runs the handler under the deadline, catching panics, then completes the transaction.
async fn execute<D, F, ResBody, E>(handler: F, state: Arc<RequestState<D>>) -> Outcome<E>
where
    D: LeaseStore,
    F: std::future::Future<Output = Result<Response<ResBody>, E>>,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<axum::BoxError>,
{
    let deadline = state.config.handler_timeout;
    let span = tracing::debug_span!("idempotency.handler", record = %state.id);
    let work = async {
        match AssertUnwindSafe(handler.instrument(span))
            .catch_unwind()
            .await
        {
            Ok(Ok(response)) => Ok(Ok(state.complete(response).await)),
            Ok(Err(e)) => Ok(Err(e)),
            Err(panic) => Err(panic),
        }
    };
    // A driver that cannot see a silent link itself watches it while the handler runs. A
    // lease holder's work is outside the database and is never abandoned for the link: its
    // own statements are bounded by the driver, and its lease expires if they fail.
    let link_lost = async {
        let _unreachable = state.config.store.link_lost().await;
        if state.lease_token().is_some() {
            std::future::pending::<()>().await;
        }
    };
    let watched = async {
        tokio::select! {
            biased;
            done = work => Some(done),
            () = link_lost => None,
        }
    };
    match tokio::time::timeout(deadline, watched).await {
        Ok(None) => {
            // The handler's statements were waiting on a link that is gone: its
            // connection is closed, the server rolls the transaction back.
            state.abandon().await;
            tracing::warn!(record = %state.id, "database unreachable; rolled back");
            Outcome::Done(Ok(state.reject(
                Rejection::new(
                    RejectionKind::StoreUnavailable,
                    "the database could not be reached; the work was rolled back, retry the request",
                )
                .with_retry_after(state.config.retry_after),
            )))
        }
        Ok(Some(Ok(Ok(response)))) => Outcome::Done(Ok(response)),
        Ok(Some(Ok(Err(e)))) => {
            state.abandon().await;
            Outcome::Done(Err(e))
        }
        Ok(Some(Err(panic))) => {
            if let Some(answer) = state.answered_as_duplicate().await {
                // The handler panicked on the refused statement of an in-flight duplicate.
                state.release_redis_lock().await;
                return Outcome::Done(Ok(answer));
            }
            if state.abandon().await {
                tracing::error!(record = %state.id, "handler panicked; rolled back");
                Outcome::Done(Ok(state.reject(Rejection::new(
                    RejectionKind::HandlerPanicked,
                    "the handler failed; its work was rolled back and the request may be retried",
                ))))
            } else {
                Outcome::Panicked(panic)
            }
        }
        Err(_elapsed) => {
            // Whatever was still open rolls back; a COMMIT already sent may still land,
            // in which case the retry replays it.
            state.abandon().await;
            tracing::warn!(record = %state.id, ?deadline, "deadline passed; rolled back");
            Outcome::Done(Ok(state.reject(
                Rejection::new(
                    RejectionKind::HandlerTimedOut,
                    "the request took too long and was rolled back; retry it",
                )
                .with_retry_after(state.config.retry_after),
            )))
        }
    }
}
