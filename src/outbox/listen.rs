//! The relay's wake-up: a connection of its own that `LISTEN`s for the outbox trigger's
//! notifications, reconnecting with backoff when it is lost. While it is down the relay
//! polls, so nothing waits longer than the poll interval.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::{Stream, StreamExt};
use tokio::sync::Notify;
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::{AsyncMessage, Client, Socket};
use tokio_util::sync::CancellationToken;

/// The channel `migrations/0007_outbox.sql`'s trigger notifies.
const CHANNEL: &str = "idempotency_outbox";
const MAX_RECONNECT_DELAY: Duration = Duration::from_secs(10);

/// The connection's messages: notifications, notices, and its end.
type Messages = Pin<Box<dyn Stream<Item = Result<AsyncMessage, tokio_postgres::Error>> + Send>>;

/// Opens the LISTEN connection, with whatever TLS the relay was given.
#[derive(Clone)]
pub(crate) struct Connect(
    #[allow(clippy::type_complexity)]
    Arc<
        dyn Fn(
                &tokio_postgres::Config,
            ) -> BoxFuture<'static, Result<(Client, Messages), tokio_postgres::Error>>
            + Send
            + Sync,
    >,
);

impl std::fmt::Debug for Connect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Connect")
    }
}

/// A [`Connect`] over `tls`.
pub(crate) fn connector<T>(tls: T) -> Connect
where
    T: MakeTlsConnect<Socket> + Clone + Send + Sync + 'static,
    T::Stream: Send + 'static,
    T::TlsConnect: Send,
    <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
{
    Connect(Arc::new(move |config: &tokio_postgres::Config| {
        let (config, tls) = (config.clone(), tls.clone());
        Box::pin(async move {
            let (client, mut connection) = config.connect(tls).await?;
            let messages: Messages = Box::pin(futures_util::stream::poll_fn(move |cx| {
                connection.poll_message(cx)
            }));
            Ok((client, messages))
        })
    }))
}

/// Wakes `wake` on every notification until `stop`; after (re)connecting too, since a
/// notification may have been missed in between.
pub(crate) async fn run(
    config: tokio_postgres::Config,
    connect: Connect,
    wake: Arc<Notify>,
    stop: CancellationToken,
) {
    let mut delay = Duration::from_millis(100);
    loop {
        let started = tokio::time::Instant::now();
        tokio::select! {
            biased;
            () = stop.cancelled() => return,
            ended = session(&config, &connect, &wake) => match ended {
                Ok(()) => tracing::warn!("the outbox LISTEN connection closed; polling until it is back"),
                Err(error) => tracing::warn!(
                    error = %crate::error::Chain(&error),
                    "the outbox LISTEN connection failed; polling until it is back"
                ),
            },
        }
        if started.elapsed() > MAX_RECONNECT_DELAY {
            delay = Duration::from_millis(100);
        }
        tokio::select! {
            biased;
            () = stop.cancelled() => return,
            () = tokio::time::sleep(delay) => {}
        }
        delay = (delay * 2).min(MAX_RECONNECT_DELAY);
    }
}

/// One connection: `LISTEN`, then a wake-up per notification until the connection ends.
async fn session(
    config: &tokio_postgres::Config,
    connect: &Connect,
    wake: &Notify,
) -> Result<(), tokio_postgres::Error> {
    let (client, mut messages) = (connect.0)(config).await?;
    let listen = async {
        client.batch_execute(&format!("LISTEN {CHANNEL}")).await?;
        tracing::debug!("outbox relay listening");
        wake.notify_one();
        std::future::pending::<Result<(), tokio_postgres::Error>>().await
    };
    let deliver = async {
        while let Some(message) = messages.next().await {
            if let AsyncMessage::Notification(_) = message? {
                wake.notify_one();
            }
        }
        Ok(())
    };
    tokio::select! {
        ended = listen => ended,
        ended = deliver => ended,
    }
}
