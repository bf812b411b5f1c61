//! The orders examples' outbox relay: started when `AMQP_URL` is set, publishing the
//! `payment-succeeded` messages of `POST /orders/{order_no}/pay` to RabbitMQ.

#[cfg(feature = "rabbitmq")]
#[path = "amqp.rs"]
mod amqp;

/// The queue paid orders are announced on: env `PAYMENTS_QUEUE`, default
/// `payment-succeeded`.
pub(crate) fn payments_queue() -> String {
    std::env::var("PAYMENTS_QUEUE").unwrap_or_else(|_| "payment-succeeded".to_owned())
}

/// Starts the relay when `AMQP_URL` is set (and says so); without it, messages wait in the
/// outbox for a relay elsewhere.
#[cfg(feature = "rabbitmq")]
pub(crate) async fn start<P>(
    pool: P,
    listener: Option<axum_idempotency::outbox::Listener>,
    prepared: bool,
) -> Result<Option<axum_idempotency::outbox::RelayHandle>, Box<dyn std::error::Error>>
where
    P: axum_idempotency::IntoStore,
    P::Store: axum_idempotency::OutboxStore,
{
    use axum_idempotency::outbox::{OutboxRelay, RabbitPublisher};

    if std::env::var_os("AMQP_URL").is_none() {
        println!("AMQP_URL not set: paid orders' messages wait in the outbox");
        return Ok(None);
    }
    // One URL, or a cluster's nodes separated by commas.
    let urls = amqp::urls();
    let queue = payments_queue();
    // The queue outlives both sides: a message published before the consumer starts waits
    // in it instead of being returned as unroutable. A quorum queue with QUEUE_TYPE=quorum.
    amqp::declare(&urls, &queue).await?;
    let mut relay =
        OutboxRelay::new(pool, RabbitPublisher::cluster(urls)).prepared_statements(prepared);
    // Without a listener (MySQL, SQLite, or behind a transaction-pooling PgBouncer) the
    // relay polls alone.
    if let Some(listener) = listener {
        relay = relay.listen(listener);
    }
    let relay = relay.spawn();
    println!("outbox relay publishing paid orders to queue {queue}");
    Ok(Some(relay))
}

#[cfg(not(feature = "rabbitmq"))]
pub(crate) async fn start<P>(
    _pool: P,
    _listener: Option<axum_idempotency::outbox::Listener>,
    _prepared: bool,
) -> Result<Option<NoRelay>, Box<dyn std::error::Error>> {
    if std::env::var_os("AMQP_URL").is_some() {
        println!("built without feature `rabbitmq`: paid orders' messages wait in the outbox");
    }
    Ok(None)
}

/// Stands in for the relay handle in a build without RabbitMQ.
#[cfg(not(feature = "rabbitmq"))]
pub(crate) struct NoRelay;

#[cfg(not(feature = "rabbitmq"))]
impl NoRelay {
    pub(crate) async fn shutdown(self) {}
}
