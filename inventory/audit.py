"""The sale's invariant, checked from the database: what was sold, ordered, lost or oversold.

:class:`AuditReport` states the invariant once, in words (``problems``); the audit, the admin,
the dashboard and the burst runner's judgement all ask it.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import Count, Sum

from .errors import ProductNotFound
from .models import Order, Product


@dataclass(frozen=True)
class AuditReport:
    """What the database says about one product's sale: the sale's invariant, checked once here."""

    sku: str
    initial: int
    stock: int
    sold: int  # initial - stock: units that left the shelf
    ordered: int  # units on orders
    orders: int
    over_limit_customers: int  # customers whose units across orders exceed the per-customer limit
    oversold: int  # units on orders beyond what left the shelf
    lost: int  # units that left the shelf without an order
    undersold: int  # units left on the shelf although a shopper was told "sold out"
    repeated_keys: int = 0  # Idempotency-Keys with more than one order (a resend that was sold twice)

    @classmethod
    def of(
        cls, product: Product, *, over_limit_customers: int = 0, told_sold_out: int = 0, repeated_keys: int = 0
    ) -> AuditReport:
        """The report on ``product`` as ``Product.objects.with_totals()`` annotated it.

        ``over_limit_customers`` and ``repeated_keys`` take a query each (:func:`audit` makes them;
        a list of products leaves them at 0); ``told_sold_out`` as in :func:`audit`.
        """
        sold = product.initial_stock - product.stock
        ordered = product.ordered_units
        return cls(
            sku=product.sku,
            initial=product.initial_stock,
            stock=product.stock,
            sold=sold,
            ordered=ordered,
            orders=product.order_count,
            over_limit_customers=over_limit_customers,
            oversold=max(0, ordered - sold),
            lost=max(0, sold - ordered),
            undersold=max(product.stock, 0) if told_sold_out else 0,
            repeated_keys=repeated_keys,
        )

    @property
    def problems(self) -> list[str]:
        """The sale's invariant, in words; empty when it holds."""
        found = []
        if self.stock < 0:
            found.append(f"stock {self.stock} below 0")
        if self.oversold:
            found.append(f"oversold by {self.oversold}: {self.ordered} units ordered, stock fell by {self.sold}")
        if self.lost:
            found.append(f"{self.lost} units lost: stock fell by {self.sold}, {self.ordered} units ordered")
        if self.over_limit_customers:
            found.append(f"{self.over_limit_customers} customers hold more than the per-customer limit")
        if self.undersold:
            found.append(f"undersold {self.undersold}: units left while shoppers were told sold out")
        if self.repeated_keys:
            found.append(f"{self.repeated_keys} Idempotency-Keys have more than one order")
        return found

    @property
    def ok(self) -> bool:
        return not self.problems


def audit(*, sku: str, told_sold_out: int = 0) -> AuditReport:
    """Check the sale's invariants from the database.

    ``told_sold_out`` is how many shoppers were answered "sold out" (from the load test); if any
    were while units are still on the shelf, those units count as undersold. A shopper told
    "busy, try again" (503) is not an undersell: they were not told there was nothing left.
    """
    product = Product.objects.with_totals().filter(sku=sku).first()
    if product is None:
        raise ProductNotFound(f"no product with sku {sku!r}")
    over_limit = (
        Order.objects.filter(product=product)
        .values("customer")
        .annotate(units=Sum("quantity"))
        .filter(units__gt=product.per_customer_limit)
        .count()
    )
    repeated_keys = (
        Order.objects.filter(product=product)
        .exclude(idempotency_key="")
        .values("idempotency_key")
        .annotate(orders=Count("id"))
        .filter(orders__gt=1)
        .count()
    )
    return AuditReport.of(
        product, over_limit_customers=over_limit, told_sold_out=told_sold_out, repeated_keys=repeated_keys
    )
