#!/usr/bin/env bash
# A PostgreSQL of its own in a network namespace behind a veth pair, for tests/partition.rs:
#   netns.sh up      start it: 10.77.0.2:5432 from the host (the host's side is 10.77.0.1)
#   netns.sh cut     drop every packet in both directions inside the namespace (no RST, no ICMP)
#   netns.sh cut-replies   drop only what the server sends (it still receives and commits)
#   netns.sh heal    accept them again
#   netns.sh down    stop it and remove the namespace
# Needs root, iproute2, iptables and PostgreSQL 15's binaries.
set -euo pipefail

NS=axi-part
HOST_IF=axi-part-h
NS_IF=axi-part-n
HOST_IP=10.77.0.1
NS_IP=10.77.0.2
DATA=/tmp/axum-idempotency-partition
PG_BIN="/usr/lib/postgresql/$(ls /usr/lib/postgresql | sort -V | tail -1)/bin"

in_ns() { ip netns exec "$NS" "$@"; }
as_postgres() { in_ns runuser -u postgres -- "$@"; }

case "${1:-}" in
up)
    "$0" down >/dev/null 2>&1 || true
    ip netns add "$NS"
    ip link add "$HOST_IF" type veth peer name "$NS_IF"
    ip link set "$NS_IF" netns "$NS"
    ip addr add "$HOST_IP/24" dev "$HOST_IF"
    ip link set "$HOST_IF" up
    in_ns ip addr add "$NS_IP/24" dev "$NS_IF"
    in_ns ip link set "$NS_IF" up
    in_ns ip link set lo up
    mkdir -p "$DATA"
    chown postgres:postgres "$DATA"
    as_postgres "$PG_BIN/initdb" -D "$DATA/data" --auth=trust -U postgres >/dev/null
    echo "host all all $HOST_IP/32 trust" >>"$DATA/data/pg_hba.conf"
    # The server notices a vanished client within about 4 s (in the configuration file, so
    # a test can turn it off with ALTER SYSTEM).
    cat >>"$DATA/data/postgresql.conf" <<'CONF'
tcp_keepalives_idle = 2
tcp_keepalives_interval = 1
tcp_keepalives_count = 3
tcp_user_timeout = 4000
CONF
    as_postgres "$PG_BIN/pg_ctl" -D "$DATA/data" -l "$DATA/log" -w -t 30 \
        -o "-c listen_addresses=$NS_IP -c port=5432 -c unix_socket_directories=$DATA \
            -c fsync=off -c max_connections=200" start >/dev/null
    echo "postgres://postgres@$NS_IP:5432/postgres"
    ;;
cut)
    in_ns iptables -A INPUT -j DROP
    in_ns iptables -A OUTPUT -j DROP
    ;;
cut-replies)
    in_ns iptables -A OUTPUT -j DROP
    ;;
heal)
    in_ns iptables -F
    ;;
down)
    if ip netns list | grep -qw "$NS"; then
        in_ns iptables -F || true
        if [ -f "$DATA/data/postmaster.pid" ]; then
            as_postgres "$PG_BIN/pg_ctl" -D "$DATA/data" -m immediate -w stop >/dev/null || true
        fi
        ip netns del "$NS"
    fi
    ip link del "$HOST_IF" 2>/dev/null || true
    rm -rf "$DATA"
    ;;
*)
    echo "usage: $0 up|cut|cut-replies|heal|down" >&2
    exit 2
    ;;
esac
