//! The RabbitMQ at `AMQP_URL` for the tests that need one.

use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties};

use super::amqp_url;

/// A connection to the broker; `None` (the test says it skipped) when there is none,
/// except under CI, where a missing broker fails the test.
pub async fn connect() -> Option<Connection> {
    match Connection::connect(&amqp_url(), ConnectionProperties::default()).await {
        Ok(connection) => Some(connection),
        Err(e) if std::env::var_os("CI").is_none() => {
            eprintln!("skipped: no RabbitMQ at {} ({e})", amqp_url());
            None
        }
        Err(e) => panic!("connect to RabbitMQ at AMQP_URL: {e}"),
    }
}

/// Declares the durable queue `name`.
pub async fn declare_durable(connection: &Connection, name: &str) {
    let channel = connection.create_channel().await.unwrap();
    channel
        .queue_declare(
            name.into(),
            QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
}
