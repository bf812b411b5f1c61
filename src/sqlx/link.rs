//! The sqlx driver's bound on a silent link: sqlx's connect options set neither TCP
//! keepalive nor a user timeout, so a statement sent into a cut link waits out the kernel's
//! retransmission backoff (minutes). The driver bounds its own statements and checkouts on
//! the client side, and watches the link while a handler's statements run.

use std::future::Future;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ::sqlx::{ConnectOptions, Connection, PgPool};

/// How long the crate's statements and checkouts, and the link check that watches a
/// handler, may wait on the database by default.
pub(super) const DEFAULT_LINK_TIMEOUT: Duration = Duration::from_secs(4);

/// The link's bound and what the last check of it found.
#[derive(Debug)]
pub(super) struct Link {
    pub(super) timeout: Duration,
    /// When a check last reached the server, and whether it did.
    last: tokio::sync::Mutex<Option<(Instant, bool)>>,
    /// When a check last failed to reach the server.
    lost_at: Mutex<Option<Instant>>,
}

impl Link {
    pub(super) fn new(timeout: Duration) -> Self {
        Self {
            timeout,
            last: tokio::sync::Mutex::new(None),
            lost_at: Mutex::new(None),
        }
    }

    /// `work`, failed as a timed-out I/O error (a lost link, transient) if it takes longer
    /// than the bound plus `extra`.
    pub(super) async fn within<T>(
        &self,
        extra: Duration,
        work: impl Future<Output = Result<T, ::sqlx::Error>>,
    ) -> Result<T, ::sqlx::Error> {
        Self::bounded(self.timeout + extra, work).await
    }

    /// `work`, failed as a timed-out I/O error if it takes longer than `bound`.
    pub(super) async fn bounded<T>(
        bound: Duration,
        work: impl Future<Output = Result<T, ::sqlx::Error>>,
    ) -> Result<T, ::sqlx::Error> {
        match tokio::time::timeout(bound, work).await {
            Ok(done) => done,
            Err(_elapsed) => Err(::sqlx::Error::Io(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("the database did not answer within {bound:?}"),
            ))),
        }
    }

    /// Whether a check found the link down within the last bound: a connection that just
    /// failed is closed rather than sent a `ROLLBACK` that cannot arrive.
    pub(super) fn recently_lost(&self) -> bool {
        self.lost_at
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some_and(|at| at.elapsed() < self.timeout)
    }

    /// Resolves once a check finds the server unreachable: every half bound, a fresh
    /// connection (bounded by half the bound) — shared by every request that waits at the
    /// same time. A handler whose statements run long on a healthy link is left alone.
    pub(super) async fn lost(&self, pool: &PgPool) {
        let half = self.timeout / 2;
        loop {
            tokio::time::sleep(half).await;
            if !self.reachable(pool, half).await {
                return;
            }
        }
    }

    async fn reachable(&self, pool: &PgPool, within: Duration) -> bool {
        let mut last = self.last.lock().await;
        if let Some((at, reached)) = *last {
            if at.elapsed() < within {
                return reached;
            }
        }
        let options = pool.connect_options();
        let reached = match tokio::time::timeout(within, options.connect()).await {
            Ok(Ok(conn)) => {
                // Closing a fresh connection sends one message; do not wait on it long.
                let _ = tokio::time::timeout(within, conn.close()).await;
                true
            }
            // Refused, reset, or no answer: the server cannot be reached right now.
            Ok(Err(error)) => {
                tracing::debug!(%error, "link check failed");
                !matches!(error, ::sqlx::Error::Io(_))
            }
            Err(_elapsed) => false,
        };
        if !reached {
            tracing::warn!(
                ?within,
                "the database is unreachable; abandoning in-flight work"
            );
            *self.lost_at.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
        }
        *last = Some((Instant::now(), reached));
        reached
    }
}
