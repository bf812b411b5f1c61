-- The troubleshooting console's lists and counts, each backed by an index that holds only
-- the rows it shows (the tables' bulk, SUCCESS records and SENT messages, is not in them).

-- FAILED records (lease mode), counted on the overview.
CREATE INDEX IF NOT EXISTS idempotency_records_failed_idx
    ON idempotency_records (expires_at) WHERE state = 'FAILED';

-- A consumer group's FAILED messages, the most recently failed first, paged.
CREATE INDEX IF NOT EXISTS inbox_messages_failed_idx
    ON inbox_messages (consumer_group, updated_at, message_id) WHERE status = 'FAILED';

-- Parked outbox messages in commit order, paged.
CREATE INDEX IF NOT EXISTS idempotency_outbox_parked_idx
    ON idempotency_outbox (seq) WHERE state = 'FAILED';
