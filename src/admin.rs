//! The troubleshooting view: the article's checklist as a small API.
//!
//! When a client reports "my retry was refused" or "my payment ran twice": look the key up
//! in its scope and compare the stored fingerprint and state with what the client sent; list
//! the PROCESSING records whose lease has lapsed; look at a consumer's failed messages; purge
//! what has expired now rather than at the sweeper's next run.
//! `examples/idempotency_admin.rs` is a command-line tool over it.

use std::time::SystemTime;

use deadpool_postgres::Pool;
use tokio_postgres::Row;
use tokio_postgres::types::Type;

use crate::key::{RecordId, hex};
use crate::store::{Db, Sql};
use crate::sweeper::{SweepReport, Sweeper};
use crate::{Error, IdempotencyKey};

/// A `SELECT` of every [`RecordInfo`] column, followed by `$clause`.
macro_rules! select_record {
    ($clause:literal) => {
        concat!(
            "SELECT uuid_send(id), scope, idempotency_key, state, retryable, status, \
             fingerprint, fencing_token, created_at, updated_at, expires_at, locked_until, \
             (octet_length(headers) + octet_length(body))::bigint \
             FROM idempotency_records ",
            $clause
        )
    };
}

/// A `SELECT` of every [`MessageInfo`] column, followed by `$clause`.
macro_rules! select_message {
    ($clause:literal) => {
        concat!(
            "SELECT consumer_group, message_id, status, attempts, last_error, payload_digest, \
             created_at, updated_at, expires_at FROM inbox_messages ",
            $clause
        )
    };
}

const LOOKUP: Sql = Sql {
    text: select_record!("WHERE id = $1"),
    types: &[Type::UUID],
};
const STALE: Sql = Sql {
    text: select_record!(
        "WHERE state = 'PROCESSING' AND locked_until < now() ORDER BY locked_until, id LIMIT $1"
    ),
    types: &[Type::INT8],
};
const MESSAGE: Sql = Sql {
    text: select_message!("WHERE consumer_group = $1 AND message_id = $2"),
    types: &[Type::TEXT, Type::TEXT],
};
const FAILED_MESSAGES: Sql = Sql {
    text: select_message!(
        "WHERE consumer_group = $1 AND status = 'FAILED' \
     ORDER BY updated_at DESC, message_id LIMIT $2"
    ),
    types: &[Type::TEXT, Type::INT8],
};

/// Every statement above, for the check of their declared parameter types.
#[cfg(test)]
pub(crate) const STATEMENTS: &[&Sql] = &[&LOOKUP, &STALE, &MESSAGE, &FAILED_MESSAGES];

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
pub struct Admin {
    pool: Pool,
    prepared_statements: bool,
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

impl Admin {
    /// An admin view over the crate's tables in `pool`'s database.
    pub fn new(pool: Pool) -> Self {
        Self {
            pool,
            prepared_statements: true,
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
        self.prepared_statements = enabled;
        self
    }

    fn db<'a>(&self, client: &'a deadpool_postgres::ClientWrapper) -> Db<'a> {
        Db::new(client, self.prepared_statements)
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
        let client = self.pool.get().await?;
        let db = self.db(&client);
        let statement = db.prepare(&LOOKUP).await?;
        let row = db.query_opt(&statement, &[&id]).await?;
        Ok(row.map(|row| record_info(&row)).transpose()?)
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
        let client = self.pool.get().await?;
        let db = self.db(&client);
        let statement = db.prepare(&STALE).await?;
        let rows = db.query(&statement, &[&limit.max(0)]).await?;
        Ok(rows
            .iter()
            .map(record_info)
            .collect::<Result<_, tokio_postgres::Error>>()?)
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
        let client = self.pool.get().await?;
        let db = self.db(&client);
        let statement = db.prepare(&MESSAGE).await?;
        let row = db
            .query_opt(&statement, &[&consumer_group, &message_id])
            .await?;
        Ok(row.map(|row| message_info(&row)).transpose()?)
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
        let client = self.pool.get().await?;
        let db = self.db(&client);
        let statement = db.prepare(&FAILED_MESSAGES).await?;
        let rows = db
            .query(&statement, &[&consumer_group, &limit.max(0)])
            .await?;
        Ok(rows
            .iter()
            .map(message_info)
            .collect::<Result<_, tokio_postgres::Error>>()?)
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
        Sweeper::new(self.pool.clone())
            .prepared_statements(self.prepared_statements)
            .run_once()
            .await
    }
}

fn record_info(row: &Row) -> Result<RecordInfo, tokio_postgres::Error> {
    let id: &[u8] = row.try_get(0)?;
    let status: i16 = row.try_get(5)?;
    let fingerprint: &[u8] = row.try_get(6)?;
    let response_bytes: i64 = row.try_get(12)?;
    Ok(RecordInfo {
        id: hex(id),
        scope: row.try_get(1)?,
        key: row.try_get(2)?,
        state: row.try_get(3)?,
        retryable: row.try_get(4)?,
        status: u16::try_from(status).unwrap_or(0),
        fingerprint: hex(fingerprint),
        fencing_token: row.try_get(7)?,
        created_at: row.try_get(8)?,
        updated_at: row.try_get(9)?,
        expires_at: row.try_get(10)?,
        locked_until: row.try_get(11)?,
        response_bytes: usize::try_from(response_bytes).unwrap_or(usize::MAX),
    })
}

fn message_info(row: &Row) -> Result<MessageInfo, tokio_postgres::Error> {
    let attempts: i32 = row.try_get(3)?;
    let digest: Option<&[u8]> = row.try_get(5)?;
    Ok(MessageInfo {
        consumer_group: row.try_get(0)?,
        message_id: row.try_get(1)?,
        status: row.try_get(2)?,
        attempts: u32::try_from(attempts).unwrap_or(0),
        last_error: row.try_get(4)?,
        payload_digest: digest.map(hex),
        created_at: row.try_get(6)?,
        updated_at: row.try_get(7)?,
        expires_at: row.try_get(8)?,
    })
}
