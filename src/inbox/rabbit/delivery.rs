//! One delivery's attempt count and the broker answer to its outcome.

use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicNackOptions, BasicRejectOptions};
use lapin::types::AMQPValue;

/// The broker's count of earlier deliveries (a quorum queue's `x-delivery-count`).
pub(super) fn delivery_count(delivery: &Delivery) -> u32 {
    let Some(headers) = delivery.properties.headers() else {
        return 0;
    };
    let count = match headers.inner().get("x-delivery-count") {
        Some(AMQPValue::LongLongInt(n)) => i128::from(*n),
        Some(AMQPValue::LongInt(n)) => i128::from(*n),
        Some(AMQPValue::ShortInt(n)) => i128::from(*n),
        Some(AMQPValue::ShortShortInt(n)) => i128::from(*n),
        Some(AMQPValue::LongUInt(n)) => i128::from(*n),
        Some(AMQPValue::ShortUInt(n)) => i128::from(*n),
        Some(AMQPValue::ShortShortUInt(n)) => i128::from(*n),
        _ => 0,
    };
    u32::try_from(count.max(0)).unwrap_or(u32::MAX)
}

pub(super) enum Answer {
    Ack,
    Requeue,
    Reject,
}

/// Answers the broker; an answer lost with the connection means a redelivery, which the
/// Inbox answers as a duplicate if the work committed.
pub(super) async fn answer(delivery: &Delivery, answer: Answer) {
    let sent = match answer {
        Answer::Ack => delivery.ack(BasicAckOptions::default()).await,
        Answer::Requeue => {
            delivery
                .nack(BasicNackOptions {
                    requeue: true,
                    ..BasicNackOptions::default()
                })
                .await
        }
        Answer::Reject => delivery.reject(BasicRejectOptions { requeue: false }).await,
    };
    if let Err(error) = sent {
        tracing::debug!(error = %error, "could not answer a delivery; the broker redelivers it");
    }
}
