//! The transactional outbox: messages that leave the service exactly when the work that
//! produced them committed.
//!
//! A handler that must tell another service cannot publish *inside* its transaction (the
//! message goes out for work that then rolls back) nor *after* COMMIT (a crash in between
//! loses it). Instead it enqueues the message in the same transaction as its rows — and, in
//! an idempotent handler, the idempotency record — with
//! [`IdempotentTx::enqueue`](crate::IdempotentTx::enqueue) (or
//! [`postgres::enqueue`](crate::postgres::enqueue) on any transaction, or the sqlx
//! driver's own). An [`OutboxRelay`] publishes committed messages through a
//! [`Publisher`] (`RabbitPublisher` with feature `rabbitmq`) and marks them SENT after
//! the broker's confirm. Delivery is at least once, with a stable message id, so a
//! consumer that goes through the [`Inbox`](crate::Inbox) applies each message once.
//!
//! ```text
//! POST /orders/ORD-7/pay ──► one COMMIT: orders row PAID + idempotency record + outbox row
//!                                                   │
//!            OutboxRelay (LISTEN/poll, SKIP LOCKED) ┘──► RabbitMQ (confirm) ──► SENT
//!                                                            │
//!            coupon consumer: Inbox(message_id) + coupon row, one COMMIT ◄┘
//! ```
//!
//! The guide [`crate::guide::outbox`] has the whole story: guarantees, ordering, the
//! metrics, running behind PgBouncer.

mod publisher;
#[cfg(feature = "rabbitmq")]
mod rabbit;
mod relay;

pub use self::publisher::{PublishError, Publisher};
#[cfg(feature = "rabbitmq")]
#[cfg_attr(docsrs, doc(cfg(feature = "rabbitmq")))]
pub use self::rabbit::RabbitPublisher;
pub use self::relay::{OutboxRelay, RelayHandle, RelayReport};
pub use crate::engine::listener::Listener;
pub use crate::engine::outbox::{Enqueued, MessageError, OutboxMessage, Outgoing};
