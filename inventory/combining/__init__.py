"""Flat combining: one queue per hot key, whoever leads serves the requests behind it.

Two queues, each written once for asyncio and generated to its blocking twin by
``scripts/unasync_locks.py``: the in-process combiner (``_async.py``: :class:`AsyncCombiner`,
:func:`alead_batch`, the ASGI purchase path; ``_sync.py``: :class:`Combiner`, :func:`lead_batch`,
gunicorn's threads), one queue per process, and the shared queue (``_async_shared.py``:
:class:`AsyncSharedQueue`; ``_sync_shared.py``: :class:`SharedQueue`), one Redis list per key for
every process and pod. The same leader function serves a batch from either.
"""

from ._async import AsyncCombiner, alead_batch
from ._async_shared import AsyncSharedQueue
from ._sync import Combiner, Ticket, lead_batch
from ._sync_shared import SharedQueue, SharedTicket

__all__ = [
    "AsyncCombiner",
    "AsyncSharedQueue",
    "Combiner",
    "SharedQueue",
    "SharedTicket",
    "Ticket",
    "alead_batch",
    "lead_batch",
]
