"""``optimistic``: no guard; the write is a version compare-and-set, re-run on a conflict.

Every section reads the row's ``version`` and writes only while the row is still at it, so a
write based on a stale read changes nothing: it never oversells. Under contention many
sections read the same version and all but one are refused; each re-runs after a jittered
back-off, at most ``MAX_RETRIES`` times, and is then told "busy" (503 + Retry-After).
What can still go wrong: retry storms, and shoppers told busy while stock is left.
"""

from __future__ import annotations

import random

from django.core.exceptions import ImproperlyConfigured

from .base import Strategy
from .contract import Grant, Shelf
from .statements import Statement, checked_update


class OptimisticStrategy(Strategy):
    name = "optimistic"
    check_label = "version compare-and-set"
    default_options = {"MAX_RETRIES": 8, "BACKOFF_MS": 2.0}

    def __init__(self, *, config: dict) -> None:
        super().__init__(config=config)
        retries = int(self.options["MAX_RETRIES"])
        if retries < 0:  # every purchase would be answered busy without a try
            raise ImproperlyConfigured(f"OPTIMISTIC_MAX_RETRIES={retries}: use 0 or more")
        self.max_attempts = 1 + retries

    def stock_update(self, shelf: Shelf, *, quantity: int, grant: Grant) -> Statement:
        return checked_update(shelf, quantity=quantity, token=None, fenced=True)

    def backoff_s(self, attempt: int) -> float:
        # Full jitter over an exponentially growing window: 0–2 ms, 0–4 ms, ... capped at 64 ms.
        return random.uniform(0, min(64.0, self.options["BACKOFF_MS"] * 2**attempt)) / 1000
