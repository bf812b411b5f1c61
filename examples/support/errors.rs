//! How the orders examples answer a failed database call, and its log line.

use axum::http::StatusCode;

/// An error with its sources, each said once (a driver's error may repeat its source's
/// text).
pub(crate) fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(next) = source {
        let next_text = next.to_string();
        if !text.contains(&next_text) {
            text = format!("{text}: {next_text}");
        }
        source = next.source();
    }
    text
}

/// The status, problem code and detail for a failed database call: not reaching the
/// database is worth a retry (503, with `Retry-After` added by the caller); a statement
/// that failed is not (500).
pub(crate) fn database_problem(
    error: &axum_idempotency::Error,
) -> (StatusCode, &'static str, String) {
    if error.is_transient() {
        eprintln!("database unavailable: {}", chain(error));
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "database_unavailable",
            "the database is unavailable; retry later".to_owned(),
        )
    } else {
        eprintln!("database error: {}", chain(error));
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            "database_error",
            "the request failed in the database; its work was rolled back".to_owned(),
        )
    }
}
