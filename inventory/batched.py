"""Purchases that share a section (``BATCH`` > 1): a queue per SKU, one leader at a time.

A purchase that got past the shelf's plain read queues here: with ``QUEUE`` ``local`` on its
process's :class:`inventory.combining.Combiner` (one per strategy and SKU), with ``shared`` on the
SKU's Redis list, every process's and pod's (:class:`inventory.combining.SharedQueue`, on
``REDIS_URL``; its answers come back through Redis as :meth:`PurchaseResult.as_wire`). The leader
takes the strategy's guard once, then takes up to ``BATCH`` queued purchases (its own first, on
the local queue; for ``db``, whose guard is the section's row read, what queued while that read
waited joins the batch once it returns), runs :func:`inventory.strategies.batch.batch_section`
(one read, each decided in queue order, one checked stock write, bulk orders and units, one commit),
releases the guard, and hands each waiter its own answer. A conflict (the storage check refused
the batch's write) re-runs the whole batch as the strategy allows one purchase to re-run; an
``IntegrityError`` (which aborts the whole PostgreSQL transaction) re-runs the batch with each
purchase in its own savepoint, so one bad purchase never fails the others.

Once the batch has committed, every purchase gets its true answer: one whose answer cannot be
built (a constraint no outcome is mapped for) is told busy, as nothing was written for it, and
the others keep theirs. The combiner's "a failing leader answers its batch busy" covers only a
failure before the commit, when nothing of the batch was written.

A waiter still queued when ``ACQUIRE_TIMEOUT_MS`` has passed leaves the queue and is told busy
(503); one its leader has taken waits for the leader's answer (docs/batching.md), on the shared
queue for at most ``max(LOCK_TTL_MS, ROW_LOCK_TIMEOUT_MS)`` more (a leader in another process may
have died). A shared queue whose Redis does not answer answers busy.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from asyncio import AbstractEventLoop, get_running_loop
from dataclasses import asdict
from functools import partial
from typing import Any, Awaitable, Callable

import redis
import redis.asyncio
from asgiref.sync import async_to_sync
from django.db import DEFAULT_DB_ALIAS, DatabaseError, IntegrityError, OperationalError, connections

from .combining import (
    AsyncCombiner,
    AsyncSharedQueue,
    Combiner,
    SharedQueue,
    SharedTicket,
    Ticket,
    alead_batch,
    lead_batch,
)
from .results import PurchaseResult, Timings, constraint_hit, result_of
from .strategies.base import Strategy
from .strategies.batch import Ask, BatchAttempt
from .strategies.contract import Grant, Outcome
from .strategies.prepared import is_stale
from .strategies.section import lock_timed_out

logger = logging.getLogger(__name__)

_combiners: weakref.WeakKeyDictionary[Strategy, dict[str, Combiner]] = weakref.WeakKeyDictionary()
_async_combiners: weakref.WeakKeyDictionary[Strategy, dict[str, AsyncCombiner]] = weakref.WeakKeyDictionary()
_shared: weakref.WeakKeyDictionary[Strategy, dict[str, SharedQueue]] = weakref.WeakKeyDictionary()
# An asyncio Redis client belongs to the loop it first ran on: a shared queue per loop.
_async_shared: weakref.WeakKeyDictionary[
    AbstractEventLoop, weakref.WeakKeyDictionary[Strategy, dict[str, AsyncSharedQueue]]
] = weakref.WeakKeyDictionary()
# One Redis client per strategy for all its SKUs' shared queues (per loop under ASGI): a client per
# SKU kept a connection pool, and its idle connections, per SKU ever bought. A loop's are held until
# aclose_shared_queues() closes them on it, a replaced strategy's too (its connections are that loop's).
_shared_clients: weakref.WeakKeyDictionary[Strategy, redis.Redis] = weakref.WeakKeyDictionary()
_async_shared_clients: weakref.WeakKeyDictionary[AbstractEventLoop, dict[Strategy, redis.asyncio.Redis]] = (
    weakref.WeakKeyDictionary()
)
_combiners_lock = threading.Lock()
#: A blocking read of a shared queue's answer lasts at most its poll (0.2 s): far below this.
SHARED_SOCKET_TIMEOUT_S = 5.0


def combiner_for(strategy: Strategy, sku: str) -> Combiner:
    """The strategy's queue for ``sku`` in this process (its threads'), made on first use."""
    return _queue_of(_combiners, lambda: Combiner(limit=strategy.batch), strategy, sku)


def async_combiner_for(strategy: Strategy, sku: str) -> AsyncCombiner:
    """The strategy's queue for ``sku`` on this process's event loop (ASGI), made on first use."""
    return _queue_of(_async_combiners, lambda: AsyncCombiner(limit=strategy.batch), strategy, sku)


def shared_queue_for(strategy: Strategy, sku: str) -> SharedQueue:
    """The strategy's shared queue for ``sku`` (``QUEUE=shared``), as this process's threads reach it."""
    return _queue_of(_shared, lambda: _shared_queue(SharedQueue, _shared_clients, redis, strategy, sku), strategy, sku)


def async_shared_queue_for(strategy: Strategy, sku: str) -> AsyncSharedQueue:
    """The strategy's shared queue for ``sku`` as this event loop reaches it (ASGI)."""
    loop = get_running_loop()
    with _combiners_lock:
        registry = _async_shared.setdefault(loop, weakref.WeakKeyDictionary())
        clients = _async_shared_clients.setdefault(loop, {})
    make = lambda: _shared_queue(AsyncSharedQueue, clients, redis.asyncio, strategy, sku)  # noqa: E731
    return _queue_of(registry, make, strategy, sku)


async def aclose_shared_queues() -> None:
    """Close the running loop's shared-queue clients (every strategy's) and forget its shared queues:
    a purchase on this loop after it makes new ones."""
    loop = get_running_loop()
    with _combiners_lock:
        _async_shared.pop(loop, None)
        clients = _async_shared_clients.pop(loop, {})
    for client in clients.values():
        await client.aclose()


def shared_key(strategy: Strategy, sku: str) -> str:
    """The Redis list of ``sku``'s asks under ``strategy`` (its lease and answers are named after it)."""
    return f"flashsale:queue:{strategy.name}:{{{sku}}}"


def _shared_queue(kind, clients, client_module, strategy: Strategy, sku: str):
    """A shared queue of ``kind`` on the strategy's client of the shop's Redis in ``clients`` (made of
    ``client_module``, ``redis`` or ``redis.asyncio``, on first use; called under the registry's lock)."""
    client = clients.get(strategy)
    if client is None:
        client = clients[strategy] = client_module.Redis.from_url(
            strategy.config["REDIS_URL"], socket_timeout=SHARED_SOCKET_TIMEOUT_S, socket_connect_timeout=2.0
        )
    return kind(
        client,
        key=shared_key(strategy, sku),
        limit=strategy.batch,
        lease_ms=strategy.config["LOCK_TTL_MS"],
        item_of=lambda fields: Ask(**fields),
        answer_as=PurchaseResult.as_wire,
        answer_of=PurchaseResult.from_wire,
    )


def _queue_of(registry, make: Callable[[], Any], strategy: Strategy, sku: str):
    with _combiners_lock:
        mine = registry.setdefault(strategy, {})
        if sku not in mine:
            mine[sku] = make()
        return mine[sku]


def combiners_of(strategy: Strategy) -> dict[str, Combiner | AsyncCombiner]:
    """The queues the strategy has made so far, threads' and loop's (none while it runs with BATCH=1)."""
    with _combiners_lock:
        return {**_async_combiners.get(strategy, {}), **_combiners.get(strategy, {})}


def _ms(since: float, until: float | None = None) -> float:
    return ((until or time.perf_counter()) - since) * 1000


def pooled_connection_back() -> None:
    """A pooled connection this thread holds goes back to the pool while its purchase queues: only a
    leader needs one (a worker's threads share few). Most queued purchases hold none (answered from
    the remembered row, they read nothing), so the wrapper is looked up once and asked first whether
    it holds one: each read through the ``connection`` proxy is a thread-local lookup of its own."""
    db = connections[DEFAULT_DB_ALIAS]
    if db.connection is not None and db.settings_dict.get("OPTIONS", {}).get("pool") and not db.in_atomic_block:
        db.close()


def purchase_in_batch(
    strategy: Strategy, *, sku: str, product_id: int, customer: str, quantity: int, key: str
) -> PurchaseResult:
    """Queue the purchase and return its own answer, whoever's section served it."""
    pooled_connection_back()
    combiner = shared_queue_for(strategy, sku) if strategy.queue == "shared" else combiner_for(strategy, sku)

    def serve(take) -> None:
        run = partial(run_batch, take=take) if _joins(strategy) else run_batch
        lead_batch(strategy, combiner, take, sku=sku, product_id=product_id, run=run)

    ask, waits = Ask(customer, quantity, key), {"timeout_s": _queue_timeout_s(strategy), "busy": _busy_in(strategy)}
    if strategy.queue != "shared":
        return combiner.submit(ask, serve=serve, **waits).answer
    try:
        return combiner.submit(asdict(ask), serve=serve, taken_wait_s=_taken_wait_s(strategy), **waits).answer
    except redis.RedisError as exc:
        return _unreachable(strategy, exc)


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
    while it waits; its leader awaits the guard and ``run``, :func:`run_batch` on an ORM thread
    (given ``take`` for ``db``, as :func:`purchase_in_batch` gives it)."""
    shared = strategy.queue == "shared"
    combiner = async_shared_queue_for(strategy, sku) if shared else async_combiner_for(strategy, sku)

    async def serve(take) -> None:
        # The section runs on an ORM thread: its take hops back to the loop.
        runs = partial(run, take=async_to_sync(take)) if _joins(strategy) else run
        await alead_batch(strategy, combiner, take, sku=sku, product_id=product_id, run=runs)

    ask, waits = Ask(customer, quantity, key), {"timeout_s": _queue_timeout_s(strategy), "busy": _busy_in(strategy)}
    if not shared:
        return (await combiner.submit(ask, serve=serve, **waits)).answer
    try:
        return (await combiner.submit(asdict(ask), serve=serve, taken_wait_s=_taken_wait_s(strategy), **waits)).answer
    except redis.RedisError as exc:
        return _unreachable(strategy, exc)


def _joins(strategy: Strategy) -> bool:
    """Whether purchases queued while a batch's read waits join that batch: the read waits for the
    row lock inside the section (``db``), and the queue is this process's to take from again."""
    return strategy.for_update and strategy.queue != "shared"


def _queue_timeout_s(strategy: Strategy) -> float:
    return strategy.config["ACQUIRE_TIMEOUT_MS"] / 1000


def _taken_wait_s(strategy: Strategy) -> float:
    """How long a shared queue's submitter waits for the answer of an ask a leader took: the section
    that leader runs is bounded by its lease and by PostgreSQL's lock_timeout."""
    return max(strategy.config["LOCK_TTL_MS"], strategy.config["ROW_LOCK_TIMEOUT_MS"]) / 1000


def _unreachable(strategy: Strategy, exc: redis.RedisError) -> PurchaseResult:
    logger.warning("%s: the shared queue's Redis does not answer (%s): busy", strategy.name, exc)
    return PurchaseResult(Outcome.BUSY, strategy.name, timings=Timings())


def _busy_in(strategy: Strategy) -> Callable[[Ticket | SharedTicket], PurchaseResult]:
    """The answer of a purchase that left the queue unserved: busy, with its time queued."""

    def busy(ticket: Ticket | SharedTicket) -> PurchaseResult:
        return PurchaseResult(Outcome.BUSY, strategy.name, timings=Timings(queue_wait_ms=_ms(ticket.queued_at)))

    return busy


def run_batch(
    strategy: Strategy,
    grant: Grant,
    *,
    product_id: int,
    asks: list[Ask],
    timings: Timings,
    take: Callable[[], list[Ticket]] | None = None,
) -> list[PurchaseResult]:
    """The batch section until it writes; on a conflict re-run as the strategy allows, then busy.

    ``take``: the local queue's (``asks`` are its tickets' items, in order), for ``db``, whose batch
    read waits for the row lock: the purchases that queued meanwhile join the first attempt (and
    the leader's list of tickets, which ``take`` grows), and the answers cover them after ``asks``.
    Without it the batch is fixed when the guard is granted, as for the lock strategies, whose wait
    is over by then.
    """
    conflicts = retries = 0
    recovered, savepoint_each, stale_again = False, False, False
    joined: list[Ask] = []
    joining = _joining(take, len(asks), joined) if take is not None else None
    for attempt_number in range(strategy.max_attempts + 1):
        started = time.perf_counter()
        try:
            batch = strategy.attempt_batch(
                product_id=product_id, asks=asks, grant=grant, savepoint_each=savepoint_each, joining=joining
            )
        except IntegrityError:
            if savepoint_each:
                raise
            savepoint_each = True
            continue
        except OperationalError as exc:
            if not lock_timed_out(exc):
                raise
            break  # a row lock held elsewhere past ROW_LOCK_TIMEOUT_MS: rolled back, the batch is busy
        except DatabaseError as exc:
            if not is_stale(exc) or stale_again:
                raise
            stale_again = True  # rolled back, its statements dropped: run it once more, prepared anew
            continue
        finally:
            timings.db_ms += _ms(started)
            if joining is not None:  # only the first attempt's read waited for the row lock
                asks, joining = [*asks, *joined], None
        if batch.conflict is None:
            return _results(
                strategy, batch, asks, product_id=product_id, grant=grant, conflicts=conflicts, retries=retries
            )
        conflicts += 1
        retry = strategy.after_conflict(batch.conflict, grant, recovered=recovered, attempt=attempt_number)
        if retry is None:
            break
        (grant, recovered), retries = retry, retries + 1
    return _busy(strategy, asks, grant=grant, conflicts=conflicts, retries=retries)


def _busy(strategy: Strategy, asks: list[Ask], *, grant: Grant, conflicts: int, retries: int) -> list[PurchaseResult]:
    """A busy answer for each of ``asks``: the batch wrote nothing."""
    busy = partial(PurchaseResult, Outcome.BUSY, strategy.name, fence=grant.token, conflicts=conflicts, retries=retries)
    return [busy(timings=Timings()) for _ in asks]


def _joining(take: Callable[[], list[Ticket]], taken: int, joined: list[Ask]) -> Callable[[], list[Ask]]:
    """The purchases queued since the batch's first ``taken`` (up to ``BATCH`` in all), kept in ``joined``."""

    def join() -> list[Ask]:
        joined[:] = [ticket.item for ticket in take()[taken:]]
        return joined

    return join


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
        return PurchaseResult(
            Outcome.CONFIRMED, strategy.name, order_id=order.pk, fence=order.fence, quantity=order.quantity, **common
        )
    return PurchaseResult(Outcome.BUSY, strategy.name, **common)
