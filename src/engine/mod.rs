//! The driver-neutral engine: keys and scopes, fingerprints, the store policy, the claim's
//! outcomes and the completion rules, the stored-response codec, encryption at rest, the
//! caches, front lines and the hot-key limiter in front of the database, and the metrics.

#[cfg(feature = "rabbitmq")]
pub(crate) mod amqp;
pub(crate) mod archive;
pub(crate) mod cache;
pub(crate) mod crypto;
pub(crate) mod error;
pub(crate) mod fingerprint;
pub(crate) mod key;
pub(crate) mod limit;
pub(crate) mod listener;
pub(crate) mod outbox;
pub(crate) mod policy;
pub(crate) mod record;
pub(crate) mod shared_tx;
pub(crate) mod telemetry;
#[cfg(test)]
pub(crate) mod testing;
pub(crate) mod view;
