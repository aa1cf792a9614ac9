"""The ``etcd`` strategy against a real 3-member etcd cluster and real PostgreSQL.

The cluster listens on the slot's ports +126..+128 (peers +136..+138), the suite's ETCD_ENDPOINTS:
started here unless it runs (a session fixture may run it for every strategy's tests), and then
stopped at the end of the module; before and after each test every member is up and healthy.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection

from inventory.audit import audit
from inventory.models import Order, Product
from inventory.services import purchase
from inventory.strategies.etcd import EtcdLockStrategy
from processes.needs import processes_for, project_cluster
from tests import slots

pytestmark = pytest.mark.django_db(transaction=True)

ENDPOINTS = [f"http://127.0.0.1:{slots.ETCD_BASE_PORT + i}" for i in range(3)]


@pytest.fixture(scope="module")
def etcd_cluster():
    cluster = project_cluster(ENDPOINTS)
    started = not cluster.running()
    cluster.start()
    yield cluster
    if started:
        cluster.stop()


@pytest.fixture
def config(settings, etcd_cluster):
    etcd_cluster.reset()
    yield {**settings.INVENTORY, "ETCD_ENDPOINTS": ENDPOINTS, "LOCK_TTL_MS": 2_000, "ACQUIRE_TIMEOUT_MS": 5_000}
    etcd_cluster.reset()


def test_the_strategy_describes_its_cluster(config, etcd_cluster):
    [process] = processes_for(EtcdLockStrategy.needs(config))
    assert process.endpoints == ENDPOINTS and process.startable and process.running()
    assert EtcdLockStrategy.server_env(config) == {"ETCD_ENDPOINTS": ",".join(ENDPOINTS)}
    assert EtcdLockStrategy.checks(config) == []
    assert [m.id for m in EtcdLockStrategy.checks({**config, "ETCD_ENDPOINTS": ENDPOINTS[:2]})] == ["inventory.W004"]


def test_threads_buying_at_once_sell_exactly_the_stock(config, make_product):
    make_product(sku="hot", stock=12, limit=1)
    strategy = EtcdLockStrategy(config=config)
    outcomes: Counter[str] = Counter()
    guard = threading.Lock()

    def shopper(index: int) -> None:
        try:
            for k in range(4):
                result = purchase(sku="hot", customer=f"t{index}-c{k}", quantity=1, strategy=strategy)
                with guard:
                    outcomes[result.outcome.value] += 1
                    outcomes["conflicts"] += result.conflicts
        finally:
            connection.close()

    threads = [threading.Thread(target=shopper, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    strategy.close()
    assert outcomes["confirmed"] == 12 and outcomes["sold_out"] == 12, outcomes
    assert outcomes["conflicts"] == 0, "the lock serialises the sections: the storage check never fires"
    report = audit(sku="hot")
    assert report.ok and Product.objects.get(sku="hot").stock == 0


class FreezingAfterRead(EtcdLockStrategy):
    """The first section reads, then the whole process "freezes": its session stops being renewed
    (as under SIGSTOP or a stop-the-world pause) until ``resume`` is set, which the test does only
    once B has bought: longer than the session lease (2 s, etcd's minimum with the cluster's
    default election timeout), however slow the machine."""

    resume: threading.Event | None = None

    def read_section(self, product_id, **kwargs):
        read = super().read_section(product_id, **kwargs)
        if self.resume is not None:
            resume, self.resume = self.resume, None
            self.client.freeze_sessions()
            self.paused.set()
            assert resume.wait(60), "the test never ended the freeze"
        return read


@pytest.mark.slow
def test_a_holder_whose_lease_lapsed_is_refused_by_the_fence(config, make_product):
    make_product(stock=1)
    holder = FreezingAfterRead(config=config)
    resume = threading.Event()
    holder.resume, holder.paused = resume, threading.Event()
    results = {}

    def shopper_a():
        try:
            results["a"] = purchase(sku="phone-x", customer="a", quantity=1, strategy=holder)
        finally:
            connection.close()

    thread = threading.Thread(target=shopper_a)
    thread.start()
    assert holder.paused.wait(5)
    other = EtcdLockStrategy(config={**config, "ACQUIRE_TIMEOUT_MS": 30_000})  # a wait no load comes near
    started = time.monotonic()
    results["b"] = purchase(sku="phone-x", customer="b", quantity=1, strategy=other)
    waited = time.monotonic() - started
    resume.set()  # A wakes only after B has committed
    thread.join(10)
    holder.close()
    other.close()
    assert results["b"].confirmed, "B got the lock once A's session lease ran out"
    assert waited > 1.0, f"B was granted after {waited:.1f} s, before A's lease could have run out"
    assert results["a"].outcome.value == "busy" and results["a"].conflicts == 1
    assert audit(sku="phone-x").ok and Order.objects.count() == 1


# It kills two members of its own cluster and waits for the timeout: make test runs it, not make check.
@pytest.mark.slow
def test_majority_down_answers_busy_within_the_timeout_and_changes_nothing(config, etcd_cluster, make_product):
    make_product(stock=5)
    strategy = EtcdLockStrategy(config=config)
    assert purchase(sku="phone-x", customer="warm", quantity=1, strategy=strategy).confirmed
    etcd_cluster[0].kill()
    etcd_cluster[2].kill()
    started = time.monotonic()
    result = purchase(sku="phone-x", customer="late", quantity=1, strategy=strategy)
    strategy.close()
    assert result.outcome.value == "busy"
    assert time.monotonic() - started < config["ACQUIRE_TIMEOUT_MS"] / 1000
    assert Product.objects.get(sku="phone-x").stock == 4 and Order.objects.count() == 1


@pytest.mark.slow
def test_simulate_pause_with_etcd_holds_every_step(config, settings):
    settings.INVENTORY = config
    out = StringIO()
    call_command("simulate_pause", backend="etcd", stdout=out)
    text = out.getvalue()
    assert "FAIL" not in text and "every step held (etcd)" in text
    assert "A's release is ignored (NotOwned)" in text and "A writes with stale fence" in text
    product = Product.objects.get(sku="simulate-pause")
    assert product.stock == product.initial_stock - 1 and product.fence > 0


# It kills every member of its own cluster: make test runs it, not make check.
@pytest.mark.slow
@pytest.mark.parametrize("warm", [True, False], ids=["warm", "cold"])
def test_whole_cluster_down_answers_busy_within_the_timeout_and_changes_nothing(
    config, etcd_cluster, make_product, warm
):
    """Every member down, with the strategy's session made before (warm) or not yet (cold): busy
    within the acquire timeout, never a 500, nothing written."""
    from tests.helpers import bought_with_the_service_down

    make_product(stock=5)
    result, took, before, after = bought_with_the_service_down(EtcdLockStrategy(config=config), etcd_cluster, warm=warm)
    assert result.outcome.value == "busy"
    assert took < config["ACQUIRE_TIMEOUT_MS"] / 1000 + 1.0, took
    assert after == before


@pytest.mark.slow
@pytest.mark.parametrize("down", [0, 1, 2])
def test_one_member_down_the_sale_goes_on(config, etcd_cluster, make_product, down):
    """Any one member down, the first endpoint too: the two left are a majority, and purchases are
    confirmed with growing fences, by a session made before the kill and by one made after."""
    make_product(stock=5)
    warm = EtcdLockStrategy(config=config)
    first = purchase(sku="phone-x", customer="warm", quantity=1, strategy=warm)
    etcd_cluster[down].kill()
    cold = EtcdLockStrategy(config=config)
    try:
        results = [
            purchase(sku="phone-x", customer=name, quantity=1, strategy=s) for name, s in (("a", warm), ("b", cold))
        ]
    finally:
        warm.close()
        cold.close()
    assert first.confirmed and all(result.confirmed for result in results), results
    assert first.fence < results[0].fence < results[1].fence
    assert audit(sku="phone-x").ok and Order.objects.count() == 3


@pytest.mark.slow
def test_the_cluster_down_while_a_holder_writes_leaves_its_order_confirmed(config, etcd_cluster, make_product):
    """Every member dies while a holder's write waits for the row: the write commits, its release
    cannot reach etcd, and the shopper is told confirmed (the order stands), within the timeouts."""
    from tests.helpers import bought_while_the_service_dies

    product = make_product(stock=5)
    strategy = EtcdLockStrategy(config=config)
    result, took, alive = bought_while_the_service_dies(strategy, etcd_cluster, product.pk)
    strategy.close()
    assert not alive
    assert not isinstance(result, Exception), result
    assert result.confirmed and Order.objects.filter(pk=result.order_id).exists(), result
    assert took < config["ACQUIRE_TIMEOUT_MS"] / 1000 + 1.0, took
