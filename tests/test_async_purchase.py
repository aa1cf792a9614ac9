"""The purchase on an event loop (``inventory.async_purchase``), in-process against real PostgreSQL
and Redis: the asyncio lock awaited on a loop, the section on the ORM threads, the same outcomes as
the sync purchase; a holder paused past its lease refused by the fence, beside a WSGI shopper of the
same sale (tests/test_matrix.py advances a forgotten fence from an ORM thread through the loop's lock)."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
import warnings
from collections import Counter

import pytest
from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured

from inventory import async_purchase
from inventory.async_purchase import apurchase, loop_refusal, on_thread
from inventory.audit import audit
from inventory.batched import combiners_of
from inventory.errors import InvalidQuantity, ProductNotFound
from inventory.models import Order, Product
from inventory.services import prepare, purchase, reset_sale, section_of
from inventory.strategies import get_strategy, load_strategy, reset_strategy, strategy_class
from tests.helpers import (
    WORKING_STRATEGIES,
    bought_on_a_loop,
    purchases_queued,
    row_locked_elsewhere,
    run_on_a_loop,
    waiting_for_a_row_lock_is,
)
from tests.test_matrix import PAUSED_HOLDER_LOCKS, PausingRedis, PausingRedlock, holder_ttl_ms

pytestmark = pytest.mark.django_db(transaction=True)

ON_LOOP = [name for name in WORKING_STRATEGIES if not strategy_class(name).loop_refusal]


def buy(**kwargs):
    """One purchase on a fresh event loop, as a uvicorn worker would await it."""
    return bought_on_a_loop(**kwargs)


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


@pytest.mark.parametrize("lock", PAUSED_HOLDER_LOCKS)
def test_a_loop_holder_paused_past_its_lease_is_refused_by_the_fence(lock, settings, use_strategy, make_product):
    """The article's pause under ASGI: A, on an event loop, holds the asyncio lock (a short TTL,
    :func:`tests.test_matrix.holder_ttl_ms`), reads stock 1 and pauses; B, a WSGI shopper of the
    same sale (the sync twin, the same keys), takes the expired lock, buys the unit and commits;
    then A wakes and writes: refused, busy."""
    use_strategy(lock, LOCK_TTL_MS=holder_ttl_ms(lock), ACQUIRE_TIMEOUT_MS=30_000)
    make_product(stock=1)
    holder = (PausingRedis if lock == "redis" else PausingRedlock)(config=settings.INVENTORY)
    holder.resume, holder.paused = threading.Event(), threading.Event()
    resume, results = holder.resume, {}

    def shopper_a():
        try:
            results["a"] = buy(sku="phone-x", customer="a", quantity=1, strategy=holder)
        except Exception as exc:  # said by the assertion below, not lost in the thread
            results["a"] = exc

    thread = threading.Thread(target=shopper_a)
    thread.start()
    assert holder.wait_paused(thread, 10), f"A never paused in its section; it was answered {results.get('a')!r}"
    other = load_strategy(lock)
    results["b"] = purchase(sku="phone-x", customer="b", quantity=1, strategy=other)
    resume.set()  # A wakes only after B has committed
    thread.join(10)
    other.close()
    assert results["b"].confirmed, "B got the lock once A's lease ran out"
    assert results["a"].outcome.value == "busy" and results["a"].conflicts == 1
    assert audit(sku="phone-x").ok and Order.objects.count() == 1


LOOP_BATCHED = ["db", "redis", "atomic", "redis-stock"]


async def until(condition, what: str, timeout_s: float = 10.0) -> None:
    """Poll the awaitable ``condition()`` on the loop until it is true; fail after ``timeout_s``."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await condition():
        assert asyncio.get_running_loop().time() < deadline, f"gave up waiting: {what}"
        await asyncio.sleep(0.01)


async def release_once_queued(release) -> None:
    """With the first purchase's section waiting on the row (locked elsewhere), wait until the
    ``ASGI_DB_THREADS - 1`` others admitted after it are queued, then let go of the row (``release``):
    the next section serves them all (``db``'s first, which they join)."""
    behind = django_settings.ASGI_DB_THREADS - 1

    async def queued() -> bool:
        return await asyncio.to_thread(purchases_queued, "hot") >= behind

    await until(queued, f"{behind} purchases queued behind the section on the row", 5.0)
    release()


def loop_sale(count: int, *, hang_up_every: int = 0, release=None) -> tuple[Counter, Counter]:
    """``count`` purchases as tasks of one event loop (BATCH from the settings), 30 customers (limit 1);
    with ``hang_up_every``, every n-th shopper's task is cancelled, one after another over the first
    50 ms (Django cancels the view of a client that hangs up); with ``release`` (the row is locked
    elsewhere), the others start once the first task's section waits on the row, and the row is let
    go as :func:`release_once_queued` says.
    Their outcomes ("hung up": the cancelled) and the batch sizes they were served in."""
    outcomes, sizes = Counter(), Counter()

    async def shopper(number: int) -> None:
        result = await apurchase(sku="hot", customer=f"c{number % 30}", quantity=1, idempotency_key=f"k{number}")
        outcomes[result.outcome.value] += 1
        sizes[result.timings.batch] += 1

    async def sale() -> None:
        tasks = [asyncio.create_task(shopper(0))]
        if release is not None:
            await until(lambda: on_thread(waiting_for_a_row_lock_is, 1), "the first section waiting on the row", 5.0)
        tasks += [asyncio.create_task(shopper(number)) for number in range(1, count)]
        if release is not None:
            await release_once_queued(release)
        # The hang-ups spread over the sale's first 50 ms: queued, leading, holding the guard. (Over
        # 200 ms, a machine that sold out within 40 ms saw 4 of 20 land before their answers.)
        hang_ups = [task for number, task in enumerate(tasks) if hang_up_every and number % hang_up_every == 0]
        for task in hang_ups:
            await asyncio.sleep(0.05 / len(hang_ups))
            task.cancel()
        done = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 60)
        assert all(isinstance(one, asyncio.CancelledError) or one is None for one in done), done
        outcomes["hung up"] = sum(isinstance(one, asyncio.CancelledError) for one in done)
        await asyncio.sleep(0.5)  # the hung-up purchases run to their end (shielded) before the loop closes

    run_on_a_loop(sale())
    return outcomes, sizes


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "queue"), [(name, "local") for name in LOOP_BATCHED] + [("db", "shared"), ("redis", "shared")]
)
def test_tasks_of_one_loop_share_sections_and_never_oversell(name, queue, use_strategy, make_product, settings):
    """60 purchases as tasks of one loop (BATCH 8, ASGI_DB_THREADS 4 admitted at a time) for 30
    customers from 20 units: they queue on the loop's combiner (or the SKU's Redis list, awaited),
    holding no thread while they wait.

    The first one's section waits on the row, locked elsewhere until the three admitted after it are
    queued: the next section serves all three (``db``'s first, which they join, four). Left to the
    tasks' timing, whether any section served two was the scheduler's choice (each purchase through
    before the next one queues is a schedule a loaded machine may run)."""
    # Both waits outlast the hold (at most 10 s), so nobody is told busy for it.
    options = {**settings.INVENTORY["OPTIONS"], "BATCH": 8, "QUEUE": queue}
    use_strategy(name, ACQUIRE_TIMEOUT_MS=15_000, ROW_LOCK_TIMEOUT_MS=15_000, OPTIONS=options)
    product = make_product("hot", stock=20)
    with row_locked_elsewhere(product.pk) as release:
        outcomes, sizes = loop_sale(60, release=release)
    assert outcomes["confirmed"] == 20 and sum(outcomes.values()) == 60 and not outcomes["hung up"], outcomes
    largest, behind = max(size or 0 for size in sizes), settings.ASGI_DB_THREADS - 1
    assert largest > 1 and largest >= behind, f"no section served the {behind} queued behind the first: {sizes}"
    report = audit(sku="hot", told_sold_out=outcomes["sold_out"])
    assert report.ok and report.stock == 0 and report.oversold == 0 and report.over_limit_customers == 0
    assert all(combiner.idle for combiner in combiners_of(get_strategy()).values())
    reset_sale(sku="hot", stock=0)


@pytest.mark.slow
@pytest.mark.parametrize("batch", [1, 8])
def test_a_shopper_who_hangs_up_leaves_the_sale_whole(batch, use_strategy, make_product, settings):
    """Every third task is cancelled during the sale: each cancelled purchase still runs to its end
    (its section never outlives its guard; a queue never loses its leader), so the sale sells
    its 20 units, every answered shopper was answered, and a later shopper is served at once."""
    use_strategy("redis", ACQUIRE_TIMEOUT_MS=5_000, OPTIONS={**settings.INVENTORY["OPTIONS"], "BATCH": batch})
    make_product("hot", stock=20)
    outcomes, _ = loop_sale(60, hang_up_every=3)
    assert sum(outcomes.values()) == 60 and outcomes["hung up"] >= 10 and outcomes["busy"] == 0, outcomes
    assert Product.objects.get(sku="hot").stock == 0
    assert audit(sku="hot").ok and Order.objects.count() == 20
    assert all(combiner.idle for combiner in combiners_of(get_strategy()).values())
    reset_sale(sku="hot", stock=0)


def test_on_the_loop_purchases_queued_while_the_row_read_waits_join_its_batch(use_strategy, make_product, settings):
    """The ASGI twin of tests/test_batching.py's join: ``db``'s batch read waits for the row lock on
    an ORM thread, and the purchases that queued on the loop meanwhile join its batch (the take hops
    back to the loop). Before, ann's section served ann alone."""
    use_strategy("db", OPTIONS={**settings.INVENTORY["OPTIONS"], "BATCH": 8})
    product = make_product("hot", stock=10, limit=1)

    async def sale() -> list:
        first = asyncio.create_task(apurchase(sku="hot", customer="ann", quantity=1, idempotency_key="k-ann"))
        await until(lambda: on_thread(waiting_for_a_row_lock_is, 1), "ann's batch read waiting for the row lock")
        others = [
            asyncio.create_task(apurchase(sku="hot", customer=name, quantity=1, idempotency_key=f"k-{name}"))
            for name in ("bob", "cat", "dan")
        ]
        combiner = combiners_of(get_strategy())["hot"]

        async def queued() -> bool:
            return len(combiner._queue) == 3

        await until(queued, "three purchases queued behind ann's section")
        release()
        return await asyncio.wait_for(asyncio.gather(first, *others), 10)

    with row_locked_elsewhere(product.pk) as release:
        results = run_on_a_loop(sale())
    assert [result.timings.batch for result in results] == [4, 4, 4, 4]
    assert all(result.confirmed for result in results)
    assert Product.objects.get(pk=product.pk).stock == 6 and audit(sku="hot").ok


def test_on_the_loop_a_leader_lingers_for_company_only_after_a_batch_that_had_it(use_strategy, make_product, settings):
    """The ASGI twin of tests/test_batching.py's linger: after a batch with company the leader
    awaits ``BATCH_LINGER_MS`` on the loop (holding no thread), and the tasks that queue meanwhile
    share its section, which starts once they are as many as that batch, well before the linger's
    end; a purchase alone on a fresh queue does not wait."""
    use_strategy("atomic", OPTIONS={**settings.INVENTORY["OPTIONS"], "BATCH": 8, "BATCH_LINGER_MS": 1_000})
    product = make_product("hot", stock=10)

    async def sale() -> tuple:
        loop = asyncio.get_running_loop()
        started = loop.time()
        alone = await apurchase(sku="hot", customer="ann", quantity=1)
        alone_s = loop.time() - started
        combiner = combiners_of(get_strategy())["hot"]
        combiner.note_batch(3)  # as after a batch of three (tests/test_batching.py makes one of two)
        first = asyncio.create_task(apurchase(sku="hot", customer="eve", quantity=1))
        for _ in range(100):
            await asyncio.sleep(0.01)
            if len(combiner._queue) == 1:
                break
        others = [asyncio.create_task(apurchase(sku="hot", customer=name, quantity=1)) for name in ("fay", "gus")]
        return alone, alone_s, await asyncio.wait_for(asyncio.gather(first, *others), 10)

    alone, alone_s, results = run_on_a_loop(sale())
    assert alone.confirmed and alone.timings.batch == 1 and alone_s < 0.9, "a purchase alone waited for company"
    assert [result.timings.batch for result in results] == [3, 3, 3]
    assert results[0].timings.queue_wait_ms < 900, "the linger went on after gus made three"
    assert all(result.confirmed for result in results)
    assert Product.objects.get(pk=product.pk).stock == 6 and audit(sku="hot").ok


@pytest.mark.parametrize("fenced", [True, False])
def test_a_hold_cancelled_while_its_section_runs_on_is_refused_by_the_fence(
    fenced, settings, use_strategy, make_product
):
    """Sound (kept): the task holding the guard is cancelled while its section runs on an ORM thread
    (what ``apurchase``'s shield prevents; code awaiting ``aguard`` without it): the cancellation
    releases the lock at once (TTL 10 s) though the section runs on; B takes it, buys the unit and
    commits; then A's section writes from its stale read. Fenced: refused, busy, one order. Unfenced:
    two orders for one unit (the test reaches the race)."""
    use_strategy("redis", LOCK_TTL_MS=10_000, ACQUIRE_TIMEOUT_MS=2_000, OPTIONS={"FENCED": fenced})
    make_product(stock=1)
    holder = PausingRedis(config=settings.INVENTORY)
    holder.resume, holder.paused = threading.Event(), threading.Event()
    resume, results, done = holder.resume, {}, threading.Event()

    def section(strategy, grant, ready) -> None:
        try:
            results["a"] = section_of(strategy, grant, ready)
        except Exception as exc:  # said by the assertion below, not lost in the thread
            results["a"] = exc
        finally:
            done.set()

    async def hold() -> None:
        ready = await on_thread(prepare, holder, sku="phone-x", customer="a", quantity=1, idempotency_key="")
        async with holder.aguard(ready.sku) as grant:
            await on_thread(section, holder, grant, ready)

    async def scenario() -> None:
        task = asyncio.ensure_future(hold())
        assert await asyncio.to_thread(holder.paused.wait, 10), "A never paused in its section"
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        other = load_strategy("redis")
        started = time.monotonic()
        results["b"] = await on_thread(purchase, sku="phone-x", customer="b", quantity=1, strategy=other)
        results["b waited"] = time.monotonic() - started
        other.close()
        resume.set()  # A's section wakes only after B has committed
        assert await asyncio.to_thread(done.wait, 10), "A's section never ended"

    run_on_a_loop(scenario())
    assert results["b"].confirmed and results["b waited"] < 3.0, results  # released at once, not at the 10 s TTL
    if fenced:
        assert (results["a"].outcome.value, results["a"].conflicts) == ("busy", 1), results
        assert audit(sku="phone-x").ok and Order.objects.count() == 1
    else:
        assert results["a"].confirmed, results
        assert Order.objects.count() == 2  # one unit, two orders: the late write the fence refuses


def unclosed(caught: list) -> list[str]:
    """The ResourceWarnings among ``caught``: a connection or transport garbage-collected open."""
    return [str(warning.message) for warning in caught if issubclass(warning.category, ResourceWarning)]


@pytest.mark.parametrize(
    "name, options", [("redis", {}), ("redlock", {}), ("atomic", {"BATCH": 4, "QUEUE": "shared"})], ids=str
)
def test_a_loop_closes_every_connection_its_purchases_opened(name, options, use_strategy, make_product, settings):
    """Seen by a helper (2026-12-05): nothing closed the asyncio connections a loop's purchases
    opened (the locks', a shared queue's client): a worker's loop that ended left them open, and a
    strategy replaced while its loop ran dropped its own, open. Two loops, one after the other, as a
    worker's: each buys, has its strategy replaced (a settings change) and buys again, then awaits
    ``aclose_loop()`` (its lifespan's shutdown): no connection is ever collected open."""
    use_strategy(name, OPTIONS={**settings.INVENTORY["OPTIONS"], **options})
    make_product(stock=4, limit=1)

    async def worker_s_loop(first: str, then: str) -> None:
        assert (await apurchase(sku="phone-x", customer=first, quantity=1)).confirmed
        reset_strategy()
        gc.collect()
        assert unclosed(caught) == [], "the replaced strategy's connections were collected open"
        assert (await apurchase(sku="phone-x", customer=then, quantity=1)).confirmed
        await async_purchase.aclose_loop()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        asyncio.run(worker_s_loop("a", "b"))
        asyncio.run(worker_s_loop("c", "d"))
        gc.collect()
    assert unclosed(caught) == []
    assert Order.objects.count() == 4 and audit(sku="phone-x").ok
