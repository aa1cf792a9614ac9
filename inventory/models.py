"""Products on flash sale and the orders against them.

The database is the last guard: ``stock`` can never go below zero (CHECK), never above the
initial stock, and a customer's units across their orders of one product never exceed the
product's per-customer limit (an :class:`Allocation` row per product and customer, CHECKed).
"""

from __future__ import annotations

from decimal import Decimal

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import Count, F, Q, Sum
from django.db.models.functions import Coalesce


class ProductQuerySet(models.QuerySet):
    def with_totals(self) -> ProductQuerySet:
        """Each product with ``ordered_units`` (units on its orders), ``order_count`` and ``invariant_ok``.

        ``invariant_ok`` is the part of the sale's invariant one query can answer per product: stock
        is not below 0 and the units ordered are the units that left the shelf. It is there so a list
        can sort by it; :class:`inventory.audit.AuditReport` says the same verdict in words.
        """
        return self.annotate(
            ordered_units=Coalesce(Sum("orders__quantity"), 0),
            order_count=Count("orders"),
        ).annotate(
            invariant_ok=Q(stock__gte=0) & Q(ordered_units=F("initial_stock") - F("stock")),
        )


class Product(models.Model):
    sku = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200)
    price = models.DecimalField(max_digits=10, decimal_places=2, validators=[MinValueValidator(0)])
    initial_stock = models.PositiveIntegerField(help_text="Units put on sale at the last reset.")
    stock = models.IntegerField(help_text="Units left.")
    per_customer_limit = models.PositiveIntegerField(
        default=1,
        # The CHECK below in the form's words, beside the field (without it: "Constraint ... is violated").
        validators=[MinValueValidator(1)],
        help_text="Most units one customer may buy, across all of their orders.",
    )
    # The highest fencing token that has written this row. A distributed-lock holder may write
    # only with a larger token, so a holder that paused past its lease cannot write late.
    fence = models.BigIntegerField(default=0)
    # Bumped by every write of stock (purchase, restock, reset): a writer that read version v may
    # write only while the row is still at v, so a write based on a stale read cannot land.
    version = models.BigIntegerField(default=0)
    sale_starts_at = models.DateTimeField(null=True, blank=True)
    sale_ends_at = models.DateTimeField(null=True, blank=True)
    listed = models.BooleanField(
        default=True, help_text="Shown on the storefront's home page (a burst's own product is not)."
    )

    objects = ProductQuerySet.as_manager()

    class Meta:
        ordering = ["sku"]
        constraints = [
            models.CheckConstraint(condition=Q(stock__gte=0), name="product_stock_not_negative"),
            models.CheckConstraint(
                condition=Q(stock__lte=models.F("initial_stock")), name="product_stock_at_most_initial"
            ),
            models.CheckConstraint(condition=Q(per_customer_limit__gte=1), name="product_limit_positive"),
            models.CheckConstraint(condition=Q(price__gte=0), name="product_price_not_negative"),
            # A window that ends before it starts is never live: refused, not saved as an unsellable product.
            models.CheckConstraint(
                condition=Q(sale_starts_at__isnull=True)
                | Q(sale_ends_at__isnull=True)
                | Q(sale_ends_at__gt=F("sale_starts_at")),
                name="product_sale_ends_after_it_starts",
                violation_error_message="The sale must end after it starts: set its end later, or leave one blank.",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.sku})"

    @property
    def sold(self) -> int:
        return self.initial_stock - self.stock


class Allocation(models.Model):
    """Units one customer holds of one product, across their orders: the limit's last guard.

    Every confirmed order adds its units here in the same transaction (an upsert), and the CHECK
    refuses a total above ``cap``, the product's limit when the units were taken. A strategy
    that decides right never trips it; a hit is counted as a failure of the strategy.
    """

    # No index of its own: the unique (product, customer) index below leads with the product, so it
    # serves a lookup by product too, and a probe by (product, customer) has only the exact index.
    product = models.ForeignKey(Product, on_delete=models.CASCADE, related_name="allocations", db_index=False)
    customer = models.CharField(max_length=64)
    units = models.PositiveIntegerField()
    cap = models.PositiveIntegerField(help_text="The per-customer limit in force when the units were taken.")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["product", "customer"], name="allocation_one_per_customer"),
            models.CheckConstraint(condition=Q(units__lte=models.F("cap")), name="allocation_within_limit"),
            models.CheckConstraint(condition=Q(units__gte=1), name="allocation_units_positive"),
        ]

    def __str__(self) -> str:
        return f"{self.customer}: {self.units} of {self.cap} × product {self.product_id}"


class Order(models.Model):
    # Indexed with the customer (Meta.indexes), not alone: a read of one customer's orders of a
    # product is then an exact probe, whatever the planner's statistics believe about the
    # product's rows (taken before a sale, they call them few, and a product-only index was chosen
    # and every order of the sale filtered), and a lookup by product still has the index's prefix.
    product = models.ForeignKey(Product, on_delete=models.PROTECT, related_name="orders", db_index=False)
    # Indexed in Meta.indexes: a plain btree for the admin's lookup of one shopper's orders, without
    # the varchar_pattern_ops twin Django adds for db_index=True, which no query here can use (the
    # admin's search is icontains, UPPER(...) LIKE '%...%'), and every order insert paid for.
    customer = models.CharField(max_length=64, help_text="The shopper's session identity.")
    quantity = models.PositiveIntegerField()
    # What one unit cost when it was bought: the price the purchase's own read of the product saw
    # (the read that decided the sale), so a price staff change later does not rewrite what the
    # shopper was charged. Orders from before the field have their product's price at the migration.
    # A writer that names no price (a test's fixture, the narrated demos' own orders) gets the
    # product's price at its insert from a trigger (migration 0014); the purchase path and the
    # hot-row benchmark always name the one their read saw.
    unit_price = models.DecimalField(
        max_digits=10,
        decimal_places=2,
        validators=[MinValueValidator(0)],
        help_text="The price of one unit when it was bought.",
    )
    strategy = models.CharField(max_length=32, help_text="The strategy that guarded this purchase.")
    fence = models.BigIntegerField(null=True, blank=True, help_text="Fencing token of the lock grant, if any.")
    idempotency_key = models.CharField(
        max_length=64, blank=True, default="", help_text="The client's Idempotency-Key: a retry gets this order back."
    )
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["product", "customer"], name="order_product_customer"),
            models.Index(fields=["customer"], name="order_customer"),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["product", "customer", "idempotency_key"],
                condition=~Q(idempotency_key=""),
                name="order_idempotency_key_once",
            ),
            models.CheckConstraint(condition=Q(quantity__gte=1), name="order_quantity_positive"),
            models.CheckConstraint(condition=Q(unit_price__gte=0), name="order_unit_price_not_negative"),
        ]

    def __str__(self) -> str:
        return f"order {self.pk}: {self.quantity} × {self.product.sku} for {self.customer}"

    @property
    def total(self) -> Decimal:
        """What the shopper paid: the units at the price they were bought at."""
        return self.unit_price * self.quantity


class BurstRun(models.Model):
    """One strategy's row of ``manage.py flashsale``: what was sent, what came back, what the audit found."""

    started_at = models.DateTimeField(db_index=True)
    strategy = models.CharField(max_length=32)
    server = models.CharField(
        max_length=8,
        default="wsgi",
        help_text="The pods' server (flashsale --server): wsgi, gunicorn's threads; asgi, uvicorn workers "
        "(runs stored before this field: wsgi).",
    )
    sku = models.CharField(max_length=64)
    requests = models.PositiveIntegerField()
    stock_initial = models.IntegerField()
    stock_final = models.IntegerField()
    orders = models.PositiveIntegerField()
    oversold = models.IntegerField()
    undersold = models.IntegerField()
    status_counts = models.JSONField(default=dict, help_text='HTTP status → count, e.g. {"201": 100, "409": 4900}.')
    errors_5xx = models.PositiveIntegerField()
    rps = models.FloatField()
    p50_ms = models.FloatField()
    p95_ms = models.FloatField()
    p99_ms = models.FloatField()
    duration_s = models.FloatField()
    invariants_ok = models.BooleanField()
    # [[seconds since start, stock left, purchase requests sent], ...] sampled while the burst ran.
    timeline = models.JSONField(default=list)
    sentence = models.TextField(
        blank=True, default="", help_text="What the run showed, in the report's words (empty for runs stored before)."
    )

    class Meta:
        ordering = ["-started_at", "-id"]

    def __str__(self) -> str:
        return (
            f"{self.strategy} burst at {self.started_at:%Y-%m-%d %H:%M:%S}: {'ok' if self.invariants_ok else 'FAILED'}"
        )


class SessionGeneration(models.Model):
    """How many times a user has logged out: part of their sessions' auth hash (inventory/sessions.py).

    Sessions are signed cookies held by the browser alone, so a logout cannot delete one; it raises
    this number instead, and every session signed with the old one stops verifying."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, primary_key=True, related_name="session_generation"
    )
    generation = models.PositiveBigIntegerField(default=0)
