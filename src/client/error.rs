//! [`ClientError`]: why the middleware returned no response.

use std::fmt;
use std::time::Duration;

/// Why [`IdempotencyMiddleware`](super::IdempotencyMiddleware) returned no response. It reaches the caller inside
/// [`reqwest_middleware::Error::Middleware`]; [`ClientError::find`] gets it back.
///
/// ```no_run
/// use axum_idempotency::client::ClientError;
///
/// # async fn run(client: reqwest_middleware::ClientWithMiddleware) {
/// match client.post("http://127.0.0.1:3000/orders").body("{}").send().await {
///     Ok(response) => println!("{}", response.status()),
///     Err(error) => match ClientError::find(&error) {
///         Some(ClientError::StreamedBody) => eprintln!("buffer the body first"),
///         Some(failure) => eprintln!("gave up after {} tries: {failure}", failure.tries()),
///         None => eprintln!("{error}"),
///     },
/// }
/// # }
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum ClientError {
    /// The request's body is a stream, which cannot be sent twice: nothing was sent. Give the
    /// request a buffered body (bytes, a string, JSON).
    StreamedBody,
    /// No try got an answer: the last one failed with `source`, and it was not worth
    /// retrying, or the tries or the time ran out.
    Failed {
        /// Tries made.
        tries: u32,
        /// The last try's error.
        source: reqwest_middleware::Error,
    },
    /// The overall deadline passed while a try was running (it was cancelled) or before one
    /// could start.
    DeadlineExceeded {
        /// Tries made, the cancelled one included.
        tries: u32,
        /// The deadline that passed.
        deadline: Duration,
    },
}

impl ClientError {
    /// The `ClientError` inside an error of a client with the middleware, if there is one.
    ///
    /// ```no_run
    /// use axum_idempotency::client::ClientError;
    ///
    /// # fn show(error: &reqwest_middleware::Error) {
    /// if let Some(ClientError::DeadlineExceeded { tries, .. }) = ClientError::find(error) {
    ///     eprintln!("out of time after {tries} tries");
    /// }
    /// # }
    /// ```
    pub fn find(error: &reqwest_middleware::Error) -> Option<&Self> {
        match error {
            reqwest_middleware::Error::Middleware(error) => error.downcast_ref(),
            reqwest_middleware::Error::Reqwest(_) => None,
        }
    }

    /// Tries made: 0 when nothing was sent.
    ///
    /// ```
    /// use axum_idempotency::client::ClientError;
    ///
    /// assert_eq!(ClientError::StreamedBody.tries(), 0);
    /// ```
    pub fn tries(&self) -> u32 {
        match self {
            Self::StreamedBody => 0,
            Self::Failed { tries, .. } | Self::DeadlineExceeded { tries, .. } => *tries,
        }
    }
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::StreamedBody => f.write_str(
                "an idempotent request needs a buffered body to be retried, and this one is \
                 streamed; nothing was sent",
            ),
            Self::Failed { tries, .. } => {
                write!(f, "the request failed after {tries} tries")
            }
            Self::DeadlineExceeded { tries, deadline } => write!(
                f,
                "the request had no answer within its deadline of {deadline:?} ({tries} tries)"
            ),
        }
    }
}

impl std::error::Error for ClientError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Failed { source, .. } => Some(source),
            Self::StreamedBody | Self::DeadlineExceeded { .. } => None,
        }
    }
}
