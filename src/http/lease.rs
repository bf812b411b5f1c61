//! Lease mode: idempotency for handlers whose side effects leave the database.
//!
//! Atomic mode ([`IdempotentTx`](crate::IdempotentTx)) makes the record and the handler's
//! rows commit together — but a call to a payment gateway or an email cannot be rolled
//! back, and holding a transaction open across it is wrong. A handler that takes
//! [`IdempotentLease`] instead follows the article's state machine:
//!
//! 1. the claim commits a `PROCESSING` record at once, with a lease (`locked_until`,
//!    [`IdempotencyLayer::lease`](crate::IdempotencyLayer::lease)) and a fencing token;
//!    duplicates get 409 with `Retry-After` while the lease holds;
//! 2. the handler does its work, passing [`IdempotentLease::derive_key`] values to
//!    every outside call so that they are idempotent too;
//! 3. the layer finishes the record with an update fenced by the token: `SUCCESS` with
//!    the response, or `FAILED` — replayed for a deterministic 4xx, retryable for a 5xx,
//!    408/409/425/429, a panic or a timeout;
//! 4. a holder that crashed leaves a lease that runs out; the next retry takes the key over
//!    with a new token, and the old holder's late completion is refused (409
//!    `lease_lost`), never overwriting the newer result.

use std::fmt;

use crate::engine::key::{RecordId, derive_key};

/// The extractor that makes a route idempotent in lease mode.
///
/// ```no_run
/// use axum::{Json, http::StatusCode};
/// use axum_idempotency::IdempotentLease;
///
/// async fn charge(lease: IdempotentLease, Json(order): Json<serde_json::Value>) -> StatusCode {
///     // The same value on every retry of this operation, so the gateway charges once.
///     let charge_key = lease.derive_key("charge");
///     let sent = reqwest_like_post("https://gateway.example/charges", &charge_key, &order).await;
///     if sent { StatusCode::CREATED } else { StatusCode::BAD_GATEWAY } // 502: retry may run again
/// }
/// # async fn reqwest_like_post(_: &str, _: &str, _: &serde_json::Value) -> bool { true }
/// ```
pub struct IdempotentLease {
    id: RecordId,
    token: i64,
}

impl IdempotentLease {
    pub(crate) fn new(id: RecordId, token: i64) -> Self {
        Self { id, token }
    }

    /// The fencing token of this lease: drawn from a database sequence when the key is
    /// first leased, and higher at every takeover, so a later holder of a key always has a
    /// higher token than an earlier one — even if the key's record was purged in between.
    /// Pass it to downstream systems that can reject stale writers.
    pub fn fencing_token(&self) -> i64 {
        self.token
    }

    /// A stable key for one downstream effect of this operation: the same on every retry of
    /// the same (scope, Idempotency-Key), different for every `label`. Send it as the
    /// `Idempotency-Key` of a downstream HTTP call or as the id of a published message.
    pub fn derive_key(&self, label: &str) -> String {
        derive_key(self.id, label)
    }
}

impl fmt::Debug for IdempotentLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotentLease")
            .field("record", &self.id)
            .field("token", &self.token)
            .finish()
    }
}
