-- The archive of purged records (the sweeper's `archive`): the record's columns as they
-- were when it was purged, its response unless the sweeper archives metadata only, and
-- when it was archived. The primary key is the record's id and its creation time: a key
-- used again after its purge has a second row, and a batch archived twice never doubles one.
CREATE TABLE IF NOT EXISTS idempotency_records_archive (
    id              BLOB    NOT NULL CHECK (length(id) = 16),
    scope           TEXT    NOT NULL,
    idempotency_key TEXT,
    fingerprint     BLOB    NOT NULL,
    status          INTEGER NOT NULL,
    headers         BLOB,
    body            BLOB,
    body_key_id     INTEGER,
    state           TEXT    NOT NULL,
    retryable       INTEGER NOT NULL,
    fencing_token   INTEGER NOT NULL,
    created_at      REAL    NOT NULL,
    updated_at      REAL    NOT NULL,
    expires_at      REAL    NOT NULL,
    archived_at     REAL    NOT NULL DEFAULT (unixepoch('subsec')),
    PRIMARY KEY (id, created_at)
);

CREATE INDEX IF NOT EXISTS idempotency_records_archive_archived_at_idx
    ON idempotency_records_archive (archived_at);
