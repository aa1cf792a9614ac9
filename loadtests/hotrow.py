"""The hot-row limit: what this machine's PostgreSQL gives one product row, without the shop.

Plain psycopg, no Django, no HTTP. ``connections`` threads, each on its own connection, buy from
one product row until ``purchases`` have been asked for, in one of two shapes:

* ``batch`` 1, one purchase per transaction: ``UPDATE inventory_product SET stock = stock - 1,
  version = version + 1 WHERE id = %s AND stock >= 1``, then, if it took the unit, the order's
  ``INSERT``, then ``COMMIT``: the writes of every strategy's section at BATCH=1, and none of its
  reads, guard or HTTP;
* ``batch`` K, K purchases per commit: one ``UPDATE`` of K units (the same condition, refused
  whole when fewer are left, as a late batch is), the K orders in one ``INSERT``, one ``COMMIT``:
  the writes of a combined section.

The row lock is held from the ``UPDATE`` to the ``COMMIT`` (the ``INSERT``'s round trip and the
commit's), so purchases/s here is the physical limit of the shape on this machine: no strategy,
which adds its reads, its guard and a request's path around the same writes, can beat it. The
burst reads every strategy row against it (``hot_row_ratio``, ``flashsale --hot-row``). The orders
are real rows (strategy ``hot-row``, no fence, no Idempotency-Key): the caller resets the sale
afterwards. Nothing here writes the customers' units (``inventory_allocation``): each purchase is a
new customer, whose limit cannot be reached.
"""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass

import psycopg

#: The ``strategy`` column of the orders the hot row writes, and the name of its table rows.
HOT_ROW = "hot-row"

TAKE = "UPDATE inventory_product SET stock = stock - %s, version = version + 1 WHERE id = %s AND stock >= %s"
# The orders of one transaction in one statement: one row per customer in the array.
RECORD = (
    "INSERT INTO inventory_order (product_id, customer, quantity, strategy, fence, idempotency_key, created_at) "
    "SELECT %s, customer, 1, %s, NULL, '', now() FROM unnest(%s::text[]) AS customer"
)


@dataclass(frozen=True)
class HotRowRun:
    """One shape's run: what was asked, what the row gave, how fast, and the audit after it."""

    name: str  # "hot-row 1", "hot-row 64"
    batch: int  # purchases per transaction
    connections: int
    purchases: int  # asked for
    sold: int
    refused: int  # asked for but refused by the UPDATE's condition (too few units left)
    commits: int  # transactions that sold
    seconds: float  # the first thread's start to the last one's end
    rps: float  # purchases sold per second
    stock_final: int
    orders: int  # the shape's order rows (units: one each)
    oversold: int  # units ordered beyond what left the shelf, or a shelf below zero
    ok: bool

    def as_dict(self) -> dict:
        return asdict(self)


class Claims:
    """The purchases still to ask for, handed out ``batch`` at a time across threads."""

    def __init__(self, purchases: int) -> None:
        self._left = purchases
        self._lock = threading.Lock()

    def take(self, batch: int) -> int:
        with self._lock:
            taken = min(batch, self._left)
            self._left -= taken
            return taken


@dataclass
class Tally:
    sold: int = 0
    refused: int = 0
    commits: int = 0
    error: BaseException | None = None


def buy(conn: psycopg.Connection, *, product_id: int, claims: Claims, batch: int, who: str, tally: Tally) -> None:
    """One connection's loop: claim up to ``batch`` purchases, take them in one transaction, repeat."""
    number = 0
    with conn.cursor() as cursor:
        while units := claims.take(batch):
            cursor.execute(TAKE, (units, product_id, units))
            if cursor.rowcount != 1:
                conn.rollback()
                tally.refused += units
                continue
            customers = [f"{who}-{number + i}" for i in range(units)]
            number += units
            cursor.execute(RECORD, (product_id, HOT_ROW, customers))
            conn.commit()
            tally.sold += units
            tally.commits += 1


def race(dsn: str, *, product_id: int, purchases: int, connections: int, batch: int) -> tuple[list[Tally], float]:
    """Every connection opened first, then all threads released at once: (their tallies, seconds)."""
    claims = Claims(purchases)
    tallies = [Tally() for _ in range(connections)]
    start = threading.Barrier(connections + 1)
    conns: list[psycopg.Connection] = []

    def run(index: int) -> None:
        start.wait()
        try:
            buy(
                conns[index],
                product_id=product_id,
                claims=claims,
                batch=batch,
                who=f"{HOT_ROW}-{index}",
                tally=tallies[index],
            )
        except BaseException as exc:  # handed to the caller, which raises it
            tallies[index].error = exc

    threads = [threading.Thread(target=run, args=(i,), name=f"{HOT_ROW}-{i}") for i in range(connections)]
    try:
        for _ in range(connections):
            conns.append(psycopg.connect(dsn, autocommit=False))  # one at a time: a failure closes those opened
        for thread in threads:
            thread.start()
        start.wait()
        began = time.perf_counter()
        for thread in threads:
            thread.join()
        seconds = time.perf_counter() - began
    finally:
        for conn in conns:
            conn.close()
    return tallies, seconds


def run_shape(dsn: str, *, product_id: int, purchases: int, connections: int, batch: int) -> HotRowRun:
    """Run one shape on the product row (on sale, with its stock already set) and audit the row after it."""
    if purchases < 1 or connections < 1 or batch < 1:
        raise ValueError("purchases, connections and batch must each be 1 or more")
    connections = min(connections, -(-purchases // batch))  # more would find nothing to claim
    tallies, seconds = race(dsn, product_id=product_id, purchases=purchases, connections=connections, batch=batch)
    failed = next((tally.error for tally in tallies if tally.error is not None), None)
    if failed is not None:
        raise failed
    sold = sum(tally.sold for tally in tallies)
    stock, initial, orders = audit_row(dsn, product_id=product_id)
    oversold = max(0, orders - (initial - stock)) + max(0, -stock)
    return HotRowRun(
        name=f"{HOT_ROW} {batch}",
        batch=batch,
        connections=connections,
        purchases=purchases,
        sold=sold,
        refused=sum(tally.refused for tally in tallies),
        commits=sum(tally.commits for tally in tallies),
        seconds=round(seconds, 3),
        rps=round(sold / seconds, 1) if seconds else 0.0,
        stock_final=stock,
        orders=orders,
        oversold=oversold,
        ok=oversold == 0 and orders == sold == initial - stock,
    )


def audit_row(dsn: str, *, product_id: int) -> tuple[int, int, int]:
    """(stock, initial stock, units on the hot row's orders) of the product, read after a run."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        stock, initial = conn.execute(
            "SELECT stock, initial_stock FROM inventory_product WHERE id = %s", (product_id,)
        ).fetchone()
        (orders,) = conn.execute(
            "SELECT coalesce(sum(quantity), 0) FROM inventory_order WHERE product_id = %s AND strategy = %s",
            (product_id, HOT_ROW),
        ).fetchone()
    return stock, initial, int(orders)


def spare_connections(dsn: str, *, keep: int) -> int:
    """Connections PostgreSQL has free now (max_connections − reserved − in use), less ``keep``."""
    with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
        limit = int(conn.execute("SHOW max_connections").fetchone()[0])
        reserved = int(conn.execute("SHOW superuser_reserved_connections").fetchone()[0])
        (in_use,) = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'"
        ).fetchone()
    return limit - reserved - in_use - keep
