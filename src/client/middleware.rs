//! [`IdempotencyMiddleware`]: one key per logical request, and the retry loop.

use std::time::{Duration, Instant, SystemTime};

use http::{Extensions, HeaderValue, Method, StatusCode, header};
use reqwest::{Request, Response};
use reqwest_middleware::{Middleware, Next};

use super::{ClientError, IdempotencyOutcome, KeyVersion};
use crate::engine::key::IDEMPOTENCY_KEY;

/// How much of an answer that will be retried is read (and dropped) so its connection can
/// carry the retry; a longer body closes the connection instead.
const DRAIN_LIMIT: usize = 64 * 1024;

/// Reads `response`'s body to its end, at most [`DRAIN_LIMIT`] bytes and for at most
/// `wait`, and returns what is left of `wait`. A body read to its end lets the client's
/// pool reuse the connection; one dropped unread closes it.
async fn drain(mut response: Response, wait: Duration) -> Duration {
    let started = Instant::now();
    let _ = tokio::time::timeout(wait, async {
        let mut read = 0;
        while let Ok(Some(chunk)) = response.chunk().await {
            read += chunk.len();
            if read > DRAIN_LIMIT {
                break;
            }
        }
    })
    .await;
    wait.saturating_sub(started.elapsed())
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
                    let retry = !outcome.replayed() && retryable_status(response.status());
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
                    drain(response, delay).await
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
