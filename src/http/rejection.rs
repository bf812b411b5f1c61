//! The answers the crate gives instead of running (or after failing to finish) a handler,
//! rendered as RFC 9457 `application/problem+json` by default.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode, header};

use crate::engine::error::Chain;

/// What went wrong, in a form a program can branch on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RejectionKind {
    /// The route requires an `Idempotency-Key` and the request has none (400).
    MissingKey,
    /// The `Idempotency-Key` is malformed (400).
    InvalidKey,
    /// The request body is larger than the configured limit (413).
    PayloadTooLarge,
    /// The request body could not be read (400).
    BodyUnreadable,
    /// The request body did not arrive within the configured time (408).
    BodyTimeout,
    /// The key was used before with a different request (422).
    KeyReused,
    /// A request with the same key is still being processed (409, with `Retry-After`).
    InFlight,
    /// The idempotency store could not be reached (503, with `Retry-After`).
    StoreUnavailable,
    /// The crate's tables or functions are missing from the database, or older than this
    /// version needs: `migrate` has not run against it (500, no `Retry-After`: retrying
    /// cannot help until an operator migrates).
    SchemaMissing,
    /// The handler succeeded but the record insert or the COMMIT failed, or the connection
    /// was lost before PostgreSQL answered the COMMIT (503). Either nothing was stored and
    /// a retry runs the handler again, or — when only the answer was lost — the work did
    /// commit and a retry replays it; never twice.
    CommitFailed,
    /// The handler's response is larger than the limit for stored responses; the work was
    /// rolled back (500).
    ResponseTooLarge,
    /// The handler's response body failed while being buffered; the work was rolled back
    /// (500).
    ResponseBodyFailed,
    /// Lease mode: the handler finished after its lease ran out and another request took
    /// the key over; its result was not stored (409, with `Retry-After`).
    LeaseLost,
    /// The handler kept a copy of its `IdempotentTx` after returning; the work was rolled
    /// back (500).
    TransactionLeaked,
    /// The handler panicked; the work was rolled back (500).
    HandlerPanicked,
    /// The handler did not finish within the configured deadline; the work was rolled back
    /// (503).
    HandlerTimedOut,
    /// `IdempotentTx` was used on a route without `IdempotencyLayer` (500).
    LayerMissing,
    /// `IdempotentTx` was used on a method the layer does not cover (500).
    MethodNotCovered,
    /// A handler returned an [`Error`](crate::Error) that is not about reaching the
    /// database (a constraint, a statement refused): its work was rolled back (500).
    DatabaseError,
    /// The key was attempted more often in the current second than
    /// [`IdempotencyLayer::key_attempt_limit`](crate::IdempotencyLayer::key_attempt_limit)
    /// allows; refused before the database was asked (429, with `Retry-After: 1`).
    TooManyAttempts,
    /// One handler took both [`IdempotentTx`](crate::IdempotentTx) (atomic mode) and
    /// [`IdempotentLease`](crate::IdempotentLease) (lease mode): a key is claimed in one
    /// mode. Nothing was done (500).
    ConflictingExtractors,
}

impl RejectionKind {
    /// Every kind, in declaration order: the source of the `code` values the OpenAPI
    /// declarations list per status.
    #[cfg_attr(not(feature = "utoipa"), allow(dead_code))]
    pub(crate) const ALL: [Self; 21] = [
        Self::MissingKey,
        Self::InvalidKey,
        Self::PayloadTooLarge,
        Self::BodyUnreadable,
        Self::BodyTimeout,
        Self::KeyReused,
        Self::InFlight,
        Self::StoreUnavailable,
        Self::SchemaMissing,
        Self::CommitFailed,
        Self::ResponseTooLarge,
        Self::ResponseBodyFailed,
        Self::LeaseLost,
        Self::TransactionLeaked,
        Self::HandlerPanicked,
        Self::HandlerTimedOut,
        Self::LayerMissing,
        Self::MethodNotCovered,
        Self::DatabaseError,
        Self::TooManyAttempts,
        Self::ConflictingExtractors,
    ];

    /// The status code of the default response.
    pub fn status(self) -> StatusCode {
        match self {
            Self::MissingKey | Self::InvalidKey | Self::BodyUnreadable => StatusCode::BAD_REQUEST,
            Self::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Self::BodyTimeout => StatusCode::REQUEST_TIMEOUT,
            Self::TooManyAttempts => StatusCode::TOO_MANY_REQUESTS,
            Self::KeyReused => StatusCode::UNPROCESSABLE_ENTITY,
            Self::InFlight | Self::LeaseLost => StatusCode::CONFLICT,
            Self::StoreUnavailable | Self::CommitFailed | Self::HandlerTimedOut => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            Self::ResponseTooLarge
            | Self::ResponseBodyFailed
            | Self::TransactionLeaked
            | Self::HandlerPanicked
            | Self::LayerMissing
            | Self::MethodNotCovered
            | Self::SchemaMissing
            | Self::DatabaseError
            | Self::ConflictingExtractors => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// A stable, machine-readable name, sent as the `code` member of the problem body.
    pub fn code(self) -> &'static str {
        match self {
            Self::MissingKey => "missing_key",
            Self::InvalidKey => "invalid_key",
            Self::PayloadTooLarge => "payload_too_large",
            Self::BodyUnreadable => "body_unreadable",
            Self::BodyTimeout => "body_timeout",
            Self::KeyReused => "key_reused",
            Self::InFlight => "in_flight",
            Self::LeaseLost => "lease_lost",
            Self::StoreUnavailable => "store_unavailable",
            Self::SchemaMissing => "schema_missing",
            Self::CommitFailed => "commit_failed",
            Self::ResponseTooLarge => "response_too_large",
            Self::ResponseBodyFailed => "response_body_failed",
            Self::TransactionLeaked => "transaction_leaked",
            Self::HandlerPanicked => "handler_panicked",
            Self::HandlerTimedOut => "handler_timed_out",
            Self::LayerMissing => "layer_missing",
            Self::MethodNotCovered => "method_not_covered",
            Self::DatabaseError => "database_error",
            Self::TooManyAttempts => "too_many_attempts",
            Self::ConflictingExtractors => "conflicting_extractors",
        }
    }
}

/// A refusal or failure of the idempotency machinery.
///
/// Every response the crate makes on its own carries a clone of its `Rejection` in the
/// response extensions, so outer middleware and tests can inspect [`Rejection::kind`]. The
/// response itself is built by the layer's rejection handler (see
/// [`IdempotencyLayer::on_rejection`](crate::IdempotencyLayer::on_rejection)), by default
/// [`Rejection::problem_response`].
#[derive(Clone)]
pub struct Rejection {
    kind: RejectionKind,
    detail: Cow<'static, str>,
    retry_after: Option<u32>,
    source: Option<Arc<dyn std::error::Error + Send + Sync>>,
}

impl Rejection {
    pub(crate) fn new(kind: RejectionKind, detail: impl Into<Cow<'static, str>>) -> Self {
        Self {
            kind,
            detail: detail.into(),
            retry_after: None,
            source: None,
        }
    }

    pub(crate) fn with_retry_after(mut self, seconds: u32) -> Self {
        self.retry_after = Some(seconds);
        self
    }

    pub(crate) fn with_source(
        mut self,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        self.source = Some(Arc::new(source));
        self
    }

    /// What went wrong.
    pub fn kind(&self) -> RejectionKind {
        self.kind
    }

    /// The status code of the default response.
    pub fn status(&self) -> StatusCode {
        self.kind.status()
    }

    /// A sentence for humans; it never contains the raw key.
    pub fn detail(&self) -> &str {
        &self.detail
    }

    /// Seconds after which a retry makes sense, sent as `Retry-After`.
    pub fn retry_after(&self) -> Option<u32> {
        self.retry_after
    }

    /// The default rendering: an RFC 9457 problem document.
    ///
    /// ```
    /// # use axum_idempotency::{Rejection, RejectionKind};
    /// # fn show(rejection: &Rejection) {
    /// let response = rejection.problem_response();
    /// assert_eq!(response.headers()["content-type"], "application/problem+json");
    /// // {"type":"about:blank","title":"Conflict","status":409,
    /// //  "detail":"a request with this Idempotency-Key is still being processed",
    /// //  "code":"in_flight"}
    /// # }
    /// ```
    pub fn problem_response(&self) -> Response {
        let status = self.status();
        let problem = Problem {
            r#type: "about:blank",
            title: status.canonical_reason().unwrap_or("Error"),
            status: status.as_u16(),
            detail: &self.detail,
            code: self.kind.code(),
        };
        let body = serde_json::to_vec(&problem).unwrap_or_default();
        let mut response = Response::new(Body::from(body));
        *response.status_mut() = status;
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        self.decorate(response)
    }

    /// Adds what every rejection response carries whoever rendered it: `Retry-After` and
    /// the rejection itself in the extensions.
    pub(crate) fn decorate(&self, mut response: Response) -> Response {
        if let Some(seconds) = self.retry_after {
            response
                .headers_mut()
                .entry(header::RETRY_AFTER)
                .or_insert_with(|| HeaderValue::from(seconds));
        }
        response.extensions_mut().insert(self.clone());
        response
    }
}

#[derive(serde::Serialize)]
struct Problem<'a> {
    r#type: &'static str,
    title: &'static str,
    status: u16,
    detail: &'a str,
    code: &'static str,
}

impl IntoResponse for Rejection {
    fn into_response(self) -> Response {
        self.problem_response()
    }
}

impl fmt::Debug for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rejection")
            .field("kind", &self.kind)
            .field("detail", &self.detail)
            .field("retry_after", &self.retry_after)
            .field("source", &self.source)
            .finish()
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.detail)
    }
}

impl std::error::Error for Rejection {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// Builds the response for a rejection; set with
/// [`IdempotencyLayer::on_rejection`](crate::IdempotencyLayer::on_rejection).
pub(crate) type RejectionHandler = Arc<dyn Fn(&Rejection) -> Response + Send + Sync>;

/// Re-renders a response the crate made with a custom rejection handler, if one is set.
pub(crate) fn finalize(response: Response, handler: Option<&RejectionHandler>) -> Response {
    let Some(handler) = handler else {
        return response;
    };
    match response.extensions().get::<Rejection>() {
        Some(rejection) => {
            let rejection = rejection.clone();
            rejection.decorate(handler(&rejection))
        }
        None => response,
    }
}

/// A handler may return `Result<_, axum_idempotency::Error>`: the error answers as a
/// problem document. Not reaching the database (no pooled connection, a lost connection,
/// a serialization failure or deadlock, the server shutting down) is 503 `store_unavailable`
/// with `Retry-After: 1`; the crate's own schema never migrated is 500 `schema_missing`
/// (a handler's statement that names a table or column of its own that does not exist is
/// that statement's failure: 500 `database_error`); anything else 500
/// `database_error`. Either way the layer rolls the work back and stores nothing, so the
/// client's retry runs again. The body never carries the database's message.
///
/// ```no_run
/// use axum::http::StatusCode;
/// use axum_idempotency::postgres::IdempotentTx;
///
/// async fn create_order(tx: IdempotentTx) -> Result<StatusCode, axum_idempotency::Error> {
///     tx.execute("INSERT INTO orders (user_id, amount) VALUES (1001, 299)", &[]).await?;
///     Ok(StatusCode::CREATED)
/// }
/// # let _: axum::routing::MethodRouter = axum::routing::post(create_order);
/// ```
impl IntoResponse for crate::engine::error::Error {
    fn into_response(self) -> Response {
        let rejection = if matches!(self, Self::DuplicateRequest) {
            // The layer answers such a request itself; this is for a handler outside it.
            Rejection::new(
                RejectionKind::InFlight,
                "another request with this Idempotency-Key is in flight; retry later",
            )
            .with_retry_after(1)
        } else if self.is_crate_schema_missing() {
            tracing::error!(error = %Chain(&self), "the idempotency schema is missing");
            Rejection::new(
                RejectionKind::SchemaMissing,
                "the database schema is missing or outdated; run axum_idempotency::migrate",
            )
        } else if self.is_transient() {
            tracing::warn!(error = %Chain(&self), "a handler's statement could not reach the database");
            Rejection::new(
                RejectionKind::StoreUnavailable,
                "the database is unavailable; retry later",
            )
            .with_retry_after(1)
        } else {
            tracing::error!(error = %Chain(&self), "a handler's statement failed");
            Rejection::new(
                RejectionKind::DatabaseError,
                "the request failed in the database; its work was rolled back",
            )
        };
        rejection.with_source(self).problem_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    /// `ALL` names every kind once: a kind added to the enum and not to the list fails to
    /// compile here (the match is exhaustive) or fails the count.
    #[test]
    fn all_lists_every_kind_once() {
        let position = |kind: RejectionKind| match kind {
            RejectionKind::MissingKey => 0,
            RejectionKind::InvalidKey => 1,
            RejectionKind::PayloadTooLarge => 2,
            RejectionKind::BodyUnreadable => 3,
            RejectionKind::BodyTimeout => 4,
            RejectionKind::KeyReused => 5,
            RejectionKind::InFlight => 6,
            RejectionKind::StoreUnavailable => 7,
            RejectionKind::SchemaMissing => 8,
            RejectionKind::CommitFailed => 9,
            RejectionKind::ResponseTooLarge => 10,
            RejectionKind::ResponseBodyFailed => 11,
            RejectionKind::LeaseLost => 12,
            RejectionKind::TransactionLeaked => 13,
            RejectionKind::HandlerPanicked => 14,
            RejectionKind::HandlerTimedOut => 15,
            RejectionKind::LayerMissing => 16,
            RejectionKind::MethodNotCovered => 17,
            RejectionKind::DatabaseError => 18,
            RejectionKind::TooManyAttempts => 19,
            RejectionKind::ConflictingExtractors => 20,
        };
        for (index, kind) in RejectionKind::ALL.into_iter().enumerate() {
            assert_eq!(position(kind), index, "{kind:?}");
        }
        let codes: std::collections::HashSet<_> =
            RejectionKind::ALL.iter().map(|kind| kind.code()).collect();
        assert_eq!(codes.len(), RejectionKind::ALL.len(), "codes are distinct");
    }

    #[tokio::test]
    async fn a_handler_error_answers_by_what_a_retry_can_do() {
        let unreachable =
            crate::engine::error::Error::Pool("no connection in time".into()).into_response();
        assert_eq!(unreachable.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(unreachable.headers()[header::RETRY_AFTER], "1");
        let misuse = crate::engine::error::Error::TransactionEnded.into_response();
        assert_eq!(misuse.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert!(misuse.headers().get(header::RETRY_AFTER).is_none());
        let body = misuse.into_body().collect().await.unwrap().to_bytes();
        let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(problem["code"], "database_error");
    }

    #[tokio::test]
    async fn too_many_attempts_is_429_with_its_own_code() {
        let response = Rejection::new(RejectionKind::TooManyAttempts, "slow down")
            .with_retry_after(1)
            .problem_response();
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(response.headers()[header::RETRY_AFTER], "1");
        let body = response.into_body().collect().await.unwrap().to_bytes();
        let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(problem["code"], "too_many_attempts");
        assert_eq!(problem["title"], "Too Many Requests");
    }

    #[tokio::test]
    async fn problem_document_has_rfc9457_members() {
        let rejection = Rejection::new(RejectionKind::InFlight, "busy").with_retry_after(2);
        let response = rejection.problem_response();
        assert_eq!(response.status(), StatusCode::CONFLICT);
        assert_eq!(response.headers()[header::RETRY_AFTER], "2");
        assert_eq!(
            response.headers()[header::CONTENT_TYPE],
            "application/problem+json"
        );
        assert_eq!(
            response
                .extensions()
                .get::<Rejection>()
                .map(Rejection::kind),
            Some(RejectionKind::InFlight)
        );
        let body = response.into_body().collect().await.unwrap().to_bytes();
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "type": "about:blank", "title": "Conflict", "status": 409,
                "detail": "busy", "code": "in_flight"
            })
        );
    }
}
