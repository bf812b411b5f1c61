//! [`OutboxRelay`]: publishes committed outbox messages, marks them SENT after the
//! broker's confirm, and is safe to run in every app instance at once.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::{Outgoing, PublishError, Publisher};
use crate::engine::error::Chain;
use crate::engine::error::Error;
use crate::engine::listener::Listener;
use crate::engine::outbox::{Settlement, lanes};
use crate::engine::telemetry;
use crate::store::{IntoStore, OutboxStore, Store};

/// The relay: takes the outbox's pending messages in batches and hands them to a
/// [`Publisher`].
///
/// Each batch is locked `FOR UPDATE SKIP LOCKED` in a transaction of its own, so relays in
/// several app instances never publish the same message at the same time. A message is
/// marked SENT, in that transaction, only after the publisher returned (for RabbitMQ: the
/// broker's confirm); a relay that dies before the commit leaves it pending, and it is
/// published again — with the same message id, so the consumer's
/// [`Inbox`](crate::Inbox) sees a duplicate. Delivery is at least once; with the Inbox,
/// the effect happens once.
///
/// Messages that share an ordering key are published in commit order, one after the
/// other's confirm; all others in parallel.
///
/// ```no_run
/// # #[cfg(feature = "rabbitmq")]
/// # async fn run(pool: deadpool_postgres::Pool, database_url: &str) -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use axum_idempotency::outbox::{Listener, OutboxRelay, RabbitPublisher};
///
/// let relay = OutboxRelay::new(pool, RabbitPublisher::new("amqp://guest:guest@127.0.0.1:5672/%2f"))
///     // Woken within milliseconds of a COMMIT; polls every 5 s as a fallback.
///     .listen(Listener::postgres(database_url.parse()?))
///     .poll_interval(Duration::from_secs(5))
///     .spawn();
/// // ... serve ...
/// relay.shutdown().await;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct OutboxRelay<P, D: Store> {
    store: D,
    publisher: P,
    config: RelayConfig,
    /// When the pending gauges were last refreshed (see [`PENDING_REFRESH`]).
    pending_refreshed: std::sync::Mutex<Option<Instant>>,
}

/// The pending gauges scan the pending rows: a relay draining a backlog batch after batch
/// refreshes them at most this often.
const PENDING_REFRESH: Duration = Duration::from_secs(1);

#[derive(Debug, Clone)]
struct RelayConfig {
    batch_size: u32,
    poll_interval: Duration,
    max_attempts: u32,
    retry_delay: Duration,
    max_retry_delay: Duration,
    max_backoff: Duration,
    publish_timeout: Duration,
    listen: Option<Listener>,
}

/// What one [`OutboxRelay::run_once`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RelayReport {
    /// Messages the batch locked.
    pub locked: usize,
    /// Messages the broker confirmed, now SENT.
    pub published: usize,
    /// Messages the broker refused this time (retried later, or parked).
    pub refused: usize,
    /// Refused messages that reached `max_attempts` and are now parked as FAILED.
    pub parked: u64,
    /// Messages left pending behind an earlier pending message of their ordering key.
    pub held_back: usize,
    /// The broker was unavailable: the rest of the batch was left pending, no attempt
    /// counted.
    pub unavailable: bool,
}

impl<P: Publisher, D: OutboxStore> OutboxRelay<P, D> {
    /// A relay over the outbox in `pool`'s database (any pool the crate supports, see
    /// [`IntoStore`]) that publishes through `publisher`. Run
    /// [`migrate`](crate::migrate) first.
    pub fn new<T: IntoStore<Store = D>>(pool: T, publisher: P) -> Self {
        Self {
            store: pool.into_store(),
            publisher,
            config: RelayConfig {
                batch_size: 100,
                poll_interval: Duration::from_secs(1),
                max_attempts: 10,
                retry_delay: Duration::from_secs(1),
                max_retry_delay: Duration::from_secs(300),
                max_backoff: Duration::from_secs(30),
                publish_timeout: Duration::from_secs(30),
                listen: None,
            },
            pending_refreshed: std::sync::Mutex::new(None),
        }
    }

    /// Messages locked and published per batch (and per transaction). Default: 100.
    #[must_use]
    pub fn batch_size(mut self, messages: u32) -> Self {
        self.config.batch_size = messages.max(1);
        self
    }

    /// How often a spawned relay looks for messages when nothing woke it. With
    /// [`listen`](Self::listen) this is only the fallback; without it (behind a
    /// transaction-pooling PgBouncer, where `LISTEN` does not work) it is the latency.
    /// Default: 1 s.
    #[must_use]
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.config.poll_interval = interval.max(Duration::from_millis(1));
        self
    }

    /// After this many refusals a message is parked as FAILED with its last error (see
    /// [`Admin::outbox_messages`](crate::Admin::outbox_messages)). Default: 10.
    #[must_use]
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.config.max_attempts = attempts.max(1);
        self
    }

    /// A refused message's next attempt waits `delay × 2^attempts`, at most `max`.
    /// Default: 1 s, at most 5 minutes.
    #[must_use]
    pub fn retry_delay(mut self, delay: Duration, max: Duration) -> Self {
        self.config.retry_delay = delay;
        self.config.max_retry_delay = max.max(delay);
        self
    }

    /// While the broker (or the database) is unavailable the relay waits 100 ms, then
    /// twice as long after every failed batch, at most this long. Default: 30 s.
    #[must_use]
    pub fn max_backoff(mut self, max: Duration) -> Self {
        self.config.max_backoff = max.max(Duration::from_millis(100));
        self
    }

    /// How long one publish may wait for the broker's answer before the broker counts as
    /// unavailable. Default: 30 s.
    #[must_use]
    pub fn publish_timeout(mut self, timeout: Duration) -> Self {
        self.config.publish_timeout = timeout;
        self
    }

    /// Wakes the spawned relay within milliseconds of a COMMIT that enqueued messages:
    /// `listener` keeps a connection of its own that `LISTEN`s for the outbox table's
    /// trigger, and reconnects when it is lost. Polling stays on as the fallback. Build the
    /// listener from your driver ([`Listener`]). Default: off.
    #[must_use]
    pub fn listen(mut self, listener: Listener) -> Self {
        self.config.listen = Some(listener);
        self
    }

    /// Whether the relay's statements are prepared (once per pooled connection) or sent
    /// unprepared with their parameter types. Default: `true`; turn it off behind a
    /// PgBouncer in transaction pooling mode without prepared-statement support.
    #[must_use]
    pub fn prepared_statements(mut self, enabled: bool) -> Self {
        self.store.set_prepared_statements(enabled);
        self
    }

    /// Publishes one batch: locks up to [`batch_size`](Self::batch_size) due messages,
    /// publishes them (each ordering key in order, the rest in parallel), marks the
    /// confirmed ones SENT and the refused ones retried or parked, and commits. Also
    /// refreshes the pending gauges (at most once a second: they scan the pending rows).
    ///
    /// A database error leaves every message of the batch pending (those already
    /// confirmed are published again later).
    pub async fn run_once(&self) -> Result<RelayReport, Error> {
        let report = self.run_batch().await;
        self.refresh_pending().await;
        report
    }

    async fn run_batch(&self) -> Result<RelayReport, Error> {
        let Some(batch) = self
            .store
            .outbox_lock_batch(i64::from(self.config.batch_size))
            .await?
        else {
            return Ok(RelayReport::default());
        };
        let locked = batch.rows.len();
        let plan = lanes(batch.rows, &batch.barriers);
        let broker_down = AtomicBool::new(false);
        let lanes = futures_util::future::join_all(
            plan.lanes
                .iter()
                .map(|lane| self.publish_lane(lane, &broker_down)),
        )
        .await;
        let mut sent = Vec::new();
        let (mut refused, mut errors) = (Vec::new(), Vec::new());
        for lane in lanes {
            sent.extend(lane.sent);
            if let Some((seq, error)) = lane.refused {
                refused.push(seq);
                errors.push(error);
            }
        }
        let settlement = Settlement {
            sent: &sent,
            refused: &refused,
            errors: &errors,
            max_attempts: i32::try_from(self.config.max_attempts).unwrap_or(i32::MAX),
            retry_base_seconds: self.config.retry_delay.as_secs_f64(),
            retry_cap_seconds: self.config.max_retry_delay.as_secs_f64(),
        };
        let parked = D::outbox_settle(batch.conn, &settlement).await?;
        telemetry::outbox_settled(sent.len(), parked);
        if parked > 0 {
            tracing::warn!(parked, "outbox messages parked after their attempts");
        }
        Ok(RelayReport {
            locked,
            published: sent.len(),
            refused: refused.len(),
            parked,
            held_back: plan.held_back,
            unavailable: broker_down.load(Ordering::Relaxed),
        })
    }

    /// Publishes a lane in order, stopping at its first failure: the rest of its key
    /// stays pending behind it.
    async fn publish_lane(&self, lane: &[Outgoing], broker_down: &AtomicBool) -> Lane {
        let mut done = Lane {
            sent: Vec::new(),
            refused: None,
        };
        for message in lane {
            if broker_down.load(Ordering::Relaxed) {
                break;
            }
            let started = Instant::now();
            let published =
                tokio::time::timeout(self.config.publish_timeout, self.publisher.publish(message))
                    .await
                    .unwrap_or_else(|_| {
                        Err(PublishError::unavailable(
                            "the broker did not answer within the publish timeout",
                        ))
                    });
            match published {
                Ok(()) => {
                    telemetry::outbox_lag(message.age_seconds + started.elapsed().as_secs_f64());
                    done.sent.push(message.seq);
                }
                Err(error) if error.is_unavailable() => {
                    if !broker_down.swap(true, Ordering::Relaxed) {
                        tracing::warn!(error = %Chain(&error), "outbox relay: broker unavailable");
                    }
                    telemetry::outbox_publish_failure("unavailable");
                    break;
                }
                Err(error) => {
                    let text = Chain(&error).to_string();
                    tracing::info!(message = %message.message_id, attempts = message.attempts + 1,
                        error = %text, "outbox message refused");
                    telemetry::outbox_publish_failure("refused");
                    done.refused = Some((message.seq, text));
                    break;
                }
            }
        }
        done
    }

    async fn refresh_pending(&self) {
        {
            let mut refreshed = self
                .pending_refreshed
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if refreshed.is_some_and(|at| at.elapsed() < PENDING_REFRESH) {
                return;
            }
            *refreshed = Some(Instant::now());
        }
        match self.store.outbox_pending().await {
            Ok(pending) => telemetry::outbox_pending(pending.count, pending.oldest_seconds),
            Err(error) => {
                tracing::debug!(error = %Chain(&error), "could not count pending outbox messages");
            }
        }
    }

    /// Runs the relay on a tokio task until [`RelayHandle::shutdown`]: a batch at once
    /// after a full one, otherwise when [`listen`](Self::listen) wakes it or the
    /// [`poll_interval`](Self::poll_interval) passes; after a failure (broker or database
    /// unavailable) it backs off, doubling from 100 ms up to
    /// [`max_backoff`](Self::max_backoff).
    ///
    /// Must be called within a tokio runtime. Dropping the handle detaches the task.
    #[must_use = "dropping the handle leaves the relay running with no way to stop it"]
    pub fn spawn(self) -> RelayHandle {
        let token = CancellationToken::new();
        let wake = Arc::new(Notify::new());
        let listener = self
            .config
            .listen
            .clone()
            .map(|listener| tokio::spawn(listener.run(Arc::clone(&wake), token.clone())));
        let stop = token.clone();
        let task = tokio::spawn(async move { self.run(&wake, &stop).await });
        RelayHandle {
            token,
            task,
            listener,
        }
    }

    async fn run(&self, wake: &Notify, stop: &CancellationToken) {
        const FIRST_BACKOFF: Duration = Duration::from_millis(100);
        let mut backoff = FIRST_BACKOFF;
        loop {
            if stop.is_cancelled() {
                return;
            }
            // A batch in progress finishes (each publish is bounded by the publish
            // timeout): abandoning it after a confirm would publish those messages again.
            let result = self.run_once().await;
            let pause = match result {
                Ok(report) if report.unavailable => Some(backoff),
                Ok(report) => {
                    backoff = FIRST_BACKOFF;
                    let full = report.locked >= self.config.batch_size as usize;
                    if full && report.published + report.refused > 0 {
                        continue;
                    }
                    None
                }
                Err(error) => {
                    tracing::error!(error = %Chain(&error), "outbox relay batch failed");
                    Some(backoff)
                }
            };
            if let Some(pause) = pause {
                backoff = (backoff * 2).min(self.config.max_backoff);
                tokio::select! {
                    biased;
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(pause) => {}
                }
                continue;
            }
            tokio::select! {
                biased;
                () = stop.cancelled() => return,
                () = wake.notified() => {}
                () = tokio::time::sleep(self.config.poll_interval) => {}
            }
        }
    }
}

struct Lane {
    sent: Vec<i64>,
    refused: Option<(i64, String)>,
}

/// Controls an [`OutboxRelay::spawn`]ed task.
#[derive(Debug)]
pub struct RelayHandle {
    token: CancellationToken,
    task: JoinHandle<()>,
    listener: Option<JoinHandle<()>>,
}

impl RelayHandle {
    /// Stops the relay and waits for its task to end. A batch in progress finishes first,
    /// so what the broker confirmed is marked SENT and not published again. (A relay that
    /// dies mid-batch instead leaves the batch pending: its messages are published again,
    /// with the same ids.)
    pub async fn shutdown(self) {
        self.token.cancel();
        for task in std::iter::once(self.task).chain(self.listener) {
            if let Err(error) = task.await {
                if error.is_panic() {
                    std::panic::resume_unwind(error.into_panic());
                }
            }
        }
    }
}
