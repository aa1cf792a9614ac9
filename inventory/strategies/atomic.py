"""``atomic``: no guard and no read; the decision is pushed into SQL.

``UPDATE product SET stock = stock - q ... WHERE stock >= q AND <sale is on>`` is atomic by
itself in PostgreSQL (the row is locked for the statement and re-checked after a wait), and the
customer's units are an upsert that adds nothing past the limit. It is the honest baseline for
one counter: it cannot oversell and never conflicts. What it cannot do is guard a section of
several steps (check a payment, reserve elsewhere) that must see one consistent state.
"""

from __future__ import annotations

from django.utils import timezone

from .base import Strategy
from .contract import Grant, SectionResult, Shelf
from .section import take_in_one_statement
from .statements import Statement, take_update


class AtomicUpdateStrategy(Strategy):
    name = "atomic"
    guard_label = "none (one conditional UPDATE)"
    check_label = "WHERE stock >= q"

    def attempt(self, *, product_id: int, customer: str, quantity: int, key: str, grant: Grant) -> SectionResult:
        return take_in_one_statement(
            self, product_id=product_id, customer=customer, quantity=quantity, key=key, grant=grant
        )

    # A batch (BATCH > 1) reads the row plainly, decides each purchase, and takes the batch's units
    # with the same conditional UPDATE; when the row no longer holds them, the batch reads again.

    def stock_update(self, shelf: Shelf, *, quantity: int, grant: Grant) -> Statement:
        return take_update(shelf.product_id, quantity, now=timezone.now())

    def recover(self, shelf: Shelf, grant: Grant) -> Grant | None:
        return grant
