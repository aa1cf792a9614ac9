"""Process bodies for the multi-process lock tests (module level so they can be pickled)."""

from __future__ import annotations

import time

import redis

from locks import RedisLock, Redlock


def increment_under_lock(kind: str, urls: list[str], name: str, counter_url: str, times: int) -> None:
    """Read the counter, sleep, write it back plus one, under the lock: lost updates show as a low count."""
    clients = [redis.Redis.from_url(url, socket_timeout=1.0) for url in urls]
    counter = redis.Redis.from_url(counter_url, socket_timeout=1.0)
    for _ in range(times):
        if kind == "redis":
            lock = RedisLock(clients[0], name, ttl_ms=5_000, timeout_ms=30_000)
        else:
            # 8 processes on a loaded two-core machine can miss the default 50 ms per round; this
            # test is about lost updates, so a slow round must not end a worker.
            lock = Redlock(clients, name, ttl_ms=5_000, timeout_ms=30_000, node_timeout_ms=500)
        with lock:
            value = int(counter.get(f"{name}:counter") or 0)
            time.sleep(0.001)
            counter.set(f"{name}:counter", value + 1)
