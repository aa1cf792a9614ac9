"""Combining (BATCH > 1): a batch decides exactly what its purchases one at a time would, in real PostgreSQL.

The semantics test runs the same purchases twice from the same state, once as one batch section
and once as sequential sections, and compares every outcome and the final rows.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from datetime import timedelta

import pytest
from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
from django.utils import timezone
from hypothesis import HealthCheck, assume, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from inventory import soldout, soldout_local
from inventory.audit import audit
from inventory.batched import combiners_of, pooled_connection_back, run_batch
from inventory.models import Allocation, Order, Product
from inventory.results import Timings
from inventory.services import purchase, reset_sale
from inventory.strategies import get_strategy, load_strategy
from inventory.strategies.batch import Ask
from inventory.strategies.contract import NO_GRANT, Outcome
from inventory.strategies.redis_stock import forget_sale
from inventory.strategies.section import read_shelf
from tests.helpers import purchases_queued, refusing_trigger, row_locked_elsewhere, waiting_for_a_row_lock_is

CUSTOMERS = ["ann", "bob", "cat"]
KEYS = ["", "", "k1", "k2"]

asks = st.lists(
    st.builds(Ask, st.sampled_from(CUSTOMERS), st.integers(1, 3), st.sampled_from(KEYS)), min_size=1, max_size=12
)


def state(product_id: int) -> tuple:
    """What a sale's rows say: stock, units per customer, orders as (customer, quantity, key)."""
    product = Product.objects.get(pk=product_id)
    units = dict(Allocation.objects.filter(product_id=product_id).values_list("customer", "units"))
    orders = sorted(Order.objects.filter(product_id=product_id).values_list("customer", "quantity", "idempotency_key"))
    return product.stock, units, orders


def described(attempts, before: set[int]) -> list[tuple]:
    """Outcomes comparable across runs: an order is named by its (customer, key) or as new."""
    out = []
    for attempt in attempts:
        if attempt.order is not None:
            old = attempt.order.pk in before
            out.append(("order", attempt.order.customer, attempt.order.quantity, attempt.order.idempotency_key, old))
        else:
            out.append(("refused", attempt.refusal.outcome, attempt.refusal.units_left))
    return out


def rolled_back(run):
    """Run ``run()`` in a savepoint that is then rolled back; its result."""
    with transaction.atomic():
        result = run()
        transaction.set_rollback(True)
    return result


@pytest.mark.django_db
@pytest.mark.parametrize("backend", ["db", "atomic", "redis-stock"])
@hypothesis_settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    history=st.lists(st.builds(Ask, st.sampled_from(CUSTOMERS), st.just(1), st.sampled_from(KEYS)), max_size=3),
    batch=asks,
    stock=st.integers(0, 8),
    limit=st.integers(1, 4),
    window=st.sampled_from(["open", "upcoming", "ended"]),
)
def test_a_batch_decides_what_its_purchases_one_at_a_time_would(backend, history, batch, stock, limit, window):
    now = timezone.now()
    edges = {
        "open": {"sale_starts_at": now - timedelta(hours=1), "sale_ends_at": now + timedelta(hours=1)},
        "upcoming": {"sale_starts_at": now + timedelta(hours=1)},
        "ended": {"sale_ends_at": now - timedelta(seconds=1)},
    }[window]
    # atomic's single statement refuses past the limit before it looks at the window (both are
    # refusals; a purchase outside the window is answered by the plain read before any strategy runs).
    assume(backend != "atomic" or window == "open")
    strategy = load_strategy(backend)
    batch = [Ask(a.customer, min(a.quantity, limit), a.key) for a in batch]

    def scene():
        forget_sale(soldout.client(), "sem", units_too=True)  # redis-stock's counter: loaded from the rows
        product = Product.objects.create(
            sku="sem", name="Sem", price=1, initial_stock=stock + 3, stock=stock + 3, per_customer_limit=limit
        )
        for ask in history:  # the sale before the batch (open then), keys included
            strategy.attempt(product_id=product.pk, grant=NO_GRANT, **vars(ask))
        Product.objects.filter(pk=product.pk).update(stock=stock, **edges)
        forget_sale(soldout.client(), "sem", units_too=True)
        return product.pk, set(Order.objects.filter(product_id=product.pk).values_list("pk", flat=True))

    def batched():
        product_id, before = scene()
        attempt = strategy.attempt_batch(product_id=product_id, asks=batch, grant=NO_GRANT)
        return described(attempt.attempts, before), state(product_id)

    def sequential():
        product_id, before = scene()
        attempts = [strategy.attempt(product_id=product_id, grant=NO_GRANT, **vars(a)) for a in batch]
        return described(attempts, before), state(product_id)

    assert rolled_back(batched) == rolled_back(sequential)
    strategy.close()


@pytest.mark.django_db
def test_the_sale_window_edge_is_the_same_for_a_batch(make_product):
    """The end of the window is exclusive and its start inclusive, for every purchase of a batch."""
    from inventory.strategies.batch import decide_batch

    now = timezone.now()
    product = make_product("edge", stock=5, limit=5)
    shelf = read_shelf(product.pk)
    ending = decide_batch(
        shelf.__class__(**{**vars(shelf), "sale_ends_at": now}), [Ask("a", 1)], held={}, orders={}, now=now
    )
    starting = decide_batch(
        shelf.__class__(**{**vars(shelf), "sale_starts_at": now}),
        [Ask("a", 1), Ask("b", 1)],
        held={},
        orders={},
        now=now,
    )
    assert [v.refusal.outcome for v in ending] == [Outcome.NOT_ON_SALE]
    assert [v.sell for v in starting] == [True, True]


@pytest.mark.django_db
def test_batch_1_bypasses_the_combiner(use_strategy, make_product):
    use_strategy("db")
    make_product("solo", stock=3)
    result = purchase(sku="solo", customer="ann", quantity=1)
    assert get_strategy().batch == 1
    assert result.confirmed and result.timings.batch == 1 and result.timings.queue_wait_ms is None
    assert combiners_of(get_strategy()) == {}, "BATCH=1 made a queue"


@pytest.mark.django_db
def test_a_bad_batch_option_is_refused(use_strategy):
    from django.core.exceptions import ImproperlyConfigured

    for bad in (0, -3, "8", True):
        with pytest.raises(ImproperlyConfigured, match="INVENTORY_BATCH"):
            load_strategy("db", config={"OPTIONS": {"BATCH": bad}})
    for bad in ("redis", "", None):
        with pytest.raises(ImproperlyConfigured, match="INVENTORY_QUEUE"):
            load_strategy("db", config={"OPTIONS": {"QUEUE": bad}})
    for bad in (-1, 1001, "20", True, 2.5):
        with pytest.raises(ImproperlyConfigured, match="INVENTORY_BATCH_LINGER_MS"):
            load_strategy("atomic", config={"OPTIONS": {"BATCH_LINGER_MS": bad}})
    assert load_strategy("atomic", config={"OPTIONS": {"BATCH_LINGER_MS": 0}}).linger_s == 0
    assert load_strategy("atomic", config={"OPTIONS": {"BATCH_LINGER_MS": 20}}).linger_s == 0.02


REFUSE_BOB, _ = refusing_trigger("refuse_bob", table="inventory_allocation")


@pytest.mark.django_db
def test_one_bad_purchase_never_fails_the_others(make_product):
    """A constraint refuses bob's units (a trigger in PostgreSQL): the bulk write aborts, the batch
    runs again one purchase per savepoint, and only bob is refused."""
    product = make_product("bad", stock=5, limit=2)
    with connection.cursor() as cursor:
        cursor.execute(REFUSE_BOB)
    results = run_batch(
        load_strategy("db"),
        NO_GRANT,
        product_id=product.pk,
        asks=[Ask("ann", 1), Ask("bob", 1), Ask("cat", 2)],
        timings=Timings(),
    )
    assert [r.outcome for r in results] == [Outcome.CONFIRMED, Outcome.LIMIT_REACHED, Outcome.CONFIRMED]
    assert [r.constraint_hits for r in results] == [0, 1, 0]
    assert state(product.pk) == (2, {"ann": 1, "cat": 2}, [("ann", 1, ""), ("cat", 2, "")])


REFUSE_BOB_UNKNOWN, _ = refusing_trigger("refuse_bob", table="inventory_allocation", constraint="a_rule_nobody_mapped")


@pytest.mark.django_db
def test_a_committed_batch_answers_every_purchase_truly(make_product):
    """A constraint no outcome is mapped for refuses bob with a savepoint per purchase, after ann's and cat's
    orders are written: the batch commits, so ann and cat are confirmed with their orders and only
    bob, of whom nothing was written, is told busy. Building the answers must not fail the batch."""
    product = make_product("bad", stock=5, limit=2)
    with connection.cursor() as cursor:
        cursor.execute(REFUSE_BOB_UNKNOWN)
    results = run_batch(
        load_strategy("db"),
        NO_GRANT,
        product_id=product.pk,
        asks=[Ask("ann", 1), Ask("bob", 1), Ask("cat", 2)],
        timings=Timings(),
    )
    assert [r.outcome for r in results] == [Outcome.CONFIRMED, Outcome.BUSY, Outcome.CONFIRMED]
    orders = dict(Order.objects.filter(product=product).values_list("customer", "pk"))
    assert [results[0].order_id, results[2].order_id] == [orders["ann"], orders["cat"]]
    assert state(product.pk) == (2, {"ann": 1, "cat": 2}, [("ann", 1, ""), ("cat", 2, "")])


BATCHED = ["db", "optimistic", "redis", "redlock", "etcd", "atomic", "redis-stock"]


#: The shared queue (QUEUE=shared, a Redis list per SKU) with a guard of each kind: a row lock, a
#: Redis lock, a quorum, and none.
SHARED = ["db", "optimistic", "redis", "redlock", "atomic"]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("backend", "queue"), [(name, "local") for name in BATCHED] + [(name, "shared") for name in SHARED]
)
def test_threads_share_sections_and_never_oversell(backend, queue, use_strategy, make_product, settings):
    """24 threads of one process buy 60 times for 30 customers (limit 1) from 20 units, BATCH=8,
    queued in the process or in Redis.

    The row is locked elsewhere until 16 of the first 24 purchases wait in the queue: the first
    section, which waits on the row, took at most 8, so the next one serves 8. Left to the threads'
    timing, whether any section served two was the scheduler's choice (one purchase through before the
    next one queues is a schedule a loaded machine may run)."""
    # Both waits outlast the hold (at most 5 s), so nobody is told busy for it.
    options = {**settings.INVENTORY["OPTIONS"], "BATCH": 8, "QUEUE": queue}
    use_strategy(backend, ACQUIRE_TIMEOUT_MS=10_000, ROW_LOCK_TIMEOUT_MS=10_000, OPTIONS=options)
    product = make_product("hot", stock=20)
    outcomes, sizes = Counter(), Counter()
    guard, start = threading.Lock(), threading.Barrier(24)

    def shopper(index: int) -> None:
        start.wait()
        try:
            for round_number in range(60 // 24 + 1):
                number = index + 24 * round_number
                if number >= 60:
                    return
                result = purchase(sku="hot", customer=f"c{number % 30}", quantity=1, idempotency_key=f"k{number}")
                with guard:
                    outcomes[result.outcome.value] += 1
                    sizes[result.timings.batch] += 1
        finally:
            connection.close()

    threads = [threading.Thread(target=shopper, args=(i,)) for i in range(24)]
    with row_locked_elsewhere(product.pk):
        for thread in threads:
            thread.start()
        _until(lambda: purchases_queued("hot") >= 16, "16 purchases queued behind the section on the row", 5.0)
    for thread in threads:
        thread.join()
    assert outcomes["confirmed"] == 20
    assert sum(outcomes.values()) == 60
    assert max(size or 0 for size in sizes) == 8, f"no section served BATCH (8) purchases: {sizes}"
    report = audit(sku="hot", told_sold_out=outcomes["sold_out"])
    assert report.ok and report.stock == 0 and report.oversold == 0 and report.over_limit_customers == 0
    reset_sale(sku="hot", stock=0)


def _until(condition, what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting: {what}"
        time.sleep(0.01)


@pytest.mark.django_db(transaction=True)
def test_purchases_queued_while_the_row_read_waits_join_its_batch(use_strategy, make_product, settings, monkeypatch):
    """``db``'s batch read waits for the row lock inside the section: what queues meanwhile joins
    that batch (one section for all), with its customers' units and keyed orders read under the
    lock. Before, the batch was fixed before the read waited: ann's section served ann alone."""
    use_strategy("db", OPTIONS={**settings.INVENTORY["OPTIONS"], "BATCH": 8})
    # dan's resend must reach the queue: with the row this process read kept in memory (2 s, which a
    # loaded machine can pass before his thread starts), no plain read answers it with its order.
    monkeypatch.setattr(soldout_local, "MARK_TTL_S", 60.0)
    product = make_product("hot", stock=10, limit=1)
    earlier = purchase(sku="hot", customer="dan", quantity=1, idempotency_key="k-dan")  # dan's resend replays it
    purchase(sku="hot", customer="eve", quantity=1, idempotency_key="k-eve-1")  # eve is at her limit
    results: dict[str, object] = {}

    def shopper(customer: str, key: str) -> None:
        try:
            results[customer] = purchase(sku="hot", customer=customer, quantity=1, idempotency_key=key)
        finally:
            connection.close()

    threads = []
    with row_locked_elsewhere(product.pk):
        threads.append(threading.Thread(target=shopper, args=("ann", "k-ann")))
        threads[-1].start()
        _until(lambda: waiting_for_a_row_lock_is(1), "ann's batch read waiting for the row lock")
        for customer, key in [("bob", "k-bob"), ("cat", "k-cat"), ("dan", "k-dan"), ("eve", "k-eve-2")]:
            threads.append(threading.Thread(target=shopper, args=(customer, key)))
            threads[-1].start()
        combiner = combiners_of(get_strategy())["hot"]
        _until(lambda: len(combiner._queue) == 4, "four purchases queued behind ann's section")
    for thread in threads:
        thread.join(10)

    assert {name: result.timings.batch for name, result in results.items()} == dict.fromkeys(results, 5)
    outcomes = {name: result.outcome for name, result in results.items()}
    assert outcomes == {
        "ann": Outcome.CONFIRMED,
        "bob": Outcome.CONFIRMED,
        "cat": Outcome.CONFIRMED,
        "dan": Outcome.CONFIRMED,
        "eve": Outcome.LIMIT_REACHED,
    }
    assert results["dan"].order_id == earlier.order_id
    # Each one's statements' round trips lie inside its own hold: a joiner's hold begins when it was
    # taken, after ann's read had waited (make test once read 40.27 ms of SQL in a 39.72 ms hold).
    for name, result in results.items():
        assert 0 < result.timings.sql_ms <= result.timings.lock_hold_ms, (name, result.timings)
    assert state(product.pk)[:2] == (5, {"ann": 1, "bob": 1, "cat": 1, "dan": 1, "eve": 1})
    assert audit(sku="hot").ok


@pytest.mark.django_db(transaction=True)
def test_a_leader_lingers_for_company_only_after_a_batch_that_had_it(use_strategy, make_product, settings):
    """Group commit (``BATCH_LINGER_MS``): the leader of a strategy without a lock whose queue's
    last batch served more than one purchase waits before its section, and what queues meanwhile
    shares that section; the wait ends once as many are queued as the largest recent batch served,
    and lasts the whole linger when they do not come. A purchase alone, after a batch of one, does
    not wait. Before the linger, eve's section served eve alone and fay the next one."""
    use_strategy("atomic", OPTIONS={**settings.INVENTORY["OPTIONS"], "BATCH": 8, "BATCH_LINGER_MS": 1_000})
    product = make_product("hot", stock=10)
    started = time.monotonic()
    alone = purchase(sku="hot", customer="ann", quantity=1)
    assert alone.confirmed and alone.timings.batch == 1
    assert time.monotonic() - started < 0.9, "a purchase alone waited for company"
    combiner = combiners_of(get_strategy())["hot"]
    results: dict[str, object] = {}
    threads = []

    def start(customer: str) -> None:
        def shopper() -> None:
            try:
                results[customer] = purchase(sku="hot", customer=customer, quantity=1)
            finally:
                connection.close()

        threads.append(threading.Thread(target=shopper))
        threads[-1].start()

    def done() -> None:
        for thread in threads:
            thread.join(10)

    # A batch with company: bob's write waits for the row, cat and dee queue behind it and share the next section.
    with row_locked_elsewhere(product.pk):
        start("bob")
        _until(lambda: waiting_for_a_row_lock_is(1), "bob's write waiting for the row lock")
        start("cat")
        start("dee")
        _until(lambda: len(combiner._queue) == 2, "cat and dee queued behind bob")
    done()
    assert [results[name].timings.batch for name in ("bob", "cat", "dee")] == [1, 2, 2]
    # Now eve's leader lingers, holding nothing (her own ticket still queued), until fay makes two.
    start("eve")
    _until(lambda: len(combiner._queue) == 1, "eve queued, her leader lingering")
    time.sleep(0.3)
    assert "eve" not in results and len(combiner._queue) == 1, "eve's leader did not wait for company"
    start("fay")
    done()
    assert [results[name].timings.batch for name in ("eve", "fay")] == [2, 2]
    assert 300 <= results["eve"].timings.queue_wait_ms < 900, (
        "the linger ended when fay made two, and counts as queue time"
    )
    # gus alone after a batch of two: nobody comes, the whole linger.
    gus = purchase(sku="hot", customer="gus", quantity=1)
    assert gus.timings.batch == 1 and gus.timings.queue_wait_ms >= 950
    assert all(results[name].confirmed for name in results) and gus.confirmed
    assert Product.objects.get(pk=product.pk).stock == 3 and audit(sku="hot").ok


@pytest.fixture
def pooled_connection():
    """This thread's connection wrapper, made pooled (as under gunicorn) for the test, then put back."""
    db = connections[DEFAULT_DB_ALIAS]
    saved = db.settings_dict
    db.close()
    pool = {"min_size": 0, "max_size": 2}
    db.settings_dict = {**saved, "CONN_MAX_AGE": 0, "OPTIONS": {**saved.get("OPTIONS", {}), "pool": pool}}
    try:
        yield db
    finally:
        db.close()
        db.close_pool()
        db.settings_dict = saved


@pytest.mark.django_db(transaction=True)
def test_a_queued_purchase_gives_its_pooled_connection_back_and_keeps_a_transactions(pooled_connection):
    db = pooled_connection
    db.ensure_connection()
    assert db.connection is not None
    pooled_connection_back()
    assert db.connection is None
    assert db.pool.get_stats()["pool_available"] == 1  # back in the pool, not closed
    with transaction.atomic():
        db.ensure_connection()
        pooled_connection_back()  # inside a transaction the connection is the transaction's: kept
        assert db.connection is not None
