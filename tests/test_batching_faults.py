"""Combining under faults: a leader killed after its commit, a leader paused past its lease."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time

import pytest
from django.db import connections

from inventory.audit import audit
from inventory.batched import run_batch
from inventory.combining import Combiner
from inventory.models import Order
from inventory.results import Timings
from inventory.services import purchase
from inventory.strategies import get_strategy, load_strategy, reset_strategy
from inventory.strategies.batch import Ask
from inventory.strategies.contract import Outcome

#: A lease or wait that only a held lock would make anyone sit out.
LONG_MS = 60_000


def buy_then_die(sku: str) -> None:
    """In a forked child: lead a batch, and die (SIGKILL) after its commit, before any answer."""
    reset_strategy()
    Combiner.answer = lambda self, ticket, answer: os.kill(os.getpid(), signal.SIGKILL)
    purchase(sku=sku, customer="ann", quantity=1, idempotency_key="retry-me")
    os._exit(3)  # not reached: the leader dies before it answers


@pytest.mark.django_db(transaction=True)
def test_a_leader_killed_after_its_commit_leaves_the_order_to_the_keyed_retry(use_strategy, make_product, settings):
    # A lease and a wait far longer than any delay of a loaded machine: a lock the dead leader
    # still held would keep the retry waiting about a minute.
    use_strategy(
        "redis", LOCK_TTL_MS=LONG_MS, ACQUIRE_TIMEOUT_MS=LONG_MS, OPTIONS={**settings.INVENTORY["OPTIONS"], "BATCH": 8}
    )
    make_product("kill", stock=3)
    connections.close_all()
    reset_strategy()
    child = multiprocessing.get_context("fork").Process(target=buy_then_die, args=("kill",))
    child.start()
    child.join(30)
    assert child.exitcode == -signal.SIGKILL
    assert Order.objects.filter(customer="ann").count() == 1, "the leader died before its commit"
    started = time.monotonic()
    retry = purchase(sku="kill", customer="ann", quantity=1, idempotency_key="retry-me")
    assert retry.outcome is Outcome.CONFIRMED
    assert retry.order_id == Order.objects.get(customer="ann").pk
    assert time.monotonic() - started < LONG_MS / 1000 / 2, "the dead leader still held the lock"
    assert audit(sku="kill").ok and Order.objects.count() == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("fenced", [True, False])
def test_a_paused_leaders_late_batch_is_refused_whole(fenced, use_strategy, make_product, settings):
    """Leader A holds the lock for a batch of three, reads, pauses past its lease; B's grant sells
    the two units; A's late write is refused whole (fenced) or lands and oversells (unfenced)."""
    options = {**settings.INVENTORY["OPTIONS"], "FENCED": fenced}
    use_strategy("redis", LOCK_TTL_MS=300, OPTIONS={**options, "BATCH": 4})
    product = make_product("late", stock=2)
    leader = get_strategy()
    read, paused, resume = leader.read_batch, threading.Event(), threading.Event()

    def pausing_read(product_id, **kwargs):
        first = read(product_id, **kwargs)
        paused.set()
        resume.wait(10)
        return first

    leader.read_batch = pausing_read
    results = []

    def lead() -> None:
        try:
            with leader.guard("late") as grant:
                asks = [Ask("a1", 1), Ask("a2", 1), Ask("a3", 1)]
                results.extend(run_batch(leader, grant, product_id=product.pk, asks=asks, timings=Timings()))
        finally:
            connections.close_all()

    thread = threading.Thread(target=lead)
    thread.start()
    assert paused.wait(5)
    time.sleep(0.5)  # past the 300 ms lease: the lock is free for B
    other = load_strategy("redis", config={**settings.INVENTORY, "OPTIONS": options})
    for customer in ("b1", "b2"):
        assert purchase(sku="late", customer=customer, quantity=1, strategy=other).confirmed
    resume.set()
    thread.join(10)
    report = audit(sku="late")
    if fenced:
        assert [r.outcome for r in results] == [Outcome.BUSY] * 3
        assert sorted(Order.objects.values_list("customer", flat=True)) == ["b1", "b2"]
        assert report.ok and report.stock == 0
    else:
        assert [r.outcome for r in results] == [Outcome.CONFIRMED, Outcome.CONFIRMED, Outcome.SOLD_OUT]
        assert report.oversold > 0 and not report.ok
    other.close()
