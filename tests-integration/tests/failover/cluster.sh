#!/usr/bin/env bash
# A pg_auto_failover formation on this machine for tests/failover.rs: a monitor, a primary
# and a standby, each with its own data directory and port under one directory, run as the
# `postgres` user (pg_autoctl refuses to run as root). Nothing here touches another cluster.
#
#   cluster.sh start DIR MONITOR_PORT PORT1 PORT2   create and run the three nodes; waits
#                                                   until node1 is primary, node2 secondary
#   cluster.sh state DIR                            `pg_autoctl show state`
#   cluster.sh primary DIR                          the name of the node the monitor calls primary
#   cluster.sh sync DIR                             synchronous_standby_names on the primary
#   cluster.sh set-async DIR                        both nodes leave the replication quorum:
#                                                   a primary never waits for its standby
#   cluster.sh pause-standby DIR                    SIGSTOP of the standby's WAL receiver: it
#                                                   falls behind; resume-standby DIR: SIGCONT,
#                                                   or with `discard`, SIGKILL (the WAL in its
#                                                   socket buffer is never read)
#   cluster.sh kill-primary DIR                     SIGKILL of the primary's keeper and postmaster;
#                                                   prints the killed node's name
#   cluster.sh wait-promoted DIR OLD [SECONDS]      waits until the other node is primary
#   cluster.sh rejoin DIR NODE                      restarts NODE's keeper (it rejoins as standby)
#   cluster.sh wait-healthy DIR [SECONDS]           waits for one primary and one secondary
#   cluster.sh stop DIR                             stops everything started in DIR, removes DIR
#
# Waits are bounded; a failed wait prints the monitor's view of the formation and exits 1.
set -euo pipefail

PG_BIN="${PG_BIN:-/usr/lib/postgresql/15/bin}"
export PATH="$PG_BIN:$PATH"
export PG_CONFIG="$PG_BIN/pg_config"

die() {
    echo "cluster.sh: $*" >&2
    exit 1
}

usage() {
    sed -n '6,20s/^#   //p' "${BASH_SOURCE[0]}" >&2
    exit 2
}

[ $# -ge 2 ] || usage
command="$1"
DIR="$2"
shift 2

# The prefix that runs a command as postgres, with pg_autoctl's configuration, state and
# runtime files kept under DIR (never in the postgres user's home, so that formations never
# mix).
as_postgres=()
if [ "$(id -u)" -eq 0 ]; then
    as_postgres=(runuser -u postgres --)
elif [ "$(id -un)" != postgres ]; then
    die "run as root or as postgres (pg_autoctl runs as postgres)"
fi
as_postgres+=(env "HOME=$DIR" "XDG_CONFIG_HOME=$DIR/xdg/config" "XDG_DATA_HOME=$DIR/xdg/data"
    "XDG_RUNTIME_DIR=$DIR/xdg/run" "PATH=$PATH" "PG_CONFIG=$PG_CONFIG")

as_pg() {
    "${as_postgres[@]}" "$@"
}

# Starts `pg_autoctl ARGS...` in a session of its own (so that stop can end it with every
# child), logging to DIR/NAME.log; records the session id.
spawn() {
    local name="$1"
    shift
    setsid "${as_postgres[@]}" pg_autoctl "$@" >>"$DIR/$name.log" 2>&1 </dev/null &
    echo "$!" >"$DIR/$name.session"
}

load() {
    [ -f "$DIR/ports" ] || die "no formation in $DIR (run start first)"
    # shellcheck disable=SC1091
    . "$DIR/ports"
}

monitor_sql() {
    as_pg psql -X -qtA -h 127.0.0.1 -p "$MONITOR_PORT" -U autoctl_node -d pg_auto_failover \
        -c "$1"
}

node_port() {
    case "$1" in
        node1) echo "$PORT1" ;;
        node2) echo "$PORT2" ;;
        *) die "unknown node $1" ;;
    esac
}

# The reported state of each node, as `name:reportedstate:goalstate` lines.
states() {
    monitor_sql "SELECT nodename || ':' || reportedstate || ':' || goalstate \
                 FROM pgautofailover.node ORDER BY nodename" 2>/dev/null || true
}

show_state() {
    as_pg pg_autoctl show state --pgdata "$DIR/monitor" 2>&1 || true
}

# Waits until `states` matches every extended regexp given, for at most SECONDS.
wait_states() {
    local seconds="$1" what="$2"
    shift 2
    local deadline=$((SECONDS + seconds)) current pattern ok
    while [ "$SECONDS" -lt "$deadline" ]; do
        current="$(states)"
        ok=1
        for pattern in "$@"; do
            grep -Eq "$pattern" <<<"$current" || ok=0
        done
        if [ "$ok" -eq 1 ]; then
            return 0
        fi
        sleep 0.5
    done
    show_state >&2
    die "timed out after ${seconds}s waiting for $what"
}

port_free() {
    ! (exec 3<>"/dev/tcp/127.0.0.1/$1") >/dev/null 2>&1
}

start() {
    [ $# -eq 3 ] || usage
    MONITOR_PORT="$1" PORT1="$2" PORT2="$3"
    local port
    for port in "$MONITOR_PORT" "$PORT1" "$PORT2"; do
        [ "$port" != 5432 ] || die "port 5432 belongs to the shared server"
        port_free "$port" || die "port $port is in use"
    done
    command -v pg_autoctl >/dev/null ||
        die "pg_autoctl not found: apt-get install postgresql-15-auto-failover"
    mkdir -p "$DIR/xdg/config" "$DIR/xdg/data" "$DIR/xdg/run"
    chmod 700 "$DIR/xdg/run"
    if [ "$(id -u)" -eq 0 ]; then
        chown -R postgres:postgres "$DIR"
    fi
    cat >"$DIR/ports" <<EOF
MONITOR_PORT=$MONITOR_PORT
PORT1=$PORT1
PORT2=$PORT2
EOF
    local common=(--pgctl "$PG_BIN/pg_ctl" --hostname 127.0.0.1 --auth trust --no-ssl)

    spawn monitor create monitor --pgdata "$DIR/monitor" --pgport "$MONITOR_PORT" \
        "${common[@]}" --run
    local deadline=$((SECONDS + 60))
    until monitor_sql "SELECT 1" >/dev/null 2>&1; do
        [ "$SECONDS" -lt "$deadline" ] || {
            tail -n 30 "$DIR/monitor.log" >&2
            die "the monitor did not accept connections in 60 s"
        }
        sleep 0.5
    done
    # Quick failure detection for a test (defaults: checks every 5 s, unhealthy after 20 s).
    local setting
    # A node the monitor cannot reach is demoted after primary_demote_timeout; its keeper
    # demotes itself after timeout.network_partition_timeout (set to 3 s below), which must
    # stay shorter. Defaults: 30 s and 20 s.
    # The monitor promotes a standby only within promote_wal_log_threshold (16 MB) of the
    # primary's last reported position; the lagging asynchronous run stops the standby's
    # WAL receiver for 1.5 s under load, which on a fast machine writes more than that, and
    # its failover (and the loss it measures) would then never happen. 1 GB here.
    for setting in primary_demote_timeout=6000 health_check_period=1000 \
        health_check_timeout=1000 health_check_max_retries=1 health_check_retry_delay=500 \
        node_considered_unhealthy_timeout=3000 promote_wal_log_threshold=1073741824; do
        as_pg psql -X -qtA -p "$MONITOR_PORT" -d pg_auto_failover \
            -c "ALTER SYSTEM SET pgautofailover.${setting%=*} = ${setting#*=}" >/dev/null
    done
    as_pg psql -X -qtA -p "$MONITOR_PORT" -d pg_auto_failover -c "SELECT pg_reload_conf()" \
        >/dev/null
    MONITOR_URI="postgres://autoctl_node@127.0.0.1:$MONITOR_PORT/pg_auto_failover?sslmode=disable"
    echo "MONITOR_URI='$MONITOR_URI'" >>"$DIR/ports"

    local node
    for node in node1 node2; do
        spawn "$node" create postgres --pgdata "$DIR/$node" --pgport "$(node_port "$node")" \
            --listen 127.0.0.1 --name "$node" --dbname postgres --username postgres \
            --monitor "$MONITOR_URI" "${common[@]}" --run
        if [ "$node" = node1 ]; then
            wait_states 120 "node1 to be the primary" '^node1:single:single$'
        fi
    done
    wait_states 180 "node1 primary and node2 secondary" \
        '^node1:primary:primary$' '^node2:secondary:secondary$'
    for node in node1 node2; do
        as_pg pg_autoctl config set --pgdata "$DIR/$node" timeout.network_partition_timeout 3 \
            >/dev/null
        as_pg pg_autoctl reload --pgdata "$DIR/$node" >/dev/null
    done
}

primary() {
    monitor_sql "SELECT nodename FROM pgautofailover.node \
                 WHERE reportedstate IN ('primary', 'wait_primary', 'single') \
                   AND goalstate IN ('primary', 'wait_primary', 'single') \
                 ORDER BY nodename LIMIT 1"
}

# Runs SQL on NODE's own PostgreSQL.
node_sql() {
    as_pg psql -X -qtA -h 127.0.0.1 -p "$(node_port "$1")" -U postgres -d postgres -c "$2"
}

kill_primary() {
    local node pid
    node="$(primary)"
    [ -n "$node" ] || die "no primary to kill"
    # The keeper first: it would restart its PostgreSQL at once, and the monitor would see
    # nothing to fail over. Then the postmaster itself, as a crash would.
    local session
    session="$(cat "$DIR/$node.session")"
    # Every pg_autoctl process of the node's session (its supervisor and services).
    for pid in $(pgrep -s "$session" -x pg_autoctl || true); do
        kill -KILL "$pid" 2>/dev/null || true
    done
    pid="$(head -n 1 "$DIR/$node/postmaster.pid")"
    kill -KILL "$pid"
    # The backends notice their postmaster's death by themselves; make it immediate.
    pkill -KILL -s "$session" 2>/dev/null || true
    echo "$node"
}

secondary() {
    monitor_sql "SELECT nodename FROM pgautofailover.node \
                 WHERE reportedstate = 'secondary' ORDER BY nodename LIMIT 1"
}

pause_standby() {
    local node pid
    node="$(secondary)"
    [ -n "$node" ] || die "no secondary"
    pid="$(node_sql "$node" "SELECT pid FROM pg_stat_wal_receiver")"
    [ -n "$pid" ] || die "$node has no WAL receiver"
    kill -STOP "$pid"
    echo "$pid" >"$DIR/paused"
    echo "$node"
}

resume_standby() {
    if [ -f "$DIR/paused" ]; then
        if [ "${1:-}" = discard ]; then
            # What the primary had sent but the receiver had not read is gone with it; the
            # standby's postmaster restarts its processes and recovers from its own WAL.
            kill -KILL "$(cat "$DIR/paused")" 2>/dev/null || true
        else
            kill -CONT "$(cat "$DIR/paused")" 2>/dev/null || true
        fi
        rm -f "$DIR/paused"
    fi
}

rejoin() {
    [ $# -eq 1 ] || usage
    local node="$1"
    local deadline=$((SECONDS + 20))
    # A crashed node leaves its stale postmaster.pid; pg_autoctl handles it.
    while pgrep -s "$(cat "$DIR/$node.session")" >/dev/null 2>&1; do
        [ "$SECONDS" -lt "$deadline" ] || die "processes of $node still run"
        sleep 0.2
    done
    spawn "$node" run --pgdata "$DIR/$node"
}

stop() {
    local name session deadline
    resume_standby
    if [ -f "$DIR/ports" ]; then
        for name in node1 node2 monitor; do
            [ -d "$DIR/$name" ] || continue
            timeout 20 "${as_postgres[@]}" pg_autoctl stop --pgdata "$DIR/$name" --immediate \
                >/dev/null 2>&1 || true
        done
    fi
    # Whatever still runs in the sessions started here.
    deadline=$((SECONDS + 15))
    for name in node1 node2 monitor; do
        [ -f "$DIR/$name.session" ] || continue
        session="$(cat "$DIR/$name.session")"
        while pgrep -s "$session" >/dev/null 2>&1 && [ "$SECONDS" -lt "$deadline" ]; do
            sleep 0.2
        done
        pkill -KILL -s "$session" 2>/dev/null || true
    done
    case "$DIR" in
        /tmp/*) rm -rf "$DIR" ;;
        *) echo "cluster.sh: left $DIR in place (not under /tmp)" >&2 ;;
    esac
}

case "$command" in
    start) start "$@" ;;
    state) load; show_state ;;
    states) load; states ;;
    primary) load; primary ;;
    sync) load; node_sql "$(primary)" "SHOW synchronous_standby_names" ;;
    pause-standby) load; pause_standby ;;
    resume-standby) resume_standby "$@" ;;
    set-async)
        load
        # Both nodes: after a failover the old primary becomes the standby, and its own
        # setting decides then.
        # The monitor may refuse a change while the keepers report their state (it has
        # answered with a deadlock between its own functions); the setting is idempotent,
        # so a refused change is asked again, within a bound.
        for node in node1 node2; do
            attempt=1
            until out="$(as_pg pg_autoctl set node replication-quorum false \
                --pgdata "$DIR/$node" 2>&1)"; do
                [ "$attempt" -lt 10 ] || die "$node keeps its replication quorum: $out"
                attempt=$((attempt + 1))
                sleep 1
            done
        done
        deadline=$((SECONDS + 60))
        until [ -z "$(node_sql "$(primary)" "SHOW synchronous_standby_names")" ]; do
            [ "$SECONDS" -lt "$deadline" ] || die "the primary still waits for its standby"
            sleep 0.5
        done
        wait_states 60 "the formation to settle" ':primary:primary$' ':secondary:secondary$'
        ;;
    kill-primary) load; kill_primary ;;
    wait-promoted)
        load
        [ $# -ge 1 ] || usage
        old="$1"
        case "$old" in
            node1) new=node2 ;;
            node2) new=node1 ;;
            *) die "unknown node $old" ;;
        esac
        wait_states "${2:-120}" "$new to be promoted" \
            "^$new:(wait_primary|primary):(wait_primary|primary)$"
        echo "$new"
        ;;
    rejoin) load; rejoin "$@" ;;
    wait-healthy)
        load
        wait_states "${1:-180}" "one primary and one secondary" \
            ':primary:primary$' ':secondary:secondary$'
        ;;
    stop) stop ;;
    *) usage ;;
esac
