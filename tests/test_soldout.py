"""The sold-out mark (``inventory/soldout.py``): a sold-out answer without SQL, cleared by a
restock or reset, bad input still refused, a keyed retry still answered, a restock refused when
Redis does not answer."""

from __future__ import annotations

import pytest

from inventory.errors import InvalidQuantity, InventoryError
from inventory.models import Order
from inventory.services import purchase, reset_sale, restock
from inventory.strategies.contract import Outcome
from tests.helpers import snapshot

pytestmark = pytest.mark.django_db(transaction=True)


class TestSoldOutMark:
    def test_a_sold_out_answer_costs_no_sql(self, use_strategy, make_product, django_assert_num_queries):
        use_strategy("db")
        make_product(stock=1)
        assert purchase(sku="phone-x", customer="a", quantity=1).confirmed
        assert purchase(sku="phone-x", customer="b", quantity=1).outcome is Outcome.SOLD_OUT  # marks it
        with django_assert_num_queries(0):
            result = purchase(sku="phone-x", customer="c", quantity=1)
        assert (result.outcome, result.units_left) == (Outcome.SOLD_OUT, 0)

    def test_a_restock_clears_the_mark_at_once(self, use_strategy, make_product):
        use_strategy("db")
        make_product(stock=1)
        assert purchase(sku="phone-x", customer="a", quantity=1).confirmed
        assert purchase(sku="phone-x", customer="b", quantity=1).outcome is Outcome.SOLD_OUT
        restock(sku="phone-x", quantity=1)
        assert purchase(sku="phone-x", customer="b", quantity=1).confirmed
        assert purchase(sku="phone-x", customer="c", quantity=1).outcome is Outcome.SOLD_OUT
        reset_sale(sku="phone-x", stock=1)
        assert purchase(sku="phone-x", customer="c", quantity=1).confirmed

    def test_bad_input_is_still_refused_on_a_sold_out_product(self, use_strategy, make_product):
        use_strategy("db")
        make_product(stock=0)
        assert purchase(sku="phone-x", customer="a", quantity=1).outcome is Outcome.SOLD_OUT
        with pytest.raises(InvalidQuantity):
            purchase(sku="phone-x", customer="a", quantity=2)

    def test_a_keyed_retry_after_sold_out_gets_its_order(self, use_strategy, make_product):
        use_strategy("db")
        make_product(stock=1)
        first = purchase(sku="phone-x", customer="a", quantity=1, idempotency_key="k")
        assert purchase(sku="phone-x", customer="b", quantity=1).outcome is Outcome.SOLD_OUT
        again = purchase(sku="phone-x", customer="a", quantity=1, idempotency_key="k")
        assert again.confirmed and again.order_id == first.order_id and Order.objects.count() == 1

    def test_restock_is_refused_when_redis_is_down(self, settings, make_product):
        make_product(stock=1)
        settings.INVENTORY = {**settings.INVENTORY, "REDIS_URL": "redis://127.0.0.1:6/0"}
        before = snapshot()
        with pytest.raises(InventoryError, match="does not answer"):
            restock(sku="phone-x", quantity=3)
        assert snapshot() == before
