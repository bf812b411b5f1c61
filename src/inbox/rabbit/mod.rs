//! [`Consumer`]: an [`Inbox`] over a RabbitMQ queue (feature `rabbitmq`, lapin 4) — the
//! consume loop with its acknowledgements, prefetch, reconnection and shutdown.
//!
//! | the Inbox answers | the delivery |
//! |---|---|
//! | processed, or a duplicate (done before) | ack |
//! | the work failed, panicked, or kept its transaction | nack with requeue: the broker delivers it again |
//! | gave up (`max_attempts` reached) | reject without requeue: to the queue's dead-letter exchange, if it has one |
//! | no message id (neither the AMQP property nor the body field), or an invalid one | reject without requeue |
//! | the database is unavailable, or another worker holds the message too long | kept in hand and tried again with backoff, so the broker's delivery count does not grow |
//!
//! On a quorum queue the broker counts deliveries (`x-delivery-count`); the Inbox counts a
//! delivery that ended without an outcome (the consumer died, its connection or node was
//! lost) as a failed attempt, so even a message that kills its consumer is given up after
//! `max_attempts`. The guide [`crate::guide::inbox`] explains `max_attempts` together with
//! the queue's `x-delivery-limit`.

mod delivery;
mod message;

use self::delivery::{Answer, answer, delivery_count};
pub use self::message::{ConsumerError, Message};

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use lapin::message::Delivery;
use lapin::options::{BasicCancelOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Connection};
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;

use super::{Inbox, InboxError, Outcome};
use crate::engine::amqp::Brokers;
pub use crate::engine::amqp::Unreachable;
use crate::store::{IdempotentTx, InboxStore};

/// Runs an [`Inbox`] over a RabbitMQ queue: delivers each message to your work once per
/// message id, acknowledges, requeues or rejects it by what the Inbox answered, and
/// reconnects through the broker's nodes when its node fails.
///
/// The work gets the transaction that records the message and the [`Message`]; what it
/// writes commits with the record, or not at all. Up to [`prefetch`](Self::prefetch)
/// messages are in hand (and processed) at once.
///
/// ```no_run
/// use axum_idempotency::Inbox;
/// use axum_idempotency::inbox::rabbit::Consumer;
///
/// # async fn run(pool: deadpool_postgres::Pool) -> Result<(), Box<dyn std::error::Error>> {
/// let inbox = Inbox::new(pool, "coupon-service");
/// let consumer = Consumer::new(
///     inbox,
///     ["amqp://guest:guest@rabbit-1:5672/%2f", "amqp://guest:guest@rabbit-2:5672/%2f"],
///     "payment-succeeded",
/// )
/// .prefetch(16)
/// // Without the AMQP message_id property, the body's "message_id" field.
/// .message_id_field("message_id")
/// .start(|tx, message| async move {
///     let event: serde_json::Value = message.json()?;
///     let user_id = event["user_id"].as_i64().unwrap_or_default();
///     tx.execute(
///         "INSERT INTO coupon_account (user_id, coupon_code) VALUES ($1, 'NEW_USER_50')",
///         &[&user_id],
///     )
///     .await?;
///     Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
/// })
/// .await?;
/// tokio::signal::ctrl_c().await?;
/// // Finishes the messages in hand, then closes the connection.
/// consumer.shutdown().await;
/// # Ok(()) }
/// ```
pub struct Consumer<D: InboxStore> {
    inbox: Inbox<D>,
    brokers: Arc<Brokers>,
    queue: String,
    prefetch: u16,
    id_field: Option<String>,
    max_backoff: Duration,
}

impl<D: InboxStore> fmt::Debug for Consumer<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Consumer")
            .field("group", &self.inbox.consumer_group())
            .field("nodes", &self.brokers.len())
            .field("queue", &self.queue)
            .field("prefetch", &self.prefetch)
            .field("id_field", &self.id_field)
            .finish_non_exhaustive()
    }
}

/// The connection name the broker shows for a consumer's connection.
const CONNECTION_NAME: &str = "axum-idempotency inbox consumer";
const FIRST_BACKOFF: Duration = Duration::from_millis(100);

/// A connection consuming the queue.
struct Session {
    connection: Connection,
    channel: Channel,
    deliveries: lapin::Consumer,
    node: usize,
}

impl<D: InboxStore> Consumer<D> {
    /// A consumer of `queue` for `inbox`'s consumer group, on the broker whose nodes are
    /// `uris` (`amqp://user:password@host:port/vhost`; one, or a cluster's), tried in order.
    /// The queue must exist (declare it, durable or quorum, before starting).
    pub fn new<I, S>(inbox: Inbox<D>, uris: I, queue: impl Into<String>) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            inbox,
            brokers: Arc::new(Brokers::new(uris)),
            queue: queue.into(),
            prefetch: 16,
            id_field: None,
            max_backoff: Duration::from_secs(30),
        }
    }

    /// How many unacknowledged messages the broker sends ahead (AMQP `basic.qos`); they
    /// are processed at once. Default: 16.
    #[must_use]
    pub fn prefetch(mut self, messages: u16) -> Self {
        self.prefetch = messages.max(1);
        self
    }

    /// For messages without the AMQP `message_id` property: take the id from this
    /// top-level string field of the JSON body. Default: none (the property is required).
    #[must_use]
    pub fn message_id_field(mut self, field: impl Into<String>) -> Self {
        self.id_field = Some(field.into());
        self
    }

    /// While no node answers (or the database is unavailable) the consumer waits 100 ms,
    /// then twice as long after every failure, at most this long. Default: 30 s.
    #[must_use]
    pub fn max_backoff(mut self, max: Duration) -> Self {
        self.max_backoff = max.max(FIRST_BACKOFF);
        self
    }
}

impl<D> Consumer<D>
where
    D: InboxStore + Send + Sync + 'static,
{
    /// Connects to the first node that answers, starts consuming, and runs the consumer on
    /// a tokio task until [`ConsumerHandle::shutdown`]. When its connection is lost it
    /// reconnects through the nodes with backoff (see [`max_backoff`](Self::max_backoff));
    /// the messages it had not acknowledged are redelivered by the broker, and the Inbox
    /// answers the ones already done as duplicates.
    ///
    /// Fails if no node answers at the start, or the broker refuses the consumer (no such
    /// queue).
    pub async fn start<F, Fut, T, E>(self, work: F) -> Result<ConsumerHandle, ConsumerError>
    where
        F: Fn(IdempotentTx<D>, Message) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
        T: Send + 'static,
        E: fmt::Display + Send + 'static,
    {
        let session = self.open().await?;
        let token = CancellationToken::new();
        let stop = token.clone();
        let task = tokio::spawn(async move { self.run(session, Arc::new(work), stop).await });
        Ok(ConsumerHandle { token, task })
    }

    async fn open(&self) -> Result<Session, ConsumerError> {
        let (connection, node) = self
            .brokers
            .connect(CONNECTION_NAME)
            .await
            .map_err(ConsumerError::Unreachable)?;
        let consumed = async {
            let channel = connection.create_channel().await?;
            channel
                .basic_qos(self.prefetch, BasicQosOptions::default())
                .await?;
            let deliveries = channel
                .basic_consume(
                    self.queue.as_str().into(),
                    "".into(),
                    BasicConsumeOptions::default(), // manual acknowledgements
                    FieldTable::default(),
                )
                .await?;
            Ok::<_, lapin::Error>((channel, deliveries))
        }
        .await;
        match consumed {
            Ok((channel, deliveries)) => Ok(Session {
                connection,
                channel,
                deliveries,
                node,
            }),
            Err(error) => {
                self.brokers.failed(node);
                let _ = connection.close(200, "consumer refused".into()).await;
                Err(ConsumerError::Broker(error))
            }
        }
    }

    async fn run<F, Fut, T, E>(self, first: Session, work: Arc<F>, stop: CancellationToken)
    where
        F: Fn(IdempotentTx<D>, Message) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
        T: Send + 'static,
        E: fmt::Display + Send + 'static,
    {
        let this = Arc::new(self);
        let mut session = Some(first);
        let mut backoff = FIRST_BACKOFF;
        loop {
            let Some(mut current) = session.take() else {
                match this.open().await {
                    Ok(opened) => {
                        tracing::info!(queue = %this.queue, node = opened.node,
                            "inbox consumer reconnected");
                        backoff = FIRST_BACKOFF;
                        session = Some(opened);
                    }
                    Err(error) => {
                        tracing::warn!(queue = %this.queue, error = %crate::engine::error::Chain(&error),
                            "inbox consumer: no broker node answered; retrying");
                        tokio::select! {
                            biased;
                            () = stop.cancelled() => return,
                            () = tokio::time::sleep(backoff) => {}
                        }
                        backoff = (backoff * 2).min(this.max_backoff);
                    }
                }
                continue;
            };
            let mut in_hand = JoinSet::new();
            let stopped = loop {
                tokio::select! {
                    biased;
                    () = stop.cancelled() => break true,
                    Some(_) = in_hand.join_next(), if !in_hand.is_empty() => {}
                    delivery = current.deliveries.next() => match delivery {
                        Some(Ok(delivery)) => {
                            let (this, work, stop, channel) = (
                                Arc::clone(&this),
                                Arc::clone(&work),
                                stop.clone(),
                                current.channel.clone(),
                            );
                            in_hand.spawn(async move {
                                this.settle(delivery, &channel, &*work, &stop).await;
                            });
                        }
                        Some(Err(error)) => {
                            tracing::warn!(queue = %this.queue, node = current.node,
                                error = %error, "inbox consumer lost its broker connection");
                            break false;
                        }
                        None => {
                            tracing::warn!(queue = %this.queue, node = current.node,
                                "the broker cancelled the consumer");
                            break false;
                        }
                    },
                }
            };
            if stopped {
                // No more deliveries; those in hand finish and are acknowledged.
                let _ = current
                    .channel
                    .basic_cancel(
                        current.deliveries.tag().as_str().into(),
                        BasicCancelOptions::default(),
                    )
                    .await;
            }
            while in_hand.join_next().await.is_some() {}
            if stopped {
                let _ = current.channel.close(200, "shutdown".into()).await;
                let _ = current.connection.close(200, "shutdown".into()).await;
                return;
            }
            this.brokers.failed(current.node);
            let _ = current.connection.close(200, "reconnecting".into()).await;
        }
    }

    /// Runs one delivery through the Inbox and answers the broker.
    async fn settle<F, Fut, T, E>(
        &self,
        delivery: Delivery,
        channel: &Channel,
        work: &F,
        stop: &CancellationToken,
    ) where
        F: Fn(IdempotentTx<D>, Message) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
        E: fmt::Display,
    {
        let Some(id) = self.message_id(&delivery) else {
            tracing::warn!(queue = %self.queue, "a message without a message id; rejected");
            answer(&delivery, Answer::Reject).await;
            return;
        };
        let message = Message {
            payload: Bytes::from(delivery.data.clone()),
            redelivered: delivery.redelivered,
            delivered_before: delivery_count(&delivery),
            routing_key: delivery.routing_key.to_string(),
            id,
        };
        let mut backoff = FIRST_BACKOFF;
        loop {
            let outcome = self
                .inbox
                .run(
                    &message.id,
                    Some(&message.payload),
                    message.delivered_before,
                    |tx| work(tx, message.clone()),
                )
                .await;
            let (answer_with, what) = match &outcome {
                Ok(Outcome::Processed(_)) => (Answer::Ack, "processed; acknowledged"),
                Ok(Outcome::Duplicate { .. }) => (Answer::Ack, "duplicate; acknowledged"),
                Ok(Outcome::GaveUp { .. }) => (Answer::Reject, "gave up; rejected"),
                Err(InboxError::InvalidMessageId(_)) => {
                    (Answer::Reject, "invalid message id; rejected")
                }
                Err(InboxError::Store(_) | InboxError::Busy) => {
                    // Not the message's fault: keep it in hand and try again, as long as
                    // its channel lives (else the broker delivers it again anyway).
                    if !channel.status().connected() {
                        return;
                    }
                    tracing::warn!(queue = %self.queue, message_id = %message.id,
                        error = %outcome.as_ref().err().map(ToString::to_string).unwrap_or_default(),
                        "inbox unavailable; retrying the message");
                    tokio::select! {
                        biased;
                        () = stop.cancelled() => {
                            answer(&delivery, Answer::Requeue).await;
                            return;
                        }
                        () = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(self.max_backoff);
                    continue;
                }
                Err(_) => (Answer::Requeue, "failed; requeued"),
            };
            match &outcome {
                Ok(Outcome::GaveUp {
                    attempts,
                    last_error,
                }) => {
                    tracing::warn!(queue = %self.queue, message_id = %message.id, attempts,
                        last_error = last_error.as_deref().unwrap_or(""), "{what}");
                }
                Err(error) => {
                    tracing::info!(queue = %self.queue, message_id = %message.id, error = %error,
                        "{what}");
                }
                Ok(_) => tracing::info!(queue = %self.queue, message_id = %message.id, "{what}"),
            }
            answer(&delivery, answer_with).await;
            return;
        }
    }

    fn message_id(&self, delivery: &Delivery) -> Option<String> {
        if let Some(id) = delivery.properties.message_id() {
            return Some(id.to_string());
        }
        let field = self.id_field.as_deref()?;
        let body: serde_json::Value = serde_json::from_slice(&delivery.data).ok()?;
        body.get(field)?.as_str().map(str::to_owned)
    }
}

/// Controls a [`Consumer::start`]ed consumer.
#[derive(Debug)]
pub struct ConsumerHandle {
    token: CancellationToken,
    task: JoinHandle<()>,
}

impl ConsumerHandle {
    /// Stops taking deliveries, finishes (and acknowledges) the messages in hand, closes
    /// the connection and waits for the consumer's task to end. Messages the broker had
    /// sent ahead but the consumer had not started go back to the queue.
    pub async fn shutdown(self) {
        self.token.cancel();
        if let Err(error) = self.task.await {
            if error.is_panic() {
                std::panic::resume_unwind(error.into_panic());
            }
        }
    }
}
