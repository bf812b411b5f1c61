//! SQLite's statement texts: each does what the PostgreSQL statement of the same name in
//! `store/sql.rs` does, with the same parameters in the same order unless its doc says
//! otherwise, and returns the same columns for the shared row decoders.
//!
//! Times are REAL seconds since the Unix epoch, and every "now" is SQLite's own
//! `unixepoch('subsec')` (millisecond precision), computed in the statement: SQLite keeps it
//! the same for the whole of one statement. Parameters are numbered (`?1`), so one value
//! may be used twice. A decoded `f64` must be a REAL value, so epochs and ages are `CAST`.

/// The write lock: every write transaction of the crate starts with it, so no transaction
/// ever upgrades from a read (which fails `SQLITE_BUSY` at once, without the busy wait).
pub(super) const BEGIN_IMMEDIATE: &str = "BEGIN IMMEDIATE";

/// A record's claim columns, as `LOOKUP`. `?1` record id. `lease_left` is the ceiling of
/// the seconds left on the lease (no `ceil` without SQLite's math functions).
pub(super) const LOOKUP: &str = "SELECT status, headers, body, fingerprint, \
    expires_at <= unixepoch('subsec'), state, retryable, \
    CAST(locked_until - unixepoch('subsec') AS INTEGER) \
        + (locked_until - unixepoch('subsec') > CAST(locked_until - unixepoch('subsec') AS INTEGER)), \
    CAST(expires_at - unixepoch('subsec') AS REAL), body_key_id \
    FROM idempotency_records WHERE id = ?1";
/// As `DELETE_REPLACEABLE`. `?1` record id.
pub(super) const DELETE_REPLACEABLE: &str = "DELETE FROM idempotency_records WHERE id = ?1 \
    AND (expires_at <= unixepoch('subsec') \
         OR (state = 'PROCESSING' AND locked_until <= unixepoch('subsec')) \
         OR (state = 'FAILED' AND retryable))";
/// As `INSERT`. `?1` id, `?2` scope, `?3` raw key, `?4` fingerprint, `?5` status, `?6`
/// headers, `?7` body, `?8` body key id, `?9` ttl seconds.
pub(super) const INSERT: &str = "INSERT INTO idempotency_records \
    (id, scope, idempotency_key, fingerprint, status, headers, body, body_key_id, \
     created_at, updated_at, expires_at) \
    VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, unixepoch('subsec'), unixepoch('subsec'), \
            unixepoch('subsec') + ?9)";

/// The next fencing token: a counter row that only goes up, so a token is never handed
/// out twice, even after its record was purged. In the lease's write transaction.
pub(super) const NEXT_FENCING_TOKEN: &str = "UPDATE idempotency_counters \
    SET value = value + 1 WHERE name = 'fencing' RETURNING value";
/// As `LEASE_ACQUIRE`, under the write lock, with the token drawn before it: `?1` id, `?2`
/// scope, `?3` raw key, `?4` fingerprint, `?5` the new fencing token, `?6` lease seconds,
/// `?7` ttl seconds. Returns the record's token when it took the key.
pub(super) const LEASE_ACQUIRE: &str = "INSERT INTO idempotency_records AS r \
    (id, scope, idempotency_key, fingerprint, state, fencing_token, locked_until, \
     status, headers, body, created_at, updated_at, expires_at) \
    VALUES (?1, ?2, ?3, ?4, 'PROCESSING', ?5, unixepoch('subsec') + ?6, 0, X'', X'', \
            unixepoch('subsec'), unixepoch('subsec'), unixepoch('subsec') + ?7) \
    ON CONFLICT (id) DO UPDATE SET \
        state = 'PROCESSING', retryable = 0, \
        fencing_token = max(r.fencing_token + 1, excluded.fencing_token), \
        locked_until = excluded.locked_until, scope = excluded.scope, \
        idempotency_key = excluded.idempotency_key, fingerprint = excluded.fingerprint, \
        status = 0, headers = X'', body = X'', body_key_id = NULL, \
        updated_at = excluded.updated_at, \
        created_at = CASE WHEN r.expires_at <= unixepoch('subsec') \
                          THEN excluded.created_at ELSE r.created_at END, \
        expires_at = excluded.expires_at \
    WHERE r.expires_at <= unixepoch('subsec') \
       OR (r.fingerprint = excluded.fingerprint \
           AND ((r.state = 'PROCESSING' AND r.locked_until <= unixepoch('subsec')) \
                OR (r.state = 'FAILED' AND r.retryable))) \
    RETURNING fencing_token";
/// As `LEASE_COMPLETE`. `?1` id, `?2` token, `?3` state, `?4` retryable, `?5` status, `?6`
/// headers, `?7` body, `?8` body key id, `?9` ttl seconds.
pub(super) const LEASE_COMPLETE: &str = "UPDATE idempotency_records SET \
    state = ?3, retryable = ?4, status = ?5, headers = ?6, body = ?7, body_key_id = ?8, \
    locked_until = NULL, updated_at = unixepoch('subsec'), \
    expires_at = unixepoch('subsec') + ?9 \
    WHERE id = ?1 AND fencing_token = ?2 AND state = 'PROCESSING'";

/// Taken right after an inbox message's write lock: a failed attempt rolls back to it.
pub(super) const INBOX_WORK_SAVEPOINT: &str = "SAVEPOINT axum_idempotency_work";
/// Discards the consumer's work of a failed attempt, keeping the write lock.
pub(super) const INBOX_ROLLBACK_WORK: &str = "ROLLBACK TO SAVEPOINT axum_idempotency_work";
/// As `INBOX_LOOKUP`. `?1` group, `?2` message id.
pub(super) const INBOX_LOOKUP: &str = "SELECT status = 'SUCCESS', attempts, last_error, \
    expires_at > unixepoch('subsec'), payload_digest FROM inbox_messages \
    WHERE consumer_group = ?1 AND message_id = ?2";
/// As `INBOX_RECORD_SUCCESS`. `?1` group, `?2` message id, `?3` attempts, `?4` digest,
/// `?5` payload, `?6` payload key id, `?7` retention seconds.
pub(super) const INBOX_RECORD_SUCCESS: &str = "INSERT INTO inbox_messages AS m \
    (consumer_group, message_id, status, attempts, payload_digest, payload, payload_key_id, \
     created_at, updated_at, expires_at) \
    VALUES (?1, ?2, 'SUCCESS', ?3, ?4, ?5, ?6, unixepoch('subsec'), unixepoch('subsec'), \
            unixepoch('subsec') + ?7) \
    ON CONFLICT (consumer_group, message_id) DO UPDATE SET \
        status = 'SUCCESS', attempts = excluded.attempts, \
        payload_digest = excluded.payload_digest, payload = excluded.payload, \
        payload_key_id = excluded.payload_key_id, last_error = NULL, \
        updated_at = excluded.updated_at, expires_at = excluded.expires_at";
/// As `INBOX_RECORD_FAILURE`. `?1` group, `?2` message id, `?3` digest, `?4` payload, `?5`
/// payload key id, `?6` error, `?7` retention seconds.
pub(super) const INBOX_RECORD_FAILURE: &str = "INSERT INTO inbox_messages AS m \
    (consumer_group, message_id, status, attempts, payload_digest, payload, payload_key_id, \
     last_error, created_at, updated_at, expires_at) \
    VALUES (?1, ?2, 'FAILED', 1, ?3, ?4, ?5, ?6, unixepoch('subsec'), unixepoch('subsec'), \
            unixepoch('subsec') + ?7) \
    ON CONFLICT (consumer_group, message_id) DO UPDATE SET \
        status = 'FAILED', \
        attempts = CASE WHEN m.status = 'SUCCESS' OR m.expires_at <= unixepoch('subsec') \
                        THEN 1 ELSE m.attempts + 1 END, \
        payload_digest = excluded.payload_digest, payload = excluded.payload, \
        payload_key_id = excluded.payload_key_id, last_error = excluded.last_error, \
        updated_at = excluded.updated_at, expires_at = excluded.expires_at \
    WHERE m.status = 'FAILED' OR m.expires_at <= unixepoch('subsec') \
    RETURNING attempts";

/// The rowids of a batch of expired records past their state's retention, the parameters
/// of [`PURGE_RECORDS`].
macro_rules! expired_rowids {
    () => {
        "SELECT rowid FROM idempotency_records \
         WHERE expires_at <= unixepoch('subsec') - ?3 \
           AND CASE state \
               WHEN 'SUCCESS' THEN expires_at <= unixepoch('subsec') - ?1 \
               ELSE expires_at <= unixepoch('subsec') - ?2 \
                    AND (state = 'FAILED' OR locked_until IS NULL \
                         OR locked_until <= unixepoch('subsec')) \
               END \
         LIMIT ?4"
    };
}

/// As `PURGE_RECORDS`: `?1` success grace, `?2` failure retention (seconds), `?3` the
/// smaller, `?4` batch size. One bounded autocommit `DELETE` (the write lock for one batch).
pub(super) const PURGE_RECORDS: &str = concat!(
    "DELETE FROM idempotency_records WHERE rowid IN (",
    expired_rowids!(),
    ")"
);
/// The rowids of the records [`PURGE_RECORDS`] would purge, with its parameters: an
/// archiving batch reads them under the write lock, then archives and deletes exactly those.
pub(super) const EXPIRED_RECORD_ROWIDS: &str = expired_rowids!();
/// Copies records into the archive (a record archived before keeps its row), followed by
/// `(rowid, …))` and [`ARCHIVE_SUFFIX`]; `{response}` is `headers, body, body_key_id` or
/// `NULL, NULL, NULL`.
pub(super) const ARCHIVE_RECORDS: &str = "INSERT INTO idempotency_records_archive \
    (id, scope, idempotency_key, fingerprint, status, headers, body, body_key_id, state, \
     retryable, fencing_token, created_at, updated_at, expires_at) \
    SELECT id, scope, idempotency_key, fingerprint, status, {response}, state, \
     retryable, fencing_token, created_at, updated_at, expires_at \
    FROM idempotency_records WHERE rowid IN ";
pub(super) const ARCHIVE_SUFFIX: &str = " ON CONFLICT (id, created_at) DO NOTHING";
/// Archived records archived more than `?1` seconds ago, `?2` at most.
pub(super) const PURGE_ARCHIVE: &str = "DELETE FROM idempotency_records_archive \
    WHERE rowid IN (SELECT rowid FROM idempotency_records_archive \
      WHERE archived_at <= unixepoch('subsec') - ?1 LIMIT ?2)";
/// As `PURGE_MESSAGES`, with the parameters of [`PURGE_RECORDS`].
pub(super) const PURGE_MESSAGES: &str = "DELETE FROM inbox_messages WHERE rowid IN ( \
    SELECT rowid FROM inbox_messages \
    WHERE expires_at <= unixepoch('subsec') - ?3 \
      AND CASE status \
          WHEN 'SUCCESS' THEN expires_at <= unixepoch('subsec') - ?1 \
          ELSE expires_at <= unixepoch('subsec') - ?2 \
          END \
    LIMIT ?4)";
/// As `PURGE_OUTBOX`, with the parameters of [`PURGE_RECORDS`].
pub(super) const PURGE_OUTBOX: &str = "DELETE FROM idempotency_outbox WHERE seq IN ( \
    SELECT seq FROM idempotency_outbox \
    WHERE state <> 'PENDING' \
      AND coalesce(sent_at, created_at) <= unixepoch('subsec') - ?3 \
      AND CASE state \
          WHEN 'SENT' THEN sent_at <= unixepoch('subsec') - ?1 \
          ELSE created_at <= unixepoch('subsec') - ?2 \
          END \
    LIMIT ?4)";
/// As `STALE_SUMMARY`.
pub(super) const STALE_SUMMARY: &str = "SELECT count(*), \
    CAST(unixepoch('subsec') - min(locked_until) AS REAL) \
    FROM idempotency_records WHERE state = 'PROCESSING' AND locked_until < unixepoch('subsec')";
/// As `STALE_IDS`. `?1` how many.
pub(super) const STALE_IDS: &str = "SELECT id FROM idempotency_records \
    WHERE state = 'PROCESSING' AND locked_until < unixepoch('subsec') \
    ORDER BY locked_until LIMIT ?1";
/// As `MARK_STALE_FAILED`. `?1` seconds since the lease ended, `?2` batch size.
pub(super) const MARK_STALE_FAILED: &str = "UPDATE idempotency_records \
    SET state = 'FAILED', retryable = 1, locked_until = NULL, updated_at = unixepoch('subsec') \
    WHERE rowid IN ( \
    SELECT rowid FROM idempotency_records \
    WHERE state = 'PROCESSING' AND locked_until < unixepoch('subsec') - ?1 \
    LIMIT ?2)";

/// A random UUID (version 4) as text, like PostgreSQL's `gen_random_uuid()::text`.
macro_rules! random_uuid {
    () => {
        "(SELECT lower(substr(h, 1, 8) || '-' || substr(h, 9, 4) || '-4' || substr(h, 14, 3) \
         || '-' || substr('89ab', 1 + (abs(random()) % 4), 1) || substr(h, 18, 3) || '-' \
         || substr(h, 21, 12)) FROM (SELECT hex(randomblob(16)) AS h))"
    };
}

/// As `OUTBOX_ENQUEUE`. No lock for the ordering key: SQLite has one writer, so the row's
/// `seq` is drawn under the write lock its transaction holds until COMMIT, and producers
/// commit in `seq` order whatever their keys. `?1` message id (NULL: a random UUID), `?2`
/// topic, `?3` ordering key, `?4` content type, `?5` payload.
pub(super) const OUTBOX_ENQUEUE: &str = concat!(
    "INSERT INTO idempotency_outbox \
     (message_id, topic, ordering_key, content_type, payload, created_at) \
     VALUES (coalesce(?1, ",
    random_uuid!(),
    "), ?2, ?3, ?4, ?5, unixepoch('subsec')) \
     ON CONFLICT (message_id) DO NOTHING RETURNING message_id"
);
/// Whether any pending message may be due and unclaimed: read outside any transaction, so
/// an idle relay never takes the write lock.
pub(super) const OUTBOX_ANY_DUE: &str = "SELECT EXISTS (SELECT 1 FROM idempotency_outbox \
    WHERE state = 'PENDING' AND next_attempt_at <= unixepoch('subsec') \
      AND (claimed_until IS NULL OR claimed_until <= unixepoch('subsec')))";
/// The next batch claim token (same counter table as the fencing tokens).
pub(super) const NEXT_CLAIM_TOKEN: &str = "UPDATE idempotency_counters \
    SET value = value + 1 WHERE name = 'outbox_claim' RETURNING value";
/// As `OUTBOX_LOCK_BATCH`, with a claim instead of row locks: the due pending rows that no
/// live claim holds, oldest first, get this batch's claim token until `?2` seconds from
/// now. `?1` claim token, `?2` claim seconds, `?3` batch size. The rows come back in no
/// particular order.
pub(super) const OUTBOX_CLAIM_BATCH: &str = "UPDATE idempotency_outbox \
    SET claim_token = ?1, claimed_until = unixepoch('subsec') + ?2 \
    WHERE seq IN (SELECT seq FROM idempotency_outbox AS o \
        WHERE state = 'PENDING' AND next_attempt_at <= unixepoch('subsec') \
          AND (claimed_until IS NULL OR claimed_until <= unixepoch('subsec')) \
          AND (ordering_key IS NULL OR NOT EXISTS (SELECT 1 FROM idempotency_outbox AS w \
              WHERE w.state = 'PENDING' AND w.ordering_key = o.ordering_key AND w.seq < o.seq \
                AND w.next_attempt_at > unixepoch('subsec'))) \
        ORDER BY seq LIMIT ?3) \
    RETURNING seq, message_id, topic, ordering_key, content_type, payload, attempts, \
        CAST(unixepoch('subsec') - created_at AS REAL)";
/// As `OUTBOX_BARRIERS`: for each ordering key of the batch claimed under `?1`, the first
/// pending message of that key outside the batch (claimed by another relay, or waiting for
/// its next attempt).
pub(super) const OUTBOX_BARRIERS: &str = "SELECT ordering_key, min(seq) \
    FROM idempotency_outbox WHERE state = 'PENDING' AND claim_token IS NOT ?1 \
    AND ordering_key IN (SELECT ordering_key FROM idempotency_outbox \
        WHERE claim_token = ?1 AND ordering_key IS NOT NULL) \
    GROUP BY ordering_key";
/// As `OUTBOX_MARK_SENT`, fenced by the batch's claim. `?1` seqs (a JSON array), `?2`
/// claim token.
pub(super) const OUTBOX_MARK_SENT: &str = "UPDATE idempotency_outbox \
    SET state = 'SENT', sent_at = unixepoch('subsec'), attempts = attempts + 1, \
        last_error = NULL, claim_token = NULL, claimed_until = NULL \
    WHERE claim_token = ?2 AND seq IN (SELECT value FROM json_each(?1))";
/// As `OUTBOX_MARK_FAILED`, fenced by the batch's claim: `?1` the refused seqs with their
/// errors (a JSON array of `[seq, error]`), `?2` max attempts, `?3` retry base seconds, `?4`
/// retry cap seconds, `?5` claim token. Returns, per refused message, whether it was parked.
pub(super) const OUTBOX_MARK_FAILED: &str = "UPDATE idempotency_outbox AS o \
    SET attempts = o.attempts + 1, last_error = f.error, \
        state = CASE WHEN o.attempts + 1 >= ?2 THEN 'FAILED' ELSE 'PENDING' END, \
        next_attempt_at = unixepoch('subsec') + min(?3 * (1 << min(o.attempts, 62)), ?4), \
        claim_token = NULL, claimed_until = NULL \
    FROM (SELECT json_extract(value, '$[0]') AS seq, json_extract(value, '$[1]') AS error \
          FROM json_each(?1)) AS f \
    WHERE o.seq = f.seq AND o.claim_token = ?5 RETURNING state = 'FAILED'";
/// Releases what is left of a batch's claim (messages neither confirmed nor refused). `?1`
/// claim token.
pub(super) const OUTBOX_RELEASE: &str = "UPDATE idempotency_outbox \
    SET claim_token = NULL, claimed_until = NULL WHERE claim_token = ?1";
/// As `OUTBOX_PENDING`.
pub(super) const OUTBOX_PENDING: &str = "SELECT count(*), \
    CAST(unixepoch('subsec') - min(created_at) AS REAL) \
    FROM idempotency_outbox WHERE state = 'PENDING'";
/// As `OUTBOX_PARKED`.
pub(super) const OUTBOX_PARKED: &str = "SELECT count(*), \
    CAST(unixepoch('subsec') - min(created_at) AS REAL) \
    FROM idempotency_outbox WHERE state = 'FAILED'";

/// The columns of `ADMIN_OUTBOX` and the outbox pages, followed by `$clause`.
macro_rules! select_outbox {
    ($clause:literal) => {
        concat!(
            "SELECT seq, message_id, topic, ordering_key, state, attempts, last_error, \
             length(CAST(payload AS BLOB)), CAST(created_at AS REAL), CAST(sent_at AS REAL) \
             FROM idempotency_outbox ",
            $clause
        )
    };
}
/// As `ADMIN_OUTBOX`. `?1` state, `?2` limit.
pub(super) const ADMIN_OUTBOX: &str = select_outbox!("WHERE state = ?1 ORDER BY seq LIMIT ?2");
/// As `ADMIN_REQUEUE_OUTBOX` (the claim cleared too). `?1` message id.
pub(super) const ADMIN_REQUEUE_OUTBOX: &str = "UPDATE idempotency_outbox \
    SET state = 'PENDING', attempts = 0, next_attempt_at = 0, claim_token = NULL, \
        claimed_until = NULL \
    WHERE message_id = ?1 AND state = 'FAILED'";
/// As `ADMIN_OUTBOX_PENDING_PAGE`. `?1` after seq, `?2` limit.
pub(super) const ADMIN_OUTBOX_PENDING_PAGE: &str =
    select_outbox!("WHERE state = 'PENDING' AND seq > ?1 ORDER BY seq LIMIT ?2");
/// As `ADMIN_OUTBOX_PARKED_PAGE`. `?1` after seq, `?2` limit.
pub(super) const ADMIN_OUTBOX_PARKED_PAGE: &str =
    select_outbox!("WHERE state = 'FAILED' AND seq > ?1 ORDER BY seq LIMIT ?2");

/// Seconds since the epoch as whole microseconds (the console's cursors): the cursor is
/// compared and ordered in this same integer form, never converted back to a REAL.
macro_rules! micros {
    ($column:literal) => {
        concat!("CAST(round(", $column, " * 1000000) AS INTEGER)")
    };
}

/// Every `RecordInfo` column, then `$tail` (more columns and the `FROM` onwards).
macro_rules! select_record {
    ($($tail:tt)*) => {
        concat!(
            "SELECT id, scope, idempotency_key, state, retryable, status, fingerprint, \
             fencing_token, CAST(created_at AS REAL), CAST(updated_at AS REAL), \
             CAST(expires_at AS REAL), CAST(locked_until AS REAL), \
             length(CAST(headers AS BLOB)) + length(CAST(body AS BLOB))",
            $($tail)*
        )
    };
}
/// Every `MessageInfo` column, then `$tail`.
macro_rules! select_message {
    ($($tail:tt)*) => {
        concat!(
            "SELECT consumer_group, message_id, status, attempts, last_error, payload_digest, \
             CAST(created_at AS REAL), CAST(updated_at AS REAL), CAST(expires_at AS REAL)",
            $($tail)*
        )
    };
}

/// As `ADMIN_RECORD`. `?1` record id.
pub(super) const ADMIN_RECORD: &str = select_record!(" FROM idempotency_records WHERE id = ?1");
/// As `EXPORT_RECORDS`: the records [`PURGE_RECORDS`] would purge, with its parameters;
/// the response's columns only when `?5`.
pub(super) const EXPORT_RECORDS: &str = select_record!(
    ", CAST(round(created_at * 1e6) AS INTEGER), CAST(round(updated_at * 1e6) AS INTEGER), \
     CASE WHEN ?5 THEN headers END, CASE WHEN ?5 THEN body END, \
     CASE WHEN ?5 THEN body_key_id END FROM idempotency_records WHERE rowid IN (",
    expired_rowids!(),
    ") ORDER BY expires_at"
);
/// Deletes an exported record if it is still as exported: `?1` id, `?2` and `?3` its
/// creation and update times in microseconds.
pub(super) const PURGE_EXPORTED: &str = "DELETE FROM idempotency_records WHERE id = ?1 \
    AND CAST(round(created_at * 1e6) AS INTEGER) = ?2 \
    AND CAST(round(updated_at * 1e6) AS INTEGER) = ?3";
/// As `ADMIN_ARCHIVED`. `?1` id.
pub(super) const ADMIN_ARCHIVED: &str = "SELECT id, scope, idempotency_key, state, retryable, \
    status, fingerprint, fencing_token, CAST(created_at AS REAL), CAST(updated_at AS REAL), \
    CAST(expires_at AS REAL), CAST(NULL AS REAL), \
    coalesce(length(CAST(headers AS BLOB)) + length(CAST(body AS BLOB)), 0), \
    CAST(archived_at AS REAL), CAST(length(CAST(body AS BLOB)) AS REAL), \
    headers, body, body_key_id \
    FROM idempotency_records_archive WHERE id = ?1 ORDER BY created_at DESC";
/// As `ADMIN_STALE`. `?1` limit.
pub(super) const ADMIN_STALE: &str = select_record!(
    " FROM idempotency_records \
     WHERE state = 'PROCESSING' AND locked_until < unixepoch('subsec') \
     ORDER BY locked_until, id LIMIT ?1"
);
/// As `ADMIN_STALE_PAGE`: `?1` the cursor's microseconds, `?2` its id, `?3` limit; the last
/// column is the row's cursor, and the rows are ordered by it.
pub(super) const ADMIN_STALE_PAGE: &str = select_record!(concat!(
    ", ",
    micros!("locked_until"),
    " FROM idempotency_records \
     WHERE state = 'PROCESSING' AND locked_until < unixepoch('subsec') AND (",
    micros!("locked_until"),
    ", id) > (?1, ?2) ORDER BY ",
    micros!("locked_until"),
    ", id LIMIT ?3"
));
/// As `ADMIN_RECORD_RESPONSE`. `?1` record id.
pub(super) const ADMIN_RECORD_RESPONSE: &str =
    "SELECT headers, body, body_key_id FROM idempotency_records WHERE id = ?1";
/// As `ADMIN_RELEASE_LEASE`. `?1` id, `?2` fencing token.
pub(super) const ADMIN_RELEASE_LEASE: &str = "UPDATE idempotency_records \
    SET state = 'FAILED', retryable = 1, locked_until = NULL, updated_at = unixepoch('subsec') \
    WHERE id = ?1 AND fencing_token = ?2 AND state = 'PROCESSING' \
      AND locked_until < unixepoch('subsec')";
/// As `ADMIN_DELETE_RECORD`. `?1` id, `?2` token.
pub(super) const ADMIN_DELETE_RECORD: &str =
    "DELETE FROM idempotency_records WHERE id = ?1 AND fencing_token = ?2";
/// As `ADMIN_RECORD_COUNTS`; SQLite keeps no row estimate, so the total is a count (a scan
/// of the primary key's index).
pub(super) const ADMIN_RECORD_COUNTS: &str = "SELECT \
    (SELECT count(*) FROM idempotency_records WHERE state = 'PROCESSING'), \
    (SELECT count(*) FROM idempotency_records WHERE state = 'FAILED'), \
    (SELECT count(*) FROM idempotency_records), \
    (SELECT count(*) FROM idempotency_records_archive)";
/// As `ADMIN_MESSAGE`. `?1` group, `?2` message id.
pub(super) const ADMIN_MESSAGE: &str =
    select_message!(" FROM inbox_messages WHERE consumer_group = ?1 AND message_id = ?2");
/// As `ADMIN_FAILED_MESSAGES`. `?1` group, `?2` limit.
pub(super) const ADMIN_FAILED_MESSAGES: &str = select_message!(
    " FROM inbox_messages WHERE consumer_group = ?1 AND status = 'FAILED' \
     ORDER BY updated_at DESC, message_id LIMIT ?2"
);
/// As `ADMIN_FAILED_PAGE`: `?1` group, `?2` the cursor's microseconds, `?3` its message id,
/// `?4` limit; the last column is the row's cursor, and the rows are ordered by it.
pub(super) const ADMIN_FAILED_PAGE: &str = select_message!(concat!(
    ", ",
    micros!("updated_at"),
    " FROM inbox_messages WHERE consumer_group = ?1 AND status = 'FAILED' AND (",
    micros!("updated_at"),
    ", message_id) < (?2, ?3) ORDER BY ",
    micros!("updated_at"),
    " DESC, message_id DESC LIMIT ?4"
));
/// As `ADMIN_FAILED_GROUPS`. `?1` give-up attempts, `?2` limit.
pub(super) const ADMIN_FAILED_GROUPS: &str = "SELECT consumer_group, count(*), \
    count(*) FILTER (WHERE attempts >= ?1) FROM inbox_messages WHERE status = 'FAILED' \
    GROUP BY consumer_group ORDER BY consumer_group LIMIT ?2";
/// As `ADMIN_RESET_INBOX`. `?1` group, `?2` message id.
pub(super) const ADMIN_RESET_INBOX: &str = "UPDATE inbox_messages SET attempts = 0 \
    WHERE consumer_group = ?1 AND message_id = ?2 AND status = 'FAILED' AND attempts > 0";

/// The table of applied migration versions.
pub(super) const CREATE_MIGRATIONS_TABLE: &str =
    "CREATE TABLE IF NOT EXISTS axum_idempotency_migrations (
        version    INTEGER PRIMARY KEY,
        name       TEXT    NOT NULL,
        applied_at REAL    NOT NULL DEFAULT (unixepoch('subsec'))
    )";
/// Whether the migration table exists (1) or not (0).
pub(super) const SCHEMA_TABLE: &str = "SELECT count(*) FROM sqlite_master \
    WHERE type = 'table' AND name = 'axum_idempotency_migrations'";
/// The highest applied version (0 for none).
pub(super) const SCHEMA_VERSION: &str =
    "SELECT coalesce(max(version), 0) FROM axum_idempotency_migrations";
/// Records an applied version. `?1` version, `?2` name.
pub(super) const RECORD_MIGRATION: &str = "INSERT INTO axum_idempotency_migrations \
    (version, name, applied_at) VALUES (?1, ?2, unixepoch('subsec'))";
/// A write that changes nothing, so `migrate` finds out at start-up whether the database
/// takes writes even when nothing is pending (SQLite refuses it on a read-only database
/// whether or not a row matches). `?1` the current version.
pub(super) const PROBE_WRITE: &str = "UPDATE axum_idempotency_migrations \
    SET applied_at = applied_at WHERE version = ?1";
/// Switches the database file to WAL (persistent in the file); answers the journal mode
/// now in force.
pub(super) const JOURNAL_MODE_WAL: &str = "PRAGMA journal_mode = WAL";
