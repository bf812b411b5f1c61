#![doc = include_str!("../README.md")]
//!
//! # How it is built
//!
//! The folder list is the architecture:
//!
//! | module | what it holds |
//! | --- | --- |
//! | `http/` | the HTTP adapter: [`IdempotencyLayer`], the [`Idempotency`] service and its [`ResponseFuture`], the per-request state shared with the extractors, [`IdempotentLease`], the [`Rejection`]s. No SQL. |
//! | `engine/` | driver-neutral: key parsing and record ids, fingerprints, the store policy ([`StoreDecision`]), the claim's outcomes and completion rules, the stored-response codec, encryption at rest, the in-process cache and the Redis front line, metrics. |
//! | `store/` | the seam: the sealed [`Store`] trait every driver implements, [`IntoStore`] and [`migrate`], the statement texts the drivers share, the migration list. |
//! | `postgres/` | the tokio-postgres driver: [`PgStore`](postgres::PgStore) over any [`ClientPool`](postgres::ClientPool) (deadpool, bb8, yours), [`IdempotentTx`]. |
//! | `sqlx/` | the sqlx driver (feature `sqlx`): `SqlxStore` over an `sqlx::PgPool`, its own `IdempotentTx` that derefs to the transaction's `PgConnection`. |
//! | `outbox/` | the transactional outbox's relay ([`outbox::OutboxRelay`]), the [`outbox::Publisher`] seam and the RabbitMQ publisher; the message and batch rules live in `engine/outbox.rs`, the statements with the drivers. |
//! | `inbox.rs`, `sweeper.rs`, `admin.rs` | the [`Inbox`], the [`Sweeper`] and [`Admin`], written once against [`Store`]. |
//! | `guide.rs` | the guides: documentation only ([`guide`]), no code. |
//!
//! Every SQL statement lives under `store/` and the driver modules; `migrations/` holds
//! the SQL files every driver's `migrate` runs.
#![cfg_attr(docsrs, feature(doc_cfg))]
// Without a driver feature nothing can run; the build still compiles, quietly.
#![cfg_attr(
    not(any(feature = "postgres", feature = "sqlx")),
    allow(dead_code, unused)
)]

#[cfg(feature = "__fuzz")]
#[doc(hidden)]
#[path = "fuzz.rs"]
pub mod __fuzz;
#[cfg(feature = "client")]
#[cfg_attr(docsrs, doc(cfg(feature = "client")))]
pub mod client;
mod engine;
pub mod guide;
mod http;
pub mod inbox;
#[cfg(feature = "utoipa")]
#[cfg_attr(docsrs, doc(cfg(feature = "utoipa")))]
pub mod openapi;
mod ops;
pub mod outbox;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub mod postgres;
#[cfg(feature = "redis")]
mod redis_front;
#[cfg(feature = "sqlx")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlx")))]
pub mod sqlx;
mod store;

#[cfg(feature = "encryption")]
#[cfg_attr(docsrs, doc(cfg(feature = "encryption")))]
pub use crate::engine::crypto::BodyKeys;
pub use crate::engine::crypto::EncryptionError;
pub use crate::engine::error::Error;
pub use crate::engine::key::{IDEMPOTENCY_KEY, IdempotencyKey, KeyError, MAX_KEY_LEN};
pub use crate::engine::policy::StoreDecision;
pub use crate::engine::view::{MessageInfo, OutboxInfo, OutboxState, RecordInfo};
pub use crate::http::lease::IdempotentLease;
pub use crate::http::rejection::{Rejection, RejectionKind};
pub use crate::http::state::REPLAYED_HEADER;
pub use crate::http::{Idempotency, IdempotencyLayer, ResponseFuture};
pub use crate::inbox::{Inbox, InboxError};
pub use crate::ops::admin::Admin;
pub use crate::ops::sweeper::{SweepReport, Sweeper, SweeperHandle};
pub use crate::store::{
    IdempotentTx, InboxStore, IntoStore, LeaseStore, MaintenanceStore, OutboxStore, Store,
    check_schema, migrate,
};
/// The `redis` crate this one is built with (feature `redis`), so the
/// [`Client`](redis::Client) given to [`IdempotencyLayer::redis`] is of the same version.
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use ::redis;
