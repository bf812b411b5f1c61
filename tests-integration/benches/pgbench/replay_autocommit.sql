\set k random(1, 100000)
SELECT status, headers, body, fingerprint FROM idempotency_records WHERE id = md5(:k::text)::uuid;
