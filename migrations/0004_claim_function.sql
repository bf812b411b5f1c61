-- The claim of atomic mode in one statement (called right after BEGIN, in the same round
-- trip): a completed record is answered from at once, without the lock, since it never
-- changes; otherwise the key's transaction-scoped advisory lock is tried and, if taken,
-- the record is read again. In READ COMMITTED every statement of a VOLATILE function takes
-- a fresh snapshot, so that second read sees whatever the previous holder committed.
-- Always returns exactly one row; its columns are those of the plain lookup, then `locked`
-- (the lock is held) and `found` (a record was read).
CREATE OR REPLACE FUNCTION axum_idempotency_claim(p_id uuid, p_lock bigint)
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
    found       boolean
)
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    RETURN QUERY
        SELECT r.status, r.headers, r.body, r.fingerprint, false, r.state, r.retryable,
               NULL::integer, extract(epoch FROM r.expires_at - now())::float8, false, true
        FROM idempotency_records r
        WHERE r.id = p_id AND r.expires_at > now()
          AND (r.state = 'SUCCESS' OR (r.state = 'FAILED' AND NOT r.retryable));
    IF FOUND THEN
        RETURN;
    END IF;
    IF NOT pg_try_advisory_xact_lock(p_lock) THEN
        RETURN QUERY SELECT NULL::smallint, NULL::bytea, NULL::bytea, NULL::bytea, NULL::boolean,
                            NULL::text, NULL::boolean, NULL::integer, NULL::float8, false, false;
        RETURN;
    END IF;
    RETURN QUERY
        SELECT r.status, r.headers, r.body, r.fingerprint, r.expires_at <= now(), r.state,
               r.retryable, ceil(extract(epoch FROM r.locked_until - now()))::int4,
               extract(epoch FROM r.expires_at - now())::float8, true, true
        FROM idempotency_records r
        WHERE r.id = p_id;
    IF NOT FOUND THEN
        RETURN QUERY SELECT NULL::smallint, NULL::bytea, NULL::bytea, NULL::bytea, NULL::boolean,
                            NULL::text, NULL::boolean, NULL::integer, NULL::float8, true, false;
    END IF;
END
$$;
