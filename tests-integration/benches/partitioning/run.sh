#!/usr/bin/env bash
# One table with a uuid key and batched deletes, against the same records partitioned by
# day (the article's suggestion for ~100 million records). Measures insert throughput,
# lookup by id, and the cost of purging one day of records.
#
#   bash tests-integration/benches/partitioning/run.sh [rows-per-day]     (default 1000000; 3 days are loaded)
#
# Needs psql and pgbench, and PostgreSQL at $DATABASE_URL.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
ROWS="${1:-1000000}"
SCHEMA="partitioning_bench_$$"
psql_q() { psql "$URL" -X -q -v ON_ERROR_STOP=1 "$@"; }
trap 'psql_q -c "DROP SCHEMA IF EXISTS $SCHEMA CASCADE" >/dev/null 2>&1 || true' EXIT

psql_q <<SQL
CREATE SCHEMA $SCHEMA;
SET search_path = $SCHEMA;
CREATE TABLE single (
    id uuid PRIMARY KEY, scope text NOT NULL, fingerprint bytea NOT NULL, status smallint NOT NULL,
    body bytea NOT NULL, created_at timestamptz NOT NULL, expires_at timestamptz NOT NULL);
CREATE INDEX ON single (expires_at);
-- Partitioned by day: the primary key must include the partition key, so (id) alone
-- is no longer unique across the table.
CREATE TABLE parted (
    id uuid NOT NULL, scope text NOT NULL, fingerprint bytea NOT NULL, status smallint NOT NULL,
    body bytea NOT NULL, created_at timestamptz NOT NULL, expires_at timestamptz NOT NULL,
    PRIMARY KEY (id, created_at)) PARTITION BY RANGE (created_at);
CREATE TABLE parted_d0 PARTITION OF parted FOR VALUES FROM ('2026-01-01') TO ('2026-01-02');
CREATE TABLE parted_d1 PARTITION OF parted FOR VALUES FROM ('2026-01-02') TO ('2026-01-03');
CREATE TABLE parted_d2 PARTITION OF parted FOR VALUES FROM ('2026-01-03') TO ('2026-01-04');
CREATE TABLE parted_d3 PARTITION OF parted FOR VALUES FROM ('2026-01-04') TO ('2026-01-05');
SQL

for t in single parted; do
  for day in 0 1 2; do
    psql_q -c "INSERT INTO $SCHEMA.$t SELECT gen_random_uuid(), 't' || (g % 1000),
        decode(md5(g::text) || md5((g + 1)::text), 'hex'), 201,
        convert_to('{\"id\":' || g || '}', 'UTF8'),
        timestamptz '2026-01-01' + ($day || ' day')::interval + (g % 86000) * interval '1 second',
        timestamptz '2026-01-04' + ($day || ' day')::interval
      FROM generate_series(1, $ROWS) g"
  done
  psql_q -c "VACUUM ANALYZE $SCHEMA.$t"
done

cat > /tmp/$SCHEMA-insert-single.sql <<SQL
INSERT INTO $SCHEMA.single VALUES (gen_random_uuid(), 't', '\\x00', 201, '\\x00', timestamptz '2026-01-04 12:00', timestamptz '2026-01-07');
SQL
cat > /tmp/$SCHEMA-insert-parted.sql <<SQL
INSERT INTO $SCHEMA.parted VALUES (gen_random_uuid(), 't', '\\x00', 201, '\\x00', timestamptz '2026-01-04 12:00', timestamptz '2026-01-07');
SQL
psql_q -At -c "SELECT id FROM $SCHEMA.single ORDER BY random() LIMIT 1" > /tmp/$SCHEMA-id
ID=$(cat /tmp/$SCHEMA-id)
cat > /tmp/$SCHEMA-lookup-single.sql <<SQL
SELECT status FROM $SCHEMA.single WHERE id = '$ID';
SQL
cat > /tmp/$SCHEMA-lookup-parted.sql <<SQL
SELECT status FROM $SCHEMA.parted WHERE id = '$ID';
SQL

tps() { pgbench "$URL" -n -M prepared -c 16 -j 2 -T 10 -f "$1" 2>/dev/null | awk '/^tps/ {print int($3)}'; }
echo "| | one table, uuid key | partitioned by day |"
echo "|---|---|---|"
echo "| insert tps (16 clients) | $(tps /tmp/$SCHEMA-insert-single.sql) | $(tps /tmp/$SCHEMA-insert-parted.sql) |"
echo "| lookup by id tps (16 clients) | $(tps /tmp/$SCHEMA-lookup-single.sql) | $(tps /tmp/$SCHEMA-lookup-parted.sql) |"

purge_single() {
  local start end
  start=$(date +%s%N)
  while :; do
    n=$(psql_q -At -c "WITH d AS (DELETE FROM $SCHEMA.single WHERE id IN (SELECT id FROM $SCHEMA.single WHERE expires_at <= timestamptz '2026-01-04' LIMIT 5000 FOR UPDATE SKIP LOCKED) RETURNING 1) SELECT count(*) FROM d")
    [ "$n" -lt 5000 ] && break
  done
  end=$(date +%s%N)
  echo "$(( (end - start) / 1000000 )) ms"
}
purge_parted() {
  local start end
  start=$(date +%s%N)
  psql_q -c "ALTER TABLE $SCHEMA.parted DETACH PARTITION $SCHEMA.parted_d0; DROP TABLE $SCHEMA.parted_d0"
  end=$(date +%s%N)
  echo "$(( (end - start) / 1000000 )) ms"
}
echo "| purge one day ($ROWS rows) | $(purge_single) (batched DELETE) | $(purge_parted) (DETACH + DROP) |"
single_size=$(psql_q -At -c "SELECT pg_size_pretty(pg_total_relation_size('$SCHEMA.single'))")
echo "| size after purge (before VACUUM) | $single_size | — |"
rm -f /tmp/$SCHEMA-*
