-- The archive of purged records (the sweeper's `archive`): the record's columns as they
-- were when it was purged, its response unless the sweeper archives metadata only, and
-- when it was archived (UTC). The primary key is the record's id and its creation time:
-- a key used again after its purge has a second row, and a batch archived twice never
-- doubles one.
CREATE TABLE IF NOT EXISTS idempotency_records_archive (
    id              BINARY(16)    NOT NULL,
    scope           TEXT          CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    idempotency_key VARCHAR(255)  CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    fingerprint     VARBINARY(32) NOT NULL,
    status          SMALLINT      NOT NULL,
    headers         LONGBLOB      NULL,
    body            LONGBLOB      NULL,
    body_key_id     SMALLINT      NULL,
    state           VARCHAR(10)   CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    retryable       BOOLEAN       NOT NULL,
    fencing_token   BIGINT        NOT NULL,
    created_at      DATETIME(6)   NOT NULL,
    updated_at      DATETIME(6)   NOT NULL,
    expires_at      DATETIME(6)   NOT NULL,
    archived_at     DATETIME(6)   NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    PRIMARY KEY (id, created_at),
    KEY idempotency_records_archive_archived_at_idx (archived_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
