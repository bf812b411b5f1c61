#!/usr/bin/env bash
# A RabbitMQ node of its own in a network namespace behind a veth pair, for
# tests/broker_partition.rs (the broker on 127.0.0.1:5672 is never touched):
#   rabbit.sh up      start it: amqp://guest:guest@10.78.0.2:5672/%2f from the host
#   rabbit.sh cut     drop every packet in both directions inside the namespace (no RST, no ICMP)
#   rabbit.sh heal    accept them again
#   rabbit.sh ctl ARGS...   rabbitmqctl ARGS on the node (inside the namespace)
#   rabbit.sh down    stop it and remove the namespace
# Needs root, iproute2, iptables and the rabbitmq-server package. Waits are bounded; a
# failed start prints the node's log tail.
set -euo pipefail

NS=axi-rmq
HOST_IF=axi-rmq-h
NS_IF=axi-rmq-n
HOST_IP=10.78.0.1
NS_IP=10.78.0.2
DIR=/tmp/axum-idempotency-broker-partition
RMQ=/usr/lib/rabbitmq/bin
NODE=rabbit-partition@localhost

in_ns() { ip netns exec "$NS" "$@"; }

# The node's environment: nothing read from /etc/rabbitmq; epmd on the namespace's loopback.
node_env() {
    echo env "HOME=$DIR" "PATH=$PATH" \
        "RABBITMQ_NODENAME=$NODE" \
        "RABBITMQ_NODE_IP_ADDRESS=$NS_IP" \
        "RABBITMQ_NODE_PORT=5672" \
        "RABBITMQ_DIST_PORT=25672" \
        "RABBITMQ_MNESIA_BASE=$DIR/mnesia" \
        "RABBITMQ_LOG_BASE=$DIR/log" \
        "RABBITMQ_PID_FILE=$DIR/pid" \
        "RABBITMQ_CONFIG_FILE=$DIR/rabbitmq.conf" \
        "RABBITMQ_CONF_ENV_FILE=$DIR/rabbitmq-env.conf" \
        "RABBITMQ_ENABLED_PLUGINS_FILE=$DIR/enabled_plugins" \
        "RABBITMQ_ENABLED_PLUGINS=" \
        "ERL_EPMD_ADDRESS=127.0.0.1"
}

ctl() {
    in_ns runuser -u rabbitmq -- env "HOME=$DIR" "PATH=$PATH" "ERL_EPMD_ADDRESS=127.0.0.1" \
        "RABBITMQ_CONF_ENV_FILE=$DIR/rabbitmq-env.conf" \
        "RABBITMQ_CONFIG_FILE=$DIR/rabbitmq.conf" \
        "$RMQ/rabbitmqctl" -q -n "$NODE" "$@"
}

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
    mkdir -p "$DIR/mnesia" "$DIR/log"
    # The guest user from another address than loopback; a small heartbeat floor is the
    # client's to ask for (`?heartbeat=N` on its URI).
    printf 'loopback_users = none\nlisteners.tcp.default = %s:5672\n' "$NS_IP" >"$DIR/rabbitmq.conf"
    : >"$DIR/rabbitmq-env.conf"
    echo '[].' >"$DIR/enabled_plugins"
    head -c 20 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$DIR/.erlang.cookie"
    chmod 400 "$DIR/.erlang.cookie"
    chown -R rabbitmq:rabbitmq "$DIR"
    # In a session of its own, in the background: `-detached` would hide start-up errors.
    # shellcheck disable=SC2046
    in_ns setsid runuser -u rabbitmq -- $(node_env) "$RMQ/rabbitmq-server" \
        >>"$DIR/server.log" 2>&1 </dev/null &
    echo "$!" >"$DIR/session"
    deadline=$((SECONDS + 120))
    until ctl await_startup --timeout 5 >/dev/null 2>&1; do
        if [ "$SECONDS" -ge "$deadline" ]; then
            tail -n 40 "$DIR/server.log" >&2 || true
            echo "rabbit.sh: the node did not start in 120 s" >&2
            exit 1
        fi
        sleep 0.5
    done
    echo "amqp://guest:guest@$NS_IP:5672/%2f"
    ;;
cut)
    in_ns iptables -A INPUT -j DROP
    in_ns iptables -A OUTPUT -j DROP
    ;;
heal)
    in_ns iptables -F
    ;;
ctl)
    shift
    ctl "$@"
    ;;
down)
    if ip netns list | grep -qw "$NS"; then
        in_ns iptables -F || true
        # Every process of the node (and its epmd) is in the namespace: end them all.
        for pid in $(ip netns pids "$NS"); do
            kill -9 "$pid" 2>/dev/null || true
        done
        ip netns del "$NS"
    fi
    ip link del "$HOST_IF" 2>/dev/null || true
    rm -rf "$DIR"
    ;;
*)
    echo "usage: $0 up|cut|heal|ctl ARGS...|down" >&2
    exit 2
    ;;
esac
