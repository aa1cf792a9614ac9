"""The section's SQL, written so that the hold is a few round trips (issue 28: a short hold).

Inside the guard a purchase used to take nine round trips: BEGIN, ``SET LOCAL lock_timeout``, the
row, the customer's order under the key, their units, the stock UPDATE, the units upsert, the
order INSERT, COMMIT; each ORM call also compiled its query in Python while the row (or the lock)
was held. Here:

* :func:`first_read`: the transaction's ``lock_timeout`` (``set_config(..., true)``, which is
  ``SET LOCAL``), the row and, when nothing can have changed them since the statement began, the
  customer's order under the key and their units, in one statement. A ``FOR UPDATE`` read may
  wait for the row, and its subqueries would see the data as it was before that wait; it reads
  them in a second statement of the same message (see below), which starts after the row's lock.
* :func:`sell`: the checked stock UPDATE, the units upsert and the order INSERT in one statement
  (data-modifying CTEs). The upsert and the INSERT read the UPDATE's ``RETURNING``: when the
  storage check refuses the write, nothing is inserted and no row comes back. A constraint that
  refuses (the units' CHECK, the order's unique key) raises :class:`~django.db.IntegrityError` as
  the separate statements did. With ``commit`` the transaction's COMMIT follows in the same
  message: the row's lock is taken and released inside PostgreSQL, with no Python (and no wait
  for this process's turn on the GIL or a core) in between.

* The BEGIN: psycopg sends the BEGIN of Django's ``atomic`` alone, a round trip before the first
  statement; a section that is not inside another transaction keeps autocommit on and sends
  ``BEGIN;`` in its first message instead (:class:`~inventory.strategies.section.RidingBegin`).
  A purchase's section transaction is then two round trips, BEGIN to COMMIT.

One message, several statements: Django's psycopg cursor binds parameters on the client and sends
the text with the simple query protocol, which runs each statement of a message in turn, each
with its own snapshot (READ COMMITTED), and stops at the first error. psycopg keeps every
statement's result (``nextset()``). An error in the write leaves the COMMIT unrun and the
transaction aborted; the section's ``transaction.atomic`` rolls it back as before.

No Django model query runs here: the statements are plain SQL on Django's connection, so they
run inside the section's transaction (``transaction.atomic``) like the ORM's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Sequence

from django.db import connection

from ..models import Allocation, Order, Product
from .contract import Shelf
from .prepared import execute

#: SQL text and its parameters.
Statement = tuple[str, list]

PRODUCT = Product._meta.db_table
ORDER = Order._meta.db_table
ALLOCATION = Allocation._meta.db_table

SHELF_FIELDS = ("id", "stock", "version", "fence", "per_customer_limit", "sale_starts_at", "sale_ends_at", "price")
_SHELF = ", ".join(f"p.{field}" for field in SHELF_FIELDS)
#: The first statement's first column: the transaction's bound on every wait for a row lock.
_LOCK_TIMEOUT = "set_config('lock_timeout', %s, true)"
_KEYED_ORDER = (
    f"(SELECT o.id FROM {ORDER} o WHERE o.product_id = {{product}} AND o.customer = %s AND o.idempotency_key = %s)"
)
_REPLAY = _KEYED_ORDER.format(product="%s")
#: The same, for the row the statement reads (``p``).
_REPLAY_OF_ROW = _KEYED_ORDER.format(product="p.id")
_UNITS_HELD = f"(SELECT a.units FROM {ALLOCATION} a WHERE a.product_id = {{product}} AND a.customer = %s)"
_UNITS = _UNITS_HELD.format(product="%s")
#: The same, for the row the statement reads (``p``).
_UNITS_OF_ROW = _UNITS_HELD.format(product="p.id")
#: An order's columns, and the model's names for them (``Order.from_db``).
_ORDER_ATTNAMES = [field.attname for field in Order._meta.concrete_fields]
_ORDER_COLUMNS = ", ".join(field.column for field in Order._meta.concrete_fields)
# A batch's lookups, one index probe per customer or per (customer, key) pair, the pairs a JSON
# parameter. Written as ``IN`` lists they were planned on the product's rows alone and filtered:
# a product's orders and units grow through the sale, and the planner's statistics (taken before
# it, or never) call that product's rows few, so every batch read every row the sale had written
# so far (3,000 in 2.6 ms at the end of a 3,000-unit sale; the lateral probes: 10 in 0.3 ms).
# ``OFFSET 0`` keeps each probe a subquery of its own, which the planner cannot merge into one
# scan of the product's rows.
_KEYED_ORDERS = f"""SELECT o.* FROM json_array_elements(%s::json) AS v(pair) CROSS JOIN LATERAL (
SELECT {_ORDER_COLUMNS} FROM {ORDER} WHERE product_id = %s AND customer = v.pair->>0
AND idempotency_key = v.pair->>1 AND idempotency_key <> '' OFFSET 0) o"""
_CUSTOMERS_UNITS = f"""SELECT a.* FROM json_array_elements_text(%s::json) AS v(customer) CROSS JOIN LATERAL (
SELECT customer, units FROM {ALLOCATION} WHERE product_id = %s AND customer = v.customer OFFSET 0) a"""


def _with_keyed_orders(statement: Statement, product_id: int, pairs: set[tuple[str, str]]) -> list[Statement]:
    """``statement`` followed, in the same message, by the read of the orders already placed under
    ``pairs`` (customer, Idempotency-Key), when there are any."""
    if not pairs:
        return [statement]
    return [statement, (_KEYED_ORDERS, [json.dumps(sorted(pairs)), product_id])]


def _keyed_orders_after(cursor, pairs: set[tuple[str, str]]) -> dict[tuple[str, str], Order]:
    """The orders :func:`_with_keyed_orders` read, from the cursor's next result (none without pairs)."""
    if not pairs:
        return {}
    cursor.nextset()
    orders = [Order.from_db(connection.alias, _ORDER_ATTNAMES, row) for row in cursor.fetchall()]
    return {(order.customer, order.idempotency_key): order for order in orders}


def _one_row(sql: str, params: Sequence) -> tuple | None:
    with connection.cursor() as cursor:
        execute(cursor, (sql, list(params)))
        return cursor.fetchone()


def _row_read(product_id: int, *, lock_timeout_ms: int | None, for_update: bool, columns: list[str], params: list):
    """The row (and ``columns`` more, with their ``params``) as the transaction's first statement."""
    bound = [_LOCK_TIMEOUT] if lock_timeout_ms is not None else []
    bound_params = [str(int(lock_timeout_ms))] if lock_timeout_ms is not None else []
    sql = f"SELECT {', '.join([*bound, _SHELF, *columns])} FROM {PRODUCT} p WHERE p.id = %s"
    return sql + (" FOR UPDATE" if for_update else ""), [*bound_params, *params, product_id]


def _read_row(cursor, product_id: int, *, lock_timeout_ms: int | None) -> tuple[Shelf, tuple]:
    """The shelf and the columns after it, from the message's first result."""
    row = cursor.fetchone()
    if row is None:
        raise Product.DoesNotExist(f"no product {product_id}")
    row = row[1:] if lock_timeout_ms is not None else row
    return Shelf(*row[: len(SHELF_FIELDS)]), row[len(SHELF_FIELDS) :]


def first_read(
    product_id: int, *, lock_timeout_ms: int | None, for_update: bool, customer: str | None = None, key: str = ""
) -> tuple[Shelf, int | None, int]:
    """(the row, the id of the customer's order under ``key`` or None, their units) in one round
    trip; without a ``customer`` only the row (None, 0). With ``for_update`` the order and units
    are a second statement of the message (:func:`side_read`), run once the row is locked.
    ``lock_timeout_ms`` (not None) makes this the transaction's first statement's bound."""
    columns, params, after = [], [], None
    if customer is not None and not for_update:
        columns = [_REPLAY if key else "NULL", _UNITS]
        params = [*([product_id, customer, key] if key else []), product_id, customer]
    elif customer is not None:
        after = side_read(product_id, customer=customer, key=key)
    row = _row_read(product_id, lock_timeout_ms=lock_timeout_ms, for_update=for_update, columns=columns, params=params)
    with connection.cursor() as cursor:
        execute(cursor, row, *([after] if after is not None else []))
        shelf, rest = _read_row(cursor, product_id, lock_timeout_ms=lock_timeout_ms)
        if after is not None:
            cursor.nextset()
            rest = cursor.fetchone()
    if customer is None:
        return shelf, None, 0
    replay_id, units = rest
    return shelf, replay_id, units or 0


def batch_read(
    product_id: int, *, lock_timeout_ms: int | None, for_update: bool, customers: set[str], pairs: set[tuple[str, str]]
) -> tuple[Shelf, dict[str, int], dict[tuple[str, str], Order]]:
    """A batch's reads in one message: the row (its first statement), then the ``customers``' units
    and the orders already placed under the ``pairs`` (customer, Idempotency-Key), each a statement
    of its own, run once the row is read (and, ``for_update``, locked)."""
    row = _row_read(product_id, lock_timeout_ms=lock_timeout_ms, for_update=for_update, columns=[], params=[])
    with connection.cursor() as cursor:
        execute(cursor, row, *_side_reads(product_id, customers, pairs))
        shelf, _ = _read_row(cursor, product_id, lock_timeout_ms=lock_timeout_ms)
        cursor.nextset()
        held, orders = _side_results(cursor, pairs)
    return shelf, held, orders


def batch_side_read(
    product_id: int, *, customers: set[str], pairs: set[tuple[str, str]]
) -> tuple[dict[str, int], dict[tuple[str, str], Order]]:
    """:func:`batch_read`'s side reads alone, one message: the units of purchases that joined the
    batch after its row read (the read waited for the row lock, and more queued meanwhile)."""
    with connection.cursor() as cursor:
        execute(cursor, *_side_reads(product_id, customers, pairs))
        return _side_results(cursor, pairs)


def _side_reads(product_id: int, customers: set[str], pairs: set[tuple[str, str]]) -> list[Statement]:
    """The ``customers``' units, then the orders under the ``pairs``' keys: a batch's side reads."""
    return _with_keyed_orders((_CUSTOMERS_UNITS, [json.dumps(sorted(customers)), product_id]), product_id, pairs)


def _side_results(cursor, pairs: set[tuple[str, str]]) -> tuple[dict[str, int], dict[tuple[str, str], Order]]:
    """What :func:`_side_reads` read, from the cursor's current result on."""
    return dict(cursor.fetchall()), _keyed_orders_after(cursor, pairs)


#: The product's columns ``redis-stock`` reads before its counter's script (its Redis keys are
#: named after the SKU; the rest loads the counter when Redis has none).
_SALE_FIELDS = ("id", "sku", "stock", "per_customer_limit", "sale_starts_at", "sale_ends_at")


def sale_read(product_id: int, pairs: set[tuple[str, str]]) -> tuple[Product, dict[tuple[str, str], Order]]:
    """The product as ``redis-stock`` needs it before its counter's script (only :data:`_SALE_FIELDS`
    loaded) and the orders already placed under the ``pairs`` (customer, Idempotency-Key), in one
    message, outside any transaction. Plain SQL: the two ORM queries it replaces (and their
    compilation in Python) were about 30 % of a batched ``redis-stock`` purchase's Python time
    (py-spy --gil)."""
    read = (f"SELECT {', '.join(_SALE_FIELDS)} FROM {PRODUCT} WHERE id = %s", [product_id])
    with connection.cursor() as cursor:
        execute(cursor, *_with_keyed_orders(read, product_id, pairs))
        row = cursor.fetchone()
        orders = _keyed_orders_after(cursor, pairs)
    if row is None:
        raise Product.DoesNotExist(f"no product {product_id}")
    return Product.from_db(connection.alias, list(_SALE_FIELDS), row), orders


def shelf_by_sku(sku: str, *, customer: str, key: str = "") -> tuple[Shelf, int | None, int] | None:
    """The purchase's plain read before any guard, one round trip: (the row, the id of the
    customer's order under ``key`` or None, the units the customer holds), or None when no product
    has ``sku``. The units let this read refuse as the section would (the limit before the stock).
    Plain SQL: the ORM's query compiler cost this read (and the order's, then a query of its own)
    about 40 % of a pod's Python time in a batched deep run (py-spy --gil)."""
    replay = _REPLAY_OF_ROW if key else "NULL"
    params = [customer, key] if key else []
    row = _one_row(
        f"SELECT {_SHELF}, {replay}, {_UNITS_OF_ROW} FROM {PRODUCT} p WHERE p.sku = %s", [*params, customer, sku]
    )
    return None if row is None else (Shelf(*row[:-2]), row[-2], row[-1] or 0)


def side_read(product_id: int, *, customer: str, key: str) -> Statement:
    """(the id of the customer's order under ``key`` or None, their units), as one statement."""
    replay = _REPLAY if key else "NULL"
    params = [product_id, customer, key] if key else []
    return f"SELECT {replay}, {_UNITS}", [*params, product_id, customer]


def replay_read(product_id: int, *, lock_timeout_ms: int, customer: str, key: str) -> int | None:
    """The transaction's first statement when there is no row to read first: its ``lock_timeout``
    and the id of the customer's order under ``key`` (None without a key or an order)."""
    replay = _REPLAY if key else "NULL"
    params = [product_id, customer, key] if key else []
    return _one_row(f"SELECT {_LOCK_TIMEOUT}, {replay}", [str(int(lock_timeout_ms)), *params])[1]


def checked_update(shelf: Shelf, *, quantity: int, token: int | None, fenced: bool) -> Statement:
    """The stock write of :func:`~inventory.strategies.section.checked_write`, as SQL."""
    sets, set_params = ["stock = %s", "version = version + 1"], [shelf.stock - quantity]
    where, where_params = ["id = %s"], [shelf.product_id]
    if fenced:
        where.append("version = %s")
        where_params.append(shelf.version)
        if token is not None:
            where.append("fence < %s")
            where_params.append(token)
            sets.append("fence = %s")
            set_params.append(token)
    return f"UPDATE {PRODUCT} SET {', '.join(sets)} WHERE {' AND '.join(where)}", set_params + where_params


def take_update(product_id: int, quantity: int, *, now: datetime) -> Statement:
    """Take ``quantity`` units while the sale is on and the row holds them (a conditional UPDATE)."""
    sql = (
        f"UPDATE {PRODUCT} SET stock = stock - %s, version = version + 1 WHERE id = %s AND stock >= %s"
        " AND (sale_starts_at IS NULL OR sale_starts_at <= %s) AND (sale_ends_at IS NULL OR sale_ends_at > %s)"
    )
    return sql, [quantity, product_id, quantity, now, now]


def lock_row(product_id: int) -> None:
    """Lock the product's row for the rest of the transaction (it waits for its holder, if any)."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT 1 FROM {PRODUCT} WHERE id = %s FOR UPDATE", [product_id])


def run_update(statement: Statement) -> bool:
    """Run a one-row UPDATE; True when it changed the row."""
    with connection.cursor() as cursor:
        execute(cursor, statement)
        return cursor.rowcount == 1


# The units upsert (the CHECK refuses a total past ``cap``) and the orders, both from ``taken``. A
# batch's per-customer and per-order values are one JSON parameter each, so the statement's text is
# the same for a batch of any size (psycopg converts a query's placeholders once and caches it, but
# only for statements of at most 50 parameters: a batch of 64 in VALUES rows had 500 and was parsed
# anew every time, 8 % of a batched pod's GIL samples), and psycopg binds one string where it used
# to dump five arrays element by element: 73 us against 211 us a batch of ten on the 2026-12-03
# machine (ClientCursor.mogrify).
_UNITS_FROM_TAKEN = f"""INSERT INTO {ALLOCATION} (product_id, customer, units, cap)
SELECT taken.id, v.key, v.value::integer, %s FROM taken, json_each_text(%s::json) AS v
ON CONFLICT (product_id, customer)
DO UPDATE SET units = {ALLOCATION}.units + EXCLUDED.units, cap = EXCLUDED.cap"""
_ORDER_COLUMNS_WRITTEN = "(product_id, customer, quantity, strategy, fence, idempotency_key, created_at, unit_price)"
# A section's orders share their strategy, fence (the grant's), time and unit price (its one read's):
# those are one parameter each; the rest is a JSON array of [customer, quantity, key], inserted in its order.
_ORDERS_FROM_TAKEN = f"""INSERT INTO {ORDER} {_ORDER_COLUMNS_WRITTEN}
SELECT taken.id, v.e->>0, (v.e->>1)::integer, %s::varchar, %s::bigint, v.e->>2, %s::timestamptz, %s::numeric
FROM taken, json_array_elements(%s::json) WITH ORDINALITY AS v(e, n)
ORDER BY v.n RETURNING id"""
# The same for one customer and one order, with a parameter per value: a purchase served alone
# (every BATCH 1 section) sends no array. psycopg dumps an array parameter in Python, about 6 us
# for a one-element list against under 1 us for a scalar; the eight arrays were a tenth of a
# purchase's instructions (callgrind, docs/batching.md).
_UNIT_FROM_TAKEN = f"""INSERT INTO {ALLOCATION} (product_id, customer, units, cap)
SELECT taken.id, %s::varchar, %s::integer, %s FROM taken
ON CONFLICT (product_id, customer)
DO UPDATE SET units = {ALLOCATION}.units + EXCLUDED.units, cap = EXCLUDED.cap"""
_ORDER_FROM_TAKEN = f"""INSERT INTO {ORDER} {_ORDER_COLUMNS_WRITTEN}
SELECT taken.id, %s::varchar, %s::integer, %s::varchar, %s::bigint, %s::varchar, %s::timestamptz, %s::numeric
FROM taken RETURNING id"""
_ORDER_FIELDS = ("customer", "quantity", "strategy", "fence", "idempotency_key", "created_at", "unit_price")


@dataclass(frozen=True)
class NewOrders:
    """The orders one section writes: what they share (its strategy, the product, its grant's
    fence, one time, the unit price its read saw) and each one's (customer, quantity,
    Idempotency-Key), in the order given. They become models once written (:meth:`saved`), as a
    read builds them: a model built before the write (Django's ``Model.__init__`` by keyword,
    about 8 µs an order on the 2026-12-06 machine) was work done while the row or the guard was held."""

    strategy: str
    product_id: int
    fence: int | None
    created_at: datetime
    unit_price: Decimal
    each: list[tuple[str, int, str]]

    def saved(self, ids: list[int]) -> list[Order]:
        """The orders as written under ``ids`` (one per order, in the order given)."""
        shared = {"product_id": self.product_id, "strategy": self.strategy, "fence": self.fence}
        shared |= {"created_at": self.created_at, "unit_price": self.unit_price}
        orders = []
        for pk, (customer, quantity, key) in zip(ids, self.each, strict=True):
            values = {**shared, "id": pk, "customer": customer, "quantity": quantity, "idempotency_key": key}
            orders.append(Order.from_db(connection.alias, _ORDER_ATTNAMES, [values[name] for name in _ORDER_ATTNAMES]))
        return orders


def units_upsert(units: dict[str, int], cap: int) -> Statement:
    """The units upsert of :func:`sell` for ``units`` (customer → units), one statement whatever their number."""
    if len(units) == 1:
        ((customer, amount),) = units.items()
        return _UNIT_FROM_TAKEN, [customer, amount, cap]
    return _UNITS_FROM_TAKEN, [cap, json.dumps(units)]


def order_values(order: Order) -> list:
    """One order's values, in :data:`_ORDER_FROM_TAKEN`'s order."""
    return [getattr(order, field) for field in _ORDER_FIELDS]


def orders_insert(orders: NewOrders) -> Statement:
    """The INSERT of ``orders`` from ``taken``, returning their ids in the order given."""
    if len(orders.each) == 1:
        ((customer, quantity, key),) = orders.each
        values = {"customer": customer, "quantity": quantity, "idempotency_key": key, "strategy": orders.strategy}
        values |= {"fence": orders.fence, "created_at": orders.created_at, "unit_price": orders.unit_price}
        return _ORDER_FROM_TAKEN, [values[field] for field in _ORDER_FIELDS]
    shared = [orders.strategy, orders.fence, orders.created_at, orders.unit_price]
    return _ORDERS_FROM_TAKEN, [*shared, json.dumps(orders.each)]


def sell(
    update: Statement, *, units: dict[str, int], cap: int, orders: NewOrders, commit: bool = False
) -> list[int] | None:
    """The stock ``update``, each customer's ``units`` and the ``orders`` (at least one) in one
    statement: the new orders' ids in the order given, or None when ``update``
    changed no row. The ids come back sorted: the sequence hands them out in insertion order, which
    is the order given (as Django's ``bulk_create`` relies on). ``commit``: the transaction's
    COMMIT in the same message (the caller's transaction must be the outermost and end here)."""
    update_sql, update_params = update
    units_sql, unit_params = units_upsert(units, cap)
    orders_sql, order_params = orders_insert(orders)
    sql = (
        f"WITH taken AS ({update_sql} RETURNING id), units AS ({units_sql}), placed AS ({orders_sql})"
        " SELECT id FROM placed ORDER BY id"
    )
    with connection.cursor() as cursor:
        execute(cursor, (sql, [*update_params, *unit_params, *order_params]), then="COMMIT" if commit else "")
        ids = [row[0] for row in cursor.fetchall()]
    return ids or None


# The atomic shape: the units first (within the product's limit, or nothing), the stock only if
# they were added, the order only if the stock was taken. The units' row comes from the product's
# (no product: no row, nothing added; a limit read by a subquery would be NULL there, a 500), and
# that row is locked first, as every other writer of the sale locks it before the customers' units:
# a reset holds the row and deletes the units, and a purchase that took the customer's units' row
# before waiting for the product's deadlocked with it (one of the two failed, a 500). Its limit is
# then the row's latest, not the one from before the wait, and a customer's first units past it are
# not inserted (the allocation's CHECK refused them: a purchase refused by a constraint, which the
# burst's judge reads as a strategy that let a bad write through).
_TAKE_AND_SELL = f"""WITH units AS (INSERT INTO {ALLOCATION} (product_id, customer, units, cap)
SELECT id, %s, q, per_customer_limit
FROM (SELECT id, per_customer_limit, %s::integer AS q FROM {PRODUCT} WHERE id = %s FOR UPDATE) p
WHERE q <= per_customer_limit
ON CONFLICT (product_id, customer)
DO UPDATE SET units = {ALLOCATION}.units + EXCLUDED.units, cap = EXCLUDED.cap
WHERE {ALLOCATION}.units + EXCLUDED.units <= EXCLUDED.cap RETURNING units),
taken AS ({{take}} AND EXISTS (SELECT 1 FROM units) RETURNING id, price),
placed AS (INSERT INTO {ORDER} {_ORDER_COLUMNS_WRITTEN}
SELECT taken.id, %s::varchar, %s::integer, %s::varchar, %s::bigint, %s::varchar, %s::timestamptz, taken.price
FROM taken RETURNING id, unit_price)
SELECT (SELECT count(*) FROM units), (SELECT id FROM placed), (SELECT unit_price FROM placed)"""


def take_and_sell(take: Statement, *, order: Order) -> tuple[bool, int | None]:
    """The customer's units within the limit, then ``take`` (a :func:`take_update`), then the
    ``order`` (built, not saved), in one statement: (the units were added, the order's id or None).
    Units added and no order: the caller rolls the units back. The order's unit price is the
    product's as the conditional UPDATE took the units (that UPDATE is this shape's read and
    decision, under the row's lock), set on ``order`` from the INSERT's RETURNING."""
    take_sql, take_params = take
    unit_params = [order.customer, order.quantity, order.product_id]
    order_params = order_values(order)[:-1]  # all but the unit price, which comes from ``taken``
    with connection.cursor() as cursor:
        execute(cursor, (_TAKE_AND_SELL.format(take=take_sql), [*unit_params, *take_params, *order_params]))
        added, order_id, unit_price = cursor.fetchone()
    if order_id is not None:
        order.unit_price = unit_price
    return added == 1, order_id
