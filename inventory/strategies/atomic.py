"""``atomic``: no guard and no read; the decision is pushed into SQL.

``UPDATE product SET stock = stock - q ... WHERE stock >= q AND <sale is on>`` is atomic by
itself in PostgreSQL (the row is locked for the statement and re-checked after a wait), and the
customer's units are an upsert that adds nothing past the limit. It is the honest baseline for
one counter: it cannot oversell and never conflicts. What it cannot do is guard a section of
several steps (check a payment, reserve elsewhere) that must see one consistent state.
"""

from __future__ import annotations

from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from ..models import Product
from .base import Strategy
from .contract import Grant, Outcome, Refusal, SectionResult, Shelf
from .section import allocate, create_order, decide, find_order, held_units, read_shelf, section_transaction


def on_sale(now) -> Q:
    return (Q(sale_starts_at__isnull=True) | Q(sale_starts_at__lte=now)) & (
        Q(sale_ends_at__isnull=True) | Q(sale_ends_at__gt=now)
    )


def take_units(product_id: int, quantity: int) -> bool:
    """Take ``quantity`` units while the sale is on and the row holds them (one conditional UPDATE)."""
    rows = Product.objects.filter(on_sale(timezone.now()), pk=product_id, stock__gte=quantity)
    return rows.update(stock=F("stock") - quantity, version=F("version") + 1) == 1


def take_in_one_statement(
    strategy: Strategy, *, product_id: int, customer: str, quantity: int, key: str, grant: Grant
) -> SectionResult:
    """The customer's units (upsert within the limit) and the stock (conditional UPDATE), then the order."""
    now = timezone.now()
    with section_transaction(strategy):
        replay = find_order(product_id=product_id, customer=customer, key=key)
        if replay is not None:
            return SectionResult(order=replay, replayed=True)
        if not allocate(product_id=product_id, customer=customer, quantity=quantity, within_cap_only=True):
            return SectionResult(refusal=Refusal(Outcome.LIMIT_REACHED))
        taken = Product.objects.filter(on_sale(now), pk=product_id, stock__gte=quantity).update(
            stock=F("stock") - quantity, version=F("version") + 1
        )
        if taken:
            return SectionResult(
                order=create_order(
                    strategy, product_id=product_id, customer=customer, quantity=quantity, key=key, grant=grant
                )
            )
        # Nothing taken: undo the units, then say why from the row as it is now.
        transaction.set_rollback(True)
    shelf = read_shelf(product_id)
    refusal = decide(shelf, quantity=quantity, held=held_units(product_id, customer), now=now)
    return SectionResult(refusal=refusal or Refusal(Outcome.SOLD_OUT, units_left=shelf.stock))


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

    def read(self, product_id: int) -> Shelf:
        return read_shelf(product_id)

    def write(self, shelf: Shelf, *, quantity: int, grant: Grant) -> bool:
        return (
            Product.objects.filter(on_sale(timezone.now()), pk=shelf.product_id, stock__gte=quantity).update(
                stock=F("stock") - quantity, version=F("version") + 1
            )
            == 1
        )

    def recover(self, shelf: Shelf, grant: Grant) -> Grant | None:
        return grant
