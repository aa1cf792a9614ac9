"""The critical section for a batch of purchases of one product: one read, one write, one commit.

A leader (:mod:`inventory.batched`) holds the strategy's guard once and runs this section for up
to ``BATCH`` queued purchases. It reads the row once (the strategy's own ``read``), decides each
purchase in queue order with :func:`~inventory.strategies.section.decide` against the running stock
and each customer's running units (:func:`decide_batch`), writes the stock once through the
strategy's own ``write`` (the same storage check as one purchase: a late batch is refused whole),
inserts the orders in one statement and adds the units in one upsert, one row per customer.

The outcomes equal running the batch one purchase at a time, in queue order, from the leader's
read: a repeated Idempotency-Key gets the order of the first purchase with it, as its retry would.
``savepoint_each`` runs the writes of each purchase in its own savepoint, so a constraint that refuses
one purchase (an :class:`IntegrityError`) refuses only that one; the runner uses it after a bulk
write failed, which aborts the whole transaction.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Callable

from django.db import IntegrityError, transaction
from django.utils import timezone

from ..models import Allocation, Order
from .contract import Grant, Refusal, SectionParts, SectionResult, Shelf
from .section import (
    allocate_many,
    decide_open,
    new_order,
    on_sale,
    roll_back_section,
    section_transaction,
    sell_and_commit,
)
from .statements import NewOrders, batch_side_read, lock_row


@dataclass(frozen=True)
class Ask:
    """One queued purchase."""

    customer: str
    quantity: int
    key: str = ""


@dataclass(frozen=True)
class Verdict:
    """What the rules say of one ask in its batch: exactly one field is set."""

    sell: bool = False  # a new order
    refusal: Refusal | None = None
    replay: Order | None = None  # an order its key already had before the batch
    same_as: int | None = None  # the index of the earlier ask in the batch whose order this key gets


@dataclass(frozen=True)
class BatchAttempt:
    """One run of the batch section: per ask an SectionResult (or the IntegrityError that refused it,
    with a savepoint per purchase), or the read the storage check refused."""

    attempts: list[SectionResult | IntegrityError] | None = None
    conflict: Shelf | None = None


def decide_batch(
    shelf: Shelf, asks: list[Ask], *, held: dict[str, int], orders: dict[tuple[str, str], Order], now: datetime
) -> list[Verdict]:
    """Each ask in order against the running stock and units: what sequential sections would decide."""
    stock, units, keyed = shelf.stock, dict(held), {}
    open_now = on_sale(shelf, now=now)  # one reading of the window for the batch, as for one purchase
    verdicts: list[Verdict] = []
    for index, ask in enumerate(asks):
        pair = (ask.customer, ask.key)
        if ask.key and pair in orders:
            verdicts.append(Verdict(replay=orders[pair]))
        elif ask.key and pair in keyed:
            verdicts.append(Verdict(same_as=keyed[pair]))
        else:
            held_now = units.get(ask.customer, 0)
            refusal = decide_open(shelf, stock=stock, quantity=ask.quantity, held=held_now, open_now=open_now)
            if refusal is None:
                stock -= ask.quantity
                units[ask.customer] = held_now + ask.quantity
                if ask.key:
                    keyed[pair] = index
            verdicts.append(Verdict(sell=refusal is None, refusal=refusal))
    return verdicts


def held_by(product_id: int, customers: set[str]) -> dict[str, int]:
    rows = Allocation.objects.filter(product_id=product_id, customer__in=customers)
    return dict(rows.values_list("customer", "units"))


def order_for(strategy: SectionParts, shelf: Shelf, ask: Ask, grant: Grant) -> Order:
    """``ask``'s order at the price of the batch's one read (``shelf``), which decided it."""
    return new_order(
        strategy.name,
        product_id=shelf.product_id,
        customer=ask.customer,
        quantity=ask.quantity,
        token=grant.token,
        key=ask.key,
        unit_price=shelf.price,
    )


def batch_section(
    strategy: SectionParts,
    *,
    product_id: int,
    asks: list[Ask],
    grant: Grant,
    savepoint_each: bool = False,
    joining: Callable[[], list[Ask]] | None = None,
) -> BatchAttempt:
    """Read once, decide each ask, write the stock once, the orders and units in bulk; one transaction.

    ``joining`` (``db``'s batches, whose row read waits for the row lock): called once the row is
    read, it returns the purchases that queued while the read waited, which join the batch after
    ``asks`` (their side reads one message more); the attempts then cover ``asks`` and them.
    """
    # Savepoints need Django's atomic around them: BEGIN then goes alone.
    with section_transaction(strategy, bound_by_first_statement=True, begin_rides=not savepoint_each):
        customers, pairs = _customers_and_keys(asks)
        shelf, held, orders = strategy.read_batch(product_id, customers=customers, pairs=pairs)
        joined = joining() if joining is not None else []
        if joined:
            _read_joined(product_id, joined, customers=customers, pairs=pairs, held=held, orders=orders)
            asks = [*asks, *joined]
        verdicts = decide_batch(shelf, asks, held=held, orders=orders, now=timezone.now())
        if savepoint_each:
            verdicts, created = _write_one_by_one(strategy, product_id, asks, verdicts, shelf=shelf, grant=grant)
        else:
            created = _write_in_bulk(strategy, product_id, asks, verdicts, shelf=shelf, grant=grant)
        if created is None:
            roll_back_section()
            return BatchAttempt(conflict=shelf)
    return BatchAttempt(attempts=_attempts(verdicts, created))


def _customers_and_keys(asks: list[Ask]) -> tuple[set[str], set[tuple[str, str]]]:
    """The customers of ``asks`` and their (customer, Idempotency-Key) pairs, the batch's side reads."""
    return {ask.customer for ask in asks}, {(ask.customer, ask.key) for ask in asks if ask.key}


def _read_joined(
    product_id: int,
    joined: list[Ask],
    *,
    customers: set[str],
    pairs: set[tuple[str, str]],
    held: dict[str, int],
    orders: dict[tuple[str, str], Order],
) -> None:
    """Add to ``held`` and ``orders`` what the batch's first read did not cover of ``joined``: the
    row is locked by then, so the second read sees what its last holder committed, as the first did."""
    new_customers, new_pairs = _customers_and_keys(joined)
    new_customers, new_pairs = new_customers - customers, new_pairs - pairs
    if new_customers or new_pairs:
        more_held, more_orders = batch_side_read(product_id, customers=new_customers, pairs=new_pairs)
        held.update(more_held)
        orders.update(more_orders)


def _write_in_bulk(
    strategy: SectionParts, product_id: int, asks: list[Ask], verdicts: list[Verdict], *, shelf: Shelf, grant: Grant
) -> dict[int, Order] | None:
    """The sold asks' stock (one checked write), units and orders in one statement
    (:func:`~inventory.strategies.statements.sell`); None when the check refused."""
    sold = [index for index, verdict in enumerate(verdicts) if verdict.sell]
    if not sold:
        return {}
    units = Counter()
    for index in sold:
        units[asks[index].customer] += asks[index].quantity
    each = [(asks[i].customer, asks[i].quantity, asks[i].key) for i in sold]
    # At the price of the batch's one read (``shelf``), which decided them.
    orders = NewOrders(strategy.name, shelf.product_id, grant.token, timezone.now(), shelf.price, each)
    update = strategy.stock_update(shelf, quantity=sum(asks[i].quantity for i in sold), grant=grant)
    ids = sell_and_commit(update, units=dict(units), cap=shelf.per_customer_limit, orders=orders)
    if ids is None:
        return None
    return dict(zip(sold, orders.saved(ids), strict=True))


def _write_one_by_one(
    strategy: SectionParts, product_id: int, asks: list[Ask], verdicts: list[Verdict], *, shelf: Shelf, grant: Grant
) -> tuple[list[Verdict | IntegrityError], dict[int, Order] | None]:
    """Each sold ask's units and order in a savepoint; the asks after a refused one decided again.

    The row is locked first, as every writer of the sale locks it before the customers' units: a
    reset holds the row and then deletes the units, and this batch holding a customer's units while
    it waited for the row deadlocked with it. A row changed meanwhile is the storage check's to refuse."""
    lock_row(product_id)
    held = held_by(product_id, {ask.customer for ask in asks})
    stock, created, final = shelf.stock, {}, []
    for index, ask in enumerate(asks):
        verdict = verdicts[index]
        if verdict.replay is None:
            keyed = {(asks[i].customer, asks[i].key): order for i, order in created.items() if asks[i].key}
            verdict = decide_batch(replace(shelf, stock=stock), [ask], held=held, orders=keyed, now=timezone.now())[0]
        if verdict.sell:
            try:
                with transaction.atomic():
                    allocate_many(
                        product_id=product_id, units={ask.customer: ask.quantity}, cap=shelf.per_customer_limit
                    )
                    created[index] = order_for(strategy, shelf, ask, grant)
                    created[index].save()
            except IntegrityError as exc:
                created.pop(index, None)
                final.append(exc)
                continue
            stock -= ask.quantity
            held[ask.customer] = held.get(ask.customer, 0) + ask.quantity
        final.append(verdict)
    sold = shelf.stock - stock
    if sold and not strategy.write(shelf, quantity=sold, grant=grant):
        return final, None
    return final, created


def _attempts(
    verdicts: list[Verdict | IntegrityError], created: dict[int, Order]
) -> list[SectionResult | IntegrityError]:
    attempts: list[SectionResult | IntegrityError] = []
    for index, verdict in enumerate(verdicts):
        if isinstance(verdict, IntegrityError):
            attempts.append(verdict)
        elif verdict.sell:
            attempts.append(SectionResult(order=created[index]))
        elif verdict.replay is not None:
            attempts.append(SectionResult(order=verdict.replay, replayed=True))
        elif verdict.same_as is not None:
            attempts.append(SectionResult(order=created[verdict.same_as], replayed=True))
        else:
            attempts.append(SectionResult(refusal=verdict.refusal))
    return attempts
