\set k random(1, 100000)
\startpipeline
BEGIN;
SELECT * FROM axum_idempotency_claim(md5(:k::text)::uuid, :k);
\endpipeline
ROLLBACK;
