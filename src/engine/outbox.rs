//! The outbox's driver-neutral rules: what a message is before it is enqueued and after a
//! relay locked it, and which messages of a locked batch a relay may publish, in which
//! order.

use std::collections::HashMap;
use std::fmt;

use serde::Serialize;

use crate::engine::key::{KeyError, validate_message_id};

/// Longest topic (an AMQP routing key is a short string: 255 bytes).
const MAX_TOPIC_LEN: usize = 255;

/// A message to publish once the transaction that enqueues it commits.
///
/// ```
/// use axum_idempotency::outbox::OutboxMessage;
///
/// #[derive(serde::Serialize)]
/// struct PaymentSucceeded { user_id: i64, coupon_code: &'static str }
///
/// let message = OutboxMessage::json(
///     "payment-succeeded",
///     &PaymentSucceeded { user_id: 1001, coupon_code: "PAID_THANKS" },
/// )?
/// // Stable across retries of the request: enqueued twice, it is kept once.
/// .id("ORD-7-payment")
/// // Messages of one key are published in commit order.
/// .ordering_key("user-1001");
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Clone)]
pub struct OutboxMessage {
    pub(crate) id: Option<String>,
    pub(crate) topic: String,
    pub(crate) ordering_key: Option<String>,
    pub(crate) content_type: Option<String>,
    pub(crate) payload: Vec<u8>,
}

impl OutboxMessage {
    /// A message for `topic` (for RabbitMQ, the routing key) with a raw payload. Its id is
    /// a random UUID unless [`id`](Self::id) sets one.
    pub fn new(topic: impl Into<String>, payload: impl Into<Vec<u8>>) -> Self {
        Self {
            id: None,
            topic: topic.into(),
            ordering_key: None,
            content_type: None,
            payload: payload.into(),
        }
    }

    /// A message whose payload is `value` as JSON, with content type `application/json`.
    pub fn json<T: Serialize + ?Sized>(
        topic: impl Into<String>,
        value: &T,
    ) -> Result<Self, serde_json::Error> {
        Ok(Self::new(topic, serde_json::to_vec(value)?).content_type("application/json"))
    }

    /// The message id the consumer deduplicates on (the AMQP `message_id`): 1–255
    /// printable ASCII characters without spaces, like an `Idempotency-Key`. Enqueueing an
    /// id that is already in the outbox is a no-op, so an id derived from the operation
    /// (`IdempotentTx::derive_key`) keeps a repeated enqueue from sending twice.
    #[must_use]
    pub fn id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(id.into());
        self
    }

    /// Messages that share an ordering key are published in the order their transactions
    /// committed (producers of one key wait for each other's commit); messages without a
    /// key, or of different keys, are published in parallel.
    #[must_use]
    pub fn ordering_key(mut self, key: impl Into<String>) -> Self {
        self.ordering_key = Some(key.into());
        self
    }

    /// The payload's content type, passed to the broker.
    #[must_use]
    pub fn content_type(mut self, content_type: impl Into<String>) -> Self {
        self.content_type = Some(content_type.into());
        self
    }

    /// Checks the id, topic and ordering key before anything reaches the database.
    pub(crate) fn check(&self) -> Result<(), MessageError> {
        if let Some(id) = &self.id {
            validate_message_id(id).map_err(MessageError::Id)?;
        }
        if self.topic.is_empty()
            || self.topic.len() > MAX_TOPIC_LEN
            || self.topic.chars().any(char::is_control)
        {
            return Err(MessageError::Topic);
        }
        if self
            .ordering_key
            .as_ref()
            .is_some_and(|key| key.is_empty() || key.len() > MAX_TOPIC_LEN)
        {
            return Err(MessageError::OrderingKey);
        }
        Ok(())
    }
}

impl fmt::Debug for OutboxMessage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OutboxMessage")
            .field("id", &self.id)
            .field("topic", &self.topic)
            .field("ordering_key", &self.ordering_key)
            .field("content_type", &self.content_type)
            .field("payload_bytes", &self.payload.len())
            .finish()
    }
}

/// Why an [`OutboxMessage`] was refused before it reached the database.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum MessageError {
    /// The id breaks the message-id rules (see [`OutboxMessage::id`]).
    Id(KeyError),
    /// The topic is empty, longer than 255 bytes, or holds a control character.
    Topic,
    /// The ordering key is empty or longer than 255 bytes.
    OrderingKey,
}

impl fmt::Display for MessageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Id(e) => write!(f, "invalid outbox message id: {e}"),
            Self::Topic => {
                f.write_str("an outbox topic must be 1-255 bytes without control characters")
            }
            Self::OrderingKey => f.write_str("an outbox ordering key must be 1-255 bytes"),
        }
    }
}

impl std::error::Error for MessageError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Id(e) => Some(e),
            _ => None,
        }
    }
}

/// What an enqueue did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Enqueued {
    /// The message's id: the one it was given, or the generated one.
    pub message_id: String,
    /// The id was already in the outbox; nothing was added.
    pub duplicate: bool,
}

impl Enqueued {
    /// The enqueue's answer from the id its insert returned: none when the message's id
    /// was already in the outbox.
    pub(crate) fn from_insert(message: &OutboxMessage, inserted: Option<String>) -> Self {
        match inserted {
            Some(message_id) => Self {
                message_id,
                duplicate: false,
            },
            None => Self {
                message_id: message.id.clone().unwrap_or_default(),
                duplicate: true,
            },
        }
    }
}

/// A committed message a relay locked and hands to its
/// [`Publisher`](crate::outbox::Publisher).
#[derive(Clone)]
pub struct Outgoing {
    pub(crate) seq: i64,
    pub(crate) message_id: String,
    pub(crate) topic: String,
    pub(crate) ordering_key: Option<String>,
    pub(crate) content_type: Option<String>,
    pub(crate) payload: Vec<u8>,
    pub(crate) attempts: i32,
    /// Seconds since the row was inserted, when the batch was locked.
    pub(crate) age_seconds: f64,
}

impl Outgoing {
    /// The message id: publish it as the broker's message id (AMQP `message_id`), so the
    /// consumer's [`Inbox`](crate::Inbox) recognises a message published twice.
    pub fn message_id(&self) -> &str {
        &self.message_id
    }

    /// The topic (for RabbitMQ, the routing key).
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// The ordering key, if the message has one.
    pub fn ordering_key(&self) -> Option<&str> {
        self.ordering_key.as_deref()
    }

    /// The payload's content type, if given.
    pub fn content_type(&self) -> Option<&str> {
        self.content_type.as_deref()
    }

    /// The payload.
    pub fn payload(&self) -> &[u8] {
        &self.payload
    }

    /// Earlier attempts the broker refused.
    pub fn attempts(&self) -> u32 {
        u32::try_from(self.attempts).unwrap_or(0)
    }
}

impl fmt::Debug for Outgoing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Outgoing")
            .field("message_id", &self.message_id)
            .field("topic", &self.topic)
            .field("ordering_key", &self.ordering_key)
            .field("attempts", &self.attempts)
            .field("payload_bytes", &self.payload.len())
            .finish_non_exhaustive()
    }
}

/// The parameters of the barrier query for a locked batch (its ordering keys, and its
/// seqs to leave out), or `None` when no message of it has a key.
#[cfg_attr(
    not(any(feature = "postgres", feature = "sqlx", feature = "mysql")),
    allow(dead_code)
)]
pub(crate) fn barrier_params(rows: &[Outgoing]) -> Option<(Vec<&str>, Vec<i64>)> {
    let keys: Vec<&str> = rows
        .iter()
        .filter_map(|r| r.ordering_key.as_deref())
        .collect();
    (!keys.is_empty()).then(|| (keys, rows.iter().map(|r| r.seq).collect()))
}

/// A locked batch split into publishing lanes: each lane is published in order, one
/// message after the other's confirm; lanes run in parallel. Messages of one ordering key
/// share a lane, up to the first pending message of that key outside the batch (another
/// relay holds it, or it waits for its next attempt): the rest of that key stays pending
/// for a later batch. A message without a key is a lane of its own.
pub(crate) fn lanes(rows: Vec<Outgoing>, barriers: &HashMap<String, i64>) -> Plan {
    let mut keyed: HashMap<String, usize> = HashMap::new();
    let mut plan = Plan {
        lanes: Vec::new(),
        held_back: 0,
    };
    for row in rows {
        let Some(key) = row.ordering_key.clone() else {
            plan.lanes.push(vec![row]);
            continue;
        };
        if barriers.get(&key).is_some_and(|&first| first < row.seq) {
            plan.held_back += 1;
            continue;
        }
        match keyed.get(&key) {
            Some(&lane) => plan.lanes[lane].push(row),
            None => {
                keyed.insert(key, plan.lanes.len());
                plan.lanes.push(vec![row]);
            }
        }
    }
    plan
}

/// What a relay publishes of a batch.
#[derive(Debug)]
pub(crate) struct Plan {
    pub(crate) lanes: Vec<Vec<Outgoing>>,
    /// Messages left pending behind an earlier message of their key.
    pub(crate) held_back: usize,
}

/// A batch a relay locked: its rows, and for each ordering key among them the first
/// pending message of that key outside the batch. The transaction holding the row locks
/// ends in [`Store::outbox_settle`](crate::store::Store::outbox_settle).
#[derive(Debug)]
pub struct OutboxBatch<C> {
    pub(crate) conn: C,
    pub(crate) rows: Vec<Outgoing>,
    pub(crate) barriers: HashMap<String, i64>,
}

/// How a relay settles a batch: which messages the broker confirmed, which it refused
/// (with the error), and the retry rules for the refused ones.
#[derive(Debug)]
pub struct Settlement<'a> {
    pub(crate) sent: &'a [i64],
    pub(crate) refused: &'a [i64],
    pub(crate) errors: &'a [String],
    pub(crate) max_attempts: i32,
    pub(crate) retry_base_seconds: f64,
    pub(crate) retry_cap_seconds: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(seq: i64, key: Option<&str>) -> Outgoing {
        Outgoing {
            seq,
            message_id: format!("m{seq}"),
            topic: "t".to_owned(),
            ordering_key: key.map(str::to_owned),
            content_type: None,
            payload: Vec::new(),
            attempts: 0,
            age_seconds: 0.0,
        }
    }

    fn seqs(plan: &Plan) -> Vec<Vec<i64>> {
        plan.lanes
            .iter()
            .map(|lane| lane.iter().map(|row| row.seq).collect())
            .collect()
    }

    #[test]
    fn a_key_shares_one_lane_in_seq_order_and_unkeyed_messages_run_alone() {
        let rows = vec![
            row(1, Some("a")),
            row(2, None),
            row(3, Some("b")),
            row(4, Some("a")),
            row(5, None),
            row(6, Some("a")),
        ];
        let plan = lanes(rows, &HashMap::new());
        assert_eq!(seqs(&plan), vec![vec![1, 4, 6], vec![2], vec![3], vec![5]]);
        assert_eq!(plan.held_back, 0);
    }

    #[test]
    fn a_key_stops_at_its_first_pending_message_outside_the_batch() {
        // Another relay holds seq 112 of key "k": this batch may publish 17 but not 217.
        let rows = vec![row(17, Some("k")), row(50, Some("j")), row(217, Some("k"))];
        let barriers = HashMap::from([("k".to_owned(), 112)]);
        let plan = lanes(rows, &barriers);
        assert_eq!(seqs(&plan), vec![vec![17], vec![50]]);
        assert_eq!(plan.held_back, 1);

        // A barrier before every message of the key holds them all back.
        let rows = vec![row(217, Some("k")), row(300, Some("k"))];
        let plan = lanes(rows, &barriers);
        assert!(plan.lanes.is_empty());
        assert_eq!(plan.held_back, 2);
    }

    #[test]
    fn messages_are_checked_before_they_reach_the_database() {
        assert_eq!(OutboxMessage::new("t", "p").check(), Ok(()));
        assert!(matches!(
            OutboxMessage::new("t", "p").id("has space").check(),
            Err(MessageError::Id(KeyError::InvalidCharacter { position: 3 }))
        ));
        assert_eq!(
            OutboxMessage::new("", "p").check(),
            Err(MessageError::Topic)
        );
        assert_eq!(
            OutboxMessage::new("a\nb", "p").check(),
            Err(MessageError::Topic)
        );
        assert_eq!(
            OutboxMessage::new("t", "p").ordering_key("").check(),
            Err(MessageError::OrderingKey)
        );
        let json = OutboxMessage::json("t", &serde_json::json!({"a": 1})).unwrap();
        assert_eq!(json.content_type.as_deref(), Some("application/json"));
        assert_eq!(json.payload, br#"{"a":1}"#);
    }
}
