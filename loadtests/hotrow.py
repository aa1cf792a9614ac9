"""The hot-row limit: what this machine's PostgreSQL gives one product row, without the shop.

Plain psycopg, no Django, no HTTP. ``connections`` processes, each with its own connection, buy
from one product row until ``purchases`` have been asked for, in one of two shapes:

* ``batch`` 1, one purchase per transaction: ``UPDATE inventory_product SET stock = stock - 1,
  version = version + 1 WHERE id = %s AND stock >= 1``, the order's ``INSERT`` reading its
  ``RETURNING`` (nothing when the unit was not taken), then ``COMMIT``: the writes of every
  strategy's section at BATCH=1, and none of its reads, guard or HTTP;
* ``batch`` K, K purchases per commit: one ``UPDATE`` of K units (the same condition, refused
  whole when fewer are left, as a late batch is), the K orders in the same ``INSERT``, one
  ``COMMIT``: the writes of a combined section.

The write and its ``COMMIT`` go in one message (client-side binding, the simple query protocol), as
the shop's section sends them: the row lock is held from the ``UPDATE`` to the ``COMMIT`` inside
PostgreSQL, with no round trip between. A process per connection, as ``pgbench`` runs its clients:
the client's Python never waits for another connection's thread to give back the GIL while holding
the row (with threads of one process, 85 connections sold 425/s where ``pgbench`` sold 741/s, and
2,154/s at 2). Each shape runs at every count of :data:`CONNECTION_COUNTS` (:func:`best_shape`); its
best is the limit, as a floor is the best a request can do. So purchases/s here is the physical
limit of the shape on this machine: no strategy, which adds its reads, its guard and a request's
path around the same writes, can beat it. The burst reads every strategy row against it
(``hot_row_ratio``, ``flashsale --hot-row``). The orders are real rows (strategy ``hot-row``, no
fence, no Idempotency-Key): the caller resets the sale afterwards. Nothing here writes the
customers' units (``inventory_allocation``): each purchase is a new customer, whose limit cannot be
reached."""

from __future__ import annotations

import contextlib
import multiprocessing
import threading
import time
from dataclasses import asdict, dataclass
from typing import Callable

import psycopg

#: The ``strategy`` column of the orders the hot row writes, and the name of its table rows.
HOT_ROW = "hot-row"
#: The connection counts a shape is run with; its limit is the best of them. On 2 cores one
#: purchase per commit peaks at 2 connections (pgbench: 1,698 tps at 1, 2,154 at 2, 2,007 at 4, 741
#: at 85), so more connections measure the row lock's queue, not the row.
CONNECTION_COUNTS = (1, 2, 4, 8)
#: Every connection must be open within this long; a race must end within this long.
START_TIMEOUT_S = 30.0
RACE_TIMEOUT_S = 300.0


class HotRowError(RuntimeError):
    """A connection of the hot row failed (its first line says how)."""


# The units (refused whole when fewer are left), the orders of one transaction (one row per customer
# in the array, none when nothing was taken, each at the price the UPDATE read, as a purchase names
# the price its read saw) and the COMMIT, in one message.
TAKE_AND_RECORD = (
    "WITH taken AS (UPDATE inventory_product SET stock = stock - %s, version = version + 1"
    " WHERE id = %s AND stock >= %s RETURNING id, price)"
    " INSERT INTO inventory_order"
    " (product_id, customer, quantity, unit_price, strategy, fence, idempotency_key, created_at)"
    " SELECT taken.id, customer, 1, taken.price, %s, NULL, '', now() FROM taken, unnest(%s::text[]) AS customer;"
    " COMMIT"
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


@dataclass
class Tally:
    sold: int = 0
    refused: int = 0
    commits: int = 0
    error: str | None = None


def take_claims(left, batch: int) -> int:
    """Up to ``batch`` of the purchases still to ask for (a shared counter: every process takes from it)."""
    with left.get_lock():
        taken = min(batch, left.value)
        left.value -= taken
        return taken


def buy(conn: psycopg.Connection, *, product_id: int, left, batch: int, who: str, tally: Tally) -> None:
    """One connection's loop: claim up to ``batch`` purchases, take them in one transaction, repeat."""
    number = 0
    with psycopg.ClientCursor(conn) as cursor:
        while units := take_claims(left, batch):
            customers = [f"{who}-{number + i}" for i in range(units)]
            cursor.execute(TAKE_AND_RECORD, (units, product_id, units, HOT_ROW, customers))
            if cursor.rowcount != units:  # nothing taken, nothing written (the COMMIT ended an empty transaction)
                tally.refused += units
                continue
            number += units
            tally.sold += units
            tally.commits += 1


def connection_process(dsn: str, product_id: int, batch: int, who: str, left, start, tallies) -> None:
    """One process, one connection: opened first, then the race once every connection is open."""
    tally = Tally()
    try:
        with psycopg.connect(dsn, autocommit=False) as conn:
            start.wait(START_TIMEOUT_S)
            buy(conn, product_id=product_id, left=left, batch=batch, who=who, tally=tally)
    except BaseException as exc:  # handed to the parent, which raises it
        start.abort()
        tally.error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    tallies.put(asdict(tally))


def forkserver():
    """The processes' start method: a fork server (started once, spawned clean, with this module
    loaded) forks each connection's process; nothing of this process's threads or connections
    goes with it, and a race after the first starts its processes in milliseconds."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__])
    return context


def race(dsn: str, *, product_id: int, purchases: int, connections: int, batch: int) -> tuple[list[Tally], float]:
    """One process per connection (the client has no GIL to share, as PostgreSQL's own ``pgbench``
    has none), each connection opened first, all released at once: (their tallies, seconds)."""
    context = forkserver()
    left = context.Value("q", purchases)
    start = context.Barrier(connections + 1)
    tallies = context.Queue()
    processes = [
        context.Process(
            target=connection_process,
            args=(dsn, product_id, batch, f"{HOT_ROW}-{index}", left, start, tallies),
            name=f"{HOT_ROW}-{index}",
            daemon=True,
        )
        for index in range(connections)
    ]
    try:
        for process in processes:
            process.start()
        with contextlib.suppress(threading.BrokenBarrierError):  # a connection failed: its tally says why
            start.wait(START_TIMEOUT_S)
        began = time.perf_counter()
        results = [Tally(**tallies.get(timeout=RACE_TIMEOUT_S)) for _ in processes]
        seconds = time.perf_counter() - began
    finally:
        for process in processes:
            process.join(5)
            if process.is_alive():
                process.kill()
    return results, seconds


def run_shape(dsn: str, *, product_id: int, purchases: int, connections: int, batch: int) -> HotRowRun:
    """Run one shape on the product row (on sale, with its stock already set) and audit the row after it."""
    if purchases < 1 or connections < 1 or batch < 1:
        raise ValueError("purchases, connections and batch must each be 1 or more")
    connections = min(connections, -(-purchases // batch))  # more would find nothing to claim
    tallies, seconds = race(dsn, product_id=product_id, purchases=purchases, connections=connections, batch=batch)
    failed = next((tally.error for tally in tallies if tally.error is not None), None)
    if failed is not None:
        raise HotRowError(failed)
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


def best_shape(
    dsn: str,
    *,
    product_id: int,
    purchases: int,
    batch: int,
    counts: tuple[int, ...] = CONNECTION_COUNTS,
    reset: Callable[[], None],
) -> tuple[HotRowRun, list[HotRowRun]]:
    """The shape at each connection count of ``counts`` (``reset()`` restores the row before each):
    (the fastest run whose audit balances, or the first that does not; every run)."""
    runs = []
    for connections in counts:
        reset()
        run = run_shape(dsn, product_id=product_id, purchases=purchases, connections=connections, batch=batch)
        runs.append(run)
        if not run.ok:
            return run, runs
    return max(runs, key=lambda run: run.rps), runs


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
