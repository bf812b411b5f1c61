-- Lease mode: a record can be committed PROCESSING before the handler runs, holding a lease
-- until `locked_until` under a fencing token, and is finished as SUCCESS or FAILED.
-- Atomic-mode records are SUCCESS rows written with the handler's own transaction.
ALTER TABLE idempotency_records
    -- PROCESSING (lease held), SUCCESS (response stored and replayed), FAILED (lease mode:
    -- replayed unless retryable, in which case the next retry runs again).
    ADD COLUMN IF NOT EXISTS state text NOT NULL DEFAULT 'SUCCESS'
        CONSTRAINT idempotency_records_state_check
        CHECK (state IN ('PROCESSING', 'SUCCESS', 'FAILED')),
    ADD COLUMN IF NOT EXISTS retryable boolean NOT NULL DEFAULT false,
    -- Incremented by every takeover; a completion must present the current one.
    ADD COLUMN IF NOT EXISTS fencing_token bigint NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS locked_until timestamptz,
    ADD COLUMN IF NOT EXISTS updated_at timestamptz NOT NULL DEFAULT now();

-- The sweeper's scan for leases that outlived their holder.
CREATE INDEX IF NOT EXISTS idempotency_records_processing_idx
    ON idempotency_records (locked_until) WHERE state = 'PROCESSING';
