"""``redis``: one Redis server. ``SET NX PX`` with a random token, Lua compare-and-delete release,
and a fencing token from the same acquire script.

What can still go wrong: with replication, a failover to a replica that never saw the lock
forgets it and grants it twice; the storage check keeps the second holder's stale write out.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis

from locks import RedisLock
from processes.nodes import RedisNode, ping_error

from .base import ServiceError
from .fenced import FencedLockStrategy


@dataclass(frozen=True)
class RedisService:
    """A Redis that a strategy needs: a private node the project starts, or one it only uses."""

    url: str
    node: RedisNode | None = None  # None: not the project's to start (the machine's Redis)

    @property
    def description(self) -> str:
        return f"redis-server {self.url}" + (" (private)" if self.node else "")

    @property
    def startable(self) -> bool:
        return self.node is not None

    def running(self) -> bool:
        return ping_error(self.url, timeout_s=1) is None

    def start(self) -> None:
        if self.node is None:
            raise ServiceError(f"Redis at {self.url} does not answer: start it (Debian: apt-get install redis-server)")
        self.node.start()

    def stop(self) -> None:
        if self.node is not None:
            self.node.stop()


class RedisLockStrategy(FencedLockStrategy):
    name = "redis"
    guard_label = "one Redis: SET NX PX + Lua release"

    def __init__(self, *, config: dict) -> None:
        super().__init__(config=config)
        self.client = redis.Redis.from_url(config["REDIS_URL"], socket_timeout=2.0, socket_connect_timeout=2.0)

    def make_lock(self, name: str) -> RedisLock:
        return RedisLock(
            self.client, name, ttl_ms=self.config["LOCK_TTL_MS"], timeout_ms=self.config["ACQUIRE_TIMEOUT_MS"]
        )

    @classmethod
    def services(cls, config: dict) -> list[RedisService]:
        return [RedisService(config["REDIS_URL"])]

    def close(self) -> None:
        self.client.close()
