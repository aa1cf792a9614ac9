"""What the asyncio combiner waits with (hand-written; ``_sync_io`` is its blocking twin).

Every task of a loop runs on its one thread and the combiner never awaits while it holds its
mutex, so the mutex has nothing to exclude: it is there for the blocking twin, whose submitters
are threads.
"""

from __future__ import annotations

import asyncio
from contextlib import nullcontext, suppress
from typing import Awaitable

Event = asyncio.Event
#: What ``serve`` and the batch section give back here: something to await.
Served = Awaitable[None]
Answers = Awaitable[list]
#: What a leader's ``take()`` gives back: something to await (a shared queue's LPOP awaits Redis).
Taken = Awaitable[list]


def Mutex() -> nullcontext:  # noqa: N802 (it stands where the twin makes a threading.Lock)
    return nullcontext()


async def wait(event: asyncio.Event, timeout_s: float | None) -> None:
    """Until ``event`` is set or ``timeout_s`` has passed (None: no limit)."""
    with suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), timeout_s)


#: A shared queue leader's linger before its section (``AsyncSharedQueue.linger``).
sleep = asyncio.sleep
