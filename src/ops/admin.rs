//! The troubleshooting view: the troubleshooting checklist as a small API.
//!
//! When a client reports "my retry was refused" or "my payment ran twice": look the key up
//! in its scope and compare the stored fingerprint and state with what the client sent; list
//! the PROCESSING records whose lease has lapsed; look at a consumer's failed messages; purge
//! what has expired now rather than at the sweeper's next run.
//! `examples/idempotency_admin.rs` is a command-line tool over it.

use bytes::Bytes;

use crate::engine::crypto::{self, BodyKeys};
use crate::engine::error::Error;
use crate::engine::key::{IdempotencyKey, RecordId};
use crate::engine::record::{StoredRow, decode_headers};
use crate::engine::view::{
    ArchivedRecord, MessageInfo, OutboxInfo, OutboxState, Overview, Page, RecordInfo, ResponseBody,
    StoredResponse,
};
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
    pub(crate) store: D,
    body_keys: Option<BodyKeys>,
}

/// The most rows one page holds.
const MAX_PAGE: u32 = 500;

/// The first page's cursor of a list ordered oldest first: before every row.
const BEFORE_ALL: i64 = -9_000_000_000_000_000;
/// The first page's cursor of a list ordered newest first: after every row.
const AFTER_ALL: i64 = 9_000_000_000_000_000;

/// A record id as [`RecordInfo::id`] shows it, or the error for one that is not.
fn record_id(id: &str) -> Result<RecordId, Error> {
    RecordId::from_hex(id).ok_or(Error::InvalidArgument("a record id is 32 hex digits"))
}

/// `micros.rest` of a cursor.
fn split_cursor(cursor: &str) -> Result<(i64, &str), Error> {
    let invalid = || Error::InvalidArgument("not a cursor of this list");
    let (micros, rest) = cursor.split_once('.').ok_or_else(invalid)?;
    Ok((micros.parse().map_err(|_| invalid())?, rest))
}

impl<D: Store> Admin<D> {
    /// An admin view over the crate's tables in `pool`'s database (any pool the crate
    /// supports, see [`IntoStore`]).
    pub fn new<P: IntoStore<Store = D>>(pool: P) -> Self {
        Self {
            store: pool.into_store(),
            body_keys: None,
        }
    }

    /// The keys [`response`](Self::response) opens encrypted bodies with: the layer's
    /// [`encrypt_bodies`](crate::IdempotencyLayer::encrypt_bodies) keys. Without them an
    /// encrypted body is shown as [`ResponseBody::Sealed`] (redacted).
    ///
    /// ```no_run
    /// use axum_idempotency::{Admin, BodyKeys};
    ///
    /// # fn run(pool: deadpool_postgres::Pool, key: [u8; 32]) {
    /// let admin = Admin::new(pool).body_keys(BodyKeys::new(1, key));
    /// # }
    /// ```
    #[cfg(feature = "encryption")]
    #[cfg_attr(docsrs, doc(cfg(feature = "encryption")))]
    #[must_use]
    pub fn body_keys(mut self, keys: BodyKeys) -> Self {
        self.body_keys = Some(keys);
        self
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

    /// A page of pending ([`OutboxState::Pending`]) or parked ([`OutboxState::Failed`])
    /// messages in commit order, at most `limit` (capped at 500); `after` is the previous
    /// page's [`Page::next`] (`None` for the first page). Each page is one index range
    /// scan, however large the table.
    ///
    /// ```no_run
    /// use axum_idempotency::OutboxState;
    ///
    /// # async fn run(admin: axum_idempotency::Admin<axum_idempotency::postgres::PgStore>) -> Result<(), axum_idempotency::Error> {
    /// let mut after = None;
    /// loop {
    ///     let page = admin.outbox_page(OutboxState::Failed, after.as_deref(), 100).await?;
    ///     for message in &page.items {
    ///         println!("{} parked: {:?}", message.message_id, message.last_error);
    ///     }
    ///     match page.next {
    ///         Some(next) => after = Some(next),
    ///         None => break,
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn outbox_page(
        &self,
        state: OutboxState,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Page<OutboxInfo>, Error> {
        let parked = match state {
            OutboxState::Pending => false,
            OutboxState::Failed => true,
            OutboxState::Sent => {
                return Err(Error::InvalidArgument(
                    "only pending and parked messages are paged",
                ));
            }
        };
        let after = match after {
            Some(seq) => seq
                .parse()
                .map_err(|_| Error::InvalidArgument("not a cursor of this list"))?,
            None => 0,
        };
        let limit = limit.clamp(1, MAX_PAGE);
        let rows = self
            .store
            .outbox_page(parked, after, i64::from(limit) + 1)
            .await?;
        let rows = rows
            .into_iter()
            .map(|m| {
                let cursor = m.seq.to_string();
                (m, cursor)
            })
            .collect();
        Ok(Page::from_rows(rows, limit as usize))
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

    /// The archived records of a key (see [`Sweeper::archive`](crate::Sweeper::archive)),
    /// the most recently created first: a key used again after its purge has several.
    /// Found whether or not the key has a live record ([`lookup`](Self::lookup)); the same
    /// key forms are accepted.
    ///
    /// ```no_run
    /// # async fn run(admin: axum_idempotency::Admin<axum_idempotency::postgres::PgStore>) -> Result<(), axum_idempotency::Error> {
    /// for archived in admin.archived("1001", "order-42").await? {
    ///     println!(
    ///         "answered {} at {:?}, archived at {:?}",
    ///         archived.record.status, archived.record.created_at, archived.archived_at
    ///     );
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn archived(&self, scope: &str, key: &str) -> Result<Vec<ArchivedRecord>, Error> {
        let key = IdempotencyKey::parse(key.as_bytes()).map_err(Error::InvalidKey)?;
        let id = RecordId::from_parts(scope, key.as_str());
        let archived = self.store.archived_records(id).await?;
        Ok(archived
            .into_iter()
            .map(|(mut archived, stored)| {
                archived.response = stored.map(|row| self.open(id, row));
                archived
            })
            .collect())
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

    /// A page of stale leases, the longest-expired first, at most `limit` (capped at 500);
    /// `after` is the previous page's [`Page::next`] (`None` for the first page).
    ///
    /// ```no_run
    /// # async fn run(admin: axum_idempotency::Admin<axum_idempotency::postgres::PgStore>) -> Result<(), axum_idempotency::Error> {
    /// let page = admin.stale_page(None, 50).await?;
    /// for record in &page.items {
    ///     println!("{} since {:?}", record.id, record.locked_until);
    /// }
    /// if let Some(next) = page.next {
    ///     let _second = admin.stale_page(Some(&next), 50).await?;
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn stale_page(
        &self,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Page<RecordInfo>, Error> {
        let after = match after {
            Some(cursor) => {
                let (micros, id) = split_cursor(cursor)?;
                (micros, record_id(id)?)
            }
            None => (
                BEFORE_ALL,
                RecordId::from_hex(&"0".repeat(32)).expect("hex"),
            ),
        };
        let limit = limit.clamp(1, MAX_PAGE);
        let rows = self.store.stale_page(after, i64::from(limit) + 1).await?;
        let rows = rows
            .into_iter()
            .map(|(record, micros)| {
                let cursor = format!("{micros}.{}", record.id);
                (record, cursor)
            })
            .collect();
        Ok(Page::from_rows(rows, limit as usize))
    }

    /// The record with id `id` (as [`RecordInfo::id`] shows it).
    ///
    /// ```no_run
    /// # async fn run(admin: axum_idempotency::Admin<axum_idempotency::postgres::PgStore>) -> Result<(), axum_idempotency::Error> {
    /// if let Some(record) = admin.record("2a5a1ada11a9b76e26741e99bb58bb98").await? {
    ///     println!("{} since {:?}", record.state, record.updated_at);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn record(&self, id: &str) -> Result<Option<RecordInfo>, Error> {
        self.store.record_info(record_id(id)?).await
    }

    /// The stored response of record `id` (as [`RecordInfo::id`] shows it): its headers,
    /// and its body, decrypted with the `body_keys` given, or
    /// [`ResponseBody::Sealed`] without them.
    ///
    /// ```no_run
    /// use axum_idempotency::ResponseBody;
    ///
    /// # async fn run(admin: axum_idempotency::Admin<axum_idempotency::postgres::PgStore>, id: &str) -> Result<(), axum_idempotency::Error> {
    /// if let Some(response) = admin.response(id).await? {
    ///     match response.body {
    ///         ResponseBody::Plain(body) => println!("{}", String::from_utf8_lossy(&body)),
    ///         ResponseBody::Sealed { key_id, .. } => println!("encrypted under key {key_id}"),
    ///         _ => {}
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn response(&self, id: &str) -> Result<Option<StoredResponse>, Error> {
        let record = record_id(id)?;
        let Some(row) = self.store.record_response(record).await? else {
            return Ok(None);
        };
        Ok(Some(self.open(record, row)))
    }

    /// A stored response as the operator sees it: the body opened with the body keys, or
    /// sealed without them.
    fn open(&self, record: RecordId, row: StoredRow) -> StoredResponse {
        let headers = decode_headers(&row.headers);
        let len = row.body.len();
        let body = match (row.body_key_id, &self.body_keys) {
            (Some(key_id), None) => ResponseBody::Sealed { key_id, len },
            (key_id, keys) => {
                match crypto::open_body(keys.as_ref(), record, key_id, Bytes::from(row.body)) {
                    Ok(body) => ResponseBody::Plain(body),
                    Err(_) => ResponseBody::Sealed {
                        key_id: key_id.unwrap_or_default(),
                        len,
                    },
                }
            }
        };
        StoredResponse { headers, body }
    }

    /// Releases the stale lease of record `id` held at `fencing_token`, as the
    /// [`Sweeper`] does: the record becomes FAILED and retryable, so the client's next
    /// retry runs the handler again (with a new token; a holder that comes back finds its
    /// completion refused). `false`, changing nothing, when the record is not a stale lease
    /// at that token (released already, completed, or taken over).
    ///
    /// ```no_run
    /// # async fn run(admin: axum_idempotency::Admin<axum_idempotency::postgres::PgStore>) -> Result<(), axum_idempotency::Error> {
    /// for record in admin.stale_page(None, 100).await?.items {
    ///     admin.release_lease(&record.id, record.fencing_token).await?;
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn release_lease(&self, id: &str, fencing_token: i64) -> Result<bool, Error> {
        self.store
            .release_lease(record_id(id)?, fencing_token)
            .await
    }

    /// Deletes record `id` if it is still at `fencing_token` (the token shown with it):
    /// the key can be used afresh. `false`, changing nothing, when it is gone or was taken
    /// over since.
    ///
    /// ```no_run
    /// # async fn run(admin: axum_idempotency::Admin<axum_idempotency::postgres::PgStore>) -> Result<(), axum_idempotency::Error> {
    /// if let Some(record) = admin.lookup("tenant-42", "order-42").await? {
    ///     admin.delete_record(&record.id, record.fencing_token).await?;
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn delete_record(&self, id: &str, fencing_token: i64) -> Result<bool, Error> {
        self.store
            .delete_record(record_id(id)?, fencing_token)
            .await
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

    /// A page of a consumer group's FAILED messages, the most recently failed first, at
    /// most `limit` (capped at 500); `after` is the previous page's [`Page::next`].
    ///
    /// ```no_run
    /// # async fn run(admin: axum_idempotency::Admin<axum_idempotency::postgres::PgStore>) -> Result<(), axum_idempotency::Error> {
    /// let page = admin.failed_page("coupon-service", None, 50).await?;
    /// for message in &page.items {
    ///     println!("{} after {} attempts: {:?}", message.message_id, message.attempts, message.last_error);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn failed_page(
        &self,
        consumer_group: &str,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Page<MessageInfo>, Error> {
        let after = match after {
            Some(cursor) => split_cursor(cursor)?,
            None => (AFTER_ALL, ""),
        };
        let limit = limit.clamp(1, MAX_PAGE);
        let rows = self
            .store
            .failed_page(consumer_group, after, i64::from(limit) + 1)
            .await?;
        let rows = rows
            .into_iter()
            .map(|(message, micros)| {
                let cursor = format!("{micros}.{}", message.message_id);
                (message, cursor)
            })
            .collect();
        Ok(Page::from_rows(rows, limit as usize))
    }

    /// Resets the attempts of a FAILED message, so that its next delivery runs the work
    /// again instead of being given up on. `false`, changing nothing, when the message is
    /// not FAILED or its attempts are already reset.
    ///
    /// ```no_run
    /// # async fn run(admin: axum_idempotency::Admin<axum_idempotency::postgres::PgStore>) -> Result<(), axum_idempotency::Error> {
    /// admin.reset_attempts("coupon-service", "msg-001").await?;
    /// // Now redeliver it (e.g. from the dead-letter queue).
    /// # Ok(()) }
    /// ```
    pub async fn reset_attempts(
        &self,
        consumer_group: &str,
        message_id: &str,
    ) -> Result<bool, Error> {
        self.store.inbox_reset(consumer_group, message_id).await
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

/// The console's overview: every count from an index.
impl<D: MaintenanceStore + InboxStore + OutboxStore> Admin<D> {
    /// Records by state, stale leases, outbox backlog and parked messages, and each
    /// consumer group's failed and given-up inbox messages (given up: at `give_up`
    /// attempts or more, the [`Inbox::max_attempts`](crate::Inbox::max_attempts) in use).
    ///
    /// ```no_run
    /// # async fn run(admin: axum_idempotency::Admin<axum_idempotency::postgres::PgStore>) -> Result<(), axum_idempotency::Error> {
    /// let overview = admin.overview(5).await?;
    /// println!("{} stale leases, {} parked messages", overview.stale, overview.outbox_parked);
    /// # Ok(()) }
    /// ```
    pub async fn overview(&self, give_up: u32) -> Result<Overview, Error> {
        let give_up = i32::try_from(give_up).unwrap_or(i32::MAX);
        let (counts, stale, pending, parked, inbox) = tokio::join!(
            self.store.record_counts(),
            self.store.stale_summary(),
            self.store.outbox_pending(),
            self.store.outbox_parked(),
            self.store.failed_groups(give_up, 100),
        );
        let [processing, failed, records_estimate, archived_estimate] = counts?;
        let (stale, pending, parked) = (stale?, pending?, parked?);
        Ok(Overview {
            // The planner's figure lags the table (PostgreSQL has none before its first
            // `ANALYZE`): never fewer than the rows counted beside it.
            records_estimate: records_estimate.max(processing + failed),
            archived_estimate,
            processing,
            failed,
            stale: stale.count,
            stale_oldest_seconds: stale.oldest_seconds,
            outbox_pending: pending.count,
            outbox_oldest_pending_seconds: pending.oldest_seconds,
            outbox_parked: parked.count,
            inbox: inbox?,
        })
    }
}
