//! A JSON request body whose rejections are problem documents, like every other error
//! the orders examples send: axum's `Json` answers a body it cannot read with
//! `text/plain`; [`JsonBody`] answers with `application/problem+json` and a `code`, as
//! the examples' OpenAPI document declares.
//!
//! | what is wrong | status | `code` |
//! |---|---|---|
//! | not JSON (a syntax error) | 400 | `malformed_json` |
//! | JSON, but not the expected object (a missing member, a wrong type) | 422 | `invalid_body` |
//! | no `Content-Type: application/json` | 415 | `unsupported_media_type` |
//! | the body could not be read | 400, or 413 when too large | `body_unreadable`, `payload_too_large` |

use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;

/// `Json<T>` with problem-document rejections.
pub(crate) struct JsonBody<T>(pub(crate) T);

/// The `code` the examples send for each kind of JSON rejection.
pub(crate) const MALFORMED_JSON: &str = "malformed_json";
pub(crate) const INVALID_BODY: &str = "invalid_body";
pub(crate) const UNSUPPORTED_MEDIA_TYPE: &str = "unsupported_media_type";

impl<T, S> FromRequest<S> for JsonBody<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = Response;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        match axum::Json::<T>::from_request(request, state).await {
            Ok(axum::Json(value)) => Ok(Self(value)),
            Err(rejection) => Err(problem(&rejection)),
        }
    }
}

fn problem(rejection: &JsonRejection) -> Response {
    let code = match rejection {
        JsonRejection::JsonSyntaxError(_) => MALFORMED_JSON,
        JsonRejection::JsonDataError(_) => INVALID_BODY,
        JsonRejection::MissingJsonContentType(_) => UNSUPPORTED_MEDIA_TYPE,
        _ if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => "payload_too_large",
        _ => "body_unreadable",
    };
    let status = rejection.status();
    let body = serde_json::json!({
        "type": "about:blank",
        "title": status.canonical_reason(),
        "status": status.as_u16(),
        "detail": rejection.body_text(),
        "code": code,
    });
    (
        status,
        [("content-type", "application/problem+json")],
        body.to_string(),
    )
        .into_response()
}

/// The statuses [`JsonBody`] answers with, their `code` and meaning, for the document.
#[cfg_attr(not(feature = "utoipa"), allow(dead_code))]
pub(crate) const REJECTIONS: [(StatusCode, &str, &str); 3] = [
    (
        StatusCode::BAD_REQUEST,
        MALFORMED_JSON,
        "The body is not JSON.",
    ),
    (
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        UNSUPPORTED_MEDIA_TYPE,
        "The body is not declared `application/json`.",
    ),
    (
        StatusCode::UNPROCESSABLE_ENTITY,
        INVALID_BODY,
        "The body is JSON, but not the expected object.",
    ),
];
