"""What the blocking combiner waits with (hand-written; ``_async_io`` is its asyncio twin)."""

from __future__ import annotations

import threading
import time

Event = threading.Event
Mutex = threading.Lock
#: What ``serve`` and the batch section give back here: nothing, and the answers.
Served = None
Answers = list
#: What a leader's ``take()`` gives back: the tickets taken.
Taken = list


def wait(event: threading.Event, timeout_s: float | None) -> None:
    """Until ``event`` is set or ``timeout_s`` has passed (None: no limit)."""
    event.wait(timeout_s)


#: A leader's linger before its section (``lead_batch``).
sleep = time.sleep
