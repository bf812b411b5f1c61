#!/usr/bin/env bash
# Proves a shape's round trips: runs it under strace (16 clients x 50 transactions) and counts
# the COM_QUERY packets mariadb-slap sends (one per line of the file, a multi-statement line
# included), then runs it again unobserved and prints the server's counters per transaction.
# MariaDB's `Questions` counts statements (each statement of a multi-statement query), not
# packets; the COM_QUERY count is the round-trip count.
# Usage, from the crate root: bash tests-integration/benches/mysql-shapes/verify.sh [shape=s5_commit_in_complete]...
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
REPO=${REPO:-$(cd "$here/../../.." && pwd)}; C=16; N=50
HOST=${MYSQL_HOST:-127.0.0.1}; PORT=${MYSQL_PORT:-3306}; USER=${MYSQL_USER:-root}
DB=mysql_shapes_verify_$$
conn=(-h "$HOST" -P "$PORT" -u "$USER" --protocol=tcp --skip-ssl)
trap 'mariadb "${conn[@]}" -e "DROP DATABASE IF EXISTS $DB" >/dev/null 2>&1 || true; rm -f /tmp/$DB.*' EXIT
mariadb "${conn[@]}" -e "CREATE DATABASE $DB"
cat "$REPO"/migrations/mysql/*.sql | mariadb "${conn[@]}" "$DB"
mariadb "${conn[@]}" "$DB" -e "CREATE TABLE orders (id BIGINT AUTO_INCREMENT PRIMARY KEY, user_id BIGINT NOT NULL, amount BIGINT NOT NULL) ENGINE=InnoDB;
  INSERT INTO idempotency_records (id, scope, fingerprint, status, headers, body, state, created_at, updated_at, expires_at)
  SELECT UNHEX(MD5(seq)), '', X'07', 201, '', '', 'SUCCESS', UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL 1 DAY FROM seq_1_to_10000"
status() {
  mariadb "${conn[@]}" -N -B -e "SHOW GLOBAL STATUS WHERE Variable_name IN ('Questions', 'Com_commit',
    'Com_rollback', 'Handler_commit', 'Com_begin', 'Com_set_option', 'Com_select', 'Com_insert', 'Com_update',
    'Com_savepoint', 'Com_release_savepoint', 'Innodb_row_lock_waits', 'Innodb_deadlocks')" | sort
}
[ $# -gt 0 ] || set -- s5_commit_in_complete
for name in "$@"; do
  f=$here/$name.sql; lines=$(grep -c '' "$f"); tx=$((N * C))
  slap=(mariadb-slap "${conn[@]}" --create-schema="$DB" --concurrency=$C
        --number-of-queries=$((N * lines * C)) --query="$f" --csv=/dev/null)
  strace -f -qq -e trace=sendto -o "/tmp/$DB.trace" "${slap[@]}"
  # A COM_QUERY packet: 3 bytes of length, sequence 0, command byte 3.
  packets=$(grep -cP ' sendto\(\d+, "(\\\d{1,3}|\\[a-z"\\]|[^\\]){3}\\0\\3' "/tmp/$DB.trace" || true)
  echo "$name: $lines lines, $tx transactions, $packets COM_QUERY packets = $(awk -v p="$packets" -v t=$tx 'BEGIN{print p/t}') per transaction"
  # Two snapshots back to back measure the snapshot's own statements, taken off below.
  status >"/tmp/$DB.0"; status >"/tmp/$DB.1"; "${slap[@]}"; status >"/tmp/$DB.2"
  join "/tmp/$DB.0" "/tmp/$DB.1" | join - "/tmp/$DB.2" |
    awk -v t=$tx '{d = ($4 - $3) - ($3 - $2); printf "  %-22s %6d  %.3f per transaction\n", $1, d, d / t}'
done
