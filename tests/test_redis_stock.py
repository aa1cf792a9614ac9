"""``redis-stock`` (the seckill design), ``manage.py reconcile``, and the sold-out mark."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db.models.signals import pre_save

from inventory.audit import audit
from inventory.backends.contract import Outcome
from inventory.backends.redis_stock import sale_key, units_key
from inventory.models import Order, Product
from inventory.services import purchase, reset_sale, restock
from tests.helpers import snapshot

pytestmark = pytest.mark.django_db(transaction=True)


def counter(client, sku="phone-x") -> int | None:
    value = client.hget(sale_key(sku), "stock")
    return None if value is None else int(value)


class TestRedisStock:
    def test_the_counter_is_loaded_from_the_database_and_moves_with_sales(
        self, use_backend, redis_client, make_product
    ):
        use_backend("redis-stock")
        make_product(stock=3, limit=2)
        assert counter(redis_client) is None
        assert purchase(sku="phone-x", customer="a", quantity=2).confirmed
        assert counter(redis_client) == 1 and int(redis_client.hget(units_key("phone-x"), "a")) == 2
        assert purchase(sku="phone-x", customer="a", quantity=1).outcome is Outcome.LIMIT_REACHED
        result = purchase(sku="phone-x", customer="b", quantity=2)
        assert (result.outcome, result.units_left) == (Outcome.SOLD_OUT, 1)
        assert purchase(sku="phone-x", customer="b", quantity=1).confirmed
        assert counter(redis_client) == 0 and Product.objects.get(sku="phone-x").stock == 0
        assert audit(sku="phone-x").ok

    def test_a_failed_database_write_gives_the_units_back(self, use_backend, redis_client, make_product):
        use_backend("redis-stock")
        make_product(stock=5, limit=2)
        assert purchase(sku="phone-x", customer="a", quantity=1).confirmed
        before = snapshot()

        def database_fails(sender, instance, **kwargs):
            raise RuntimeError("the database write fails halfway")

        pre_save.connect(database_fails, sender=Order)
        try:
            with pytest.raises(RuntimeError, match="halfway"):
                purchase(sku="phone-x", customer="b", quantity=2)
        finally:
            pre_save.disconnect(database_fails, sender=Order)
        assert snapshot() == before
        assert counter(redis_client) == 4, "the 2 units went back to the counter"
        assert redis_client.hget(units_key("phone-x"), "b") is None
        assert purchase(sku="phone-x", customer="b", quantity=2).confirmed

    def test_drift_costs_a_refusal_never_an_oversell(self, use_backend, redis_client, make_product):
        use_backend("redis-stock")
        make_product(stock=1)
        assert purchase(sku="phone-x", customer="a", quantity=1).confirmed
        redis_client.hset(sale_key("phone-x"), "stock", 5)  # the counter drifts up by hand
        result = purchase(sku="phone-x", customer="b", quantity=1)
        assert result.outcome is Outcome.SOLD_OUT
        assert counter(redis_client) == 5, "compensated: the refused unit went back"
        assert audit(sku="phone-x").ok and Order.objects.count() == 1

    def test_restock_and_reset_keep_redis_in_step(self, use_backend, redis_client, make_product):
        use_backend("redis-stock")
        make_product(stock=1)
        assert purchase(sku="phone-x", customer="a", quantity=1).confirmed
        restock(sku="phone-x", quantity=2)
        assert counter(redis_client) is None, "dropped: the next purchase loads it"
        assert purchase(sku="phone-x", customer="b", quantity=1).confirmed and counter(redis_client) == 1
        reset_sale(sku="phone-x", stock=4)
        assert counter(redis_client) is None and not redis_client.exists(units_key("phone-x"))
        assert purchase(sku="phone-x", customer="a", quantity=1).confirmed and counter(redis_client) == 3


class TestReconcile:
    def run(self, **options) -> str:
        out = StringIO()
        call_command("reconcile", stdout=out, **options)
        return out.getvalue()

    def test_no_drift_after_sales(self, use_backend, make_product):
        use_backend("redis-stock")
        make_product(stock=5, limit=2)
        for customer in "abc":
            assert purchase(sku="phone-x", customer=customer, quantity=1).confirmed
        assert "checked 1 sale(s) loaded in Redis; repaired 0" in self.run()

    def test_a_drift_is_reported_and_repaired_from_the_database(self, use_backend, redis_client, make_product):
        use_backend("redis-stock")
        make_product(stock=5, limit=2)
        assert purchase(sku="phone-x", customer="a", quantity=1).confirmed
        redis_client.hset(sale_key("phone-x"), "stock", 9)
        redis_client.hset(units_key("phone-x"), "ghost", 2)
        assert "would repair 1" in self.run(dry_run=True) and counter(redis_client) == 9
        text = self.run()
        assert "counter 9, database stock 4 (drift +5)" in text
        assert "customer ghost: 2 unit(s) in Redis, 0 in the database" in text
        assert "repaired 1" in text
        assert counter(redis_client) == 4 and redis_client.hget(units_key("phone-x"), "ghost") is None
        assert "repaired 0" in self.run()

    def test_unknown_sku_is_a_one_line_error(self, db):
        with pytest.raises(CommandError, match="no product with sku 'nope'"):
            self.run(sku="nope")


class TestSoldOutMark:
    def test_a_sold_out_answer_costs_no_sql(self, use_backend, make_product, django_assert_num_queries):
        use_backend("db")
        make_product(stock=1)
        assert purchase(sku="phone-x", customer="a", quantity=1).confirmed
        assert purchase(sku="phone-x", customer="b", quantity=1).outcome is Outcome.SOLD_OUT  # marks it
        with django_assert_num_queries(0):
            result = purchase(sku="phone-x", customer="c", quantity=1)
        assert (result.outcome, result.units_left) == (Outcome.SOLD_OUT, 0)

    def test_a_restock_clears_the_mark_at_once(self, use_backend, make_product):
        use_backend("db")
        make_product(stock=1)
        assert purchase(sku="phone-x", customer="a", quantity=1).confirmed
        assert purchase(sku="phone-x", customer="b", quantity=1).outcome is Outcome.SOLD_OUT
        restock(sku="phone-x", quantity=1)
        assert purchase(sku="phone-x", customer="b", quantity=1).confirmed
        assert purchase(sku="phone-x", customer="c", quantity=1).outcome is Outcome.SOLD_OUT
        reset_sale(sku="phone-x", stock=1)
        assert purchase(sku="phone-x", customer="c", quantity=1).confirmed

    def test_bad_input_is_still_refused_on_a_sold_out_product(self, use_backend, make_product):
        from inventory.errors import InvalidQuantity

        use_backend("db")
        make_product(stock=0)
        assert purchase(sku="phone-x", customer="a", quantity=1).outcome is Outcome.SOLD_OUT
        with pytest.raises(InvalidQuantity):
            purchase(sku="phone-x", customer="a", quantity=2)

    def test_a_keyed_retry_after_sold_out_gets_its_order(self, use_backend, make_product):
        use_backend("db")
        make_product(stock=1)
        first = purchase(sku="phone-x", customer="a", quantity=1, idempotency_key="k")
        assert purchase(sku="phone-x", customer="b", quantity=1).outcome is Outcome.SOLD_OUT
        again = purchase(sku="phone-x", customer="a", quantity=1, idempotency_key="k")
        assert again.confirmed and again.order_id == first.order_id and Order.objects.count() == 1

    def test_restock_is_refused_when_redis_is_down(self, settings, make_product):
        from inventory.errors import InventoryError

        make_product(stock=1)
        settings.INVENTORY = {**settings.INVENTORY, "REDIS_URL": "redis://127.0.0.1:6/0"}
        before = snapshot()
        with pytest.raises(InventoryError, match="does not answer"):
            restock(sku="phone-x", quantity=3)
        assert snapshot() == before
