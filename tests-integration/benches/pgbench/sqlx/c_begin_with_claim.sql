\set k random(1, 9000000000000000000)
SELECT 1;
SELECT status, headers, body, fingerprint, expires_at <= now(), state, retryable, ceil(extract(epoch FROM locked_until - now()))::int4, extract(epoch FROM expires_at - now())::float8, body_key_id FROM idempotency_records WHERE id = md5(:k::text)::uuid;
BEGIN \; SELECT * FROM axum_idempotency_claim(md5(:k::text)::uuid, :k);
INSERT INTO orders (user_id, amount) VALUES (1, 2) RETURNING id;
INSERT INTO idempotency_records (id, scope, idempotency_key, fingerprint, status, headers, body, body_key_id, expires_at) VALUES (md5(:k::text)::uuid, '', NULL, '\x0102030405060708091011121314151617181920212223242526272829303132', 201, '\x000c636f6e74656e742d74797065000000106170706c69636174696f6e2f6a736f6e', '{"id":1,"user_id":1,"amount":2}', NULL, now() + make_interval(secs => 86400));
COMMIT;
