"""``redlock``: a majority of N independent Redis masters (N = 5 by default).

What can still go wrong: a holder that pauses past its validity, or a clock that jumps,
lets a second holder in; the storage check on the product row refuses the late writer.
"""

from __future__ import annotations

import redis
import redis.asyncio
from django.core import checks

from locks import AsyncRedlock, Redlock

from .contract import Needed
from .fenced import FencedLockStrategy


class RedlockStrategy(FencedLockStrategy):
    name = "redlock"
    guard_label = "Redlock: majority of 5 Redis masters"

    def __init__(self, *, config: dict) -> None:
        super().__init__(config=config)
        self.clients = [redis.Redis.from_url(url) for url in config["REDLOCK_URLS"]]
        # For ASGI's aguard (see RedisLockStrategy.async_client).
        self.async_clients = [redis.asyncio.Redis.from_url(url) for url in config["REDLOCK_URLS"]]
        if self.clients:
            # One server named twice (two databases, localhost and 127.0.0.1) is refused here, when
            # the strategy is built (manage.py check: inventory.E004), not at every purchase.
            Redlock(self.clients, "flashsale:lock:nodes")

    def make_lock(self, name: str) -> Redlock:
        return Redlock(
            self.clients, name, ttl_ms=self.config["LOCK_TTL_MS"], timeout_ms=self.config["ACQUIRE_TIMEOUT_MS"]
        )

    def make_async_lock(self, name: str) -> AsyncRedlock:
        return AsyncRedlock(
            self.async_clients, name, ttl_ms=self.config["LOCK_TTL_MS"], timeout_ms=self.config["ACQUIRE_TIMEOUT_MS"]
        )

    @classmethod
    def needs(cls, config: dict) -> list[Needed]:
        return [Needed("redis", (url,)) for url in config["REDLOCK_URLS"]]

    @classmethod
    def checks(cls, config: dict) -> list[checks.CheckMessage]:
        nodes = len(config["REDLOCK_URLS"])
        if nodes < 3:
            return [
                checks.Error(
                    f"Redlock needs at least 3 independent nodes; REDLOCK_URLS names {nodes}",
                    hint="with fewer than 3 a single node failure stops every purchase; use 5",
                    id="inventory.E002",
                )
            ]
        if nodes % 2 == 0:
            return [
                checks.Warning(
                    f"Redlock with an even number of nodes ({nodes}) tolerates no more failures than {nodes - 1}",
                    hint="use an odd number of nodes, such as 5",
                    id="inventory.W002",
                )
            ]
        return []

    @classmethod
    def server_env(cls, config: dict) -> dict[str, str]:
        return {"REDLOCK_URLS": ",".join(config["REDLOCK_URLS"])}

    def close(self) -> None:
        for client in self.clients:
            client.close()
