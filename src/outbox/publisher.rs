//! The seam between the relay and a broker.

use std::fmt;
use std::future::Future;

use crate::engine::outbox::Outgoing;

/// Publishes one message and resolves once the broker has taken responsibility for it
/// (for RabbitMQ: the publisher confirm). The relay marks a message SENT only after this
/// returned `Ok`.
///
/// `RabbitPublisher` (feature `rabbitmq`) is the one the
/// crate ships; any other broker plugs in here. Calls for messages of different ordering
/// keys run concurrently, so an implementation should be able to pipeline them.
///
/// ```
/// use axum_idempotency::outbox::{Outgoing, PublishError, Publisher};
///
/// /// Appends every message to a log file (a stand-in for a broker client).
/// struct FilePublisher(std::path::PathBuf);
///
/// impl Publisher for FilePublisher {
///     async fn publish(&self, message: &Outgoing) -> Result<(), PublishError> {
///         use std::io::Write;
///         let mut file = std::fs::OpenOptions::new()
///             .append(true)
///             .create(true)
///             .open(&self.0)
///             // Worth retrying later: no attempt is counted.
///             .map_err(PublishError::unavailable)?;
///         writeln!(file, "{} {}", message.message_id(), message.topic())
///             .map_err(PublishError::unavailable)
///     }
/// }
/// ```
pub trait Publisher: Send + Sync + 'static {
    /// Publishes `message` with its [`message_id`](Outgoing::message_id) as the broker's
    /// message id.
    fn publish(&self, message: &Outgoing) -> impl Future<Output = Result<(), PublishError>> + Send;
}

/// Why a [`Publisher`] did not publish a message.
///
/// The two kinds are handled differently: while the broker is *unavailable* (down,
/// unreachable, restarting) messages wait with no attempt counted and the relay backs off;
/// a message the broker *refused* (unroutable, negatively acknowledged, too large) counts
/// an attempt, is retried later, and is parked as FAILED after `max_attempts`.
pub struct PublishError {
    kind: Kind,
    source: Box<dyn std::error::Error + Send + Sync>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Unavailable,
    Refused,
}

impl PublishError {
    /// The broker could not be reached or lost the connection: try again later, with no
    /// attempt counted against the message.
    pub fn unavailable(source: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        Self {
            kind: Kind::Unavailable,
            source: source.into(),
        }
    }

    /// The broker refused this message: count an attempt, retry later, park it after
    /// `max_attempts`.
    pub fn refused(source: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        Self {
            kind: Kind::Refused,
            source: source.into(),
        }
    }

    /// Whether the broker was unavailable (rather than refusing this message).
    pub fn is_unavailable(&self) -> bool {
        self.kind == Kind::Unavailable
    }
}

impl fmt::Debug for PublishError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PublishError")
            .field("kind", &self.kind)
            .field("source", &self.source)
            .finish()
    }
}

impl fmt::Display for PublishError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            Kind::Unavailable => write!(f, "the broker is unavailable: {}", self.source),
            Kind::Refused => write!(f, "the broker refused the message: {}", self.source),
        }
    }
}

impl std::error::Error for PublishError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.source)
    }
}
