"""``redis``: one Redis server. ``SET NX PX`` with a random token, Lua compare-and-delete release,
and a fencing token from the same acquire script.

What can still go wrong: with replication, a failover to a replica that never saw the lock
forgets it; fencing keeps such a double grant from corrupting stock.
"""
from __future__ import annotations

import redis

from ..locks import RedisLock
from .fenced import FencedLockBackend


class RedisLockBackend(FencedLockBackend):
    name = "redis"

    def __init__(self, *, options: dict) -> None:
        super().__init__(options=options)
        self.client = redis.Redis.from_url(options["REDIS_URL"], socket_timeout=2.0, socket_connect_timeout=2.0)

    def make_lock(self, name: str) -> RedisLock:
        return RedisLock(
            self.client, name, ttl_ms=self.options["LOCK_TTL_MS"], timeout_ms=self.options["ACQUIRE_TIMEOUT_MS"]
        )

    def close(self) -> None:
        self.client.close()
