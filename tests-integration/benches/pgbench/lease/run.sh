#!/usr/bin/env bash
# Lease mode against the three-commit pattern, the database alone (pgbench, prepared, 16
# clients, no HTTP, no Rust). Each script is one request's statements:
#
#   three_commit.sql           the bench's three-commit harness: claim insert, the business
#                              transaction, the SUCCESS update (a text key, no other index)
#   three_commit_expiring.sql  the same with an `expires_at` column and its index, which a
#                              three-commit table needs to be purged
#   lease.sql                  lease mode as shipped: the acquire insert, the business
#                              transaction, the fenced completion update
#   lease_hot.sql              lease mode on a copy of the records table without the
#                              in-flight index, the expiry set at the acquire (lease + TTL)
#                              and kept by the completion: every completion a HOT update
#   lease_registry.sql         as lease_hot, with the in-flight leases kept in a table of
#                              their own (written by the acquire, deleted by the
#                              completion, in the same statements), so stuck leases can
#                              still be found without scanning the records
#   gateway.sql                what idempotency-gateway writes for a new key: the acquire
#                              insert and the fenced completion, nothing between
#
# It prints tps per round and how many of each table's updates were HOT.
#
#   bash tests-integration/benches/pgbench/lease/run.sh [seconds-per-run]   (default 6; 3 rounds)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
SCHEMA="pgbench_lease_$$"
SECONDS_PER_RUN="${1:-6}"
trap 'psql "$URL" -X -q -c "DROP SCHEMA IF EXISTS $SCHEMA CASCADE" >/dev/null 2>&1 || true' EXIT
psql "$URL" -X -q -v ON_ERROR_STOP=1 -c "CREATE SCHEMA $SCHEMA" >/dev/null
migrations=()
for migration in ../../../../migrations/0*.sql; do migrations+=(-f "$migration"); done
PGOPTIONS="-c search_path=$SCHEMA -c client_min_messages=warning" psql "$URL" -X -q -v ON_ERROR_STOP=1 \
    -c "CREATE TABLE orders (id bigserial PRIMARY KEY, user_id bigint NOT NULL, amount bigint NOT NULL)" \
    "${migrations[@]}" \
    -c "CREATE TABLE three_commit_records (key text PRIMARY KEY, status text NOT NULL,
            fingerprint text NOT NULL, response bytea)" \
    -c "CREATE TABLE three_commit_expiring (key text PRIMARY KEY, status text NOT NULL,
            fingerprint text NOT NULL, response bytea,
            expires_at timestamptz NOT NULL DEFAULT now() + interval '1 day')" \
    -c "CREATE INDEX ON three_commit_expiring (expires_at)" \
    -c "CREATE TABLE records_hot (LIKE idempotency_records INCLUDING DEFAULTS) WITH (fillfactor = 80)" \
    -c "ALTER TABLE records_hot ADD PRIMARY KEY (id)" \
    -c "CREATE INDEX ON records_hot (expires_at)" \
    -c "CREATE TABLE records_registry (LIKE idempotency_records INCLUDING DEFAULTS) WITH (fillfactor = 80)" \
    -c "ALTER TABLE records_registry ADD PRIMARY KEY (id)" \
    -c "CREATE INDEX ON records_registry (expires_at)" \
    -c "CREATE TABLE lease_registry (id uuid PRIMARY KEY, fencing_token bigint NOT NULL,
            locked_until timestamptz NOT NULL)" >/dev/null
scripts=(three_commit three_commit_expiring lease lease_hot lease_registry gateway)
header="| round |"
for script in "${scripts[@]}"; do header="$header $script |"; done
echo "$header"
echo "|---|---|---|---|---|---|---|"
for round in 1 2 3; do
    line="| $round |"
    for script in "${scripts[@]}"; do
        tps=$(PGOPTIONS="-c search_path=$SCHEMA" pgbench "$URL" -n -M prepared -c 16 -j 2 \
            -T "$SECONDS_PER_RUN" -f "$script.sql" 2>/dev/null | awk '/^tps/ {print int($3)}')
        line="$line $tps |"
    done
    echo "$line"
done
psql "$URL" -X -q -c "SELECT relname AS table, n_tup_upd AS updates, n_tup_hot_upd AS hot
    FROM pg_stat_user_tables WHERE schemaname = '$SCHEMA' AND n_tup_upd > 0 ORDER BY relname"
