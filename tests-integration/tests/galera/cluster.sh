#!/usr/bin/env bash
# A three-node MariaDB Galera cluster on loopback, for tests of the MySQL/MariaDB driver.
# Each node has its own data directory, socket, pid file, log and config under DIR; nothing
# here touches another server (the config is read with --defaults-file only). Run as root;
# the servers run as the mysql user (rsync SST's daemon cannot write a root-owned datadir),
# so DIR's parent directories must be traversable by mysql (e.g. under /tmp).
#
#   cluster.sh start DIR BASEPORT   create and run three nodes (wipes DIR's node directories);
#                                   waits until every node is Synced with wsrep_cluster_size=3
#   cluster.sh stop DIR             stops every mariadbd (and SST rsync) of DIR; keeps the logs
#   cluster.sh kill DIR N           SIGKILL of node N (1..3)
#   cluster.sh restart DIR N        starts node N again; it rejoins (by IST when the gcache
#                                   still holds what it missed) and waits until all are Synced
#   cluster.sh status DIR           one line per node: port, state, cluster size, ready
#
# Ports from BASEPORT: SQL B, B+1, B+2; Galera group B+11..13; IST B+21..23; SST B+31..33.
# root connects over TCP from 127.0.0.1 without a password (mysql://root@127.0.0.1:PORT).
# Waits are bounded (WAIT_SECONDS, default 120); a failed wait prints the node's log tail.
set -euo pipefail

PROVIDER=/usr/lib/galera/libgalera_smm.so
WAIT_SECONDS="${WAIT_SECONDS:-120}"

die() { echo "cluster.sh: $*" >&2; exit 1; }
usage() { sed -n '8,16s/^#   //p' "${BASH_SOURCE[0]}" >&2; exit 2; }

[ $# -ge 2 ] || usage
cmd="$1"
DIR="$(realpath -m "$2")"
shift 2

check_node() { case "$1" in 1 | 2 | 3) ;; *) die "no node $1 (nodes are 1, 2, 3)" ;; esac; }
node_dir() { echo "$DIR/node$1"; }
sql_port() { echo $((BASEPORT + $1 - 1)); }
load() { [ -f "$DIR/baseport" ] || die "no cluster in $DIR (run start first)"; BASEPORT="$(cat "$DIR/baseport")"; }

# Runs SQL on node N over TCP as root; prints tab-separated rows.
sql() { mariadb --no-defaults --protocol=tcp -h127.0.0.1 -P"$(sql_port "$1")" -uroot -N -B --connect-timeout=2 -e "$2"; }

status_of() { # prints "state size ready" of node N, or nothing if it does not answer
    sql "$1" "SHOW GLOBAL STATUS WHERE Variable_name IN
        ('wsrep_local_state_comment','wsrep_cluster_size','wsrep_ready')" 2>/dev/null |
        sort | awk '{v[$1]=$2} END {if (NR) print v["wsrep_local_state_comment"], v["wsrep_cluster_size"], v["wsrep_ready"]}' || true
}

pid_of() { # the running mariadbd of node N, if any
    local f; f="$(node_dir "$1")/launch.pid"
    [ -f "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null && cat "$f"
    return 0
}

write_config() { # my.cnf of node N
    local n="$1" d; d="$(node_dir "$n")"
    local g=$((BASEPORT + 10 + n)) ist=$((BASEPORT + 20 + n)) sst=$((BASEPORT + 30 + n))
    local peers="127.0.0.1:$((BASEPORT + 11)),127.0.0.1:$((BASEPORT + 12)),127.0.0.1:$((BASEPORT + 13))"
    cat >"$d/my.cnf" <<EOF
[mariadbd]
user=mysql
datadir=$d/data
socket=$d/mysqld.sock
pid-file=$d/mysqld.pid
log-error=$d/error.log
port=$(sql_port "$n")
bind-address=127.0.0.1
skip-name-resolve
# small footprint: three of these share a 2-core machine with other services
innodb_buffer_pool_size=64M
innodb_log_file_size=16M
innodb_flush_log_at_trx_commit=2
performance_schema=OFF
max_connections=300
# Galera
binlog_format=ROW
default_storage_engine=InnoDB
innodb_autoinc_lock_mode=2
wsrep_on=ON
wsrep_provider=$PROVIDER
wsrep_cluster_name=axum_idempotency_test
wsrep_cluster_address=gcomm://$peers
wsrep_node_name=node$n
wsrep_node_address=127.0.0.1:$g
wsrep_sst_method=rsync
wsrep_sst_receive_address=127.0.0.1:$sst
wsrep_provider_options="gmcast.listen_addr=tcp://127.0.0.1:$g;ist.recv_addr=127.0.0.1:$ist;gcache.size=32M;gcache.page_size=16M"
EOF
}

launch() { # starts node N in a session of its own; extra args go to mariadbd
    local n="$1" d; shift; d="$(node_dir "$n")"
    setsid /usr/sbin/mariadbd --defaults-file="$d/my.cnf" "$@" >>"$d/stdout.log" 2>&1 </dev/null &
    echo "$!" >"$d/launch.pid"
}

wait_synced() { # waits until node N is Synced, ready, and in a cluster of at least SIZE
    local n="$1" size="$2" deadline=$((SECONDS + WAIT_SECONDS)) s
    while :; do
        s="$(status_of "$n")"
        read -r state csize ready <<<"${s:-x 0 x}"
        [ "$state" = Synced ] && [ "$ready" = ON ] && [ "${csize:-0}" -ge "$size" ] 2>/dev/null && return 0
        if [ -z "$(pid_of "$n")" ]; then
            tail -n 30 "$(node_dir "$n")/error.log" >&2 || true
            die "node $n exited while starting (log above)"
        fi
        if [ "$SECONDS" -ge "$deadline" ]; then
            tail -n 30 "$(node_dir "$n")/error.log" >&2 || true
            die "node $n not Synced with cluster size >= $size after ${WAIT_SECONDS}s (now: ${s:-no answer})"
        fi
        sleep 0.5
    done
}

stop_all() {
    local n p pids=()
    for n in 1 2 3; do p="$(pid_of "$n")"; [ -n "$p" ] && pids+=("$p"); done
    # also anything else started from DIR's configs (a lost pid file, an SST rsync daemon)
    local re; re="$(printf '%s' "$DIR" | sed 's/[][\.*^$+?(){}|]/\\&/g')/node[123]/"
    while read -r p; do pids+=("$p"); done < <(pgrep -f -- "$re" || true)
    [ ${#pids[@]} -eq 0 ] && return 0
    kill -TERM "${pids[@]}" 2>/dev/null || true
    for _ in $(seq 60); do # 30 s of grace, then SIGKILL
        kill -0 "${pids[@]}" 2>/dev/null || return 0
        sleep 0.5
    done
    kill -KILL "${pids[@]}" 2>/dev/null || true
}

case "$cmd" in
start)
    [ $# -eq 1 ] || usage
    BASEPORT="$1"
    if [ -f "$DIR/baseport" ] && [ "$(cat "$DIR/baseport")" = "$BASEPORT" ] &&
        [ "$(status_of 1)" = "Synced 3 ON" ] && [ "$(status_of 2)" = "Synced 3 ON" ] &&
        [ "$(status_of 3)" = "Synced 3 ON" ]; then
        echo "cluster.sh: already running in $DIR"; exit 0
    fi
    mkdir -p "$DIR"; chmod 755 "$DIR"; stop_all; rm -rf "$DIR"/node[123] "$DIR/template"
    for p in $(seq "$BASEPORT" $((BASEPORT + 2))) $(seq $((BASEPORT + 11)) 10 $((BASEPORT + 33))) \
        $(seq $((BASEPORT + 12)) 10 $((BASEPORT + 33))) $(seq $((BASEPORT + 13)) 10 $((BASEPORT + 33))); do
        ss -Hltn "sport = :$p" | grep -q . && die "port $p is in use"
    done
    echo "$BASEPORT" >"$DIR/baseport"
    # One system-table install, copied to each node (nodes 2 and 3 then get an SST from 1).
    mariadb-install-db --no-defaults --user=mysql --datadir="$DIR/template" --skip-test-db \
        --auth-root-authentication-method=normal --innodb-log-file-size=16M \
        >"$DIR/install.log" 2>&1 || { cat "$DIR/install.log" >&2; die "mariadb-install-db failed"; }
    for n in 1 2 3; do
        mkdir -p "$(node_dir "$n")"; cp -a "$DIR/template" "$(node_dir "$n")/data"; write_config "$n"
    done
    chown -R mysql:mysql "$DIR"/node[123]
    runuser -u mysql -- test -w "$DIR/node1" ||
        die "the mysql user cannot reach $DIR: use a directory whose parents it can traverse (chmod o+x)"
    launch 1 --wsrep-new-cluster
    wait_synced 1 1
    # root@localhost has no password; skip-name-resolve needs root@127.0.0.1 for TCP. It is
    # created on the bootstrap node and so is in the SST that nodes 2 and 3 receive.
    mariadb --no-defaults -S "$(node_dir 1)/mysqld.sock" -uroot -e "
        CREATE USER IF NOT EXISTS root@'127.0.0.1';
        GRANT ALL PRIVILEGES ON *.* TO root@'127.0.0.1' WITH GRANT OPTION;"
    launch 2; wait_synced 2 2
    launch 3; wait_synced 3 3
    for n in 1 2; do wait_synced "$n" 3; done
    echo "cluster.sh: three nodes Synced on ports $BASEPORT-$((BASEPORT + 2)) in ${SECONDS}s"
    ;;
stop)
    [ -d "$DIR" ] || exit 0
    stop_all
    ;;
kill)
    [ $# -eq 1 ] || usage; load; check_node "$1"
    p="$(pid_of "$1")"; [ -n "$p" ] || die "node $1 is not running"
    kill -KILL "$p"
    while kill -0 "$p" 2>/dev/null; do sleep 0.1; done
    ;;
restart)
    [ $# -eq 1 ] || usage; load; check_node "$1"
    [ -z "$(pid_of "$1")" ] || die "node $1 is still running"
    # After a SIGKILL grastate.dat has seqno -1, and the node would ask for a full SST. As
    # galera_recovery does, read the last committed position from InnoDB first and start
    # from it, so that the donor can send only the missing write sets (IST).
    d="$(node_dir "$1")"
    /usr/sbin/mariadbd --defaults-file="$d/my.cnf" --wsrep-recover --log-error="$d/recover.log" \
        >>"$d/recover.log" 2>&1 ||
        { cat "$d/recover.log" >&2; die "wsrep recovery of node $1 failed"; }
    pos="$(sed -n 's/.*WSREP: Recovered position: *//p' "$d/recover.log" | tail -n 1)"
    launch "$1" ${pos:+--wsrep-start-position="$pos"}
    for n in 1 2 3; do wait_synced "$n" 3; done
    echo "cluster.sh: node $1 rejoined in ${SECONDS}s"
    ;;
status)
    load
    for n in 1 2 3; do
        s="$(status_of "$n")"
        p="$(pid_of "$n")"
        echo "node$n port $(sql_port "$n") pid ${p:--} ${s:-down}"
    done
    ;;
*) usage ;;
esac
