SET @id = RANDOM_BYTES(16); INSERT IGNORE INTO three_commit_records (k, status) VALUES (@id, 'PROCESSING')
START TRANSACTION
INSERT INTO orders (user_id, amount) VALUES (1, 2)
COMMIT
UPDATE three_commit_records SET status = 'SUCCESS', response = X'7b226964223a312c22757365725f6964223a312c22616d6f756e74223a327d' WHERE k = @id
