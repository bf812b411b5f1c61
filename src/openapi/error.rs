//! [`OpenApiError`], why [`IdempotencyDoc::apply`](super::IdempotencyDoc::apply) changed
//! nothing.

use std::fmt;

use http::Method;

/// Why [`IdempotencyDoc::apply`](super::IdempotencyDoc::apply) changed nothing.
///
/// ```
/// use axum_idempotency::openapi::OpenApiError;
///
/// # fn show(error: OpenApiError) {
/// match error {
///     OpenApiError::UnknownOperation { method, path } => eprintln!("no {method} {path}"),
///     other => eprintln!("{other}"),
/// }
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum OpenApiError {
    /// A marked operation is not in the document (or its method has no place in an OpenAPI
    /// path item, such as `CONNECT`).
    UnknownOperation {
        /// The marked method.
        method: Method,
        /// The marked path.
        path: String,
    },
}

impl fmt::Display for OpenApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::UnknownOperation { method, path } => write!(
                f,
                "the OpenAPI document has no operation {method} {path} to declare idempotent"
            ),
        }
    }
}

impl std::error::Error for OpenApiError {}
