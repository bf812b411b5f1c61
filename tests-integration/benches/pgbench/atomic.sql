\set k random(1, 9000000000000000000)
\startpipeline
BEGIN;
SELECT * FROM axum_idempotency_claim(md5(:k::text)::uuid, :k);
\endpipeline
INSERT INTO orders (user_id, amount) VALUES (1, 2) RETURNING id;
\startpipeline
INSERT INTO idempotency_records (id, scope, idempotency_key, fingerprint, status, headers, body, expires_at) VALUES (md5(:k::text)::uuid, '', NULL, '\x0102030405060708091011121314151617181920212223242526272829303132', 201, '\x000c636f6e74656e742d74797065000000106170706c69636174696f6e2f6a736f6e', '{"id":1,"user_id":1,"amount":2}', now() + make_interval(secs => 86400));
COMMIT;
\endpipeline
