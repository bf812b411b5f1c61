//! The layer's configuration, shared by every request through one `Arc`.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::request::Parts;
use http::{HeaderName, Method, StatusCode, header};

pub(crate) use crate::engine::policy::StoreDecision;
use tokio_util::task::TaskTracker;

use crate::engine::cache::ResponseCache;
use crate::engine::crypto::BodyKeys;
use crate::engine::fingerprint::Fingerprinter;
use crate::engine::limit::AttemptLimiter;
use crate::http::rejection::RejectionHandler;
#[cfg(feature = "redis")]
use crate::redis_front::{RedisFront, RedisOptions};

/// How [`IdempotencyLayer`](crate::IdempotencyLayer) claims a key that has no record
/// ([`claim_mode`](crate::IdempotencyLayer::claim_mode)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ClaimMode {
    /// The key's lock is taken with the handler's first statement: a twin that arrives
    /// while the first is in flight is answered 409 `in_flight` at once and never runs
    /// the handler's statements. The default.
    #[default]
    Locked,
    /// No lock: the handler's statements run in every twin, and the record's primary key
    /// decides at the record's insert. Whichever twin reaches its insert first commits;
    /// the other's insert waits on the winner's uncommitted key, then fails, its work rolls
    /// back and it is answered from the winner's record (a replay, or 422 for another
    /// payload). If the winner rolls back instead, the waiting twin's work commits. The
    /// wait is bounded by [`wait_for_in_flight`](crate::IdempotencyLayer::wait_for_in_flight)
    /// when set, else by half the [`handler_timeout`](crate::IdempotencyLayer::handler_timeout)
    /// (30 s by default); past it the twin is answered 409 `in_flight`. PostgreSQL through tokio-postgres
    /// (deadpool, bb8); the other drivers keep the locked claim.
    Optimistic,
}

pub(crate) type ScopeFn = Arc<dyn Fn(&Parts) -> Option<String> + Send + Sync>;

#[derive(Clone)]
pub(crate) struct Config<D> {
    pub(crate) store: D,
    pub(crate) methods: Vec<Method>,
    /// A covered request without a key is refused (400) rather than run without a record.
    pub(crate) key_required: bool,
    pub(crate) scope: Option<ScopeFn>,
    pub(crate) fingerprint: Fingerprinter,
    pub(crate) body_limit: usize,
    pub(crate) body_timeout: Duration,
    pub(crate) response_limit: usize,
    pub(crate) ttl: Duration,
    pub(crate) kept_headers: Vec<HeaderName>,
    pub(crate) store_policy: fn(StatusCode) -> StoreDecision,
    /// Store a 4xx answered before the handler reached its transaction (an extractor's
    /// rejection, a validation failure). Default: not stored, the key stays free.
    pub(crate) store_rejections_before_work: bool,
    pub(crate) wait_for_in_flight: Option<Duration>,
    pub(crate) claim_mode: ClaimMode,
    pub(crate) retry_after: u32,
    pub(crate) on_rejection: Option<RejectionHandler>,
    pub(crate) finish_on_disconnect: bool,
    pub(crate) handler_timeout: Duration,
    pub(crate) store_raw_key: bool,
    pub(crate) lease: Duration,
    pub(crate) cache: Option<Arc<ResponseCache>>,
    /// The hot-key limiter: attempts per key and second that may reach the database.
    pub(crate) attempt_limit: Option<Arc<AttemptLimiter>>,
    /// The limiter counts in Redis, shared by every instance, while Redis answers.
    #[cfg(feature = "redis")]
    pub(crate) attempt_limit_shared: bool,
    /// Encryption at rest of stored bodies (always `None` without feature `encryption`).
    pub(crate) body_keys: Option<BodyKeys>,
    #[cfg(feature = "redis")]
    pub(crate) redis: Option<Arc<RedisFront>>,
    #[cfg(feature = "redis")]
    pub(crate) redis_options: RedisOptions,
    pub(crate) tasks: TaskTracker,
}

impl<D> Config<D> {
    pub(crate) fn new(store: D) -> Self {
        Self {
            store,
            key_required: true,
            methods: vec![Method::POST, Method::PATCH],
            scope: None,
            fingerprint: Fingerprinter::default(),
            body_limit: 1024 * 1024,
            body_timeout: Duration::from_secs(30),
            response_limit: 1024 * 1024,
            ttl: Duration::from_secs(24 * 60 * 60),
            kept_headers: vec![header::CONTENT_TYPE, header::LOCATION],
            store_policy: StoreDecision::for_status,
            store_rejections_before_work: false,
            wait_for_in_flight: None,
            claim_mode: ClaimMode::Locked,
            retry_after: 1,
            on_rejection: None,
            finish_on_disconnect: true,
            handler_timeout: Duration::from_secs(60),
            store_raw_key: false,
            lease: Duration::from_secs(30),
            cache: None,
            attempt_limit: None,
            #[cfg(feature = "redis")]
            attempt_limit_shared: false,
            body_keys: None,
            #[cfg(feature = "redis")]
            redis: None,
            #[cfg(feature = "redis")]
            redis_options: RedisOptions::default(),
            tasks: TaskTracker::new(),
        }
    }

    pub(crate) fn covers(&self, method: &Method) -> bool {
        self.methods.contains(method)
    }

    pub(crate) fn keeps_header(&self, name: &HeaderName) -> bool {
        *name != header::SET_COOKIE && self.kept_headers.contains(name)
    }
}

impl<D: fmt::Debug> fmt::Debug for Config<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut f = f.debug_struct("Config");
        f.field("store", &self.store)
            .field("methods", &self.methods)
            .field("scoped", &self.scope.is_some())
            .field("fingerprint", &self.fingerprint)
            .field("body_limit", &self.body_limit)
            .field("body_timeout", &self.body_timeout)
            .field("response_limit", &self.response_limit)
            .field("ttl", &self.ttl)
            .field("kept_headers", &self.kept_headers)
            .field("wait_for_in_flight", &self.wait_for_in_flight)
            .field("retry_after", &self.retry_after)
            .field("custom_rejections", &self.on_rejection.is_some())
            .field("finish_on_disconnect", &self.finish_on_disconnect)
            .field("handler_timeout", &self.handler_timeout)
            .field("store_raw_key", &self.store_raw_key)
            .field("lease", &self.lease)
            .field("cache", &self.cache)
            .field("attempt_limit", &self.attempt_limit)
            .field("body_keys", &self.body_keys);
        #[cfg(feature = "redis")]
        f.field("redis", &self.redis)
            .field("attempt_limit_shared", &self.attempt_limit_shared);
        f.finish_non_exhaustive()
    }
}
