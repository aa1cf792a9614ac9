"""What a shopper paid: each order keeps the unit price its purchase's own read saw, and every page
showing an order's money (the receipt, the admin's orders) says that price, not the product's current one."""

from __future__ import annotations

import contextlib
import threading
import time
from decimal import Decimal

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.test import Client

from inventory.errors import InventoryError
from inventory.models import Order, Product
from inventory.services import purchase
from inventory.strategies import load_strategy
from inventory.strategies.contract import Outcome

pytestmark = pytest.mark.usefixtures("private_static_root")

OLD, NEW = Decimal("9.99"), Decimal("19.99")


def staff_sets(sku: str, **fields) -> None:
    """What the admin's change form does: save only the fields it edits (the receivers follow)."""
    product = Product.objects.get(sku=sku)
    for name, value in fields.items():
        setattr(product, name, value)
    product.save(update_fields=list(fields))


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("batch", [1, 3])
def test_an_order_keeps_the_price_it_was_bought_at(strategy, batch, make_product, settings, use_strategy):
    use_strategy(strategy, OPTIONS={**settings.INVENTORY["OPTIONS"], "BATCH": batch})
    make_product(stock=5, limit=2, price=OLD)
    result = purchase(sku="phone-x", customer="alice", quantity=2, idempotency_key="k1")
    assert result.outcome is Outcome.CONFIRMED, result
    staff_sets("phone-x", price=NEW)
    order = Order.objects.get(pk=result.order_id)
    assert order.unit_price == OLD
    assert order.total == Decimal("19.98")


@pytest.mark.django_db
def test_the_receipt_says_what_the_shopper_paid_after_staff_change_the_price(make_product):
    """The form's result page multiplied by the product's price after the purchase: the same form
    posted again (its order key's replay) after a price change showed the new price."""
    make_product(stock=5, limit=2, price=OLD)
    shopper = Client()
    shopper.get("/products/phone-x/")
    first = shopper.post("/products/phone-x/buy", {"quantity": "2", "key": "receipt-1"})
    assert first.status_code == 201 and "$19.98" in first.content.decode()
    staff_sets("phone-x", price=NEW)
    again = shopper.post("/products/phone-x/buy", {"quantity": "2", "key": "receipt-1"})
    assert again.status_code == 201
    html = again.content.decode()
    assert "$19.98" in html and "$39.98" not in html
    assert Order.objects.count() == 1


@pytest.mark.django_db
def test_the_admin_shows_each_orders_price_not_the_products_current_one(admin_client, make_product):
    make_product(stock=5, limit=2, price=OLD)
    order_id = purchase(sku="phone-x", customer="alice", quantity=2).order_id
    staff_sets("phone-x", price=NEW)
    listing = admin_client.get("/admin/inventory/order/").content.decode()
    assert "9.99" in listing and "19.98" in listing and "39.98" not in listing
    detail = admin_client.get(f"/admin/inventory/order/{order_id}/change/").content.decode()
    assert "9.99" in detail and "19.98" in detail and "39.98" not in detail


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("name", ["db", "optimistic", "redis", "atomic", "redis-stock"])
def test_a_purchase_racing_a_price_change_records_the_price_its_decision_read(name, use_strategy, make_product):
    """Staff flip the product between ($9.99, 1 a shopper) and ($19.99, 2 a shopper) in one save,
    while shoppers buy 2 each: a purchase of 2 was decided on a read that allowed 2, so its order
    must carry that read's $19.99. A price read apart from the decision's row could be $9.99."""
    use_strategy(name)
    make_product(stock=10_000, limit=2, price=NEW)
    stop = threading.Event()
    failures: list[BaseException] = []

    def staff() -> None:
        try:
            flip = 0
            while not stop.is_set():
                flip += 1
                price, limit = (OLD, 1) if flip % 2 else (NEW, 2)
                staff_sets("phone-x", price=price, per_customer_limit=limit)
                # Longer at ($19.99, 2), where a purchase of 2 can go through: with the two states
                # as long, no order at all was written once on a loaded machine.
                time.sleep(0.002 if flip % 2 else 0.02)
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            failures.append(exc)
        finally:
            connection.close()

    def shopper(index: int) -> None:
        try:
            for round_number in range(25):
                with contextlib.suppress(InventoryError):  # a read that allowed only 1: 2 is bad input there
                    purchase(sku="phone-x", customer=f"s{index}-{round_number}", quantity=2)
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            failures.append(exc)
        finally:
            connection.close()

    flipper = threading.Thread(target=staff)
    shoppers = [threading.Thread(target=shopper, args=(i,)) for i in range(4)]
    flipper.start()
    for thread in shoppers:
        thread.start()
    for thread in shoppers:
        thread.join(60)
    stop.set()
    flipper.join(10)
    assert not failures, failures
    orders = Order.objects.filter(product__sku="phone-x")
    assert orders.exists()
    assert set(orders.values_list("quantity", "unit_price")) == {(2, NEW)}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("name", "batch"), [("optimistic", 1), ("redis", 1), ("optimistic", 3), ("atomic", 3), ("redis-stock", 3)]
)
def test_the_order_records_the_price_of_the_read_that_decided_it(name, batch, make_product, settings):
    """Right after the section's read saw ($19.99, 2 a shopper), staff commit ($9.99, 1 a shopper):
    the purchase of 2 was decided on the read, and its order carries that read's $19.99 (the write
    lands: a staff edit moves no stock, so no storage check refuses it). A second read of the price
    would record $9.99. (``db``'s read holds the row's lock, so the edit waits for its commit; the
    thread test above covers it.)"""
    strategy = load_strategy(name, config={**settings.INVENTORY, "OPTIONS": {"BATCH": batch}})
    make_product(stock=10, limit=2, price=NEW)

    def staff_edit_after(read):
        def reading(*args, **kwargs):
            seen = read(*args, **kwargs)
            editor = threading.Thread(
                target=lambda: (staff_sets("phone-x", price=OLD, per_customer_limit=1), connection.close())
            )
            editor.start()
            editor.join(10)
            assert not editor.is_alive(), "the staff edit waited for the section"
            return seen

        return reading

    strategy.read_section = staff_edit_after(strategy.read_section)
    strategy.read_batch = staff_edit_after(strategy.read_batch)
    try:
        result = purchase(sku="phone-x", customer="alice", quantity=2, strategy=strategy)
    finally:
        strategy.close()
    assert result.outcome is Outcome.CONFIRMED, result
    assert Product.objects.get(sku="phone-x").price == OLD
    order = Order.objects.get(pk=result.order_id)
    assert (order.quantity, order.unit_price) == (2, NEW)


@pytest.mark.django_db
def test_a_writer_that_names_no_price_gets_the_products_price_at_its_insert(make_product):
    """Writers outside the purchase path name no price (loadtests/hotrow.py's SQL, the narrated demos'
    ORM orders): the column's trigger fills in the product's price as it is at the insert."""
    product = make_product(stock=5, price=OLD)
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO inventory_order (product_id, customer, quantity, strategy, fence, idempotency_key, created_at)"
            " VALUES (%s, 'bench', 1, 'db', NULL, '', now()) RETURNING unit_price",
            [product.pk],
        )
        assert cursor.fetchone() == (OLD,)
    Order.objects.create(product=product, customer="demo", quantity=1, strategy="db")
    assert Order.objects.get(customer="demo").unit_price == OLD
    named = Order.objects.create(product=product, customer="named", quantity=1, strategy="db", unit_price=NEW)
    assert Order.objects.get(pk=named.pk).unit_price == NEW  # a price named is kept


@pytest.mark.django_db(transaction=True)
def test_the_migration_fills_older_orders_with_their_products_current_price():
    executor = MigrationExecutor(connection)
    latest = executor.loader.graph.leaf_nodes()
    executor.migrate([("inventory", "0013_session_generation")])
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO inventory_product (sku, name, price, initial_stock, stock, per_customer_limit, fence,"
                " version, listed) VALUES ('old', 'Old', 4.50, 5, 4, 1, 0, 1, true) RETURNING id"
            )
            (product_id,) = cursor.fetchone()
            cursor.execute(
                "INSERT INTO inventory_order (product_id, customer, quantity, strategy, idempotency_key, created_at)"
                " VALUES (%s, 'then', 1, 'db', '', now())",
                [product_id],
            )
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(latest)
    assert Order.objects.get(customer="then").unit_price == Decimal("4.50")
