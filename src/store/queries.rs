//! The query seam under the drivers: what every database does the same way — run one
//! statement with a few parameters, decode its rows with [`rows`](super::rows)'s decoders
//! — is written once, over [`Queries`], which each driver implements with its client
//! library. A driver gives its statement texts in [`Statements`] and binds [`Param`]s its
//! own way; the abilities' provided methods do the rest.

use std::future::Future;

use super::rows::Row;
use crate::engine::error::Error;
use crate::engine::record::{InboxWrite, LeaseEnd, NewRecord, RetentionParams};

/// A row decoder of [`rows`](super::rows), for one driver's row type.
pub(crate) type Decoder<R, T> = fn(&R) -> Result<T, <R as Row>::Error>;

/// A statement's parameter, as the seam passes it; each driver binds it in its own
/// protocol.
#[derive(Debug, Clone, Copy)]
pub enum Param<'a> {
    /// A record id: PostgreSQL's `uuid`, 16 bytes elsewhere.
    Id(crate::engine::key::RecordId),
    Text(&'a str),
    OptText(Option<&'a str>),
    Bool(bool),
    I16(i16),
    OptI16(Option<i16>),
    I32(i32),
    I64(i64),
    Bytes(&'a [u8]),
    OptBytes(Option<&'a [u8]>),
    /// A duration in the dialect's unit for interval arithmetic: seconds as a double on
    /// PostgreSQL and SQLite, whole microseconds on MySQL.
    Duration(std::time::Duration),
}

/// A statement of a dialect whose placeholders are positional (`?`): its text, and which
/// of the seam's parameters each placeholder takes, in order — empty for the parameters in
/// their own order.
#[cfg(feature = "_sqlx")]
#[derive(Debug)]
pub struct Text {
    pub(crate) sql: &'static str,
    pub(crate) order: &'static [usize],
}

#[cfg(feature = "_sqlx")]
impl Text {
    /// A statement that takes the seam's parameters in their order.
    pub(crate) const fn new(sql: &'static str) -> Self {
        Self { sql, order: &[] }
    }

    /// A statement whose `n`-th placeholder takes the seam's parameter `order[n]`.
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    pub(crate) const fn ordered(sql: &'static str, order: &'static [usize]) -> Self {
        Self { sql, order }
    }

    /// The parameters in the order the placeholders take them.
    pub(crate) fn params<'p, 'a>(
        &self,
        params: &'p [Param<'a>],
    ) -> impl Iterator<Item = &'p Param<'a>> + 'p {
        let order = self.order;
        let reordered = order.iter().map(move |&at| &params[at]);
        let in_order = params
            .iter()
            .take(if order.is_empty() { params.len() } else { 0 });
        in_order.chain(reordered)
    }
}

/// The statements written once over [`Queries`], in one driver's dialect: the same
/// parameters, in the same order, and the same columns, whatever the database.
#[derive(Debug)]
pub struct Statements<S: ?Sized + 'static> {
    /// A record's claim columns ([`rows::lookup`](super::rows::lookup)), outside any
    /// transaction. Id.
    pub(crate) lookup: &'static S,
    /// A message's record. Group, message id.
    pub(crate) admin_message: &'static S,
    /// A group's FAILED messages, newest first. Group, limit.
    pub(crate) admin_failed_messages: &'static S,
    /// A page of a group's FAILED messages after a cursor. Group, `updated_at`
    /// (microseconds), message id, limit.
    pub(crate) admin_failed_page: &'static S,
    /// The groups with FAILED messages. Attempts that count as given up, limit.
    pub(crate) admin_failed_groups: &'static S,
    /// Resets a FAILED message's attempts. Group, message id.
    pub(crate) admin_reset_inbox: &'static S,
    /// A record's state for the console. Id.
    pub(crate) admin_record: &'static S,
    /// A key's archived records, newest first. Id.
    pub(crate) admin_archived: &'static S,
    /// The stalest leases. Limit.
    pub(crate) admin_stale: &'static S,
    /// A page of stale leases after a cursor. `locked_until` (microseconds), id, limit.
    pub(crate) admin_stale_page: &'static S,
    /// A record's stored answer. Id.
    pub(crate) admin_record_response: &'static S,
    /// Releases a stale lease at its token. Id, token.
    pub(crate) admin_release_lease: &'static S,
    /// Deletes a record at its token. Id, token.
    pub(crate) admin_delete_record: &'static S,
    /// PROCESSING and FAILED counts and the estimated total.
    pub(crate) admin_record_counts: &'static S,
    /// Outbox messages in a state, oldest first. State, limit.
    pub(crate) admin_outbox: &'static S,
    /// Puts a parked message back in the queue. Message id.
    pub(crate) admin_requeue_outbox: &'static S,
    /// A page of PENDING messages after a seq. Seq, limit.
    pub(crate) admin_outbox_pending_page: &'static S,
    /// A page of FAILED (parked) messages after a seq. Seq, limit.
    pub(crate) admin_outbox_parked_page: &'static S,
    /// Whether the migration table exists: 1 or 0.
    pub(crate) schema_table: &'static S,
    /// The highest migration applied (0 for none); the table exists.
    pub(crate) schema_version: &'static S,
    /// PROCESSING records past their lease: count, age of the oldest.
    pub(crate) stale_summary: &'static S,
    /// Ids of the stalest PROCESSING records. Limit.
    pub(crate) stale_ids: &'static S,
    /// PENDING messages: count, age of the oldest.
    pub(crate) outbox_pending: &'static S,
    /// FAILED (parked) messages: count, age of the oldest.
    pub(crate) outbox_parked: &'static S,
    /// A lease holder's fenced completion. Id, token, state, retryable, status, headers,
    /// body, body key id, time to live.
    pub(crate) lease_complete: &'static S,
    /// A message's failed attempt, and its attempts since, unless it has succeeded. Group,
    /// message id, payload digest, payload, payload key id, error, retention.
    pub(crate) inbox_record_failure: &'static S,
    /// A message's success, on its locked row. Group, message id, attempts, payload digest,
    /// payload, payload key id, retention.
    pub(crate) inbox_record_success: &'static S,
    /// The records a purge of expired records would purge, for an archive sink, read, not
    /// locked: [`retention_params`].
    pub(crate) export_records: &'static S,
}

/// The parameters of a purge ([`Statements::export_records`], the sweeper's purges): the
/// success grace, the failure retention, the earlier of the two, the batch's limit, and
/// whether the archive keeps the response.
pub(crate) fn retention_params(r: RetentionParams) -> [Param<'static>; 5] {
    [
        Param::Duration(r.success_grace),
        Param::Duration(r.failure_retention),
        Param::Duration(r.success_grace.min(r.failure_retention)),
        Param::I64(r.limit),
        Param::Bool(r.archive.is_some_and(|a| a.keeps_response())),
    ]
}

/// The parameters of [`Statements::lease_complete`].
pub(crate) fn lease_complete_params<'a>(
    record: &'a NewRecord<'_>,
    token: i64,
    end: LeaseEnd,
) -> [Param<'a>; 9] {
    [
        Param::Id(record.id),
        Param::I64(token),
        Param::Text(end.state()),
        Param::Bool(end.retryable()),
        Param::I16(i16::try_from(record.status.as_u16()).unwrap_or(i16::MAX)),
        Param::Bytes(&record.headers),
        Param::Bytes(&record.body.bytes),
        Param::OptI16(record.body.key_id),
        Param::Duration(record.ttl),
    ]
}

/// The parameters of [`Statements::inbox_record_failure`].
pub(crate) fn inbox_failure_params<'a>(
    write: &'a InboxWrite<'_>,
    error: &'a str,
) -> [Param<'a>; 7] {
    [
        Param::Text(write.group),
        Param::Text(write.message_id),
        Param::OptBytes(write.payload_digest),
        Param::OptBytes(write.payload),
        Param::OptI16(write.payload_key_id),
        Param::Text(error),
        Param::Duration(write.retention),
    ]
}

/// The parameters of [`Statements::inbox_record_success`].
pub(crate) fn inbox_success_params<'a>(write: &'a InboxWrite<'_>, attempts: i32) -> [Param<'a>; 7] {
    [
        Param::Text(write.group),
        Param::Text(write.message_id),
        Param::I32(attempts),
        Param::OptBytes(write.payload_digest),
        Param::OptBytes(write.payload),
        Param::OptI16(write.payload_key_id),
        Param::Duration(write.retention),
    ]
}

/// A database as the seam sees it: its statements, and how it runs one.
#[doc(hidden)]
pub trait Queries: Send + Sync {
    /// What the driver runs: a statement's text, or its own prepared-statement descriptor.
    type Statement: ?Sized + Sync + 'static;
    /// The driver's result row.
    type Row: Row;

    /// The driver's texts of the seam's statements.
    const STATEMENTS: Statements<Self::Statement>;

    /// Runs `statement` with `params`, each row decoded by `map`.
    fn query_rows<T: Send>(
        &self,
        statement: &'static Self::Statement,
        params: &[Param<'_>],
        map: Decoder<Self::Row, T>,
    ) -> impl Future<Output = Result<Vec<T>, Error>> + Send;

    /// Runs `statement` with `params`; the rows it changed.
    fn query_affected(
        &self,
        statement: &'static Self::Statement,
        params: &[Param<'_>],
    ) -> impl Future<Output = Result<u64, Error>> + Send;

    /// [`query_rows`](Self::query_rows) for one of the sweeper's batches, which may run far
    /// longer than a request's statement on a healthy server.
    fn batch_rows<T: Send>(
        &self,
        statement: &'static Self::Statement,
        params: &[Param<'_>],
        map: Decoder<Self::Row, T>,
    ) -> impl Future<Output = Result<Vec<T>, Error>> + Send {
        self.query_rows(statement, params, map)
    }

    /// [`query_affected`](Self::query_affected) for one of the sweeper's batches.
    fn batch_affected(
        &self,
        statement: &'static Self::Statement,
        params: &[Param<'_>],
    ) -> impl Future<Output = Result<u64, Error>> + Send {
        self.query_affected(statement, params)
    }

    /// Runs `statement`, which returns at most one row; that row, decoded.
    fn query_opt<T: Send>(
        &self,
        statement: &'static Self::Statement,
        params: &[Param<'_>],
        map: Decoder<Self::Row, T>,
    ) -> impl Future<Output = Result<Option<T>, Error>> + Send {
        let found = self.query_rows(statement, params, map);
        async move { Ok(found.await?.into_iter().next()) }
    }

    /// Runs `statement`, which changes at most one row; whether it changed one.
    fn query_changed(
        &self,
        statement: &'static Self::Statement,
        params: &[Param<'_>],
    ) -> impl Future<Output = Result<bool, Error>> + Send {
        let changed = self.query_affected(statement, params);
        async move { Ok(changed.await? == 1) }
    }
}

/// The seam on a connection inside the crate's transaction: a statement of the crate's own
/// bookkeeping run there, the rollback to the savepoint taken after the claim's lock, and
/// the commit. What the shared transaction holds implements it.
#[doc(hidden)]
pub trait TxQueries: Send {
    /// As [`Queries::Statement`].
    type Statement: ?Sized + Sync + 'static;
    /// As [`Queries::Row`].
    type Row: Row;

    /// Runs `statement` with `params` in the transaction, each row decoded by `map`.
    fn tx_rows<T: Send>(
        &mut self,
        statement: &'static Self::Statement,
        params: &[Param<'_>],
        map: Decoder<Self::Row, T>,
    ) -> impl Future<Output = Result<Vec<T>, Error>> + Send;

    /// Runs `statement` with `params` in the transaction; the rows it changed.
    fn tx_affected(
        &mut self,
        statement: &'static Self::Statement,
        params: &[Param<'_>],
    ) -> impl Future<Output = Result<u64, Error>> + Send;

    /// Rolls back to the savepoint taken after the claim's lock: the work undone, the lock
    /// kept.
    fn tx_rollback_work(&mut self) -> impl Future<Output = Result<(), Error>> + Send;

    /// Commits the transaction.
    fn tx_commit(&mut self) -> impl Future<Output = Result<(), Error>> + Send;
}

/// A driver's [`Statements`] from its dialect's constants, named as the fields in upper
/// case: `statements!(sql::)`, `statements!(&statement::)` for descriptors, or
/// `statements!(text sql::)` for texts in [`Text`] (each field then overridable with
/// struct update syntax, for a statement whose placeholders take the parameters in another
/// order).
macro_rules! statements {
    (@wrap [$($wrap:tt)*] $($path:tt)*) => {
        $crate::store::queries::Statements {
            lookup: $($wrap)* ($($path)* LOOKUP),
            admin_message: $($wrap)* ($($path)* ADMIN_MESSAGE),
            admin_failed_messages: $($wrap)* ($($path)* ADMIN_FAILED_MESSAGES),
            admin_failed_page: $($wrap)* ($($path)* ADMIN_FAILED_PAGE),
            admin_failed_groups: $($wrap)* ($($path)* ADMIN_FAILED_GROUPS),
            admin_reset_inbox: $($wrap)* ($($path)* ADMIN_RESET_INBOX),
            admin_record: $($wrap)* ($($path)* ADMIN_RECORD),
            admin_archived: $($wrap)* ($($path)* ADMIN_ARCHIVED),
            admin_stale: $($wrap)* ($($path)* ADMIN_STALE),
            admin_stale_page: $($wrap)* ($($path)* ADMIN_STALE_PAGE),
            admin_record_response: $($wrap)* ($($path)* ADMIN_RECORD_RESPONSE),
            admin_release_lease: $($wrap)* ($($path)* ADMIN_RELEASE_LEASE),
            admin_delete_record: $($wrap)* ($($path)* ADMIN_DELETE_RECORD),
            admin_record_counts: $($wrap)* ($($path)* ADMIN_RECORD_COUNTS),
            admin_outbox: $($wrap)* ($($path)* ADMIN_OUTBOX),
            admin_requeue_outbox: $($wrap)* ($($path)* ADMIN_REQUEUE_OUTBOX),
            admin_outbox_pending_page: $($wrap)* ($($path)* ADMIN_OUTBOX_PENDING_PAGE),
            admin_outbox_parked_page: $($wrap)* ($($path)* ADMIN_OUTBOX_PARKED_PAGE),
            schema_table: $($wrap)* ($($path)* SCHEMA_TABLE),
            schema_version: $($wrap)* ($($path)* SCHEMA_VERSION),
            stale_summary: $($wrap)* ($($path)* STALE_SUMMARY),
            stale_ids: $($wrap)* ($($path)* STALE_IDS),
            outbox_pending: $($wrap)* ($($path)* OUTBOX_PENDING),
            outbox_parked: $($wrap)* ($($path)* OUTBOX_PARKED),
            lease_complete: $($wrap)* ($($path)* LEASE_COMPLETE),
            inbox_record_failure: $($wrap)* ($($path)* INBOX_RECORD_FAILURE),
            inbox_record_success: $($wrap)* ($($path)* INBOX_RECORD_SUCCESS),
            export_records: $($wrap)* ($($path)* EXPORT_RECORDS),
        }
    };
    (text $($path:tt)*) => {
        $crate::store::queries::statements!(@wrap [&$crate::store::queries::Text::new] $($path)*)
    };
    ($($path:tt)*) => {
        $crate::store::queries::statements!(@wrap [] $($path)*)
    };
}
pub(crate) use statements;
