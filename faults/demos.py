"""What the narrated fault demos (``simulate_pause``, ``simulate_failover``, ``simulate_clock_jump``) share.

* :class:`Narrator`: one timestamped line per step, ``ok`` or ``FAIL``; a demo exits 0 only when
  every step held.
* The demo product, reset before each run, and the critical section's parts as a purchase uses
  them (``inventory.strategies.section``): ``read_shelf``, then in one transaction
  ``checked_write`` (the storage check on or off), the customer's units and the order.
"""

from __future__ import annotations

import time
from datetime import datetime
from decimal import Decimal
from typing import Any, NamedTuple

from django.core.management.base import CommandError, OutputWrapper
from django.db import transaction

from inventory.audit import audit
from inventory.models import Product
from inventory.services import reset_sale
from inventory.strategies.contract import Shelf
from inventory.strategies.section import allocate, checked_write, new_order, read_shelf
from locks import Lease, Redlock

__all__ = [
    "DEMO_NODE_TIMEOUT_MS",
    "demo_redlock",
    "Narrator",
    "Shelf",
    "audit_line",
    "read_shelf",
    "reset_product",
    "why_refused",
    "write_order",
]

#: A Redlock node timeout for the narrated demos: they count votes, not how fast the votes come, and
#: no step waits on a silent node (a killed one refuses at once). The default for a 10 s TTL, 50 ms,
#: was outlasted by all five nodes at once in ``make test`` at load 6 (``simulate_clock_jump``).
DEMO_NODE_TIMEOUT_MS = 1_000


def demo_redlock(clients: list, name: str, *, ttl_ms: int) -> Redlock:
    """A demo holder's Redlock: one try (``timeout_ms=0``), and :data:`DEMO_NODE_TIMEOUT_MS` a node."""
    return Redlock(clients, name, ttl_ms=ttl_ms, timeout_ms=0, node_timeout_ms=DEMO_NODE_TIMEOUT_MS)


class Holder(NamedTuple):
    """A lock holder in a demo: its lock, the lease it was granted and the shelf it read under it."""

    lock: Any
    lease: Lease
    shelf: Shelf


class Narrator:
    """Prints ``HH:MM:SS.mmm +seconds  ok|FAIL  message`` lines and remembers the steps that failed."""

    def __init__(self, stdout: OutputWrapper) -> None:
        self.stdout = stdout
        self.started = time.monotonic()
        self.failures: list[str] = []

    def say(self, message: str) -> None:
        now = datetime.now().strftime("%H:%M:%S.%f")[:-3]
        self.stdout.write(f"{now} +{time.monotonic() - self.started:6.3f}s  {message}")

    def step(self, held: bool, message: str) -> bool:
        self.say(f"{'ok  ' if held else 'FAIL'} {message}")
        if not held:
            self.failures.append(message)
        return held

    def note(self, message: str) -> None:
        """A line that explains, indented under the steps."""
        self.say(f"     {message}")

    def check(self) -> None:
        """Raise :class:`CommandError` naming every step that did not hold, if any did not."""
        if self.failures:
            raise CommandError(f"{len(self.failures)} step(s) did not hold: " + "; ".join(self.failures))


def reset_product(*, sku: str, name: str, stock: int, per_customer_limit: int | None = None) -> Product:
    """A demo's (or a burst's) product, created if missing, on sale now with ``stock`` units, no
    orders and fence 0; a customer may buy ``per_customer_limit`` units (by default all of them).
    The instrument stays out of the shop window: the storefront's home page does not list it."""
    limit = stock if per_customer_limit is None else per_customer_limit
    Product.objects.get_or_create(
        sku=sku,
        defaults={"name": name, "price": Decimal("1.00"), "initial_stock": stock, "stock": stock},
    )
    Product.objects.filter(sku=sku).update(
        name=name, per_customer_limit=limit, sale_starts_at=None, sale_ends_at=None, listed=False
    )
    return reset_sale(sku=sku, stock=stock)


def write_order(shelf: Shelf, *, customer: str, quantity: int, token: int | None, fenced: bool, strategy: str) -> bool:
    """The section's transaction: the checked write and, if it landed, the customer's units and order."""
    with transaction.atomic():
        if not checked_write(shelf, quantity=quantity, token=token, fenced=fenced):
            return False
        allocate(product_id=shelf.product_id, customer=customer, quantity=quantity, cap=shelf.per_customer_limit)
        new_order(strategy, product_id=shelf.product_id, customer=customer, quantity=quantity, token=token).save()
    return True


def why_refused(shelf: Shelf, token: int | None) -> str:
    """Which part of the storage check refused a write made from ``shelf`` with ``token``."""
    now = read_shelf(shelf.product_id)
    reasons = []
    if now.version != shelf.version:
        reasons.append(
            f"the row changed since the read (version {shelf.version}, stock {shelf.stock} then; "
            f"version {now.version}, stock {now.stock} now)"
        )
    if token is not None and token <= now.fence:
        reasons.append(f"token {token} is not newer than the row's fence {now.fence}")
    return " and ".join(reasons) or "no condition failed"


def audit_line(sku: str) -> tuple[int, str]:
    """(units oversold, one line of the audit) for the demo product."""
    report = audit(sku=sku)
    return report.oversold, (
        f"audit: {report.orders} order(s) for {report.ordered} unit(s), stock fell by "
        f"{report.sold}: oversold {report.oversold}, lost {report.lost}"
    )
