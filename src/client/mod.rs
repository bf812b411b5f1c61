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

mod error;
mod middleware;
mod outcome;

pub use self::error::ClientError;
pub use self::middleware::IdempotencyMiddleware;
pub use self::outcome::{IdempotencyOutcome, IdempotentResponseExt};

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
