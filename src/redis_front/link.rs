//! The Redis front line's connection: one multiplexed connection per layer, the back-off
//! after a failure, and one operation run under the deadline.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use ::redis::aio::MultiplexedConnection;
use ::redis::{AsyncConnectionConfig, ErrorKind, RedisError, RedisResult};

use super::{BACKOFF, RedisFront};
use crate::engine::key::RecordId;

#[derive(Default)]
pub(super) struct Link {
    /// The live connection and its generation (a failure on an older one is ignored).
    pub(super) conn: Option<(u64, MultiplexedConnection)>,
    /// No connection attempt before this instant.
    pub(super) retry_at: Option<Instant>,
    /// One request is connecting; the others skip Redis meanwhile.
    pub(super) connecting: bool,
    /// The last attempt failed (log level: warn on the way down, debug while down).
    pub(super) down: bool,
    /// Locks to delete once Redis answers again (bounded by [`MAX_UNRELEASED`](super::MAX_UNRELEASED)).
    pub(super) unreleased: Vec<RecordId>,
}

impl RedisFront {
    /// Runs one operation on the connection, under the deadline.
    pub(super) async fn run<T, F, Fut>(&self, what: &'static str, operation: F) -> Ran<T>
    where
        F: FnOnce(MultiplexedConnection) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        let Some((generation, conn)) = self.connection().await else {
            return Ran::Skipped;
        };
        match tokio::time::timeout(self.options.timeout, operation(conn)).await {
            Ok(Ok(value)) => Ran::Done(value),
            Ok(Err(error)) => {
                self.failed(generation, what, Failure::Redis(error));
                Ran::Failed
            }
            Err(_elapsed) => {
                self.failed(generation, what, Failure::Timeout(self.options.timeout));
                Ran::Failed
            }
        }
    }

    /// The live connection, or a fresh one unless another request is connecting or the
    /// back-off after a failure is still running.
    pub(super) async fn connection(&self) -> Option<(u64, MultiplexedConnection)> {
        {
            let mut link = self.link();
            if let Some((generation, conn)) = &link.conn {
                return Some((*generation, conn.clone()));
            }
            if link.connecting || link.retry_at.is_some_and(|at| Instant::now() < at) {
                return None;
            }
            link.connecting = true;
        }
        // Clears `connecting` even if this request is cancelled mid-attempt.
        let mut attempt = Attempt {
            front: self,
            done: false,
        };
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.options.timeout))
            .set_response_timeout(Some(self.options.timeout));
        let connected = tokio::time::timeout(
            self.options.timeout,
            self.client
                .get_multiplexed_async_connection_with_config(&config),
        )
        .await;
        attempt.done = true;
        let mut link = self.link();
        link.connecting = false;
        match connected {
            Ok(Ok(conn)) => {
                let generation = self.generations.fetch_add(1, Ordering::Relaxed) + 1;
                if link.down {
                    tracing::info!(prefix = %self.options.prefix, "Redis is reachable again");
                }
                link.down = false;
                link.retry_at = None;
                link.conn = Some((generation, conn.clone()));
                let unreleased = std::mem::take(&mut link.unreleased);
                drop(link);
                if !unreleased.is_empty() {
                    self.release_kept(unreleased, &conn);
                }
                Some((generation, conn))
            }
            Ok(Err(error)) => {
                self.backoff(&mut link, "connect", &Failure::Redis(error));
                None
            }
            Err(_elapsed) => {
                self.backoff(
                    &mut link,
                    "connect",
                    &Failure::Timeout(self.options.timeout),
                );
                None
            }
        }
    }

    /// A failed operation: an error answer from the server only skips this operation;
    /// anything else (lost connection, timeout) drops the connection and starts the back-off.
    pub(super) fn failed(&self, generation: u64, what: &'static str, failure: Failure) {
        let mut link = self.link();
        let current = link.conn.as_ref().is_some_and(|(g, _)| *g == generation);
        if failure.is_server_answer() || !current {
            tracing::debug!(operation = what, error = %failure, "Redis operation failed; asking PostgreSQL");
            return;
        }
        link.conn = None;
        self.backoff(&mut link, what, &failure);
    }

    pub(super) fn backoff(&self, link: &mut Link, what: &'static str, error: &Failure) {
        if link.down {
            tracing::debug!(operation = what, %error, "Redis still unavailable");
        } else {
            tracing::warn!(operation = what, %error, backoff = ?BACKOFF,
                "Redis unavailable; going on with PostgreSQL alone");
        }
        link.down = true;
        link.retry_at = Some(Instant::now() + BACKOFF);
    }
}

/// What [`RedisFront::run`] got.
pub(super) enum Ran<T> {
    Done(T),
    /// Redis failed or timed out.
    Failed,
    /// Not tried: no connection, during the back-off or while another request connects.
    Skipped,
}

/// Why a Redis operation gave no answer.
#[derive(Debug)]
pub(super) enum Failure {
    Redis(RedisError),
    Timeout(Duration),
}

impl Failure {
    /// An error reply (`OOM`, `READONLY`, …): the connection itself is fine.
    pub(super) fn is_server_answer(&self) -> bool {
        matches!(self, Self::Redis(e) if matches!(e.kind(), ErrorKind::Server(_)))
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Redis(error) => error.fmt(f),
            Self::Timeout(timeout) => write!(f, "no answer within {timeout:?}"),
        }
    }
}

/// A connection attempt in progress; if it is dropped unfinished (the request was
/// cancelled), the next attempt waits for the back-off.
pub(super) struct Attempt<'a> {
    front: &'a RedisFront,
    done: bool,
}

impl Drop for Attempt<'_> {
    fn drop(&mut self) {
        if !self.done {
            let mut link = self.front.link();
            link.connecting = false;
            link.retry_at = Some(Instant::now() + BACKOFF);
        }
    }
}
