#!/usr/bin/env bash
# An outside API fuzzer against the orders example: schemathesis reads the example's served
# `/openapi.json` and sends requests generated from it (valid and invalid ones, then
# sequences following the responses), failing on any 5xx, any response that contradicts the
# document (status, content type, headers, body schema) and any valid request refused.
# The example runs on a free port against a schema of its own on DATABASE_URL's server.
#
# Usage: .ci/schemathesis.sh SCHEMATHESIS [MAX_EXAMPLES]   (default 300 per operation)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

schemathesis="$(realpath "$1")"
max_examples="${2:-300}"
database_url="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
schema="ci_schemathesis_$$"
example="target/debug/examples/orders"
# Up to date (built by cargo test already, in CI).
cargo build --all-features --example orders
scratch="$(mktemp -d)"
log="$scratch/example.log"

psql -X -q -d "$database_url" -c "CREATE SCHEMA $schema"
pid=""
cleanup() {
    if [ -n "$pid" ]; then
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    fi
    psql -X -q -d "$database_url" -c "DROP SCHEMA IF EXISTS $schema CASCADE" \
        >/dev/null 2>&1 || true
    rm -rf "$scratch"
}
trap cleanup EXIT

# No AMQP_URL: paid orders' messages wait in the outbox (no relay needed here).
env -u AMQP_URL BIND_ADDR=127.0.0.1:0 \
    DATABASE_URL="$database_url?options=-c%20search_path%3D$schema" \
    "$example" >"$log" 2>&1 &
pid=$!
addr=""
for _ in $(seq 1 300); do
    addr="$(sed -n 's/.*listening on http:\/\///p' "$log")"
    [ -n "$addr" ] && break
    kill -0 "$pid" 2>/dev/null || { cat "$log" >&2; exit 1; }
    sleep 0.1
done
[ -n "$addr" ] || { echo "the orders example did not start in 30 s" >&2; cat "$log" >&2; exit 1; }

# From the scratch directory: schemathesis keeps a cache of crashes in its working directory.
config="$PWD/.ci/schemathesis.toml"
cd "$scratch"
"$schemathesis" --no-color --config-file "$config" run "http://$addr/openapi.json" \
    --checks all --max-examples "$max_examples" --seed 1 --workers 2 \
    --generation-database none
