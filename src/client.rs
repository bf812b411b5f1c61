//! The caller's side of an idempotent API (feature `client`): a
//! [`reqwest-middleware`](reqwest_middleware) middleware that gives every logical request one
//! `Idempotency-Key` and retries it, with that same key, until it has an answer.
//!
//! An idempotent server is only half of a safe retry. The caller must
//!
//! - generate **one key per business intent** and keep it across its own retries: a new key
//!   for a retry is a new order;
//! - retry what may have been lost (a connection error, a timeout, `503`), and wait when the
//!   first try is still running (`409`, with `Retry-After`);
//! - never retry what cannot succeed: a `422` means the key was used before with a different
//!   request — a bug in the caller — and other `4xx` are the request's own fault.
//!
//! [`IdempotencyMiddleware`] does all three:
//!
//! - it attaches an `Idempotency-Key` (a UUID, v4 by default or v7) to `POST` and `PATCH`
//!   requests ([configurable](IdempotencyMiddleware::methods)) that have none, once per
//!   logical request: every retry, its own and those of a middleware around it, sends the
//!   same key. A key the caller set is never replaced;
//! - it retries connection errors, timeouts, `409` (honouring `Retry-After`), `429` and
//!   `503` with capped exponential backoff and jitter, within an overall
//!   [deadline](IdempotencyMiddleware::deadline); it never retries `400`, `422` or any other
//!   `4xx`, nor a replayed response;
//! - it records on the response whether it was a replay (`Idempotent-Replayed: true`) and
//!   how many tries it took: [`IdempotentResponseExt::idempotency`].
//!
//! Only buffered bodies can be sent twice: a request with a streamed body that the middleware
//! would retry fails with [`ClientError::StreamedBody`] before anything is sent.
//!
//! ```no_run
//! use axum_idempotency::client::{IdempotencyMiddleware, IdempotentResponseExt};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
//!     .with(IdempotencyMiddleware::new())
//!     .build();
//! let response = client
//!     .post("http://127.0.0.1:3000/orders")
//!     .header("content-type", "application/json")
//!     .body(r#"{"user_id": 1001, "amount": 299}"#)
//!     .send()
//!     .await?;
//! let outcome = response.idempotency().expect("the middleware ran");
//! println!("{} replayed={} tries={}", response.status(), outcome.replayed(), outcome.tries());
//! # Ok(())
//! # }
//! ```
//!
//! Requests of other methods without a key pass through untouched, in one try.

use std::fmt;
use std::time::{Duration, Instant, SystemTime};

use http::{Extensions, HeaderValue, Method, StatusCode, header};
use reqwest::{Request, Response};
use reqwest_middleware::{Middleware, Next};

use crate::engine::key::IDEMPOTENCY_KEY;
use crate::http::request::REPLAYED_HEADER;

/// Which UUID version the middleware generates keys with.
///
/// ```
/// use axum_idempotency::client::KeyVersion;
///
/// let key = KeyVersion::V7.generate();
/// assert_eq!(key.len(), 36);
/// assert_eq!(&key[14..15], "7");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum KeyVersion {
    /// Random (UUID v4): reveals nothing about the caller or the time.
    #[default]
    V4,
    /// Time-ordered (UUID v7): keys sort by creation time, which some stores index better.
    V7,
}

impl KeyVersion {
    /// A new key of this version, in its hyphenated form (36 characters).
    ///
    /// ```
    /// use axum_idempotency::client::KeyVersion;
    ///
    /// assert_ne!(KeyVersion::V4.generate(), KeyVersion::V4.generate());
    /// ```
    pub fn generate(self) -> String {
        match self {
            Self::V4 => uuid::Uuid::new_v4(),
            Self::V7 => uuid::Uuid::now_v7(),
        }
        .hyphenated()
        .to_string()
    }
}

/// The key generated for one logical request, kept in the request's `Extensions`: a
/// middleware around this one that retries the whole chain passes the same `Extensions`
/// again, and gets the same key.
#[derive(Clone)]
struct GeneratedKey(HeaderValue);

/// A [`reqwest_middleware::Middleware`] that makes a request safe to retry and retries it:
/// one `Idempotency-Key` per logical request, reused by every try.
///
/// The defaults: keys on `POST` and `PATCH`, UUID v4, at most 5 tries, backoff from 100 ms
/// doubling up to 5 s (each delay drawn between half and all of that), 30 s overall.
///
/// ```no_run
/// use std::time::Duration;
///
/// use axum_idempotency::client::{IdempotencyMiddleware, KeyVersion};
/// use http::Method;
///
/// let middleware = IdempotencyMiddleware::new()
///     .methods([Method::POST, Method::PATCH, Method::PUT])
///     .key_version(KeyVersion::V7)
///     .max_tries(8)
///     .backoff(Duration::from_millis(200), Duration::from_secs(10))
///     .deadline(Duration::from_secs(60));
/// let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
///     .with(middleware)
///     .build();
/// # let _ = client;
/// ```
#[derive(Debug, Clone)]
pub struct IdempotencyMiddleware {
    methods: Vec<Method>,
    key_version: KeyVersion,
    max_tries: u32,
    base_delay: Duration,
    max_delay: Duration,
    deadline: Duration,
}

impl Default for IdempotencyMiddleware {
    fn default() -> Self {
        Self::new()
    }
}

impl IdempotencyMiddleware {
    /// The middleware with its defaults (see the type's documentation).
    ///
    /// ```
    /// let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
    ///     .with(axum_idempotency::client::IdempotencyMiddleware::new())
    ///     .build();
    /// # let _ = client;
    /// ```
    pub fn new() -> Self {
        Self {
            methods: vec![Method::POST, Method::PATCH],
            key_version: KeyVersion::V4,
            max_tries: 5,
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(5),
            deadline: Duration::from_secs(30),
        }
    }

    /// The methods that get a generated key when the caller set none (default `POST` and
    /// `PATCH`). A request of any method that carries a key is retried as well.
    ///
    /// ```
    /// use axum_idempotency::client::IdempotencyMiddleware;
    /// use http::Method;
    ///
    /// let middleware = IdempotencyMiddleware::new().methods([Method::POST, Method::PUT]);
    /// # let _ = middleware;
    /// ```
    pub fn methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.methods = methods.into_iter().collect();
        self
    }

    /// The UUID version of generated keys (default [`KeyVersion::V4`]).
    ///
    /// ```
    /// use axum_idempotency::client::{IdempotencyMiddleware, KeyVersion};
    ///
    /// let middleware = IdempotencyMiddleware::new().key_version(KeyVersion::V7);
    /// # let _ = middleware;
    /// ```
    pub fn key_version(mut self, version: KeyVersion) -> Self {
        self.key_version = version;
        self
    }

    /// The most tries of one logical request, the first included (default 5; at least 1).
    ///
    /// ```
    /// let middleware = axum_idempotency::client::IdempotencyMiddleware::new().max_tries(3);
    /// # let _ = middleware;
    /// ```
    pub fn max_tries(mut self, tries: u32) -> Self {
        self.max_tries = tries.max(1);
        self
    }

    /// The backoff between tries without a `Retry-After`: `base` after the first try,
    /// doubling after each, never more than `max`; each delay is drawn at random between
    /// half and all of that (default 100 ms and 5 s).
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// let middleware = axum_idempotency::client::IdempotencyMiddleware::new()
    ///     .backoff(Duration::from_millis(50), Duration::from_secs(2));
    /// # let _ = middleware;
    /// ```
    pub fn backoff(mut self, base: Duration, max: Duration) -> Self {
        self.base_delay = base;
        self.max_delay = max.max(base);
        self
    }

    /// The time one logical request may take, every try and wait included (default 30 s).
    /// A try still running then is cancelled ([`ClientError::DeadlineExceeded`]); a wait that
    /// would end after it is not started, and the last answer is returned instead.
    ///
    /// The time of one try is bounded by the `reqwest::Client`'s own timeout, if it has one.
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// let middleware = axum_idempotency::client::IdempotencyMiddleware::new()
    ///     .deadline(Duration::from_secs(10));
    /// # let _ = middleware;
    /// ```
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// A new key as this middleware generates them: for a caller that stores its key with
    /// the business intent (a pending payment row, a job) before the first try, and sets it
    /// on every request for that intent, across restarts.
    ///
    /// ```no_run
    /// use axum_idempotency::client::IdempotencyMiddleware;
    ///
    /// # async fn run(client: reqwest_middleware::ClientWithMiddleware) -> reqwest_middleware::Result<()> {
    /// let middleware = IdempotencyMiddleware::new();
    /// let key = middleware.generate_key(); // saved with the intent, reused after a crash
    /// client
    ///     .post("http://127.0.0.1:3000/orders")
    ///     .header("idempotency-key", key.as_str())
    ///     .body(r#"{"user_id": 1001, "amount": 299}"#)
    ///     .send()
    ///     .await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn generate_key(&self) -> String {
        self.key_version.generate()
    }

    /// The delay before the next try after `tries` tries, without a server hint.
    fn backoff_delay(&self, tries: u32) -> Duration {
        let exponent = tries.saturating_sub(1).min(30);
        let full = self
            .base_delay
            .saturating_mul(1 << exponent)
            .min(self.max_delay);
        let half = full / 2;
        half + jitter(full - half)
    }

    async fn send(
        &self,
        request: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
        key: Option<HeaderValue>,
    ) -> Result<Response, ClientError> {
        let started = Instant::now();
        let mut tries = 0;
        loop {
            let Some(attempt) = request.try_clone() else {
                return Err(ClientError::StreamedBody);
            };
            let Some(remaining) = self.deadline.checked_sub(started.elapsed()) else {
                return Err(ClientError::DeadlineExceeded {
                    tries,
                    deadline: self.deadline,
                });
            };
            tries += 1;
            let result = match tokio::time::timeout(
                remaining,
                next.clone().run(attempt, extensions),
            )
            .await
            {
                Ok(result) => result,
                Err(_elapsed) => {
                    return Err(ClientError::DeadlineExceeded {
                        tries,
                        deadline: self.deadline,
                    });
                }
            };
            let delay = match result {
                Ok(mut response) => {
                    let outcome = IdempotencyOutcome::new(key.clone(), tries, &response);
                    let retry = !outcome.replayed && retryable_status(response.status());
                    let delay = retry_after(&response)
                        .map(|hint| hint + jitter(hint / 10))
                        .unwrap_or_else(|| self.backoff_delay(tries));
                    if !retry
                        || tries >= self.max_tries
                        || started.elapsed() + delay > self.deadline
                    {
                        response.extensions_mut().insert(outcome);
                        return Ok(response);
                    }
                    tracing::debug!(
                        status = response.status().as_u16(),
                        tries,
                        ?delay,
                        "idempotent request answered with a retryable status; retrying"
                    );
                    delay
                }
                Err(error) => {
                    let delay = self.backoff_delay(tries);
                    if !retryable_error(&error)
                        || tries >= self.max_tries
                        || started.elapsed() + delay > self.deadline
                    {
                        return Err(ClientError::Failed {
                            tries,
                            source: error,
                        });
                    }
                    tracing::debug!(%error, tries, ?delay, "idempotent request failed; retrying");
                    delay
                }
            };
            tokio::time::sleep(delay).await;
        }
    }
}

#[async_trait::async_trait]
impl Middleware for IdempotencyMiddleware {
    async fn handle(
        &self,
        mut request: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<Response> {
        let key = match request.headers().get(IDEMPOTENCY_KEY) {
            // The caller's own key: kept as it is, never replaced.
            Some(key) => Some(key.clone()),
            None if self.methods.contains(request.method()) => {
                let key = match extensions.get::<GeneratedKey>() {
                    Some(GeneratedKey(key)) => key.clone(),
                    None => {
                        let key = HeaderValue::try_from(self.generate_key())
                            .expect("a UUID is a valid header value");
                        extensions.insert(GeneratedKey(key.clone()));
                        key
                    }
                };
                request.headers_mut().insert(IDEMPOTENCY_KEY, key.clone());
                Some(key)
            }
            None => None,
        };
        if key.is_none() {
            // Not ours to retry: one try, its outcome recorded all the same.
            let mut response = next.run(request, extensions).await?;
            let outcome = IdempotencyOutcome::new(None, 1, &response);
            response.extensions_mut().insert(outcome);
            return Ok(response);
        }
        if request.body().is_some_and(|body| body.as_bytes().is_none()) {
            return Err(reqwest_middleware::Error::middleware(
                ClientError::StreamedBody,
            ));
        }
        self.send(request, extensions, next, key)
            .await
            .map_err(reqwest_middleware::Error::middleware)
    }
}

/// Statuses that say "the same request may succeed later".
fn retryable_status(status: StatusCode) -> bool {
    matches!(
        status,
        StatusCode::CONFLICT | StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE
    )
}

/// Errors without an answer: the request may or may not have arrived, and the key makes
/// sending it again safe. A request that could not be built, a redirect loop or another
/// middleware's refusal would fail the same way again.
fn retryable_error(error: &reqwest_middleware::Error) -> bool {
    match error {
        reqwest_middleware::Error::Reqwest(error) => {
            !(error.is_builder() || error.is_redirect() || error.is_status() || error.is_decode())
        }
        reqwest_middleware::Error::Middleware(_) => false,
    }
}

/// `Retry-After` as seconds or as an HTTP date; `None` when absent, unreadable or zero.
fn retry_after(response: &Response) -> Option<Duration> {
    let value = response.headers().get(header::RETRY_AFTER)?.to_str().ok()?;
    let value = value.trim();
    let delay = match value.parse::<u64>() {
        Ok(seconds) => Duration::from_secs(seconds),
        Err(_) => httpdate::parse_http_date(value)
            .ok()?
            .duration_since(SystemTime::now())
            .ok()?,
    };
    (!delay.is_zero()).then_some(delay)
}

/// A random duration in `0..=max`.
fn jitter(max: Duration) -> Duration {
    let max = u64::try_from(max.as_micros()).unwrap_or(u64::MAX);
    Duration::from_micros(fastrand::u64(0..=max))
}

/// What the middleware did for one logical request, kept in the final response's
/// extensions; read it with [`IdempotentResponseExt::idempotency`].
///
/// ```no_run
/// use axum_idempotency::client::IdempotentResponseExt;
///
/// # fn show(response: &reqwest::Response) {
/// if let Some(outcome) = response.idempotency() {
///     eprintln!("replayed={} tries={}", outcome.replayed(), outcome.tries());
/// }
/// # }
/// ```
#[derive(Clone)]
pub struct IdempotencyOutcome {
    key: Option<HeaderValue>,
    tries: u32,
    replayed: bool,
}

impl IdempotencyOutcome {
    fn new(key: Option<HeaderValue>, tries: u32, response: &Response) -> Self {
        Self {
            key,
            tries,
            replayed: is_replayed(response),
        }
    }

    /// The `Idempotency-Key` the request was sent with (generated or the caller's), or
    /// `None` for a request the middleware left alone.
    ///
    /// ```no_run
    /// # use axum_idempotency::client::IdempotentResponseExt;
    /// # fn show(response: &reqwest::Response) {
    /// let key = response.idempotency().and_then(|outcome| outcome.key());
    /// # let _ = key;
    /// # }
    /// ```
    pub fn key(&self) -> Option<&str> {
        self.key.as_ref().and_then(|key| key.to_str().ok())
    }

    /// How many times the request was sent, 1 for an answer to the first try.
    ///
    /// ```no_run
    /// # use axum_idempotency::client::IdempotentResponseExt;
    /// # fn show(response: &reqwest::Response) {
    /// assert!(response.idempotency().unwrap().tries() >= 1);
    /// # }
    /// ```
    pub fn tries(&self) -> u32 {
        self.tries
    }

    /// Whether the answer is the server's stored answer to an earlier try of the same key
    /// (`Idempotent-Replayed: true`): the work was done once, before this answer.
    ///
    /// ```no_run
    /// # use axum_idempotency::client::IdempotentResponseExt;
    /// # fn show(response: &reqwest::Response) {
    /// if response.idempotency().is_some_and(|outcome| outcome.replayed()) {
    ///     println!("already done: the first answer had been lost");
    /// }
    /// # }
    /// ```
    pub fn replayed(&self) -> bool {
        self.replayed
    }
}

/// The key may be a secret the caller reuses: `Debug` says whether there is one, not what.
impl fmt::Debug for IdempotencyOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyOutcome")
            .field("key", &self.key.as_ref().map(|_| "…"))
            .field("tries", &self.tries)
            .field("replayed", &self.replayed)
            .finish()
    }
}

fn is_replayed(response: &Response) -> bool {
    response
        .headers()
        .get(REPLAYED_HEADER)
        .is_some_and(|value| value.as_bytes().eq_ignore_ascii_case(b"true"))
}

/// Reads what [`IdempotencyMiddleware`] recorded on a `reqwest::Response`.
///
/// ```no_run
/// use axum_idempotency::client::IdempotentResponseExt;
///
/// # fn show(response: &reqwest::Response) {
/// println!("replayed={}", response.is_replayed());
/// # }
/// ```
pub trait IdempotentResponseExt: sealed::Sealed {
    /// The middleware's record for this response; `None` when the response did not come
    /// through it.
    ///
    /// ```no_run
    /// use axum_idempotency::client::IdempotentResponseExt;
    ///
    /// # fn show(response: &reqwest::Response) {
    /// let tries = response.idempotency().map_or(1, |outcome| outcome.tries());
    /// # let _ = tries;
    /// # }
    /// ```
    fn idempotency(&self) -> Option<&IdempotencyOutcome>;

    /// Whether the response carries `Idempotent-Replayed: true`, with or without the
    /// middleware.
    ///
    /// ```no_run
    /// use axum_idempotency::client::IdempotentResponseExt;
    ///
    /// # fn show(response: &reqwest::Response) {
    /// let replayed = response.is_replayed();
    /// # let _ = replayed;
    /// # }
    /// ```
    fn is_replayed(&self) -> bool;
}

impl IdempotentResponseExt for Response {
    fn idempotency(&self) -> Option<&IdempotencyOutcome> {
        self.extensions().get::<IdempotencyOutcome>()
    }

    fn is_replayed(&self) -> bool {
        is_replayed(self)
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for reqwest::Response {}
}

/// Why [`IdempotencyMiddleware`] returned no response. It reaches the caller inside
/// [`reqwest_middleware::Error::Middleware`]; [`ClientError::find`] gets it back.
///
/// ```no_run
/// use axum_idempotency::client::ClientError;
///
/// # async fn run(client: reqwest_middleware::ClientWithMiddleware) {
/// match client.post("http://127.0.0.1:3000/orders").body("{}").send().await {
///     Ok(response) => println!("{}", response.status()),
///     Err(error) => match ClientError::find(&error) {
///         Some(ClientError::StreamedBody) => eprintln!("buffer the body first"),
///         Some(failure) => eprintln!("gave up after {} tries: {failure}", failure.tries()),
///         None => eprintln!("{error}"),
///     },
/// }
/// # }
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum ClientError {
    /// The request's body is a stream, which cannot be sent twice: nothing was sent. Give the
    /// request a buffered body (bytes, a string, JSON).
    StreamedBody,
    /// No try got an answer: the last one failed with `source`, and it was not worth
    /// retrying, or the tries or the time ran out.
    Failed {
        /// Tries made.
        tries: u32,
        /// The last try's error.
        source: reqwest_middleware::Error,
    },
    /// The overall deadline passed while a try was running (it was cancelled) or before one
    /// could start.
    DeadlineExceeded {
        /// Tries made, the cancelled one included.
        tries: u32,
        /// The deadline that passed.
        deadline: Duration,
    },
}

impl ClientError {
    /// The `ClientError` inside an error of a client with the middleware, if there is one.
    ///
    /// ```no_run
    /// use axum_idempotency::client::ClientError;
    ///
    /// # fn show(error: &reqwest_middleware::Error) {
    /// if let Some(ClientError::DeadlineExceeded { tries, .. }) = ClientError::find(error) {
    ///     eprintln!("out of time after {tries} tries");
    /// }
    /// # }
    /// ```
    pub fn find(error: &reqwest_middleware::Error) -> Option<&Self> {
        match error {
            reqwest_middleware::Error::Middleware(error) => error.downcast_ref(),
            reqwest_middleware::Error::Reqwest(_) => None,
        }
    }

    /// Tries made: 0 when nothing was sent.
    ///
    /// ```
    /// use axum_idempotency::client::ClientError;
    ///
    /// assert_eq!(ClientError::StreamedBody.tries(), 0);
    /// ```
    pub fn tries(&self) -> u32 {
        match self {
            Self::StreamedBody => 0,
            Self::Failed { tries, .. } | Self::DeadlineExceeded { tries, .. } => *tries,
        }
    }
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::StreamedBody => f.write_str(
                "an idempotent request needs a buffered body to be retried, and this one is \
                 streamed; nothing was sent",
            ),
            Self::Failed { tries, .. } => {
                write!(f, "the request failed after {tries} tries")
            }
            Self::DeadlineExceeded { tries, deadline } => write!(
                f,
                "the request had no answer within its deadline of {deadline:?} ({tries} tries)"
            ),
        }
    }
}

impl std::error::Error for ClientError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Failed { source, .. } => Some(source),
            Self::StreamedBody | Self::DeadlineExceeded { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap_with_jitter_in_the_upper_half() {
        let middleware = IdempotencyMiddleware::new()
            .backoff(Duration::from_millis(100), Duration::from_secs(1));
        for _ in 0..100 {
            let first = middleware.backoff_delay(1);
            assert!((Duration::from_millis(50)..=Duration::from_millis(100)).contains(&first));
            let third = middleware.backoff_delay(3);
            assert!((Duration::from_millis(200)..=Duration::from_millis(400)).contains(&third));
            let capped = middleware.backoff_delay(40);
            assert!((Duration::from_millis(500)..=Duration::from_secs(1)).contains(&capped));
        }
    }

    #[test]
    fn retries_only_what_may_succeed_later() {
        for status in [409, 429, 503] {
            assert!(retryable_status(StatusCode::from_u16(status).unwrap()));
        }
        for status in [200, 201, 400, 401, 404, 413, 422, 500, 502] {
            assert!(!retryable_status(StatusCode::from_u16(status).unwrap()));
        }
    }

    #[test]
    fn retry_after_reads_seconds_and_http_dates() {
        let response = |value: &str| {
            Response::from(
                http::Response::builder()
                    .header(header::RETRY_AFTER, value)
                    .body(Vec::<u8>::new())
                    .unwrap(),
            )
        };
        assert_eq!(retry_after(&response("2")), Some(Duration::from_secs(2)));
        assert_eq!(retry_after(&response("0")), None);
        assert_eq!(retry_after(&response("soon")), None);
        let later = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(30));
        let delay = retry_after(&response(&later)).unwrap();
        assert!(delay > Duration::from_secs(28) && delay <= Duration::from_secs(30));
    }

    #[test]
    fn keys_are_uuids_of_the_chosen_version() {
        let v4 = uuid::Uuid::parse_str(&KeyVersion::V4.generate()).unwrap();
        assert_eq!(v4.get_version_num(), 4);
        let v7 = uuid::Uuid::parse_str(&KeyVersion::V7.generate()).unwrap();
        assert_eq!(v7.get_version_num(), 7);
    }
}
