//! The caller's `X-User-Id` header, required on the orders examples' `POST` routes: an
//! integer user id (the OpenAPI document declares it so). A request without it, or with
//! anything else in it, is answered 400 before its handler's extractors run: no order, no
//! record, nothing claimed. A method a route does not serve is still 405.

use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// The header, and the problem `code` of a request whose header is missing or not an
/// integer.
pub(crate) const HEADER: &str = "x-user-id";
pub(crate) const INVALID: &str = "invalid_x_user_id";

/// Middleware for a route's `POST`
/// (`post(handler).route_layer(axum::middleware::from_fn(user::require))`): refuses a
/// request whose `X-User-Id` is not an integer (see the module docs).
pub(crate) async fn require(request: Request, next: Next) -> Response {
    let user = request
        .headers()
        .get(HEADER)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.trim().parse::<i64>().ok());
    if user.is_some() {
        return next.run(request).await;
    }
    let detail = match request.headers().get(HEADER) {
        None => "the X-User-Id header is required: the caller's integer user id",
        Some(_) => "the X-User-Id header must be the caller's integer user id",
    };
    let status = StatusCode::BAD_REQUEST;
    let body = serde_json::json!({
        "type": "about:blank",
        "title": status.canonical_reason(),
        "status": status.as_u16(),
        "detail": detail,
        "code": INVALID,
    });
    (
        status,
        [("content-type", "application/problem+json")],
        body.to_string(),
    )
        .into_response()
}
