"""Create (or reset) the demo products."""

from __future__ import annotations

from decimal import Decimal

from django.core.management.base import BaseCommand

from inventory.models import Product
from inventory.services import reset_sale

DEMO_PRODUCTS = [
    ("phone-x", "Phone X", Decimal("499.00"), 100),
    ("earbuds-pro", "Earbuds Pro", Decimal("89.00"), 250),
    ("smartwatch-s", "Smartwatch S", Decimal("199.00"), 50),
]


class Command(BaseCommand):
    help = "Create the demo flash-sale products, or reset their stock and orders if they exist."

    def add_arguments(self, parser):
        parser.add_argument(
            "--missing-only",
            action="store_true",
            help="create only the demo products that do not exist; leave the others, their stock and orders, "
            "as they are (make serve)",
        )

    def handle(self, *args, missing_only: bool = False, **options):
        for sku, name, price, stock in DEMO_PRODUCTS:
            product, created = Product.objects.get_or_create(
                sku=sku, defaults={"name": name, "price": price, "initial_stock": stock, "stock": stock}
            )
            if created:
                self.stdout.write(f"created {sku}: {stock} units at ${price}")
            elif missing_only:
                left = f"{product.stock} of {product.initial_stock} units left"
                self.stdout.write(f"kept {sku}: {left} at ${product.price}")
            else:
                reset_sale(sku=sku, stock=stock)
                self.stdout.write(f"reset {sku}: {stock} units at ${price}")
