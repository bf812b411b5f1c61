//! The MySQL/MariaDB statement texts: each does what the PostgreSQL statement of the same
//! name in `store::sql` does (see its doc), in this dialect, with the same columns in the
//! same order, so the shared row decoders read them. Parameters are `?`, bound in the order
//! each doc lists. Every time is `DATETIME(6)` in UTC, computed with `UTC_TIMESTAMP(6)`
//! (never `NOW()`, which follows the session's time zone); every interval is an integer
//! count of microseconds.

/// The session variable that keeps the connection's own `innodb_lock_wait_timeout` while
/// the crate's bound is in force.
macro_rules! saved {
    () => {
        "@axum_idempotency_lock_wait"
    };
}

/// Seconds since the epoch of a `DATETIME(6)` column, as `DOUBLE` (NULL stays NULL).
macro_rules! epoch {
    ($col:literal) => {
        concat!(
            "CAST(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', ",
            $col,
            ") / 1e6 AS DOUBLE)"
        )
    };
}

/// The start of every transaction of the crate: the connection's lock wait timeout saved
/// and, with `lock_wait`, bounded to that many whole seconds; `autocommit = 0` until the
/// crate restores it, so a statement a handler sends after the server rolled its
/// transaction back (a deadlock) opens a new transaction the crate rolls back, instead of
/// committing on its own; READ COMMITTED for the next transaction only; then `START
/// TRANSACTION`. `savepoint`: a plain transaction's savepoint, whose absence at commit
/// shows the transaction was lost.
pub(super) fn begin(lock_wait: Option<u64>, savepoint: bool) -> String {
    let mut begin = concat!("SET ", saved!(), " = @@SESSION.innodb_lock_wait_timeout").to_owned();
    if let Some(seconds) = lock_wait {
        begin.push_str(&format!(", SESSION innodb_lock_wait_timeout = {seconds}"));
    }
    begin.push_str(
        ", SESSION autocommit = 0; SET TRANSACTION ISOLATION LEVEL READ COMMITTED; \
         START TRANSACTION",
    );
    if savepoint {
        begin.push_str("; SAVEPOINT axum_idempotency_work");
    }
    begin
}

/// One autocommit statement after this runs READ COMMITTED with its lock waits bounded to
/// one second; [`ROLLBACK_AND_RESTORE`] restores the timeout.
pub(super) const BOUND_NEXT_STATEMENT: &str = concat!(
    "SET ",
    saved!(),
    " = @@SESSION.innodb_lock_wait_timeout; SET SESSION innodb_lock_wait_timeout = 1; \
     SET TRANSACTION ISOLATION LEVEL READ COMMITTED"
);

/// The session's lock wait timeout as the crate found it, and the saved copy cleared.
macro_rules! restore_lock_wait {
    () => {
        concat!(
            "SESSION innodb_lock_wait_timeout = COALESCE(CAST(",
            saved!(),
            " AS UNSIGNED), @@SESSION.innodb_lock_wait_timeout), ",
            saved!(),
            " = NULL"
        )
    };
}

/// Commits and restores the session the crate changed, in one statement sent alone:
/// turning `autocommit` back on commits the open transaction, and its failure (a deadlock,
/// or a Galera certification failure) is that statement's error. On Galera a commit that
/// shares its text query with other statements can lose its error — the commit reported
/// done, the transaction rolled back — even as the query's last statement
/// (`tests-integration/tests/galera/commit_errors.py` measures each shape), so nothing rides with this one.
pub(super) const COMMIT_AND_RESTORE: &str =
    concat!("SET ", restore_lock_wait!(), ", SESSION autocommit = 1");

/// Restores the lock wait timeout inside a transaction, without committing it: the end of
/// a text query whose commit follows on its own.
pub(super) const RESTORE_LOCK_WAIT: &str = concat!("SET ", restore_lock_wait!());

/// Rolls back and restores the session the crate changed.
pub(super) const ROLLBACK_AND_RESTORE: &str = concat!(
    "ROLLBACK; SET ",
    restore_lock_wait!(),
    ", SESSION autocommit = 1"
);
/// The same, with a Galera node's `wsrep_sync_wait` too ([`CAUSAL_READS`]).
pub(super) const ROLLBACK_AND_RESTORE_ALL: &str = concat!(
    "ROLLBACK; SET ",
    restore_lock_wait!(),
    ", SESSION autocommit = 1, SESSION wsrep_sync_wait = \
     COALESCE(CAST(@axum_idempotency_sync_wait AS UNSIGNED), @@SESSION.wsrep_sync_wait), \
     @axum_idempotency_sync_wait = NULL"
);

/// Taken right after the key's (or message's) row lock; a stored 4xx and a failed inbox
/// attempt roll back to it, keeping the lock. With the lock wait timeout restored for the
/// handler.
pub(super) const WORK_SAVEPOINT: &str = concat!(
    "SAVEPOINT axum_idempotency_work; SET SESSION innodb_lock_wait_timeout = COALESCE(CAST(",
    saved!(),
    " AS UNSIGNED), @@SESSION.innodb_lock_wait_timeout)"
);
/// The savepoint alone: MariaDB's claim bounds its one lock wait per statement and leaves
/// the session's timeout as it is.
pub(super) const SAVEPOINT: &str = "SAVEPOINT axum_idempotency_work";
/// MariaDB's claim begins without touching the lock wait timeout: `autocommit = 0`, READ
/// COMMITTED for the next transaction, `START TRANSACTION`.
pub(super) const BEGIN_MARIADB: &str = "SET SESSION autocommit = 0; \
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION";

/// Fails (1305) when the transaction that took the savepoint is gone: the check, before
/// the record, that the handler's transaction is still the one the claim began.
pub(super) const RELEASE_WORK: &str = "RELEASE SAVEPOINT axum_idempotency_work";
/// Discards the handler's (or consumer's) writes, keeping the row lock.
pub(super) const ROLLBACK_WORK: &str = "ROLLBACK TO SAVEPOINT axum_idempotency_work";

/// The claim columns of a record, as [`store::sql::LOOKUP`](crate::store::sql::LOOKUP).
macro_rules! record_columns {
    () => {
        "SELECT status, headers, body, fingerprint, expires_at <= UTC_TIMESTAMP(6), state, \
         retryable, CAST(CEIL(TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), locked_until) \
         / 1000000) AS SIGNED), \
         CAST(TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) / 1e6 AS DOUBLE), \
         body_key_id FROM idempotency_records WHERE id = ?"
    };
}

/// A record's stored answer: status, headers, body. `?` id.
pub(super) const RECORD_RESPONSE: &str =
    "SELECT status, headers, body FROM idempotency_records WHERE id = ? AND state = 'SUCCESS'";
/// A record's claim columns, outside any transaction. `?` id.
pub(super) const LOOKUP: &str = record_columns!();
/// The key's row lock, refused at once if another transaction holds it (a twin's
/// placeholder); `FOR UPDATE` waits instead (`wait_for_in_flight`). `?` id.
pub(super) const LOCK_NOWAIT: &str =
    "SELECT 1 FROM idempotency_records WHERE id = ? FOR UPDATE NOWAIT";
/// The key's row lock, waited for up to the session's `innodb_lock_wait_timeout`. `?` id.
pub(super) const LOCK_WAIT: &str = "SELECT 1 FROM idempotency_records WHERE id = ? FOR UPDATE";
/// Removes the replaceable record the claim found, under its lock. `?` id.
pub(super) const DELETE_REPLACEABLE: &str = "DELETE FROM idempotency_records WHERE id = ?";
/// The key's placeholder, inserted at the start of the request's transaction: InnoDB holds
/// it locked until the transaction ends, so a twin's locking read waits for it (or, with
/// `NOWAIT`, is refused). Never committed as it is: the completion turns it into the
/// record. Already expired and without a lease, should anything ever commit it. `?` id, `?`
/// fingerprint.
pub(super) const INSERT_PLACEHOLDER: &str = "INSERT INTO idempotency_records \
    (id, scope, fingerprint, status, headers, body, state, created_at, updated_at, expires_at) \
    VALUES (?, '', ?, 0, '', '', 'PROCESSING', UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), \
            UTC_TIMESTAMP(6))";
/// The placeholder becomes the record. 0 rows: the placeholder is gone, and with it the
/// transaction. `?` scope, raw key, fingerprint, status, headers, body, body key id, ttl
/// microseconds, id.
pub(super) const COMPLETE: &str = "UPDATE idempotency_records FORCE INDEX (PRIMARY) SET \
    scope = ?, idempotency_key = ?, fingerprint = ?, status = ?, headers = ?, body = ?, \
    body_key_id = ?, state = 'SUCCESS', retryable = FALSE, locked_until = NULL, \
    created_at = UTC_TIMESTAMP(6), updated_at = UTC_TIMESTAMP(6), \
    expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND \
    WHERE id = ? AND state = 'PROCESSING' AND locked_until IS NULL";

/// Lease mode: the key's row lock and its claim columns, then whether a lease may take it
/// over (expired, or — for the same fingerprint — a lapsed lease or retryable failure),
/// and its fencing token. `?` fingerprint, id.
pub(super) const LEASE_LOCK: &str = "SELECT status, headers, body, fingerprint, \
    expires_at <= UTC_TIMESTAMP(6), state, retryable, \
    CAST(CEIL(TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), locked_until) / 1000000) AS SIGNED), \
    CAST(TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) / 1e6 AS DOUBLE), body_key_id, \
    expires_at <= UTC_TIMESTAMP(6) OR (fingerprint = ? AND \
        ((state = 'PROCESSING' AND locked_until <= UTC_TIMESTAMP(6)) \
         OR (state = 'FAILED' AND retryable))), \
    fencing_token FROM idempotency_records WHERE id = ? FOR UPDATE";
/// Draws the next fencing token (read back as the result's `last_insert_id`): a counter
/// that never goes back, held locked only until the lease's transaction commits.
pub(super) const NEXT_FENCING_TOKEN: &str = "UPDATE idempotency_counters \
    SET value = LAST_INSERT_ID(value + 1) WHERE name = 'fencing'";
/// Lease mode: a new PROCESSING record. `?` id, scope, raw key, fingerprint, token, lease
/// microseconds, ttl microseconds.
pub(super) const LEASE_INSERT: &str = "INSERT INTO idempotency_records \
    (id, scope, idempotency_key, fingerprint, state, fencing_token, locked_until, \
     status, headers, body, created_at, updated_at, expires_at) \
    VALUES (?, ?, ?, ?, 'PROCESSING', ?, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, \
            0, '', '', UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND)";
/// Lease mode: the takeover of a replaceable record, under its lock. `?` scope, raw key,
/// fingerprint, token, lease microseconds, ttl microseconds, id. (`created_at` is set
/// before `expires_at`: MySQL assigns left to right.)
pub(super) const LEASE_TAKE_OVER: &str = "UPDATE idempotency_records SET \
    created_at = CASE WHEN expires_at <= UTC_TIMESTAMP(6) THEN UTC_TIMESTAMP(6) ELSE created_at END, \
    scope = ?, idempotency_key = ?, fingerprint = ?, state = 'PROCESSING', retryable = FALSE, \
    fencing_token = GREATEST(fencing_token + 1, ?), \
    locked_until = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, \
    status = 0, headers = '', body = '', body_key_id = NULL, updated_at = UTC_TIMESTAMP(6), \
    expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND WHERE id = ?";
/// The token a takeover wrote. `?` id.
pub(super) const LEASE_TOKEN: &str = "SELECT fencing_token FROM idempotency_records WHERE id = ?";
/// Lease mode: the holder's completion, fenced by its token. `?` state, retryable, status,
/// headers, body, body key id, ttl microseconds, id, token.
pub(super) const LEASE_COMPLETE: &str = "UPDATE idempotency_records FORCE INDEX (PRIMARY) SET \
    state = ?, retryable = ?, status = ?, headers = ?, body = ?, body_key_id = ?, \
    locked_until = NULL, updated_at = UTC_TIMESTAMP(6), \
    expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND \
    WHERE id = ? AND fencing_token = ? AND state = 'PROCESSING'";

/// The message's row lock, existing row or new: a new one is a PENDING placeholder (never
/// committed as it is; already expired), an existing one is left as it is. A concurrent
/// consumer's insert waits for this lock (bounded by the session's lock wait timeout).
/// `?` group, message id.
pub(super) const INBOX_LOCK: &str = "INSERT INTO inbox_messages \
    (consumer_group, message_id, status, attempts, created_at, updated_at, expires_at) \
    VALUES (?, ?, 'PENDING', 0, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6)) \
    ON DUPLICATE KEY UPDATE consumer_group = consumer_group";
/// An inbox record under its lock (a placeholder is no record). `?` group, message id.
pub(super) const INBOX_LOOKUP: &str = "SELECT status = 'SUCCESS', attempts, last_error, \
    expires_at > UTC_TIMESTAMP(6), payload_digest FROM inbox_messages \
    WHERE consumer_group = ? AND message_id = ? AND status <> 'PENDING'";
/// Records success with the consumer's work, on the locked row (placeholder or not). 0
/// rows: the row — and with it the transaction — is gone. `?` attempts, digest, payload,
/// payload key id, retention microseconds, group, message id.
pub(super) const INBOX_RECORD_SUCCESS: &str = "UPDATE inbox_messages SET \
    status = 'SUCCESS', attempts = ?, payload_digest = ?, payload = ?, payload_key_id = ?, \
    last_error = NULL, updated_at = UTC_TIMESTAMP(6), \
    expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND \
    WHERE consumer_group = ? AND message_id = ?";
/// A failed attempt on the locked row: counted from 1 again after a success or an expired
/// record (or on a placeholder), refused on a live success. `attempts` is assigned before
/// `status` and `expires_at`, which it reads (MySQL assigns left to right). `?` digest,
/// payload, payload key id, error, retention microseconds, group, message id.
pub(super) const INBOX_RECORD_FAILURE: &str = "UPDATE inbox_messages SET \
    attempts = CASE WHEN status IN ('SUCCESS', 'PENDING') OR expires_at <= UTC_TIMESTAMP(6) \
                    THEN 1 ELSE attempts + 1 END, \
    status = 'FAILED', payload_digest = ?, payload = ?, payload_key_id = ?, last_error = ?, \
    updated_at = UTC_TIMESTAMP(6), expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND \
    WHERE consumer_group = ? AND message_id = ? \
      AND (status <> 'SUCCESS' OR expires_at <= UTC_TIMESTAMP(6))";
/// The attempts of a message. `?` group, message id.
pub(super) const INBOX_ATTEMPTS: &str =
    "SELECT attempts FROM inbox_messages WHERE consumer_group = ? AND message_id = ?";

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
pub(super) const PURGE_RECORDS: &str = concat!(
    "SELECT id FROM idempotency_records ",
    expired_where!(),
    "ORDER BY expires_at LIMIT ? FOR UPDATE SKIP LOCKED"
);
/// Deletes one record [`PURGE_RECORDS`] locked, followed by its key's equality.
pub(super) const PURGE_RECORDS_ONE: &str = "DELETE FROM idempotency_records WHERE ";
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
pub(super) const ARCHIVE_RECORD_ONE: &str = archive_one!("headers, body, body_key_id");
/// [`ARCHIVE_RECORD_ONE`] without the response's headers and body.
pub(super) const ARCHIVE_METADATA_ONE: &str = archive_one!("NULL, NULL, NULL");
/// A record archived before (a batch repeated) keeps its row.
pub(super) const ARCHIVE_ONE_SUFFIX: &str =
    " ON DUPLICATE KEY UPDATE archived_at = idempotency_records_archive.archived_at";
/// The keys of archived records archived more than `?` microseconds ago, `?` at most,
/// locked; the creation time formatted for [`PURGE_ARCHIVE_ONE`]'s equality.
pub(super) const PURGE_ARCHIVE: &str = "SELECT id, \
    DATE_FORMAT(created_at, '%Y-%m-%d %H:%i:%s.%f') FROM idempotency_records_archive \
    WHERE archived_at <= UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND \
    ORDER BY archived_at LIMIT ? FOR UPDATE SKIP LOCKED";
/// Deletes one archived record [`PURGE_ARCHIVE`] locked, followed by its key's equality.
pub(super) const PURGE_ARCHIVE_ONE: &str = "DELETE FROM idempotency_records_archive WHERE ";
/// The keys of expired inbox records, with the parameters of [`PURGE_RECORDS`].
pub(super) const PURGE_MESSAGES: &str = "SELECT consumer_group, message_id FROM inbox_messages \
    WHERE expires_at <= UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND \
      AND status <> 'PENDING' \
      AND CASE status \
          WHEN 'SUCCESS' THEN expires_at <= UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND \
          ELSE expires_at <= UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND \
          END \
    ORDER BY expires_at LIMIT ? FOR UPDATE SKIP LOCKED";
/// Deletes one inbox record [`PURGE_MESSAGES`] locked, followed by its key's equality.
pub(super) const PURGE_MESSAGES_ONE: &str = "DELETE FROM inbox_messages WHERE ";
/// The keys of settled outbox rows past their retention, with the parameters of
/// [`PURGE_RECORDS`].
pub(super) const PURGE_OUTBOX: &str = "SELECT seq FROM idempotency_outbox \
    WHERE state <> 'PENDING' \
      AND COALESCE(sent_at, created_at) <= UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND \
      AND CASE state \
          WHEN 'SENT' THEN sent_at <= UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND \
          ELSE created_at <= UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND \
          END \
    ORDER BY seq LIMIT ? FOR UPDATE SKIP LOCKED";
/// Deletes one outbox row [`PURGE_OUTBOX`] locked, followed by its key's equality.
pub(super) const PURGE_OUTBOX_ONE: &str = "DELETE FROM idempotency_outbox WHERE ";
/// PROCESSING records past their lease and the seconds since the oldest lease ended.
pub(super) const STALE_SUMMARY: &str = "SELECT CAST(COUNT(*) AS SIGNED), \
    CAST(TIMESTAMPDIFF(MICROSECOND, MIN(locked_until), UTC_TIMESTAMP(6)) / 1e6 AS DOUBLE) \
    FROM idempotency_records WHERE state = 'PROCESSING' AND locked_until < UTC_TIMESTAMP(6)";
/// The stalest ids. `?` how many.
pub(super) const STALE_IDS: &str = "SELECT id FROM idempotency_records \
    WHERE state = 'PROCESSING' AND locked_until < UTC_TIMESTAMP(6) \
    ORDER BY locked_until LIMIT ?";
/// The keys of records whose lease ended more than `?` microseconds ago, `?` at a time,
/// skipping locked rows.
pub(super) const MARK_STALE_FAILED: &str = "SELECT id FROM idempotency_records \
    WHERE state = 'PROCESSING' AND locked_until < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND \
    ORDER BY locked_until LIMIT ? FOR UPDATE SKIP LOCKED";
/// One record [`MARK_STALE_FAILED`] locked becomes FAILED and retryable, followed by its
/// key's equality (the lock keeps it PROCESSING until then).
pub(super) const MARK_STALE_FAILED_ONE: &str = "UPDATE idempotency_records \
    SET state = 'FAILED', retryable = TRUE, locked_until = NULL, updated_at = UTC_TIMESTAMP(6) \
    WHERE ";

/// The row lock of an ordering key, taken before its message's insert, so producers of
/// one key commit in the order their rows are numbered. `?` ordering key.
pub(super) const OUTBOX_KEY_LOCK: &str = "INSERT INTO idempotency_outbox_keys (ordering_key) \
    VALUES (?) ON DUPLICATE KEY UPDATE ordering_key = ordering_key";
/// Enqueues a message; a duplicate message id fails with 1062 (the statement alone is
/// undone). `?` message id (NULL: a random UUID), topic, ordering key, content type,
/// payload.
pub(super) const OUTBOX_ENQUEUE: &str = "INSERT INTO idempotency_outbox \
    (message_id, topic, ordering_key, content_type, payload, state, attempts, created_at, \
     next_attempt_at) \
    VALUES (COALESCE(?, CAST(UUID() AS CHAR(36))), ?, ?, ?, ?, 'PENDING', 0, UTC_TIMESTAMP(6), '1000-01-01')";
/// The message id of a row. `?` seq.
pub(super) const OUTBOX_MESSAGE_ID: &str =
    "SELECT CONVERT(message_id USING utf8mb4) FROM idempotency_outbox WHERE seq = ?";
/// The relay's batch, as PostgreSQL's, skipping rows another relay holds. `?` batch size.
pub(super) const OUTBOX_LOCK_BATCH: &str = "SELECT seq, CONVERT(message_id USING utf8mb4), \
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
pub(super) const OUTBOX_MARK_FAILED: &str = "UPDATE idempotency_outbox SET \
    attempts = attempts + 1, last_error = ?, \
    state = CASE WHEN attempts >= ? THEN 'FAILED' ELSE 'PENDING' END, \
    next_attempt_at = UTC_TIMESTAMP(6) + INTERVAL \
        CAST(LEAST(? * POW(2, attempts - 1), ?) * 1000000 AS SIGNED) MICROSECOND \
    WHERE seq = ?";
/// Whether a message is parked. `?` seq.
pub(super) const OUTBOX_IS_PARKED: &str =
    "SELECT state = 'FAILED' FROM idempotency_outbox WHERE seq = ?";
/// Pending messages and the age in seconds of the oldest.
pub(super) const OUTBOX_PENDING: &str = "SELECT CAST(COUNT(*) AS SIGNED), \
    CAST(TIMESTAMPDIFF(MICROSECOND, MIN(created_at), UTC_TIMESTAMP(6)) / 1e6 AS DOUBLE) \
    FROM idempotency_outbox WHERE state = 'PENDING'";
/// Parked messages and the age in seconds of the oldest.
pub(super) const OUTBOX_PARKED: &str = "SELECT CAST(COUNT(*) AS SIGNED), \
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
pub(super) const ADMIN_OUTBOX: &str =
    concat!(outbox_columns!(), "WHERE state = ? ORDER BY seq LIMIT ?");
/// Admin: requeue a parked message. `?` message id.
pub(super) const ADMIN_REQUEUE_OUTBOX: &str = "UPDATE idempotency_outbox \
    SET state = 'PENDING', attempts = 0, next_attempt_at = '1000-01-01' \
    WHERE message_id = ? AND state = 'FAILED'";
/// Console: pending messages after seq `?`, `?` limit.
pub(super) const ADMIN_OUTBOX_PENDING_PAGE: &str = concat!(
    outbox_columns!(),
    "WHERE state = 'PENDING' AND seq > ? ORDER BY seq LIMIT ?"
);
/// Console: parked messages after seq `?`, `?` limit.
pub(super) const ADMIN_OUTBOX_PARKED_PAGE: &str = concat!(
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
pub(super) const ADMIN_RECORD: &str =
    concat!(record_info!(), " FROM idempotency_records WHERE id = ?");
/// The records [`PURGE_RECORDS`] would purge, for an archive sink (`rows::archived_row`):
/// read, not locked. `?` ×3 whether the response is exported, then [`PURGE_RECORDS`]'
/// parameters.
pub(super) const EXPORT_RECORDS: &str = concat!(
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
pub(super) const PURGE_EXPORTED_ONE: &str = "DELETE FROM idempotency_records WHERE ";
pub(super) const PURGE_EXPORTED_TIMES: &str = " AND TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', created_at) = {created} \
     AND TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', updated_at) = {updated}";
/// Admin: a record's archived copies, newest first (`rows::archived_record`). `?` id.
pub(super) const ADMIN_ARCHIVED: &str = concat!(
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
pub(super) const ADMIN_STALE: &str = concat!(
    record_info!(),
    " FROM idempotency_records WHERE state = 'PROCESSING' AND locked_until < UTC_TIMESTAMP(6) \
     ORDER BY locked_until, id LIMIT ?"
);
/// Console: stale leases after the cursor (`?` micros since the epoch, `?` id), `?` limit;
/// the last column is the row's cursor.
pub(super) const ADMIN_STALE_PAGE: &str = concat!(
    record_info!(),
    ", CAST(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', locked_until) AS SIGNED) \
     FROM idempotency_records WHERE state = 'PROCESSING' AND locked_until < UTC_TIMESTAMP(6) \
     AND (locked_until, id) > (TIMESTAMPADD(MICROSECOND, ?, '1970-01-01 00:00:00'), ?) \
     ORDER BY locked_until, id LIMIT ?"
);
/// Console: a record's stored response. `?` id.
pub(super) const ADMIN_RECORD_RESPONSE: &str =
    "SELECT headers, body, body_key_id FROM idempotency_records WHERE id = ?";
/// Console: releases a stale lease, fenced. `?` id, token.
pub(super) const ADMIN_RELEASE_LEASE: &str = "UPDATE idempotency_records \
    SET state = 'FAILED', retryable = TRUE, locked_until = NULL, updated_at = UTC_TIMESTAMP(6) \
    WHERE id = ? AND fencing_token = ? AND state = 'PROCESSING' \
      AND locked_until < UTC_TIMESTAMP(6)";
/// Console: deletes a record, fenced. `?` id, token.
pub(super) const ADMIN_DELETE_RECORD: &str =
    "DELETE FROM idempotency_records WHERE id = ? AND fencing_token = ?";
/// Console: PROCESSING and FAILED records, and InnoDB's estimate of the table's rows.
pub(super) const ADMIN_RECORD_COUNTS: &str = "SELECT \
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
pub(super) const ADMIN_MESSAGE: &str = concat!(
    message_info!(),
    " FROM inbox_messages WHERE consumer_group = ? AND message_id = ? AND status <> 'PENDING'"
);
/// Admin: a group's failed messages. `?` group, limit.
pub(super) const ADMIN_FAILED_MESSAGES: &str = concat!(
    message_info!(),
    " FROM inbox_messages WHERE consumer_group = ? AND status = 'FAILED' \
     ORDER BY updated_at DESC, message_id LIMIT ?"
);
/// Console: a group's failed messages before the cursor (`?` group, `?` micros, `?`
/// message id), `?` limit; the last column is the row's cursor.
pub(super) const ADMIN_FAILED_PAGE: &str = concat!(
    message_info!(),
    ", CAST(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', updated_at) AS SIGNED) \
     FROM inbox_messages WHERE consumer_group = ? AND status = 'FAILED' \
     AND (updated_at, message_id) < (TIMESTAMPADD(MICROSECOND, ?, '1970-01-01 00:00:00'), ?) \
     ORDER BY updated_at DESC, message_id DESC LIMIT ?"
);
/// Console: groups with FAILED messages, their count and those at `?` attempts or more;
/// `?` groups at most.
pub(super) const ADMIN_FAILED_GROUPS: &str = "SELECT CONVERT(consumer_group USING utf8mb4), CAST(COUNT(*) AS SIGNED), \
    CAST(SUM(attempts >= ?) AS SIGNED) FROM inbox_messages WHERE status = 'FAILED' \
    GROUP BY consumer_group ORDER BY consumer_group LIMIT ?";
/// Console: resets a FAILED message's attempts. `?` group, message id.
pub(super) const ADMIN_RESET_INBOX: &str = "UPDATE inbox_messages SET attempts = 0 \
    WHERE consumer_group = ? AND message_id = ? AND status = 'FAILED' AND attempts > 0";

/// On a Galera node, the claim's reads wait until the node has applied every write set the
/// cluster committed before them (`wsrep_sync_wait = 1`), so a key committed on another
/// node a moment ago is seen here; the session's own setting is kept and restored.
pub(super) const CAUSAL_READS: &str = "SET @axum_idempotency_sync_wait = @@SESSION.wsrep_sync_wait, \
    SESSION wsrep_sync_wait = 1";
/// The session's `wsrep_sync_wait` as the crate found it.
pub(super) const RESTORE_SYNC_WAIT: &str = "SET SESSION wsrep_sync_wait = \
    COALESCE(CAST(@axum_idempotency_sync_wait AS UNSIGNED), @@SESSION.wsrep_sync_wait), \
    @axum_idempotency_sync_wait = NULL";
