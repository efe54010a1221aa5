#!/usr/bin/env bash
# Makes sure the real Redis 7 (127.0.0.1:6379) and PostgreSQL 15 (127.0.0.1:5432, trust auth) that
# the tests use answer; starts either with the Debian packages' own commands if it does not, and
# waits for it (at most 30 s each). Tests never fake these servers.
set -euo pipefail

wait_for() {  # wait_for NAME COMMAND...
    local name=$1
    shift
    for _ in $(seq 1 60); do
        if "$@" >/dev/null 2>&1; then
            echo "== $name: up"
            return 0
        fi
        sleep 0.5
    done
    echo "== $name: did not answer within 30 s" >&2
    return 1
}

if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
    echo "== redis: not answering; starting it"
    redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save '' --appendonly no
fi
wait_for redis redis-cli -h 127.0.0.1 -p 6379 ping

if ! pg_isready -h 127.0.0.1 -p 5432 >/dev/null 2>&1; then
    echo "== postgresql: not answering; starting it"
    cluster=$(pg_lsclusters --no-header | awk 'NR == 1 {print $1 " " $2}')
    # shellcheck disable=SC2086
    pg_ctlcluster $cluster start
fi
wait_for postgresql pg_isready -h 127.0.0.1 -p 5432
