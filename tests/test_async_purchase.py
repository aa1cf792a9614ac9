"""The purchase on an event loop (``inventory.async_purchase``), in-process against real PostgreSQL
and Redis: the asyncio lock awaited on a loop, the section on the ORM threads, the same outcomes as
the sync purchase; a holder paused past its lease refused by the fence, beside a WSGI shopper of the
same sale (tests/test_matrix.py advances a forgotten fence from an ORM thread through the loop's lock)."""

from __future__ import annotations

import asyncio
import threading

import pytest
from django.core.exceptions import ImproperlyConfigured

from inventory.async_purchase import apurchase, loop_refusal
from inventory.audit import audit
from inventory.errors import InvalidQuantity, ProductNotFound
from inventory.models import Order, Product
from inventory.services import purchase
from inventory.strategies import load_strategy, strategy_class
from tests.helpers import WORKING_STRATEGIES
from tests.test_matrix import PausingRedis, PausingRedlock

pytestmark = pytest.mark.django_db(transaction=True)

ON_LOOP = [name for name in WORKING_STRATEGIES if not strategy_class(name).loop_refusal]


def buy(**kwargs):
    """One purchase on a fresh event loop, as a uvicorn worker would await it."""
    return asyncio.run(apurchase(**kwargs))


@pytest.mark.parametrize("name", ON_LOOP)
def test_each_outcome_as_the_sync_purchase_gives_it(name, use_strategy, make_product):
    use_strategy(name)
    make_product(stock=2, limit=1)
    confirmed = buy(sku="phone-x", customer="a", quantity=1, idempotency_key="k")
    assert confirmed.confirmed and confirmed.backend == name
    assert buy(sku="phone-x", customer="a", quantity=1, idempotency_key="k").order_id == confirmed.order_id
    assert buy(sku="phone-x", customer="a", quantity=1).outcome.value == "limit_reached"
    assert buy(sku="phone-x", customer="b", quantity=1).confirmed
    assert buy(sku="phone-x", customer="c", quantity=1).outcome.value == "sold_out"
    with pytest.raises(InvalidQuantity):
        buy(sku="phone-x", customer="d", quantity=0)
    with pytest.raises(ProductNotFound):
        buy(sku="no-such-thing", customer="d", quantity=1)
    assert Product.objects.get(sku="phone-x").stock == 0
    assert Order.objects.count() == 2 and audit(sku="phone-x").ok


@pytest.mark.parametrize("name", ["etcd", "zookeeper", "local"])
def test_a_strategy_that_would_block_the_loop_is_refused(name, settings):
    refusal = loop_refusal(strategy_class(name))
    assert refusal.startswith(f"INVENTORY_STRATEGY={name} cannot serve under SHOP_SERVER=asgi: ")
    config = {**settings.INVENTORY, "ALLOW_UNSAFE": True}
    with pytest.raises(ImproperlyConfigured, match="cannot serve under SHOP_SERVER=asgi"):
        buy(sku="phone-x", customer="a", quantity=1, strategy=load_strategy(name, config=config))
    assert Order.objects.count() == 0


@pytest.mark.parametrize("lock", ["redis", "redlock"])
def test_a_loop_holder_paused_past_its_lease_is_refused_by_the_fence(lock, settings, use_strategy, make_product):
    """The article's pause under ASGI: A, on an event loop, holds the asyncio lock (TTL 300 ms),
    reads stock 1 and pauses; B, a WSGI shopper of the same sale (the sync twin, the same keys),
    takes the expired lock, buys the unit and commits; then A wakes and writes: refused, busy."""
    use_strategy(lock, LOCK_TTL_MS=300, ACQUIRE_TIMEOUT_MS=30_000)
    make_product(stock=1)
    holder = (PausingRedis if lock == "redis" else PausingRedlock)(config=settings.INVENTORY)
    holder.resume, holder.paused = threading.Event(), threading.Event()
    resume, results = holder.resume, {}

    def shopper_a():
        results["a"] = buy(sku="phone-x", customer="a", quantity=1, strategy=holder)

    thread = threading.Thread(target=shopper_a)
    thread.start()
    assert holder.paused.wait(10)
    other = load_strategy(lock)
    results["b"] = purchase(sku="phone-x", customer="b", quantity=1, strategy=other)
    resume.set()  # A wakes only after B has committed
    thread.join(10)
    other.close()
    assert results["b"].confirmed, "B got the lock once A's lease ran out"
    assert results["a"].outcome.value == "busy" and results["a"].conflicts == 1
    assert audit(sku="phone-x").ok and Order.objects.count() == 1
