//! What the consumer's work gets: one delivered [`Message`]; and how the consumer fails.

use std::fmt;

use bytes::Bytes;

use crate::engine::amqp::Unreachable;

/// One delivery, as the work sees it. Cloning is cheap (the payload is shared).
#[derive(Debug, Clone)]
pub struct Message {
    pub(super) id: String,
    pub(super) payload: Bytes,
    pub(super) redelivered: bool,
    pub(super) delivered_before: u32,
    pub(super) routing_key: String,
}

impl Message {
    /// The message id the Inbox records.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The body.
    pub fn payload(&self) -> &[u8] {
        &self.payload
    }

    /// The body as JSON.
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_slice(&self.payload)
    }

    /// Whether the broker delivered this message before (to this or another consumer).
    pub fn redelivered(&self) -> bool {
        self.redelivered
    }

    /// Deliveries of this message before this one, as a quorum queue counts them
    /// (`x-delivery-count`); 0 on a classic queue.
    pub fn delivered_before(&self) -> u32 {
        self.delivered_before
    }

    /// The routing key it was published with.
    pub fn routing_key(&self) -> &str {
        &self.routing_key
    }
}

/// Why [`Consumer::start`](super::Consumer::start) did not start.
#[derive(Debug)]
#[non_exhaustive]
pub enum ConsumerError {
    /// No node of the broker answered.
    Unreachable(Unreachable),
    /// A node answered, but refused the channel, the prefetch or the consumer (for
    /// example: no such queue).
    Broker(lapin::Error),
}

impl fmt::Display for ConsumerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unreachable(_) => f.write_str("could not connect to the broker"),
            Self::Broker(_) => f.write_str("the broker refused the consumer"),
        }
    }
}

impl std::error::Error for ConsumerError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Unreachable(e) => Some(e),
            Self::Broker(e) => Some(e),
        }
    }
}
