"""A batch's reads cost what its purchases are, not what the sale has sold so far.

The leader reads its customers' units and the orders under its keys. Written as ``IN`` lists,
those reads were planned on the product's rows alone and filtered: at the end of a 3,000-unit
sale each batch read all 3,000 orders and units of the product (found by ``section_bench.py
--batch 10``: 5.95 ms of PostgreSQL CPU a section, against 3.1 ms after). Each lookup is now an
index probe of its own, whatever the planner's statistics say: none, taken after the sale, or
taken before it, on an earlier sale's rows. That last case chose the product's own index for
each probe (the statistics call the new product's rows few) and filtered all 3,000 rows per probe,
seen when this test failed on ``make check --reuse-db`` after a run that had analyzed the tables;
the product's indexes now lead with it and include the customer (migration 0009), so there is no
product-only index to choose.
"""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from inventory.strategies.statements import batch_read, sale_read

SOLD = 3000
BATCH = 10


def rows_visited(plan: dict) -> int:
    """Rows the plan's scans of the orders and units tables produced or filtered away."""
    visited = 0
    if plan.get("Relation Name") in ("inventory_order", "inventory_allocation"):
        loops = plan.get("Actual Loops", 1)
        visited += (plan.get("Actual Rows", 0) + plan.get("Rows Removed by Filter", 0)) * loops
    return visited + sum(rows_visited(child) for child in plan.get("Plans", []))


def visited_by(sql: str) -> list[int]:
    """Rows each statement of a message visited, from EXPLAIN ANALYZE (the first, the row's read, skipped)."""
    counts = []
    with connection.cursor() as cursor:
        for statement in sql.split("; ")[1:]:
            cursor.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {statement}")
            (explained,) = cursor.fetchone()  # psycopg loads the json column
            counts.append(rows_visited(explained[0]["Plan"]))
    return counts


def sell(cursor, product_id: int, prefix: str = "sold-") -> None:
    """``SOLD`` orders and customers' units of the product, one unit each."""
    cursor.execute(
        "INSERT INTO inventory_order (product_id, customer, quantity, strategy, idempotency_key, created_at)"
        " SELECT %s, %s || g, 1, 'db', 'key-' || g, now() FROM generate_series(1, %s) g",
        [product_id, prefix, SOLD],
    )
    cursor.execute(
        "INSERT INTO inventory_allocation (product_id, customer, units, cap)"
        " SELECT %s, %s || g, 1, 5 FROM generate_series(1, %s) g",
        [product_id, prefix, SOLD],
    )


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("statistics", ["as found", "taken after the sale", "taken before the sale"])
def test_a_batch_reads_its_own_customers_rows_not_the_sales(statistics, make_product):
    with connection.cursor() as cursor:
        if statistics == "taken before the sale":
            earlier = make_product("earlier-sale", stock=10_000, limit=5)
            sell(cursor, earlier.pk, prefix="earlier-")
            cursor.execute("ANALYZE inventory_order, inventory_allocation")
        product = make_product(stock=10_000, limit=5)
        sell(cursor, product.pk)
        if statistics == "taken after the sale":
            cursor.execute("ANALYZE inventory_order, inventory_allocation")
    customers = {f"sold-{n}" for n in range(1, BATCH)} | {"new"}  # nine who bought, one who did not
    pairs = {(customer, f"key-{customer[5:]}") for customer in customers if customer != "new"}
    with CaptureQueriesContext(connection) as captured:
        _, held, orders = batch_read(
            product.pk, lock_timeout_ms=None, for_update=False, customers=customers, pairs=pairs
        )
        _, replays = sale_read(product.pk, pairs)
    assert held == {customer: 1 for customer in customers - {"new"}}
    assert set(orders) == set(replays) == pairs
    batch_sql, sale_sql = (query["sql"] for query in captured.captured_queries)
    for visited in (*visited_by(batch_sql), *visited_by(sale_sql)):
        assert visited <= 2 * BATCH, f"a lookup visited {visited} rows of a sale of {SOLD}"
