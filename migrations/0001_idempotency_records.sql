-- Completed HTTP requests, keyed by (scope, Idempotency-Key).
-- A row is written in the same transaction as the handler's own rows, so it exists exactly
-- when the handler's work committed (or, for a stored 4xx, when its answer was recorded).
CREATE TABLE IF NOT EXISTS idempotency_records (
    -- First 16 bytes of SHA-256 over (scope, key).
    id              uuid        PRIMARY KEY,
    scope           text        NOT NULL,
    -- The raw key, only when the layer is configured to keep it.
    idempotency_key text,
    -- SHA-256 over method, path and query, chosen headers and (canonical) body.
    fingerprint     bytea       NOT NULL,
    status          smallint    NOT NULL,
    -- Kept response headers, length-prefixed name/value pairs.
    headers         bytea       NOT NULL,
    body            bytea       NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    expires_at      timestamptz NOT NULL
);

CREATE INDEX IF NOT EXISTS idempotency_records_expires_at_idx
    ON idempotency_records (expires_at);
