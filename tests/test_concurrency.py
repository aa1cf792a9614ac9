"""Many buyers at once, in several processes with several threads each, for every backend.

Afterwards the database must show: exactly the stock sold, stock at zero, one order per
customer, and every attempt accounted for by an outcome.
"""
from __future__ import annotations

import multiprocessing
import threading
from collections import Counter

import pytest
from django.db import connections

from inventory.backends import reset_backend
from inventory.services import audit, purchase

PROCESSES = 4
THREADS = 6
CUSTOMERS_PER_THREAD = 5
STOCK = 25


def buy_in_threads(process_index: int) -> dict[str, int]:
    """Runs in a forked child: THREADS threads, each buying for its customers (twice each)."""
    reset_backend()  # the parent's Redis connections must not be shared across the fork
    outcomes: Counter[str] = Counter()
    guard = threading.Lock()
    start = threading.Barrier(THREADS)

    def shopper(thread_index: int) -> None:
        start.wait()
        try:
            for k in range(CUSTOMERS_PER_THREAD):
                # The same customer also buys from the neighbouring thread: a double submit.
                for owner in (thread_index, (thread_index + 1) % THREADS):
                    customer = f"p{process_index}-t{owner}-c{k}"
                    result = purchase(sku="hot", customer=customer, quantity=1)
                    with guard:
                        outcomes[result.outcome.value] += 1
        finally:
            connections.close_all()

    threads = [threading.Thread(target=shopper, args=(i,)) for i in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return dict(outcomes)


def run_shoppers() -> Counter[str]:
    """Fork PROCESSES children that buy at once; the outcomes of every attempt, added up."""
    connections.close_all()  # a forked child must not share the parent's database socket
    reset_backend()
    with multiprocessing.get_context("fork").Pool(PROCESSES) as pool:
        per_process = pool.map(buy_in_threads, range(PROCESSES))
    return sum((Counter(c) for c in per_process), Counter())


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("backend", ["db", "redis", "redlock"])
def test_processes_and_threads_never_oversell(backend, use_backend, make_product):
    use_backend(backend)
    make_product("hot", stock=STOCK)
    outcomes = run_shoppers()
    attempts = PROCESSES * THREADS * CUSTOMERS_PER_THREAD * 2
    assert sum(outcomes.values()) == attempts
    assert outcomes["confirmed"] == STOCK
    assert set(outcomes) <= {"confirmed", "sold_out", "limit_reached", "busy"}

    report = audit(sku="hot", demand=attempts // 2)
    assert report.stock == 0
    assert report.ordered == report.orders == STOCK
    assert report.oversold == report.lost == report.undersold == report.duplicate_customers == 0
    assert report.ok


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_audit_catches_the_unsafe_backends_oversell(use_backend, make_product):
    """The control experiment: without a lock the same load oversells, and the audit says so."""
    use_backend("unsafe", ALLOW_UNSAFE=True)
    make_product("hot", stock=STOCK)
    outcomes = run_shoppers()
    report = audit(sku="hot")
    assert outcomes["confirmed"] > STOCK
    assert report.oversold > 0
    assert not report.ok
