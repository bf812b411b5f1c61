//! [`RabbitPublisher`]: the relay's publisher for RabbitMQ (feature `rabbitmq`, lapin 4).

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::{BasicProperties, Channel, Confirmation, Connection};
use tokio::sync::Mutex;

use super::{Outgoing, PublishError, Publisher};
use crate::engine::amqp::Brokers;

/// The connection name the broker shows for the relay's connection.
const CONNECTION_NAME: &str = "axum-idempotency outbox relay";

/// Publishes outbox messages to RabbitMQ with publisher confirms, as persistent messages
/// whose AMQP `message_id` is the outbox id and whose routing key is the message's topic.
///
/// It connects on first use and again after the connection or channel is lost. Given the
/// nodes of a cluster ([`cluster`](Self::cluster)), it connects to the first that answers
/// and, when that node fails, to the next one that does; while no node answers the relay
/// waits with no attempt counted, backing off up to its
/// [`max_backoff`](super::OutboxRelay::max_backoff). A message is SENT only on a confirm
/// from the node it was published to; one in flight when its node died is published again,
/// with the same message id. Messages are published `mandatory`, so one that no queue takes
/// is returned and counts as refused instead of vanishing. With the default exchange (`""`)
/// the topic is the queue's name.
///
/// | broker answer | to the relay |
/// |---|---|
/// | confirm (ack) | SENT |
/// | returned (unroutable), nack, a channel error for this message (no such exchange, too large) | refused: retried, parked after `max_attempts` |
/// | connection refused or lost, confirms not answered | unavailable: waits, no attempt counted |
///
/// ```no_run
/// use axum_idempotency::outbox::{OutboxRelay, RabbitPublisher};
///
/// # async fn run(pool: deadpool_postgres::Pool) {
/// let relay = OutboxRelay::new(pool, RabbitPublisher::new("amqp://guest:guest@127.0.0.1:5672/%2f"))
///     .spawn();
/// // ... serve ...
/// relay.shutdown().await;
/// # }
/// ```
pub struct RabbitPublisher {
    brokers: Brokers,
    exchange: String,
    link: Mutex<Option<Link>>,
}

/// The open connection, its shared channel, and the node (position in the list) it is to.
struct Link {
    connection: Connection,
    channel: Channel,
    node: usize,
}

impl RabbitPublisher {
    /// A publisher to the broker at `uri` (`amqp://user:password@host:port/vhost`), on the
    /// default exchange.
    pub fn new(uri: impl Into<String>) -> Self {
        Self::cluster([uri.into()])
    }

    /// A publisher to a cluster: `uris` are its nodes' addresses, tried in order. It
    /// connects to the first that answers and, when the node it is connected to fails,
    /// moves on to the next one that answers (each attempt bounded by 5 seconds).
    ///
    /// ```no_run
    /// use axum_idempotency::outbox::{OutboxRelay, RabbitPublisher};
    ///
    /// # async fn run(pool: deadpool_postgres::Pool) {
    /// let publisher = RabbitPublisher::cluster([
    ///     "amqp://guest:guest@rabbit-1:5672/%2f",
    ///     "amqp://guest:guest@rabbit-2:5672/%2f",
    ///     "amqp://guest:guest@rabbit-3:5672/%2f",
    /// ]);
    /// let relay = OutboxRelay::new(pool, publisher).spawn();
    /// # relay.shutdown().await;
    /// # }
    /// ```
    pub fn cluster<I, S>(uris: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            brokers: Brokers::new(uris),
            exchange: String::new(),
            link: Mutex::new(None),
        }
    }

    /// Publishes to `exchange` instead of the default exchange; the topic is then the
    /// routing key that exchange routes by.
    #[must_use]
    pub fn exchange(mut self, exchange: impl Into<String>) -> Self {
        self.exchange = exchange.into();
        self
    }

    /// The open channel, or a new connection and channel with confirms on.
    async fn channel(&self) -> Result<Channel, PublishError> {
        let mut link = self.link.lock().await;
        if let Some(open) = link.as_mut() {
            if open.connection.status().connected() {
                if open.channel.status().connected() {
                    return Ok(open.channel.clone());
                }
                // The channel closed over a refused message: open another on the connection.
                if let Ok(reopened) = open_channel(&open.connection).await {
                    open.channel = reopened.clone();
                    return Ok(reopened);
                }
            }
            // Its node failed (or closed the connection): start with the next one.
            self.brokers.failed(open.node);
            tracing::info!(
                node = open.node,
                "outbox relay: lost its broker connection; reconnecting"
            );
        }
        *link = None;
        let (connection, node) = self
            .brokers
            .connect(CONNECTION_NAME)
            .await
            .map_err(PublishError::unavailable)?;
        let channel = match open_channel(&connection).await {
            Ok(channel) => channel,
            Err(error) => {
                self.brokers.failed(node);
                return Err(PublishError::unavailable(error));
            }
        };
        if self.brokers.len() > 1 {
            tracing::info!(node, "outbox relay connected to broker node");
        }
        *link = Some(Link {
            connection,
            channel: channel.clone(),
            node,
        });
        Ok(channel)
    }
}

async fn open_channel(connection: &Connection) -> Result<Channel, lapin::Error> {
    let channel = connection.create_channel().await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    Ok(channel)
}

/// Why a publish on a channel failed.
enum Failure {
    /// The broker closed the channel (a channel-level, "soft" AMQP error). That fails every
    /// message in flight on the channel, not only the one the broker refused.
    ChannelClosed(lapin::Error),
    /// The message was refused, or the broker is unavailable.
    Publish(PublishError),
}

fn classify(error: lapin::Error) -> Failure {
    if error.is_amqp_soft_error() {
        Failure::ChannelClosed(error)
    } else {
        Failure::Publish(PublishError::unavailable(error))
    }
}

impl RabbitPublisher {
    /// A channel with confirms on, on the open connection, for one message alone.
    async fn channel_of_its_own(&self) -> Result<Channel, PublishError> {
        let link = self.link.lock().await;
        let Some(open) = link.as_ref() else {
            return Err(PublishError::unavailable("no connection to the broker"));
        };
        open_channel(&open.connection)
            .await
            .map_err(PublishError::unavailable)
    }

    async fn publish_on(&self, channel: &Channel, message: &Outgoing) -> Result<(), Failure> {
        let mut properties = BasicProperties::default()
            .with_message_id(message.message_id().into())
            .with_delivery_mode(2);
        if let Some(content_type) = message.content_type() {
            properties = properties.with_content_type(content_type.into());
        }
        let confirm = channel
            .basic_publish(
                self.exchange.as_str().into(),
                message.topic().into(),
                BasicPublishOptions {
                    mandatory: true,
                    ..BasicPublishOptions::default()
                },
                message.payload(),
                properties,
            )
            .await
            .map_err(classify)?;
        let refused = |reason: String| Failure::Publish(PublishError::refused(reason));
        match confirm.await.map_err(classify)? {
            Confirmation::Ack(None) => Ok(()),
            Confirmation::Ack(Some(returned)) => Err(refused(format!(
                "returned unroutable ({} {})",
                returned.reply_code,
                returned.reply_text.as_str()
            ))),
            Confirmation::Nack(_) => Err(refused(
                "the broker negatively acknowledged the message".to_owned(),
            )),
            Confirmation::NotRequested => Err(Failure::Publish(PublishError::unavailable(
                "publisher confirms are not enabled on the channel",
            ))),
        }
    }
}

impl Publisher for RabbitPublisher {
    /// On the shared channel; when the broker closes it, the message is published again
    /// alone on a channel of its own, and is refused only if the broker refuses it there
    /// too — the messages that merely shared the closed channel cost no attempt (and may
    /// reach the broker twice, which the consumer's Inbox absorbs by message id).
    async fn publish(&self, message: &Outgoing) -> Result<(), PublishError> {
        let shared = self.channel().await?;
        match self.publish_on(&shared, message).await {
            Ok(()) => Ok(()),
            Err(Failure::Publish(error)) => Err(error),
            Err(Failure::ChannelClosed(_)) => {
                let alone = self.channel_of_its_own().await?;
                let outcome = self.publish_on(&alone, message).await;
                if alone.status().connected() {
                    let _ = alone.close(200, "published".into()).await;
                }
                match outcome {
                    Ok(()) => Ok(()),
                    Err(Failure::ChannelClosed(error)) => Err(PublishError::refused(error)),
                    Err(Failure::Publish(error)) => Err(error),
                }
            }
        }
    }
}

impl std::fmt::Debug for RabbitPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RabbitPublisher")
            .field("nodes", &self.brokers.len())
            .field("exchange", &self.exchange)
            .finish_non_exhaustive()
    }
}
