-- The schema of axum-idempotency 0.1 on MySQL 8.0 / MariaDB 10.6 and later (tested on
-- MariaDB 10.11): the same tables and columns as PostgreSQL's `migrations/0001_schema.sql`,
-- in this dialect. `migrate` runs it once per database (recorded in
-- `axum_idempotency_migrations`); every statement is safe to run again, since MySQL commits
-- DDL implicitly.
--
-- Types: ids are BINARY(16), fingerprints and digests binary. Message ids, consumer
-- groups, topics and ordering keys are VARBINARY (UTF-8 bytes, compared byte for byte:
-- `A1`, `a1` and `a1 ` are three — utf8mb4_bin would ignore the trailing space, being a
-- PAD SPACE collation, and utf8mb4_general_ci the case too); the statements read them back
-- as text with CONVERT(... USING utf8mb4). Scopes and raw keys, never compared, are
-- utf8mb4_bin text. Bodies and payloads are LONGBLOB (a BLOB holds 64 KiB); times
-- DATETIME(6) in UTC, always written from UTC_TIMESTAMP(6).

CREATE TABLE IF NOT EXISTS idempotency_records (
    id              BINARY(16)    NOT NULL PRIMARY KEY,
    scope           TEXT          CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    idempotency_key VARCHAR(255)  CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    fingerprint     VARBINARY(32) NOT NULL,
    status          SMALLINT      NOT NULL,
    headers         LONGBLOB      NOT NULL,
    body            LONGBLOB      NOT NULL,
    created_at      DATETIME(6)   NOT NULL,
    expires_at      DATETIME(6)   NOT NULL,
    -- PROCESSING: a lease held, or (never committed) the placeholder of a request in flight.
    state           VARCHAR(10)   CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT 'SUCCESS',
    retryable       BOOLEAN       NOT NULL DEFAULT FALSE,
    fencing_token   BIGINT        NOT NULL DEFAULT 0,
    locked_until    DATETIME(6)   NULL,
    updated_at      DATETIME(6)   NOT NULL,
    body_key_id     SMALLINT      NULL,
    CONSTRAINT idempotency_records_state_check
        CHECK (state IN ('PROCESSING', 'SUCCESS', 'FAILED')),
    KEY idempotency_records_expires_at_idx (expires_at),
    KEY idempotency_records_processing_idx (state, locked_until),
    KEY idempotency_records_failed_idx (state, expires_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- Lease mode's fencing tokens: one counter row that never goes back (MySQL 8 has no
-- sequences), drawn with `value = LAST_INSERT_ID(value + 1)`.
CREATE TABLE IF NOT EXISTS idempotency_counters (
    name  VARCHAR(32) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
    value BIGINT      NOT NULL
) ENGINE = InnoDB;

INSERT INTO idempotency_counters (name, value) VALUES ('fencing', 0)
    ON DUPLICATE KEY UPDATE name = name;

-- Consumed messages. PENDING is the placeholder a consumer's transaction inserts to lock a
-- new message (it replaces PostgreSQL's advisory lock), never committed as it is.
CREATE TABLE IF NOT EXISTS inbox_messages (
    consumer_group VARBINARY(1020) NOT NULL,
    message_id     VARBINARY(1020) NOT NULL,
    status         VARCHAR(10)   CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    attempts       INT           NOT NULL,
    payload_digest VARBINARY(64) NULL,
    payload        LONGBLOB      NULL,
    last_error     MEDIUMTEXT    CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    created_at     DATETIME(6)   NOT NULL,
    updated_at     DATETIME(6)   NOT NULL,
    expires_at     DATETIME(6)   NOT NULL,
    payload_key_id SMALLINT      NULL,
    PRIMARY KEY (consumer_group, message_id),
    CONSTRAINT inbox_messages_status_check CHECK (status IN ('PENDING', 'SUCCESS', 'FAILED')),
    KEY inbox_messages_expires_at_idx (expires_at),
    KEY inbox_messages_failed_idx (consumer_group, status, updated_at, message_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- The transactional outbox.
CREATE TABLE IF NOT EXISTS idempotency_outbox (
    seq             BIGINT        NOT NULL AUTO_INCREMENT PRIMARY KEY,
    message_id      VARBINARY(1020) NOT NULL,
    topic           VARBINARY(1020) NOT NULL,
    ordering_key    VARBINARY(1020) NULL,
    content_type    VARCHAR(255)  CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    payload         LONGBLOB      NOT NULL,
    state           VARCHAR(10)   CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT 'PENDING',
    attempts        INT           NOT NULL DEFAULT 0,
    last_error      MEDIUMTEXT    CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    created_at      DATETIME(6)   NOT NULL,
    next_attempt_at DATETIME(6)   NOT NULL,
    sent_at         DATETIME(6)   NULL,
    CONSTRAINT idempotency_outbox_message_id_key UNIQUE (message_id),
    CONSTRAINT idempotency_outbox_state_check CHECK (state IN ('PENDING', 'SENT', 'FAILED')),
    KEY idempotency_outbox_pending_idx (state, seq),
    KEY idempotency_outbox_pending_key_idx (state, ordering_key, seq),
    KEY idempotency_outbox_settled_idx (state, sent_at, created_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- The outbox's per-ordering-key lock (PostgreSQL: an advisory lock): a producer upserts
-- its key's row before its message's insert, and holds the row lock until it commits.
CREATE TABLE IF NOT EXISTS idempotency_outbox_keys (
    ordering_key VARBINARY(1020) NOT NULL PRIMARY KEY
) ENGINE = InnoDB;
