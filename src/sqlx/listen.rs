//! The outbox relay's wake-up on sqlx: [`Listener::sqlx`].

use std::sync::Arc;

use ::sqlx::PgPool;
use ::sqlx::postgres::PgListener;
use tokio::sync::Notify;

use crate::engine::listener::{Listener, OUTBOX_CHANNEL, SessionError};

impl Listener {
    /// A listener on a connection of its own, opened with `pool`'s connect options
    /// (taken out of the pool for good: it does not count against the pool's size once
    /// open).
    ///
    /// ```no_run
    /// # #[cfg(feature = "rabbitmq")]
    /// # async fn run(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
    /// use axum_idempotency::outbox::{Listener, OutboxRelay, RabbitPublisher};
    ///
    /// let relay = OutboxRelay::new(pool.clone(), RabbitPublisher::new("amqp://127.0.0.1:5672/%2f"))
    ///     .listen(Listener::sqlx(&pool))
    ///     .spawn();
    /// # Ok(()) }
    /// ```
    #[cfg_attr(docsrs, doc(cfg(feature = "sqlx")))]
    pub fn sqlx(pool: &PgPool) -> Self {
        let pool = pool.clone();
        Self::from_session(move |wake| Box::pin(session(pool.clone(), wake)))
    }
}

/// One connection: `LISTEN`, then a wake-up per notification until the connection ends
/// (`try_recv` answers `None` when it is lost: the listener reconnects, and wakes the relay
/// for what it may have missed).
async fn session(pool: PgPool, wake: Arc<Notify>) -> Result<(), SessionError> {
    let mut listener = PgListener::connect_with(&pool).await?;
    listener.listen(OUTBOX_CHANNEL).await?;
    tracing::debug!("outbox relay listening");
    wake.notify_one();
    while listener.try_recv().await?.is_some() {
        wake.notify_one();
    }
    Ok(())
}
