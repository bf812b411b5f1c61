-- The archive of purged records (the sweeper's `archive`): the record's columns as they
-- were when it was purged, its response (headers and body) unless the sweeper archives
-- metadata only, and when it was archived. A key used again after its record was purged
-- has a second row: the primary key is the record's id and its creation time, so a batch
-- archived twice never doubles a row.
CREATE TABLE IF NOT EXISTS idempotency_records_archive (
    id              uuid        NOT NULL,
    scope           text        NOT NULL,
    idempotency_key text,
    fingerprint     bytea       NOT NULL,
    status          smallint    NOT NULL,
    headers         bytea,
    body            bytea,
    body_key_id     smallint,
    state           text        NOT NULL,
    retryable       boolean     NOT NULL,
    fencing_token   bigint      NOT NULL,
    created_at      timestamptz NOT NULL,
    updated_at      timestamptz NOT NULL,
    expires_at      timestamptz NOT NULL,
    archived_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (id, created_at)
);

CREATE INDEX IF NOT EXISTS idempotency_records_archive_archived_at_idx
    ON idempotency_records_archive (archived_at);
