//! The outbox relay's wake-up on sqlx: [`Listener::sqlx`].

use std::sync::Arc;
use std::time::Duration;

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

/// How long the listener waits for a notification before it checks its connection with a
/// statement, and how long that check (and connecting) may take. sqlx sets no TCP
/// keepalive: a connection that only receives would never notice a silent link cut.
const CHECK_AFTER: Duration = Duration::from_secs(10);

/// One connection: `LISTEN`, then a wake-up per notification until the connection ends
/// (`try_recv` answers `None` when it is lost: the listener reconnects, and wakes the relay
/// for what it may have missed). After `CHECK_AFTER` without a notification the connection
/// is checked with `SELECT 1`; one that does not answer within `CHECK_AFTER` ends the
/// session.
async fn session(pool: PgPool, wake: Arc<Notify>) -> Result<(), SessionError> {
    let connect = async {
        let mut listener = PgListener::connect_with(&pool).await?;
        listener.listen(OUTBOX_CHANNEL).await?;
        Ok::<_, ::sqlx::Error>(listener)
    };
    let mut listener = bounded(connect).await?;
    tracing::debug!("outbox relay listening");
    wake.notify_one();
    loop {
        // `try_recv` keeps what it read when it is cancelled.
        match tokio::time::timeout(CHECK_AFTER, listener.try_recv()).await {
            Ok(Ok(Some(_))) => wake.notify_one(),
            Ok(Ok(None)) => return Ok(()),
            Ok(Err(error)) => return Err(error.into()),
            Err(_quiet) => {
                bounded(::sqlx::query("SELECT 1").execute(&mut listener)).await?;
            }
        }
    }
}

/// `work`, failed as a timed-out I/O error after `CHECK_AFTER`.
async fn bounded<T>(
    work: impl std::future::Future<Output = Result<T, ::sqlx::Error>>,
) -> Result<T, SessionError> {
    match tokio::time::timeout(CHECK_AFTER, work).await {
        Ok(done) => Ok(done?),
        Err(_elapsed) => {
            Err(format!("the listener's connection did not answer within {CHECK_AFTER:?}").into())
        }
    }
}
