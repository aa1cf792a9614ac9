"""The critical section every strategy runs: read the row, decide, write, record the order.

The rules are :func:`decide`, written once. A strategy changes only how the row is read
(plain, or ``FOR UPDATE``) and how the write is checked (:func:`checked_write`):

* **version check**: the write lands only if the row is still at the version that was read, so
  a write based on a read that is no longer current changes nothing;
* **fence check**: the write lands only if the writer's token is newer than the last token that
  wrote the row, so a delayed write from an older lock grant changes nothing after a newer one.

The fenced write requires both, and sets the row's fence to the token: the fence only grows.
Together they refuse (1) a holder whose read is no longer current (A reads, B reads, A writes,
B writes: B refused) and (2) an older token's write after a newer one has written (A reads,
pauses past its lease, B reads and writes, A writes: A refused). A write from an older token
whose read is still current is refused too (its token is not newer than a row fence that a
newer grant has set), unless no newer grant has written yet, in which case nothing is lost.
Any check of this kind alone prevents oversell; the lock then saves the conflicts.
"""

from __future__ import annotations

import operator
import time
from contextlib import contextmanager, nullcontext
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Callable, Iterator, TypeVar

from django.db import Error, OperationalError, connection, transaction
from django.db.backends.utils import debug_transaction
from django.utils import timezone
from psycopg.pq import TransactionStatus

from ..models import Allocation, Order, Product
from .contract import Grant, Outcome, Refusal, SectionParts, SectionResult, Shelf
from .prepared import forget, is_stale
from .statements import (
    SHELF_FIELDS,
    NewOrders,
    Statement,
    batch_read,
    checked_update,
    first_read,
    replay_read,
    run_update,
    sell,
    take_and_sell,
    take_update,
)

#: PostgreSQL's SQLSTATE for "lock_timeout passed while waiting for a lock" (lock_not_available).
LOCK_NOT_AVAILABLE = "55P03"


@dataclass
class Spans:
    """What the section transactions run inside :func:`timed_transactions` came to."""

    ms: list[float] = field(default_factory=list)  # each transaction, BEGIN to COMMIT (or ROLLBACK)
    # Their COMMITs: the round trip that carried each (its own, or the write's when it rode along,
    # see sell_and_commit); a ROLLBACK ending a refused write counts too.
    commit_ms: float = 0.0
    # The SQL messages they sent through the cursor, one round trip each (a message may hold several
    # statements: the BEGIN riding the first, a FOR UPDATE read's side reads, the COMMIT riding with
    # the write; a BEGIN or COMMIT sent alone is not counted): each one's send time
    # (``time.perf_counter``) and round trip, from its send to its reply read (ms, inside the hold).
    sends: list[tuple[float, float]] = field(default_factory=list)

    def count(self, execute, sql, params, many, context):
        """A ``connection.execute_wrapper``: one more message, and its round trip's milliseconds."""
        started = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            self.sends.append((started, (time.perf_counter() - started) * 1000))

    def since(self, moment: float | None = None) -> tuple[int, float]:
        """The messages sent at or after ``moment`` (None: all of them) and their round trips' ms: a
        purchase that joined a batch during its read counts only those sent once it was taken."""
        later = [ms for sent, ms in self.sends if moment is None or sent >= moment]
        return len(later), sum(later)


#: Where :func:`section_transaction` notes its transactions (:class:`Spans`) while a runner collects
#: them (:func:`timed_transactions`); None: nobody is collecting.
_transaction_spans: ContextVar[Spans | None] = ContextVar("transaction_spans", default=None)


@contextmanager
def timed_transactions() -> Iterator[Spans]:
    """Collect the milliseconds, BEGIN to COMMIT (or ROLLBACK), of every section transaction run
    inside, their COMMITs' own milliseconds and the SQL statements they sent.

    For a strategy without a lock the transactions are its hold: what a purchase keeps the row (and
    its connection) for, as a lock's hold is grant to release.
    """
    spans = Spans()
    token = _transaction_spans.set(spans)
    try:
        yield spans
    finally:
        _transaction_spans.reset(token)


@contextmanager
def section_transaction(
    strategy: SectionParts, *, bound_by_first_statement: bool = False, begin_rides: bool = True
) -> Iterator[None]:
    """The section's transaction, whose first statement bounds every wait for a row lock.

    A row lock held elsewhere (an open admin transaction, a stuck pod, ``psql``) would otherwise
    hold the section, its guard and its batch's followers for as long as it is held. ``SET LOCAL``
    ends with the transaction, so pooled connections, ``reset_sale``, ``restock`` and migrations
    keep their own behaviour. A wait past it raises :class:`OperationalError` (55P03, see
    :func:`lock_timed_out`), which the purchase path answers busy. While :func:`timed_transactions`
    collects, it gets the duration (from entering, as the ``SET LOCAL`` opens the transaction, to
    after the commit), the commit's own (the body's end to after the commit) and the statements sent.
    ``bound_by_first_statement``: the caller's first statement sets it (``set_config``, see
    :mod:`.statements`), one round trip fewer inside the hold.

    With ``begin_rides`` (and the first statement setting the bound), a section that is not inside
    another transaction sends its BEGIN in its first message (:class:`RidingBegin`) instead of in
    a round trip of its own, as psycopg does for Django's ``atomic``: one round trip fewer again.
    A body that needs Django's ``atomic`` inside (savepoints) passes ``begin_rides=False``.
    """
    spans = _transaction_spans.get()
    began = body_done = time.perf_counter()
    riding = bound_by_first_statement and begin_rides and _may_ride()
    try:
        with (
            connection.execute_wrapper(spans.count) if spans is not None else nullcontext(),
            _riding_transaction() if riding else transaction.atomic(),
        ):
            if not bound_by_first_statement:
                with connection.cursor() as cursor:
                    cursor.execute(f"SET LOCAL lock_timeout = {int(strategy.row_lock_timeout_ms)}")
            yield
            body_done = time.perf_counter()
    except Exception as exc:
        if is_stale(exc) and not connection.in_atomic_block:
            forget()  # rolled back by now: the next section prepares its statements anew
        raise
    finally:
        if spans is not None:
            ended = time.perf_counter()
            spans.ms.append((ended - began) * 1000)
            spans.commit_ms += (ended - body_done) * 1000 if body_done > began else 0.0


class RidingBegin:
    """A ``connection.execute_wrapper`` that sends the transaction's BEGIN in its first message.

    Django's ``atomic`` turns autocommit off, and psycopg then sends BEGIN in a round trip of its
    own before the first statement: inside a lock's hold, one round trip of three. With autocommit
    left on, this wrapper prefixes the first statement with ``BEGIN;`` (the simple query protocol
    runs a message's statements in turn, and the transaction stays open after it) and steps the
    cursor past BEGIN's empty result, so the statement's caller reads its own as before.
    :func:`_riding_transaction` ends the transaction: the write's riding COMMIT
    (:func:`sell_and_commit`), else a COMMIT, or a ROLLBACK on an error or :func:`roll_back_section`.
    """

    def __init__(self) -> None:
        self.pending = True
        self.rollback = False

    def __call__(self, execute, sql, params, many, context):
        if not self.pending:
            return execute(sql, params, many, context)
        self.pending = False
        with debug_transaction(connection, "BEGIN"):  # Django's query log names it, as for atomic's
            pass
        if many:
            execute("BEGIN", None, False, context)
            return execute(sql, params, many, context)
        result = execute(f"BEGIN; {sql}", params, many, context)
        context["cursor"].nextset()
        return result


#: The section transaction running with its BEGIN riding (:class:`RidingBegin`) in this context, if any.
_riding: ContextVar[RidingBegin | None] = ContextVar("riding_begin", default=None)


def _may_ride() -> bool:
    """BEGIN may ride the first statement when no transaction is open: autocommit on, no ``atomic``."""
    return not connection.in_atomic_block and connection.get_autocommit()


@contextmanager
def _riding_transaction() -> Iterator[None]:
    riding = RidingBegin()
    token = _riding.set(riding)
    try:
        with connection.execute_wrapper(riding):
            yield
    except BaseException:
        try:
            _end_transaction(rollback=True)
        except Error:
            # The connection failed under the section (a dead backend): drop it, as Django's atomic
            # does when its ROLLBACK fails, and let the section's own error be the one raised.
            connection.close()
        raise
    else:
        _end_transaction(rollback=riding.rollback)
    finally:
        _riding.reset(token)


def _end_transaction(*, rollback: bool) -> None:
    """COMMIT (or ROLLBACK) the riding transaction unless the write's message already committed it;
    an aborted one (an error in its message) is rolled back."""
    raw = connection.connection
    if raw is None or raw.closed:
        return
    status = raw.info.transaction_status
    if status == TransactionStatus.IDLE:
        return
    if status != TransactionStatus.INTRANS:
        rollback = True
    command = "ROLLBACK" if rollback else "COMMIT"
    with debug_transaction(connection, command), connection.wrap_database_errors:
        raw.execute(command)


def roll_back_section() -> None:
    """End the running section transaction with a ROLLBACK, whichever way its BEGIN was sent."""
    riding = _riding.get()
    if riding is not None:
        riding.rollback = True
    else:
        transaction.set_rollback(True)


def lock_timed_out(exc: OperationalError) -> bool:
    """True when ``exc`` is a row-lock wait that ran past the section's ``lock_timeout``."""
    return getattr(exc.__cause__, "sqlstate", None) == LOCK_NOT_AVAILABLE


def read_shelf(product_id: int, *, for_update: bool = False) -> Shelf:
    rows = Product.objects.filter(pk=product_id)
    if for_update:
        rows = rows.select_for_update()
    return Shelf(*rows.values_list(*SHELF_FIELDS).get())


def on_sale(shelf: Shelf, *, now: datetime) -> bool:
    """``now`` lies inside the row's sale window."""
    return not (
        (shelf.sale_starts_at and now < shelf.sale_starts_at) or (shelf.sale_ends_at and now >= shelf.sale_ends_at)
    )


def decide(shelf: Shelf, *, quantity: int, held: int, now: datetime) -> Refusal | None:
    """The sale's rules, for every strategy: None when ``quantity`` units may be sold.

    ``held`` is what the customer already holds of this product (units across their orders).
    """
    return decide_open(shelf, stock=shelf.stock, quantity=quantity, held=held, open_now=on_sale(shelf, now=now))


def decide_open(shelf: Shelf, *, stock: int, quantity: int, held: int, open_now: bool) -> Refusal | None:
    """:func:`decide` with the sale window already read (``open_now``) and the row at ``stock``:
    a batch decides each purchase at the stock its earlier purchases left, against one reading
    of the window (``batch.decide_batch``)."""
    if not open_now:
        return Refusal(Outcome.NOT_ON_SALE)
    if held + quantity > shelf.per_customer_limit:
        return Refusal(Outcome.LIMIT_REACHED)
    if stock < quantity:
        return Refusal(Outcome.SOLD_OUT, units_left=max(stock, 0))
    return None


def checked_write(shelf: Shelf, *, quantity: int, token: int | None, fenced: bool) -> bool:
    """Write ``shelf.stock - quantity``; False when the storage check refused it.

    ``fenced``: only while the row is at ``shelf.version`` and, with a ``token``, only if the
    token is newer than the row's fence (which becomes the token). Unfenced: unconditionally,
    which is a lost update whenever two sections overlap.
    """
    return run_update(checked_update(shelf, quantity=quantity, token=token, fenced=fenced))


def held_units(product_id: int, customer: str) -> int:
    return (
        Allocation.objects.filter(product_id=product_id, customer=customer).values_list("units", flat=True).first() or 0
    )


# The customer's units: one upsert, one VALUES row per customer (a row may not be hit twice). The
# CHECK refuses a total past ``cap``.
ALLOCATE = """
INSERT INTO inventory_allocation (product_id, customer, units, cap) VALUES {rows}
ON CONFLICT (product_id, customer)
DO UPDATE SET units = inventory_allocation.units + EXCLUDED.units, cap = EXCLUDED.cap
"""
# The same, but adding nothing (and returning no row) when the total would pass the cap.
WITHIN_CAP = " WHERE inventory_allocation.units + EXCLUDED.units <= EXCLUDED.cap RETURNING units"
# The cap when the caller has not read the product: its limit, read by the same statement.
PRODUCT_LIMIT = "(SELECT per_customer_limit FROM inventory_product WHERE id = %s)"


def allocate(
    *, product_id: int, customer: str, quantity: int, cap: int | None = None, within_cap_only: bool = False
) -> bool:
    """Add ``quantity`` to the customer's units of the product (the CHECK refuses more than ``cap``,
    by default the product's per-customer limit)."""
    sql = ALLOCATE.format(rows=f"(%s, %s, %s, {'%s' if cap is not None else PRODUCT_LIMIT})")
    if within_cap_only:
        sql += WITHIN_CAP
    with connection.cursor() as cursor:
        cursor.execute(sql, [product_id, customer, quantity, product_id if cap is None else cap])
        return cursor.fetchone() is not None if within_cap_only else True


def allocate_many(*, product_id: int, units: dict[str, int], cap: int) -> None:
    """Add each customer's units in one upsert (the batch's customers, each once)."""
    sql = ALLOCATE.format(rows=", ".join(["(%s, %s, %s, %s)"] * len(units)))
    params = [value for customer, amount in units.items() for value in (product_id, customer, amount, cap)]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


def find_order(*, product_id: int, customer: str, key: str) -> Order | None:
    if not key:
        return None
    return Order.objects.filter(product_id=product_id, customer=customer, idempotency_key=key).first()


def _twin_order(product_id: int, customer: str, key: str) -> SectionResult | None:
    """The order a keyed purchase's twin committed while this one's section was refused, as its replay."""
    order = find_order(product_id=product_id, customer=customer, key=key)
    return SectionResult(order=order, replayed=True) if order is not None else None


#: How many times a read of the sale looks again for the key's order that a reset deleted between
#: its two reads (the order found by id, then read), before the purchase is answered busy: one reset
#: is met by one more read; three in a row, each between the two reads, is a sale being reset under
#: the shopper. The plain read (:func:`inventory.services.prepare`) and the section both stop there.
REPLAY_READ_TRIES = 3
R = TypeVar("R")
#: The id of the key's order in a section read (shelf, order id, units held): made once, not per purchase.
_KEYED_ORDER_ID = operator.itemgetter(1)


class KeptDeleting(Exception):
    """The key's order was deleted between a read's two reads :data:`REPLAY_READ_TRIES` times: the
    purchase is answered busy (it writes nothing; its retry reads the sale afresh)."""


def read_past_resets(read: Callable[[], R], order_id_of: Callable[[R], int | None]) -> tuple[R, Order | None]:
    """``read()``, and the order its result names under the purchase's key (``order_id_of``; None
    without one). A reset that commits between the two reads deletes that order: the sale is then
    read again, as it is now, :data:`REPLAY_READ_TRIES` times in all, then :class:`KeptDeleting`.
    The plain read and both section shapes read through here."""
    for _ in range(REPLAY_READ_TRIES):
        found = read()
        order_id = order_id_of(found)
        if order_id is None:
            return found, None
        replay = order_read_as(order_id)
        if replay is not None:
            return found, replay
    raise KeptDeleting


def order_read_as(order_id: int) -> Order | None:
    """The order a read found under a key, or None when a reset has deleted it since (the read and
    this are two statements): the caller reads again, and the key, with no order on the new sale,
    buys as a new purchase."""
    return Order.objects.filter(pk=order_id).first()


def new_order(
    strategy: str,
    *,
    product_id: int,
    customer: str,
    quantity: int,
    token: int | None,
    key: str = "",
    unit_price: Decimal | None = None,
) -> Order:
    """An order built before its write (not saved): what was bought, by whom, at what unit price,
    under which strategy and token, where the write takes the model (a savepoint's ``save()``,
    :func:`take_in_one_statement`'s one statement). A section's bulk write takes
    :class:`~.statements.NewOrders` and builds the models after it. ``unit_price`` is the price the
    read that decided the sale saw (``Shelf.price``); None only where the write itself reads it."""
    return Order(
        product_id=product_id,
        customer=customer,
        quantity=quantity,
        unit_price=unit_price,
        strategy=strategy,
        fence=token,
        idempotency_key=key,
    )


def section_read(
    strategy: SectionParts, product_id: int, *, customer: str | None = None, key: str = ""
) -> tuple[Shelf, int | None, int]:
    """The section's reads, its transaction's first message (whose first statement sets its
    ``lock_timeout``): (the row, the id of ``customer``'s order under ``key`` or None, their units);
    without a ``customer`` the row alone (None, 0). One round trip; after a ``FOR UPDATE`` read
    the side reads are a second statement of the message, so they see what the row's last holder
    committed."""
    return first_read(product_id, customer=customer, key=key, **_row_read_of(strategy))


def batch_reads(
    strategy: SectionParts, product_id: int, customers: set[str], pairs: set[tuple[str, str]]
) -> tuple[Shelf, dict[str, int], dict[tuple[str, str], Order]]:
    """A batch's reads, its transaction's first message (:func:`.statements.batch_read`): the row
    read as the strategy reads it, the customers' units, the orders under the keys; one round trip."""
    return batch_read(product_id, customers=customers, pairs=pairs, **_row_read_of(strategy))


def _row_read_of(strategy: SectionParts) -> dict:
    """How ``strategy`` reads the row: its transaction's bound on row-lock waits, and FOR UPDATE or not."""
    return {"lock_timeout_ms": strategy.row_lock_timeout_ms, "for_update": strategy.for_update}


def commit_rides() -> bool:
    """True when the section's write may carry its transaction's COMMIT (:func:`.statements.sell`):
    its BEGIN rode the first statement (:class:`RidingBegin`), or its ``transaction.atomic`` is the
    outermost block, so its end is the COMMIT. Inside another atomic block (a caller's transaction,
    a test's) it is a savepoint, and the write goes alone."""
    riding = _riding.get()
    if riding is not None:
        return not riding.rollback
    return len(connection.atomic_blocks) == 1 and not connection.needs_rollback


def sell_and_commit(update: Statement, *, units: dict[str, int], cap: int, orders: NewOrders) -> list[int] | None:
    """The section's write (:func:`.statements.sell`), with the COMMIT aboard when it may ride
    (:func:`commit_rides`): the section's last statement. While :func:`timed_transactions` collects,
    the round trip that carried the COMMIT counts as the commit's time."""
    rides = commit_rides()
    started = time.perf_counter()
    ids = sell(update, units=units, cap=cap, orders=orders, commit=rides)
    spans = _transaction_spans.get()
    if rides and spans is not None:
        spans.commit_ms += (time.perf_counter() - started) * 1000
    return ids


def saved(order: Order, pk: int) -> Order:
    """``order`` (built by :func:`new_order`, written by a statement of :mod:`.statements`) as saved."""
    order.pk = pk
    order._state.adding = False
    order._state.db = connection.alias
    return order


def attempt_section(
    strategy: SectionParts, *, product_id: int, customer: str, quantity: int, key: str, grant: Grant
) -> SectionResult:
    """One run of read → decide → write → record, in one transaction of two round trips: the reads
    with the BEGIN aboard (:class:`RidingBegin`) and the write with the COMMIT (:mod:`.statements`).
    Inside another transaction (:func:`commit_rides`) the section is a savepoint of Django's
    ``atomic``, its write goes alone and the caller commits."""
    with section_transaction(strategy, bound_by_first_statement=True):
        try:
            (shelf, _, held), replay = read_past_resets(
                lambda: strategy.read_section(product_id, customer=customer, key=key), _KEYED_ORDER_ID
            )
        except KeptDeleting:
            return SectionResult(refusal=Refusal(Outcome.BUSY))
        if replay is not None:
            return SectionResult(order=replay, replayed=True)
        now = timezone.now()
        refusal = decide(shelf, quantity=quantity, held=held, now=now)
        if refusal is not None:
            return SectionResult(refusal=refusal)
        placed = NewOrders(strategy.name, product_id, grant.token, now, shelf.price, [(customer, quantity, key)])
        update = strategy.stock_update(shelf, quantity=quantity, grant=grant)
        ids = sell_and_commit(update, units={customer: quantity}, cap=shelf.per_customer_limit, orders=placed)
        if ids is None:
            return SectionResult(conflict=shelf)
    return SectionResult(order=placed.saved(ids)[0])


def take_in_one_statement(
    strategy: SectionParts, *, product_id: int, customer: str, quantity: int, key: str, grant: Grant
) -> SectionResult:
    """The customer's units (upsert within the limit), the stock (conditional UPDATE) and the order
    in one statement, after the read of the key's order (the BEGIN aboard it): two round trips and
    the COMMIT, or the ROLLBACK that undoes units added when no stock was taken."""
    now = timezone.now()
    with section_transaction(strategy, bound_by_first_statement=True):
        try:
            _, replay = read_past_resets(
                lambda: replay_read(
                    product_id, lock_timeout_ms=strategy.row_lock_timeout_ms, customer=customer, key=key
                ),
                lambda replay_id: replay_id,
            )
        except KeptDeleting:
            return SectionResult(refusal=Refusal(Outcome.BUSY))
        if replay is not None:
            return SectionResult(order=replay, replayed=True)
        order = new_order(
            strategy.name, product_id=product_id, customer=customer, quantity=quantity, token=grant.token, key=key
        )
        order.created_at = now
        added, order_id = take_and_sell(take_update(product_id, quantity, now=now), order=order)
        if order_id is not None:
            return SectionResult(order=saved(order, order_id))
        if not added:
            # The upsert waited for a twin's units (the same key, sent again while the first was in
            # flight) and found the limit reached: that twin's order, now committed, is the answer.
            # No product (deleted since the plain read) adds nothing either: read_shelf says so.
            twin = _twin_order(product_id, customer, key)
            if twin is not None:
                return twin
            read_shelf(product_id)  # raises Product.DoesNotExist if a delete took the product since
            return SectionResult(refusal=Refusal(Outcome.LIMIT_REACHED))
        # Nothing taken: undo the units, then say why from the row as it is now.
        roll_back_section()
    twin = _twin_order(product_id, customer, key)  # a twin that took the last units: its order
    if twin is not None:
        return twin
    shelf = read_shelf(product_id)
    refusal = decide(shelf, quantity=quantity, held=held_units(product_id, customer), now=now)
    return SectionResult(refusal=refusal or Refusal(Outcome.SOLD_OUT, units_left=shelf.stock))
