"""The shared queue (``QUEUE=shared``): one Redis list per SKU, drained by whoever leads, in real
Redis and PostgreSQL, from real threads and two forked processes (two "pods").

The queue's own rules first (withdrawal at the deadline, a taken ask's answer is authoritative, a
lost leader), on the queue alone with the machine's Redis; then purchases: whatever process a
batch's asks came from, the sale never sells more or less than it has, and a shopper told busy
while queued is never sold afterwards.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import multiprocessing
import threading
import time
from collections import Counter

import pytest
import redis
from django.conf import settings
from django.db import connections
from hypothesis import given
from hypothesis import strategies as st

from inventory.async_purchase import apurchase
from inventory.audit import audit
from inventory.batched import async_shared_queue_for, shared_key, shared_queue_for
from inventory.combining import SharedQueue
from inventory.models import Order, Product
from inventory.results import PurchaseResult, Timings
from inventory.services import purchase
from inventory.strategies import get_strategy, reset_strategy
from inventory.strategies.contract import Outcome
from tests.helpers import bought_on_a_loop, row_locked_elsewhere, run_threads

PROCESSES = 2
THREADS = 12
# 40 of the 48 customers: sections with orders run from the opening to the sell-out, as both pods'
# threads come back for their second customer; with 20 the orders' three or four sections could
# all fall to one pod's first wave ("no section served both pods": once in each of two full runs
# on 2026-12-03, [redis] then [atomic]).
STOCK = 40


@pytest.fixture
def queue(redis_client):
    """A shared queue of plain items on the shop's Redis (emptied before and after), whose leader
    ``serve`` answers each item doubled."""
    return SharedQueue(
        redis.Redis.from_url(settings.INVENTORY["REDIS_URL"], socket_timeout=5),
        key="flashsale:queue:test:{q}",
        limit=4,
        lease_ms=10_000,
        item_of=lambda fields: fields,
        answer_as=lambda answer: {"value": answer},
        answer_of=lambda fields: fields["value"],
        poll_s=0.05,
    )


def busy(ticket) -> str:
    return "busy"


def doubling(queue: SharedQueue, served: list):
    def serve(take) -> None:
        tickets = take()
        served.append([ticket.item["n"] for ticket in tickets])
        for ticket in tickets:
            queue.answer(ticket, ticket.item["n"] * 2)

    return serve


def test_threads_are_served_in_batches_each_its_own_answer(queue):
    """Ten asks wait in the list behind a lease held elsewhere, then are served in batches of at
    most four. Left to the threads' timing, every batch was of one in a full run on a loaded machine:
    the lease is now let go only once all ten wait."""
    served, answers, start = [], {}, threading.Barrier(10)
    queue.client.set(queue.lease_key, "someone-else")

    def submitter(n: int) -> None:
        start.wait()
        answers[n] = queue.submit(
            {"n": n}, serve=doubling(queue, served), timeout_s=10, taken_wait_s=10, busy=busy
        ).answer

    threads = [threading.Thread(target=submitter, args=(n,)) for n in range(10)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 5
    while queue.client.llen(queue.key) < 10 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert queue.client.llen(queue.key) == 10, "the ten asks never all waited in the list"
    queue.client.delete(queue.lease_key)
    for thread in threads:
        thread.join(15)
    assert answers == {n: n * 2 for n in range(10)}
    assert sorted(itertools.chain(*served)) == list(range(10)), "each ask served exactly once"
    assert max(len(batch) for batch in served) > 1 and max(len(batch) for batch in served) <= 4
    assert queue.client.llen(queue.key) == 0 and not queue.client.exists(queue.lease_key)


def test_an_ask_past_its_deadline_leaves_the_list_busy_and_is_never_served(queue):
    """Someone else holds the lease and never drains: at its deadline the ask is withdrawn (LREM)
    and answered busy; a leader that drains afterwards finds nothing of it."""
    queue.client.set(queue.lease_key, "someone-else")
    ticket = queue.submit({"n": 1}, serve=doubling(queue, []), timeout_s=0.3, taken_wait_s=5, busy=busy)
    assert ticket.answer == "busy"
    assert queue.client.llen(queue.key) == 0
    queue.client.delete(queue.lease_key)
    served = []
    assert queue.submit({"n": 2}, serve=doubling(queue, served), timeout_s=5, taken_wait_s=5, busy=busy).answer == 4
    assert served == [[2]]


def test_a_leader_serves_its_own_ask_whatever_its_deadline(queue):
    """Seen with ACQUIRE_TIMEOUT_MS=0 (the checks accept it: take the lock or be busy at once): the
    leader's own ask was past its deadline by its own LPOP, answered busy, and with an empty list it
    never served at all; every purchase on the shared queue was busy on an idle shop. The local queue
    serves its leader's own ticket whatever its deadline: so does this one."""
    served = []
    assert queue.submit({"n": 1}, serve=doubling(queue, served), timeout_s=0, taken_wait_s=1, busy=busy).answer == 2
    assert served == [[1]] and queue.client.llen(queue.key) == 0 and not queue.client.exists(queue.lease_key)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("server", ["threads", "event loop"])
def test_a_purchase_that_may_not_wait_is_sold_when_nobody_is_ahead(server, use_strategy, make_product):
    """ACQUIRE_TIMEOUT_MS=0 on the shared queue: a purchase alone leads and is sold, on either server."""
    use_strategy(
        "atomic", ACQUIRE_TIMEOUT_MS=0, OPTIONS={**settings.INVENTORY["OPTIONS"], "BATCH": 4, "QUEUE": "shared"}
    )
    make_product("hot", stock=2, limit=1)
    buy = functools.partial(purchase if server == "threads" else bought_on_a_loop, sku="hot")
    assert buy(customer="a", quantity=1).confirmed and buy(customer="b", quantity=1).confirmed
    assert buy(customer="c", quantity=1).outcome is Outcome.SOLD_OUT
    assert Order.objects.count() == 2 and Product.objects.get(sku="hot").stock == 0


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("server", ["threads", "event loop"])
def test_every_sku_s_shared_queue_in_a_process_shares_one_redis_pool(server, use_strategy, make_product):
    """Seen by a helper reading the code: each SKU's shared queue made a Redis client of its own, so
    a worker kept a connection pool (and its idle connections) per SKU ever bought: a shop of many
    SKUs held that many times the connections. One pool per process (per event loop under ASGI)."""
    use_strategy("atomic", OPTIONS={**settings.INVENTORY["OPTIONS"], "BATCH": 4, "QUEUE": "shared"})
    skus = [f"sku-{n}" for n in range(4)]
    for sku in skus:
        make_product(sku, stock=2, limit=1)
    strategy = get_strategy()
    if server == "threads":
        assert all(purchase(sku=sku, customer="a", quantity=1).confirmed for sku in skus)
        pools = {id(shared_queue_for(strategy, sku).client.connection_pool) for sku in skus}
    else:

        async def buy_all():
            answers = [await apurchase(sku=sku, customer="a", quantity=1) for sku in skus]
            return answers, {id(async_shared_queue_for(strategy, sku).client.connection_pool) for sku in skus}

        answers, pools = asyncio.run(buy_all())
        assert all(answer.confirmed for answer in answers)
    assert len(pools) == 1
    assert Order.objects.count() == 4


def submitted_behind(queue, leader: str, item: dict, *, timeout_s: float, taken_wait_s: float):
    """Another process (``leader``) holds the lease; a thread submits ``item``. Returns the thread,
    where its ticket will be (``result["ticket"]``) and the ask once this "leader" has popped it."""
    queue.client.set(queue.lease_key, leader)
    result = {}
    thread = threading.Thread(
        target=lambda: result.update(
            ticket=queue.submit(
                item, serve=doubling(queue, []), timeout_s=timeout_s, taken_wait_s=taken_wait_s, busy=busy
            )
        )
    )
    thread.start()
    deadline = time.monotonic() + 2
    while not (payload := queue.client.lpop(queue.key)) and time.monotonic() < deadline:
        time.sleep(0.01)
    return thread, result, json.loads(payload)


def test_a_taken_ask_gets_its_leaders_answer_even_after_its_deadline(queue):
    """Another leader takes the ask before its deadline and answers after it: the answer is the
    leader's (it may have sold), not busy."""
    thread, result, ask = submitted_behind(queue, "other-leader", {"n": 3}, timeout_s=0.3, taken_wait_s=5)
    time.sleep(0.5)  # past the submitter's deadline, its ask in the other leader's hands
    queue.client.rpush(queue.answer_key(ask["ticket"]), json.dumps({"answer": {"value": "sold"}}))
    thread.join(5)
    assert result["ticket"].answer == "sold"


@pytest.mark.slow  # waits out the taken ask's wait
def test_a_taken_ask_whose_leader_died_is_answered_busy(queue):
    thread, result, _ = submitted_behind(queue, "dead-leader", {"n": 4}, timeout_s=0.2, taken_wait_s=0.4)
    thread.join(5)
    assert result["ticket"].answer == "busy"


def test_a_leader_serves_asks_of_others_that_wait_behind_a_lease_given_back(queue):
    """A lease released with asks still queued: the submitter at the head is nudged, or a waiter's
    poll takes the lease; nobody is left waiting until its deadline."""
    queue.client.set(queue.lease_key, "leaving-leader", px=300)  # a leader that went away without passing on
    served, answers = [], {}
    threads = [
        threading.Thread(
            target=lambda n=n: answers.update(
                {
                    n: queue.submit(
                        {"n": n}, serve=doubling(queue, served), timeout_s=5, taken_wait_s=5, busy=busy
                    ).answer
                }
            )
        )
        for n in range(6)
    ]
    began = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert answers == {n: n * 2 for n in range(6)}
    assert time.monotonic() - began < 3


def buy_in_threads(process_index: int, *, opens_at: float) -> dict:
    """In a forked child ("pod"): THREADS threads, each buying for two customers, one with a keyed
    retry of the same purchase, from ``opens_at`` (``time.time()``, the same for both pods); outcomes,
    batch sizes, and the orders each keyed purchase got."""
    reset_strategy()  # the parent's Redis connections must not be shared across the fork
    outcomes, sizes, keyed = Counter(), Counter(), {}
    guard, start = threading.Lock(), threading.Barrier(THREADS)

    def shopper(thread_index: int) -> None:
        start.wait()
        time.sleep(max(0.0, opens_at - time.time()))
        try:
            for k in range(2):
                customer = f"p{process_index}-t{thread_index}-c{k}"
                for attempt in range(2 if k == 0 else 1):  # the first customer's keyed purchase, sent twice
                    result = purchase(sku="hot", customer=customer, quantity=1, idempotency_key=f"{customer}-k")
                    with guard:
                        outcomes[result.outcome.value] += 1 if attempt == 0 else 0
                        sizes[result.timings.batch] += 1
                        if result.confirmed:
                            keyed.setdefault(customer, set()).add(result.order_id)
        finally:
            connections.close_all()

    run_threads(THREADS, shopper)
    return {"outcomes": dict(outcomes), "sizes": dict(sizes), "keyed": {c: sorted(o) for c, o in keyed.items()}}


@pytest.mark.flaky(reruns=2)  # which pods a section serves is timing: docs/testing.md
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("backend", ["db", "redis", "atomic"])
def test_two_pods_share_one_queue_and_never_oversell(backend, use_strategy, make_product):
    """Two forked processes × 12 threads buy for 48 customers (limit 1) from 20 units, BATCH=8 on the
    shared queue: the sale balances, a keyed retry gets the same order, and some section served
    purchases of both processes (one batch's orders share their created_at).

    The first section's write waits on the row, locked here until more purchases wait in the shared
    list than one pod has threads: the next section then takes both pods' (left to chance, seven
    sections each served one pod in a full run on a loaded machine)."""
    # A fresh clone's full run (three workers, bursts beside it) once had only 6 asks in the list
    # after 4 s, the forked pods' first purchases slow to open their connections: the row's wait and
    # the asks' deadlines get 12 s here, and the wait for both pods' asks 8 s (within the lease, 10 s).
    use_strategy(
        backend,
        OPTIONS={**settings.INVENTORY["OPTIONS"], "BATCH": 8, "QUEUE": "shared"},
        ACQUIRE_TIMEOUT_MS=12_000,
        ROW_LOCK_TIMEOUT_MS=12_000,
    )
    product = make_product("hot", stock=STOCK)
    connections.close_all()
    reset_strategy()
    waiting = redis.Redis.from_url(settings.INVENTORY["REDIS_URL"])
    key = shared_key(get_strategy(), "hot")
    with multiprocessing.get_context("fork").Pool(PROCESSES) as pool:
        with row_locked_elsewhere(product.pk) as release:
            pending = pool.map_async(functools.partial(buy_in_threads, opens_at=time.time() + 0.5), range(PROCESSES))
            deadline = time.monotonic() + 8.0  # within ROW_LOCK_TIMEOUT_MS and the asks' deadlines (12 s)
            while waiting.llen(key) <= THREADS and time.monotonic() < deadline:
                time.sleep(0.01)
            assert waiting.llen(key) > THREADS, "both pods' purchases never waited in the shared list"
            release()
        per_pod = pending.get(60)
    waiting.close()
    outcomes = sum((Counter(pod["outcomes"]) for pod in per_pod), Counter())
    sizes = sum((Counter(pod["sizes"]) for pod in per_pod), Counter())
    assert outcomes["confirmed"] == STOCK and sum(outcomes.values()) == PROCESSES * THREADS * 2, outcomes
    assert outcomes["busy"] == 0, outcomes
    assert all(len(orders) == 1 for pod in per_pod for orders in pod["keyed"].values()), "a keyed retry got a new order"
    assert max(size or 0 for size in sizes) > 1, f"no section served two purchases: {sizes}"
    report = audit(sku="hot", told_sold_out=outcomes["sold_out"])
    assert report.ok and report.stock == 0 and report.ordered == report.orders == STOCK
    assert report.oversold == report.undersold == report.lost == report.over_limit_customers == 0
    batches = {}
    for created_at, customer in Order.objects.filter(product__sku="hot").values_list("created_at", "customer"):
        batches.setdefault(created_at, set()).add(customer.split("-")[0])
    assert any(len(pods) == PROCESSES for pods in batches.values()), f"no section served both pods: {batches}"
    assert redis.Redis.from_url(settings.INVENTORY["REDIS_URL"]).llen(shared_key(get_strategy(), "hot")) == 0


@pytest.mark.slow  # waits out ACQUIRE_TIMEOUT_MS behind a held lock
@pytest.mark.django_db(transaction=True)
def test_a_shopper_told_busy_while_queued_is_never_sold(use_strategy, make_product):
    """The SKU's lock is held elsewhere: the leader never gets it, the asks behind it reach their
    deadline in the list and are answered busy. Once the lock is free, a new purchase sells, and
    nothing of the busy shoppers ever does."""
    use_strategy(
        "redis", ACQUIRE_TIMEOUT_MS=600, OPTIONS={**settings.INVENTORY["OPTIONS"], "BATCH": 8, "QUEUE": "shared"}
    )
    make_product("hot", stock=5, limit=1)
    strategy, results = get_strategy(), {}

    def shopper(n: int) -> None:
        try:
            results[n] = purchase(sku="hot", customer=f"c{n}", quantity=1)
        finally:
            connections.close_all()

    with strategy.guard("hot"):
        threads = [threading.Thread(target=shopper, args=(n,)) for n in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
    assert [results[n].outcome.value for n in range(4)] == ["busy"] * 4
    assert redis.Redis.from_url(settings.INVENTORY["REDIS_URL"]).llen(shared_key(strategy, "hot")) == 0
    assert purchase(sku="hot", customer="late", quantity=1).confirmed
    time.sleep(0.3)
    assert list(Order.objects.values_list("customer", flat=True)) == ["late"]
    assert Product.objects.get(sku="hot").stock == 4 and audit(sku="hot").ok


def test_flashsale_runs_a_batched_row_per_queue_and_tells_its_pods(tmp_path):
    """``--batch 1,64 --queue local,shared``: the BATCH=1 row once (it queues nowhere), the batched row
    once per queue, and each row's pods get its INVENTORY_QUEUE."""
    from loadtests.options import BatchLayout, row_keys, row_plan
    from loadtests.plan import BurstPlan
    from loadtests.pods import server_environment

    assert row_keys(["db"], [1, 64], ["local", "shared"]) == [
        ("db", 1, "local"),
        ("db", 64, "local"),
        ("db", 64, "shared"),
    ]
    plan = row_plan(BurstPlan(scenario="deep", requests=100, stock=100), 64, BatchLayout(2, 25), "shared")
    env = server_environment(backend="db", plan=plan, access_log=tmp_path / "access.log")
    assert (env["INVENTORY_BATCH"], env["INVENTORY_QUEUE"]) == ("64", "shared")
    assert (env["GUNICORN_WORKERS"], plan.threads) == ("2", 25)  # the batched rows' layout


maybe_ms = st.none() | st.floats(0, 1e6, allow_nan=False)


@given(
    outcome=st.sampled_from(Outcome),
    numbers=st.tuples(*[st.none() | st.integers(0, 2**40)] * 3),
    counts=st.tuples(*[st.integers(0, 100)] * 3),
    timings=st.builds(
        Timings,
        lock_wait_ms=maybe_ms,
        lock_hold_ms=maybe_ms,
        db_ms=st.floats(0, 1e6, allow_nan=False),
        queue_wait_ms=maybe_ms,
        batch=st.none() | st.integers(1, 1000),
        commit_ms=maybe_ms,
        sql_statements=st.none() | st.integers(0, 100),
    ),
)
def test_an_answer_crosses_redis_as_it_left(outcome, numbers, counts, timings):
    """What a leader posts on a ticket's list (JSON) is the answer its submitter reads back."""
    result = PurchaseResult(outcome, "db", *numbers, *counts, timings=timings)
    assert PurchaseResult.from_wire(json.loads(json.dumps(result.as_wire()))) == result


def test_a_shared_row_says_so_in_the_table_and_the_report():
    from loadtests.report.base import row_label
    from loadtests.table import COLUMNS

    assert row_label({"row": "redis", "batch": 64, "queue": "shared"}) == "redis ×64 shared"
    assert row_label({"row": "redis", "batch": 64, "queue": "local"}) == "redis ×64"
    assert row_label({"row": "redis", "batch": 1, "queue": None}, with_batch_1=True) == "redis ×1"
    titles = [title for title, _ in COLUMNS]
    assert titles[titles.index("batch") + 1] == "queue"
