//! The statements of the sweeper, the outbox relay and the console on MySQL/MariaDB: the
//! same conventions as the request path's in the parent module.

// The sweeper's batches. Each is a short READ COMMITTED transaction of its own: the
// locking `SELECT` of a batch's keys below skips the rows a live request (or another
// sweeper) holds — InnoDB's `DELETE` and `UPDATE` cannot skip a locked row, and MySQL has
// no `LIMIT` in an `IN` subquery — then one `..._ONE` statement per key, completed with
// that key's equality on the primary key, deletes (or marks) exactly those rows, and
// `COMMIT`.

/// The condition of an expired record past its state's retention: `?` the smaller
/// retention, success grace, failure retention (microseconds).
macro_rules! expired_where {
    () => {
        "WHERE expires_at <= UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND \
           AND CASE state \
               WHEN 'SUCCESS' THEN expires_at <= UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND \
               ELSE expires_at <= UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND \
                    AND (state = 'FAILED' OR locked_until IS NULL \
                         OR locked_until <= UTC_TIMESTAMP(6)) \
               END "
    };
}
/// The keys of expired records past their state's retention, oldest first, a bounded
/// batch, skipping locked rows. `?` the smaller retention, success grace, failure
/// retention (microseconds), batch size.
pub(in crate::mysql) const PURGE_RECORDS: &str = concat!(
    "SELECT id FROM idempotency_records ",
    expired_where!(),
    "ORDER BY expires_at LIMIT ? FOR UPDATE SKIP LOCKED"
);
/// Deletes one record [`PURGE_RECORDS`] locked, followed by its key's equality.
pub(in crate::mysql) const PURGE_RECORDS_ONE: &str = "DELETE FROM idempotency_records WHERE ";
/// The archive's `INSERT … SELECT` of one record, its response columns `$response`.
macro_rules! archive_one {
    ($response:literal) => {
        concat!(
            "INSERT INTO idempotency_records_archive \
             (id, scope, idempotency_key, fingerprint, status, headers, body, body_key_id, \
              state, retryable, fencing_token, created_at, updated_at, expires_at) \
             SELECT id, scope, idempotency_key, fingerprint, status, ",
            $response,
            ", state, retryable, fencing_token, created_at, updated_at, expires_at \
             FROM idempotency_records WHERE "
        )
    };
}
/// Copies one record [`PURGE_RECORDS`] locked into the archive, before its delete:
/// followed by its key's equality and [`ARCHIVE_ONE_SUFFIX`].
pub(in crate::mysql) const ARCHIVE_RECORD_ONE: &str = archive_one!("headers, body, body_key_id");
/// [`ARCHIVE_RECORD_ONE`] without the response's headers and body.
pub(in crate::mysql) const ARCHIVE_METADATA_ONE: &str = archive_one!("NULL, NULL, NULL");
/// A record archived before (a batch repeated) keeps its row.
pub(in crate::mysql) const ARCHIVE_ONE_SUFFIX: &str =
    " ON DUPLICATE KEY UPDATE archived_at = idempotency_records_archive.archived_at";
/// The keys of archived records archived more than `?` microseconds ago, `?` at most,
/// locked; the creation time formatted for [`PURGE_ARCHIVE_ONE`]'s equality.
pub(in crate::mysql) const PURGE_ARCHIVE: &str = "SELECT id, \
    DATE_FORMAT(created_at, '%Y-%m-%d %H:%i:%s.%f') FROM idempotency_records_archive \
    WHERE archived_at <= UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND \
    ORDER BY archived_at LIMIT ? FOR UPDATE SKIP LOCKED";
/// Deletes one archived record [`PURGE_ARCHIVE`] locked, followed by its key's equality.
pub(in crate::mysql) const PURGE_ARCHIVE_ONE: &str =
    "DELETE FROM idempotency_records_archive WHERE ";
/// The keys of expired inbox records, with the parameters of [`PURGE_RECORDS`].
pub(in crate::mysql) const PURGE_MESSAGES: &str = "SELECT consumer_group, message_id FROM inbox_messages \
    WHERE expires_at <= UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND \
      AND status <> 'PENDING' \
      AND CASE status \
          WHEN 'SUCCESS' THEN expires_at <= UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND \
          ELSE expires_at <= UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND \
          END \
    ORDER BY expires_at LIMIT ? FOR UPDATE SKIP LOCKED";
/// Deletes one inbox record [`PURGE_MESSAGES`] locked, followed by its key's equality.
pub(in crate::mysql) const PURGE_MESSAGES_ONE: &str = "DELETE FROM inbox_messages WHERE ";
/// The keys of settled outbox rows past their retention, with the parameters of
/// [`PURGE_RECORDS`].
pub(in crate::mysql) const PURGE_OUTBOX: &str = "SELECT seq FROM idempotency_outbox \
    WHERE state <> 'PENDING' \
      AND COALESCE(sent_at, created_at) <= UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND \
      AND CASE state \
          WHEN 'SENT' THEN sent_at <= UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND \
          ELSE created_at <= UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND \
          END \
    ORDER BY seq LIMIT ? FOR UPDATE SKIP LOCKED";
/// Deletes one outbox row [`PURGE_OUTBOX`] locked, followed by its key's equality.
pub(in crate::mysql) const PURGE_OUTBOX_ONE: &str = "DELETE FROM idempotency_outbox WHERE ";
/// Whether the migration table exists (1) or not (0), in the connection's database.
pub(in crate::mysql) const SCHEMA_TABLE: &str = "SELECT COUNT(*) FROM information_schema.tables \
    WHERE table_schema = DATABASE() AND table_name = 'axum_idempotency_migrations'";
/// The highest applied version (0 for none).
pub(in crate::mysql) const SCHEMA_VERSION: &str =
    "SELECT CAST(COALESCE(MAX(version), 0) AS SIGNED) FROM axum_idempotency_migrations";
/// PROCESSING records past their lease and the seconds since the oldest lease ended.
pub(in crate::mysql) const STALE_SUMMARY: &str = "SELECT CAST(COUNT(*) AS SIGNED), \
    CAST(TIMESTAMPDIFF(MICROSECOND, MIN(locked_until), UTC_TIMESTAMP(6)) / 1e6 AS DOUBLE) \
    FROM idempotency_records WHERE state = 'PROCESSING' AND locked_until < UTC_TIMESTAMP(6)";
/// The stalest ids. `?` how many.
pub(in crate::mysql) const STALE_IDS: &str = "SELECT id FROM idempotency_records \
    WHERE state = 'PROCESSING' AND locked_until < UTC_TIMESTAMP(6) \
    ORDER BY locked_until LIMIT ?";
/// The keys of records whose lease ended more than `?` microseconds ago, `?` at a time,
/// skipping locked rows.
pub(in crate::mysql) const MARK_STALE_FAILED: &str = "SELECT id FROM idempotency_records \
    WHERE state = 'PROCESSING' AND locked_until < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND \
    ORDER BY locked_until LIMIT ? FOR UPDATE SKIP LOCKED";
/// One record [`MARK_STALE_FAILED`] locked becomes FAILED and retryable, followed by its
/// key's equality (the lock keeps it PROCESSING until then).
pub(in crate::mysql) const MARK_STALE_FAILED_ONE: &str = "UPDATE idempotency_records \
    SET state = 'FAILED', retryable = TRUE, locked_until = NULL, updated_at = UTC_TIMESTAMP(6) \
    WHERE ";

/// The row lock of an ordering key, taken before its message's insert, so producers of
/// one key commit in the order their rows are numbered. `?` ordering key.
pub(in crate::mysql) const OUTBOX_KEY_LOCK: &str = "INSERT INTO idempotency_outbox_keys (ordering_key) \
    VALUES (?) ON DUPLICATE KEY UPDATE ordering_key = ordering_key";
/// Enqueues a message; a duplicate message id fails with 1062 (the statement alone is
/// undone). `?` message id (NULL: a random UUID), topic, ordering key, content type,
/// payload.
pub(in crate::mysql) const OUTBOX_ENQUEUE: &str = "INSERT INTO idempotency_outbox \
    (message_id, topic, ordering_key, content_type, payload, state, attempts, created_at, \
     next_attempt_at) \
    VALUES (COALESCE(?, CAST(UUID() AS CHAR(36))), ?, ?, ?, ?, 'PENDING', 0, UTC_TIMESTAMP(6), '1000-01-01')";
/// The message id of a row. `?` seq.
pub(in crate::mysql) const OUTBOX_MESSAGE_ID: &str =
    "SELECT CONVERT(message_id USING utf8mb4) FROM idempotency_outbox WHERE seq = ?";
/// The relay's batch, as PostgreSQL's, skipping rows another relay holds. `?` batch size.
pub(in crate::mysql) const OUTBOX_LOCK_BATCH: &str = "SELECT seq, CONVERT(message_id USING utf8mb4), \
    CONVERT(topic USING utf8mb4), CONVERT(ordering_key USING utf8mb4), content_type, payload, attempts, \
    CAST(TIMESTAMPDIFF(MICROSECOND, created_at, UTC_TIMESTAMP(6)) / 1e6 AS DOUBLE) \
    FROM idempotency_outbox AS o WHERE state = 'PENDING' AND next_attempt_at <= UTC_TIMESTAMP(6) \
    AND (ordering_key IS NULL OR NOT EXISTS (SELECT 1 FROM idempotency_outbox AS w \
        WHERE w.state = 'PENDING' AND w.ordering_key = o.ordering_key AND w.seq < o.seq \
          AND w.next_attempt_at > UTC_TIMESTAMP(6))) \
    ORDER BY seq LIMIT ? FOR UPDATE SKIP LOCKED";
/// A refused attempt of one message: `attempts` first (MySQL assigns left to right), so
/// the state compares the new count and the backoff uses `2^(new count - 1)` seconds times
/// the base, at most the cap. `?` error, max attempts, base seconds, cap seconds, seq.
/// Then [`OUTBOX_IS_PARKED`].
pub(in crate::mysql) const OUTBOX_MARK_FAILED: &str = "UPDATE idempotency_outbox SET \
    attempts = attempts + 1, last_error = ?, \
    state = CASE WHEN attempts >= ? THEN 'FAILED' ELSE 'PENDING' END, \
    next_attempt_at = UTC_TIMESTAMP(6) + INTERVAL \
        CAST(LEAST(? * POW(2, attempts - 1), ?) * 1000000 AS SIGNED) MICROSECOND \
    WHERE seq = ?";
/// Whether a message is parked. `?` seq.
pub(in crate::mysql) const OUTBOX_IS_PARKED: &str =
    "SELECT state = 'FAILED' FROM idempotency_outbox WHERE seq = ?";
/// Pending messages and the age in seconds of the oldest.
pub(in crate::mysql) const OUTBOX_PENDING: &str = "SELECT CAST(COUNT(*) AS SIGNED), \
    CAST(TIMESTAMPDIFF(MICROSECOND, MIN(created_at), UTC_TIMESTAMP(6)) / 1e6 AS DOUBLE) \
    FROM idempotency_outbox WHERE state = 'PENDING'";
/// Parked messages and the age in seconds of the oldest.
pub(in crate::mysql) const OUTBOX_PARKED: &str = "SELECT CAST(COUNT(*) AS SIGNED), \
    CAST(TIMESTAMPDIFF(MICROSECOND, MIN(created_at), UTC_TIMESTAMP(6)) / 1e6 AS DOUBLE) \
    FROM idempotency_outbox WHERE state = 'FAILED'";

/// The [`OutboxInfo`](crate::OutboxInfo) columns.
macro_rules! outbox_columns {
    () => {
        concat!(
            "SELECT seq, CONVERT(message_id USING utf8mb4), CONVERT(topic USING utf8mb4), \
             CONVERT(ordering_key USING utf8mb4), state, attempts, last_error, \
             CAST(LENGTH(payload) AS SIGNED), ",
            epoch!("created_at"),
            ", ",
            epoch!("sent_at"),
            " FROM idempotency_outbox "
        )
    };
}
/// Admin: messages in one state. `?` state, limit.
pub(in crate::mysql) const ADMIN_OUTBOX: &str =
    concat!(outbox_columns!(), "WHERE state = ? ORDER BY seq LIMIT ?");
/// Admin: requeue a parked message. `?` message id.
pub(in crate::mysql) const ADMIN_REQUEUE_OUTBOX: &str = "UPDATE idempotency_outbox \
    SET state = 'PENDING', attempts = 0, next_attempt_at = '1000-01-01' \
    WHERE message_id = ? AND state = 'FAILED'";
/// Console: pending messages after seq `?`, `?` limit.
pub(in crate::mysql) const ADMIN_OUTBOX_PENDING_PAGE: &str = concat!(
    outbox_columns!(),
    "WHERE state = 'PENDING' AND seq > ? ORDER BY seq LIMIT ?"
);
/// Console: parked messages after seq `?`, `?` limit.
pub(in crate::mysql) const ADMIN_OUTBOX_PARKED_PAGE: &str = concat!(
    outbox_columns!(),
    "WHERE state = 'FAILED' AND seq > ? ORDER BY seq LIMIT ?"
);

/// The [`RecordInfo`](crate::RecordInfo) columns.
macro_rules! record_info {
    () => {
        concat!(
            "SELECT id, scope, idempotency_key, state, retryable, status, fingerprint, \
             fencing_token, ",
            epoch!("created_at"),
            ", ",
            epoch!("updated_at"),
            ", ",
            epoch!("expires_at"),
            ", ",
            epoch!("locked_until"),
            ", CAST(LENGTH(headers) + LENGTH(body) AS SIGNED)"
        )
    };
}
/// Admin: a record by id. `?` id.
pub(in crate::mysql) const ADMIN_RECORD: &str =
    concat!(record_info!(), " FROM idempotency_records WHERE id = ?");
/// The records [`PURGE_RECORDS`] would purge, for an archive sink (`rows::archived_row`):
/// read, not locked. `?` ×3 whether the response is exported, then [`PURGE_RECORDS`]'
/// parameters.
pub(in crate::mysql) const EXPORT_RECORDS: &str = concat!(
    record_info!(),
    ", TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', created_at), \
     TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', updated_at), \
     CASE WHEN ? THEN headers END, CASE WHEN ? THEN body END, \
     CASE WHEN ? THEN body_key_id END FROM idempotency_records ",
    expired_where!(),
    "ORDER BY expires_at LIMIT ?"
);
/// Deletes one exported record if it is still as exported, followed by its id's equality
/// and [`PURGE_EXPORTED_TIMES`] with its two times in microseconds.
pub(in crate::mysql) const PURGE_EXPORTED_ONE: &str = "DELETE FROM idempotency_records WHERE ";
pub(in crate::mysql) const PURGE_EXPORTED_TIMES: &str = " AND TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', created_at) = {created} \
     AND TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', updated_at) = {updated}";
/// Admin: a record's archived copies, newest first (`rows::archived_record`). `?` id.
pub(in crate::mysql) const ADMIN_ARCHIVED: &str = concat!(
    "SELECT id, scope, idempotency_key, state, retryable, status, fingerprint, fencing_token, ",
    epoch!("created_at"),
    ", ",
    epoch!("updated_at"),
    ", ",
    epoch!("expires_at"),
    ", CAST(NULL AS DOUBLE), CAST(COALESCE(LENGTH(headers) + LENGTH(body), 0) AS SIGNED), ",
    epoch!("archived_at"),
    ", CAST(LENGTH(body) AS DOUBLE), headers, body, body_key_id \
     FROM idempotency_records_archive WHERE id = ? ORDER BY created_at DESC"
);
/// Admin: stale leases. `?` limit.
pub(in crate::mysql) const ADMIN_STALE: &str = concat!(
    record_info!(),
    " FROM idempotency_records WHERE state = 'PROCESSING' AND locked_until < UTC_TIMESTAMP(6) \
     ORDER BY locked_until, id LIMIT ?"
);
/// Console: stale leases after the cursor (`?` micros since the epoch, `?` id), `?` limit;
/// the last column is the row's cursor.
pub(in crate::mysql) const ADMIN_STALE_PAGE: &str = concat!(
    record_info!(),
    ", CAST(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', locked_until) AS SIGNED) \
     FROM idempotency_records WHERE state = 'PROCESSING' AND locked_until < UTC_TIMESTAMP(6) \
     AND (locked_until, id) > (TIMESTAMPADD(MICROSECOND, ?, '1970-01-01 00:00:00'), ?) \
     ORDER BY locked_until, id LIMIT ?"
);
/// Console: a record's stored response. `?` id.
pub(in crate::mysql) const ADMIN_RECORD_RESPONSE: &str =
    "SELECT headers, body, body_key_id FROM idempotency_records WHERE id = ?";
/// Console: releases a stale lease, fenced. `?` id, token.
pub(in crate::mysql) const ADMIN_RELEASE_LEASE: &str = "UPDATE idempotency_records \
    SET state = 'FAILED', retryable = TRUE, locked_until = NULL, updated_at = UTC_TIMESTAMP(6) \
    WHERE id = ? AND fencing_token = ? AND state = 'PROCESSING' \
      AND locked_until < UTC_TIMESTAMP(6)";
/// Console: deletes a record, fenced. `?` id, token.
pub(in crate::mysql) const ADMIN_DELETE_RECORD: &str =
    "DELETE FROM idempotency_records WHERE id = ? AND fencing_token = ?";
/// Console: PROCESSING and FAILED records, and InnoDB's estimate of the table's rows.
pub(in crate::mysql) const ADMIN_RECORD_COUNTS: &str = "SELECT \
    CAST((SELECT COUNT(*) FROM idempotency_records WHERE state = 'PROCESSING') AS SIGNED), \
    CAST((SELECT COUNT(*) FROM idempotency_records WHERE state = 'FAILED') AS SIGNED), \
    CAST(COALESCE((SELECT TABLE_ROWS FROM information_schema.TABLES \
        WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'idempotency_records'), 0) AS SIGNED), \
    CAST(COALESCE((SELECT TABLE_ROWS FROM information_schema.TABLES \
        WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'idempotency_records_archive'), 0) \
        AS SIGNED)";

/// The [`MessageInfo`](crate::MessageInfo) columns.
macro_rules! message_info {
    () => {
        concat!(
            "SELECT CONVERT(consumer_group USING utf8mb4), CONVERT(message_id USING utf8mb4), \
             status, attempts, last_error, payload_digest, ",
            epoch!("created_at"),
            ", ",
            epoch!("updated_at"),
            ", ",
            epoch!("expires_at")
        )
    };
}
/// Admin: one message. `?` group, message id.
pub(in crate::mysql) const ADMIN_MESSAGE: &str = concat!(
    message_info!(),
    " FROM inbox_messages WHERE consumer_group = ? AND message_id = ? AND status <> 'PENDING'"
);
/// Admin: a group's failed messages. `?` group, limit.
pub(in crate::mysql) const ADMIN_FAILED_MESSAGES: &str = concat!(
    message_info!(),
    " FROM inbox_messages WHERE consumer_group = ? AND status = 'FAILED' \
     ORDER BY updated_at DESC, message_id LIMIT ?"
);
/// Console: a group's failed messages before the cursor (`?` group, `?` micros, `?`
/// message id), `?` limit; the last column is the row's cursor.
pub(in crate::mysql) const ADMIN_FAILED_PAGE: &str = concat!(
    message_info!(),
    ", CAST(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', updated_at) AS SIGNED) \
     FROM inbox_messages WHERE consumer_group = ? AND status = 'FAILED' \
     AND (updated_at, message_id) < (TIMESTAMPADD(MICROSECOND, ?, '1970-01-01 00:00:00'), ?) \
     ORDER BY updated_at DESC, message_id DESC LIMIT ?"
);
/// Console: groups with FAILED messages, their count and those at `?` attempts or more;
/// `?` groups at most.
pub(in crate::mysql) const ADMIN_FAILED_GROUPS: &str = "SELECT CONVERT(consumer_group USING utf8mb4), CAST(COUNT(*) AS SIGNED), \
    CAST(SUM(attempts >= ?) AS SIGNED) FROM inbox_messages WHERE status = 'FAILED' \
    GROUP BY consumer_group ORDER BY consumer_group LIMIT ?";
/// Console: resets a FAILED message's attempts. `?` group, message id.
pub(in crate::mysql) const ADMIN_RESET_INBOX: &str = "UPDATE inbox_messages SET attempts = 0 \
    WHERE consumer_group = ? AND message_id = ? AND status = 'FAILED' AND attempts > 0";
