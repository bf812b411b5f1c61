//! Per-request state: what the layer learned about a keyed request, the claim the extractor
//! makes, and the completion the layer runs after the handler.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode};
use http_body_util::{BodyExt, Limited};
use tracing::Instrument;

use std::time::{Duration, Instant};

use crate::engine::crypto::{self, StoredBody};
use crate::engine::fingerprint::Fingerprint;
use crate::engine::key::{IdempotencyKey, RecordId};
use crate::engine::record::{
    Claim, CommitError, Completion, Existing, ExistingKind, NewRecord, encode_headers,
};
use crate::engine::shared_tx::SharedTx;
use crate::engine::telemetry::{self, RequestOutcome};
use crate::http::config::{Config, StoreDecision};
use crate::http::rejection::{Rejection, RejectionKind};
use crate::store::{LeaseStore, Store};

/// The response header that marks a replayed response.
pub const REPLAYED_HEADER: &str = "idempotent-replayed";

/// What the layer knows about one keyed request.
pub(crate) struct RequestState<D: Store> {
    pub(crate) config: Arc<Config<D>>,
    pub(crate) id: RecordId,
    pub(crate) scope: String,
    pub(crate) key: IdempotencyKey,
    pub(crate) fingerprint: Fingerprint,
    /// Atomic mode: the shared transaction.
    pub(crate) tx: Arc<SharedTx<D::Conn>>,
    /// Atomic mode, set by the claim: a record for this id must be deleted before the insert.
    pub(crate) replaces: AtomicBool,
    /// Lease mode: the fencing token of the lease this request holds.
    pub(crate) lease: std::sync::Mutex<Option<i64>>,
    pub(crate) claimed: AtomicBool,
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
            replaces: AtomicBool::new(false),
            lease: std::sync::Mutex::new(None),
            claimed: AtomicBool::new(false),
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
            raw_key: self.config.store_raw_key.then(|| self.key.as_str()),
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

    /// A key can be claimed once per request, by one kind of extractor.
    pub(crate) fn first_claim(&self) -> Result<(), Rejection> {
        if self.claimed.swap(true, Ordering::AcqRel) {
            return Err(Rejection::new(
                RejectionKind::ConflictingExtractors,
                "this request's key was already claimed by another extractor of the handler: \
                 a handler takes IdempotentTx (atomic mode) or one IdempotentLease (lease \
                 mode), not both",
            ));
        }
        Ok(())
    }

    /// Atomic mode, the extractor's work: begin, lock, look up — and decide.
    pub(crate) async fn claim(self: &Arc<Self>) -> Result<D::Handle, Response> {
        let held = || {
            self.reject(Rejection::new(
                RejectionKind::TransactionLeaked,
                "this request's transaction is already held by another extractor; \
                 take one transaction extractor per handler",
            ))
        };
        let Some(mut slot) = self.tx.try_slot() else {
            return Err(held());
        };
        if slot.is_some() {
            // A second extractor in the same handler shares the transaction, where the
            // driver's handles can share it.
            drop(slot);
            return D::handle(&self.tx).ok_or_else(held);
        }
        self.first_claim().map_err(|r| self.reject(r))?;
        if let Some(answer) = self.answer_from_cache() {
            return Err(answer);
        }
        // No pre-filter when a duplicate is to wait for the first in PostgreSQL.
        let lock = self
            .config
            .wait_for_in_flight
            .is_none()
            .then_some(self.config.handler_timeout);
        // The Redis front line, then the hot-key limiter: the last answers before PostgreSQL.
        if let Some(answer) = self.answer_before_store(lock).await {
            return Err(answer);
        }
        let started = Instant::now();
        let config = &self.config;
        let (claim, conn) = config
            .store
            .claim(self.id, self.fingerprint, config.wait_for_in_flight)
            .await
            .map_err(|e| {
                tracing::warn!(record = %self.id, error = %crate::engine::error::Chain(&e), "claim failed");
                self.unavailable(e)
            })?;
        telemetry::claim_time("atomic", started);
        match claim {
            Claim::Run { replaces } => {
                tracing::debug!(record = %self.id, replaces, "claimed");
                self.replaces.store(replaces, Ordering::Release);
                *slot = Some(conn);
                drop(slot);
                D::handle(&self.tx).ok_or_else(held)
            }
            Claim::InFlight => {
                tracing::debug!(record = %self.id, "in flight");
                telemetry::request(RequestOutcome::InFlight);
                Err(self.reject(self.in_flight(self.config.retry_after)))
            }
            Claim::Existing {
                existing,
                holds_lock,
            } => {
                if holds_lock {
                    // Release the key's lock before answering, so the client's next
                    // retry cannot find it still held.
                    D::rollback(conn).await;
                } else {
                    // Nothing held: the ROLLBACK can finish in the background.
                    drop(conn);
                }
                Err(self.answer_existing(existing).await)
            }
        }
    }

    pub(crate) fn unavailable(&self, error: crate::engine::error::Error) -> Response {
        telemetry::request(RequestOutcome::StoreError);
        if error.is_schema_missing() {
            schema_missing_logged_once(&error);
            return self.reject(
                Rejection::new(
                    RejectionKind::SchemaMissing,
                    "the idempotency tables are missing or older than this version needs; \
                     run axum_idempotency::migrate against this database",
                )
                .with_source(error),
            );
        }
        self.reject(
            Rejection::new(
                RejectionKind::StoreUnavailable,
                "the idempotency store is unavailable; retry later",
            )
            .with_retry_after(self.config.retry_after)
            .with_source(error),
        )
    }

    pub(crate) fn in_flight(&self, retry_after: u32) -> Rejection {
        Rejection::new(
            RejectionKind::InFlight,
            "a request with this Idempotency-Key is still being processed",
        )
        .with_retry_after(retry_after.max(1))
    }

    /// A record this request may not replace: the stored response if the request is the
    /// same, 422 if not, 409 while a lease holder is at work.
    pub(crate) async fn answer_existing(&self, existing: Existing) -> Response {
        if existing.fingerprint != self.fingerprint {
            tracing::info!(record = %self.id, "key reused with a different request");
            telemetry::request(RequestOutcome::PayloadMismatch);
            return self.reject(Rejection::new(
                RejectionKind::KeyReused,
                "this Idempotency-Key was already used for a different request",
            ));
        }
        let stored = match existing.kind {
            ExistingKind::Completed(stored) => stored,
            ExistingKind::Leased { retry_after } => {
                telemetry::request(RequestOutcome::InFlight);
                return self.reject(self.in_flight(retry_after));
            }
            ExistingKind::Replaceable => {
                telemetry::request(RequestOutcome::InFlight);
                return self.reject(self.in_flight(1));
            }
        };
        let body = match crypto::open_body(
            self.config.body_keys.as_ref(),
            self.id,
            stored.body_key_id,
            stored.body,
        ) {
            Ok(body) => body,
            Err(e) => {
                // Never replay what cannot be decrypted; restoring the key makes it replay.
                tracing::error!(record = %self.id, error = %e,
                    "stored response could not be decrypted; not replayed");
                return self.unavailable(crate::engine::error::Error::Encryption(e));
            }
        };
        self.remember(stored.status, &stored.headers, &body, stored.expires_in)
            .await;
        replay(stored.status, stored.headers, body)
    }

    /// The lifetime left to a record stored now: its `expires_at` was computed from the
    /// transaction's start, so a cached copy must not outlive it.
    pub(crate) fn remaining_ttl(&self) -> Duration {
        self.config.ttl.saturating_sub(self.started.elapsed())
    }

    /// Gives up on whatever the handler left open: rolls the transaction back, or marks
    /// the lease failed so a retry may run again. `false` if nothing was claimed.
    pub(crate) async fn abandon(&self) -> bool {
        // PostgreSQL's own lock still guards the key until the rollback below.
        self.release_redis_lock().await;
        if let Some(token) = self.lease_token() {
            self.end_lease_quietly(token).await;
            telemetry::request(RequestOutcome::RolledBack);
            return true;
        }
        match self.tx.take().await {
            Some(conn) => {
                D::rollback(conn).await;
                telemetry::request(RequestOutcome::RolledBack);
                true
            }
            None => false,
        }
    }

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
        // `None` if the handler never claimed (it does not take an extractor, or the
        // extractor answered for it).
        let Some(mut conn) = self.tx.take().await else {
            return response.map(Body::new);
        };
        let decision = (self.config.store_policy)(response.status());
        if decision == StoreDecision::Discard {
            tracing::debug!(record = %self.id, status = %response.status(), "rolled back, not stored");
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
                    Err(e) => self.unavailable(e),
                }
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
fn schema_missing_logged_once(error: &crate::engine::error::Error) {
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
