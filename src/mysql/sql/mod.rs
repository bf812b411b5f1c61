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

// The sweeper's, the relay's and the console's statements.
mod ops;
pub(super) use self::ops::*;

/// On a Galera node, the claim's reads wait until the node has applied every write set the
/// cluster committed before them (`wsrep_sync_wait = 1`), so a key committed on another
/// node a moment ago is seen here; the session's own setting is kept and restored.
pub(super) const CAUSAL_READS: &str = "SET @axum_idempotency_sync_wait = @@SESSION.wsrep_sync_wait, \
    SESSION wsrep_sync_wait = 1";
/// The session's `wsrep_sync_wait` as the crate found it.
pub(super) const RESTORE_SYNC_WAIT: &str = "SET SESSION wsrep_sync_wait = \
    COALESCE(CAST(@axum_idempotency_sync_wait AS UNSIGNED), @@SESSION.wsrep_sync_wait), \
    @axum_idempotency_sync_wait = NULL";
