"""A row lock held elsewhere is answered busy in bounded time, never a hang and never a 500.

The test holds the product's row lock from a psycopg connection of its own (``BEGIN; SELECT ...
FOR UPDATE``), as an admin's open transaction, a slow migration or a stuck pod would. Every
strategy's section waits for that lock (``db`` to read, the others to write the stock), alone and
as batch followers; each must be told busy within ``ROW_LOCK_TIMEOUT_MS`` (plus the queue's own
bound) and leave stock, orders and the ``redis-stock`` counter as they were.
"""

from __future__ import annotations

import threading
import time
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

ROW_LOCK_TIMEOUT_MS = 300
ACQUIRE_TIMEOUT_MS = 1000
SHOPPERS = 3


@contextmanager
def row_locked(sku: str, *, at_most_s: float = 5.0):
    """Hold the product's row lock from another connection until the block ends, or ``at_most_s``
    (so that a purchase made in the test's own thread cannot hang the test forever)."""
    with psycopg.connect(database_url()) as holder:
        holder.execute("SELECT id FROM inventory_product WHERE sku = %s FOR UPDATE", [sku])
        released = threading.Lock()

        def release() -> None:
            with released:
                if not holder.closed and holder.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                    holder.rollback()

        timer = threading.Timer(at_most_s, release)
        timer.start()
        try:
            yield
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
    answers, took = {}, {}

    def shopper(index: int) -> None:
        started = time.monotonic()
        try:
            answers[index] = purchase(sku="phone-x", customer=f"c{index}", quantity=1)
        finally:
            took[index] = time.monotonic() - started
            connection.close()

    threads = [threading.Thread(target=shopper, args=(i,)) for i in range(SHOPPERS)]
    with row_locked("phone-x"):
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 3.0
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        hung = sum(thread.is_alive() for thread in threads)
    for thread in threads:
        thread.join(30)
    assert not hung, f"{hung} of {SHOPPERS} purchases still waited on the row lock 3 s later (lock_timeout unset)"
    assert [answers[i].outcome for i in range(SHOPPERS)] == [Outcome.BUSY] * SHOPPERS
    assert max(took.values()) < (ACQUIRE_TIMEOUT_MS + 2 * ROW_LOCK_TIMEOUT_MS) / 1000 + 0.5, took
    assert Product.objects.get(sku="phone-x").stock == 5 and Order.objects.count() == 0
    if backend == "redis-stock":
        from inventory import soldout

        assert int(soldout.client().hget(sale_key("phone-x"), "stock")) == 5, "units taken in Redis not given back"


def test_the_view_answers_a_lock_timeout_503_with_retry_after(use_strategy, make_product, settings, client):
    configure(use_strategy, settings, "db", 1)
    make_product(stock=5, limit=1)
    started = time.monotonic()
    with row_locked("phone-x"):
        response = client.post("/api/products/phone-x/purchase", data="{}", content_type="application/json")
    took = time.monotonic() - started
    assert took < 3.0, f"answered {response.status_code} after {took:.1f} s: it waited until the row lock was let go"
    assert (response.status_code, response.json()["outcome"]) == (503, "busy")
    assert response["Retry-After"] == "1"
    assert Product.objects.get(sku="phone-x").stock == 5 and Order.objects.count() == 0
