#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]
// Without a driver feature nothing can run; the build still compiles, quietly.
#![cfg_attr(
    not(any(
        feature = "postgres",
        feature = "sqlx",
        feature = "mysql",
        feature = "sqlite"
    )),
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
#[cfg(feature = "mysql")]
#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
pub mod mysql;
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
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub mod sqlite;
#[cfg(feature = "sqlx")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlx")))]
pub mod sqlx;
mod store;

pub use crate::engine::archive::{ArchivedResponse, ArchivedRow, BoxError};
#[cfg(feature = "encryption")]
#[cfg_attr(docsrs, doc(cfg(feature = "encryption")))]
pub use crate::engine::crypto::BodyKeys;
pub use crate::engine::crypto::EncryptionError;
pub use crate::engine::error::Error;
pub use crate::engine::key::{
    BODY_OMITTED_HEADER, IDEMPOTENCY_KEY, IdempotencyKey, KeyError, MAX_KEY_LEN, REPLAYED_HEADER,
};
pub use crate::engine::policy::StoreDecision;
pub use crate::engine::record::Archive;
pub use crate::engine::view::{
    ArchivedRecord, InboxFailures, MessageInfo, OutboxInfo, OutboxState, Overview, Page,
    RecordInfo, ResponseBody, StoredResponse,
};
pub use crate::http::config::ClaimMode;
pub use crate::http::lease::{IdempotentLease, OutcomeUnknown};
pub use crate::http::rejection::{Rejection, RejectionKind};
pub use crate::http::{Idempotency, IdempotencyLayer, ResponseFuture};
pub use crate::inbox::{Inbox, InboxError};
pub use crate::ops::admin::Admin;
pub use crate::ops::archive::ArchiveSink;
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
