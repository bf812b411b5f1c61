#!/usr/bin/env bash
# The sqlx driver's statement shapes, the database alone: sqlx cannot pipeline, so each
# statement is a round trip, and its pool pings (`SELECT 1` here) at every checkout. The
# shapes that send `BEGIN` with the claim, or the record's insert with `COMMIT`, as one
# multi-statement query need the simple protocol, so every script runs in it (pgbench
# -M simple, 16 clients): compare the ratios, not the rates, with the prepared runs.
#
#   a_bare                 ping; BEGIN; insert; COMMIT                      (sqlx-bare: 4)
#   b_shipped              ping; lookup; BEGIN; claim; insert; record; COMMIT          (7)
#   c_begin_with_claim     as b, `BEGIN; claim` in one query                           (6)
#   d_record_with_commit   as c, `record; COMMIT` in one query too                     (5)
#   e_no_lookup            as d without the autocommit lookup (a replay then costs a
#                          transaction)                                                (4)
#
#   bash tests-integration/benches/pgbench/sqlx/run.sh [seconds-per-run] [rounds]   (default 5 and 3)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
SCHEMA="pgbench_sqlx_$$"
SECONDS_PER_RUN="${1:-5}"
ROUNDS="${2:-3}"
trap 'psql "$URL" -X -q -c "DROP SCHEMA IF EXISTS $SCHEMA CASCADE" >/dev/null 2>&1 || true' EXIT
psql "$URL" -X -q -v ON_ERROR_STOP=1 -c "CREATE SCHEMA $SCHEMA" >/dev/null
migrations=()
for migration in ../../../../migrations/0*.sql; do migrations+=(-f "$migration"); done
PGOPTIONS="-c search_path=$SCHEMA -c client_min_messages=warning" psql "$URL" -X -q -v ON_ERROR_STOP=1 \
    -c "CREATE TABLE orders (id bigserial PRIMARY KEY, user_id bigint NOT NULL, amount bigint NOT NULL)" \
    "${migrations[@]}" >/dev/null
tps() {
    PGOPTIONS="-c search_path=$SCHEMA" pgbench "$URL" -n -M simple -c 16 -j 2 \
        -T "$SECONDS_PER_RUN" -f "$1" 2>/dev/null | awk '/^tps/ {print int($3)}'
}
for round in $(seq "$ROUNDS"); do
    line="round $round:"
    bare=
    for script in ./*.sql; do
        rate=$(tps "$script")
        [ -z "$bare" ] && bare=$rate
        line="$line $(basename "$script" .sql)=$rate ($(awk -v a="$rate" -v b="$bare" 'BEGIN {printf "%.2f", a / b}'))"
    done
    echo "$line"
done
