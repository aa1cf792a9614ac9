"""``unsafe`` (control): no guard, no storage check. Read, decide, write back ``stock - q``.

Two buyers read the same stock, both write ``stock - 1``, and two orders stand against one
unit: it exists to prove that the burst's audit catches oversell. Loads only with
``ALLOW_UNSAFE_STRATEGY=1``.
"""

from __future__ import annotations

from .base import Strategy
from .contract import Grant, Shelf
from .section import checked_write, read_shelf


class UnsafeStrategy(Strategy):
    name = "unsafe"
    control = True

    def read(self, product_id: int) -> Shelf:
        return read_shelf(product_id)

    def write(self, shelf: Shelf, *, quantity: int, grant: Grant) -> bool:
        return checked_write(shelf, quantity=quantity, token=None, fenced=False)
