//! The answers found before PostgreSQL is asked: the in-process cache of completed
//! responses, the Redis front line (feature `redis`) and the hot-key limiter, and what a
//! completed request leaves there for its retries.

#[cfg(feature = "redis")]
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::response::Response;
use bytes::Bytes;
use http::{HeaderMap, StatusCode};

use crate::engine::fingerprint::Fingerprint;
use crate::engine::telemetry::{self, RequestOutcome};
use crate::http::complete::replay;
use crate::http::rejection::{Rejection, RejectionKind};
use crate::http::state::RequestState;
use crate::store::LeaseStore;

impl<D: LeaseStore> RequestState<D> {
    /// A replay straight from the in-process cache, if it is on and holds the key.
    pub(crate) fn answer_from_cache(&self) -> Option<Response> {
        let cached = self.config.cache.as_ref()?.get(self.id)?;
        Some(self.answer_completed(
            cached.fingerprint,
            cached.status,
            cached.headers.clone(),
            cached.body.clone(),
        ))
    }

    /// This very request's answer (the same fingerprint) from the in-process cache: a
    /// replay that needs neither the handler nor the store. Another request under the key
    /// is left to the extractor, which answers it as the route requires.
    pub(crate) fn cached_replay(&self) -> Option<Response> {
        let cached = self.config.cache.as_ref()?.get(self.id)?;
        (cached.fingerprint == self.fingerprint)
            .then(|| replay(cached.status, cached.headers.clone(), cached.body.clone()))
    }

    /// A completed response found before PostgreSQL was asked: replayed to the same
    /// request, 422 to another.
    pub(crate) fn answer_completed(
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

    /// The answer of the front lines between the in-process cache and PostgreSQL, if they
    /// have one: the Redis front line's (a completed response, or 409 while another request
    /// holds the key), then the hot-key limiter's (429 past the key's attempts for this
    /// second). With `lock`, a request that goes on to PostgreSQL holds the Redis in-flight
    /// lock for that long (plus a margin) or until it ends; an answer given here leaves the
    /// lock to the caller's release.
    #[cfg(feature = "redis")]
    pub(crate) async fn answer_before_store(&self, lock: Option<Duration>) -> Option<Response> {
        use crate::redis_front::{LOCK_MARGIN, Lookup};
        let Some(front) = self.config.redis.as_ref() else {
            return self.answer_from_limiter();
        };
        let shared_limit = self
            .config
            .attempt_limit
            .as_ref()
            .filter(|_| self.config.attempt_limit_shared)
            .map(|limiter| limiter.limit());
        // A key past this instance's limit is refused after the lookup anyway: look for a
        // replay without taking the in-flight lock, which would only be released again.
        let exhausted = shared_limit.is_none()
            && self
                .config
                .attempt_limit
                .as_ref()
                .is_some_and(|limiter| limiter.exhausted(self.id));
        let lock = lock.filter(|_| !exhausted).map(|lock| lock + LOCK_MARGIN);
        match front.lookup(self.id, lock, shared_limit).await {
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
            Lookup::Limited => Some(self.too_many_attempts(shared_limit.unwrap_or(1))),
            Lookup::Miss { locked } => {
                self.redis_lock.store(locked, Ordering::Release);
                // Counted in Redis already when the limit is shared.
                if shared_limit.is_some() {
                    None
                } else {
                    self.answer_from_limiter()
                }
            }
            // Fails open to this instance's own count.
            Lookup::Unavailable => self.answer_from_limiter(),
        }
    }

    #[cfg(not(feature = "redis"))]
    pub(crate) async fn answer_before_store(&self, _lock: Option<Duration>) -> Option<Response> {
        self.answer_from_limiter()
    }

    /// 429 if the in-process hot-key limiter refuses this attempt; counts it otherwise.
    fn answer_from_limiter(&self) -> Option<Response> {
        let limiter = self.config.attempt_limit.as_ref()?;
        if limiter.admit(self.id) {
            return None;
        }
        Some(self.too_many_attempts(limiter.limit()))
    }

    /// The hot-key limiter's refusal.
    fn too_many_attempts(&self, limit: u32) -> Response {
        tracing::debug!(record = %self.id, limit, "too many attempts of this key");
        telemetry::request(RequestOutcome::TooManyAttempts);
        self.reject(
            Rejection::new(
                RejectionKind::TooManyAttempts,
                format!(
                    "this Idempotency-Key was attempted more than {limit} times in one second; \
                     retry after Retry-After seconds"
                ),
            )
            .with_retry_after(1),
        )
    }

    /// Gives the Redis in-flight lock back, if this request holds it.
    pub(crate) async fn release_redis_lock(&self) {
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
    pub(crate) async fn remember(
        &self,
        status: StatusCode,
        headers: &HeaderMap,
        body: &Bytes,
        ttl: Duration,
    ) {
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
}
