//! A list of RabbitMQ nodes to connect through (feature `rabbitmq`), shared by the outbox's
//! publisher and the inbox's consumer.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lapin::{Connection, ConnectionProperties};

/// The nodes of one broker (a cluster, or a single node), tried in order.
#[derive(Debug)]
pub(crate) struct Brokers {
    uris: Vec<String>,
    /// The node to try first next time: the one after the last that failed.
    next: AtomicUsize,
    connect_timeout: Duration,
}

/// No node of the broker answered; the source is the last node's error.
#[derive(Debug)]
pub struct Unreachable {
    tried: usize,
    last: Option<lapin::Error>,
}

impl std::fmt::Display for Unreachable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.tried {
            0 => f.write_str("no broker address configured"),
            1 => f.write_str("the broker did not answer"),
            n => write!(f, "none of the {n} broker nodes answered"),
        }
    }
}

impl std::error::Error for Unreachable {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.last.as_ref().map(|e| e as _)
    }
}

impl Brokers {
    pub(crate) fn new<I, S>(uris: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            uris: uris.into_iter().map(Into::into).collect(),
            next: AtomicUsize::new(0),
            connect_timeout: Duration::from_secs(5),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.uris.len()
    }

    /// Connects to the first node that answers, starting from the one after the node that
    /// failed last (at first: the first node), each attempt bounded by the connect timeout.
    /// Returns the connection and the node's position in the list.
    pub(crate) async fn connect(&self, name: &str) -> Result<(Connection, usize), Unreachable> {
        let count = self.uris.len();
        let first = self.next.load(Ordering::Relaxed);
        let mut last = None;
        for step in 0..count {
            let at = (first + step) % count;
            let properties = ConnectionProperties::default().with_connection_name(name.into());
            let attempt = tokio::time::timeout(
                self.connect_timeout,
                Connection::connect(&self.uris[at], properties),
            )
            .await;
            match attempt {
                Ok(Ok(connection)) => {
                    self.next.store(at, Ordering::Relaxed);
                    return Ok((connection, at));
                }
                Ok(Err(error)) => {
                    tracing::debug!(node = at, error = %error, "broker node did not answer");
                    last = Some(error);
                }
                Err(_) => {
                    tracing::debug!(
                        node = at,
                        "broker node did not answer within the connect timeout"
                    );
                    last = Some(lapin::Error::from(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "connect timed out",
                    )));
                }
            }
        }
        Err(Unreachable { tried: count, last })
    }

    /// The node at `at` failed: the next connection starts with the one after it.
    pub(crate) fn failed(&self, at: usize) {
        if !self.uris.is_empty() {
            let _ = self.next.compare_exchange(
                at,
                (at + 1) % self.uris.len(),
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
        }
    }
}
