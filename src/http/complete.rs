//! The completion of a keyed request: the handler's response buffered, the store policy
//! applied, the record inserted with `COMMIT`, and what a repeat is answered with.

use std::sync::atomic::Ordering;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode};
use http_body_util::{BodyExt, Limited};
use tracing::Instrument;

use std::time::Instant;

use crate::engine::key::REPLAYED_HEADER;
use crate::engine::record::{CommitError, Completion, Deferred, Existing, encode_headers};
use crate::engine::telemetry::{self, RequestOutcome};
use crate::http::config::StoreDecision;
use crate::http::rejection::{Rejection, RejectionKind};
use crate::http::state::RequestState;
use crate::store::{ConnOf, LeaseStore};

impl<D: LeaseStore> RequestState<D> {
    /// The layer's work after the handler returned a response.
    pub(crate) async fn complete<B>(&self, response: Response<B>) -> Response
    where
        B: http_body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<axum::BoxError>,
    {
        let response = self.finish(response).await;
        self.release_redis_lock().await;
        response
    }

    pub(crate) async fn finish<B>(&self, response: Response<B>) -> Response
    where
        B: http_body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<axum::BoxError>,
    {
        if let Some(token) = self.lease_token() {
            return self.complete_lease(token, response).await;
        }
        if self.tx.live_handles() > 0 {
            // A handle outlived the handler. Roll back now if it is not in the middle of a
            // statement; otherwise the transaction rolls back when the handle lets go of it.
            if let Some(conn) = self.tx.try_take() {
                D::rollback(conn).await;
            }
            tracing::error!(record = %self.id, "handler leaked its transaction handle; rolling back");
            telemetry::request(RequestOutcome::RolledBack);
            return self.reject(Rejection::new(
                RejectionKind::TransactionLeaked,
                "the handler kept its transaction handle after returning; its work was rolled back",
            ));
        }
        if let Some(answer) = self.answered_as_duplicate().await {
            return answer;
        }
        // `None` if the handler never claimed (it does not take an extractor, or the
        // extractor answered for it).
        let Some(mut conn) = self.tx.take().await else {
            return response.map(Body::new);
        };

        let decision = (self.config.store_policy)(response.status());
        if self.key.is_none() {
            return self.finish_unkeyed(conn, decision, response).await;
        }
        let refused_before_work = decision == StoreDecision::StoreWithoutCommit
            && response.status().is_client_error()
            && !self.config.store_rejections_before_work
            && !self.work_began.load(Ordering::Acquire);
        if decision == StoreDecision::Discard || refused_before_work {
            tracing::debug!(record = %self.id, status = %response.status(), refused_before_work,
                "rolled back, not stored");
            D::rollback(conn).await;
            telemetry::request(RequestOutcome::RolledBack);
            return response.map(Body::new);
        }
        let (parts, body) = match self.buffer_response(response).await {
            Ok(buffered) => buffered,
            Err(rejection) => {
                D::rollback(conn).await;
                telemetry::request(RequestOutcome::RolledBack);
                return self.reject(rejection);
            }
        };
        let kept = self.kept_headers(&parts.headers);
        let sealed = match self.seal(&body) {
            Ok(sealed) => sealed,
            Err(rejection) => {
                D::rollback(conn).await;
                telemetry::request(RequestOutcome::RolledBack);
                return self.reject(rejection);
            }
        };
        let record = self.record(parts.status, encode_headers(kept.iter()), sealed);
        let started = Instant::now();
        let completion = Completion {
            discard_handler_writes: (decision == StoreDecision::StoreWithoutCommit)
                .then_some(self.config.handler_timeout),
            replaces: self.replaces.load(Ordering::Acquire),
        };
        let outcome = D::commit(&mut conn, &record, completion)
            .instrument(tracing::debug_span!("idempotency.commit", record = %self.id))
            .await;
        telemetry::commit_time("atomic", started);
        match outcome {
            Ok(()) => {
                drop(conn);
                tracing::debug!(record = %self.id, status = %parts.status, "committed");
                telemetry::request(RequestOutcome::Executed);
                self.remember(parts.status, &kept, &body, self.remaining_ttl())
                    .await;
                Response::from_parts(parts, Body::from(body))
            }
            Err(CommitError::Conflict) => {
                // The COMMIT after the failed insert was a ROLLBACK.
                drop(conn);
                tracing::warn!(record = %self.id, "unique-key backstop caught a concurrent request");
                telemetry::unique_conflict();
                let found = self
                    .config
                    .store
                    .lookup(self.id)
                    .await
                    .map(|row| row.map(Existing::from).filter(|existing| !existing.expired));
                match found {
                    Ok(Some(existing)) => self.answer_existing(existing).await,
                    Ok(None) => {
                        telemetry::request(RequestOutcome::InFlight);
                        self.reject(self.in_flight(self.config.retry_after))
                    }
                    Err(e) => {
                        tracing::warn!(record = %self.id, error = %crate::engine::error::Chain(&e),
                            "could not read the record that won the key");
                        self.unavailable(e)
                    }
                }
            }
            Err(CommitError::InFlight) => {
                drop(conn);
                tracing::debug!(record = %self.id, "in flight (the lock taken with the insert was held)");
                telemetry::request(RequestOutcome::InFlight);
                self.reject(self.in_flight(self.config.retry_after))
            }
            Err(CommitError::Failed(e)) => {
                tracing::error!(record = %self.id, error = %crate::engine::error::Chain(&e),
                    "commit failed or its outcome is unknown");
                drop(conn);
                telemetry::request(RequestOutcome::StoreError);
                self.reject(
                    Rejection::new(
                        RejectionKind::CommitFailed,
                        "the work could not be committed, or its commit was not confirmed; retry the request",
                    )
                    .with_retry_after(self.config.retry_after)
                    .with_source(e),
                )
            }
        }
    }

    /// A request without a key on a layer that does not require one: the handler's writes
    /// commit when the store policy would commit them, and nothing is recorded.
    async fn finish_unkeyed<B>(
        &self,
        mut conn: ConnOf<D>,
        decision: StoreDecision,
        response: Response<B>,
    ) -> Response
    where
        B: http_body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<axum::BoxError>,
    {
        if decision != StoreDecision::Commit {
            D::rollback(conn).await;
            return response.map(Body::new);
        }
        match D::commit_plain(&mut conn).await {
            Ok(()) => response.map(Body::new),
            Err(e) => {
                tracing::error!(error = %crate::engine::error::Chain(&e), "commit failed or its outcome is unknown");
                drop(conn);
                self.reject(
                    Rejection::new(
                        RejectionKind::CommitFailed,
                        "the work could not be committed, or its commit was not confirmed",
                    )
                    .with_retry_after(self.config.retry_after)
                    .with_source(e),
                )
            }
        }
    }

    /// The answer to a request whose handler's first statement found the key held by
    /// another request, or its record committed: its transaction rolls back, and it is
    /// answered as that request's duplicate, whatever the handler made of the refused
    /// statement.
    pub(crate) async fn answered_as_duplicate(&self) -> Option<Response> {
        let deferred = self.tx.read().await.as_ref().map(D::deferred)?;
        if deferred == Deferred::Granted {
            return None;
        }
        if let Some(conn) = self.tx.take().await {
            D::rollback(conn).await;
        }
        if deferred == Deferred::Failed {
            telemetry::request(RequestOutcome::StoreError);
            return Some(
                self.reject(
                    Rejection::new(
                        RejectionKind::StoreUnavailable,
                        "the idempotency store could not claim the key; retry the request",
                    )
                    .with_retry_after(self.config.retry_after),
                ),
            );
        }
        if deferred == Deferred::Found {
            let found = self.config.store.lookup(self.id).await;
            match found.map(|row| row.map(Existing::from).filter(|existing| !existing.expired)) {
                Ok(Some(existing)) => return Some(self.answer_existing(existing).await),
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(record = %self.id, error = %crate::engine::error::Chain(&e),
                        "could not read the record of an earlier request with this key");
                    return Some(self.unavailable(e));
                }
            }
        }
        tracing::debug!(record = %self.id, "in flight (the lock sent with the first statement was held)");
        telemetry::request(RequestOutcome::InFlight);
        Some(self.reject(self.in_flight(self.config.retry_after)))
    }

    /// The response headers that are stored and replayed.
    pub(crate) fn kept_headers(&self, headers: &HeaderMap) -> HeaderMap {
        let mut kept = HeaderMap::new();
        for (name, value) in headers {
            if self.config.keeps_header(name) {
                kept.append(name.clone(), value.clone());
            }
        }
        kept
    }

    /// Buffers the handler's response body up to the stored-response limit.
    pub(crate) async fn buffer_response<B>(
        &self,
        response: Response<B>,
    ) -> Result<(http::response::Parts, Bytes), Rejection>
    where
        B: http_body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<axum::BoxError>,
    {
        let (parts, body) = response.into_parts();
        match Limited::new(body, self.config.response_limit)
            .collect()
            .await
        {
            Ok(collected) => Ok((parts, collected.to_bytes())),
            Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(Rejection::new(
                RejectionKind::ResponseTooLarge,
                "the response is larger than the limit for stored responses; the work was rolled back",
            )),
            Err(_) => Err(Rejection::new(
                RejectionKind::ResponseBodyFailed,
                "the response body failed while being buffered; the work was rolled back",
            )),
        }
    }
}

/// Logs a missing schema at error level, with the database's own message, once per
/// process; later occurrences at debug level.
pub(crate) fn schema_missing_logged_once(error: &crate::engine::error::Error) {
    static LOGGED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let chain = crate::engine::error::Chain(error);
    if !LOGGED.swap(true, Ordering::Relaxed) {
        tracing::error!(error = %chain,
            "the idempotency schema is missing or outdated: run axum_idempotency::migrate");
    } else {
        tracing::debug!(error = %chain, "the idempotency schema is missing or outdated");
    }
}

/// A stored response as sent again, marked as a replay.
pub(crate) fn replay(status: StatusCode, headers: HeaderMap, body: Bytes) -> Response {
    telemetry::request(RequestOutcome::Replayed);
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    response
        .headers_mut()
        .insert(REPLAYED_HEADER, HeaderValue::from_static("true"));
    response
}
