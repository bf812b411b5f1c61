//! The request body, read whole before the handler runs: bounded in size (`body_limit`,
//! by `Content-Length` and while streaming) and in time (`body_timeout`).

use bytes::Bytes;
use http::header;
use http_body_util::{BodyExt, LengthLimitError, Limited};

use crate::http::config::Config;
use crate::http::rejection::{Rejection, RejectionKind};

/// Reads the whole request body, bounded in size and time.
pub(super) async fn buffer_body<D, B>(
    config: &Config<D>,
    headers: &http::HeaderMap,
    body: B,
) -> Result<Bytes, Rejection>
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    let too_large = || {
        Rejection::new(
            RejectionKind::PayloadTooLarge,
            format!(
                "the request body is larger than the {} bytes allowed",
                config.body_limit
            ),
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u64>().ok());
    if declared.is_some_and(|len| len > config.body_limit as u64) {
        return Err(too_large());
    }
    let collect = Limited::new(body, config.body_limit).collect();
    match tokio::time::timeout(config.body_timeout, collect).await {
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(e)) if e.is::<LengthLimitError>() => Err(too_large()),
        Ok(Err(e)) => Err(Rejection::new(
            RejectionKind::BodyUnreadable,
            "the request body could not be read",
        )
        .with_source(BodyError(e))),
        Err(_elapsed) => Err(Rejection::new(
            RejectionKind::BodyTimeout,
            "the request body did not arrive in time",
        )),
    }
}

/// A body error, kept as the rejection's source.
#[derive(Debug)]
struct BodyError(axum::BoxError);

impl std::fmt::Display for BodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for BodyError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.0)
    }
}
