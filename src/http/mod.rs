//! The HTTP adapter: the Tower middleware ([`IdempotencyLayer`], the [`Idempotency`]
//! service, its [`ResponseFuture`]), the per-request state it shares with the extractors,
//! and the rejections. It knows nothing of SQL: every database step goes through the
//! request's [`Store`](crate::Store).

mod body;
mod claim;
mod complete;
pub(crate) mod config;
pub(crate) mod extract;
mod front;
mod future;
mod layer;
pub(crate) mod lease;
pub(crate) mod rejection;
mod service;
pub(crate) mod state;

pub use self::future::ResponseFuture;
pub use self::layer::IdempotencyLayer;
pub use self::service::Idempotency;
