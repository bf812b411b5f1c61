-- The schema of axum-idempotency 0.1: every table, index and function the crate's
-- statements use. `migrate` runs it once per schema (recorded in
-- `axum_idempotency_migrations`); later versions add files, never change this one.

-- Completed HTTP requests and lease-mode leases, keyed by (scope, Idempotency-Key).
-- In atomic mode a SUCCESS row is written in the same transaction as the handler's own
-- rows, so it exists exactly when the handler's work committed (or, for a stored 4xx, when
-- its answer was recorded). In lease mode a row is committed PROCESSING before the handler
-- runs, holding a lease until `locked_until` under a fencing token, and is finished as
-- SUCCESS or FAILED.
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
    expires_at      timestamptz NOT NULL,
    -- PROCESSING (lease held), SUCCESS (response stored and replayed), FAILED (lease mode:
    -- replayed unless retryable, in which case the next retry runs again).
    state           text        NOT NULL DEFAULT 'SUCCESS'
                                CONSTRAINT idempotency_records_state_check
                                CHECK (state IN ('PROCESSING', 'SUCCESS', 'FAILED')),
    retryable       boolean     NOT NULL DEFAULT false,
    -- Drawn from `idempotency_fencing_tokens` by every new lease and every takeover; a
    -- completion must present the current one.
    fencing_token   bigint      NOT NULL DEFAULT 0,
    locked_until    timestamptz,
    updated_at      timestamptz NOT NULL DEFAULT now(),
    -- Encryption at rest (feature `encryption`): the id of the key the body is sealed
    -- under; NULL for a plaintext body, so turning encryption on never makes an existing
    -- row unreadable.
    body_key_id     smallint
);

-- The sweeper's purge.
CREATE INDEX IF NOT EXISTS idempotency_records_expires_at_idx
    ON idempotency_records (expires_at);
-- Leases that outlived their holder: the sweeper, the stale gauges, `Admin` and the console.
CREATE INDEX IF NOT EXISTS idempotency_records_processing_idx
    ON idempotency_records (locked_until) WHERE state = 'PROCESSING';
-- FAILED records (lease mode), counted on the console's overview.
CREATE INDEX IF NOT EXISTS idempotency_records_failed_idx
    ON idempotency_records (expires_at) WHERE state = 'FAILED';

-- Lease mode's fencing tokens: a token is never handed out twice, even to a record
-- re-created after its predecessor was purged while its holder still ran.
CREATE SEQUENCE IF NOT EXISTS idempotency_fencing_tokens;

-- The claim of atomic mode in one statement, for a driver that cannot pipeline (sqlx; it is
-- called right after BEGIN): a completed record is answered from at once, without the
-- lock, since it never changes; otherwise the key's transaction-scoped advisory lock is
-- tried and, if taken, the record is read again. In READ COMMITTED every statement of a
-- VOLATILE function takes a fresh snapshot, so that second read sees whatever the previous
-- holder committed. Always returns exactly one row: the plain lookup's columns, then
-- `locked` (the lock is held), `found` (a record was read) and `body_key_id`.
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

-- Consumed messages, keyed by (consumer_group, message_id).
-- A SUCCESS row is written in the same transaction as the consumer's own work, so it exists
-- exactly when that work committed. A FAILED row is written after a rollback, in a short
-- transaction of its own, so poison messages stay visible with their attempt count.
-- In-flight processing needs no row: it is the open transaction holding the message's
-- advisory lock.
CREATE TABLE IF NOT EXISTS inbox_messages (
    consumer_group text        NOT NULL,
    message_id     text        NOT NULL,
    status         text        NOT NULL CHECK (status IN ('SUCCESS', 'FAILED')),
    attempts       integer     NOT NULL,
    -- SHA-256 of the payload, when the consumer passed one.
    payload_digest bytea,
    -- The payload itself, only when the inbox is configured to keep it.
    payload        bytea,
    last_error     text,
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    expires_at     timestamptz NOT NULL,
    -- Encryption at rest: the key the payload is sealed under; NULL for plaintext.
    payload_key_id smallint,
    PRIMARY KEY (consumer_group, message_id)
);

-- The sweeper's purge.
CREATE INDEX IF NOT EXISTS inbox_messages_expires_at_idx
    ON inbox_messages (expires_at);
-- A consumer group's FAILED messages, the most recently failed first, paged (the console).
CREATE INDEX IF NOT EXISTS inbox_messages_failed_idx
    ON inbox_messages (consumer_group, updated_at, message_id) WHERE status = 'FAILED';

-- The transactional outbox: messages enqueued in the same transaction as the business rows
-- (and, in a handler, the idempotency record), so they exist exactly when that work
-- committed. A relay publishes PENDING rows and marks them SENT after the broker's confirm;
-- a row the broker keeps refusing is parked as FAILED after its attempts.
CREATE TABLE IF NOT EXISTS idempotency_outbox (
    -- Commit order within an ordering key: producers of one key take the key's
    -- transaction-scoped advisory lock before their row draws its number.
    seq             bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- Stable across republishing: the AMQP message_id the consumer's Inbox deduplicates on.
    message_id      text        NOT NULL UNIQUE,
    topic           text        NOT NULL,
    ordering_key    text,
    content_type    text,
    payload         bytea       NOT NULL,
    state           text        NOT NULL DEFAULT 'PENDING'
                                CHECK (state IN ('PENDING', 'SENT', 'FAILED')),
    attempts        integer     NOT NULL DEFAULT 0,
    last_error      text,
    -- The insert's wall-clock time (close to its COMMIT), for the relay's lag.
    created_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    next_attempt_at timestamptz NOT NULL DEFAULT '-infinity',
    sent_at         timestamptz
);

-- The relay's batch scan and the ordering barrier read only pending rows.
CREATE INDEX IF NOT EXISTS idempotency_outbox_pending_idx
    ON idempotency_outbox (seq) WHERE state = 'PENDING';
CREATE INDEX IF NOT EXISTS idempotency_outbox_pending_key_idx
    ON idempotency_outbox (ordering_key, seq)
    WHERE state = 'PENDING' AND ordering_key IS NOT NULL;
-- The sweeper's retention scans.
CREATE INDEX IF NOT EXISTS idempotency_outbox_settled_idx
    ON idempotency_outbox (coalesce(sent_at, created_at)) WHERE state <> 'PENDING';
-- Parked messages in commit order, paged (the console).
CREATE INDEX IF NOT EXISTS idempotency_outbox_parked_idx
    ON idempotency_outbox (seq) WHERE state = 'FAILED';

-- Wakes listening relays once per inserting statement; the payload is the schema, so
-- relays of other schemas in the same database may ignore it. A relay that is not
-- listening (behind a transaction-pooling PgBouncer) polls instead.
CREATE OR REPLACE FUNCTION idempotency_outbox_notify() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('idempotency_outbox', TG_TABLE_SCHEMA);
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS idempotency_outbox_notify ON idempotency_outbox;
CREATE TRIGGER idempotency_outbox_notify
    AFTER INSERT ON idempotency_outbox
    FOR EACH STATEMENT EXECUTE FUNCTION idempotency_outbox_notify();
