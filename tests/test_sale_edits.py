"""Staff edit or delete a product while purchases of it run, for every strategy, on real threads.

Each test holds the product's row the way a staff save holds it (its transaction's row lock), lets
shoppers in behind it, then changes the product and commits. Afterwards the database is the judge:
every confirmed answer has its order, every refusal left nothing, no customer holds past the
limit, and the stock plus the units sold is the initial stock. No shopper's answer is a 500.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest
from django.db import connections, transaction
from django.test import Client

from inventory.errors import ProductNotFound
from inventory.models import Order, Product
from inventory.services import purchase
from tests.helpers import run_threads

SHOPPERS = 6


def buy_behind(change, *, sku: str = "hot", quantity: int = 1, buy=None) -> Counter[str]:
    """SHOPPERS threads each buy ``quantity`` while a staff thread holds the row of ``sku`` (locked
    in its transaction), then, once the shoppers are on their way, runs ``change(product)`` inside
    that transaction and commits. Every answer's outcome, counted (``not_found`` for a 404, and
    ``raised <exception>`` for what would be a shopper's 500). ``buy(index)``: another way to buy,
    returning the answer to count."""
    outcomes: Counter[str] = Counter()
    guard = threading.Lock()
    held = threading.Event()

    def staff() -> None:
        try:
            with transaction.atomic():
                product = Product.objects.select_for_update().get(sku=sku)
                held.set()
                time.sleep(0.5)  # the shoppers pass the plain read and wait on the row
                change(product)
        finally:
            connections.close_all()

    def shopper(index: int) -> None:
        held.wait(10)
        try:
            try:
                answer = buy(index) if buy else purchase(sku=sku, customer=f"c{index}", quantity=quantity).outcome.value
            except ProductNotFound:
                answer = "not_found"
            except Exception as exc:  # noqa: BLE001 - a shopper's 500, counted and shown
                answer = f"raised {exc!r}"
            with guard:
                outcomes[answer] += 1
        finally:
            connections.close_all()

    changing = threading.Thread(target=staff)
    changing.start()
    run_threads(SHOPPERS, shopper, timeout_s=60)
    changing.join(30)
    assert not changing.is_alive()
    return outcomes


@pytest.mark.django_db(transaction=True)
def test_a_product_deleted_while_purchases_wait_for_it_answers_404(strategy, make_product):
    """A product with no orders yet is deleted while shoppers are between the plain read and the
    write: each of them is told the product is gone (404), none gets a 500, and nothing is left."""
    make_product("hot", stock=5, limit=1)
    outcomes = buy_behind(lambda product: product.delete())
    assert set(outcomes) <= {"not_found", "busy", "sold_out"}, outcomes  # sold out: redis-stock's counter
    assert not Product.objects.filter(sku="hot").exists()
    assert not Order.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_the_buy_form_of_a_product_deleted_while_it_waits_is_a_404_page(use_strategy, make_product):
    """The form's purchase of a product deleted under it: the "No such product" page (404), as for a
    sku that never was, not "Check your order" (400) nor a 500 from reading the product again."""
    use_strategy("db")
    make_product("hot", stock=5, limit=1)

    def buy(index: int) -> str:
        client = Client(raise_request_exception=False)
        response = client.post("/products/hot/buy", {"quantity": "1"})
        return str(response.status_code)

    outcomes = buy_behind(lambda product: product.delete(), buy=buy)
    assert set(outcomes) <= {"404", "503"}, outcomes
    assert not Order.objects.exists()
