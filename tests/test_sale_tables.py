"""A burst row starts from vacuumed sale tables (``loadtests.burst.vacuum_sale_tables``)."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.db import connection, transaction

from inventory.models import Order, Product
from loadtests.burst import SALE_TABLES, vacuum_sale_tables


def last_vacuums() -> dict[str, object]:
    """Each sale table's last manual VACUUM, as PostgreSQL's statistics say now."""
    names = [model._meta.db_table for model in SALE_TABLES]
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT relname, last_vacuum FROM pg_stat_user_tables WHERE relname = ANY(%s)", [names])
        return dict(cursor.fetchall())


@pytest.mark.django_db(transaction=True)
def test_a_row_vacuums_the_rows_a_reset_deleted():
    product = Product.objects.create(sku="vacuumed", name="V", price=Decimal("1.00"), initial_stock=5, stock=5)
    Order.objects.bulk_create(
        Order(product=product, customer=f"c{n}", quantity=1, strategy="db", unit_price=Decimal("1.00"))
        for n in range(50)
    )
    Order.objects.filter(product=product).delete()
    before = last_vacuums()
    vacuum_sale_tables()
    after = last_vacuums()
    assert set(after) == {model._meta.db_table for model in SALE_TABLES}
    for table, moment in after.items():
        assert moment is not None and (before.get(table) is None or moment > before[table]), table


@pytest.mark.django_db(transaction=True)
def test_inside_a_transaction_it_leaves_them_alone():
    before = last_vacuums()
    with transaction.atomic():
        vacuum_sale_tables()  # VACUUM would fail here: it is not sent
    assert last_vacuums() == before
