//! The gateway's routes: a keyed request of a guarded method goes through the layer in lease
//! mode to the upstream, once; everything else is proxied as it is.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum_idempotency::{IDEMPOTENCY_KEY, IdempotentLease, OutcomeUnknown};
use tower_service::Service;

use crate::proxy::{FENCING_TOKEN, Failure, Upstream};

/// What the dispatcher needs.
#[derive(Clone)]
pub(crate) struct Gateway {
    pub(crate) upstream: Upstream,
    pub(crate) methods: Vec<Method>,
    pub(crate) key_required: bool,
    /// The guarded route: the layer around [`forward_guarded`].
    pub(crate) guarded: Router,
}

impl Gateway {
    /// Whether `request` goes through the layer: a guarded method, with a key (or without
    /// one when keys are required, so the layer answers 400 `missing_key`).
    fn guards(&self, request: &Request) -> bool {
        self.methods.contains(request.method())
            && (self.key_required || request.headers().contains_key(IDEMPOTENCY_KEY))
    }
}

/// Every request: guarded, or proxied as it is.
pub(crate) async fn dispatch(State(gateway): State<Arc<Gateway>>, request: Request) -> Response {
    if gateway.guards(&request) {
        let mut guarded = gateway.guarded.clone();
        return match guarded.call(request).await {
            Ok(response) => response,
            Err(never) => match never {},
        };
    }
    let peer = peer(&request);
    let request = gateway.upstream.outgoing(request, peer);
    match gateway.upstream.send_streaming(request).await {
        Ok(response) => response,
        Err(failure) => failed(&failure).into_response(),
    }
}

/// A guarded request, once its key is leased: forwarded with the key's fencing token.
pub(crate) async fn forward_guarded(
    State(upstream): State<Arc<Upstream>>,
    lease: IdempotentLease,
    request: Request,
) -> Response {
    let peer = peer(&request);
    let mut request = upstream.outgoing(request, peer);
    request
        .headers_mut()
        .insert(FENCING_TOKEN, HeaderValue::from(lease.fencing_token()));
    match upstream.send_buffered(request).await {
        Ok(response) => response,
        Err(failure) => {
            tracing::warn!(token = lease.fencing_token(), %failure, "upstream gave no answer");
            match failure {
                // Nothing was sent: the key is free for the retry (a 502 is not stored).
                Failure::Refused(_) => failed(&failure).into_response(),
                // It may have been acted on: the key stays held until its lease runs out.
                Failure::TimedOut | Failure::Closed(_) => {
                    (OutcomeUnknown, failed(&failure)).into_response()
                }
            }
        }
    }
}

fn peer(request: &Request) -> Option<IpAddr> {
    request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|info| info.0.ip())
}

/// The answer for an upstream that gave none.
fn failed(failure: &Failure) -> Response {
    match failure {
        Failure::Refused(_) => problem(
            StatusCode::BAD_GATEWAY,
            "upstream_unreachable",
            "the upstream refused the connection; nothing was sent, retry the request",
        ),
        Failure::TimedOut => problem(
            StatusCode::GATEWAY_TIMEOUT,
            "upstream_timed_out",
            "the upstream did not answer in time; it may have acted on the request, whose key \
             stays held until its lease ends",
        ),
        Failure::Closed(_) => problem(
            StatusCode::BAD_GATEWAY,
            "upstream_closed",
            "the upstream closed the connection after the request was sent; it may have acted \
             on the request, whose key stays held until its lease ends",
        ),
    }
}

/// An `application/problem+json` answer with the gateway's `code`.
pub(crate) fn problem(status: StatusCode, code: &str, detail: &str) -> Response {
    let body = serde_json::json!({
        "type": "about:blank",
        "title": status.canonical_reason().unwrap_or_default(),
        "status": status.as_u16(),
        "detail": detail,
        "code": code,
    });
    (
        status,
        [("content-type", "application/problem+json")],
        Body::from(body.to_string()),
    )
        .into_response()
}

/// The console's guard: reading is open (the console listens where the operator chose);
/// actions need `Authorization: Bearer CONSOLE_TOKEN`, and without a token there are none.
pub(crate) async fn console_guard(
    State(token): State<Option<Arc<str>>>,
    request: Request,
    next: axum::middleware::Next,
) -> Response {
    if matches!(*request.method(), Method::GET | Method::HEAD) {
        return next.run(request).await;
    }
    let Some(token) = token else {
        return problem(
            StatusCode::FORBIDDEN,
            "console_read_only",
            "the console is read-only: start the gateway with CONSOLE_TOKEN to allow its actions",
        );
    };
    let sent = request
        .headers()
        .get("authorization")
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "));
    if sent.is_some_and(|sent| same(sent.as_bytes(), token.as_bytes())) {
        return next.run(request).await;
    }
    let mut response = problem(
        StatusCode::UNAUTHORIZED,
        "console_token_required",
        "the console's actions need Authorization: Bearer <CONSOLE_TOKEN>",
    );
    response
        .headers_mut()
        .insert("www-authenticate", HeaderValue::from_static("Bearer"));
    response
}

/// Compares two secrets in time independent of where they differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    use sha2::{Digest, Sha256};
    Sha256::digest(a)
        .iter()
        .zip(Sha256::digest(b).iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y))
        == 0
}

#[cfg(test)]
mod tests {
    use super::same;

    #[test]
    fn secrets_compare_whole() {
        assert!(same(b"token", b"token"));
        assert!(!same(b"token", b"tokem"));
        assert!(!same(b"token", b"token "));
        assert!(!same(b"", b"token"));
    }
}
