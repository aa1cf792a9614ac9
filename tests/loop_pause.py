"""A strategy for tests/test_asgi.py that blocks its worker's event loop inside its section.

Loaded by an ASGI pod as ``INVENTORY_STRATEGY=tests.loop_pause.LoopBlockingRedis``: the ``redis``
strategy, except that the first section of the process, right after its read, hands the event
loop sync work that blocks it for ``LOOP_BLOCK_S`` seconds (``time.sleep`` on the loop, as a slow
sync call would). The worker can then do nothing, its lease runs out, and the section writes late
from a stale read: the article's pause, in a real server.
"""

from __future__ import annotations

import os
import threading
import time

from asgiref.sync import async_to_sync

from inventory.strategies.contract import Shelf
from inventory.strategies.redis import RedisLockStrategy

_first = threading.Event()


async def block_the_loop() -> None:
    time.sleep(float(os.environ["LOOP_BLOCK_S"]))  # sync work on the event loop: nothing else runs


class LoopBlockingRedis(RedisLockStrategy):
    def read_section(self, product_id: int, **kwargs) -> tuple[Shelf, int | None, int]:
        first = super().read_section(product_id, **kwargs)
        if not _first.is_set():
            _first.set()
            async_to_sync(block_the_loop)()  # from this ORM thread, on the worker's loop; back when it ends
        return first
