#![doc = include_str!("../README.md")]

mod admin;
mod cache;
mod config;
mod crypto;
mod error;
mod fingerprint;
#[cfg(feature = "redis")]
mod front;
mod inbox;
mod key;
mod lease;
mod middleware;
mod rejection;
mod request;
mod store;
mod sweeper;
mod telemetry;
mod transaction;

pub use crate::admin::{Admin, MessageInfo, RecordInfo};
pub use crate::config::StoreDecision;
#[cfg(feature = "encryption")]
pub use crate::crypto::BodyKeys;
pub use crate::crypto::EncryptionError;
pub use crate::error::Error;
pub use crate::inbox::{Inbox, InboxError, Outcome};
pub use crate::key::{IDEMPOTENCY_KEY, IdempotencyKey, KeyError, MAX_KEY_LEN};
pub use crate::lease::IdempotentLease;
pub use crate::middleware::{Idempotency, IdempotencyLayer, ResponseFuture};
pub use crate::rejection::{Rejection, RejectionKind};
pub use crate::request::REPLAYED_HEADER;
pub use crate::store::migrate;
pub use crate::sweeper::{SweepReport, Sweeper, SweeperHandle};
pub use crate::transaction::{IdempotentTx, TxStatement};
/// The `redis` crate this one is built with (feature `redis`), so the
/// [`Client`](redis::Client) given to [`IdempotencyLayer::redis`] is of the same version.
#[cfg(feature = "redis")]
pub use ::redis;
