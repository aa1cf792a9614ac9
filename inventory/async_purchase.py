"""The purchase on an event loop (``SHOP_SERVER=asgi``): the asyncio lock awaited, the section on a thread.

The same purchase as :func:`inventory.services.purchase`, step for step and from the same
functions: :func:`~inventory.services.prepare` (the plain read), the strategy's guard, the section
(:func:`~inventory.services.run_section`), :func:`~inventory.services.finish`. What differs is only
where each step runs. The guard is the strategy's ``aguard``: the asyncio twin of its lock
(``locks._async``), held with ``async with`` on the loop, so a purchase waiting for the lock costs
no thread. Django 5.2's ORM is sync only (``atomic()`` and ``select_for_update`` cannot run in
async code), so the steps that touch the database run on one of ``ASGI_DB_THREADS`` threads per
process (:func:`on_thread`), the same section code as under WSGI: it is written once
(docs/decisions.md says why this route and what it costs).

A thread holds at most one connection at a time, and gives it back to the pool after each step,
so the pool's size and timeout (and the 503 when it is exhausted) mean what they mean under
gunicorn's threads; and at most as many purchases are in progress per worker (:func:`admission`).
``BATCH`` > 1 queues the purchase on the loop's combiner (:mod:`inventory.combining`, written for
asyncio and generated to the threads' twin): it waits on the loop, and only its batch's section,
led by the purchase at the head of the queue, takes an ORM thread.
"""

from __future__ import annotations

import asyncio
import functools
import os
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, TypeVar

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connection

from locks import aclose_connections

from .batched import aclose_shared_queues, apurchase_in_batch, run_batch
from .results import PurchaseResult
from .services import (
    Ready,
    busy,
    finish,
    gone_is_not_found,
    held_for,
    prepare,
    queued,
    same_purchase,
    section_of,
)
from .strategies import get_strategy
from .strategies.base import Strategy
from .strategies.contract import LockUnavailable
from .strategies.section import timed_transactions

T = TypeVar("T")

_executor: ThreadPoolExecutor | None = None
_executor_pid: int | None = None
_executor_lock = threading.Lock()


def executor() -> ThreadPoolExecutor:
    """This process's ORM threads (made after gunicorn forks, on first use)."""
    global _executor, _executor_pid
    with _executor_lock:
        if _executor is None or _executor_pid != os.getpid():
            _executor = ThreadPoolExecutor(settings.ASGI_DB_THREADS, thread_name_prefix="orm")
            _executor_pid = os.getpid()
        return _executor


def _giving_back(function: Callable[..., T]) -> Callable[..., T]:
    def run(*args, **kwargs) -> T:
        try:
            return function(*args, **kwargs)
        finally:
            # A pooled connection goes back to the pool. Django's docs disable persistent
            # connections in async code: nothing closes a persistent one a pool thread keeps.
            connection.close()

    return run


async def on_thread(function: Callable[..., T], /, *args, **kwargs) -> T:
    """``function(*args, **kwargs)`` on one of the ORM threads, awaited; its connection given back after."""
    return await sync_to_async(_giving_back(function), thread_sensitive=False, executor=executor())(*args, **kwargs)


async def aclose_loop() -> None:
    """Close the connections purchases opened on the running loop: the asyncio locks' (every
    strategy's, a replaced one's too) and the shared queues' clients. An asyncio connection belongs
    to its loop and cannot be closed once the loop is: await this last on a loop that ends, its
    purchases answered (the ASGI application's lifespan shutdown, ``shop/lifespan.py``; the end of an
    ``asyncio.run``). A purchase on this loop after it opens new ones."""
    await aclose_shared_queues()
    await aclose_connections()


def loop_refusal(strategy: type[Strategy] | Strategy) -> str:
    """The one-line refusal of a strategy that cannot serve on an event loop, or ""."""
    if not strategy.loop_refusal:
        return ""
    return f"INVENTORY_STRATEGY={strategy.name} cannot serve under SHOP_SERVER=asgi: {strategy.loop_refusal}"


_admissions: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = weakref.WeakKeyDictionary()


def admission() -> asyncio.Semaphore:
    """This loop's bound on purchases in progress: ``ASGI_DB_THREADS``, as gthread runs at most its
    threads' worth. Without it every shopper of a spike is admitted at the opening, reads the shelf
    before the first sale commits and queues for the lock, and the sold-out mark (which keeps late
    shoppers off the lock and the database) comes too late for all of them: measured, 1,748 sections
    for 2,000 purchases against WSGI's 131 (docs/decisions.md)."""
    loop = asyncio.get_running_loop()
    semaphore = _admissions.get(loop)
    if semaphore is None:
        semaphore = _admissions[loop] = asyncio.Semaphore(settings.ASGI_DB_THREADS)
    return semaphore


async def apurchase(
    *, sku: str, customer: str, quantity: int, idempotency_key: str = "", strategy: Strategy | None = None
) -> PurchaseResult:
    """:func:`inventory.services.purchase` on the event loop: the same answers, outcomes and errors."""
    strategy = strategy or get_strategy()
    refusal = loop_refusal(strategy)
    if refusal:
        raise ImproperlyConfigured(refusal)
    # Django cancels the view when its client hangs up. Cancelled half-way, the purchase would
    # leave its section running on a thread after its guard was released (fenced: refused, but
    # unfenced: a second writer), or leave a combiner's queue with nobody leading it: once
    # started, a purchase runs to its end, and only its answer is dropped.
    return await asyncio.shield(
        _admitted(strategy, sku=sku, customer=customer, quantity=quantity, idempotency_key=idempotency_key)
    )


async def _admitted(
    strategy: Strategy, *, sku: str, customer: str, quantity: int, idempotency_key: str
) -> PurchaseResult:
    async with admission():
        return await _prepared(strategy, sku=sku, customer=customer, quantity=quantity, idempotency_key=idempotency_key)


async def _prepared(
    strategy: Strategy, *, sku: str, customer: str, quantity: int, idempotency_key: str
) -> PurchaseResult:
    ready = await on_thread(
        prepare, strategy, sku=sku, customer=customer, quantity=quantity, idempotency_key=idempotency_key
    )
    if isinstance(ready, PurchaseResult):
        return same_purchase(ready, quantity=quantity, key=idempotency_key)
    with gone_is_not_found(sku):
        result = await (_in_batch(strategy, ready) if strategy.batch > 1 else _alone(strategy, ready))
    return same_purchase(await on_thread(finish, strategy, result, ready), quantity=quantity, key=idempotency_key)


async def _in_batch(strategy: Strategy, ready: Ready) -> PurchaseResult:
    """The purchase queued on this loop's combiner (``BATCH`` > 1): it waits on the loop, and only
    its batch's section takes an ORM thread."""
    return await apurchase_in_batch(strategy, **queued(ready), run=functools.partial(on_thread, run_batch))


async def _alone(strategy: Strategy, ready: Ready) -> PurchaseResult:
    """One purchase in its own section: await the guard, run the section on a thread, commit, release."""
    waiting = time.perf_counter()
    try:
        with timed_transactions() as transactions:
            async with strategy.aguard(ready.sku) as grant:
                granted = time.perf_counter()
                result = await on_thread(section_of, strategy, grant, ready)
        held_for(strategy, ready.timings, waiting=waiting, granted=granted, transactions=transactions)
    except LockUnavailable:
        result = busy(strategy, ready.timings, waiting=waiting)
    return result
