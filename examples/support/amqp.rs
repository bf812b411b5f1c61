//! The examples' RabbitMQ settings: `AMQP_URL` (one URL, or the nodes of a cluster
//! separated by commas) and `QUEUE_TYPE` (`quorum`, or a durable classic queue).

use lapin::options::QueueDeclareOptions;
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Connection, ConnectionProperties};

/// The broker's node addresses from `AMQP_URL`, default the local broker.
pub(crate) fn urls() -> Vec<String> {
    std::env::var("AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned())
        .split(',')
        .map(str::trim)
        .filter(|url| !url.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Declares `queue` durable, as a quorum queue when `QUEUE_TYPE=quorum` (replicated on the
/// cluster's nodes), else as a classic queue; on the first node that answers. A queue that
/// exists already with the same type is left as it is.
pub(crate) async fn declare(
    urls: &[String],
    queue: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    let quorum = std::env::var("QUEUE_TYPE").is_ok_and(|t| t.eq_ignore_ascii_case("quorum"));
    let mut arguments = FieldTable::default();
    if quorum {
        arguments.insert(
            "x-queue-type".into(),
            AMQPValue::LongString("quorum".into()),
        );
    }
    let mut last = None;
    for url in urls {
        let connection = match Connection::connect(url, ConnectionProperties::default()).await {
            Ok(connection) => connection,
            Err(e) => {
                last = Some(e);
                continue;
            }
        };
        let channel = connection.create_channel().await?;
        channel
            .queue_declare(
                queue.into(),
                QueueDeclareOptions {
                    durable: true,
                    ..QueueDeclareOptions::default()
                },
                arguments,
            )
            .await?;
        channel.close(200, "declared".into()).await?;
        connection.close(200, "declared".into()).await?;
        return Ok(());
    }
    Err(last.map_or_else(|| "AMQP_URL holds no address".into(), Into::into))
}
