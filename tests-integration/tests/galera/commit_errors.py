#!/usr/bin/env python3
# usage: commit_errors.py [--ports 33100,33101,33102] [--pairs 400] [--shapes a,a1,a2,a3,b,b0,c,d,e,f]
#                         [--meet commit|start] [--json OUT]
#
# Does a Galera COMMIT that loses certification report its error to the client, for each
# statement shape a driver could commit with? Needs a running three-node cluster
# (tests/galera/cluster.sh start DIR 33100) and pymysql (pip install pymysql).
#
# For each pair, two clients, one on node 1 and one on node 2, run the same transaction at
# the same instant: [SET SESSION autocommit=0;] SET TRANSACTION ISOLATION LEVEL READ
# COMMITTED; START TRANSACTION; INSERT an orders row tagged with this attempt; INSERT the
# contended records(id) row, the same id for both; then commit with the shape under test.
# Both clients meet at a barrier before the committing query (--meet commit), so both reach
# commit with a conflicting write set and one must lose (certification failure, or a brute-
# force abort when the winner is applied on its node first); --meet start lines them up at
# the start of the transaction instead. Every result
# set of a multi-statement query is read with nextset(), so any statement's error surfaces.
# Afterwards node 3 (wsrep_sync_wait=1) says which orders rows exist:
#   lost error  = every statement answered OK, but the attempt's orders row does not exist
#   false error = an error was answered, but the attempt's orders row exists
import argparse
import collections
import json
import threading
import time
import uuid

import pymysql
from pymysql.constants import CLIENT

BEGIN = ("SET @s = @@SESSION.innodb_lock_wait_timeout; "
         "SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION")
RESTORE = ("SET SESSION innodb_lock_wait_timeout = COALESCE(@s, @@SESSION.innodb_lock_wait_timeout),"
           " @s = NULL")
ORDER = "INSERT INTO orders (client_tag) VALUES ('{tag}')"
RECORD = "INSERT INTO records (id) VALUES ({key})"

# name: (autocommit=0 first?, statements before the barrier, the committing query, what it is)
SHAPES = {
    "a": (True, [ORDER, RECORD], "COMMIT; SET SESSION autocommit = 1; SET @x = NULL",
          "autocommit=0; ...; `COMMIT; SET SESSION autocommit = 1; SET @x = NULL`"),
    "a1": (False, [ORDER, RECORD], "COMMIT; SET SESSION autocommit = 1; SET @x = NULL",
           "as a, without autocommit=0 first"),
    "a2": (True, [ORDER, RECORD], "COMMIT; SET @x = NULL",
           "autocommit=0; ...; `COMMIT; SET @x = NULL`"),
    "a3": (True, [ORDER, RECORD], "COMMIT; SET SESSION autocommit = 1",
           "autocommit=0; ...; `COMMIT; SET SESSION autocommit = 1`"),
    "b": (False, [ORDER, RECORD], "COMMIT", "`COMMIT` alone"),
    "b0": (True, [ORDER, RECORD], "COMMIT", "autocommit=0; ...; `COMMIT` alone"),
    "c": (False, [ORDER], RECORD + "; COMMIT", "`INSERT INTO records ...; COMMIT`"),
    "d": (True, [ORDER, RECORD], "SET SESSION autocommit = 1",
          "autocommit=0; ...; `SET SESSION autocommit = 1` alone"),
    "e": (True, [ORDER], RECORD + "; SET SESSION autocommit = 1",
          "autocommit=0; ...; `INSERT INTO records ...; SET SESSION autocommit = 1`"),
    "f": (True, [ORDER], RECORD + "; COMMIT; SET SESSION autocommit = 1",
          "autocommit=0; ...; `INSERT INTO records ...; COMMIT; SET SESSION autocommit = 1`"),
    "g": (True, [ORDER, RECORD], RESTORE + ", SESSION autocommit = 1",
          "autocommit=0; ...; the driver's commit alone: one SET of three assignments"),
    "h": (True, [RECORD, "SAVEPOINT w", ORDER],
          ["RELEASE SAVEPOINT w; UPDATE records SET id = id WHERE id = {key}",
           RESTORE + ", SESSION autocommit = 1"],
          "the driver's atomic path: the contended row first, then "
          "`RELEASE SAVEPOINT; UPDATE` and the commit alone"),
    "i": (True, [RECORD, "SAVEPOINT w", ORDER],
          ["RELEASE SAVEPOINT w; UPDATE records SET id = id WHERE id = {key}",
           "SET SESSION autocommit = 1"],
          "as h, the commit `SET SESSION autocommit = 1` alone"),
    "j": (True, [RECORD, "SAVEPOINT w", ORDER],
          ["RELEASE SAVEPOINT w", "UPDATE records SET id = id WHERE id = {key}",
           "SET SESSION autocommit = 1"],
          "as i, every statement alone"),
}


def connect(port, db="galera_commit"):
    return pymysql.connect(host="127.0.0.1", port=port, user="root", database=db,
                           client_flag=CLIENT.MULTI_STATEMENTS, autocommit=None,
                           connect_timeout=5, read_timeout=60, write_timeout=60)


def run(cur, sql):
    """Sends one (multi-statement) query; returns one entry per statement answered:
    None for OK, the error number for the statement that failed (the server runs no
    statement after a failed one)."""
    out = []
    try:
        cur.execute(sql)
        out.append(None)
        while cur.nextset():
            out.append(None)
    except pymysql.err.MySQLError as e:
        out.append(e.args[0] if e.args and isinstance(e.args[0], int) else str(e))
    return out


def attempt(conn, shape, key, tag, barrier, result, meet):
    ac0, before, commit, _ = SHAPES[shape]
    cur = conn.cursor()
    steps = []
    try:
        if meet == "start":
            barrier.wait(timeout=30)
        if ac0:
            steps += run(cur, "SET SESSION autocommit = 0")
        steps += run(cur, BEGIN)
        for s in before:
            steps += run(cur, s.format(tag=tag, key=key))
        pre_error = next((s for s in steps if s is not None), None)
        if meet == "commit":
            barrier.wait(timeout=30)
        if pre_error is not None:
            result.update(phase="before", error=pre_error)
            return
        r = []
        for query in [commit] if isinstance(commit, str) else commit:
            r += run(cur, query.format(tag=tag, key=key))
            if r[-1] is not None:
                break
        err = next(((i, s) for i, s in enumerate(r) if s is not None), None)
        result.update(phase="commit", error=err[1] if err else None,
                      failed_stmt=err[0] if err else None, answers=len(r))
        # what the session says right after: an error deferred to the next statement shows here
        try:
            cur.execute("SELECT @@autocommit, @@in_transaction")
            result["after"] = list(cur.fetchone())
        except pymysql.err.MySQLError as e:
            result["after"] = e.args[0]
    finally:
        # leave the session as a pool would want it: no transaction, autocommit on
        run(cur, "ROLLBACK")
        run(cur, "SET SESSION autocommit = 1")
        cur.close()


def wsrep_counters(conns):
    out = []
    for c in conns:
        with c.cursor() as cur:
            cur.execute("SHOW GLOBAL STATUS WHERE Variable_name IN"
                        " ('wsrep_local_cert_failures', 'wsrep_local_bf_aborts')")
            out.append({k: int(v) for k, v in cur.fetchall()})
    return out


def committed_tags(conn, shape):
    with conn.cursor() as cur:
        cur.execute("SET SESSION wsrep_sync_wait = 1")
        cur.execute("SELECT client_tag FROM orders WHERE client_tag LIKE %s", (f"{shape}-%",))
        return {r[0] for r in cur.fetchall()}


def run_shape(shape, pairs, conns, checker, key_base, meet):
    stats = collections.Counter()
    errors = collections.Counter()
    attempts = []
    before = wsrep_counters(conns)
    for i in range(pairs):
        key = key_base + i
        barrier = threading.Barrier(2)
        res = [{}, {}]
        tags = [f"{shape}-{key}-n{n + 1}-{uuid.uuid4().hex[:8]}" for n in range(2)]
        ths = [threading.Thread(target=attempt, args=(conns[n], shape, key, tags[n], barrier, res[n], meet))
               for n in range(2)]
        for t in ths:
            t.start()
        for t in ths:
            t.join()
        for n in range(2):
            res[n].update(tag=tags[n], key=key, node=n + 1)
        attempts.append(res)
    # which attempts committed, seen from node 3 after it applied everything before the read
    after = wsrep_counters(conns)
    for n in range(2):
        for k in ("wsrep_local_cert_failures", "wsrep_local_bf_aborts"):
            stats[f"node{n + 1} {k[11:]}"] = after[n][k] - before[n][k]
    committed = committed_tags(checker, shape)
    # the same answer from the two nodes that ran the attempts
    stats["nodes disagree"] = sum(committed_tags(c, shape) != committed for c in conns)
    with checker.cursor() as cur:
        cur.execute("SELECT COUNT(*) FROM records WHERE id >= %s AND id < %s", (key_base, key_base + pairs))
        record_rows = cur.fetchone()[0]
    for pair in attempts:
        oks = 0
        for a in pair:
            exists = a["tag"] in committed
            if a.get("phase") == "before":
                stats["aborted before commit"] += 1
                errors[f"before:{a['error']}"] += 1
                if exists:
                    stats["false error"] += 1
                continue
            if a["error"] is None:
                oks += 1
                stats["answered OK"] += 1
                if not exists:
                    stats["lost error"] += 1
                    stats[f"lost error, next statement said {a.get('after')}"] += 1
            else:
                stats["answered error"] += 1
                errors[f"stmt{a['failed_stmt'] + 1}:{a['error']}"] += 1
                if exists:
                    stats["false error"] += 1
            stats["committed"] += exists
        stats[f"pairs with {oks} OK"] += 1
    stats["records rows"] = record_rows
    return stats, errors, attempts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ports", default="33100,33101,33102")
    ap.add_argument("--pairs", type=int, default=400)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--meet", choices=["commit", "start"], default="commit",
                    help="where the two clients of a pair wait for each other: before the"
                         " committing query (default), or before the transaction starts")
    ap.add_argument("--json", default=None, help="write every attempt's outcome here")
    args = ap.parse_args()
    ports = [int(p) for p in args.ports.split(",")]

    setup = connect(ports[0], db=None)
    with setup.cursor() as cur:
        for q in ["CREATE DATABASE IF NOT EXISTS galera_commit",
                  "USE galera_commit",
                  "CREATE TABLE IF NOT EXISTS orders (id BIGINT AUTO_INCREMENT PRIMARY KEY,"
                  " client_tag VARCHAR(64) NOT NULL UNIQUE) ENGINE=InnoDB",
                  "CREATE TABLE IF NOT EXISTS records (id BIGINT PRIMARY KEY) ENGINE=InnoDB",
                  "SELECT @@version, (SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS"
                  " WHERE VARIABLE_NAME = 'wsrep_provider_version')"]:
            cur.execute(q)
        print("server", cur.fetchone())
        # a fresh key range for every run: ids already used stay, and never collide
        cur.execute("SELECT COALESCE(MAX(id), 0) FROM records")
        base = (cur.fetchone()[0] // 1_000_000 + 1) * 1_000_000
    setup.close()

    conns = [connect(ports[0]), connect(ports[1])]
    checker = connect(ports[2])
    report, dump = [], {}
    for k, shape in enumerate(args.shapes.split(",")):
        t0 = time.monotonic()
        stats, errors, attempts = run_shape(shape, args.pairs, conns, checker, base + k * 100_000,
                                           args.meet)
        secs = time.monotonic() - t0
        dump[shape] = attempts
        report.append((shape, stats, errors, secs))
        print(f"\n[{shape}] {SHAPES[shape][3]}  ({args.pairs} pairs, {secs:.1f}s)")
        for key in sorted(stats):
            print(f"  {key:24} {stats[key]}")
        print("  error codes (statement of the committing query:errno):", dict(errors) or "-")

    print("\nshape | pairs | both OK | one OK | none OK | lost errors | false errors | aborted before commit | errors")
    for shape, s, e, _ in report:
        print(f"{shape} | {args.pairs} | {s['pairs with 2 OK']} | {s['pairs with 1 OK']} | {s['pairs with 0 OK']}"
              f" | {s['lost error']} | {s['false error']} | {s['aborted before commit']} | {dict(e)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dump, f)


if __name__ == "__main__":
    main()
