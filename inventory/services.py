"""The inventory's business logic: buy, restock and reset (the audit: :mod:`inventory.audit`).

Plain keyword-only functions. ``purchase`` returns an outcome for the expected refusals (sold
out, limit reached, busy, not on sale) and raises for bad input; any refusal leaves stock and
orders as they were. The critical section and its rules live in
:mod:`inventory.strategies.section`; this module runs it under the configured strategy.
"""

from __future__ import annotations

import logging
import re
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Iterator

import redis
from django.conf import settings
from django.db import IntegrityError, OperationalError, transaction
from django.utils import timezone

from . import soldout
from .audit import AuditReport, audit
from .batched import purchase_in_batch
from .errors import InvalidQuantity, InventoryError, KeyReused, ProductNotFound
from .limits import MAX_QUANTITY
from .models import Allocation, Order, Product
from .results import PurchaseResult, Timings, constraint_hit, result_of
from .strategies import get_strategy
from .strategies.base import Strategy
from .strategies.contract import Grant, LockUnavailable, Outcome, Refusal, SectionResult, Shelf
from .strategies.prepared import again_if_stale
from .strategies.redis_stock import forget_sale
from .strategies.section import (
    KeptDeleting,
    Spans,
    decide,
    lock_timed_out,
    on_sale,
    read_past_resets,
    timed_transactions,
)
from .strategies.statements import shelf_by_sku

logger = logging.getLogger(__name__)

#: The most units a product's stock columns hold (PostgreSQL's integer): a restock or reset past
#: it is refused with the most it can take, not written into an "integer out of range".
MAX_STOCK = 2**31 - 1
IDEMPOTENCY_KEY = re.compile(r"^[A-Za-z0-9_-]{1,64}$")

__all__ = [
    "MAX_QUANTITY",
    "AuditReport",
    "InvalidQuantity",
    "InventoryError",
    "Outcome",
    "ProductNotFound",
    "PurchaseResult",
    "Timings",
    "audit",
    "purchase",
    "reset_sale",
    "restock",
]


def check_quantity(quantity: object, *, limit: int = MAX_QUANTITY) -> int:
    """Return ``quantity`` as an int in 1..limit, or raise :class:`InvalidQuantity` (its ``most``: ``limit``)."""
    if isinstance(quantity, bool) or not isinstance(quantity, int):
        raise InvalidQuantity("quantity must be a whole number", most=limit)
    if not 1 <= quantity <= limit:
        raise InvalidQuantity(
            "quantity must be 1" if limit == 1 else f"quantity must be between 1 and {limit}", most=limit
        )
    return quantity


def most_per_request(per_customer_limit: int) -> int:
    """The most one purchase may name of a product: its per-customer limit, and never more than
    :data:`MAX_QUANTITY` (what the product page offers)."""
    return min(per_customer_limit, MAX_QUANTITY)


def sale_state(product: Product, *, now=None) -> str:
    """``upcoming``, ``live``, ``ended`` or ``sold_out``."""
    now = now or timezone.now()
    if product.sale_starts_at and now < product.sale_starts_at:
        return "upcoming"
    if product.sale_ends_at and now >= product.sale_ends_at:
        return "ended"
    if product.stock <= 0:
        return "sold_out"
    return "live"


def _elapsed_ms(since: float) -> float:
    """Milliseconds since ``since`` (a ``time.perf_counter()`` reading)."""
    return (time.perf_counter() - since) * 1000


@dataclass
class Ready:
    """A purchase the plain read could not answer: it goes through the strategy's section."""

    sku: str
    customer: str
    quantity: int
    key: str
    shelf: Shelf
    seen: soldout.Reading | None
    began: float
    timings: Timings


def purchase(
    *, sku: str, customer: str, quantity: int, idempotency_key: str = "", strategy: Strategy | None = None
) -> PurchaseResult:
    """Buy ``quantity`` units of ``sku`` for ``customer`` under ``strategy`` (default: the configured one).

    A refusal that the shelf already shows (not on sale, too few units) is answered from one
    plain read without the guard, which keeps thousands of late shoppers off the lock; it is
    exact when given, because it only says what the row held at that read. Otherwise the
    strategy's guard is taken, the section runs (read, decide, checked write, order) and
    commits, and only then is the guard released: releasing first would let the next holder
    read stock this one has not yet written. The same ``idempotency_key`` from the same
    customer gets the same confirmed order back, never a second one.
    """
    strategy = strategy or get_strategy()
    ready = prepare(strategy, sku=sku, customer=customer, quantity=quantity, idempotency_key=idempotency_key)
    if not isinstance(ready, PurchaseResult):
        with gone_is_not_found(sku):
            result = in_batch(strategy, ready) if strategy.batch > 1 else _alone(strategy, ready)
        ready = finish(strategy, result, ready)
    return same_purchase(ready, quantity=quantity, key=idempotency_key)


@contextmanager
def gone_is_not_found(sku: str) -> Iterator[None]:
    """A product deleted after the plain read found it (a staff delete committed while the purchase
    waited for its guard or the row) is gone for the shopper too: 404, as the plain read would say,
    not the section's ``Product.DoesNotExist`` (a 500). Its transaction rolled back, nothing written."""
    try:
        yield
    except Product.DoesNotExist as exc:
        raise ProductNotFound(f"no product with sku {sku!r}") from exc


def same_purchase(result: PurchaseResult, *, quantity: int, key: str) -> PurchaseResult:
    """``result``, unless its order is one ``key`` got before for another quantity: then
    :class:`KeyReused` (that order stands, and this request bought nothing: a replay writes nothing)."""
    if key and result.outcome is Outcome.CONFIRMED and result.quantity not in (None, quantity):
        units = "1 unit" if result.quantity == 1 else f"{result.quantity} units"
        raise KeyReused(
            f"Idempotency-Key {key!r} was used for an order of {units} (order {result.order_id}): "
            f"send a new key to buy {quantity}"
        )
    return result


def prepare(
    strategy: Strategy, *, sku: str, customer: str, quantity: int, idempotency_key: str
) -> PurchaseResult | Ready:
    """Check the input and answer what the plain read can (sold out, a replayed key, a refusal
    the shelf shows); the rest is :class:`Ready` for the section. Both servers start here.

    A SKU this process knows unmarked, with the row from its last read (:func:`soldout.remember_shelf`),
    needs no read here (:func:`_from_memory`)."""
    began = time.perf_counter()
    if not customer:
        raise InventoryError("a purchase needs a customer")
    if idempotency_key and not IDEMPOTENCY_KEY.match(idempotency_key):
        raise InventoryError("Idempotency-Key must be 1 to 64 letters, digits, - or _")
    timings = Timings()
    seen = soldout.read(sku, customer=customer, key=idempotency_key)
    if seen is not None and (seen.order_id or (seen.sold_out and not _past(seen.ends_at))):
        # A keyed retry of an order is checked against no product's limit: see the plain read's.
        check_quantity(quantity, limit=MAX_QUANTITY if seen.order_id else most_per_request(seen.limit or MAX_QUANTITY))
        timings.total_ms = _elapsed_ms(began)
        if seen.order_id:
            return PurchaseResult(
                Outcome.CONFIRMED, strategy.name, order_id=seen.order_id, quantity=seen.order_quantity, timings=timings
            )
        return PurchaseResult(Outcome.SOLD_OUT, strategy.name, units_left=0, timings=timings)
    known = seen.shelf if seen is not None else None
    if known is not None:
        answered = _from_memory(strategy, Ready(sku, customer, quantity, idempotency_key, known, seen, began, timings))
        if answered is not None:
            return answered
    try:
        found, replay = _plain_read(sku, customer=customer, key=idempotency_key)
    except KeptDeleting:
        timings.total_ms = _elapsed_ms(began)
        return PurchaseResult(Outcome.BUSY, strategy.name, timings=timings)
    if found is None:
        soldout.forget_unknown(sku, seen)
        raise ProductNotFound(f"no product with sku {sku!r}")
    shelf, _, held = found
    # A keyed retry gets its order back whatever the limit is now: staff may have lowered it since
    # (bad input is still 400; another quantity than the order's, 422).
    check_quantity(quantity, limit=MAX_QUANTITY if replay else most_per_request(shelf.per_customer_limit))
    if seen is not None:
        soldout.remember_shelf(sku, seen, shelf)
    ready = Ready(sku, customer, quantity, idempotency_key, shelf, seen, began, timings)
    refusal = None if replay else decide(shelf, quantity=quantity, held=held, now=timezone.now())
    if replay or refusal:
        settled = result_of(strategy, SectionResult(order=replay, refusal=refusal), timings=timings)
        return finish(strategy, settled, ready)
    return ready


def _plain_read(sku: str, *, customer: str, key: str) -> tuple[tuple[Shelf, int | None, int] | None, Order | None]:
    """:func:`shelf_by_sku`, and the order it found under ``key`` (None without one), read past
    resets that delete it (:func:`~inventory.strategies.section.read_past_resets`).

    Past its tries (a twin of the key ordering again after each reset, and staff resetting again
    before each second read) :class:`KeptDeleting` is raised, which the purchase answers busy. Not
    "as if no order existed": the last read's units were read beside an order that is gone, and
    deciding on them could refuse (the limit) for units the reset removed, or answer a key that has
    an order again by now with a new purchase's refusal. Busy writes nothing and claims nothing: the
    key still orders at most once, and its retry (Retry-After) reads the sale afresh."""
    return read_past_resets(
        lambda: shelf_by_sku(sku, customer=customer, key=key), lambda found: None if found is None else found[1]
    )


def _past_the_limit(quantity: object, shelf: Shelf) -> bool:
    """A whole number past what one purchase of ``shelf`` may name: bad input, unless it is a keyed
    retry of an order placed before staff lowered the limit (the plain read finds out which)."""
    return (
        isinstance(quantity, int)
        and not isinstance(quantity, bool)
        and quantity > most_per_request(shelf.per_customer_limit)
    )


def _from_memory(strategy: Strategy, ready: Ready) -> PurchaseResult | Ready | None:
    """A purchase of a SKU known unmarked, with the row as this process last read it: its limit
    and sale window hold (a change of the product would have dropped them), its stock does not,
    so only bad input and a closed sale are answered here. The section reads the row, and a keyed
    retry's order, under the guard; a refusal there is as exact as the plain read's.

    None: the plain read must answer. A keyed request memory would refuse (past the limit, or the
    sale over) may be the retry of an order placed before staff lowered the limit or the sale
    ended, and gets that order back; memory does not know the orders."""
    if ready.key and _past_the_limit(ready.quantity, ready.shelf):
        return None
    check_quantity(ready.quantity, limit=most_per_request(ready.shelf.per_customer_limit))
    if on_sale(ready.shelf, now=timezone.now()):
        return ready
    if ready.key:
        return None
    closed = SectionResult(refusal=Refusal(Outcome.NOT_ON_SALE))
    return finish(strategy, result_of(strategy, closed, timings=ready.timings), ready)


def in_batch(strategy: Strategy, ready: Ready) -> PurchaseResult:
    """The purchase queued for a section shared with others (``BATCH`` > 1)."""
    return purchase_in_batch(strategy, **queued(ready))


def queued(ready: Ready) -> dict:
    """What a combiner's queue needs of a purchase (``purchase_in_batch`` and its asyncio twin)."""
    return {
        "sku": ready.sku,
        "product_id": ready.shelf.product_id,
        "customer": ready.customer,
        "quantity": ready.quantity,
        "key": ready.key,
    }


def finish(strategy: Strategy, result: PurchaseResult, ready: Ready) -> PurchaseResult:
    """The purchase's total time, and the sold-out mark it leaves for later shoppers (:func:`_remember`)."""
    result.timings.total_ms = _elapsed_ms(ready.began)
    return _remember(strategy, result, sku=ready.sku, shelf=ready.shelf, seen=ready.seen)


def _alone(strategy: Strategy, ready: Ready) -> PurchaseResult:
    """One purchase in its own section: take the guard, run the section, commit, release."""
    waiting = time.perf_counter()
    try:
        with ExitStack() as held:
            transactions = held.enter_context(timed_transactions())
            grant = held.enter_context(strategy.guard(ready.sku))
            granted = time.perf_counter()
            result = section_of(strategy, grant, ready)
        held_for(strategy, ready.timings, waiting=waiting, granted=granted, transactions=transactions)
    except LockUnavailable:
        result = busy(strategy, ready.timings, waiting=waiting)
    return result


def section_of(strategy: Strategy, grant: Grant, ready: Ready) -> PurchaseResult:
    """:func:`run_section` for one purchase alone (its batch of 1)."""
    ready.timings.batch = 1
    return run_section(
        strategy,
        grant,
        product_id=ready.shelf.product_id,
        customer=ready.customer,
        quantity=ready.quantity,
        key=ready.key,
        timings=ready.timings,
    )


def held_for(strategy: Strategy, timings: Timings, *, waiting: float, granted: float, transactions: Spans) -> None:
    """Note a section's lock wait and hold (a lock's grant to release, or, with no lock, its
    transactions) and what its transactions came to (their COMMITs, their statements)."""
    if strategy.guarded:
        timings.lock_wait_ms, timings.lock_hold_ms = (granted - waiting) * 1000, _elapsed_ms(granted)
    elif transactions.ms:
        timings.lock_hold_ms = sum(transactions.ms)  # no lock: the hold is the section's transaction(s)
    timings.note_transactions(transactions)


def busy(strategy: Strategy, timings: Timings, *, waiting: float) -> PurchaseResult:
    """The guard was not granted in time: nothing ran, the shopper is told busy."""
    timings.lock_wait_ms = _elapsed_ms(waiting)
    return PurchaseResult(Outcome.BUSY, strategy.name, timings=timings)


def _past(moment: float | None) -> bool:
    return moment is not None and time.time() >= moment


def _remember(
    strategy: Strategy, result: PurchaseResult, *, sku: str, shelf: Shelf, seen: soldout.Reading | None
) -> PurchaseResult:
    """Leave the sold-out mark when the shelf was empty. A strategy that says "sold out" before the
    row (``redis-stock``) marks only once the row holds no units: until then an order for the last
    ones may be on its way, and its keyed retry, meeting the mark, would find no order and be told
    "sold out" (a read of one row by its key, on this path only until the mark is left)."""
    if seen is not None and result.outcome is Outcome.SOLD_OUT and result.units_left == 0:
        if strategy.sold_out_before_the_row and Product.objects.filter(pk=shelf.product_id, stock__gt=0).exists():
            return result
        soldout.mark(sku, generation=seen.generation, limit=shelf.per_customer_limit, ends_at=shelf.sale_ends_at)
    return result


def run_section(
    strategy: Strategy, grant: Grant, *, product_id: int, customer: str, quantity: int, key: str, timings: Timings
) -> PurchaseResult:
    """Run the section until it writes or refuses; re-run it on a conflict while the strategy allows."""
    conflicts = retries = 0
    recovered = False
    for attempt_number in range(strategy.max_attempts + 1):
        started = time.perf_counter()
        try:
            attempt = again_if_stale(
                partial(
                    strategy.attempt, product_id=product_id, customer=customer, quantity=quantity, key=key, grant=grant
                )
            )
        except OperationalError as exc:
            if not lock_timed_out(exc):
                raise
            # A row lock held elsewhere past ROW_LOCK_TIMEOUT_MS: rolled back, nothing written.
            return PurchaseResult(Outcome.BUSY, strategy.name, conflicts=conflicts, retries=retries, timings=timings)
        except IntegrityError as exc:
            return constraint_hit(
                strategy,
                exc,
                product_id=product_id,
                customer=customer,
                key=key,
                conflicts=conflicts,
                retries=retries,
                timings=timings,
            )
        finally:
            timings.db_ms += _elapsed_ms(started)
        if attempt.conflict is None:
            return result_of(strategy, attempt, grant=grant, conflicts=conflicts, retries=retries, timings=timings)
        conflicts += 1
        retry = strategy.after_conflict(attempt.conflict, grant, recovered=recovered, attempt=attempt_number)
        if retry is None:
            break
        (grant, recovered), retries = retry, retries + 1
    return PurchaseResult(
        Outcome.BUSY, strategy.name, fence=grant.token, conflicts=conflicts, retries=retries, timings=timings
    )


def restock(*, sku: str, quantity: int) -> Product:
    """Add ``quantity`` units to a product's stock (and to its initial stock)."""
    check_quantity(quantity, limit=1_000_000)
    with transaction.atomic():
        product = Product.objects.select_for_update().filter(sku=sku).first()
        if product is None:
            raise ProductNotFound(f"no product with sku {sku!r}")
        if product.initial_stock + quantity > MAX_STOCK:
            raise InvalidQuantity(
                f"a restock of {quantity} would take its initial stock to {product.initial_stock + quantity}, "
                f"past {MAX_STOCK}: add at most {MAX_STOCK - product.initial_stock}"
            )
        product.stock += quantity
        product.initial_stock += quantity
        product.version += 1
        product.save(update_fields=["stock", "initial_stock", "version"])
        _sale_changing(sku, reset=False)
    return product


def reset_sale(*, sku: str, stock: int) -> Product:
    """Start the sale of ``sku`` over: ``stock`` units, no orders, fence back to 0.

    The fence may go back to 0 because the lock services' counters never do (and, if one was
    restarted, a holder advances it past the row's fence: see ``strategies/fenced.py``).
    """
    if isinstance(stock, bool) or not isinstance(stock, int) or not 0 <= stock <= MAX_STOCK:
        raise InvalidQuantity(f"stock must be a whole number from 0 to {MAX_STOCK}")
    with transaction.atomic():
        product = Product.objects.select_for_update().filter(sku=sku).first()
        if product is None:
            raise ProductNotFound(f"no product with sku {sku!r}")
        Order.objects.filter(product=product).delete()
        Allocation.objects.filter(product=product).delete()
        product.initial_stock = stock
        product.stock = stock
        product.fence = 0
        product.version += 1
        product.save(update_fields=["initial_stock", "stock", "fence", "version"])
        _sale_changing(sku, reset=True)
    return product


def _sale_changing(sku: str, *, reset: bool) -> None:
    """Inside a restock or reset: what lives outside the database follows it.

    The sold-out mark's generation is raised before the commit, so if Redis does not answer
    the change is refused and nothing changes; ``inventory.receivers`` raises it again after
    the commit (a mark left meanwhile stops counting) and drops the ``redis-stock`` counter. A
    reset also drops the customers' units there: its orders are gone.
    """
    try:
        soldout.raise_generation(sku)
    except redis.RedisError as exc:
        raise InventoryError(
            f"Redis at {settings.INVENTORY['REDIS_URL']} does not answer ({exc}); nothing changed"
        ) from exc
    if reset:
        transaction.on_commit(lambda: _after_reset(sku))


def _after_reset(sku: str) -> None:
    soldout.sale_changed(sku)
    try:
        forget_sale(soldout.client(), sku, units_too=True)
    except redis.RedisError:
        logger.exception("could not drop the redis-stock counter of %s; run manage.py reconcile", sku)
