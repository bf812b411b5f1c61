\set k random(1, 9000000000000000000)
INSERT INTO three_commit_records (key, status, fingerprint) VALUES (:k::text, 'PROCESSING', 'fp') ON CONFLICT (key) DO NOTHING;
BEGIN;
INSERT INTO orders (user_id, amount) VALUES (1, 2) RETURNING id;
COMMIT;
UPDATE three_commit_records SET status = 'SUCCESS', response = '\x7b226964223a312c22757365725f6964223a312c22616d6f756e74223a327d' WHERE key = :k::text;
