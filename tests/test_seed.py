"""``manage.py seed``: the demo products created, or reset to what the seed defines; with
``--missing-only`` (``make serve``) only the missing ones created, the others left as they are."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command

from inventory.management.commands.seed import DEMO_PRODUCTS
from inventory.models import Order, Product
from inventory.services import purchase

pytestmark = pytest.mark.django_db


def seed(*args: str) -> list[str]:
    out = StringIO()
    call_command("seed", *args, stdout=out)
    return out.getvalue().splitlines()


def test_missing_only_creates_the_missing_products_and_keeps_the_sale_of_the_others(use_strategy):
    """Seen: every ``make serve`` reset the demo products, deleting the sale's orders."""
    use_strategy("db")
    seed()
    Product.objects.filter(sku="earbuds-pro").delete()
    assert purchase(sku="phone-x", customer="alice", quantity=1).confirmed
    said = seed("--missing-only")
    assert said == [
        "kept phone-x: 99 of 100 units left at $499.00",
        "created earbuds-pro: 250 units at $89.00",
        "kept smartwatch-s: 50 of 50 units left at $199.00",
    ]
    assert Product.objects.get(sku="phone-x").stock == 99
    assert list(Order.objects.values_list("product__sku", "customer")) == [("phone-x", "alice")]
    assert Product.objects.count() == len(DEMO_PRODUCTS)
