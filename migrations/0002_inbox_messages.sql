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
    PRIMARY KEY (consumer_group, message_id)
);

CREATE INDEX IF NOT EXISTS inbox_messages_expires_at_idx
    ON inbox_messages (expires_at);
