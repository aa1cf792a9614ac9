"""Create (or reset) the demo products."""

from __future__ import annotations

from decimal import Decimal

from django.core.management.base import BaseCommand
from django.db import transaction

from inventory.models import Product
from inventory.services import reset_sale

DEMO_PRODUCTS = [
    ("phone-x", "Phone X", Decimal("499.00"), 100),
    ("earbuds-pro", "Earbuds Pro", Decimal("89.00"), 250),
    ("smartwatch-s", "Smartwatch S", Decimal("199.00"), 50),
]

#: What every demo product is besides its name, price and stock: one unit a customer, on sale now
#: with no end, shown on the home page.
DEMO_SALE = {"per_customer_limit": 1, "sale_starts_at": None, "sale_ends_at": None, "listed": True}


def reset_demo(sku: str, stock: int, fields: dict) -> list[str]:
    """Start the sale of ``sku`` over with ``stock`` units (:func:`reset_sale`) and put back every
    one of ``fields`` that was edited since, in one transaction; the names of those put back."""
    with transaction.atomic():
        product = reset_sale(sku=sku, stock=stock)
        restored = [name for name, value in fields.items() if getattr(product, name) != value]
        for name in restored:
            setattr(product, name, fields[name])
        if restored:
            # Saved as the admin's form saves an edit: once it commits, inventory.receivers tells
            # every process, and each drops the row it remembers (the old limit, window, ...).
            product.save(update_fields=restored)
    return restored


class Command(BaseCommand):
    help = (
        "Create the demo flash-sale products, or reset those that exist: no orders, the seed's stock, "
        "and its name, price, limit, open sale window and listing back."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--missing-only",
            action="store_true",
            help="create only the demo products that do not exist; leave the others, their stock and orders, "
            "as they are (make serve)",
        )

    def handle(self, *args, missing_only: bool = False, **options):
        for sku, name, price, stock in DEMO_PRODUCTS:
            fields = {"name": name, "price": price, **DEMO_SALE}
            product, created = Product.objects.get_or_create(
                sku=sku, defaults={**fields, "initial_stock": stock, "stock": stock}
            )
            if created:
                self.stdout.write(f"created {sku}: {stock} units at ${price}")
            elif missing_only:
                left = f"{product.stock} of {product.initial_stock} units left"
                self.stdout.write(f"kept {sku}: {left} at ${product.price}")
            else:
                restored = reset_demo(sku, stock, fields)
                also = f" (restored {', '.join(restored)})" if restored else ""
                self.stdout.write(f"reset {sku}: {stock} units at ${price}{also}")
