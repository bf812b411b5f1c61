//! The outbox relay's wake-up on tokio-postgres: [`Listener::postgres`] and
//! [`Listener::postgres_with_tls`].

use std::sync::Arc;

use futures_util::StreamExt;
use tokio::sync::Notify;
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::{AsyncMessage, Socket};

use crate::engine::listener::{Listener, OUTBOX_CHANNEL, SessionError};

impl Listener {
    /// A listener on a tokio-postgres connection of its own, made from `config` without
    /// TLS (see [`postgres_with_tls`](Self::postgres_with_tls)).
    ///
    /// The connection only ever receives, so a silently cut link would leave it deaf with
    /// nothing failing: unless `config` sets a `tcp_user_timeout` of its own, the listener
    /// applies [`detect_dead_peers`](crate::postgres::detect_dead_peers) with
    /// [`DEAD_LISTENER_AFTER`](crate::postgres::DEAD_LISTENER_AFTER), so a dead link ends
    /// the session within seconds and the listener reconnects; the relay's polling covers
    /// the gap.
    ///
    /// ```no_run
    /// # #[cfg(feature = "rabbitmq")]
    /// # async fn run(pool: deadpool_postgres::Pool, database_url: &str) -> Result<(), Box<dyn std::error::Error>> {
    /// use axum_idempotency::outbox::{Listener, OutboxRelay, RabbitPublisher};
    ///
    /// let relay = OutboxRelay::new(pool, RabbitPublisher::new("amqp://127.0.0.1:5672/%2f"))
    ///     .listen(Listener::postgres(database_url.parse()?))
    ///     .spawn();
    /// # Ok(()) }
    /// ```
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    pub fn postgres(config: tokio_postgres::Config) -> Self {
        Self::postgres_with_tls(config, tokio_postgres::NoTls)
    }

    /// [`postgres`](Self::postgres) over TLS: `tls` is any tokio-postgres TLS connector
    /// (`postgres_native_tls::MakeTlsConnector`, `tokio_postgres_rustls::MakeRustlsConnect`,
    /// ...), used for every (re)connection. Whether TLS is required is `config`'s
    /// `sslmode`.
    ///
    /// ```no_run
    /// # use tokio_postgres::{Socket, tls::{MakeTlsConnect, TlsConnect}};
    /// # #[cfg(feature = "rabbitmq")]
    /// # async fn run<T>(pool: deadpool_postgres::Pool, amqp_url: String, tls: T) -> Result<(), Box<dyn std::error::Error>>
    /// # where
    /// #     T: MakeTlsConnect<Socket> + Clone + Send + Sync + 'static,
    /// #     T::Stream: Send + 'static,
    /// #     T::TlsConnect: Send,
    /// #     <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
    /// # {
    /// use axum_idempotency::outbox::{Listener, OutboxRelay, RabbitPublisher};
    ///
    /// // `tls`: for example, with postgres-native-tls and native-tls in your Cargo.toml,
    /// // `postgres_native_tls::MakeTlsConnector::new(native_tls::TlsConnector::new()?)`.
    /// let relay = OutboxRelay::new(pool, RabbitPublisher::new(amqp_url))
    ///     .listen(Listener::postgres_with_tls(
    ///         "host=db.example.com user=app sslmode=require".parse()?,
    ///         tls,
    ///     ))
    ///     .spawn();
    /// # Ok(()) }
    /// ```
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    pub fn postgres_with_tls<T>(config: tokio_postgres::Config, tls: T) -> Self
    where
        T: MakeTlsConnect<Socket> + Clone + Send + Sync + 'static,
        T::Stream: Send + 'static,
        T::TlsConnect: Send,
        <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
    {
        let mut config = config;
        if config.get_tcp_user_timeout().is_none() {
            crate::postgres::detect_dead_peers(&mut config, crate::postgres::DEAD_LISTENER_AFTER);
        }
        Self::from_session(move |wake| {
            let (config, tls) = (config.clone(), tls.clone());
            Box::pin(session(config, tls, wake))
        })
    }
}

/// One connection: `LISTEN`, then a wake-up per notification until the connection ends.
async fn session<T>(
    config: tokio_postgres::Config,
    tls: T,
    wake: Arc<Notify>,
) -> Result<(), SessionError>
where
    T: MakeTlsConnect<Socket> + Send + 'static,
    T::Stream: Send + 'static,
    T::TlsConnect: Send,
    <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
{
    let (client, mut connection) = config.connect(tls).await?;
    let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
    let listen = async {
        client
            .batch_execute(&format!("LISTEN {OUTBOX_CHANNEL}"))
            .await?;
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
        Ok::<(), tokio_postgres::Error>(())
    };
    tokio::select! {
        ended = listen => ended?,
        ended = deliver => ended?,
    }
    Ok(())
}
