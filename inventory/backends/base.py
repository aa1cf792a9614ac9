"""The contract every purchase backend fulfils.

A backend answers two questions for :func:`inventory.services.purchase`:

* ``guard(sku)``: a context manager held around the whole transaction. Distributed-lock
  backends acquire there and release on exit, which is *after* the transaction has committed;
  it yields the grant's fencing token (or ``None`` when the backend has none) and raises
  :class:`LockUnavailable` when the lock cannot be had in time.
* ``take_stock(...)``: runs inside ``transaction.atomic()`` and moves stock for one order.
"""
from __future__ import annotations

from contextlib import AbstractContextManager
from enum import Enum


class Outcome(str, Enum):
    CONFIRMED = "confirmed"
    SOLD_OUT = "sold_out"
    LIMIT_REACHED = "limit_reached"
    BUSY = "busy"
    NOT_ON_SALE = "not_on_sale"


class LockUnavailable(Exception):
    """The backend could not grant exclusive access in time; the shopper should retry."""


class StaleFence(Exception):
    """A newer lock grant has already written the row: this holder's lease ran out."""


class InventoryBackend:
    """Base class; one subclass per mechanism, one module per subclass."""

    name: str = ""
    #: True when the backend writes through a fencing token (distributed locks).
    fenced: bool = False

    def __init__(self, *, options: dict) -> None:
        self.options = options

    def guard(self, sku: str) -> AbstractContextManager[int | None]:
        raise NotImplementedError("subclasses of InventoryBackend must provide guard()")

    def take_stock(self, *, product_id: int, quantity: int, fence: int | None) -> bool:
        """Decrement stock by ``quantity``; False when too little is left. Called inside a transaction."""
        raise NotImplementedError("subclasses of InventoryBackend must provide take_stock()")

    def close(self) -> None:
        """Release connections held by the backend."""
