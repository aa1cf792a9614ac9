"""The ``zookeeper`` strategy against a real 3-member ZooKeeper ensemble and real PostgreSQL.

The ensemble listens on the slot's ports +143..+145 (quorum +153..+155, election +163..+165),
the suite's ZOOKEEPER_HOSTS: started here unless it runs, and stopped at the end of the module
if it was; before and after each test every member is up and serving.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection
from kazoo.client import KazooClient

from inventory.audit import audit
from inventory.models import Order, Product
from inventory.services import purchase
from inventory.strategies.statements import checked_update
from inventory.strategies.zookeeper import ZooKeeperLockStrategy
from processes.needs import processes_for, project_ensemble
from tests import slots

pytestmark = pytest.mark.django_db(transaction=True)

HOSTS = [f"127.0.0.1:{slots.ZOOKEEPER_BASE_PORT + i}" for i in range(3)]
SESSION_MS = 2_000


@pytest.fixture(scope="module")
def ensemble():
    ensemble = project_ensemble(HOSTS)
    started = not ensemble.running()
    ensemble.start()
    yield ensemble
    if started:
        ensemble.stop()


@pytest.fixture
def config(settings, ensemble):
    ensemble.reset()
    yield {**settings.INVENTORY, "ZOOKEEPER_HOSTS": HOSTS, "LOCK_TTL_MS": SESSION_MS, "ACQUIRE_TIMEOUT_MS": 3_000}
    ensemble.reset()


def end_session_elsewhere(strategy: ZooKeeperLockStrategy) -> None:
    """Close ``strategy``'s session from a second connection with its id and password: the ensemble
    ends it and deletes its znodes, as it does when a frozen holder's session times out."""
    session_id, password = strategy.client.session_credentials()
    twin = KazooClient(hosts=",".join(HOSTS), client_id=(session_id, password))
    twin.start(timeout=5)
    twin.stop()
    twin.close()


def test_the_strategy_describes_its_ensemble(config, ensemble):
    [process] = processes_for(ZooKeeperLockStrategy.needs(config))
    assert process.hosts == HOSTS and process.startable and process.running()
    assert ZooKeeperLockStrategy.server_env(config) == {"ZOOKEEPER_HOSTS": ",".join(HOSTS)}
    assert ZooKeeperLockStrategy.checks(config) == []
    assert [m.id for m in ZooKeeperLockStrategy.checks({**config, "ZOOKEEPER_HOSTS": HOSTS[:2]})] == ["inventory.W005"]


def test_threads_buying_at_once_sell_exactly_the_stock(config, make_product):
    make_product(sku="hot", stock=12, limit=1)
    strategy = ZooKeeperLockStrategy(config=config)
    outcomes: Counter[str] = Counter()
    fences: list[int] = []
    guard = threading.Lock()

    def shopper(index: int) -> None:
        try:
            for k in range(4):
                result = purchase(sku="hot", customer=f"t{index}-c{k}", quantity=1, strategy=strategy)
                with guard:
                    outcomes[result.outcome.value] += 1
                    outcomes["conflicts"] += result.conflicts
                    if result.confirmed:
                        fences.append(result.fence)
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
    assert len(set(fences)) == 12 and Product.objects.get(sku="hot").fence == max(fences)
    assert audit(sku="hot").ok and Product.objects.get(sku="hot").stock == 0


class SessionEndsAfterRead(ZooKeeperLockStrategy):
    """The first section reads, then its session ends (as when the process froze past the session
    timeout) and the next shopper buys; then the section goes on to write."""

    def read_section(self, product_id, **kwargs):
        read = super().read_section(product_id, **kwargs)
        if not self.done.is_set():
            end_session_elsewhere(self)
            self.session_ended.set()
            assert self.other_bought.wait(60)
            self.done.set()
        return read


class WritesWithoutAsking(SessionEndsAfterRead):
    """A write that gets past the session check (the loss not yet known to the holder)."""

    def stock_update(self, shelf, *, quantity, grant):
        return checked_update(shelf, quantity=quantity, token=grant.token, fenced=self.fenced)


@pytest.mark.parametrize("holder_class", [SessionEndsAfterRead, WritesWithoutAsking])
def test_a_holder_whose_session_ended_is_stopped_or_refused(config, make_product, holder_class):
    make_product(stock=1)
    holder = holder_class(config=config)
    holder.session_ended, holder.other_bought, holder.done = threading.Event(), threading.Event(), threading.Event()
    results = {}

    def shopper_a():
        try:
            results["a"] = purchase(sku="phone-x", customer="a", quantity=1, strategy=holder)
        finally:
            connection.close()

    thread = threading.Thread(target=shopper_a)
    thread.start()
    assert holder.session_ended.wait(10)
    # A stays inside its section until B has its answer, so B can only have bought because A's
    # session ended (B may wait long: a loaded machine cannot make that look like A's release).
    other = ZooKeeperLockStrategy(config={**config, "ACQUIRE_TIMEOUT_MS": 30_000})
    results["b"] = purchase(sku="phone-x", customer="b", quantity=1, strategy=other)
    holder.other_bought.set()
    thread.join(10)
    holder.close()
    other.close()
    assert results["b"].confirmed, "B got the lock once A's session ended, A still in its section"
    assert results["a"].outcome.value == "busy"
    # The session check stops A before its write; a write that got past it is refused by the fence.
    assert results["a"].conflicts == (1 if holder_class is WritesWithoutAsking else 0)
    product = Product.objects.get(sku="phone-x")
    assert audit(sku="phone-x").ok and Order.objects.count() == 1 and product.fence == results["b"].fence


@pytest.mark.slow
def test_follower_then_leader_killed_then_both_back(config, ensemble, make_product):
    make_product(stock=50, limit=1)
    strategy = ZooKeeperLockStrategy(config=config)
    fences = [purchase(sku="phone-x", customer="warm", quantity=1, strategy=strategy).fence]
    leader = ensemble.leader()
    follower = next(member for member in ensemble if member is not leader)
    follower.kill()
    for i in range(5):
        result = purchase(sku="phone-x", customer=f"f{i}", quantity=1, strategy=strategy)
        assert result.confirmed, result
        fences.append(result.fence)
    assert fences == sorted(set(fences)), "grants go on with growing fences while one member is down"
    leader.kill()
    before = (Product.objects.get(sku="phone-x").stock, Order.objects.count())
    started = time.monotonic()
    result = purchase(sku="phone-x", customer="late", quantity=1, strategy=strategy)
    assert result.outcome.value == "busy"
    assert time.monotonic() - started < config["ACQUIRE_TIMEOUT_MS"] / 1000 + 1.0
    assert (Product.objects.get(sku="phone-x").stock, Order.objects.count()) == before
    follower.start()
    leader.start()
    ensemble.reset()
    result = purchase(sku="phone-x", customer="back", quantity=1, strategy=strategy)
    strategy.close()
    assert result.confirmed and result.fence > fences[-1]
    assert audit(sku="phone-x").ok and Product.objects.get(sku="phone-x").stock == 50 - 7


def test_simulate_pause_with_zookeeper_holds_every_step(config, settings):
    settings.INVENTORY = config
    out = StringIO()
    call_command("simulate_pause", strategy="zookeeper", stdout=out)
    text = out.getvalue()
    assert "FAIL" not in text and "every step held (zookeeper)" in text
    assert "A's release is ignored (NotOwned)" in text and "A writes with stale fence" in text
    product = Product.objects.get(sku="simulate-pause")
    assert product.stock == product.initial_stock - 1 and product.fence > 0


# It kills every member of its own ensemble: make test runs it, not make check.
@pytest.mark.slow
@pytest.mark.parametrize("warm", [True, False], ids=["warm", "cold"])
def test_whole_ensemble_down_answers_busy_within_the_timeout_and_changes_nothing(config, ensemble, make_product, warm):
    """Every member down, with the strategy's session made before (warm) or not yet (cold): busy
    within the acquire timeout, never a 500, nothing written."""
    from tests.helpers import bought_with_the_service_down

    make_product(stock=5)
    strategy = ZooKeeperLockStrategy(config=config)
    result, took, before, after = bought_with_the_service_down(strategy, ensemble, warm=warm)
    assert result.outcome.value == "busy"
    assert took < config["ACQUIRE_TIMEOUT_MS"] / 1000 + 1.0, took
    assert after == before


@pytest.mark.slow
def test_the_ensemble_down_while_a_holder_writes_leaves_its_order_confirmed(config, ensemble, make_product):
    """Every member dies while a holder's write waits for the row: the write commits, its release
    cannot reach ZooKeeper, and the shopper is told confirmed (the order stands), within the timeouts."""
    from tests.helpers import bought_while_the_service_dies

    product = make_product(stock=5)
    strategy = ZooKeeperLockStrategy(config=config)
    result, took, alive = bought_while_the_service_dies(strategy, ensemble, product.pk)
    strategy.close()
    assert not alive
    assert not isinstance(result, Exception), result
    assert result.confirmed and Order.objects.filter(pk=result.order_id).exists(), result
    assert took < config["ACQUIRE_TIMEOUT_MS"] / 1000 + 1.0, took


@pytest.mark.slow
@pytest.mark.parametrize("down", [0, 1, 2])
def test_one_member_down_the_sale_goes_on(config, ensemble, make_product, down):
    """Any one member down, the first host too: the two left are a majority, and purchases are
    confirmed with growing fences, by a session made before the kill and by one made after."""
    make_product(stock=5)
    warm = ZooKeeperLockStrategy(config=config)
    first = purchase(sku="phone-x", customer="warm", quantity=1, strategy=warm)
    list(ensemble)[down].kill()
    cold = ZooKeeperLockStrategy(config=config)
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
