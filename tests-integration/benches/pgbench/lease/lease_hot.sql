\set k random(1, 9000000000000000000)
INSERT INTO records_hot AS r (id, scope, idempotency_key, fingerprint, state, fencing_token, locked_until, status, headers, body, expires_at) VALUES (md5(:k::text)::uuid, '', NULL, '\x0707070707070707070707070707070707070707070707070707070707070707', 'PROCESSING', nextval('idempotency_fencing_tokens'), now() + make_interval(secs => 30), 0, '', '', now() + make_interval(secs => 86430)) ON CONFLICT (id) DO NOTHING RETURNING fencing_token, xmax <> '0'::xid;
BEGIN;
INSERT INTO orders (user_id, amount) VALUES (1, 2) RETURNING id;
COMMIT;
UPDATE records_hot SET state = 'SUCCESS', retryable = false, status = 201, headers = '\x000c636f6e74656e742d74797065000000106170706c69636174696f6e2f6a736f6e', body = '{"id":1,"user_id":1,"amount":2}', body_key_id = NULL, locked_until = NULL, updated_at = now(), expires_at = GREATEST(expires_at, now() + make_interval(secs => 86400)) WHERE id = md5(:k::text)::uuid AND state = 'PROCESSING';
