//! The optional abilities on top of [`Store`]: each component asks for exactly the one it
//! uses, and each driver implements each in the module of that concern
//! (`postgres/inbox.rs` holds `impl InboxStore for PgStore`).

use std::future::Future;
use std::time::Duration;

use super::queries::{
    Param, TxQueries, inbox_failure_params, inbox_success_params, lease_complete_params,
    retention_params,
};
use super::rows;
use super::{ConnOf, Store};
use crate::engine::archive::{ArchivedRow, ExportStamp};
use crate::engine::error::Error;
use crate::engine::key::RecordId;
use crate::engine::outbox::{Enqueued, OutboxBatch, OutboxMessage, Settlement};
use crate::engine::record::{
    Backlog, InboxClaim, InboxWrite, LeaseClaim, LeaseEnd, NewRecord, RetentionParams, StoredRow,
    SweepBatch,
};
use crate::engine::view::{ArchivedRecord, InboxFailures, MessageInfo, OutboxInfo, RecordInfo};

/// Lease mode ([`IdempotentLease`](crate::IdempotentLease)): a PROCESSING record committed
/// before the handler runs, and its fenced completion. The layer asks for it, since any
/// route under it may take the lease extractor.
pub trait LeaseStore: Store {
    /// Lease mode: commits a PROCESSING record, or takes over a replaceable one.
    #[doc(hidden)]
    fn lease_acquire(
        &self,
        record: &NewRecord<'_>,
        lease: Duration,
    ) -> impl Future<Output = Result<LeaseClaim, Error>> + Send;

    /// Lease mode: the holder's fenced completion, one autocommit statement; `false` if
    /// the lease was taken over.
    #[doc(hidden)]
    fn lease_complete(
        &self,
        record: &NewRecord<'_>,
        token: i64,
        end: LeaseEnd,
    ) -> impl Future<Output = Result<bool, Error>> + Send {
        async move {
            let params = lease_complete_params(record, token, end);
            self.query_changed(Self::STATEMENTS.lease_complete, &params)
                .await
        }
    }
}

/// The [`Inbox`](crate::Inbox): a message's record in the consumer's transaction, its
/// failed attempts, and the look-ups [`Admin`](crate::Admin) makes of them.
pub trait InboxStore: Store {
    /// Begins a message's transaction, waits (bounded) for its lock, reads its record and
    /// takes the savepoint a failed attempt rolls back to.
    #[doc(hidden)]
    fn inbox_claim(
        &self,
        id: RecordId,
        group: &str,
        message_id: &str,
        wait: Duration,
    ) -> impl Future<Output = Result<InboxClaim<ConnOf<Self>>, Error>> + Send;

    /// Records success and commits with the consumer's work.
    #[doc(hidden)]
    fn inbox_commit(
        conn: &mut ConnOf<Self>,
        write: &InboxWrite<'_>,
        attempts: i32,
    ) -> impl Future<Output = Result<(), Error>> + Send {
        async move {
            let params = inbox_success_params(write, attempts);
            let statement = Self::STATEMENTS.inbox_record_success;
            conn.tx_affected(statement, &params).await?;
            conn.tx_commit().await
        }
    }

    /// Rolls the consumer's work back to the savepoint taken after the message's lock,
    /// records the failed attempt under that lock and commits; `None` if the message has
    /// succeeded (it cannot, under the lock).
    #[doc(hidden)]
    fn inbox_fail(
        mut conn: ConnOf<Self>,
        write: &InboxWrite<'_>,
        error: &str,
    ) -> impl Future<Output = Result<Option<i32>, Error>> + Send {
        async move {
            conn.tx_rollback_work().await?;
            let params = inbox_failure_params(write, error);
            let statement = Self::STATEMENTS.inbox_record_failure;
            let attempts = conn.tx_rows(statement, &params, rows::first_i32).await?;
            conn.tx_commit().await?;
            Ok(attempts.into_iter().next())
        }
    }

    /// Records a failed attempt in a transaction of its own (when the work kept its
    /// transaction): one autocommit statement; `None` if the message has meanwhile
    /// succeeded.
    #[doc(hidden)]
    fn inbox_record_failure(
        &self,
        write: &InboxWrite<'_>,
        error: &str,
    ) -> impl Future<Output = Result<Option<i32>, Error>> + Send {
        async move {
            let params = inbox_failure_params(write, error);
            let statement = Self::STATEMENTS.inbox_record_failure;
            self.query_opt(statement, &params, rows::first_i32).await
        }
    }

    #[doc(hidden)]
    fn message_info<'a>(
        &'a self,
        group: &'a str,
        message_id: &'a str,
    ) -> impl Future<Output = Result<Option<MessageInfo>, Error>> + Send + 'a {
        async move {
            let params = [Param::Text(group), Param::Text(message_id)];
            let statement = Self::STATEMENTS.admin_message;
            self.query_opt(statement, &params, rows::message_info).await
        }
    }

    #[doc(hidden)]
    fn failed_messages(
        &self,
        group: &str,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<MessageInfo>, Error>> + Send {
        let params = [Param::Text(group), Param::I64(limit)];
        let statement = Self::STATEMENTS.admin_failed_messages;
        async move {
            self.query_rows(statement, &params, rows::message_info)
                .await
        }
    }

    /// A page of a group's FAILED messages after the cursor (`updated_at` in microseconds
    /// since the epoch, message id), each with its own cursor.
    #[doc(hidden)]
    fn failed_page<'a>(
        &'a self,
        group: &'a str,
        after: (i64, &'a str),
        limit: i64,
    ) -> impl Future<Output = Result<Vec<(MessageInfo, i64)>, Error>> + Send + 'a {
        let params = [
            Param::Text(group),
            Param::I64(after.0),
            Param::Text(after.1),
            Param::I64(limit),
        ];
        let statement = Self::STATEMENTS.admin_failed_page;
        async move { self.query_rows(statement, &params, rows::failed_row).await }
    }

    /// The groups with FAILED messages, with those at `give_up` attempts or more.
    #[doc(hidden)]
    fn failed_groups(
        &self,
        give_up: i32,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<InboxFailures>, Error>> + Send {
        let params = [Param::I32(give_up), Param::I64(limit)];
        let statement = Self::STATEMENTS.admin_failed_groups;
        async move {
            self.query_rows(statement, &params, rows::inbox_failures)
                .await
        }
    }

    /// Resets a FAILED message's attempts; whether it had any.
    #[doc(hidden)]
    fn inbox_reset<'a>(
        &'a self,
        group: &'a str,
        message_id: &'a str,
    ) -> impl Future<Output = Result<bool, Error>> + Send + 'a {
        async move {
            let params = [Param::Text(group), Param::Text(message_id)];
            self.query_changed(Self::STATEMENTS.admin_reset_inbox, &params)
                .await
        }
    }
}

/// The transactional outbox: the enqueue in a handler's transaction
/// ([`IdempotentTx::enqueue`](crate::IdempotentTx::enqueue)), the
/// [`OutboxRelay`](crate::outbox::OutboxRelay)'s batches, and the look-ups and requeue of
/// [`Admin`](crate::Admin).
pub trait OutboxStore: Store {
    /// Enqueues `message` in the handle's transaction.
    #[doc(hidden)]
    fn enqueue(
        handle: &mut Self::Handle,
        message: &OutboxMessage,
    ) -> impl Future<Output = Result<Enqueued, Error>> + Send;

    /// Begins a transaction and locks the oldest pending outbox messages that are due, at
    /// most `limit`, skipping those another relay holds; `None` (and the transaction
    /// ended) when there are none.
    #[doc(hidden)]
    fn outbox_lock_batch(
        &self,
        limit: i64,
    ) -> impl Future<Output = Result<Option<OutboxBatch<ConnOf<Self>>>, Error>> + Send;

    /// Marks a locked batch's confirmed messages SENT and its refused ones retried or
    /// parked, and commits; the number parked.
    #[doc(hidden)]
    fn outbox_settle(
        conn: ConnOf<Self>,
        settlement: &Settlement<'_>,
    ) -> impl Future<Output = Result<u64, Error>> + Send;

    #[doc(hidden)]
    fn outbox_pending(&self) -> impl Future<Output = Result<Backlog, Error>> + Send {
        async move {
            let found = self.query_opt(Self::STATEMENTS.outbox_pending, &[], rows::backlog);
            Ok(found.await?.unwrap_or_default())
        }
    }

    #[doc(hidden)]
    fn outbox_messages<'a>(
        &'a self,
        state: &'a str,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<OutboxInfo>, Error>> + Send + 'a {
        async move {
            let params = [Param::Text(state), Param::I64(limit)];
            self.query_rows(Self::STATEMENTS.admin_outbox, &params, rows::outbox_info)
                .await
        }
    }

    /// Puts a parked message back in the queue; whether one was parked under that id.
    #[doc(hidden)]
    fn outbox_requeue<'a>(
        &'a self,
        message_id: &'a str,
    ) -> impl Future<Output = Result<bool, Error>> + Send + 'a {
        async move {
            let params = [Param::Text(message_id)];
            self.query_changed(Self::STATEMENTS.admin_requeue_outbox, &params)
                .await
        }
    }

    /// A page of PENDING (`parked == false`) or FAILED messages after seq `after`.
    #[doc(hidden)]
    fn outbox_page(
        &self,
        parked: bool,
        after: i64,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<OutboxInfo>, Error>> + Send {
        async move {
            let statement = if parked {
                Self::STATEMENTS.admin_outbox_parked_page
            } else {
                Self::STATEMENTS.admin_outbox_pending_page
            };
            let params = [Param::I64(after), Param::I64(limit)];
            self.query_rows(statement, &params, rows::outbox_info).await
        }
    }

    /// Parked messages, and the age of the oldest.
    #[doc(hidden)]
    fn outbox_parked(&self) -> impl Future<Output = Result<Backlog, Error>> + Send {
        async move {
            let found = self.query_opt(Self::STATEMENTS.outbox_parked, &[], rows::backlog);
            Ok(found.await?.unwrap_or_default())
        }
    }
}

/// Maintenance of the idempotency records: the [`Sweeper`](crate::Sweeper)'s batches and
/// stale-lease scan, and [`Admin`](crate::Admin)'s look-ups of records.
pub trait MaintenanceStore: Store {
    /// One autocommit batch of the sweeper; the rows it affected.
    #[doc(hidden)]
    fn sweep_batch(&self, batch: SweepBatch) -> impl Future<Output = Result<u64, Error>> + Send;

    /// A batch of the records `retention` would purge, for an archive sink, the response
    /// included when `retention.archive` keeps it: read, not locked.
    #[doc(hidden)]
    fn export_batch(
        &self,
        retention: RetentionParams,
    ) -> impl Future<Output = Result<Vec<ArchivedRow>, Error>> + Send {
        async move {
            let params = retention_params(retention);
            let statement = Self::STATEMENTS.export_records;
            self.batch_rows(statement, &params, rows::archived_row)
                .await
        }
    }

    /// Deletes the exported records still as they were exported (same id, creation and
    /// update time), skipping rows a live request holds; the rows deleted.
    #[doc(hidden)]
    fn purge_exported(
        &self,
        stamps: &[ExportStamp],
    ) -> impl Future<Output = Result<u64, Error>> + Send;

    #[doc(hidden)]
    fn stale_summary(&self) -> impl Future<Output = Result<Backlog, Error>> + Send {
        async move {
            let found = self.query_opt(Self::STATEMENTS.stale_summary, &[], rows::backlog);
            Ok(found.await?.unwrap_or_default())
        }
    }

    /// Ids of the stalest PROCESSING records, the stalest first.
    #[doc(hidden)]
    fn stale_ids(&self, limit: i64) -> impl Future<Output = Result<Vec<Vec<u8>>, Error>> + Send {
        async move {
            let params = [Param::I64(limit)];
            self.query_rows(Self::STATEMENTS.stale_ids, &params, rows::first_bytes)
                .await
        }
    }

    /// The archived records of `id`, the most recently created first.
    #[doc(hidden)]
    fn archived_records(
        &self,
        id: RecordId,
    ) -> impl Future<Output = Result<Vec<(ArchivedRecord, Option<StoredRow>)>, Error>> + Send {
        let statement = Self::STATEMENTS.admin_archived;
        async move {
            self.query_rows(statement, &[Param::Id(id)], rows::archived_record)
                .await
        }
    }

    #[doc(hidden)]
    fn record_info(
        &self,
        id: RecordId,
    ) -> impl Future<Output = Result<Option<RecordInfo>, Error>> + Send {
        let statement = Self::STATEMENTS.admin_record;
        async move {
            self.query_opt(statement, &[Param::Id(id)], rows::record_info)
                .await
        }
    }

    #[doc(hidden)]
    fn stale_records(
        &self,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<RecordInfo>, Error>> + Send {
        let statement = Self::STATEMENTS.admin_stale;
        async move {
            self.query_rows(statement, &[Param::I64(limit)], rows::record_info)
                .await
        }
    }

    /// A page of stale leases after the cursor (`locked_until` in microseconds since the
    /// epoch, id), each with its own cursor.
    #[doc(hidden)]
    fn stale_page(
        &self,
        after: (i64, RecordId),
        limit: i64,
    ) -> impl Future<Output = Result<Vec<(RecordInfo, i64)>, Error>> + Send {
        async move {
            let params = [Param::I64(after.0), Param::Id(after.1), Param::I64(limit)];
            self.query_rows(Self::STATEMENTS.admin_stale_page, &params, rows::stale_row)
                .await
        }
    }

    /// A record's stored headers, body and body key id.
    #[doc(hidden)]
    fn record_response(
        &self,
        id: RecordId,
    ) -> impl Future<Output = Result<Option<StoredRow>, Error>> + Send {
        let statement = Self::STATEMENTS.admin_record_response;
        async move {
            self.query_opt(statement, &[Param::Id(id)], rows::stored_row)
                .await
        }
    }

    /// Releases a stale lease at `token` (FAILED, retryable); whether it was one.
    #[doc(hidden)]
    fn release_lease(
        &self,
        id: RecordId,
        token: i64,
    ) -> impl Future<Output = Result<bool, Error>> + Send {
        let params = [Param::Id(id), Param::I64(token)];
        async move {
            self.query_changed(Self::STATEMENTS.admin_release_lease, &params)
                .await
        }
    }

    /// Deletes a record at `token`; whether it was there.
    #[doc(hidden)]
    fn delete_record(
        &self,
        id: RecordId,
        token: i64,
    ) -> impl Future<Output = Result<bool, Error>> + Send {
        let params = [Param::Id(id), Param::I64(token)];
        async move {
            self.query_changed(Self::STATEMENTS.admin_delete_record, &params)
                .await
        }
    }

    /// PROCESSING and FAILED records, and the estimated total.
    #[doc(hidden)]
    fn record_counts(&self) -> impl Future<Output = Result<[i64; 4], Error>> + Send {
        let statement = Self::STATEMENTS.admin_record_counts;
        async move {
            let found = self.query_opt(statement, &[], rows::record_counts);
            Ok(found.await?.unwrap_or_default())
        }
    }
}
