-- HTTP requests, keyed by (scope, Idempotency-Key).
-- Atomic mode writes a SUCCESS row in the same transaction as the handler's own rows, so it
-- exists exactly when the handler's work committed (or, for a stored 4xx, when its answer
-- was recorded). Lease mode commits a PROCESSING row first, holding a lease until
-- `locked_until` under a fencing token, and finishes it as SUCCESS or FAILED.
CREATE TABLE IF NOT EXISTS idempotency_records (
    -- First 16 bytes of SHA-256 over (scope, key).
    id              uuid        PRIMARY KEY,
    scope           text        NOT NULL,
    -- The raw key, only when the layer is configured to keep it.
    idempotency_key text,
    -- SHA-256 over method, path and query, chosen headers and (canonical) body.
    fingerprint     bytea       NOT NULL,
    -- PROCESSING (lease held), SUCCESS (response stored and replayed), FAILED (lease mode:
    -- replayed unless retryable, in which case the next retry runs again).
    state           text        NOT NULL DEFAULT 'SUCCESS'
                                CHECK (state IN ('PROCESSING', 'SUCCESS', 'FAILED')),
    retryable       boolean     NOT NULL DEFAULT false,
    -- Lease mode: incremented by every takeover; a completion must present the current one.
    fencing_token   bigint      NOT NULL DEFAULT 0,
    locked_until    timestamptz,
    status          smallint    NOT NULL,
    -- Kept response headers, length-prefixed name/value pairs.
    headers         bytea       NOT NULL,
    body            bytea       NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    expires_at      timestamptz NOT NULL
);

CREATE INDEX IF NOT EXISTS idempotency_records_expires_at_idx
    ON idempotency_records (expires_at);

-- The sweeper's scan for leases that outlived their holder.
CREATE INDEX IF NOT EXISTS idempotency_records_processing_idx
    ON idempotency_records (locked_until) WHERE state = 'PROCESSING';
