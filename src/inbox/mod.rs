//! Idempotent message consumption: the Inbox pattern on the same transaction engine as the
//! HTTP layer.
//!
//! Brokers deliver at least once: a consumer that did its work but lost the ACK sees the
//! message again. [`Inbox::process`] makes the redelivery harmless. The consume record,
//! keyed by (consumer group, message id), is inserted in the same PostgreSQL transaction as
//! the consumer's own writes, so it exists exactly when the work committed; a message whose
//! record exists is a [`Outcome::Duplicate`] and the work does not run again.

use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use sha2::{Digest, Sha256};

use crate::engine::key::RecordId;
use crate::engine::record::{InboxClaim, InboxWrite};
use crate::engine::shared_tx::SharedTx;
use crate::engine::telemetry;

mod outcome;
#[cfg(feature = "rabbitmq")]
#[cfg_attr(docsrs, doc(cfg(feature = "rabbitmq")))]
pub mod rabbit;

pub use self::outcome::{InboxError, Outcome};
use crate::store::{ConnOf, IdempotentTx, InboxStore, IntoStore, Store, TxHandle};

/// An idempotent consumer for one consumer group.
///
/// Cloning is cheap (one `Arc`); share one `Inbox` between all workers of a group. The work
/// gets an [`IdempotentTx`] on the transaction that records the message: on tokio-postgres
/// it runs `query`/`execute`, on sqlx `&mut *tx` is the executor.
///
/// ```no_run
/// use axum_idempotency::{Inbox, InboxError};
/// use axum_idempotency::inbox::Outcome;
///
/// # async fn consume(pool: deadpool_postgres::Pool, message_id: &str, payload: &[u8])
/// #     -> Result<(), Box<dyn std::error::Error>> {
/// let inbox = Inbox::new(pool, "coupon-service");
/// let user_id: i64 = 1001;
/// let outcome = inbox
///     .process_payload(message_id, payload, |tx| async move {
///         tx.execute(
///             "INSERT INTO coupon_account (user_id, coupon_code) VALUES ($1, $2)",
///             &[&user_id, &"NEW_USER_50"],
///         )
///         .await?;
///         Ok::<_, axum_idempotency::Error>(())
///     })
///     .await;
/// match outcome {
///     // Done now or before: acknowledge.
///     Ok(Outcome::Processed(())) | Ok(Outcome::Duplicate { .. }) => { /* ack */ }
///     // Failed too often: dead-letter instead of looping forever.
///     Ok(Outcome::GaveUp { attempts, last_error }) => { /* reject without requeue */ }
///     // The work was rolled back: requeue, the broker redelivers.
///     Err(_) => { /* nack with requeue */ }
/// }
/// # Ok(()) }
/// ```
pub struct Inbox<D: Store> {
    config: Arc<InboxConfig<D>>,
}

impl<D: Store> Clone for Inbox<D> {
    fn clone(&self) -> Self {
        Self {
            config: Arc::clone(&self.config),
        }
    }
}

impl<D: Store + fmt::Debug> fmt::Debug for Inbox<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Inbox")
            .field("config", &self.config)
            .finish()
    }
}

#[derive(Clone, Debug)]
struct InboxConfig<D> {
    store: D,
    group: String,
    max_attempts: u32,
    retention: Duration,
    lock_timeout: Duration,
    store_payload: bool,
    /// Encryption at rest of stored payloads (always `None` without feature `encryption`).
    payload_keys: Option<crate::engine::crypto::BodyKeys>,
}

impl<D: InboxStore> Inbox<D> {
    /// An inbox for `consumer_group`, storing records through `pool` (any pool the crate
    /// supports, see [`IntoStore`]). Run [`migrate`](crate::migrate) once before consuming.
    pub fn new<P: IntoStore<Store = D>>(pool: P, consumer_group: impl Into<String>) -> Self {
        Self {
            config: Arc::new(InboxConfig {
                store: pool.into_store(),
                group: consumer_group.into(),
                max_attempts: 5,
                retention: Duration::from_secs(7 * 24 * 3600),
                lock_timeout: Duration::from_secs(10),
                store_payload: false,
                payload_keys: None,
            }),
        }
    }

    fn with(mut self, f: impl FnOnce(&mut InboxConfig<D>)) -> Self {
        f(Arc::make_mut(&mut self.config));
        self
    }

    /// After this many failed attempts a message is given up: [`Outcome::GaveUp`] instead
    /// of another run. Default: 5.
    #[must_use]
    pub fn max_attempts(self, attempts: u32) -> Self {
        self.with(|c| c.max_attempts = attempts.max(1))
    }

    /// How long a record is kept; a message redelivered after that runs again. Choose it
    /// longer than the broker can hold and redeliver a message. Default: 7 days.
    #[must_use]
    pub fn retention(self, retention: Duration) -> Self {
        self.with(|c| c.retention = retention)
    }

    /// How long a worker waits for another worker that is processing the same message
    /// before it gives up with [`InboxError::Busy`]. The waiting worker holds a pooled
    /// connection. Default: 10 seconds.
    #[must_use]
    pub fn lock_timeout(self, timeout: Duration) -> Self {
        self.with(|c| c.lock_timeout = timeout)
    }

    /// Keep the payload passed to [`process_payload`](Self::process_payload) in the record.
    /// Default: off — only its SHA-256 digest is kept, since payloads often carry personal
    /// or payment data.
    #[must_use]
    pub fn store_payload(self, enabled: bool) -> Self {
        self.with(|c| c.store_payload = enabled)
    }

    /// Encrypts the payloads kept by [`store_payload`](Self::store_payload) at rest
    /// (feature `encryption`): AES-256-GCM under the current key of `keys`, bound to the
    /// consumer group and message id; the record's `payload_key_id` column names the key.
    /// The payload's SHA-256 digest stays in clear, for the duplicate check. Default: off.
    ///
    /// ```no_run
    /// # fn f(pool: deadpool_postgres::Pool, key: [u8; 32]) {
    /// use axum_idempotency::{BodyKeys, Inbox};
    ///
    /// let inbox = Inbox::new(pool, "billing")
    ///     .store_payload(true)
    ///     .encrypt_payloads(BodyKeys::new(1, key));
    /// # }
    /// ```
    #[cfg(feature = "encryption")]
    #[cfg_attr(docsrs, doc(cfg(feature = "encryption")))]
    #[must_use]
    pub fn encrypt_payloads(self, keys: crate::engine::crypto::BodyKeys) -> Self {
        self.with(|c| c.payload_keys = Some(keys))
    }

    /// Whether the inbox's own statements are prepared (once per pooled connection, then
    /// reused) or sent unprepared with their parameter types, one round trip each.
    ///
    /// Default: `true`. Turn it off behind a PgBouncer in transaction pooling mode that
    /// does not support prepared statements (before 1.21, or `max_prepared_statements`
    /// unset): there, a statement prepared in one transaction is gone in the next, which
    /// runs on another server connection. The same setting exists on
    /// [`IdempotencyLayer`](crate::IdempotencyLayer::prepared_statements),
    /// [`Sweeper`](crate::Sweeper::prepared_statements) and
    /// [`Admin`](crate::Admin::prepared_statements).
    #[must_use]
    pub fn prepared_statements(self, enabled: bool) -> Self {
        self.with(|c| c.store.set_prepared_statements(enabled))
    }

    /// The consumer group this inbox records for.
    pub fn consumer_group(&self) -> &str {
        &self.config.group
    }

    /// Runs `work` once per message id in this consumer group.
    ///
    /// `work` gets the transaction as the driver's handle; what it writes commits together
    /// with the consume record, or not at all.
    pub async fn process<F, Fut, T, E>(
        &self,
        message_id: &str,
        work: F,
    ) -> Result<Outcome<T>, InboxError<E>>
    where
        F: FnOnce(IdempotentTx<D>) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: fmt::Display,
    {
        self.run(message_id, None, 0, work).await
    }

    /// Like [`process`](Self::process), and keeps the payload's SHA-256 digest in the record
    /// (the payload itself only with [`store_payload`](Self::store_payload)). A duplicate
    /// whose payload differs from the first is logged as a warning.
    pub async fn process_payload<F, Fut, T, E>(
        &self,
        message_id: &str,
        payload: &[u8],
        work: F,
    ) -> Result<Outcome<T>, InboxError<E>>
    where
        F: FnOnce(IdempotentTx<D>) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: fmt::Display,
    {
        self.run(message_id, Some(payload), 0, work).await
    }

    /// Runs a scheduled job's `slot` once, however many schedulers fire it: the job name
    /// and slot (`"nightly-settlement"`, `"2026-12-01"`) make the message id
    /// `job@slot` (so both are printable ASCII without spaces, 255 bytes together at most,
    /// else [`InboxError::InvalidMessageId`]), so the work
    /// and its record commit together, a second scheduler firing the same slot gets
    /// [`Outcome::Duplicate`] (after waiting up to the [`lock_timeout`](Self::lock_timeout)
    /// for one still running, else [`InboxError::Busy`]), and a run that crashed or failed
    /// rolled back and runs again at the next firing.
    ///
    /// For the failover case: a job re-fired after a primary/standby switch finds the
    /// record of the run that committed before it, and does nothing.
    ///
    /// ```no_run
    /// use axum_idempotency::Inbox;
    /// use axum_idempotency::inbox::Outcome;
    ///
    /// # async fn nightly(pool: deadpool_postgres::Pool, day: &str) -> Result<(), Box<dyn std::error::Error>> {
    /// let jobs = Inbox::new(pool, "scheduler");
    /// let outcome = jobs
    ///     .run_once("nightly-settlement", day, |tx| async move {
    ///         tx.execute("INSERT INTO settlements (day) VALUES ($1::text::date)", &[&day])
    ///             .await
    ///     })
    ///     .await?;
    /// if let Outcome::Duplicate { .. } = outcome {
    ///     println!("{day} was settled already");
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn run_once<F, Fut, T, E>(
        &self,
        job: &str,
        slot: &str,
        work: F,
    ) -> Result<Outcome<T>, InboxError<E>>
    where
        F: FnOnce(IdempotentTx<D>) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: fmt::Display,
    {
        self.run(&format!("{job}@{slot}"), None, 0, work).await
    }

    /// `delivered_before`: deliveries of this message the broker counted before this one
    /// (a quorum queue's `x-delivery-count`). Those that ended without a recorded outcome
    /// (the consumer died, its connection or node was lost) count as failed attempts, so a
    /// message that kills its consumer is given up too.
    async fn run<F, Fut, T, E>(
        &self,
        message_id: &str,
        payload: Option<&[u8]>,
        delivered_before: u32,
        work: F,
    ) -> Result<Outcome<T>, InboxError<E>>
    where
        F: FnOnce(IdempotentTx<D>) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: fmt::Display,
    {
        crate::engine::key::validate_message_id(message_id)
            .map_err(InboxError::InvalidMessageId)?;
        let config = &self.config;
        let id = RecordId::from_parts(&config.group, message_id);
        let digest = payload.map(|payload| Sha256::digest(payload).to_vec());
        let stored = payload
            .filter(|_| config.store_payload)
            .map(|payload| {
                crate::engine::crypto::seal_payload(
                    config.payload_keys.as_ref(),
                    &config.group,
                    message_id,
                    payload,
                )
            })
            .transpose()
            .map_err(|e| InboxError::Store(crate::engine::error::Error::Encryption(e)))?;
        let write = InboxWrite {
            group: &config.group,
            message_id,
            payload_digest: digest.as_deref(),
            payload: stored.as_ref().map(|stored| &*stored.bytes),
            payload_key_id: stored.as_ref().and_then(|stored| stored.key_id),
            retention: config.retention,
        };

        let started = Instant::now();
        let claim = config
            .store
            .inbox_claim(id, &config.group, message_id, config.lock_timeout)
            .await
            .map_err(InboxError::Store)?;
        telemetry::claim_time("inbox", started);
        let (conn, found) = match claim {
            InboxClaim::Busy => {
                telemetry::inbox_message("busy");
                return Err(InboxError::Busy);
            }
            InboxClaim::Locked(conn, found) => (conn, found),
        };
        let record = found.filter(|record| record.live);
        if let Some(record) = &record {
            let attempts = u32::try_from(record.attempts).unwrap_or(0);
            if record.succeeded {
                D::rollback(conn).await;
                if digest.is_some()
                    && record.payload_digest.is_some()
                    && record.payload_digest != digest
                {
                    tracing::warn!(group = %config.group, message = %id,
                        "duplicate message id with a different payload");
                }
                tracing::debug!(group = %config.group, message = %id, "duplicate");
                telemetry::inbox_message("duplicate");
                return Ok(Outcome::Duplicate { attempts });
            }
        }
        let recorded = record
            .as_ref()
            .map_or(0, |record| u32::try_from(record.attempts).unwrap_or(0));
        let attempts = recorded.max(delivered_before);
        if attempts >= config.max_attempts {
            D::rollback(conn).await;
            tracing::warn!(group = %config.group, message = %id, attempts, "gave up");
            telemetry::inbox_message("gave_up");
            return Ok(Outcome::GaveUp {
                attempts,
                last_error: record.as_ref().and_then(|record| record.last_error.clone()),
            });
        }
        let prior_attempts = record.as_ref().map_or(0, |r| r.attempts);

        let shared = Arc::new(SharedTx::new(id));
        *shared.slot().await = Some(conn);
        let handle =
            D::Handle::on_shared(&shared).expect("a fresh transaction has no other handle");
        let work = AssertUnwindSafe(work(IdempotentTx::new(handle))).catch_unwind();
        // A driver that cannot see a silent link itself watches it while the work runs.
        let result = tokio::select! {
            biased;
            result = work => result,
            error = config.store.link_lost() => {
                // The work is dropped with its handle; its connection is closed and the
                // server rolls the transaction back. Not the message's failure: no
                // attempt is counted.
                drop(shared.take().await);
                tracing::warn!(group = %config.group, message = %id,
                    error = %crate::engine::error::Chain(&error),
                    "database unreachable; the work was abandoned and rolled back");
                return Err(InboxError::Store(error));
            }
        };
        let leaked = shared.live_handles() > 0;
        // A leaked handle may hold the transaction: it then rolls back when the handle
        // lets go of it.
        let taken = if leaked {
            shared.try_take()
        } else {
            shared.take().await
        };
        let failure = match result {
            Ok(Ok(value)) if !leaked => {
                let Some(mut conn) = taken else {
                    return Err(InboxError::TransactionLeaked);
                };
                let started = Instant::now();
                let committed = D::inbox_commit(&mut conn, &write, prior_attempts + 1).await;
                drop(conn);
                telemetry::commit_time("inbox", started);
                return match committed {
                    Ok(()) => {
                        tracing::debug!(group = %config.group, message = %id, "processed");
                        telemetry::inbox_message("processed");
                        if prior_attempts > 0 {
                            telemetry::retry_success("inbox");
                        }
                        Ok(Outcome::Processed(value))
                    }
                    Err(e) => {
                        tracing::error!(group = %config.group, message = %id, error = %crate::engine::error::Chain(&e),
                            "inbox commit failed");
                        telemetry::inbox_message("failed");
                        Err(InboxError::Store(e))
                    }
                };
            }
            Ok(Ok(_)) => Failure::Leaked,
            Ok(Err(error)) => Failure::Error(error),
            Err(panic) => Failure::Panic(panic_message(panic.as_ref())),
        };
        let text = match &failure {
            Failure::Leaked => "the work kept its transaction handle after returning".to_owned(),
            Failure::Error(error) => error.to_string(),
            Failure::Panic(message) => format!("panicked: {message}"),
        };
        let attempts = match taken {
            // Still under the message's lock: a worker waiting for it sees this attempt.
            Some(conn) => {
                self.fail_under_lock(conn, &write, &text, prior_attempts)
                    .await
            }
            // The work kept its handle: the transaction rolls back when the handle lets go.
            None => self.record_failure(&write, &text, prior_attempts).await,
        };
        tracing::warn!(group = %config.group, message = %id, attempts, error = %text,
            "processing failed; rolled back");
        telemetry::inbox_message("failed");
        Err(match failure {
            Failure::Leaked => InboxError::TransactionLeaked,
            Failure::Error(error) => InboxError::Failed { attempts, error },
            Failure::Panic(message) => InboxError::Panicked { attempts, message },
        })
    }

    /// Rolls the work back to the savepoint after the lock and records the failed attempt
    /// in the same transaction, so the count is up to date before the lock is released;
    /// if that fails, rolls back and records in a transaction of its own.
    async fn fail_under_lock(
        &self,
        conn: ConnOf<D>,
        write: &InboxWrite<'_>,
        error: &str,
        prior: i32,
    ) -> u32 {
        match D::inbox_fail(conn, write, error).await {
            Ok(Some(attempts)) => u32::try_from(attempts).unwrap_or(0),
            Ok(None) => u32::try_from(prior + 1).unwrap_or(0),
            Err(e) => {
                tracing::warn!(error = %crate::engine::error::Chain(&e),
                    "could not record a failed attempt under the message's lock");
                self.record_failure(write, error, prior).await
            }
        }
    }

    /// Records a failed attempt in a short transaction of its own; best effort, since the
    /// work has already been rolled back.
    async fn record_failure(&self, write: &InboxWrite<'_>, error: &str, prior: i32) -> u32 {
        match self.config.store.inbox_record_failure(write, error).await {
            Ok(Some(attempts)) => u32::try_from(attempts).unwrap_or(0),
            Ok(None) => u32::try_from(prior + 1).unwrap_or(0),
            Err(e) => {
                tracing::error!(
                    error = &e as &dyn std::error::Error,
                    "could not record a failed attempt"
                );
                u32::try_from(prior + 1).unwrap_or(0)
            }
        }
    }
}

enum Failure<E> {
    Leaked,
    Error(E),
    Panic(String),
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(message) = panic.downcast_ref::<&str>() {
        (*message).to_owned()
    } else if let Some(message) = panic.downcast_ref::<String>() {
        message.clone()
    } else {
        "non-string panic payload".to_owned()
    }
}
