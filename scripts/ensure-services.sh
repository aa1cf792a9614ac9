#!/usr/bin/env bash
# Make sure the machine's PostgreSQL (127.0.0.1:5432) and Redis (127.0.0.1:6379) answer.
# If one is installed but down, start it the way this machine kind starts it; if one is
# missing, say in one line what to install and fail.
set -euo pipefail

if ! command -v pg_isready >/dev/null || ! command -v redis-server >/dev/null; then
    missing=()
    command -v pg_isready >/dev/null || missing+=(postgresql)
    command -v redis-server >/dev/null || missing+=(redis-server)
    echo "missing: ${missing[*]}: install them (Debian: apt-get install ${missing[*]})" >&2
    exit 1
fi

if ! pg_isready -q -h 127.0.0.1 -p 5432; then
    if command -v pg_ctlcluster >/dev/null && [ -d /etc/postgresql ]; then
        echo "PostgreSQL is down; starting it"
        pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -1)" main start
    fi
    for _ in $(seq 50); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 0.2; done
    pg_isready -q -h 127.0.0.1 -p 5432 || { echo "PostgreSQL does not answer on 127.0.0.1:5432: start it" >&2; exit 1; }
fi

if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
    echo "Redis is down; starting it"
    mkdir -p /var/lib/redis /var/log/redis 2>/dev/null || true
    redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
        --dir /var/lib/redis --logfile /var/log/redis/ci.log
    for _ in $(seq 50); do redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1 && break; sleep 0.2; done
    redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1 || { echo "Redis does not answer on 127.0.0.1:6379: start it" >&2; exit 1; }
fi
