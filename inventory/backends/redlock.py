"""``redlock``: a majority of N independent Redis masters (N = 5 by default).

What can still go wrong: a holder that pauses past its validity, or a clock that jumps,
lets a second holder in; the fence on the product row rejects the late writer.
"""
from __future__ import annotations

import redis

from ..locks import Redlock
from .fenced import FencedLockBackend


class RedlockBackend(FencedLockBackend):
    name = "redlock"

    def __init__(self, *, options: dict) -> None:
        super().__init__(options=options)
        self.clients = [redis.Redis.from_url(url) for url in options["REDLOCK_URLS"]]

    def make_lock(self, name: str) -> Redlock:
        return Redlock(
            self.clients, name, ttl_ms=self.options["LOCK_TTL_MS"], timeout_ms=self.options["ACQUIRE_TIMEOUT_MS"]
        )

    def close(self) -> None:
        for client in self.clients:
            client.close()
