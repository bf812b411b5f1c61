//! The store policy: what a handler's status code means for its transaction and response.

use http::StatusCode;

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
