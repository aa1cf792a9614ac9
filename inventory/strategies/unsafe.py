"""``unsafe`` (control): no guard, no storage check. Read, decide, write back ``stock - q``.

Two buyers read the same stock, both write ``stock - 1``, and two orders stand against one
unit: it exists to prove that the burst's audit catches oversell. Loads only with
``ALLOW_UNSAFE_STRATEGY=1``.
"""

from __future__ import annotations

from .base import Strategy
from .contract import Grant, Shelf
from .statements import Statement, checked_update


class UnsafeStrategy(Strategy):
    name = "unsafe"
    control = True

    def stock_update(self, shelf: Shelf, *, quantity: int, grant: Grant) -> Statement:
        return checked_update(shelf, quantity=quantity, token=None, fenced=False)
