\set k random(1, 100000)
\startpipeline
BEGIN;
SELECT r.status, r.headers, r.body, r.fingerprint, r.expires_at <= now(), r.state, r.retryable, ceil(extract(epoch FROM r.locked_until - now()))::int4, extract(epoch FROM r.expires_at - now())::float8, CASE WHEN r.expires_at > now() AND (r.state = 'SUCCESS' OR (r.state = 'FAILED' AND NOT r.retryable)) THEN false ELSE pg_try_advisory_xact_lock(:k) END AS locked, r.id IS NOT NULL AS found, r.body_key_id FROM (VALUES (1)) AS one (x) LEFT JOIN idempotency_records r ON r.id = md5(:k::text)::uuid;
\endpipeline
ROLLBACK;
