//! The troubleshooting view: the troubleshooting checklist as a small API.
//!
//! When a client reports "my retry was refused" or "my payment ran twice": look the key up
//! in its scope and compare the stored fingerprint and state with what the client sent; list
//! the PROCESSING records whose lease has lapsed; look at a consumer's failed messages; purge
//! what has expired now rather than at the sweeper's next run.
//! `examples/idempotency_admin.rs` is a command-line tool over it.

use crate::engine::error::Error;
use crate::engine::key::{IdempotencyKey, RecordId};
use crate::engine::view::{MessageInfo, OutboxInfo, OutboxState, RecordInfo};
use crate::ops::sweeper::{SweepReport, Sweeper};
use crate::store::{InboxStore, IntoStore, MaintenanceStore, OutboxStore, Store};

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
pub struct Admin<D: Store> {
    store: D,
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
}

/// Outbox messages: the backlog, the parked ones, and sending a parked one again.
impl<D: OutboxStore> Admin<D> {
    /// Outbox messages in `state`, oldest first, at most `limit`: the pending backlog while
    /// the broker is down, or the messages parked after the broker kept refusing them
    /// (each with its last error).
    ///
    /// ```no_run
    /// use axum_idempotency::OutboxState;
    ///
    /// # async fn run(admin: axum_idempotency::Admin<axum_idempotency::postgres::PgStore>) -> Result<(), axum_idempotency::Error> {
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
}

/// Idempotency records: a key's record, the stale leases, an on-demand purge.
impl<D: MaintenanceStore> Admin<D> {
    /// The record for `key` in `scope`, expired or not. `key` is taken as the client sent it
    /// in the header: quoted (`"abc"`) and bare (`abc`) name the same record.
    ///
    /// Returns `Ok(None)` when no record exists, and [`Error::InvalidKey`] when `key` is not
    /// a valid `Idempotency-Key` value (the layer would have refused the request).
    ///
    /// ```no_run
    /// # async fn run(admin: axum_idempotency::Admin<axum_idempotency::postgres::PgStore>) -> Result<(), axum_idempotency::Error> {
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
    /// # async fn run(admin: axum_idempotency::Admin<axum_idempotency::postgres::PgStore>) -> Result<(), axum_idempotency::Error> {
    /// for record in admin.stale(10).await? {
    ///     eprintln!("record {} (scope {:?}) lost its lease", record.id, record.scope);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn stale(&self, limit: i64) -> Result<Vec<RecordInfo>, Error> {
        self.store.stale_records(limit.max(0)).await
    }

    /// Purges expired records now, with the [`Sweeper`]'s default retention (SUCCESS at
    /// expiry, FAILED 7 days after), and reports as one sweep does.
    ///
    /// ```no_run
    /// # async fn run(admin: axum_idempotency::Admin<axum_idempotency::postgres::PgStore>) -> Result<(), axum_idempotency::Error> {
    /// let report = admin.purge_now().await?;
    /// println!("{} records, {} messages purged", report.purged_records, report.purged_messages);
    /// # Ok(()) }
    /// ```
    pub async fn purge_now(&self) -> Result<SweepReport, Error> {
        Sweeper::new(self.store.clone()).run_once().await
    }
}

/// Inbox records: one message, a consumer group's failed ones.
impl<D: InboxStore> Admin<D> {
    /// The inbox record of one message, expired or not.
    ///
    /// ```no_run
    /// # async fn run(admin: axum_idempotency::Admin<axum_idempotency::postgres::PgStore>) -> Result<(), axum_idempotency::Error> {
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
    /// # async fn run(admin: axum_idempotency::Admin<axum_idempotency::postgres::PgStore>) -> Result<(), axum_idempotency::Error> {
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
}
