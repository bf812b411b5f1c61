//! The Tower middleware: [`IdempotencyLayer`], the [`Idempotency`] service it builds, and
//! the service's [`ResponseFuture`].

mod future;
mod layer;
mod service;

pub use self::future::ResponseFuture;
pub use self::layer::IdempotencyLayer;
pub use self::service::Idempotency;
