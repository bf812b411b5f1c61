//! What the middleware records on a response, and how to read it.

use std::fmt;

use http::HeaderValue;
use reqwest::Response;

use crate::engine::key::REPLAYED_HEADER;

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
    pub(super) fn new(key: Option<HeaderValue>, tries: u32, response: &Response) -> Self {
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

/// Reads what [`IdempotencyMiddleware`](super::IdempotencyMiddleware) recorded on a `reqwest::Response`.
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
