"""The hold is short (issue 28): inside the section's transaction a purchase takes two statements
(three for ``db``, whose side reads must follow the row's lock), then COMMIT. Before, nine round
trips: BEGIN, SET LOCAL, the row, the key's order, the units, the UPDATE, the upsert, the INSERT,
COMMIT (the first version of this test counted 11 statements for ``db`` with the two outside)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from inventory.models import Allocation, Order, Product
from inventory.services import purchase

#: Statements between BEGIN and COMMIT for one confirmed purchase, per strategy.
INSIDE = {"db": 3, "optimistic": 2, "redis": 2, "redlock": 2, "atomic": 2, "redis-stock": 2}


def inside_the_transaction(queries: list[dict]) -> list[str]:
    sqls = [query["sql"] for query in queries]
    begin, commit = sqls.index("BEGIN"), sqls.index("COMMIT")
    return sqls[begin + 1 : commit]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("name", sorted(INSIDE))
def test_a_purchase_holds_the_row_for_two_statements_and_a_commit(name, use_strategy, make_product):
    use_strategy(name)
    make_product(stock=5, limit=3)
    assert purchase(sku="phone-x", customer="first", quantity=1).confirmed
    with CaptureQueriesContext(connection) as captured:
        result = purchase(sku="phone-x", customer="me", quantity=2, idempotency_key="key-1")
    assert result.confirmed
    statements = inside_the_transaction(captured.captured_queries)
    assert len(statements) == INSIDE[name], statements
    assert "lock_timeout" in statements[0]  # the first statement bounds every row-lock wait
    # What the one write statement did, from the database.
    product = Product.objects.get(sku="phone-x")
    order = Order.objects.get(pk=result.order_id)
    assert (product.stock, order.customer, order.quantity, order.idempotency_key) == (2, "me", 2, "key-1")
    assert order.strategy == name and order.created_at is not None
    assert Allocation.objects.get(product=product, customer="me").units == 2
    # The retry under the same key is answered from the order, without a write.
    again = purchase(sku="phone-x", customer="me", quantity=2, idempotency_key="key-1")
    assert again.order_id == order.pk and Product.objects.get(sku="phone-x").stock == 2


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("name", ["redis", "atomic"])
def test_a_refused_limit_writes_nothing(name, use_strategy, make_product):
    use_strategy(name)
    make_product(stock=5, limit=2)
    assert purchase(sku="phone-x", customer="me", quantity=2).confirmed
    result = purchase(sku="phone-x", customer="me", quantity=1)
    assert result.outcome.value == "limit_reached"
    assert Product.objects.get(sku="phone-x").stock == 3
    assert Allocation.objects.get(customer="me").units == 2 and Order.objects.count() == 1
