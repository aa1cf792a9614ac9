"""Purchases that share a section (``BATCH`` > 1): a queue per SKU in each process, one leader at a time.

A purchase that got past the shelf's plain read queues here (:class:`inventory.combining.Combiner`,
one per strategy and SKU). The leader takes the strategy's guard once, then takes up to ``BATCH``
queued purchases (its own first), runs :func:`inventory.strategies.batch.batch_section` (one read,
each decided in queue order, one checked stock write, bulk orders and units, one commit),
releases the guard, and hands each waiter its own answer. A conflict (the storage check refused
the batch's write) re-runs the whole batch as the strategy allows one purchase to re-run; an
``IntegrityError`` (which aborts the whole PostgreSQL transaction) re-runs the batch with each
purchase in its own savepoint, so one bad purchase never fails the others.

Once the batch has committed, every purchase gets its true answer: one whose answer cannot be
built (a constraint no outcome is mapped for) is told busy, as nothing was written for it, and
the others keep theirs. The combiner's "a failing leader answers its batch busy" covers only a
failure before the commit, when nothing of the batch was written.

A waiter still queued when ``ACQUIRE_TIMEOUT_MS`` has passed leaves the queue and is told busy
(503); one its leader has taken waits for the leader's answer (docs/batching.md).
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from typing import Awaitable, Callable

from django.db import IntegrityError, OperationalError, connection

from .combining import AsyncCombiner, Combiner, Ticket, alead_batch, lead_batch
from .results import PurchaseResult, Timings, constraint_hit, result_of
from .strategies.base import Strategy
from .strategies.batch import Ask, BatchAttempt
from .strategies.contract import Grant, Outcome
from .strategies.section import lock_timed_out

logger = logging.getLogger(__name__)

_combiners: weakref.WeakKeyDictionary[Strategy, dict[str, Combiner]] = weakref.WeakKeyDictionary()
_async_combiners: weakref.WeakKeyDictionary[Strategy, dict[str, AsyncCombiner]] = weakref.WeakKeyDictionary()
_combiners_lock = threading.Lock()


def combiner_for(strategy: Strategy, sku: str) -> Combiner:
    """The strategy's queue for ``sku`` in this process (its threads'), made on first use."""
    return _queue_of(_combiners, Combiner, strategy, sku)


def async_combiner_for(strategy: Strategy, sku: str) -> AsyncCombiner:
    """The strategy's queue for ``sku`` on this process's event loop (ASGI), made on first use."""
    return _queue_of(_async_combiners, AsyncCombiner, strategy, sku)


def _queue_of(registry, kind, strategy: Strategy, sku: str):
    with _combiners_lock:
        mine = registry.setdefault(strategy, {})
        if sku not in mine:
            mine[sku] = kind(limit=strategy.batch)
        return mine[sku]


def combiners_of(strategy: Strategy) -> dict[str, Combiner | AsyncCombiner]:
    """The queues the strategy has made so far, threads' and loop's (none while it runs with BATCH=1)."""
    with _combiners_lock:
        return {**_async_combiners.get(strategy, {}), **_combiners.get(strategy, {})}


def _ms(since: float, until: float | None = None) -> float:
    return ((until or time.perf_counter()) - since) * 1000


def purchase_in_batch(
    strategy: Strategy, *, sku: str, product_id: int, customer: str, quantity: int, key: str
) -> PurchaseResult:
    """Queue the purchase and return its own answer, whoever's section served it."""
    combiner = combiner_for(strategy, sku)

    def serve(take) -> None:
        lead_batch(strategy, combiner, take, sku=sku, product_id=product_id, run=run_batch)

    if connection.settings_dict.get("OPTIONS", {}).get("pool") and not connection.in_atomic_block:
        connection.close()  # back to the pool while queued: only a leader needs one (a worker's threads share few)
    ticket = combiner.submit(
        Ask(customer, quantity, key), serve=serve, timeout_s=_queue_timeout_s(strategy), busy=_busy_in(strategy)
    )
    return ticket.answer


async def apurchase_in_batch(
    strategy: Strategy,
    *,
    sku: str,
    product_id: int,
    customer: str,
    quantity: int,
    key: str,
    run: Callable[..., Awaitable[list[PurchaseResult]]],
) -> PurchaseResult:
    """:func:`purchase_in_batch` on the event loop: queued on the loop's combiner, holding no thread
    while it waits; its leader awaits the guard and ``run``, :func:`run_batch` on an ORM thread."""
    combiner = async_combiner_for(strategy, sku)

    async def serve(take) -> None:
        await alead_batch(strategy, combiner, take, sku=sku, product_id=product_id, run=run)

    ticket = await combiner.submit(
        Ask(customer, quantity, key), serve=serve, timeout_s=_queue_timeout_s(strategy), busy=_busy_in(strategy)
    )
    return ticket.answer


def _queue_timeout_s(strategy: Strategy) -> float:
    return strategy.config["ACQUIRE_TIMEOUT_MS"] / 1000


def _busy_in(strategy: Strategy) -> Callable[[Ticket], PurchaseResult]:
    """The answer of a purchase that left the queue unserved: busy, with its time queued."""

    def busy(ticket: Ticket) -> PurchaseResult:
        return PurchaseResult(Outcome.BUSY, strategy.name, timings=Timings(queue_wait_ms=_ms(ticket.queued_at)))

    return busy


def run_batch(
    strategy: Strategy, grant: Grant, *, product_id: int, asks: list[Ask], timings: Timings
) -> list[PurchaseResult]:
    """The batch section until it writes; on a conflict re-run as the strategy allows, then busy."""
    conflicts = retries = 0
    recovered, savepoint_each = False, False
    for attempt_number in range(strategy.max_attempts + 1):
        started = time.perf_counter()
        try:
            batch = strategy.attempt_batch(product_id=product_id, asks=asks, grant=grant, savepoint_each=savepoint_each)
        except IntegrityError:
            if savepoint_each:
                raise
            savepoint_each = True
            continue
        except OperationalError as exc:
            if not lock_timed_out(exc):
                raise
            break  # a row lock held elsewhere past ROW_LOCK_TIMEOUT_MS: rolled back, the batch is busy
        finally:
            timings.db_ms += _ms(started)
        if batch.conflict is None:
            return _results(
                strategy, batch, asks, product_id=product_id, grant=grant, conflicts=conflicts, retries=retries
            )
        conflicts += 1
        again = None if recovered else strategy.recover(batch.conflict, grant)
        if again is not None:
            grant, recovered = again, True
        elif attempt_number + 1 < strategy.max_attempts:
            time.sleep(strategy.backoff_s(attempt_number))
        else:
            break
        retries += 1
    return [
        PurchaseResult(
            Outcome.BUSY, strategy.name, fence=grant.token, conflicts=conflicts, retries=retries, timings=Timings()
        )
        for _ in asks
    ]


def _results(
    strategy: Strategy,
    batch: BatchAttempt,
    asks: list[Ask],
    *,
    product_id: int,
    grant: Grant,
    conflicts: int,
    retries: int,
) -> list[PurchaseResult]:
    """Each purchase's answer, after the batch committed: one that cannot be built never fails the others."""
    results = []
    for ask, attempt in zip(asks, batch.attempts, strict=True):
        common = {"conflicts": conflicts, "retries": retries, "timings": Timings()}
        try:
            if isinstance(attempt, IntegrityError):
                result = constraint_hit(
                    strategy, attempt, product_id=product_id, customer=ask.customer, key=ask.key, **common
                )
            else:
                result = result_of(strategy, attempt, grant=grant, **common)
        except Exception:
            # Alone, this purchase would raise (a 500); here the batch has committed, so the others
            # keep their true answers and this one is told what was written for it.
            logger.exception("%s: a committed batch could not answer %s; answered from its rows", strategy.name, ask)
            result = _committed_answer(strategy, attempt, **common)
        results.append(result)
    return results


def _committed_answer(strategy: Strategy, attempt, **common) -> PurchaseResult:
    """Its order if one was written, else busy: a refused purchase's savepoint wrote nothing."""
    order = getattr(attempt, "order", None)
    if order is not None:
        return PurchaseResult(Outcome.CONFIRMED, strategy.name, order_id=order.pk, fence=order.fence, **common)
    return PurchaseResult(Outcome.BUSY, strategy.name, **common)
