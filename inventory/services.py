"""The inventory's business logic: buy, restock, reset and audit.

Plain keyword-only functions. ``purchase`` returns an outcome for the expected refusals (sold
out, limit reached, busy, not on sale) and raises for bad input; any refusal leaves stock and
orders as they were.
"""
from __future__ import annotations

import logging
from dataclasses import asdict, dataclass

from django.db import IntegrityError, transaction
from django.db.models import Count, Sum
from django.utils import timezone

from .backends import InventoryBackend, LockUnavailable, Outcome, StaleFence, get_backend
from .backends.fenced import fenced_decrement
from .models import Order, Product

logger = logging.getLogger(__name__)

#: The largest quantity any request may name; per-product limits are usually lower.
MAX_QUANTITY = 100

__all__ = [
    "MAX_QUANTITY", "AuditReport", "InvalidQuantity", "Outcome", "ProductNotFound", "PurchaseResult",
    "audit", "fenced_decrement", "purchase", "reset_sale", "restock",
]


class InventoryError(Exception):
    """Bad input to a service: nothing was changed."""


class ProductNotFound(InventoryError):
    pass


class InvalidQuantity(InventoryError):
    pass


@dataclass(frozen=True)
class PurchaseResult:
    outcome: Outcome
    backend: str
    order_id: int | None = None
    fence: int | None = None
    detail: str = ""

    @property
    def confirmed(self) -> bool:
        return self.outcome is Outcome.CONFIRMED


def check_quantity(quantity: object, *, limit: int = MAX_QUANTITY) -> int:
    """Return ``quantity`` as an int in 1..limit, or raise :class:`InvalidQuantity`."""
    if isinstance(quantity, bool) or not isinstance(quantity, int):
        raise InvalidQuantity("quantity must be a whole number")
    if not 1 <= quantity <= limit:
        raise InvalidQuantity(f"quantity must be between 1 and {limit}")
    return quantity


def sale_state(product: Product, *, now=None) -> str:
    """``upcoming``, ``live``, ``ended`` or ``sold_out``."""
    now = now or timezone.now()
    if product.sale_starts_at and now < product.sale_starts_at:
        return "upcoming"
    if product.sale_ends_at and now >= product.sale_ends_at:
        return "ended"
    if product.stock <= 0:
        return "sold_out"
    return "live"


def purchase(*, sku: str, customer: str, quantity: int, backend: InventoryBackend | None = None) -> PurchaseResult:
    """Buy ``quantity`` units of ``sku`` for ``customer`` under the configured lock backend.

    The lock (if any) is taken before the transaction opens and released only after it has
    committed: releasing first would let the next holder read stock this one has not yet written.
    """
    backend = backend or get_backend()
    if not customer:
        raise InventoryError("a purchase needs a customer")
    product = Product.objects.filter(sku=sku).only(
        "id", "stock", "per_customer_limit", "sale_starts_at", "sale_ends_at"
    ).first()
    if product is None:
        raise ProductNotFound(f"no product with sku {sku!r}")
    check_quantity(quantity, limit=product.per_customer_limit)
    state = sale_state(product)
    if state in {"upcoming", "ended"}:
        return PurchaseResult(Outcome.NOT_ON_SALE, backend.name, detail=f"the sale is {state}")

    if product.stock < quantity:
        # Stock only falls during a sale, so a shelf already short needs no lock to say so;
        # this keeps thousands of late shoppers from queueing on the lock.
        return PurchaseResult(Outcome.SOLD_OUT, backend.name, detail="not enough stock left")
    try:
        with backend.guard(sku) as fence:
            return _purchase_in_transaction(
                backend=backend, product_id=product.id, customer=customer, quantity=quantity, fence=fence
            )
    except LockUnavailable as exc:
        return PurchaseResult(Outcome.BUSY, backend.name, detail=str(exc))


def _purchase_in_transaction(
    *, backend: InventoryBackend, product_id: int, customer: str, quantity: int, fence: int | None
) -> PurchaseResult:
    try:
        with transaction.atomic():
            if Order.objects.filter(product_id=product_id, customer=customer).exists():
                return PurchaseResult(Outcome.LIMIT_REACHED, backend.name, detail="one order per customer")
            if not backend.take_stock(product_id=product_id, quantity=quantity, fence=fence):
                return PurchaseResult(Outcome.SOLD_OUT, backend.name, detail="not enough stock left")
            order = Order.objects.create(
                product_id=product_id, customer=customer, quantity=quantity, backend=backend.name, fence=fence
            )
    except StaleFence as exc:
        logger.warning("fenced write refused: %s", exc)
        return PurchaseResult(Outcome.BUSY, backend.name, fence=fence, detail="lock lease expired; try again")
    except IntegrityError as exc:
        # The UNIQUE(product, customer) constraint caught a concurrent second order (possible
        # only when two requests of one customer race outside a lock, as in `unsafe`).
        constraint = getattr(getattr(exc.__cause__, "diag", None), "constraint_name", None)
        if constraint == "order_one_per_customer_per_product":
            return PurchaseResult(Outcome.LIMIT_REACHED, backend.name, detail="one order per customer")
        raise
    return PurchaseResult(Outcome.CONFIRMED, backend.name, order_id=order.pk, fence=fence)


def restock(*, sku: str, quantity: int) -> Product:
    """Add ``quantity`` units to a product's stock (and to its initial stock)."""
    check_quantity(quantity, limit=1_000_000)
    with transaction.atomic():
        product = Product.objects.select_for_update().filter(sku=sku).first()
        if product is None:
            raise ProductNotFound(f"no product with sku {sku!r}")
        product.stock += quantity
        product.initial_stock += quantity
        product.save(update_fields=["stock", "initial_stock"])
    return product


def reset_sale(*, sku: str, stock: int) -> Product:
    """Start the sale of ``sku`` over: ``stock`` units, no orders, fence back to 0."""
    if isinstance(stock, bool) or not isinstance(stock, int) or stock < 0:
        raise InvalidQuantity("stock must be a whole number, 0 or more")
    with transaction.atomic():
        product = Product.objects.select_for_update().filter(sku=sku).first()
        if product is None:
            raise ProductNotFound(f"no product with sku {sku!r}")
        Order.objects.filter(product=product).delete()
        product.initial_stock = stock
        product.stock = stock
        product.fence = 0
        product.save(update_fields=["initial_stock", "stock", "fence"])
    return product


@dataclass(frozen=True)
class AuditReport:
    """What the database says about one product's sale."""

    sku: str
    initial: int
    stock: int
    sold: int  # initial - stock: units that left the shelf
    ordered: int  # units on orders
    orders: int
    duplicate_customers: int  # customers with more than one order
    oversold: int  # units on orders beyond what left the shelf
    lost: int  # units that left the shelf without an order
    undersold: int  # units left unsold although demand covered them (only with ``demand``)

    @property
    def ok(self) -> bool:
        return (
            self.stock >= 0
            and self.oversold == 0
            and self.lost == 0
            and self.duplicate_customers == 0
            and self.undersold == 0
        )

    def as_dict(self) -> dict:
        return {**asdict(self), "ok": self.ok}


def audit(*, sku: str, demand: int | None = None) -> AuditReport:
    """Check the sale's invariants from the database.

    ``demand`` is the number of units shoppers asked for; when given, units left on the shelf
    while demand exceeded them count as undersold.
    """
    product = Product.objects.filter(sku=sku).first()
    if product is None:
        raise ProductNotFound(f"no product with sku {sku!r}")
    orders = Order.objects.filter(product=product)
    totals = orders.aggregate(ordered=Sum("quantity"), count=Count("id"))
    ordered = totals["ordered"] or 0
    duplicates = (
        orders.values("customer").annotate(n=Count("id")).filter(n__gt=1).count()
    )
    sold = product.initial_stock - product.stock
    undersold = 0
    if demand is not None:
        undersold = max(0, min(demand, product.initial_stock) - ordered)
    return AuditReport(
        sku=sku,
        initial=product.initial_stock,
        stock=product.stock,
        sold=sold,
        ordered=ordered,
        orders=totals["count"],
        duplicate_customers=duplicates,
        oversold=max(0, ordered - sold),
        lost=max(0, sold - ordered),
        undersold=undersold,
    )
