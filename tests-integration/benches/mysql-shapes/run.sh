#!/usr/bin/env bash
# The MySQL driver's statement shapes in the database alone (MariaDB), against the crate's own
# schema (migrations/mysql/*.sql). Usage, from the crate root:
#   bash tests-integration/benches/mysql-shapes/run.sh [seconds=5] [rounds=3]
# Prints, per round, each shape's transactions per second and its ratio to s0_bare of the same
# round. Each line of an s*.sql file is one text query (one COM_QUERY, one round trip);
# `;` inside a line separates the statements of one multi-statement query.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
REPO=${REPO:-$(cd "$here/../../.." && pwd)}; T=${1:-5}; R=${2:-3}; C=${CONCURRENCY:-16}
HOST=${MYSQL_HOST:-127.0.0.1}; PORT=${MYSQL_PORT:-3306}; USER=${MYSQL_USER:-root}
DB=mysql_shapes_$$
conn=(-h "$HOST" -P "$PORT" -u "$USER" --protocol=tcp --skip-ssl)
sql() { mariadb "${conn[@]}" -N -B "$DB" -e "$1"; }
trap 'mariadb "${conn[@]}" -e "DROP DATABASE IF EXISTS $DB" >/dev/null 2>&1 || true' EXIT
mariadb "${conn[@]}" -e "CREATE DATABASE $DB"
cat "$REPO"/migrations/mysql/*.sql | mariadb "${conn[@]}" "$DB"
sql "CREATE TABLE orders (id BIGINT AUTO_INCREMENT PRIMARY KEY, user_id BIGINT NOT NULL, amount BIGINT NOT NULL) ENGINE=InnoDB; CREATE TABLE three_commit_records (k VARBINARY(255) PRIMARY KEY, status VARCHAR(10) NOT NULL, response BLOB NULL) ENGINE=InnoDB"

# Every run starts from the same tables: no orders, and 10 000 completed records (ids
# UNHEX(MD5(1..10000))) for s9_replay to find.
reset() {
  sql "TRUNCATE orders; TRUNCATE idempotency_records; TRUNCATE three_commit_records;
       INSERT INTO idempotency_records (id, scope, idempotency_key, fingerprint, status, headers, body,
         body_key_id, state, retryable, created_at, updated_at, expires_at)
       SELECT UNHEX(MD5(seq)), '', NULL, X'0707070707070707070707070707070707070707070707070707070707070707', 201,
         X'000c636f6e74656e742d74797065000000106170706c69636174696f6e2f6a736f6e',
         X'7b226964223a312c22757365725f6964223a312c22616d6f756e74223a327d', NULL, 'SUCCESS', FALSE,
         UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL 1 DAY FROM seq_1_to_10000"
}

# run FILE N: N transactions per client (C clients); prints tps. mariadb-slap counts every line
# as a query and stops a client after --number-of-queries / concurrency lines, so the count is a
# whole number of transactions. It also stops reading a multi-statement query's results at its
# first error without saying so: check() verifies what each transaction must have left.
run() {
  local f=$1 n=$2 lines secs
  lines=$(grep -c '' "$f")
  reset
  secs=$(mariadb-slap "${conn[@]}" --create-schema="$DB" --concurrency="$C" \
    --number-of-queries=$((n * lines * C)) --query="$f" --csv=- | awk -F, '{print $3}')
  check "$f" $((n * C))
  awk -v t=$((n * C)) -v s="$secs" 'BEGIN{printf "%d", t / s}'
}
check() {
  local name want got
  name=$(basename "$1" .sql); want=$2
  got=$(sql "SELECT (SELECT COUNT(*) FROM orders), (SELECT COUNT(*) FROM idempotency_records WHERE state = 'SUCCESS' AND status = 201 AND LENGTH(body) = 31) - 10000, (SELECT COUNT(*) FROM idempotency_records WHERE state <> 'SUCCESS')")
  case $name in
    s0*) expect="$want 0 0" ;;
    s12*) return ;; # its record is in three_commit_records
    s13* | s14*) expect="$want $want 0" ;;
    s9*) expect="0 0 0" ;;
    *) expect="$want $want 0" ;;
  esac
  [ "$got" = "$(echo "$expect" | tr ' ' '\t')" ] ||
    echo "WARNING: $name left orders/records/not-SUCCESS = $got, expected $expect" >&2
}

shapes=("$here"/s*.sql)
# Sizing (and warm-up): a short run of each shape, then N per client for about T seconds.
declare -A per_client
for s in "${shapes[@]}"; do
  t=$(run "$s" 40)
  per_client[$s]=$(( (t * T + C - 1) / C ))
done
for r in $(seq "$R"); do
  line="round $r:"; bare=
  for s in "${shapes[@]}"; do
    t=$(run "$s" "${per_client[$s]}"); n=$(basename "$s" .sql); [ -z "$bare" ] && bare=$t
    line="$line $n=$t($(awk -v a="$t" -v b="$bare" 'BEGIN{printf "%.2f", a/b}'))"
  done
  echo "$line"
done
