//! The statement texts, shared by the drivers: each driver binds the same parameters in
//! the same order (the tokio-postgres driver also declares their types, for running them
//! unprepared). Tables are used without a schema qualifier, so they live in the first
//! schema of the connections' `search_path`.

/// The advisory lock of a record: its 64-bit key with the oid of the table the record
/// lives in mixed into the high half. Advisory locks are per database, records per schema:
/// without the table, the same key in two schemas of one database (two services, two
/// test schemas) would wait for each other. The cast to `regclass` is resolved at planning
/// through the `search_path`, like the tables the statements use.
macro_rules! lock_key {
    ($param:literal) => {
        concat!(
            "(",
            $param,
            " # ('idempotency_records'::regclass::oid::int8 << 32))"
        )
    };
}

/// The claim in one call of `axum_idempotency_claim` (the schema), for a driver that
/// cannot pipeline (sqlx): a completed record is returned without taking the lock (it
/// never changes); otherwise the key's transaction-scoped advisory lock is tried and the
/// record read again in a statement of its own, whose READ COMMITTED snapshot is taken
/// after the lock. `$1` record id, `$2` lock key. Columns as [`LOOKUP`], then `locked`,
/// `found`.
#[cfg(feature = "sqlx")]
pub(crate) const CLAIM: &str = concat!(
    "SELECT * FROM axum_idempotency_claim($1, ",
    lock_key!("$2"),
    ")"
);
/// Tries the key's transaction-scoped lock. `$1` lock key.
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub(crate) const TRY_LOCK: &str =
    concat!("SELECT pg_try_advisory_xact_lock(", lock_key!("$1"), ")");
/// Waits for the key's lock; bounded by [`SET_LOCK_TIMEOUT`]. `$1` lock key.
pub(crate) const WAIT_LOCK: &str =
    concat!("SELECT pg_advisory_xact_lock(", lock_key!("$1"), ")::text");
/// A transaction-local `lock_timeout`. `$1` e.g. `250ms`.
pub(crate) const SET_LOCK_TIMEOUT: &str = "SELECT set_config('lock_timeout', $1, true)";
/// The wait's lock timeout must not apply to the handler's own statements.
pub(crate) const RESET_LOCK_TIMEOUT: &str = "SET LOCAL lock_timeout TO DEFAULT";
/// A record's claim columns. `$1` record id.
pub(crate) const LOOKUP: &str = "SELECT status, headers, body, fingerprint, expires_at <= now(), \
    state, retryable, ceil(extract(epoch FROM locked_until - now()))::int4, \
    extract(epoch FROM expires_at - now())::float8, body_key_id \
    FROM idempotency_records WHERE id = $1";
/// Removes a record the claim found replaceable (expired, an abandoned lease, a retryable
/// failure), under the key's lock. `$1` record id.
pub(crate) const DELETE_REPLACEABLE: &str = "DELETE FROM idempotency_records WHERE id = $1 \
    AND (expires_at <= now() OR (state = 'PROCESSING' AND locked_until <= now()) \
         OR (state = 'FAILED' AND retryable))";
/// The record written with the handler's work. `$1` id, `$2` scope, `$3` raw key, `$4`
/// fingerprint, `$5` status, `$6` headers, `$7` body, `$8` body key id, `$9` ttl seconds.
pub(crate) const INSERT: &str = "INSERT INTO idempotency_records \
    (id, scope, idempotency_key, fingerprint, status, headers, body, body_key_id, expires_at) \
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, now() + make_interval(secs => $9))";
/// Whether the record exists, live or not (a lazy claim's look-up under the lock; any
/// record, even an expired one, makes the request take the eager claim on its retry).
/// `$1` record id.
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub(crate) const EXISTS: &str = "SELECT 1 FROM idempotency_records WHERE id = $1";
/// [`INSERT`], for a lazy claim whose handler sent no statement: the key's lock is tried
/// in the same statement (`$10`, the lock key), so a key another request holds inserts
/// nothing. The row's primary key still refuses a record a twin committed.
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub(crate) const INSERT_IF_LOCKED: &str = concat!(
    "INSERT INTO idempotency_records \
     (id, scope, idempotency_key, fingerprint, status, headers, body, body_key_id, expires_at) \
     SELECT $1, $2, $3, $4, $5, $6, $7, $8, now() + make_interval(secs => $9) \
     WHERE pg_try_advisory_xact_lock(",
    lock_key!("$10"),
    ")"
);

/// Lease mode: take the key by committing a PROCESSING record, or take over one whose
/// holder's lease ran out (or that failed retryably), with a higher fencing token. `$1` id,
/// `$2` scope, `$3` raw key, `$4` fingerprint, `$5` lease seconds, `$6` ttl seconds.
pub(crate) const LEASE_ACQUIRE: &str = "INSERT INTO idempotency_records AS r \
    (id, scope, idempotency_key, fingerprint, state, fencing_token, locked_until, \
     status, headers, body, expires_at) \
    VALUES ($1, $2, $3, $4, 'PROCESSING', nextval('idempotency_fencing_tokens'), \
            now() + make_interval(secs => $5), 0, '', '', now() + make_interval(secs => $6)) \
    ON CONFLICT (id) DO UPDATE SET \
        state = 'PROCESSING', retryable = false, \
        fencing_token = GREATEST(r.fencing_token + 1, EXCLUDED.fencing_token), \
        locked_until = EXCLUDED.locked_until, scope = EXCLUDED.scope, \
        idempotency_key = EXCLUDED.idempotency_key, fingerprint = EXCLUDED.fingerprint, \
        status = 0, headers = '', body = '', body_key_id = NULL, updated_at = now(), \
        created_at = CASE WHEN r.expires_at <= now() THEN now() ELSE r.created_at END, \
        expires_at = EXCLUDED.expires_at \
    WHERE r.expires_at <= now() \
       OR (r.fingerprint = EXCLUDED.fingerprint \
           AND ((r.state = 'PROCESSING' AND r.locked_until <= now()) \
                OR (r.state = 'FAILED' AND r.retryable))) \
    RETURNING fencing_token, xmax <> '0'::xid";

/// Lease mode: the holder's completion, fenced by its token. `$1` id, `$2` token, `$3`
/// state, `$4` retryable, `$5` status, `$6` headers, `$7` body, `$8` body key id, `$9` ttl.
pub(crate) const LEASE_COMPLETE: &str = "UPDATE idempotency_records SET \
    state = $3, retryable = $4, status = $5, headers = $6, body = $7, body_key_id = $8, \
    locked_until = NULL, updated_at = now(), expires_at = now() + make_interval(secs => $9) \
    WHERE id = $1 AND fencing_token = $2 AND state = 'PROCESSING'";

/// Taken right after an inbox message's lock: a failed attempt rolls back to it, keeping
/// the lock, and records the failure in the same transaction.
pub(crate) const INBOX_WORK_SAVEPOINT: &str = "SAVEPOINT axum_idempotency_work";
/// Discards the consumer's work of a failed attempt, keeping the message's lock.
pub(crate) const INBOX_ROLLBACK_WORK: &str = "ROLLBACK TO SAVEPOINT axum_idempotency_work";
/// An inbox record under its lock. `$1` group, `$2` message id.
pub(crate) const INBOX_LOOKUP: &str = "SELECT status = 'SUCCESS', attempts, last_error, \
    expires_at > now(), payload_digest FROM inbox_messages \
    WHERE consumer_group = $1 AND message_id = $2";
/// Records success with the consumer's work. An upsert, so that a FAILED or expired row
/// (which a concurrent sweep may delete at any moment) is replaced, and the record is
/// always written when the work commits. `$1` group, `$2` message id, `$3` attempts, `$4`
/// digest, `$5` payload, `$6` payload key id, `$7` retention seconds.
pub(crate) const INBOX_RECORD_SUCCESS: &str = "INSERT INTO inbox_messages AS m \
    (consumer_group, message_id, status, attempts, payload_digest, payload, payload_key_id, \
     expires_at) \
    VALUES ($1, $2, 'SUCCESS', $3, $4, $5, $6, now() + make_interval(secs => $7)) \
    ON CONFLICT (consumer_group, message_id) DO UPDATE SET \
        status = 'SUCCESS', attempts = EXCLUDED.attempts, \
        payload_digest = EXCLUDED.payload_digest, payload = EXCLUDED.payload, \
        payload_key_id = EXCLUDED.payload_key_id, \
        last_error = NULL, updated_at = now(), expires_at = EXCLUDED.expires_at";
/// A failed attempt. `$1` group, `$2` message id, `$3` digest, `$4` payload, `$5` payload
/// key id, `$6` error, `$7` retention seconds.
pub(crate) const INBOX_RECORD_FAILURE: &str = "INSERT INTO inbox_messages AS m \
    (consumer_group, message_id, status, attempts, payload_digest, payload, payload_key_id, \
     last_error, expires_at) \
    VALUES ($1, $2, 'FAILED', 1, $3, $4, $5, $6, now() + make_interval(secs => $7)) \
    ON CONFLICT (consumer_group, message_id) DO UPDATE SET \
        status = 'FAILED', \
        attempts = CASE WHEN m.status = 'SUCCESS' OR m.expires_at <= now() \
                        THEN 1 ELSE m.attempts + 1 END, \
        payload_digest = EXCLUDED.payload_digest, payload = EXCLUDED.payload, \
        payload_key_id = EXCLUDED.payload_key_id, \
        last_error = EXCLUDED.last_error, updated_at = now(), expires_at = EXCLUDED.expires_at \
    WHERE m.status = 'FAILED' OR m.expires_at <= now() \
    RETURNING attempts";

/// The ids of a batch of records [`PURGE_RECORDS`] purges, locked.
macro_rules! expired_where {
    () => {
        "WHERE expires_at <= now() - make_interval(secs => $3) \
           AND CASE state \
               WHEN 'SUCCESS' THEN expires_at <= now() - make_interval(secs => $1) \
               ELSE expires_at <= now() - make_interval(secs => $2) \
                    AND (state = 'FAILED' OR locked_until IS NULL OR locked_until <= now()) \
               END "
    };
}
macro_rules! expired_records {
    () => {
        concat!(
            "SELECT id FROM idempotency_records ",
            expired_where!(),
            "LIMIT $4 FOR UPDATE SKIP LOCKED"
        )
    };
}

/// Expired records past their state's retention. `$1` success grace, `$2` failure retention
/// (seconds), `$3` the smaller of the two (lets the `expires_at` index narrow the scan),
/// `$4` batch size. A PROCESSING record goes only once its lease has lapsed too, and is kept
/// as long as a failure: it is an attempt that never finished.
pub(crate) const PURGE_RECORDS: &str = concat!(
    "DELETE FROM idempotency_records WHERE id IN (",
    expired_records!(),
    ")"
);

/// [`PURGE_RECORDS`] that writes each record it purges to `idempotency_records_archive` in
/// the same statement — so in the same transaction — its headers and body only when `$5`
/// (a record archived before keeps its row: the key is `(id, created_at)`); one row, the
/// number purged.
pub(crate) const PURGE_RECORDS_ARCHIVING: &str = concat!(
    "WITH purged AS (DELETE FROM idempotency_records WHERE id IN (",
    expired_records!(),
    ") RETURNING id, scope, idempotency_key, fingerprint, status, headers, body, body_key_id, \
       state, retryable, fencing_token, created_at, updated_at, expires_at), \
     archived AS (INSERT INTO idempotency_records_archive (id, scope, idempotency_key, \
       fingerprint, status, headers, body, body_key_id, state, retryable, fencing_token, \
       created_at, updated_at, expires_at) \
       SELECT id, scope, idempotency_key, fingerprint, status, CASE WHEN $5 THEN headers END, \
         CASE WHEN $5 THEN body END, CASE WHEN $5 THEN body_key_id END, state, retryable, \
         fencing_token, created_at, updated_at, expires_at FROM purged \
       ON CONFLICT (id, created_at) DO NOTHING) \
     SELECT count(*) FROM purged"
);
/// The records [`PURGE_RECORDS`] would purge, with its parameters, for an archive sink
/// (`rows::archived_row`): read, not locked; the response's columns only when `$5`.
pub(crate) const EXPORT_RECORDS: &str = concat!(
    "SELECT uuid_send(id), scope, idempotency_key, state, retryable, status, \
     fingerprint, fencing_token, extract(epoch FROM created_at)::float8, \
     extract(epoch FROM updated_at)::float8, extract(epoch FROM expires_at)::float8, \
     extract(epoch FROM locked_until)::float8, \
     (octet_length(headers) + octet_length(body))::bigint, \
     (extract(epoch FROM created_at) * 1000000)::int8, \
     (extract(epoch FROM updated_at) * 1000000)::int8, \
     CASE WHEN $5 THEN headers END, CASE WHEN $5 THEN body END, \
     CASE WHEN $5 THEN body_key_id END \
     FROM idempotency_records ",
    expired_where!(),
    "ORDER BY expires_at LIMIT $4"
);
/// Deletes the exported records that are still as exported: `$1` ids (32 hex digits), `$2`
/// and `$3` their creation and update times in microseconds, skipping rows a live request
/// holds.
pub(crate) const PURGE_EXPORTED: &str = "DELETE FROM idempotency_records WHERE id IN ( \
    SELECT r.id FROM idempotency_records r \
    JOIN unnest($1::text[], $2::int8[], $3::int8[]) AS x(id, created_us, updated_us) \
      ON r.id = x.id::uuid \
    WHERE (extract(epoch FROM r.created_at) * 1000000)::int8 = x.created_us \
      AND (extract(epoch FROM r.updated_at) * 1000000)::int8 = x.updated_us \
    FOR UPDATE OF r SKIP LOCKED)";
/// Archived records archived more than `$1` seconds ago, `$2` at most.
pub(crate) const PURGE_ARCHIVE: &str = "DELETE FROM idempotency_records_archive \
    WHERE (id, created_at) IN (SELECT id, created_at FROM idempotency_records_archive \
      WHERE archived_at <= now() - make_interval(secs => $1) \
      LIMIT $2 FOR UPDATE SKIP LOCKED)";
/// Expired inbox records, with the same parameters as [`PURGE_RECORDS`].
pub(crate) const PURGE_MESSAGES: &str = "DELETE FROM inbox_messages \
    WHERE (consumer_group, message_id) IN ( \
    SELECT consumer_group, message_id FROM inbox_messages \
    WHERE expires_at <= now() - make_interval(secs => $3) \
      AND CASE status \
          WHEN 'SUCCESS' THEN expires_at <= now() - make_interval(secs => $1) \
          ELSE expires_at <= now() - make_interval(secs => $2) \
          END \
    LIMIT $4 FOR UPDATE SKIP LOCKED)";
/// Count of PROCESSING records past their lease, and seconds since the oldest lease ended.
pub(crate) const STALE_SUMMARY: &str = "SELECT count(*), \
    extract(epoch FROM now() - min(locked_until))::float8 \
    FROM idempotency_records WHERE state = 'PROCESSING' AND locked_until < now()";
/// The ids of the stalest records, for the log. `$1` how many.
pub(crate) const STALE_IDS: &str = "SELECT uuid_send(id) FROM idempotency_records \
    WHERE state = 'PROCESSING' AND locked_until < now() \
    ORDER BY locked_until LIMIT $1";
/// Marks records whose lease ended more than `$1` seconds ago FAILED and retryable, `$2` at
/// a time. A holder that comes back later finds its fenced completion refused.
pub(crate) const MARK_STALE_FAILED: &str = "UPDATE idempotency_records \
    SET state = 'FAILED', retryable = true, locked_until = NULL, updated_at = now() \
    WHERE state = 'PROCESSING' AND id IN ( \
    SELECT id FROM idempotency_records \
    WHERE state = 'PROCESSING' AND locked_until < now() - make_interval(secs => $1) \
    LIMIT $2 FOR UPDATE SKIP LOCKED)";

/// Outbox rows past their retention, with the same parameters as [`PURGE_RECORDS`]: `$1`
/// how long a SENT row is kept after its confirm, `$2` how long a FAILED (parked) row is
/// kept after it was enqueued, `$3` the smaller, `$4` batch size. PENDING rows are never
/// purged.
pub(crate) const PURGE_OUTBOX: &str = "DELETE FROM idempotency_outbox WHERE seq IN ( \
    SELECT seq FROM idempotency_outbox \
    WHERE state <> 'PENDING' \
      AND coalesce(sent_at, created_at) <= now() - make_interval(secs => $3) \
      AND CASE state \
          WHEN 'SENT' THEN sent_at <= now() - make_interval(secs => $1) \
          ELSE created_at <= now() - make_interval(secs => $2) \
          END \
    LIMIT $4 FOR UPDATE SKIP LOCKED)";

/// Enqueues an outbox message in the caller's transaction. A message with an ordering key
/// first takes the key's transaction-scoped lock, so producers of one key commit in the
/// order their rows are numbered; a message id already enqueued is a no-op (no row). `$1`
/// message id (NULL: a random UUID), `$2` topic, `$3` ordering key (or NULL), `$4` content
/// type (or NULL), `$5` payload.
pub(crate) const OUTBOX_ENQUEUE: &str = "INSERT INTO idempotency_outbox \
    (message_id, topic, ordering_key, content_type, payload) \
    SELECT coalesce($1, gen_random_uuid()::text), $2, $3, $4, $5 \
    WHERE $3::text IS NULL OR pg_advisory_xact_lock(hashtextextended($3, 0) \
          # ('idempotency_outbox'::regclass::oid::int8 << 32))::text = '' \
    ON CONFLICT (message_id) DO NOTHING RETURNING message_id";
/// The relay's batch: pending rows due for an attempt, oldest first, locked for this
/// relay's transaction and skipped by every other relay's. A row behind an earlier message
/// of its ordering key that waits for its next attempt is left out: it could not be
/// published before that message anyway, and a key with a batch's worth of such rows would
/// otherwise fill every batch and starve the other keys. `$1` batch size.
pub(crate) const OUTBOX_LOCK_BATCH: &str = "SELECT seq, message_id, topic, ordering_key, \
    content_type, payload, attempts, extract(epoch FROM clock_timestamp() - created_at)::float8 \
    FROM idempotency_outbox AS o WHERE state = 'PENDING' AND next_attempt_at <= now() \
    AND (ordering_key IS NULL OR NOT EXISTS (SELECT 1 FROM idempotency_outbox AS w \
        WHERE w.state = 'PENDING' AND w.ordering_key = o.ordering_key AND w.seq < o.seq \
          AND w.next_attempt_at > now())) \
    ORDER BY seq LIMIT $1 FOR UPDATE SKIP LOCKED";
/// For each ordering key of a batch, the first pending message of that key outside the
/// batch (held by another relay, or waiting for its next attempt): the batch publishes that
/// key's messages only up to it. `$1` the batch's keys, `$2` the batch's seqs.
pub(crate) const OUTBOX_BARRIERS: &str = "SELECT ordering_key, min(seq) \
    FROM idempotency_outbox WHERE state = 'PENDING' AND ordering_key = ANY($1) \
    AND seq <> ALL($2) GROUP BY ordering_key";
/// Marks confirmed messages SENT. `$1` seqs.
pub(crate) const OUTBOX_MARK_SENT: &str = "UPDATE idempotency_outbox \
    SET state = 'SENT', sent_at = now(), attempts = attempts + 1, last_error = NULL \
    WHERE seq = ANY($1)";
/// Records refused attempts: each message's next attempt waits `$4 * 2^attempts` seconds
/// (at most `$5`), and a message that reached `$3` attempts is parked FAILED. `$1` seqs,
/// `$2` their errors. Returns one row per parked message.
pub(crate) const OUTBOX_MARK_FAILED: &str = "UPDATE idempotency_outbox AS o \
    SET attempts = o.attempts + 1, last_error = f.error, \
        state = CASE WHEN o.attempts + 1 >= $3 THEN 'FAILED' ELSE 'PENDING' END, \
        next_attempt_at = now() + make_interval(secs => least($4 * power(2::float8, o.attempts), $5)) \
    FROM unnest($1::int8[], $2::text[]) AS f(seq, error) \
    WHERE o.seq = f.seq RETURNING o.state = 'FAILED'";
/// Pending messages and the age in seconds of the oldest.
pub(crate) const OUTBOX_PENDING: &str = "SELECT count(*), \
    extract(epoch FROM now() - min(created_at))::float8 \
    FROM idempotency_outbox WHERE state = 'PENDING'";
/// Admin: messages in one state, oldest first. `$1` state, `$2` limit.
pub(crate) const ADMIN_OUTBOX: &str = "SELECT seq, message_id, topic, ordering_key, state, \
    attempts, last_error, octet_length(payload)::int8, extract(epoch FROM created_at)::float8, \
    extract(epoch FROM sent_at)::float8 FROM idempotency_outbox \
    WHERE state = $1 ORDER BY seq LIMIT $2";
/// Admin: puts a parked message back in the queue with its attempts reset. `$1` message id.
pub(crate) const ADMIN_REQUEUE_OUTBOX: &str = "UPDATE idempotency_outbox \
    SET state = 'PENDING', attempts = 0, next_attempt_at = '-infinity' \
    WHERE message_id = $1 AND state = 'FAILED'";

/// A `SELECT` of every [`RecordInfo`](crate::RecordInfo) column, followed by `$clause`.
macro_rules! select_record {
    ($clause:literal) => {
        concat!(
            "SELECT uuid_send(id), scope, idempotency_key, state, retryable, status, \
             fingerprint, fencing_token, extract(epoch FROM created_at)::float8, \
             extract(epoch FROM updated_at)::float8, extract(epoch FROM expires_at)::float8, \
             extract(epoch FROM locked_until)::float8, \
             (octet_length(headers) + octet_length(body))::bigint \
             FROM idempotency_records ",
            $clause
        )
    };
}

/// A `SELECT` of every [`MessageInfo`](crate::MessageInfo) column, followed by `$clause`.
macro_rules! select_message {
    ($clause:literal) => {
        concat!(
            "SELECT consumer_group, message_id, status, attempts, last_error, payload_digest, \
             extract(epoch FROM created_at)::float8, extract(epoch FROM updated_at)::float8, \
             extract(epoch FROM expires_at)::float8 FROM inbox_messages ",
            $clause
        )
    };
}

/// Admin: a record by id. `$1` record id.
pub(crate) const ADMIN_RECORD: &str = select_record!("WHERE id = $1");
/// Admin: a record's archived copies, newest first (`rows::archived_record`). `$1` id.
pub(crate) const ADMIN_ARCHIVED: &str = "SELECT uuid_send(id), scope, idempotency_key, \
    state, retryable, status, fingerprint, fencing_token, \
    extract(epoch FROM created_at)::float8, extract(epoch FROM updated_at)::float8, \
    extract(epoch FROM expires_at)::float8, NULL::float8, \
    coalesce(octet_length(headers) + octet_length(body), 0)::bigint, \
    extract(epoch FROM archived_at)::float8, octet_length(body)::float8, \
    headers, body, body_key_id \
    FROM idempotency_records_archive WHERE id = $1 ORDER BY created_at DESC";
/// Admin: stale leases. `$1` limit.
pub(crate) const ADMIN_STALE: &str = select_record!(
    "WHERE state = 'PROCESSING' AND locked_until < now() ORDER BY locked_until, id LIMIT $1"
);
/// Admin: one message. `$1` group, `$2` message id.
pub(crate) const ADMIN_MESSAGE: &str =
    select_message!("WHERE consumer_group = $1 AND message_id = $2");
/// Admin: a group's failed messages. `$1` group, `$2` limit.
pub(crate) const ADMIN_FAILED_MESSAGES: &str = select_message!(
    "WHERE consumer_group = $1 AND status = 'FAILED' \
     ORDER BY updated_at DESC, message_id LIMIT $2"
);

/// A cursor's microseconds since the epoch as a `timestamptz` (exact: integers below 2^53).
macro_rules! micros {
    ($param:literal) => {
        concat!(
            "(timestamptz 'epoch' + ",
            $param,
            "::int8 * interval '1 microsecond')"
        )
    };
}

/// Console: a page of stale leases, the longest-expired first, after the cursor (`$1` the
/// last row's `locked_until` in microseconds since the epoch, `$2` its id; the first page
/// starts before every lease). `$3` limit. The last column is the row's cursor.
pub(crate) const ADMIN_STALE_PAGE: &str = concat!(
    "SELECT uuid_send(id), scope, idempotency_key, state, retryable, status, \
     fingerprint, fencing_token, extract(epoch FROM created_at)::float8, \
     extract(epoch FROM updated_at)::float8, extract(epoch FROM expires_at)::float8, \
     extract(epoch FROM locked_until)::float8, \
     (octet_length(headers) + octet_length(body))::bigint, \
     (extract(epoch FROM locked_until) * 1000000)::int8 \
     FROM idempotency_records \
     WHERE state = 'PROCESSING' AND locked_until < now() \
       AND (locked_until, id) > (",
    micros!("$1"),
    ", $2) ORDER BY locked_until, id LIMIT $3"
);
/// Console: the stored response of a record. `$1` record id.
pub(crate) const ADMIN_RECORD_RESPONSE: &str =
    "SELECT headers, body, body_key_id FROM idempotency_records WHERE id = $1";
/// Console: releases a stale lease the way the sweeper does ([`MARK_STALE_FAILED`]): the
/// record becomes FAILED and retryable, so the next retry takes over with a new token.
/// Fenced on the token the operator saw. `$1` id, `$2` fencing token.
pub(crate) const ADMIN_RELEASE_LEASE: &str = "UPDATE idempotency_records \
    SET state = 'FAILED', retryable = true, locked_until = NULL, updated_at = now() \
    WHERE id = $1 AND fencing_token = $2 AND state = 'PROCESSING' AND locked_until < now()";
/// Console: deletes a record, fenced on the token the operator saw. `$1` id, `$2` token.
pub(crate) const ADMIN_DELETE_RECORD: &str =
    "DELETE FROM idempotency_records WHERE id = $1 AND fencing_token = $2";
/// Console: records by state. PROCESSING and FAILED are counted through their partial
/// indexes; the table's size is the planner's estimate (no scan of the table).
pub(crate) const ADMIN_RECORD_COUNTS: &str = "SELECT \
    (SELECT count(*) FROM idempotency_records WHERE state = 'PROCESSING'), \
    (SELECT count(*) FROM idempotency_records WHERE state = 'FAILED'), \
    (SELECT greatest(reltuples, 0)::int8 FROM pg_class \
     WHERE oid = 'idempotency_records'::regclass), \
    (SELECT greatest(reltuples, 0)::int8 FROM pg_class \
     WHERE oid = 'idempotency_records_archive'::regclass)";
/// Console: a page of a group's FAILED inbox messages, the most recently failed first,
/// after the cursor (`$2` the last row's `updated_at` in microseconds, `$3` its message
/// id; the first page starts after every row). `$1` group, `$4` limit. The last column is
/// the row's cursor.
pub(crate) const ADMIN_FAILED_PAGE: &str = concat!(
    "SELECT consumer_group, message_id, status, attempts, last_error, payload_digest, \
     extract(epoch FROM created_at)::float8, extract(epoch FROM updated_at)::float8, \
     extract(epoch FROM expires_at)::float8, \
     (extract(epoch FROM updated_at) * 1000000)::int8 FROM inbox_messages \
     WHERE consumer_group = $1 AND status = 'FAILED' AND (updated_at, message_id) < (",
    micros!("$2"),
    ", $3) ORDER BY updated_at DESC, message_id DESC LIMIT $4"
);
/// Console: the consumer groups with FAILED messages, each with its count of them and of
/// those at `$1` attempts or more (given up), at most `$2` groups.
pub(crate) const ADMIN_FAILED_GROUPS: &str = "SELECT consumer_group, count(*), \
    count(*) FILTER (WHERE attempts >= $1) FROM inbox_messages WHERE status = 'FAILED' \
    GROUP BY consumer_group ORDER BY consumer_group LIMIT $2";
/// Console: resets a FAILED message's attempts, so its next delivery runs the work again.
/// `$1` group, `$2` message id.
pub(crate) const ADMIN_RESET_INBOX: &str = "UPDATE inbox_messages SET attempts = 0 \
    WHERE consumer_group = $1 AND message_id = $2 AND status = 'FAILED' AND attempts > 0";
/// Console: a page of pending outbox messages in commit order, after seq `$1`; `$2` limit.
/// (The state is written out, not a parameter, so a generic plan still uses the partial
/// index.)
pub(crate) const ADMIN_OUTBOX_PENDING_PAGE: &str = "SELECT seq, message_id, topic, \
    ordering_key, state, attempts, last_error, octet_length(payload)::int8, \
    extract(epoch FROM created_at)::float8, extract(epoch FROM sent_at)::float8 \
    FROM idempotency_outbox WHERE state = 'PENDING' AND seq > $1 ORDER BY seq LIMIT $2";
/// Console: a page of parked outbox messages, like [`ADMIN_OUTBOX_PENDING_PAGE`].
pub(crate) const ADMIN_OUTBOX_PARKED_PAGE: &str = "SELECT seq, message_id, topic, \
    ordering_key, state, attempts, last_error, octet_length(payload)::int8, \
    extract(epoch FROM created_at)::float8, extract(epoch FROM sent_at)::float8 \
    FROM idempotency_outbox WHERE state = 'FAILED' AND seq > $1 ORDER BY seq LIMIT $2";
/// Parked messages and the age in seconds of the oldest.
pub(crate) const OUTBOX_PARKED: &str = "SELECT count(*), \
    extract(epoch FROM now() - min(created_at))::float8 \
    FROM idempotency_outbox WHERE state = 'FAILED'";

/// The table of applied migration versions.
pub(crate) const CREATE_MIGRATIONS_TABLE: &str =
    "CREATE TABLE IF NOT EXISTS axum_idempotency_migrations (
        version    integer     PRIMARY KEY,
        name       text        NOT NULL,
        applied_at timestamptz NOT NULL DEFAULT now()
    )";
/// Serialises concurrent `migrate` calls. `$1` [`MIGRATION_LOCK`](super::migrations::MIGRATION_LOCK).
pub(crate) const MIGRATION_LOCK: &str = "SELECT pg_advisory_xact_lock($1)";
/// Whether the migration table exists (1) or not (0), as a name in the search path.
pub(crate) const SCHEMA_TABLE: &str =
    "SELECT count(*) WHERE to_regclass('axum_idempotency_migrations') IS NOT NULL";
/// The highest applied version (0 for none).
pub(crate) const SCHEMA_VERSION: &str =
    "SELECT coalesce(max(version), 0) FROM axum_idempotency_migrations";
/// Records an applied version. `$1` version, `$2` name.
pub(crate) const RECORD_MIGRATION: &str =
    "INSERT INTO axum_idempotency_migrations (version, name) VALUES ($1, $2)";

/// The arrays [`PURGE_EXPORTED`] takes: ids in hex, creation and update microseconds.
pub(crate) fn export_columns(
    stamps: &[crate::engine::archive::ExportStamp],
) -> (Vec<String>, Vec<i64>, Vec<i64>) {
    let ids = stamps
        .iter()
        .map(|s| crate::engine::key::hex(s.id.as_bytes()))
        .collect();
    let created = stamps.iter().map(|s| s.created_us).collect();
    let updated = stamps.iter().map(|s| s.updated_us).collect();
    (ids, created, updated)
}
