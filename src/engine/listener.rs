//! The relay's wake-up, driver-neutral: a [`Listener`] runs one driver session at a time
//! (connect, `LISTEN`, a wake-up per notification until the connection ends) and
//! reconnects with backoff. While it is down the relay polls, so nothing waits longer than
//! the poll interval.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::engine::error::Chain;

/// The channel the outbox table's trigger notifies (`migrations/`).
#[cfg_attr(not(any(feature = "postgres", feature = "sqlx")), allow(dead_code))]
pub(crate) const OUTBOX_CHANNEL: &str = "idempotency_outbox";
const FIRST_RECONNECT_DELAY: Duration = Duration::from_millis(100);
const MAX_RECONNECT_DELAY: Duration = Duration::from_secs(10);

/// An error that ended a listening session.
pub(crate) type SessionError = Box<dyn std::error::Error + Send + Sync>;

/// One session of a driver's LISTEN connection: it wakes the relay once it listens (a
/// notification may have been missed while it was down) and on every notification, and
/// returns when the connection ends.
type Session =
    Arc<dyn Fn(Arc<Notify>) -> BoxFuture<'static, Result<(), SessionError>> + Send + Sync>;

/// What wakes a spawned [`OutboxRelay`](crate::outbox::OutboxRelay) within milliseconds of
/// a COMMIT that enqueued messages: a database connection of its own that `LISTEN`s for the
/// outbox table's trigger, reconnecting with backoff when it is lost. Build one from your
/// driver — `Listener::postgres` (tokio-postgres, from a `tokio_postgres::Config`),
/// `Listener::postgres_with_tls`, or `Listener::sqlx` (from the `sqlx::PgPool`'s
/// connect options) — and give it to
/// [`OutboxRelay::listen`](crate::outbox::OutboxRelay::listen).
///
/// Not behind PgBouncer in transaction pooling mode (`LISTEN` is session state): connect
/// it to PostgreSQL directly, or leave it off and let the relay poll.
#[derive(Clone)]
pub struct Listener {
    session: Session,
}

impl Listener {
    /// A listener whose sessions `session` runs.
    #[cfg_attr(not(any(feature = "postgres", feature = "sqlx")), allow(dead_code))]
    pub(crate) fn from_session<F>(session: F) -> Self
    where
        F: Fn(Arc<Notify>) -> BoxFuture<'static, Result<(), SessionError>> + Send + Sync + 'static,
    {
        Self {
            session: Arc::new(session),
        }
    }

    /// Wakes `wake` on every notification until `stop`, reconnecting with backoff.
    pub(crate) async fn run(self, wake: Arc<Notify>, stop: CancellationToken) {
        let mut delay = FIRST_RECONNECT_DELAY;
        loop {
            let started = tokio::time::Instant::now();
            tokio::select! {
                biased;
                () = stop.cancelled() => return,
                ended = (self.session)(Arc::clone(&wake)) => match ended {
                    Ok(()) => tracing::warn!(
                        "the outbox LISTEN connection closed; polling until it is back"
                    ),
                    Err(error) => tracing::warn!(
                        error = %Chain(&*error),
                        "the outbox LISTEN connection failed; polling until it is back"
                    ),
                },
            }
            if started.elapsed() > MAX_RECONNECT_DELAY {
                delay = FIRST_RECONNECT_DELAY;
            }
            tokio::select! {
                biased;
                () = stop.cancelled() => return,
                () = tokio::time::sleep(delay) => {}
            }
            delay = (delay * 2).min(MAX_RECONNECT_DELAY);
        }
    }
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener").finish_non_exhaustive()
    }
}
