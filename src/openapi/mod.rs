//! The idempotency contract in a [utoipa](https://docs.rs/utoipa) 5 OpenAPI document
//! (feature `utoipa`): callers of the API learn the header from the document, not only
//! from prose.
//!
//! [`IdempotencyDoc`] adds, to every operation it is given:
//!
//! - the `Idempotency-Key` header parameter, required or optional, with its syntax
//!   (1–255 printable ASCII characters, bare or as a quoted Structured Field string);
//! - the layer's own problem responses (`application/problem+json`, RFC 9457) for 400, 408,
//!   409, 413, 422 and 503 (and 429 with [`attempt_limit`](IdempotencyDoc::attempt_limit)), each with
//!   the `code` values the layer sends with that status and, for 409, 429 and 503, the
//!   `Retry-After` header;
//! - the `Idempotent-Replayed` response header on the operation's own responses.
//!
//! ```
//! use axum_idempotency::openapi::IdempotencyDoc;
//! use http::Method;
//! use utoipa::openapi::path::{HttpMethod, OperationBuilder};
//! use utoipa::openapi::{OpenApiBuilder, PathItem, PathsBuilder, ResponseBuilder};
//!
//! let create_order = OperationBuilder::new()
//!     .response("201", ResponseBuilder::new().description("The order was created"));
//! let mut openapi = OpenApiBuilder::new()
//!     .paths(PathsBuilder::new().path("/orders", PathItem::new(HttpMethod::Post, create_order)))
//!     .build();
//!
//! IdempotencyDoc::new()
//!     .operation(Method::POST, "/orders")
//!     .apply(&mut openapi)?;
//!
//! let json = serde_json::to_value(&openapi)?;
//! let post = &json["paths"]["/orders"]["post"];
//! assert_eq!(post["parameters"][0]["name"], "Idempotency-Key");
//! assert_eq!(post["parameters"][0]["required"], true);
//! assert!(post["responses"]["409"]["content"]["application/problem+json"].is_object());
//! assert!(post["responses"]["201"]["headers"]["Idempotent-Replayed"].is_object());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! With `#[derive(OpenApi)]`, the same value is a modifier:
//! `#[openapi(paths(...), modifiers(&IDEMPOTENT))]`, with a `static IDEMPOTENT: LazyLock<IdempotencyDoc>`
//! (see [`IdempotencyDoc`]'s `Modify` implementation).

use http::{Method, StatusCode};
use serde_json::Value;
use utoipa::openapi::header::HeaderBuilder;
use utoipa::openapi::path::{Operation, ParameterBuilder, ParameterIn};
use utoipa::openapi::{
    Content, Header, ObjectBuilder, OpenApi, PathItem, RefOr, Required, Response, Schema, Type,
};

use crate::engine::key::MAX_KEY_LEN;
use crate::http::IdempotencyLayer;
use crate::http::rejection::RejectionKind;
use crate::store::LeaseStore;

mod error;

pub use self::error::OpenApiError;

/// The request header's name as documents spell it.
const KEY_HEADER: &str = "Idempotency-Key";
/// The response header's name as documents spell it.
const REPLAYED_HEADER: &str = "Idempotent-Replayed";
/// The media type of the layer's own responses.
const PROBLEM_JSON: &str = "application/problem+json";

/// The statuses of the layer's own answers a client of an idempotent operation must
/// handle, with what each means for it.
const PROBLEMS: [(StatusCode, &str); 6] = [
    (
        StatusCode::BAD_REQUEST,
        "The `Idempotency-Key` is missing or malformed, or the request body could not be \
         read. Fix the request; retrying it unchanged cannot succeed.",
    ),
    (
        StatusCode::REQUEST_TIMEOUT,
        "The request body did not arrive in time; nothing was done. Retry with the same key \
         and the same request.",
    ),
    (
        StatusCode::PAYLOAD_TOO_LARGE,
        "The request body is larger than the layer buffers to fingerprint it; nothing was \
         done. Retrying it unchanged cannot succeed.",
    ),
    (
        StatusCode::CONFLICT,
        "A request with this `Idempotency-Key` is still being processed. Retry after \
         `Retry-After` seconds with the same key and the same request: the retry gets the \
         first request's response.",
    ),
    (
        StatusCode::UNPROCESSABLE_ENTITY,
        "This `Idempotency-Key` was used before with a different request. A retry must send \
         the same request; a new request needs a new key.",
    ),
    (
        StatusCode::SERVICE_UNAVAILABLE,
        "The request's outcome could not be stored, or not in time; nothing was done twice. \
         Retry after `Retry-After` seconds with the same key and the same request.",
    ),
];

/// The layer's 429, sent only where [`key_attempt_limit`](crate::IdempotencyLayer::key_attempt_limit)
/// is configured.
const TOO_MANY_ATTEMPTS: (StatusCode, &str) = (
    StatusCode::TOO_MANY_REQUESTS,
    "This `Idempotency-Key` was tried too often in the last second. Retry after \
     `Retry-After` seconds with the same key and the same request.",
);

/// Declarations of the idempotency contract for chosen operations of a utoipa
/// [`OpenApi`] document.
///
/// Mark operations with [`operation`](Self::operation), then [`apply`](Self::apply) to a
/// document (or use the value as a `#[openapi(modifiers(...))]` modifier). What is added:
/// see the [module documentation](self). Problem responses the operation already declares
/// for the same status are kept: their description gains the layer's codes, a `code` enum
/// in their `application/problem+json` schema gains the layer's values, and they gain
/// `Retry-After` where the layer sends it.
///
/// ```
/// use axum_idempotency::openapi::IdempotencyDoc;
/// use http::Method;
///
/// let doc = IdempotencyDoc::new()
///     .operation(Method::POST, "/orders")
///     .operation(Method::POST, "/orders/{order_no}/pay");
/// # let _ = doc;
/// ```
#[derive(Debug, Clone)]
pub struct IdempotencyDoc {
    key_required: bool,
    attempt_limit: bool,
    operations: Vec<(Method, String)>,
}

/// The `Idempotency-Key` header's syntax, exactly as [`crate::IdempotencyKey::parse`]
/// accepts it: a bare token of 1 to [`MAX_KEY_LEN`] printable ASCII characters without
/// space or `"`, or a Structured Field string whose content is 1 to [`MAX_KEY_LEN`]
/// characters once unescaped (printable ASCII with spaces, `"` and `\` escaped by a
/// backslash).
fn key_pattern() -> String {
    format!(r#"^(?:[!#-~]{{1,{MAX_KEY_LEN}}}|"(?:[ !#-\[\]-~]|\\["\\]){{1,{MAX_KEY_LEN}}}")$"#)
}

/// The longest header value [`crate::IdempotencyKey::parse`] accepts: a quoted key of
/// [`MAX_KEY_LEN`] characters, every one escaped.
const MAX_KEY_HEADER_LEN: usize = 2 * MAX_KEY_LEN + 2;

impl Default for IdempotencyDoc {
    fn default() -> Self {
        Self::new()
    }
}

impl IdempotencyDoc {
    /// No operation marked yet; the key declared required (the layer's default).
    ///
    /// ```
    /// let doc = axum_idempotency::openapi::IdempotencyDoc::new();
    /// # let _ = doc;
    /// ```
    pub fn new() -> Self {
        Self {
            key_required: true,
            attempt_limit: false,
            operations: Vec::new(),
        }
    }

    /// No operation marked yet; the key and the 429 answer declared as `layer` is
    /// configured ([`key_required`](crate::IdempotencyLayer::key_required),
    /// [`key_attempt_limit`](crate::IdempotencyLayer::key_attempt_limit)), so the document
    /// cannot drift from the layer.
    ///
    /// ```no_run
    /// # fn f(pool: deadpool_postgres::Pool) {
    /// use axum_idempotency::IdempotencyLayer;
    /// use axum_idempotency::openapi::IdempotencyDoc;
    ///
    /// let layer = IdempotencyLayer::new(pool).key_required(false);
    /// let doc = IdempotencyDoc::for_layer(&layer).operation(http::Method::POST, "/orders");
    /// # let _ = doc; }
    /// ```
    pub fn for_layer<D: LeaseStore>(layer: &IdempotencyLayer<D>) -> Self {
        let (key_required, attempt_limit) = layer.contract();
        Self::new()
            .key_required(key_required)
            .attempt_limit(attempt_limit)
    }

    /// Declares the key required (the default) or optional, as the layer is configured.
    ///
    /// ```
    /// let doc = axum_idempotency::openapi::IdempotencyDoc::new().key_required(false);
    /// # let _ = doc;
    /// ```
    pub fn key_required(mut self, required: bool) -> Self {
        self.key_required = required;
        self
    }

    /// Also declares the 429 `too_many_attempts` answer (with `Retry-After`), for a layer
    /// configured with [`key_attempt_limit`](crate::IdempotencyLayer::key_attempt_limit).
    /// Default: off.
    ///
    /// ```
    /// let doc = axum_idempotency::openapi::IdempotencyDoc::new().attempt_limit(true);
    /// # let _ = doc;
    /// ```
    #[must_use]
    pub fn attempt_limit(mut self, declared: bool) -> Self {
        self.attempt_limit = declared;
        self
    }

    /// Marks the operation of `method` on `path` (as the document spells it,
    /// `/orders/{order_no}`) as idempotent.
    ///
    /// ```
    /// use http::Method;
    ///
    /// let doc = axum_idempotency::openapi::IdempotencyDoc::new().operation(Method::PATCH, "/orders/{order_no}");
    /// # let _ = doc;
    /// ```
    pub fn operation(mut self, method: Method, path: impl Into<String>) -> Self {
        self.operations.push((method, path.into()));
        self
    }

    /// Adds the declarations to every marked operation of `openapi`. Checks every mark
    /// first: a mark that names no operation of the document changes nothing and is an
    /// error, so a renamed route does not silently lose its declarations.
    ///
    /// ```
    /// use axum_idempotency::openapi::{IdempotencyDoc, OpenApiError};
    /// use http::Method;
    ///
    /// let mut openapi = utoipa::openapi::OpenApiBuilder::new().build();
    /// let error = IdempotencyDoc::new()
    ///     .operation(Method::POST, "/orders")
    ///     .apply(&mut openapi)
    ///     .unwrap_err();
    /// assert!(matches!(error, OpenApiError::UnknownOperation { .. }));
    /// ```
    pub fn apply(&self, openapi: &mut OpenApi) -> Result<(), OpenApiError> {
        for (method, path) in &self.operations {
            let found = openapi
                .paths
                .paths
                .get_mut(path)
                .and_then(|item| operation_mut(item, method));
            if found.is_none() {
                return Err(OpenApiError::UnknownOperation {
                    method: method.clone(),
                    path: path.clone(),
                });
            }
        }
        for (method, path) in &self.operations {
            if let Some(operation) = openapi
                .paths
                .paths
                .get_mut(path)
                .and_then(|item| operation_mut(item, method))
            {
                self.declare(operation);
            }
        }
        Ok(())
    }

    fn declare(&self, operation: &mut Operation) {
        // The operation's own responses: any of them may be a replay.
        for response in operation.responses.responses.values_mut() {
            if let RefOr::T(response) = response {
                response
                    .headers
                    .entry(REPLAYED_HEADER.to_owned())
                    .or_insert_with(replayed_header);
            }
        }
        let parameters = operation.parameters.get_or_insert_with(Vec::new);
        parameters.retain(|parameter| {
            !(parameter.parameter_in == ParameterIn::Header
                && parameter.name.eq_ignore_ascii_case(KEY_HEADER))
        });
        parameters.push(self.key_parameter());
        let limit = self.attempt_limit.then_some(TOO_MANY_ATTEMPTS);
        for (status, meaning) in PROBLEMS.into_iter().chain(limit) {
            let codes = codes(status);
            let description = format!(
                "{meaning} `code`: {}.",
                codes
                    .iter()
                    .map(|code| format!("`{code}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            let retry_after = matches!(
                status,
                StatusCode::CONFLICT
                    | StatusCode::TOO_MANY_REQUESTS
                    | StatusCode::SERVICE_UNAVAILABLE
            );
            match operation
                .responses
                .responses
                .entry(status.as_str().to_owned())
            {
                std::collections::btree_map::Entry::Vacant(entry) => {
                    let mut response = Response::new(description);
                    response
                        .content
                        .insert(PROBLEM_JSON.to_owned(), problem_content(status, &codes));
                    if retry_after {
                        response
                            .headers
                            .insert("Retry-After".to_owned(), retry_after_header());
                    }
                    entry.insert(RefOr::T(response));
                }
                std::collections::btree_map::Entry::Occupied(mut entry) => {
                    // A component reference is shared with other operations: left as it is.
                    if let RefOr::T(response) = entry.get_mut() {
                        merge(response, &description, status, &codes, retry_after);
                    }
                }
            }
        }
    }

    fn key_parameter(&self) -> utoipa::openapi::path::Parameter {
        let schema = ObjectBuilder::new()
            .schema_type(Type::String)
            .min_length(Some(1))
            .max_length(Some(MAX_KEY_HEADER_LEN))
            .pattern(Some(key_pattern()))
            .examples([Value::from("8e03978e-40d5-43e8-bc93-6894a57f9324")])
            .build();
        ParameterBuilder::new()
            .name(KEY_HEADER)
            .parameter_in(ParameterIn::Header)
            .required(if self.key_required {
                Required::True
            } else {
                Required::False
            })
            .description(Some(format!(
                "Identifies one operation: the client chooses a unique value (a UUID v4 or v7) \
                 and sends it, unchanged, with every retry of that operation. A retry with the \
                 same key and the same request gets the first response back, with \
                 `{REPLAYED_HEADER}: true`, and the operation takes effect once. 1 to \
                 {MAX_KEY_LEN} printable ASCII characters; the key may also be sent as a \
                 Structured Field string (`\"order 42\"`), which may contain spaces.{}",
                if self.key_required {
                    ""
                } else {
                    " Without it, the request runs without protection against duplicates."
                }
            )))
            .schema(Some(schema))
            .build()
    }
}

/// `utoipa::Modify`: [`IdempotencyDoc::apply`] from `#[openapi(modifiers(...))]`. A mark that
/// names no operation is logged (at error level) and nothing is added; call
/// [`apply`](IdempotencyDoc::apply) to get the error instead.
///
/// ```
/// use std::sync::LazyLock;
///
/// use axum_idempotency::openapi::IdempotencyDoc;
/// use http::Method;
/// use utoipa::Modify;
///
/// static IDEMPOTENT: LazyLock<IdempotencyDoc> =
///     LazyLock::new(|| IdempotencyDoc::new().operation(Method::POST, "/orders"));
///
/// let mut openapi = utoipa::openapi::OpenApiBuilder::new().build();
/// IDEMPOTENT.modify(&mut openapi); // what `modifiers(&IDEMPOTENT)` does
/// ```
impl utoipa::Modify for IdempotencyDoc {
    fn modify(&self, openapi: &mut OpenApi) {
        if let Err(error) = self.apply(openapi) {
            tracing::error!(%error, "the idempotency declarations were not added");
        }
    }
}

fn operation_mut<'a>(item: &'a mut PathItem, method: &Method) -> Option<&'a mut Operation> {
    let slot = match *method {
        Method::GET => &mut item.get,
        Method::PUT => &mut item.put,
        Method::POST => &mut item.post,
        Method::DELETE => &mut item.delete,
        Method::OPTIONS => &mut item.options,
        Method::HEAD => &mut item.head,
        Method::PATCH => &mut item.patch,
        Method::TRACE => &mut item.trace,
        _ => return None,
    };
    slot.as_mut()
}

/// The `code` values the layer sends with `status`, from the crate's own list.
fn codes(status: StatusCode) -> Vec<&'static str> {
    RejectionKind::ALL
        .into_iter()
        .filter(|kind| kind.status() == status)
        .map(RejectionKind::code)
        .collect()
}

fn string_schema() -> ObjectBuilder {
    ObjectBuilder::new().schema_type(Type::String)
}

/// The RFC 9457 document the layer sends with `status`.
fn problem_content(status: StatusCode, codes: &[&str]) -> Content {
    let schema = ObjectBuilder::new()
        .schema_type(Type::Object)
        .description(Some("An RFC 9457 problem document."))
        .property("type", string_schema())
        .property("title", string_schema())
        .property(
            "status",
            ObjectBuilder::new()
                .schema_type(Type::Integer)
                .enum_values(Some([status.as_u16()])),
        )
        .property(
            "detail",
            string_schema().description(Some("A sentence for humans; never contains the key.")),
        )
        .property(
            "code",
            string_schema()
                .description(Some("A stable, machine-readable name of what went wrong."))
                .enum_values(Some(codes.iter().copied())),
        )
        .required("type")
        .required("title")
        .required("status")
        .required("detail")
        .required("code")
        .build();
    Content::new(Some(schema))
}

fn retry_after_header() -> Header {
    HeaderBuilder::new()
        .schema(
            ObjectBuilder::new()
                .schema_type(Type::Integer)
                .minimum(Some(0)),
        )
        .description(Some(
            "Seconds to wait before retrying with the same key and the same request.",
        ))
        .build()
}

fn replayed_header() -> Header {
    HeaderBuilder::new()
        .schema(string_schema().enum_values(Some(["true"])))
        .description(Some(
            "`true` when this response is the stored response to an earlier request with the \
             same `Idempotency-Key`: the operation took effect once, with that request. Absent \
             otherwise.",
        ))
        .build()
}

/// Adds the layer's side to a response the operation already declares for `status`.
fn merge(
    response: &mut Response,
    description: &str,
    status: StatusCode,
    codes: &[&str],
    retry_after: bool,
) {
    if !response.description.contains(description) {
        if !response.description.is_empty() {
            response.description.push_str("\n\n");
        }
        response.description.push_str(description);
    }
    if retry_after {
        response
            .headers
            .entry("Retry-After".to_owned())
            .or_insert_with(retry_after_header);
    }
    match response.content.get_mut(PROBLEM_JSON) {
        None => {
            response
                .content
                .insert(PROBLEM_JSON.to_owned(), problem_content(status, codes));
        }
        Some(content) => {
            let code = match &mut content.schema {
                Some(RefOr::T(Schema::Object(object))) => object.properties.get_mut("code"),
                _ => None,
            };
            if let Some(RefOr::T(Schema::Object(code))) = code {
                if let Some(values) = &mut code.enum_values {
                    for value in codes {
                        let value = Value::from(*value);
                        if !values.contains(&value) {
                            values.push(value);
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_come_from_the_rejection_list() {
        assert_eq!(
            codes(StatusCode::BAD_REQUEST),
            ["missing_key", "invalid_key", "body_unreadable"]
        );
        assert_eq!(codes(StatusCode::CONFLICT), ["in_flight", "lease_lost"]);
        assert_eq!(codes(StatusCode::UNPROCESSABLE_ENTITY), ["key_reused"]);
        assert_eq!(
            codes(StatusCode::SERVICE_UNAVAILABLE),
            ["store_unavailable", "commit_failed", "handler_timed_out"]
        );
        assert_eq!(codes(StatusCode::TOO_MANY_REQUESTS), ["too_many_attempts"]);
    }

    #[test]
    fn the_429_is_declared_only_for_a_limited_layer() {
        use utoipa::openapi::path::{OperationBuilder, PathItem, PathsBuilder};
        let document = || {
            let operation = OperationBuilder::new()
                .response("201", Response::new("Created"))
                .build();
            utoipa::openapi::OpenApiBuilder::new()
                .paths(PathsBuilder::new().path(
                    "/orders",
                    PathItem::new(utoipa::openapi::HttpMethod::Post, operation),
                ))
                .build()
        };
        for limited in [false, true] {
            let mut openapi = document();
            IdempotencyDoc::new()
                .attempt_limit(limited)
                .operation(Method::POST, "/orders")
                .apply(&mut openapi)
                .unwrap();
            let json = serde_json::to_value(&openapi).unwrap();
            let responses = &json["paths"]["/orders"]["post"]["responses"];
            assert_eq!(responses["429"].is_object(), limited, "{responses}");
            if limited {
                assert!(responses["429"]["headers"]["Retry-After"].is_object());
                assert!(
                    responses["429"]["description"]
                        .as_str()
                        .unwrap()
                        .contains("too_many_attempts")
                );
            }
        }
    }
}
