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

/// Declares the durable queue `queue` with `arguments`, dead-lettering to a durable queue
/// of its own, `{queue}-dead`, whose name it returns.
pub async fn declare_dead_lettered(
    connection: &Connection,
    queue: &str,
    mut arguments: FieldTable,
) -> String {
    let dead = format!("{queue}-dead");
    let channel = connection.create_channel().await.unwrap();
    let durable = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    channel
        .queue_declare(dead.as_str().into(), durable, FieldTable::default())
        .await
        .unwrap();
    arguments.insert(
        "x-dead-letter-exchange".into(),
        lapin::types::AMQPValue::LongString("".into()),
    );
    arguments.insert(
        "x-dead-letter-routing-key".into(),
        lapin::types::AMQPValue::LongString(dead.as_str().into()),
    );
    channel
        .queue_declare(queue.into(), durable, arguments)
        .await
        .unwrap();
    dead
}
