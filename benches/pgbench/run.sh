#!/usr/bin/env bash
# The database alone: the bare business transaction against the atomic-mode sequence
# (claim pipelined with BEGIN, business insert, record insert pipelined with COMMIT), and
# against the business transaction plus only the record insert. No HTTP, no Rust.
#
#   bash benches/pgbench/run.sh [seconds-per-run]      (default 10; each script runs 3 times)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
SCHEMA="pgbench_idem_$$"
SECONDS_PER_RUN="${1:-10}"
trap 'psql "$URL" -X -q -c "DROP SCHEMA IF EXISTS $SCHEMA CASCADE" >/dev/null 2>&1 || true' EXIT
psql "$URL" -X -q -v ON_ERROR_STOP=1 -c "CREATE SCHEMA $SCHEMA" >/dev/null
PGOPTIONS="-c search_path=$SCHEMA" psql "$URL" -X -q -v ON_ERROR_STOP=1 \
    -c "CREATE TABLE orders (id bigserial PRIMARY KEY, user_id bigint NOT NULL, amount bigint NOT NULL)" \
    -f ../../migrations/0001_idempotency_records.sql -f ../../migrations/0003_lease_state.sql \
    -f ../../migrations/0004_claim_function.sql >/dev/null
tps() {
    PGOPTIONS="-c search_path=$SCHEMA" pgbench "$URL" -n -M extended -c 16 -j 2 \
        -T "$SECONDS_PER_RUN" -f "$1" 2>/dev/null | awk '/^tps/ {print int($3)}'
}
echo "| script | run 1 tps | run 2 tps | run 3 tps |"
echo "|---|---|---|---|"
declare -A results
for round in 1 2 3; do
    for script in bare atomic record_only; do
        results[$script,$round]=$(tps "$script.sql")
    done
done
for script in bare atomic record_only; do
    echo "| $script | ${results[$script,1]} | ${results[$script,2]} | ${results[$script,3]} |"
done
