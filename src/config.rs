//! The layer's configuration, shared by every request through one `Arc`.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Pool;
use http::request::Parts;
use http::{HeaderName, Method, StatusCode, header};
use tokio_util::task::TaskTracker;

use crate::cache::ResponseCache;
use crate::crypto::BodyKeys;
use crate::fingerprint::Fingerprinter;
#[cfg(feature = "redis")]
use crate::front::redis::{RedisFront, RedisOptions};
use crate::rejection::RejectionHandler;

/// What happens to a handler's transaction and response, decided by its status code.
///
/// The default, [`StoreDecision::for_status`], follows the usual retry semantics: a
/// response that a retry should see again is stored; one that a retry might change is not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreDecision {
    /// Commit the handler's writes and store the response (default for 2xx and 3xx).
    Commit,
    /// Roll the handler's writes back but store the response, so retries get the same
    /// answer (default for deterministic 4xx such as 400, 404, 422).
    StoreWithoutCommit,
    /// Roll back and store nothing: the retry runs the handler again (default for 5xx and
    /// for 408, 409, 425 and 429, which say "try again").
    Discard,
}

impl StoreDecision {
    /// The default store policy.
    ///
    /// ```
    /// use axum_idempotency::StoreDecision;
    /// use http::StatusCode;
    ///
    /// assert_eq!(StoreDecision::for_status(StatusCode::CREATED), StoreDecision::Commit);
    /// assert_eq!(StoreDecision::for_status(StatusCode::SEE_OTHER), StoreDecision::Commit);
    /// assert_eq!(StoreDecision::for_status(StatusCode::NOT_FOUND), StoreDecision::StoreWithoutCommit);
    /// assert_eq!(StoreDecision::for_status(StatusCode::TOO_MANY_REQUESTS), StoreDecision::Discard);
    /// assert_eq!(StoreDecision::for_status(StatusCode::BAD_GATEWAY), StoreDecision::Discard);
    /// ```
    pub fn for_status(status: StatusCode) -> Self {
        match status.as_u16() {
            200..=399 => Self::Commit,
            408 | 409 | 425 | 429 => Self::Discard,
            400..=499 => Self::StoreWithoutCommit,
            _ => Self::Discard,
        }
    }
}

pub(crate) type ScopeFn = Arc<dyn Fn(&Parts) -> Option<String> + Send + Sync>;

#[derive(Clone)]
pub(crate) struct Config {
    pub(crate) pool: Pool,
    pub(crate) methods: Vec<Method>,
    pub(crate) scope: Option<ScopeFn>,
    pub(crate) fingerprint: Fingerprinter,
    pub(crate) body_limit: usize,
    pub(crate) body_timeout: Duration,
    pub(crate) response_limit: usize,
    pub(crate) ttl: Duration,
    pub(crate) kept_headers: Vec<HeaderName>,
    pub(crate) store_policy: fn(StatusCode) -> StoreDecision,
    pub(crate) wait_for_in_flight: Option<Duration>,
    pub(crate) retry_after: u32,
    pub(crate) on_rejection: Option<RejectionHandler>,
    pub(crate) finish_on_disconnect: bool,
    pub(crate) handler_timeout: Duration,
    pub(crate) store_raw_key: bool,
    pub(crate) lease: Duration,
    pub(crate) prepared_statements: bool,
    pub(crate) cache: Option<Arc<ResponseCache>>,
    /// Encryption at rest of stored bodies (always `None` without feature `encryption`).
    pub(crate) body_keys: Option<BodyKeys>,
    #[cfg(feature = "redis")]
    pub(crate) redis: Option<Arc<RedisFront>>,
    #[cfg(feature = "redis")]
    pub(crate) redis_options: RedisOptions,
    pub(crate) tasks: TaskTracker,
}

impl Config {
    pub(crate) fn new(pool: Pool) -> Self {
        Self {
            pool,
            methods: vec![Method::POST, Method::PATCH],
            scope: None,
            fingerprint: Fingerprinter::default(),
            body_limit: 1024 * 1024,
            body_timeout: Duration::from_secs(30),
            response_limit: 1024 * 1024,
            ttl: Duration::from_secs(24 * 60 * 60),
            kept_headers: vec![header::CONTENT_TYPE, header::LOCATION],
            store_policy: StoreDecision::for_status,
            wait_for_in_flight: None,
            retry_after: 1,
            on_rejection: None,
            finish_on_disconnect: true,
            handler_timeout: Duration::from_secs(60),
            store_raw_key: false,
            lease: Duration::from_secs(30),
            prepared_statements: true,
            cache: None,
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

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut f = f.debug_struct("Config");
        f.field("methods", &self.methods)
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
            .field("prepared_statements", &self.prepared_statements)
            .field("cache", &self.cache)
            .field("body_keys", &self.body_keys);
        #[cfg(feature = "redis")]
        f.field("redis", &self.redis);
        f.finish_non_exhaustive()
    }
}
