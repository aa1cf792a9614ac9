"""Every index on the tables a purchase writes serves a query: each one costs every order's insert
(or every units upsert) inside the section's hold.

The list is the schema's, read from PostgreSQL after the migrations, each with what it serves. An
index that is added (Django's default for a ForeignKey or a ``db_index`` CharField adds one, the
latter with a ``varchar_pattern_ops`` twin) fails here until it is listed with its query; one
whose query is gone should be dropped, and its line with it.
"""

from __future__ import annotations

import pytest
from django.db import connection

SERVES = {
    "inventory_order": {
        "inventory_order_pkey": "the primary key (an order by id: a replay, the admin's change page)",
        "order_product_customer": (
            "a customer's orders of one product (the section's and the batch's reads, by customer and "
            "key), and every read by product alone, its prefix (the audit, the admin's counts, PROTECT)"
        ),
        "order_idempotency_key_once": "one order per (product, customer, Idempotency-Key): a retry gets it back",
        "order_customer": "the admin's filter of the orders by one shopper",
        "inventory_order_created_at_d33ccf43": "the orders newest first (the admin's list, its date hierarchy)",
    },
    "inventory_allocation": {
        "inventory_allocation_pkey": "the primary key",
        "allocation_one_per_customer": (
            "the units upsert's conflict target, a customer's units of a product (the section's and the "
            "batch's reads), and reads by product alone, its prefix"
        ),
    },
}


@pytest.mark.django_db
@pytest.mark.parametrize("table", sorted(SERVES))
def test_every_index_on_a_written_table_is_listed_with_the_query_it_serves(table):
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexname FROM pg_indexes WHERE tablename = %s", [table])
        present = {name for (name,) in cursor.fetchall()}
    listed = set(SERVES[table])
    unlisted, absent = sorted(present - listed), sorted(listed - present)
    assert present == listed, f"{table}: unlisted {unlisted}, listed but absent {absent}"
