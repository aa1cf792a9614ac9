"""``local`` (control): a process-local ``threading.Lock`` around an unchecked section.

What a monolith uses, and correct there: within one process the lock serialises every buyer.
Across gunicorn worker processes or pods each process has its own lock, so two sections
overlap and both write back ``stock - q``: it oversells. Loads only with
``ALLOW_UNSAFE_STRATEGY=1``.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from contextlib import contextmanager
from typing import Iterator

from .contract import NO_GRANT, Grant, LockUnavailable
from .unsafe import UnsafeStrategy


class ProcessLockStrategy(UnsafeStrategy):
    guarded = True
    name = "local"
    guard_label = "threading.Lock (this process only)"
    loop_refusal = "its threading.Lock would stall the event loop while another purchase holds it"

    def __init__(self, *, config: dict) -> None:
        super().__init__(config=config)
        self._locks: defaultdict[str, threading.Lock] = defaultdict(threading.Lock)
        self._locks_lock = threading.Lock()

    @contextmanager
    def guard(self, sku: str) -> Iterator[Grant]:
        with self._locks_lock:
            lock = self._locks[sku]
        if not lock.acquire(timeout=self.config["ACQUIRE_TIMEOUT_MS"] / 1000):
            raise LockUnavailable(f"process lock for {sku} not acquired within {self.config['ACQUIRE_TIMEOUT_MS']} ms")
        try:
            yield NO_GRANT
        finally:
            lock.release()
