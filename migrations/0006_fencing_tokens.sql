-- Lease mode: fencing tokens come from one sequence. A record deleted while its holder
-- still runs (purged long past its expiry) used to be re-created with token 1, the token
-- that holder may still hold; now every new lease gets a token never handed out before,
-- and a takeover still raises the record's token.
CREATE SEQUENCE IF NOT EXISTS idempotency_fencing_tokens;

-- The next token is above every token already in use (1 on an empty table).
SELECT setval('idempotency_fencing_tokens', COALESCE(max(fencing_token), 0) + 1, false)
FROM idempotency_records;
