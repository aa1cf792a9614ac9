"""``manage.py seed``: the demo products created, or reset to what the seed defines; with
``--missing-only`` (``make serve``) only the missing ones created, the others left as they are."""

from __future__ import annotations

import os
import time
from decimal import Decimal
from io import StringIO

import pytest
from django.core.management import call_command
from django.utils import timezone

from inventory import soldout, soldout_local
from inventory.errors import InvalidQuantity
from inventory.management.commands import seed as seed_command
from inventory.management.commands.seed import DEMO_PRODUCTS
from inventory.models import Order, Product
from inventory.services import purchase
from tests.test_soldout_local import row_remembered

pytestmark = pytest.mark.django_db

#: Each field of a demo product that seed's reset restores, as the seed defines smartwatch-s.
SMARTWATCH = {
    "name": "Smartwatch S",
    "price": Decimal("199.00"),
    "initial_stock": 50,
    "stock": 50,
    "per_customer_limit": 1,
    "sale_starts_at": None,
    "sale_ends_at": None,
    "listed": True,
}


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


def edited_out_of_the_sale(product: Product) -> None:
    """What staff did to the product in the admin: a price of 1, another name, a limit of 3, a sale
    window that has ended, unlisted; saved as the admin's form saves it."""
    now = timezone.now()
    product.name, product.price, product.per_customer_limit, product.listed = "Renamed", Decimal("1"), 3, False
    product.sale_starts_at, product.sale_ends_at = now - timezone.timedelta(hours=2), now - timezone.timedelta(hours=1)
    product.save()


@pytest.mark.usefixtures("private_static_root")
def test_reset_restores_the_demo_product_the_seed_defines(use_strategy, client):
    """Seen: seed printed "reset smartwatch-s: 50 units at $199.00" but reset only its stock and
    orders: the price of 1, the name "Renamed", the ended sale window and listed=False stayed, so the
    product it called reset could not be bought and was missing from the home page."""
    use_strategy("db")
    seed()
    edited_out_of_the_sale(Product.objects.get(sku="smartwatch-s"))
    said = seed()
    assert said[2] == (
        "reset smartwatch-s: 50 units at $199.00"
        " (restored name, price, per_customer_limit, sale_starts_at, sale_ends_at, listed)"
    ), said
    watch = Product.objects.get(sku="smartwatch-s")
    assert {field: getattr(watch, field) for field in SMARTWATCH} == SMARTWATCH
    assert purchase(sku="smartwatch-s", customer="alice", quantity=1).confirmed
    assert "Smartwatch S" in client.get("/").content.decode()


@pytest.mark.django_db(transaction=True)
def test_a_reset_drops_the_row_a_process_remembers(use_strategy, monkeypatch):
    """The row this process keeps in memory (made to outlive the test, so only a message can drop
    it, as in every other process) is the edited one, limit 3; seed restores the limit of 1, and the
    next purchase of 2 is refused."""
    use_strategy("db")
    sku = f"seeded-{os.getpid()}"  # a SKU of this process's own: messages reach every worker's listener
    monkeypatch.setattr(seed_command, "DEMO_PRODUCTS", [(sku, "Seeded", Decimal("5.00"), 20)])
    monkeypatch.setattr(soldout_local, "MARK_TTL_S", 3600.0)
    seed()
    product = Product.objects.get(sku=sku)
    edited_out_of_the_sale(product)
    Product.objects.filter(pk=product.pk).update(sale_starts_at=None, sale_ends_at=None)  # on sale, no message
    row_remembered(sku, customer="a")
    assert soldout.read(sku).shelf.per_customer_limit == 3
    seed()
    deadline = time.monotonic() + 5
    while (seen := soldout.read(sku)).shelf is not None and seen.shelf.per_customer_limit == 3:
        assert time.monotonic() < deadline, "the remembered row outlived the reset by 5 s"
        time.sleep(0.01)
    with pytest.raises(InvalidQuantity):
        purchase(sku=sku, customer="b", quantity=2)
    assert purchase(sku=sku, customer="b", quantity=1).confirmed
