-- The schema of axum-idempotency 0.1 on SQLite: the tables and indexes of
-- `migrations/0001_schema.sql` (PostgreSQL), with the same names, columns and meaning, in
-- SQLite's types. `migrate` runs it once per database file (recorded in
-- `axum_idempotency_migrations`); later versions add files, never change this one.
--
-- Times are REAL seconds since the Unix epoch, written by SQLite itself
-- (`unixepoch('subsec')`). Booleans are INTEGER 0/1. Text compares binary (case- and
-- trailing-space-sensitive), as keys, scopes and message ids must.

-- Completed HTTP requests and lease-mode leases, keyed by (scope, Idempotency-Key); see the
-- PostgreSQL schema. A rowid table, not WITHOUT ROWID: a stored body may be a MiB, and
-- WITHOUT ROWID suits small rows only.
CREATE TABLE IF NOT EXISTS idempotency_records (
    -- First 16 bytes of SHA-256 over (scope, key).
    id              BLOB    NOT NULL PRIMARY KEY CHECK (length(id) = 16),
    scope           TEXT    NOT NULL,
    idempotency_key TEXT,
    fingerprint     BLOB    NOT NULL,
    status          INTEGER NOT NULL,
    headers         BLOB    NOT NULL,
    body            BLOB    NOT NULL,
    created_at      REAL    NOT NULL DEFAULT (unixepoch('subsec')),
    expires_at      REAL    NOT NULL,
    state           TEXT    NOT NULL DEFAULT 'SUCCESS'
                            CONSTRAINT idempotency_records_state_check
                            CHECK (state IN ('PROCESSING', 'SUCCESS', 'FAILED')),
    retryable       INTEGER NOT NULL DEFAULT 0 CHECK (retryable IN (0, 1)),
    -- Drawn from the 'fencing' row of `idempotency_counters` by every new lease and every
    -- takeover; a completion must present the current one.
    fencing_token   INTEGER NOT NULL DEFAULT 0,
    locked_until    REAL,
    updated_at      REAL    NOT NULL DEFAULT (unixepoch('subsec')),
    body_key_id     INTEGER
);

CREATE INDEX IF NOT EXISTS idempotency_records_expires_at_idx
    ON idempotency_records (expires_at);
CREATE INDEX IF NOT EXISTS idempotency_records_processing_idx
    ON idempotency_records (locked_until) WHERE state = 'PROCESSING';
CREATE INDEX IF NOT EXISTS idempotency_records_failed_idx
    ON idempotency_records (expires_at) WHERE state = 'FAILED';

-- Counters that only go up: 'fencing' (lease mode's fencing tokens, never handed out twice,
-- even to a record re-created after its predecessor was purged: PostgreSQL's sequence) and
-- 'outbox_claim' (the relay's batch claims).
CREATE TABLE IF NOT EXISTS idempotency_counters (
    name  TEXT    NOT NULL PRIMARY KEY,
    value INTEGER NOT NULL
);
INSERT OR IGNORE INTO idempotency_counters (name, value) VALUES ('fencing', 0), ('outbox_claim', 0);

-- Consumed messages, keyed by (consumer_group, message_id); see the PostgreSQL schema.
-- In-flight processing needs no row: it is the open write transaction of its consumer.
CREATE TABLE IF NOT EXISTS inbox_messages (
    consumer_group TEXT    NOT NULL,
    message_id     TEXT    NOT NULL,
    status         TEXT    NOT NULL CHECK (status IN ('SUCCESS', 'FAILED')),
    attempts       INTEGER NOT NULL,
    payload_digest BLOB,
    payload        BLOB,
    last_error     TEXT,
    created_at     REAL    NOT NULL DEFAULT (unixepoch('subsec')),
    updated_at     REAL    NOT NULL DEFAULT (unixepoch('subsec')),
    expires_at     REAL    NOT NULL,
    payload_key_id INTEGER,
    PRIMARY KEY (consumer_group, message_id)
);

CREATE INDEX IF NOT EXISTS inbox_messages_expires_at_idx
    ON inbox_messages (expires_at);
CREATE INDEX IF NOT EXISTS inbox_messages_failed_idx
    ON inbox_messages (consumer_group, updated_at, message_id) WHERE status = 'FAILED';

-- The transactional outbox; see the PostgreSQL schema. `seq` is AUTOINCREMENT, so a number
-- is never reused after a purge. SQLite has no row locks to skip: a relay claims its batch
-- (`claim_token`, `claimed_until`) in a short write transaction, and a claim that outlived
-- its relay lapses at `claimed_until`.
CREATE TABLE IF NOT EXISTS idempotency_outbox (
    seq             INTEGER PRIMARY KEY AUTOINCREMENT,
    message_id      TEXT    NOT NULL UNIQUE,
    topic           TEXT    NOT NULL,
    ordering_key    TEXT,
    content_type    TEXT,
    payload         BLOB    NOT NULL,
    state           TEXT    NOT NULL DEFAULT 'PENDING'
                            CHECK (state IN ('PENDING', 'SENT', 'FAILED')),
    attempts        INTEGER NOT NULL DEFAULT 0,
    last_error      TEXT,
    created_at      REAL    NOT NULL DEFAULT (unixepoch('subsec')),
    -- 0: due at once (PostgreSQL's '-infinity').
    next_attempt_at REAL    NOT NULL DEFAULT 0,
    sent_at         REAL,
    claim_token     INTEGER,
    claimed_until   REAL
);

CREATE INDEX IF NOT EXISTS idempotency_outbox_pending_idx
    ON idempotency_outbox (seq) WHERE state = 'PENDING';
CREATE INDEX IF NOT EXISTS idempotency_outbox_pending_key_idx
    ON idempotency_outbox (ordering_key, seq)
    WHERE state = 'PENDING' AND ordering_key IS NOT NULL;
CREATE INDEX IF NOT EXISTS idempotency_outbox_settled_idx
    ON idempotency_outbox (coalesce(sent_at, created_at)) WHERE state <> 'PENDING';
CREATE INDEX IF NOT EXISTS idempotency_outbox_parked_idx
    ON idempotency_outbox (seq) WHERE state = 'FAILED';
CREATE INDEX IF NOT EXISTS idempotency_outbox_claim_idx
    ON idempotency_outbox (claim_token) WHERE claim_token IS NOT NULL;
