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
