"""``redis``: one Redis server. ``SET NX PX`` with a random token, Lua compare-and-delete release,
and a fencing token from the same acquire script.

What can still go wrong: with replication, a failover to a replica that never saw the lock
forgets it and grants it twice; the storage check keeps the second holder's stale write out.
"""

from __future__ import annotations

import redis
import redis.asyncio

from locks import AsyncRedisLock, RedisLock

from .contract import Needed
from .fenced import FencedLockStrategy


class RedisLockStrategy(FencedLockStrategy):
    name = "redis"
    guard_label = "one Redis: SET NX PX + Lua release"

    def __init__(self, *, config: dict) -> None:
        super().__init__(config=config)
        self.client = redis.Redis.from_url(config["REDIS_URL"], socket_timeout=2.0, socket_connect_timeout=2.0)
        # For ASGI's aguard. Its own pool is never used: the lock keeps its own connections, per
        # event loop, and the loop's owner closes them before it ends (async_purchase.aclose_loop).
        self.async_client = redis.asyncio.Redis.from_url(
            config["REDIS_URL"], socket_timeout=2.0, socket_connect_timeout=2.0
        )

    def make_lock(self, name: str) -> RedisLock:
        return RedisLock(
            self.client, name, ttl_ms=self.config["LOCK_TTL_MS"], timeout_ms=self.config["ACQUIRE_TIMEOUT_MS"]
        )

    def make_async_lock(self, name: str) -> AsyncRedisLock:
        return AsyncRedisLock(
            self.async_client, name, ttl_ms=self.config["LOCK_TTL_MS"], timeout_ms=self.config["ACQUIRE_TIMEOUT_MS"]
        )

    @classmethod
    def needs(cls, config: dict) -> list[Needed]:
        return [Needed("redis", (config["REDIS_URL"],))]

    def close(self) -> None:
        self.client.close()
