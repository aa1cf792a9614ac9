"""The hot-row limit (``loadtests/hotrow.py``): plain psycopg processes on one product row of the
real test database, one purchase per commit and many; exactly the stock sold, never more."""

from __future__ import annotations

import pytest
from django.db import connection

from inventory.audit import audit
from inventory.models import Order
from loadtests.figures import with_hot_row_ratio
from loadtests.hotrow import HOT_ROW, HotRowError, run_shape
from loadtests.pods import database_url
from loadtests.table import COLUMNS, hot_row_cells


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("batch", [1, 8])
def test_several_connections_sell_exactly_the_stock(make_product, batch):
    product = make_product("hot-sku", stock=48)
    # The hot row names the price its UPDATE read, as a purchase does: no trigger fills it in (the
    # shape's cost is the purchase's, with no lookup of its own).
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE inventory_order DISABLE TRIGGER inventory_order_unit_price")
    try:
        shape = run_shape(database_url(), product_id=product.pk, purchases=48, connections=6, batch=batch)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE inventory_order ENABLE TRIGGER inventory_order_unit_price")

    assert (shape.sold, shape.refused, shape.stock_final, shape.orders, shape.oversold) == (48, 0, 0, 48, 0)
    assert shape.ok and shape.commits == 48 // batch and shape.rps > 0
    assert shape.name == f"hot-row {batch}" and shape.connections == 6
    orders = Order.objects.filter(product=product)
    assert orders.count() == 48 and set(orders.values_list("strategy", flat=True)) == {HOT_ROW}
    assert orders.values("customer").distinct().count() == 48  # valid rows: a customer per purchase
    assert set(orders.values_list("quantity", "fence", "idempotency_key").distinct()) == {(1, None, "")}
    assert set(orders.values_list("unit_price", flat=True)) == {product.price}
    report = audit(sku="hot-sku")
    assert (report.stock, report.orders, report.oversold, report.lost) == (0, 48, 0, 0)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("batch, sold", [(1, 30), (8, 24)])
def test_more_purchases_than_stock_never_oversell(make_product, batch, sold):
    """64 purchases asked for 30 units: one at a time the row sells all 30; 8 at a time it sells 24
    and refuses each later batch whole (6 left, fewer than 8), as the conditional UPDATE does."""
    product = make_product("hot-sku", stock=30)
    shape = run_shape(database_url(), product_id=product.pk, purchases=64, connections=5, batch=batch)

    assert (shape.sold, shape.refused, shape.stock_final, shape.orders) == (sold, 64 - sold, 30 - sold, sold)
    assert shape.oversold == 0 and shape.ok
    product.refresh_from_db()
    assert product.stock == 30 - sold >= 0
    assert Order.objects.filter(product=product).count() == sold


def test_a_strategy_row_is_read_against_the_hot_row_of_its_shape():
    hot = [{"name": "hot-row 1", "batch": 1, "rps": 400.0}, {"name": "hot-row 64", "batch": 64, "rps": 2000.0}]
    alone = with_hot_row_ratio({"row": "db", "batch": 1, "rps": 100.0}, hot)
    batched = with_hot_row_ratio({"row": "db", "batch": 8, "rps": 500.0}, hot)
    floor = with_hot_row_ratio({"row": "floor", "batch": 1, "rps": 900.0}, hot)
    assert (alone["hot_row_ratio"], batched["hot_row_ratio"]) == (0.25, 0.25)
    assert "hot_row_ratio" not in floor
    assert "hot_row_ratio" not in with_hot_row_ratio({"row": "db", "batch": 1, "rps": 100.0}, [])


def test_a_hot_row_shape_fits_the_table():
    shape = {
        "name": "hot-row 64",
        "batch": 64,
        "connections": 20,
        "purchases": 200,
        "sold": 200,
        "refused": 0,
        "commits": 4,
        "seconds": 0.05,
        "rps": 4000.0,
        "stock_final": 0,
        "orders": 200,
        "oversold": 0,
        "ok": True,
    }
    cells = hot_row_cells(shape)
    assert len(cells) == len(COLUMNS)
    named = dict(zip([title for title, _ in COLUMNS], cells, strict=True))
    assert (named["row"], named["rps"], named["batch"], named["sections"], named["ok"]) == (
        "hot-row 64",
        "4000",
        64,
        4,
        "yes",
    )
    assert named["p50 ms"] is None and named["×floor"] is None  # no HTTP: those columns stay empty


def test_a_connection_that_cannot_open_is_one_clear_error():
    """A process whose connection fails says so in one line (HotRowError), and the race does not
    wait for it: the others are released and the failure is raised."""
    dsn = "postgresql://postgres@127.0.0.1:5432/no_such_database_here"
    with pytest.raises(HotRowError, match=r"^OperationalError: .*no_such_database_here") as failed:
        run_shape(dsn, product_id=1, purchases=4, connections=2, batch=1)
    assert "\n" not in str(failed.value)
