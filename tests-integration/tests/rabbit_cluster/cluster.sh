#!/usr/bin/env bash
# A three-node RabbitMQ cluster on this machine for tests/rabbit_cluster.rs: each node with
# its own name, AMQP and distribution ports, data and log directories under one directory,
# run as the `rabbitmq` user. The broker on port 5672 is never touched.
#
#   cluster.sh start DIR AMQP1 AMQP2 AMQP3 DIST1 DIST2 DIST3   start three nodes, join 2 and 3
#                                                             to 1; waits until all run
#   cluster.sh ctl DIR N ARGS...                              rabbitmqctl ARGS on node N
#   cluster.sh queues DIR N ARGS...                           rabbitmq-queues ARGS on node N
#   cluster.sh node DIR N                                     node N's name
#   cluster.sh kill DIR N                                     SIGKILL of every process of node N
#   cluster.sh restart DIR N                                  starts node N again; waits until
#                                                             it runs and is back in the cluster
#   cluster.sh stop DIR                                       stops every node, removes DIR
#
# Waits are bounded; a failed wait prints the node's log tail and exits 1.
set -euo pipefail

RMQ="/usr/lib/rabbitmq/bin"

die() {
    echo "cluster.sh: $*" >&2
    exit 1
}

usage() {
    sed -n '5,15s/^#   //p' "${BASH_SOURCE[0]}" >&2
    exit 2
}

[ $# -ge 2 ] || usage
command="$1"
DIR="$2"
shift 2

as_rabbitmq=()
if [ "$(id -u)" -eq 0 ]; then
    as_rabbitmq=(runuser -u rabbitmq --)
elif [ "$(id -un)" != rabbitmq ]; then
    die "run as root or as rabbitmq"
fi

load() {
    [ -f "$DIR/ports" ] || die "no cluster in $DIR (run start first)"
    # shellcheck disable=SC1091
    . "$DIR/ports"
}

node_name() {
    echo "rabbit-$TAG-$1@localhost"
}

# The environment of node N: nothing read from /etc/rabbitmq (its config binds port 5672).
node_env() {
    local n="$1" amqp dist
    eval "amqp=\$AMQP$n dist=\$DIST$n"
    echo env "HOME=$DIR" "PATH=$PATH" \
        "RABBITMQ_NODENAME=$(node_name "$n")" \
        "RABBITMQ_NODE_IP_ADDRESS=127.0.0.1" \
        "RABBITMQ_NODE_PORT=$amqp" \
        "RABBITMQ_DIST_PORT=$dist" \
        "RABBITMQ_MNESIA_BASE=$DIR/n$n/mnesia" \
        "RABBITMQ_LOG_BASE=$DIR/n$n/log" \
        "RABBITMQ_PID_FILE=$DIR/n$n/pid" \
        "RABBITMQ_CONFIG_FILE=$DIR/n$n/rabbitmq.conf" \
        "RABBITMQ_CONF_ENV_FILE=$DIR/n$n/rabbitmq-env.conf" \
        "RABBITMQ_ENABLED_PLUGINS_FILE=$DIR/n$n/enabled_plugins" \
        "RABBITMQ_ENABLED_PLUGINS=" \
        "ERL_EPMD_ADDRESS=127.0.0.1"
}

# The CLI tools' environment: the nodes' cookie, and no node ports (a CLI tool takes a
# distribution port of its own in 35672-35682).
cli() {
    local tool="$1" n="$2"
    shift 2
    "${as_rabbitmq[@]}" env "HOME=$DIR" "PATH=$PATH" "ERL_EPMD_ADDRESS=127.0.0.1" \
        "RABBITMQ_CONF_ENV_FILE=$DIR/n$n/rabbitmq-env.conf" \
        "RABBITMQ_CONFIG_FILE=$DIR/n$n/rabbitmq.conf" \
        "$RMQ/$tool" -q -n "$(node_name "$n")" "$@"
}

ctl() {
    cli rabbitmqctl "$@"
}

queues() {
    cli rabbitmq-queues "$@"
}

# Runs node N's server in a session of its own (so that kill and stop reach every process
# of it), in the background: `-detached` would hide start-up errors.
spawn() {
    local n="$1"
    # shellcheck disable=SC2046
    setsid "${as_rabbitmq[@]}" $(node_env "$n") "$RMQ/rabbitmq-server" \
        >>"$DIR/n$n/server.log" 2>&1 </dev/null &
    echo "$!" >"$DIR/n$n/session"
}

wait_running() {
    local n="$1" seconds="${2:-90}"
    local deadline=$((SECONDS + seconds))
    until ctl "$n" await_startup --timeout 5 >/dev/null 2>&1; do
        if [ "$SECONDS" -ge "$deadline" ]; then
            tail -n 40 "$DIR/n$n/server.log" >&2 || true
            die "node $n did not start in ${seconds}s"
        fi
        sleep 0.5
    done
}

port_free() {
    ! (exec 3<>"/dev/tcp/127.0.0.1/$1") >/dev/null 2>&1
}

start() {
    [ $# -eq 6 ] || usage
    local port n
    for port in "$@"; do
        [ "$port" != 5672 ] && [ "$port" != 25672 ] || die "port $port belongs to the shared broker"
        { [ "$port" -lt 35672 ] || [ "$port" -gt 35682 ]; } || die "port $port is the CLI tools'"
        port_free "$port" || die "port $port is in use"
    done
    [ -x "$RMQ/rabbitmq-server" ] || die "rabbitmq-server not found: apt-get install rabbitmq-server"
    mkdir -p "$DIR"
    cat >"$DIR/ports" <<PORTS
TAG=$(basename "$DIR" | tr -c 'a-zA-Z0-9\n' x)
AMQP1=$1
AMQP2=$2
AMQP3=$3
DIST1=$4
DIST2=$5
DIST3=$6
PORTS
    load
    # One Erlang cookie for the three nodes and their rabbitmqctl.
    head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$DIR/.erlang.cookie"
    for n in 1 2 3; do
        mkdir -p "$DIR/n$n/mnesia" "$DIR/n$n/log"
        cat >"$DIR/n$n/rabbitmq.conf" <<CONF
loopback_users = none
log.file.level = info
log.console = false
CONF
        : >"$DIR/n$n/rabbitmq-env.conf"
        echo "[]." >"$DIR/n$n/enabled_plugins"
    done
    if [ "$(id -u)" -eq 0 ]; then
        chown -R rabbitmq:rabbitmq "$DIR"
    fi
    chmod 400 "$DIR/.erlang.cookie"
    for n in 1 2 3; do
        spawn "$n"
    done
    for n in 1 2 3; do
        wait_running "$n"
    done
    for n in 2 3; do
        ctl "$n" stop_app >/dev/null
        ctl "$n" join_cluster "$(node_name 1)" >/dev/null
        ctl "$n" start_app >/dev/null
    done
    for n in 1 2 3; do
        wait_running "$n"
    done
    # Every node sees the other two running, so that a quorum queue declared now gets a
    # member on each.
    local deadline=$((SECONDS + 60))
    for n in 1 2 3; do
        until [ "$(ctl "$n" eval 'length(rabbit_nodes:all_running()).' 2>/dev/null)" = 3 ]; do
            [ "$SECONDS" -lt "$deadline" ] || die "node $n does not see three running nodes"
            sleep 0.3
        done
    done
}

kill_node() {
    local n="$1" session pid
    session="$(cat "$DIR/n$n/session")"
    for pid in $(pgrep -s "$session" || true); do
        kill -KILL "$pid" 2>/dev/null || true
    done
    local deadline=$((SECONDS + 10))
    while pgrep -s "$session" >/dev/null 2>&1; do
        [ "$SECONDS" -lt "$deadline" ] || die "processes of node $n still run"
        sleep 0.1
    done
}

stop() {
    local n session
    [ -f "$DIR/ports" ] || return 0
    load
    for n in 1 2 3; do
        [ -f "$DIR/n$n/session" ] || continue
        session="$(cat "$DIR/n$n/session")"
        pkill -KILL -s "$session" 2>/dev/null || true
    done
    case "$DIR" in
        /tmp/*) rm -rf "$DIR" ;;
        *) echo "cluster.sh: left $DIR in place (not under /tmp)" >&2 ;;
    esac
}

case "$command" in
    start) start "$@" ;;
    ctl) load; ctl "$@" ;;
    queues) load; queues "$@" ;;
    node) load; node_name "$1" ;;
    kill) load; kill_node "$1" ;;
    restart)
        load
        spawn "$1"
        wait_running "$1" 120
        ;;
    stop) stop ;;
    *) usage ;;
esac
