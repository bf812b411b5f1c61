-- Encryption at rest (feature `encryption`): the id of the key a stored response body or
-- inbox payload is sealed under. NULL means the value is plaintext — every row written
-- before this migration, and every row written without encryption configured — so turning
-- encryption on later never makes an old row unreadable.
ALTER TABLE idempotency_records ADD COLUMN IF NOT EXISTS body_key_id smallint;
ALTER TABLE inbox_messages ADD COLUMN IF NOT EXISTS payload_key_id smallint;

-- The claim of 0004, also returning `body_key_id` (last, so the other columns keep their
-- positions). A new function rather than a changed one: a function's result type cannot be
-- changed in place, and instances still running the previous version keep calling
-- `axum_idempotency_claim` (with statements prepared against its result type) during a
-- rolling upgrade. That one stays until a later migration removes it.
CREATE OR REPLACE FUNCTION axum_idempotency_claim_v2(p_id uuid, p_lock bigint)
RETURNS TABLE (
    status      smallint,
    headers     bytea,
    body        bytea,
    fingerprint bytea,
    expired     boolean,
    state       text,
    retryable   boolean,
    lease_left  integer,
    expires_in  double precision,
    locked      boolean,
    found       boolean,
    body_key_id smallint
)
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    RETURN QUERY
        SELECT r.status, r.headers, r.body, r.fingerprint, false, r.state, r.retryable,
               NULL::integer, extract(epoch FROM r.expires_at - now())::float8, false, true,
               r.body_key_id
        FROM idempotency_records r
        WHERE r.id = p_id AND r.expires_at > now()
          AND (r.state = 'SUCCESS' OR (r.state = 'FAILED' AND NOT r.retryable));
    IF FOUND THEN
        RETURN;
    END IF;
    IF NOT pg_try_advisory_xact_lock(p_lock) THEN
        RETURN QUERY SELECT NULL::smallint, NULL::bytea, NULL::bytea, NULL::bytea, NULL::boolean,
                            NULL::text, NULL::boolean, NULL::integer, NULL::float8, false, false,
                            NULL::smallint;
        RETURN;
    END IF;
    RETURN QUERY
        SELECT r.status, r.headers, r.body, r.fingerprint, r.expires_at <= now(), r.state,
               r.retryable, ceil(extract(epoch FROM r.locked_until - now()))::int4,
               extract(epoch FROM r.expires_at - now())::float8, true, true, r.body_key_id
        FROM idempotency_records r
        WHERE r.id = p_id;
    IF NOT FOUND THEN
        RETURN QUERY SELECT NULL::smallint, NULL::bytea, NULL::bytea, NULL::bytea, NULL::boolean,
                            NULL::text, NULL::boolean, NULL::integer, NULL::float8, true, false,
                            NULL::smallint;
    END IF;
END
$$;
