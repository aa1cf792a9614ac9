"""Flat combining: one queue per hot key and process, whoever leads serves the requests behind it.

Written once for asyncio (``_async.py``: :class:`AsyncCombiner`, :func:`alead_batch`, the ASGI
purchase path) and generated to the blocking twin (``_sync.py``: :class:`Combiner`,
:func:`lead_batch`, gunicorn's threads) by ``scripts/unasync_locks.py``.
"""

from ._async import AsyncCombiner, alead_batch
from ._sync import Combiner, Ticket, lead_batch

__all__ = ["AsyncCombiner", "Combiner", "Ticket", "alead_batch", "lead_batch"]
