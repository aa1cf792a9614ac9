"""A row lock held elsewhere is answered busy in bounded time, never a hang and never a 500.

The test holds the product's row lock from a psycopg connection of its own (``BEGIN; SELECT ...
FOR UPDATE``), as an admin's open transaction, a slow migration or a stuck pod would. Every
strategy's section waits for that lock (``db`` to read, the others to write the stock), alone and
as batch followers; each must be told busy while the row lock is still held (it is let go only
after ``HELD_S``, far longer than ``ROW_LOCK_TIMEOUT_MS`` and the queue's own bound: a purchase
whose statement waited for the lock would still be waiting, and then buy) and leave stock, orders
and the ``redis-stock`` counter as they were.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

import psycopg
import pytest
from django.db import connection

from inventory.models import Order, Product
from inventory.services import purchase
from inventory.strategies.contract import Outcome
from inventory.strategies.redis_stock import sale_key
from loadtests.pods import database_url

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("private_static_root")]

ROW_LOCK_TIMEOUT_MS = 100
ACQUIRE_TIMEOUT_MS = 1000
SHOPPERS = 3
#: How long the test holds the row lock at most: no loaded machine makes a timed-out wait last this long.
HELD_S = 30.0


@contextmanager
def row_locked(sku: str, *, at_most_s: float = HELD_S):
    """Hold the product's row lock from another connection until the block ends, or ``at_most_s``
    (so that a purchase made in the test's own thread cannot hang the test forever); yields an
    event set once the lock is let go."""
    with psycopg.connect(database_url()) as holder:
        holder.execute("SELECT id FROM inventory_product WHERE sku = %s FOR UPDATE", [sku])
        guard, released = threading.Lock(), threading.Event()

        def release() -> None:
            with guard:
                if not holder.closed and holder.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                    holder.rollback()
                released.set()

        timer = threading.Timer(at_most_s, release)
        timer.start()
        try:
            yield released
        finally:
            timer.cancel()
            release()


def configure(use_strategy, settings, backend: str, batch: int) -> None:
    options = {**settings.INVENTORY["OPTIONS"], "BATCH": batch}
    use_strategy(
        backend, ACQUIRE_TIMEOUT_MS=ACQUIRE_TIMEOUT_MS, ROW_LOCK_TIMEOUT_MS=ROW_LOCK_TIMEOUT_MS, OPTIONS=options
    )


@pytest.mark.parametrize(
    ("backend", "batch"),
    [("db", 1), ("optimistic", 1), ("redis", 1), ("atomic", 1), ("redis-stock", 1)]
    + [("db", 4), ("atomic", 4), ("redis-stock", 4)],
)
def test_a_row_lock_held_elsewhere_is_answered_busy_in_time(backend, batch, use_strategy, make_product, settings):
    configure(use_strategy, settings, backend, batch)
    make_product(stock=5, limit=1)
    answers, while_held = {}, {}

    def shopper(index: int) -> None:
        try:
            answers[index] = purchase(sku="phone-x", customer=f"c{index}", quantity=1)
            while_held[index] = not released.is_set()
        finally:
            connection.close()

    threads = [threading.Thread(target=shopper, args=(i,)) for i in range(SHOPPERS)]
    with row_locked("phone-x") as released:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(HELD_S + 5)
    assert [answers[i].outcome for i in range(SHOPPERS)] == [Outcome.BUSY] * SHOPPERS
    assert all(while_held.values()), f"answered only once the row lock was let go (lock_timeout unset): {while_held}"
    assert Product.objects.get(sku="phone-x").stock == 5 and Order.objects.count() == 0
    if backend == "redis-stock":
        from inventory import soldout

        assert int(soldout.client().hget(sale_key("phone-x"), "stock")) == 5, "units taken in Redis not given back"


def test_the_view_answers_a_lock_timeout_503_with_retry_after(use_strategy, make_product, settings, client):
    configure(use_strategy, settings, "db", 1)
    make_product(stock=5, limit=1)
    with row_locked("phone-x") as released:
        response = client.post("/api/products/phone-x/purchase", data="{}", content_type="application/json")
        assert not released.is_set(), f"answered {response.status_code} only once the row lock was let go"
    assert (response.status_code, response.json()["outcome"]) == (503, "busy")
    assert response["Retry-After"] == "1"
    assert Product.objects.get(sku="phone-x").stock == 5 and Order.objects.count() == 0
