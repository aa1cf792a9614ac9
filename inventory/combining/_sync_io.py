"""What the blocking combiner waits with (hand-written; ``_async_io`` is its asyncio twin)."""

from __future__ import annotations

import threading
import time

Mutex = threading.Lock


class Event:
    """``threading.Event``'s ``set``, ``clear`` and ``wait`` for a ticket: one waiter (its submitter),
    ``set`` and ``clear`` called only under the combiner's mutex. Built on one lock, held while the
    event is clear, where ``threading.Event`` builds a ``Condition`` (a lock, a waiter list, a lock
    per wait): every purchase queued makes one, and the leader sets one per purchase it served."""

    __slots__ = ("_open", "_flag")

    def __init__(self) -> None:
        self._open = threading.Lock()
        self._open.acquire()
        self._flag = False

    def is_set(self) -> bool:
        return self._flag

    def set(self) -> None:
        if not self._flag:
            self._flag = True
            self._open.release()

    def clear(self) -> None:
        if self._flag:
            self._flag = False
            self._open.acquire()  # free: its one waiter is the caller, done waiting

    def wait(self, timeout: float | None = None) -> bool:
        """Until set, or ``timeout`` seconds (None: no limit); True if set."""
        if self._open.acquire(timeout=-1 if timeout is None else max(timeout, 0.0)):
            self._open.release()
            return True
        return self._flag


#: What ``serve`` and the batch section give back here: nothing, and the answers.
Served = None
Answers = list
#: What a leader's ``take()`` gives back: the tickets taken.
Taken = list


def wait(event: Event, timeout_s: float | None) -> None:
    """Until ``event`` is set or ``timeout_s`` has passed (None: no limit)."""
    event.wait(timeout_s)


#: A shared queue leader's linger before its section (``SharedQueue.linger``).
sleep = time.sleep
