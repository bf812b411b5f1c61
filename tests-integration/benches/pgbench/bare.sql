BEGIN;
INSERT INTO orders (user_id, amount) VALUES (1, 2) RETURNING id;
COMMIT;
