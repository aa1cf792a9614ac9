"""Measure the two routes to the section under ASGI (issue 29; docs/decisions.md has the figures).

    DJANGO_SETTINGS_MODULE=shop.settings DATABASE_POOL_MAX_SIZE=4 python scripts/async_routes.py

Django 5.2's ORM is sync only, so an ``async def`` purchase reaches its section one of two ways:

* ``orm-thread``: the project's one section (``inventory.services.section_of``, the ORM under
  ``transaction.atomic()``) on an ORM thread, awaited through ``sync_to_async`` (what the shop does);
* ``async-sql``: the same statements written again as SQL on psycopg 3's ``AsyncConnection`` from an
  ``AsyncConnectionPool``, awaited on the loop (the route not taken; written here only to measure it);
* ``sql-thread``: that SQL again, sync, through Django's connection on an ORM thread: what of the
  difference is the ORM's own cost (which WSGI pays too) and what is the hop to a thread.

Both hold the same asyncio Redis lock (``aguard`` of the ``redis`` strategy) around the section, on
one event loop with ``--tasks`` purchases in flight, each purchase a new customer buying one unit of
a product of its own (``--purchases`` units). Printed: purchases per second, the hold (grant to
release) p50 and p99, and the cost of one bare hop to an ORM thread and back.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shop.settings")

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.db import connection, transaction  # noqa: E402
from psycopg_pool import AsyncConnectionPool  # noqa: E402

from inventory.async_purchase import aclose_loop, on_thread  # noqa: E402
from inventory.models import Product  # noqa: E402
from inventory.results import Timings  # noqa: E402
from inventory.services import Ready, reset_sale, section_of  # noqa: E402
from inventory.strategies import load_strategy  # noqa: E402
from inventory.strategies.statements import shelf_by_sku  # noqa: E402
from loadtests.pods import database_url  # noqa: E402

SKU = "async-routes"

# The section's statements as the ORM sends them (inventory/strategies/section.py), by hand.
READ = "SELECT id, stock, version, fence, per_customer_limit, price FROM inventory_product WHERE id = %s"
HELD = "SELECT units FROM inventory_allocation WHERE product_id = %s AND customer = %s LIMIT 1"
WRITE = (
    "UPDATE inventory_product SET stock = %s, version = version + 1, fence = %s"
    " WHERE id = %s AND version = %s AND fence < %s"
)
ALLOCATE = (
    "INSERT INTO inventory_allocation (product_id, customer, units, cap) VALUES (%s, %s, %s, %s)"
    " ON CONFLICT (product_id, customer) DO UPDATE SET units = inventory_allocation.units + EXCLUDED.units,"
    " cap = EXCLUDED.cap"
)
ORDER = (
    "INSERT INTO inventory_order"
    " (product_id, customer, quantity, unit_price, strategy, fence, idempotency_key, created_at)"
    " VALUES (%s, %s, 1, %s, 'redis', %s, '', now()) RETURNING id"
)


async def sql_section(pool: AsyncConnectionPool, product_id: int, customer: str, token: int) -> bool:
    """The route not taken: read, decide (stock and the customer's units), checked write, units, order."""
    async with pool.connection() as conn, conn.transaction():
        await conn.execute("SET LOCAL lock_timeout = 5000")
        _, stock, version, fence, limit, price = await (await conn.execute(READ, [product_id])).fetchone()
        held = await (await conn.execute(HELD, [product_id, customer])).fetchone()
        if stock < 1 or (held[0] if held else 0) + 1 > limit:
            return False
        written = await conn.execute(WRITE, [stock - 1, token, product_id, version, token])
        if written.rowcount != 1:
            return False
        await conn.execute(ALLOCATE, [product_id, customer, 1, limit])
        await conn.execute(ORDER, [product_id, customer, price, token])
    return True


def sql_on_thread(product_id: int, customer: str, token: int) -> bool:
    """``sql_section`` through Django's (pooled) connection, sync, on an ORM thread."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL lock_timeout = 5000")
        cursor.execute(READ, [product_id])
        _, stock, version, fence, limit, price = cursor.fetchone()
        cursor.execute(HELD, [product_id, customer])
        held = cursor.fetchone()
        if stock < 1 or (held[0] if held else 0) + 1 > limit:
            return False
        cursor.execute(WRITE, [stock - 1, token, product_id, version, token])
        if cursor.rowcount != 1:
            return False
        cursor.execute(ALLOCATE, [product_id, customer, 1, limit])
        cursor.execute(ORDER, [product_id, customer, price, token])
    return True


async def run_route(route: str, strategy, *, purchases: int, tasks: int, pool) -> dict:
    shelf, *_ = await on_thread(shelf_by_sku, SKU, customer="routes")
    holds: list[float] = []
    queue: asyncio.Queue[int] = asyncio.Queue()
    for number in range(purchases):
        queue.put_nowait(number)

    async def shopper() -> None:
        while not queue.empty():
            customer = f"{route}-{queue.get_nowait()}"
            async with strategy.aguard(SKU) as grant:
                granted = time.perf_counter()
                if route == "orm-thread":
                    ready = Ready(SKU, customer, 1, "", shelf, None, granted, Timings())
                    assert (await on_thread(section_of, strategy, grant, ready)).confirmed
                elif route == "sql-thread":
                    assert await on_thread(sql_on_thread, shelf.product_id, customer, grant.token)
                else:
                    assert await sql_section(pool, shelf.product_id, customer, grant.token)
            holds.append((time.perf_counter() - granted) * 1000)

    began = time.perf_counter()
    await asyncio.gather(*(shopper() for _ in range(tasks)))
    seconds = time.perf_counter() - began
    holds.sort()
    return {
        "route": route,
        "rps": purchases / seconds,
        "hold_p50": statistics.median(holds),
        "hold_p99": holds[int(len(holds) * 0.99) - 1],
    }


async def hop_us(hops: int) -> tuple[float, float]:
    """Microseconds per bare hop to an ORM thread and back; and per hop that also takes (and gives
    back) a pooled connection, as every step of the purchase does."""
    began = time.perf_counter()
    for _ in range(hops):
        await on_thread(int)
    bare = (time.perf_counter() - began) / hops * 1e6
    began = time.perf_counter()
    for _ in range(hops):
        await on_thread(connection.ensure_connection)
    return bare, (time.perf_counter() - began) / hops * 1e6


async def main(purchases: int, tasks: int, rounds: int) -> None:
    strategy = load_strategy("redis")
    size = settings.DATABASE_POOL_MAX_SIZE or settings.ASGI_DB_THREADS
    try:
        async with AsyncConnectionPool(database_url(), min_size=size, max_size=size, open=False) as pool:
            bare, pooled = await hop_us(2000)
            print(f"hop to an ORM thread and back: {bare:.0f} µs bare, {pooled:.0f} µs with a pooled connection")
            for round_number in range(1, rounds + 1):
                for route in ("orm-thread", "sql-thread", "async-sql"):
                    await on_thread(reset_sale, sku=SKU, stock=purchases)
                    figures = await run_route(route, strategy, purchases=purchases, tasks=tasks, pool=pool)
                    print(
                        f"round {round_number} {route:<10} {figures['rps']:6.0f} purchases/s  "
                        f"hold p50 {figures['hold_p50']:.2f} ms  p99 {figures['hold_p99']:.2f} ms"
                    )
    finally:
        await aclose_loop()  # the lock's connections are this loop's: closed before asyncio.run ends it
        strategy.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--purchases", type=int, default=1000)
    parser.add_argument("--tasks", type=int, default=16, help="purchases in flight on the loop")
    parser.add_argument("--rounds", type=int, default=3)
    arguments = parser.parse_args()
    Product.objects.get_or_create(sku=SKU, defaults={"name": SKU, "price": 1, "stock": 0, "initial_stock": 0})
    asyncio.run(main(arguments.purchases, arguments.tasks, arguments.rounds))
