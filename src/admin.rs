//! The troubleshooting view: the troubleshooting checklist as a small API.
//!
//! When a client reports "my retry was refused" or "my payment ran twice": look the key up
//! in its scope and compare the stored fingerprint and state with what the client sent; list
//! the PROCESSING records whose lease has lapsed; look at a consumer's failed messages; purge
//! what has expired now rather than at the sweeper's next run.
//! `examples/idempotency_admin.rs` is a command-line tool over it.

use std::time::SystemTime;

use crate::engine::key::{RecordId, hex};
use crate::postgres::PgStore;
use crate::store::{IntoStore, Store};
use crate::sweeper::{SweepReport, Sweeper};
use crate::{Error, IdempotencyKey};

/// Read-only looks into the crate's tables, plus an on-demand purge.
///
/// Cloning is cheap (the pool is a reference-counted handle). Every method checks out one
/// connection and runs one statement (the purge: a few).
///
/// ```no_run
/// use axum_idempotency::Admin;
///
/// # async fn run(pool: deadpool_postgres::Pool) -> Result<(), axum_idempotency::Error> {
/// let admin = Admin::new(pool);
///
/// // "Was my request with this key processed?"
/// match admin.lookup("tenant-42", "8e03978e-40d5-43e8-bc93-6894a57f9324").await? {
///     Some(record) => println!(
///         "{} {} fingerprint {} expires {:?}",
///         record.state, record.status, record.fingerprint, record.expires_at
///     ),
///     None => println!("no record: the request never committed, or it expired"),
/// }
///
/// // Leases that outlived their holder.
/// for record in admin.stale(20).await? {
///     println!("{} stuck since {:?}", record.id, record.locked_until);
/// }
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Admin<D: Store = PgStore> {
    store: D,
}

/// A stored idempotency record, as [`Admin`] shows it. The response itself is not
/// included, only its size.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RecordInfo {
    /// The record id (first 16 bytes of SHA-256 over scope and key), 32 hex digits. Log
    /// lines and spans show its first 16.
    pub id: String,
    /// The scope the key belongs to (empty when unscoped).
    pub scope: String,
    /// The raw key, when the layer was configured to store it.
    pub key: Option<String>,
    /// `PROCESSING`, `SUCCESS` or `FAILED`.
    pub state: String,
    /// For `FAILED`: whether the next retry runs the handler again.
    pub retryable: bool,
    /// The stored response status (0 while `PROCESSING`, if none was stored).
    pub status: u16,
    /// The request fingerprint: SHA-256 over method, path and query, chosen headers and
    /// body, 64 hex digits. A retry with another fingerprint is refused with 422.
    pub fingerprint: String,
    /// Lease mode: the fencing token of the current holder.
    pub fencing_token: i64,
    /// When the record was first written.
    pub created_at: SystemTime,
    /// When the record last changed.
    pub updated_at: SystemTime,
    /// After this the record is ignored and the key can be used again.
    pub expires_at: SystemTime,
    /// Lease mode: until when the holder's lease runs.
    pub locked_until: Option<SystemTime>,
    /// Size of the stored response headers and body, in bytes.
    pub response_bytes: usize,
}

/// A consumed message's inbox record, as [`Admin`] shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct MessageInfo {
    /// The consumer group.
    pub consumer_group: String,
    /// The message id.
    pub message_id: String,
    /// `SUCCESS` or `FAILED`.
    pub status: String,
    /// Attempts so far (for `SUCCESS`: attempts it took).
    pub attempts: u32,
    /// The error of the last failed attempt.
    pub last_error: Option<String>,
    /// SHA-256 of the payload, 64 hex digits, when the consumer passed one.
    pub payload_digest: Option<String>,
    /// When the message was first recorded.
    pub created_at: SystemTime,
    /// When the record last changed.
    pub updated_at: SystemTime,
    /// After this the record is ignored and the message would be processed again.
    pub expires_at: SystemTime,
}

/// An outbox message, as [`Admin`] shows it. The payload itself is not included, only its
/// size.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct OutboxInfo {
    /// Position in the outbox: commit order within an ordering key.
    pub seq: i64,
    /// The message id the consumer deduplicates on.
    pub message_id: String,
    /// The topic (for RabbitMQ, the routing key).
    pub topic: String,
    /// The ordering key, if any.
    pub ordering_key: Option<String>,
    /// `PENDING`, `SENT` or `FAILED` (parked after its attempts).
    pub state: String,
    /// Attempts the broker refused (for `SENT`: attempts it took).
    pub attempts: u32,
    /// The broker's last refusal.
    pub last_error: Option<String>,
    /// Size of the payload, in bytes.
    pub payload_bytes: usize,
    /// When the message was enqueued.
    pub created_at: SystemTime,
    /// When the broker confirmed it.
    pub sent_at: Option<SystemTime>,
}

/// Which outbox messages [`Admin::outbox_messages`] lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum OutboxState {
    /// Waiting for a relay (or for their next attempt).
    Pending,
    /// Confirmed by the broker.
    Sent,
    /// Parked after the broker refused them `max_attempts` times.
    Failed,
}

impl OutboxState {
    fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "PENDING",
            Self::Sent => "SENT",
            Self::Failed => "FAILED",
        }
    }
}

impl<D: Store> Admin<D> {
    /// An admin view over the crate's tables in `pool`'s database (any pool the crate
    /// supports, see [`IntoStore`]).
    pub fn new<P: IntoStore<Store = D>>(pool: P) -> Self {
        Self {
            store: pool.into_store(),
        }
    }

    /// Whether the admin view's statements (and [`purge_now`](Self::purge_now)'s) are
    /// prepared (once per pooled connection, then reused) or sent unprepared with their
    /// parameter types, one round trip each.
    ///
    /// Default: `true`. Turn it off behind a PgBouncer in transaction pooling mode that
    /// does not support prepared statements (before 1.21, or `max_prepared_statements`
    /// unset): there the next statement may run on another server connection, where a
    /// statement prepared earlier does not exist.
    #[must_use]
    pub fn prepared_statements(mut self, enabled: bool) -> Self {
        self.store.set_prepared_statements(enabled);
        self
    }

    /// Outbox messages in `state`, oldest first, at most `limit`: the pending backlog while
    /// the broker is down, or the messages parked after the broker kept refusing them
    /// (each with its last error).
    ///
    /// ```no_run
    /// use axum_idempotency::OutboxState;
    ///
    /// # async fn run(admin: axum_idempotency::Admin) -> Result<(), axum_idempotency::Error> {
    /// for message in admin.outbox_messages(OutboxState::Failed, 20).await? {
    ///     println!("{} to {}: {:?}", message.message_id, message.topic, message.last_error);
    ///     // Once the queue exists (or the consumer is fixed), send it again:
    ///     admin.requeue_outbox(&message.message_id).await?;
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn outbox_messages(
        &self,
        state: OutboxState,
        limit: u32,
    ) -> Result<Vec<OutboxInfo>, Error> {
        self.store
            .outbox_messages(state.as_str(), i64::from(limit))
            .await
    }

    /// Puts a parked (`FAILED`) outbox message back in the queue with its attempts reset;
    /// `false` when no parked message has that id.
    pub async fn requeue_outbox(&self, message_id: &str) -> Result<bool, Error> {
        self.store.outbox_requeue(message_id).await
    }

    /// The record for `key` in `scope`, expired or not. `key` is taken as the client sent it
    /// in the header: quoted (`"abc"`) and bare (`abc`) name the same record.
    ///
    /// Returns `Ok(None)` when no record exists, and [`Error::InvalidKey`] when `key` is not
    /// a valid `Idempotency-Key` value (the layer would have refused the request).
    ///
    /// ```no_run
    /// # async fn run(admin: axum_idempotency::Admin) -> Result<(), axum_idempotency::Error> {
    /// let record = admin.lookup("", r#""order-42""#).await?;
    /// assert_eq!(record, admin.lookup("", "order-42").await?);
    /// # Ok(()) }
    /// ```
    pub async fn lookup(&self, scope: &str, key: &str) -> Result<Option<RecordInfo>, Error> {
        let key = IdempotencyKey::parse(key.as_bytes()).map_err(Error::InvalidKey)?;
        let id = RecordId::from_parts(scope, key.as_str());
        self.store.record_info(id).await
    }

    /// PROCESSING records whose lease has run out, the longest-expired lease first, at most
    /// `limit` of them.
    ///
    /// ```no_run
    /// # async fn run(admin: axum_idempotency::Admin) -> Result<(), axum_idempotency::Error> {
    /// for record in admin.stale(10).await? {
    ///     eprintln!("record {} (scope {:?}) lost its lease", record.id, record.scope);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn stale(&self, limit: i64) -> Result<Vec<RecordInfo>, Error> {
        self.store.stale_records(limit.max(0)).await
    }

    /// The inbox record of one message, expired or not.
    ///
    /// ```no_run
    /// # async fn run(admin: axum_idempotency::Admin) -> Result<(), axum_idempotency::Error> {
    /// if let Some(message) = admin.inbox_message("coupon-service", "msg-001").await? {
    ///     println!("{} after {} attempts", message.status, message.attempts);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn inbox_message(
        &self,
        consumer_group: &str,
        message_id: &str,
    ) -> Result<Option<MessageInfo>, Error> {
        self.store.message_info(consumer_group, message_id).await
    }

    /// A consumer group's FAILED messages, the most recently failed first, at most `limit`.
    ///
    /// ```no_run
    /// # async fn run(admin: axum_idempotency::Admin) -> Result<(), axum_idempotency::Error> {
    /// for message in admin.failed_messages("coupon-service", 50).await? {
    ///     println!("{}: {:?}", message.message_id, message.last_error);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn failed_messages(
        &self,
        consumer_group: &str,
        limit: i64,
    ) -> Result<Vec<MessageInfo>, Error> {
        self.store
            .failed_messages(consumer_group, limit.max(0))
            .await
    }

    /// Purges expired records now, with the [`Sweeper`]'s default retention (SUCCESS at
    /// expiry, FAILED 7 days after), and reports as one sweep does.
    ///
    /// ```no_run
    /// # async fn run(admin: axum_idempotency::Admin) -> Result<(), axum_idempotency::Error> {
    /// let report = admin.purge_now().await?;
    /// println!("{} records, {} messages purged", report.purged_records, report.purged_messages);
    /// # Ok(()) }
    /// ```
    pub async fn purge_now(&self) -> Result<SweepReport, Error> {
        Sweeper::new(self.store.clone()).run_once().await
    }
}

/// A time the database sent as seconds since the Unix epoch.
pub(crate) fn epoch(seconds: f64) -> SystemTime {
    match std::time::Duration::try_from_secs_f64(seconds.abs()) {
        Ok(offset) if seconds >= 0.0 => SystemTime::UNIX_EPOCH + offset,
        Ok(offset) => SystemTime::UNIX_EPOCH - offset,
        Err(_) => SystemTime::UNIX_EPOCH,
    }
}

/// The columns of an admin record row (`sql::ADMIN_RECORD`, `sql::ADMIN_STALE`), as a
/// driver decoded them.
#[derive(Debug)]
pub(crate) struct RecordColumns {
    pub(crate) id: Vec<u8>,
    pub(crate) scope: String,
    pub(crate) key: Option<String>,
    pub(crate) state: String,
    pub(crate) retryable: bool,
    pub(crate) status: i16,
    pub(crate) fingerprint: Vec<u8>,
    pub(crate) fencing_token: i64,
    pub(crate) created_at: f64,
    pub(crate) updated_at: f64,
    pub(crate) expires_at: f64,
    pub(crate) locked_until: Option<f64>,
    pub(crate) response_bytes: i64,
}

impl From<RecordColumns> for RecordInfo {
    fn from(c: RecordColumns) -> Self {
        Self {
            id: hex(&c.id),
            scope: c.scope,
            key: c.key,
            state: c.state,
            retryable: c.retryable,
            status: u16::try_from(c.status).unwrap_or(0),
            fingerprint: hex(&c.fingerprint),
            fencing_token: c.fencing_token,
            created_at: epoch(c.created_at),
            updated_at: epoch(c.updated_at),
            expires_at: epoch(c.expires_at),
            locked_until: c.locked_until.map(epoch),
            response_bytes: usize::try_from(c.response_bytes).unwrap_or(usize::MAX),
        }
    }
}

/// The columns of an admin outbox row (`sql::ADMIN_OUTBOX`), as a driver decoded them.
#[derive(Debug)]
pub(crate) struct OutboxColumns {
    pub(crate) seq: i64,
    pub(crate) message_id: String,
    pub(crate) topic: String,
    pub(crate) ordering_key: Option<String>,
    pub(crate) state: String,
    pub(crate) attempts: i32,
    pub(crate) last_error: Option<String>,
    pub(crate) payload_bytes: i64,
    pub(crate) created_at: f64,
    pub(crate) sent_at: Option<f64>,
}

impl From<OutboxColumns> for OutboxInfo {
    fn from(c: OutboxColumns) -> Self {
        Self {
            seq: c.seq,
            message_id: c.message_id,
            topic: c.topic,
            ordering_key: c.ordering_key,
            state: c.state,
            attempts: u32::try_from(c.attempts).unwrap_or(0),
            last_error: c.last_error,
            payload_bytes: usize::try_from(c.payload_bytes).unwrap_or(usize::MAX),
            created_at: epoch(c.created_at),
            sent_at: c.sent_at.map(epoch),
        }
    }
}

/// The columns of an admin message row (`sql::ADMIN_MESSAGE`, `sql::ADMIN_FAILED_MESSAGES`).
#[derive(Debug)]
pub(crate) struct MessageColumns {
    pub(crate) consumer_group: String,
    pub(crate) message_id: String,
    pub(crate) status: String,
    pub(crate) attempts: i32,
    pub(crate) last_error: Option<String>,
    pub(crate) payload_digest: Option<Vec<u8>>,
    pub(crate) created_at: f64,
    pub(crate) updated_at: f64,
    pub(crate) expires_at: f64,
}

impl From<MessageColumns> for MessageInfo {
    fn from(c: MessageColumns) -> Self {
        Self {
            consumer_group: c.consumer_group,
            message_id: c.message_id,
            status: c.status,
            attempts: u32::try_from(c.attempts).unwrap_or(0),
            last_error: c.last_error,
            payload_digest: c.payload_digest.as_deref().map(hex),
            created_at: epoch(c.created_at),
            updated_at: epoch(c.updated_at),
            expires_at: epoch(c.expires_at),
        }
    }
}
