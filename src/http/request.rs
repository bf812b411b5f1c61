//! Per-request state: what the layer learned about a keyed request, the claim the extractor
//! makes, and the completion the layer runs after the handler.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::body::Body;
use axum::extract::FromRequestParts;
use axum::response::Response;
use bytes::Bytes;
use http::request::Parts;
use http::{HeaderMap, HeaderValue, StatusCode};
use http_body_util::{BodyExt, Limited};
use tracing::Instrument;

use std::time::{Duration, Instant};

use crate::engine::crypto::{self, StoredBody};
use crate::engine::fingerprint::Fingerprint;
use crate::engine::key::{IdempotencyKey, KeyError, RecordId};
use crate::engine::record::{
    Claim, CommitError, Completion, Existing, ExistingKind, LeaseClaim, LeaseEnd, NewRecord,
    encode_headers,
};
use crate::engine::shared_tx::SharedTx;
use crate::engine::telemetry::{self, RequestOutcome};
use crate::http::config::{Config, StoreDecision};
use crate::http::lease::IdempotentLease;
use crate::http::rejection::{Rejection, RejectionKind};
use crate::store::Store;

/// The response header that marks a replayed response.
pub const REPLAYED_HEADER: &str = "idempotent-replayed";

/// Request extension: a keyed request on a covered method, for the extractors of the
/// layer's driver.
pub(crate) struct Idempotent<D: Store>(pub(crate) Arc<RequestState<D>>);

impl<D: Store> Clone for Idempotent<D> {
    fn clone(&self) -> Self {
        Self(Arc::clone(&self.0))
    }
}

/// Request extension: the same request for the driver-neutral lease extractor, and the
/// layer's driver for the diagnostics of an extractor of another driver.
#[derive(Clone)]
pub(crate) struct Keyed(pub(crate) Arc<dyn Claimant>);

/// What a driver-neutral extractor can do with a keyed request.
pub(crate) trait Claimant: Send + Sync + 'static {
    /// The layer's driver.
    fn driver(&self) -> &'static str;
    /// Claims the key in lease mode.
    fn claim_lease(
        self: Arc<Self>,
    ) -> futures_util::future::BoxFuture<'static, Result<IdempotentLease, Response>>;
}

impl<D: Store> Claimant for RequestState<D> {
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
    replaces: AtomicBool,
    /// Lease mode: the fencing token of the lease this request holds.
    lease: std::sync::Mutex<Option<i64>>,
    claimed: AtomicBool,
    /// When the layer took the request: the earliest its record's lifetime can start.
    started: Instant,
    /// This request holds the Redis front line's in-flight lock.
    #[cfg(feature = "redis")]
    redis_lock: AtomicBool,
}

impl<D: Store> RequestState<D> {
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

    fn record<'a>(
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
    fn seal<'a>(&self, body: &'a [u8]) -> Result<StoredBody<'a>, Rejection> {
        crypto::seal_body(self.config.body_keys.as_ref(), self.id, body).map_err(|e| {
            tracing::error!(record = %self.id, error = %e, "could not encrypt the response");
            Rejection::new(
                RejectionKind::CommitFailed,
                "the response could not be encrypted for storage; the work was rolled back",
            )
            .with_source(crate::Error::Encryption(e))
        })
    }

    /// A key can be claimed once per request, by one kind of extractor.
    fn first_claim(&self) -> Result<(), Rejection> {
        if self.claimed.swap(true, Ordering::AcqRel) {
            return Err(Rejection::new(
                RejectionKind::TransactionLeaked,
                "this request's key was already claimed by another extractor",
            ));
        }
        Ok(())
    }

    /// Atomic mode, the extractor's work: begin, lock, look up — and decide.
    async fn claim(self: &Arc<Self>) -> Result<D::Handle, Response> {
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
        if let Some(answer) = self.answer_from_redis(lock).await {
            return Err(answer);
        }
        let started = Instant::now();
        let config = &self.config;
        let (claim, conn) = config
            .store
            .claim(self.id, self.fingerprint, config.wait_for_in_flight)
            .await
            .map_err(|e| {
                tracing::warn!(record = %self.id, error = %e, "claim failed");
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

    /// Lease mode, the extractor's work: commit a PROCESSING record (or take over an
    /// abandoned one) with a fresh fencing token.
    async fn claim_lease_inner(self: &Arc<Self>) -> Result<IdempotentLease, Response> {
        self.first_claim().map_err(|r| self.reject(r))?;
        if let Some(answer) = self.answer_from_cache() {
            return Err(answer);
        }
        let lock = self.config.lease.min(self.config.handler_timeout);
        if let Some(answer) = self.answer_from_redis(Some(lock)).await {
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
                tracing::warn!(record = %self.id, error = %e, "lease claim failed");
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

    fn lease_token(&self) -> Option<i64> {
        *self.lease.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn unavailable(&self, source: impl std::error::Error + Send + Sync + 'static) -> Response {
        telemetry::request(RequestOutcome::StoreError);
        self.reject(
            Rejection::new(
                RejectionKind::StoreUnavailable,
                "the idempotency store is unavailable; retry later",
            )
            .with_retry_after(self.config.retry_after)
            .with_source(source),
        )
    }

    fn in_flight(&self, retry_after: u32) -> Rejection {
        Rejection::new(
            RejectionKind::InFlight,
            "a request with this Idempotency-Key is still being processed",
        )
        .with_retry_after(retry_after.max(1))
    }

    /// A record this request may not replace: the stored response if the request is the
    /// same, 422 if not, 409 while a lease holder is at work.
    async fn answer_existing(&self, existing: Existing) -> Response {
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
                return self.unavailable(crate::Error::Encryption(e));
            }
        };
        self.remember(stored.status, &stored.headers, &body, stored.expires_in)
            .await;
        replay(stored.status, stored.headers, body)
    }

    /// A replay straight from the in-process cache, if it is on and holds the key.
    fn answer_from_cache(&self) -> Option<Response> {
        let cached = self.config.cache.as_ref()?.get(self.id)?;
        Some(self.answer_completed(
            cached.fingerprint,
            cached.status,
            cached.headers.clone(),
            cached.body.clone(),
        ))
    }

    /// A completed response found before PostgreSQL was asked: replayed to the same
    /// request, 422 to another.
    fn answer_completed(
        &self,
        fingerprint: Fingerprint,
        status: StatusCode,
        headers: HeaderMap,
        body: Bytes,
    ) -> Response {
        if fingerprint != self.fingerprint {
            telemetry::request(RequestOutcome::PayloadMismatch);
            return self.reject(Rejection::new(
                RejectionKind::KeyReused,
                "this Idempotency-Key was already used for a different request",
            ));
        }
        replay(status, headers, body)
    }

    /// The Redis front line's answer, if it has one: a completed response, or 409 while
    /// another request holds the key. With `lock`, a request that goes on to PostgreSQL
    /// holds the in-flight lock for that long (plus a margin) or until it ends.
    #[cfg(feature = "redis")]
    async fn answer_from_redis(&self, lock: Option<Duration>) -> Option<Response> {
        use crate::engine::front::redis::{LOCK_MARGIN, Lookup};
        let front = self.config.redis.as_ref()?;
        match front
            .lookup(self.id, lock.map(|lock| lock + LOCK_MARGIN))
            .await
        {
            Lookup::Hit(found) => {
                if let (Some(cache), Some(ttl)) = (&self.config.cache, found.ttl) {
                    let (headers, body) = (found.headers.clone(), found.body.clone());
                    cache.insert(self.id, found.fingerprint, found.status, headers, body, ttl);
                }
                Some(self.answer_completed(
                    found.fingerprint,
                    found.status,
                    found.headers,
                    found.body,
                ))
            }
            Lookup::InFlight => {
                tracing::debug!(record = %self.id, "in flight (Redis)");
                telemetry::request(RequestOutcome::InFlight);
                Some(self.reject(self.in_flight(self.config.retry_after)))
            }
            Lookup::Miss { locked } => {
                self.redis_lock.store(locked, Ordering::Release);
                None
            }
            Lookup::Unavailable => None,
        }
    }

    #[cfg(not(feature = "redis"))]
    async fn answer_from_redis(&self, _lock: Option<Duration>) -> Option<Response> {
        None
    }

    /// Gives the Redis in-flight lock back, if this request holds it.
    async fn release_redis_lock(&self) {
        #[cfg(feature = "redis")]
        if self.redis_lock.swap(false, Ordering::AcqRel) {
            if let Some(front) = &self.config.redis {
                front.release(self.id).await;
            }
        }
    }

    /// Keeps a completed response where the next retry finds it before PostgreSQL: the
    /// in-process cache and the Redis front line, whichever are on. Giving the Redis lock
    /// back rides along with the write.
    async fn remember(&self, status: StatusCode, headers: &HeaderMap, body: &Bytes, ttl: Duration) {
        #[cfg(feature = "redis")]
        if let Some(front) = &self.config.redis {
            let release = self.redis_lock.swap(false, Ordering::AcqRel);
            front
                .store(
                    self.id,
                    self.fingerprint,
                    status,
                    headers,
                    body,
                    ttl,
                    release,
                )
                .await;
        }
        if let Some(cache) = &self.config.cache {
            // Copies only when the cache is on: a replay from the database clones nothing.
            cache.insert(
                self.id,
                self.fingerprint,
                status,
                headers.clone(),
                body.clone(),
                ttl,
            );
        }
    }

    /// The lifetime left to a record stored now: its `expires_at` was computed from the
    /// transaction's start, so a cached copy must not outlive it.
    fn remaining_ttl(&self) -> Duration {
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

    /// Best effort: a lease whose holder failed becomes a retryable failure.
    async fn end_lease_quietly(&self, token: i64) {
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

    async fn finish<B>(&self, response: Response<B>) -> Response
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
                tracing::error!(record = %self.id, error = %e, "commit failed or its outcome is unknown");
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

    /// Lease mode: write the holder's result, fenced by its token.
    async fn complete_lease<B>(&self, token: i64, response: Response<B>) -> Response
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
                tracing::error!(record = %self.id, error = %e, "could not store the lease result");
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

    /// The response headers that are stored and replayed.
    fn kept_headers(&self, headers: &HeaderMap) -> HeaderMap {
        let mut kept = HeaderMap::new();
        for (name, value) in headers {
            if self.config.keeps_header(name) {
                kept.append(name.clone(), value.clone());
            }
        }
        kept
    }

    /// Buffers the handler's response body up to the stored-response limit.
    async fn buffer_response<B>(
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

/// A stored response as sent again, marked as a replay.
fn replay(status: StatusCode, headers: HeaderMap, body: Bytes) -> Response {
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

/// The request's state for an extractor, or the rejection that says why there is none.
pub(crate) fn request_state<D: Store>(
    parts: &Parts,
    extractor: &str,
) -> Result<Arc<RequestState<D>>, Rejection> {
    if let Some(Idempotent(state)) = parts.extensions.get::<Idempotent<D>>() {
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
    let rejection = if let (Some(Keyed(other)), Some(driver)) =
        (parts.extensions.get::<Keyed>(), driver)
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
pub(crate) async fn extract_tx<D: Store>(
    parts: &Parts,
    extractor: &str,
) -> Result<D::Handle, Response> {
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
    claimed
}

impl<S: Send + Sync> FromRequestParts<S> for IdempotentLease {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        match parts.extensions.get::<Keyed>() {
            Some(Keyed(state)) => Arc::clone(state).claim_lease().await,
            None => keyed_rejection(parts, "IdempotentLease", None)
                .map_err(|r: Rejection| r.problem_response()),
        }
    }
}

impl<S: Send + Sync> FromRequestParts<S> for crate::postgres::IdempotentTx {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        extract_tx::<crate::postgres::PgStore>(parts, "IdempotentTx").await
    }
}

#[cfg(feature = "sqlx")]
impl<S: Send + Sync> FromRequestParts<S> for crate::sqlx::IdempotentTx {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        extract_tx::<crate::sqlx::SqlxStore>(parts, "axum_idempotency::sqlx::IdempotentTx").await
    }
}
