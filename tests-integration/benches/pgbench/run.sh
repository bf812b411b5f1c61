#!/usr/bin/env bash
# The database alone: the bare business transaction against the atomic-mode sequence
# (the claim function pipelined with BEGIN, business insert, record insert pipelined with
# COMMIT; prepared statements, as the crate uses them), and
# against the business transaction plus only the record insert; and a replay (`BEGIN` and
# the claim of a completed record, then `ROLLBACK`) against the same lookup as one
# autocommit statement. No HTTP, no Rust.
#
#   bash tests-integration/benches/pgbench/run.sh [seconds-per-run]      (default 10; each script runs 3 times)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
SCHEMA="pgbench_idem_$$"
SECONDS_PER_RUN="${1:-10}"
trap 'psql "$URL" -X -q -c "DROP SCHEMA IF EXISTS $SCHEMA CASCADE" >/dev/null 2>&1 || true' EXIT
psql "$URL" -X -q -v ON_ERROR_STOP=1 -c "CREATE SCHEMA $SCHEMA" >/dev/null
PGOPTIONS="-c search_path=$SCHEMA" psql "$URL" -X -q -v ON_ERROR_STOP=1 \
    -c "CREATE TABLE orders (id bigserial PRIMARY KEY, user_id bigint NOT NULL, amount bigint NOT NULL)" \
    -f ../../../migrations/0001_schema.sql >/dev/null
# Completed records for the replay scripts: ids md5(1) … md5(100000).
PGOPTIONS="-c search_path=$SCHEMA" psql "$URL" -X -q -v ON_ERROR_STOP=1 -c "
    INSERT INTO idempotency_records (id, scope, fingerprint, status, headers, body, expires_at)
    SELECT md5(g::text)::uuid, '', '\\x01', 201, '\\x', convert_to('{\"id\":' || g || '}', 'UTF8'),
           now() + interval '1 day'
    FROM generate_series(1, 100000) AS g" -c "VACUUM ANALYZE idempotency_records" >/dev/null
tps() {
    PGOPTIONS="-c search_path=$SCHEMA" pgbench "$URL" -n -M prepared -c 16 -j 2 \
        -T "$SECONDS_PER_RUN" -f "$1" 2>/dev/null | awk '/^tps/ {print int($3)}'
}
echo "| script | run 1 tps | run 2 tps | run 3 tps |"
echo "|---|---|---|---|"
declare -A results
for round in 1 2 3; do
    for script in bare atomic record_only replay replay_autocommit; do
        results[$script,$round]=$(tps "$script.sql")
    done
done
for script in bare atomic record_only replay replay_autocommit; do
    echo "| $script | ${results[$script,1]} | ${results[$script,2]} | ${results[$script,3]} |"
done
