#![doc = include_str!("../README.md")]
//!
//! # How it is built
//!
//! The folders are the parts, and each part imports only the parts below it:
//!
//! ```text
//!   http/  inbox/  outbox/  ops/         client/  openapi.rs
//!     │  ╲    │       │       │             │        │ (→ http)
//!     │   redis_front/ │       │             │        │
//!     ▼       ▼  ▼    ▼       ▼             │        │
//!   store/  (the seam: Store + abilities, IdempotentTx<D>, migrate)
//!     ▲            ▲                         │        │
//!   postgres/    sqlx/   (drivers: implement the seam's traits)
//!     │            │                         │        │
//!     ▼            ▼                         ▼        ▼
//!   engine/  (driver-neutral: keys, fingerprints, policy, records, codec, crypto,
//!             caches, limiter, listener, views, metrics, error)
//! ```
//!
//! | part | holds | may import |
//! | --- | --- | --- |
//! | `engine/` | keys and record ids, fingerprints, the store policy ([`StoreDecision`]), the claim's outcomes and completion rules, the stored-response codec, encryption at rest, the in-process cache, the hot-key limiter, the outbox's message rules and [`outbox::Listener`], the RabbitMQ node list the publisher and the consumer connect through (`amqp.rs`), the operator's views ([`RecordInfo`], ...), metric names, [`Error`] | nothing |
//! | `store/` | the seam: [`Store`] (the HTTP claim) and the abilities [`LeaseStore`], [`InboxStore`], [`OutboxStore`], [`MaintenanceStore`]; [`IdempotentTx`]; [`IntoStore`], [`migrate`], [`check_schema`]; the statement texts and their row decoders; the migration list | engine |
//! | `postgres/`, `sqlx/` | the drivers (features `postgres`, `sqlx`), the same files in both: `store.rs` (the claim), `lease.rs`, `inbox.rs`, `outbox.rs`, `maintenance.rs` (one ability each), `migrate.rs`, `listen.rs`, `conn.rs`, `tx.rs` | store, engine |
//! | `redis_front/` | the Redis front line (feature `redis`) | engine |
//! | `http/` | the HTTP adapter: [`IdempotencyLayer`] (`layer.rs`), [`Idempotency`] (`service.rs`), [`ResponseFuture`] (`future.rs`), the request's state (`state.rs`), its claim (`claim.rs`) and completion (`complete.rs`), the answers found before the database (`front.rs`), lease mode (`lease.rs`), the extractors (`extract.rs`), the [`Rejection`]s | store, engine, redis_front |
//! | `inbox/`, `outbox/`, `ops/` | the [`Inbox`] and its RabbitMQ consume loop (`inbox::rabbit`); the [`outbox::OutboxRelay`] and its [`outbox::Publisher`]s; [`Admin`] and the [`Sweeper`] — each asking for the ability it uses | store, engine |
//! | `client/`, `openapi.rs` | the caller's middleware (feature `client`); the OpenAPI declarations (feature `utoipa`) | engine (openapi: and http) |
//! | `guide.rs` | the guides ([`guide`]): documentation only | nothing |
//!
//! `lib.rs` holds only these docs and the re-exports. `tests/layering.rs` checks the
//! arrows (`cargo test --test layering`): a line of code in one part may name another
//! only as the table allows, and never through a crate-root re-export. Every SQL statement
//! lives under `store/` and the driver folders; `migrations/` holds the SQL files every
//! driver's `migrate` runs.
#![cfg_attr(docsrs, feature(doc_cfg))]
// Without a driver feature nothing can run; the build still compiles, quietly.
#![cfg_attr(
    not(any(feature = "postgres", feature = "sqlx")),
    allow(dead_code, unused)
)]

#[cfg(fuzzing)]
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
pub use crate::engine::key::{
    IDEMPOTENCY_KEY, IdempotencyKey, KeyError, MAX_KEY_LEN, REPLAYED_HEADER,
};
pub use crate::engine::policy::StoreDecision;
pub use crate::engine::view::{
    InboxFailures, MessageInfo, OutboxInfo, OutboxState, Overview, Page, RecordInfo, ResponseBody,
    StoredResponse,
};
pub use crate::http::lease::IdempotentLease;
pub use crate::http::rejection::{Rejection, RejectionKind};
pub use crate::http::{Idempotency, IdempotencyLayer, ResponseFuture};
pub use crate::inbox::{Inbox, InboxError};
pub use crate::ops::admin::Admin;
#[cfg(feature = "console")]
#[cfg_attr(docsrs, doc(cfg(feature = "console")))]
pub use crate::ops::console::{Console, ConsoleUser};
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
