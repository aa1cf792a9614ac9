"""The purchase service: outcomes, and that every refusal leaves stock and orders unchanged."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.utils import timezone

from inventory.audit import audit
from inventory.errors import InvalidQuantity, ProductNotFound
from inventory.models import Order, Product
from inventory.services import purchase, reset_sale, restock
from inventory.strategies import load_strategy
from inventory.strategies.contract import Grant, Outcome, Shelf
from inventory.strategies.section import checked_write, read_shelf
from tests.helpers import FENCED_STRATEGIES, snapshot


@pytest.mark.django_db(transaction=True)
class TestOutcomes:
    def test_confirmed_takes_stock_and_records_the_order(self, strategy, make_product):
        make_product(stock=3, limit=2)
        result = purchase(sku="phone-x", customer="alice", quantity=2)
        assert result.outcome is Outcome.CONFIRMED
        order = Order.objects.get(pk=result.order_id)
        assert (order.customer, order.quantity, order.strategy) == ("alice", 2, strategy)
        assert Product.objects.get(sku="phone-x").stock == 1
        if strategy in FENCED_STRATEGIES:
            assert order.fence == Product.objects.get(sku="phone-x").fence > 0
        else:
            assert order.fence is None

    def test_second_order_of_a_customer_is_refused(self, strategy, make_product):
        make_product(stock=5)
        assert purchase(sku="phone-x", customer="alice", quantity=1).confirmed
        before = snapshot("phone-x")
        assert purchase(sku="phone-x", customer="alice", quantity=1).outcome is Outcome.LIMIT_REACHED
        assert snapshot("phone-x") == before

    def test_sold_out_when_stock_is_short(self, strategy, make_product):
        make_product(stock=1, limit=2)
        before = snapshot("phone-x")
        assert purchase(sku="phone-x", customer="bob", quantity=2).outcome is Outcome.SOLD_OUT
        assert snapshot("phone-x") == before
        assert purchase(sku="phone-x", customer="bob", quantity=1).confirmed
        assert purchase(sku="phone-x", customer="carol", quantity=1).outcome is Outcome.SOLD_OUT
        assert snapshot("phone-x")[0] == 0

    @pytest.mark.parametrize("sku", ["fence", "signal", "waiters", "handoff"])
    def test_a_sku_named_like_a_locks_helper_key_sells(self, strategy, make_product, sku):
        """Found when the lock library began refusing a name that ends in one of its helper keys'
        suffixes (another lock's ``name:fence`` …): the shop named its lock ``flashsale:lock:<sku>``,
        so a product whose sku is ``fence`` could not be bought under a lock strategy."""
        make_product(sku, stock=2)
        result = purchase(sku=sku, customer="alice", quantity=1)
        assert result.outcome is Outcome.CONFIRMED, result
        assert snapshot(sku)[0] == 1

    def test_fence_increases_with_every_grant(self, fenced_strategy, make_product):
        make_product(stock=5)
        fences = [purchase(sku="phone-x", customer=f"c{i}", quantity=1).fence for i in range(5)]
        assert fences == sorted(fences) and len(set(fences)) == 5


@pytest.mark.django_db
class TestRefusalsChangeNothing:
    @pytest.mark.parametrize("quantity", [0, -1, 2, 10**9, "1", 1.5, None, True])
    def test_bad_quantity(self, make_product, quantity):
        make_product(stock=5, limit=1)
        before = snapshot("phone-x")
        with pytest.raises(InvalidQuantity):
            purchase(sku="phone-x", customer="alice", quantity=quantity)
        assert snapshot("phone-x") == before

    @pytest.mark.parametrize("stock", [-1, 2**31, True])
    def test_a_reset_to_a_stock_the_column_cannot_hold(self, make_product, stock):
        make_product(stock=5)
        before = snapshot("phone-x")
        with pytest.raises(InvalidQuantity, match="stock must be a whole number from 0 to 2147483647"):
            reset_sale(sku="phone-x", stock=stock)
        assert snapshot("phone-x") == before

    def test_unknown_sku(self, make_product):
        make_product(stock=5)
        with pytest.raises(ProductNotFound):
            purchase(sku="nope", customer="alice", quantity=1)
        assert Order.objects.count() == 0

    @pytest.mark.parametrize("window", ["upcoming", "ended"])
    def test_outside_the_sale_window(self, make_product, window):
        now = timezone.now()
        if window == "upcoming":
            make_product(stock=5, sale_starts_at=now + timedelta(hours=1))
        else:
            make_product(stock=5, sale_ends_at=now - timedelta(minutes=1))
        before = snapshot("phone-x")
        result = purchase(sku="phone-x", customer="alice", quantity=1)
        assert result.outcome is Outcome.NOT_ON_SALE
        assert snapshot("phone-x") == before


@pytest.mark.django_db
class TestStockAdministration:
    def test_restock_adds_to_stock_and_initial(self, make_product):
        make_product(stock=2)
        product = restock(sku="phone-x", quantity=3)
        assert (product.stock, product.initial_stock) == (5, 5)
        assert audit(sku="phone-x").ok

    def test_reset_sale_clears_orders_and_fence(self, make_product):
        make_product(stock=2)
        Product.objects.filter(sku="phone-x").update(fence=42)
        assert purchase(sku="phone-x", customer="a", quantity=1).confirmed
        product = reset_sale(sku="phone-x", stock=7)
        assert (product.stock, product.initial_stock, product.fence) == (7, 7, 0)
        assert Order.objects.count() == 0

    def test_audit_reports_a_mismatch(self, make_product):
        make_product(stock=5)
        assert purchase(sku="phone-x", customer="a", quantity=1).confirmed
        Product.objects.filter(sku="phone-x").update(stock=5)  # an order whose units never left the shelf
        report = audit(sku="phone-x")
        assert (report.ordered, report.sold, report.oversold, report.ok) == (1, 0, 1, False)
        Product.objects.filter(sku="phone-x").update(stock=3)  # units gone without an order
        report = audit(sku="phone-x")
        assert (report.lost, report.ok) == (1, False)

    def test_undersold_means_units_left_while_a_shopper_was_told_sold_out(self, make_product):
        make_product(stock=5)
        assert purchase(sku="phone-x", customer="a", quantity=1).confirmed
        assert audit(sku="phone-x", told_sold_out=3).undersold == 4
        # Shoppers told "busy, try again" (503) were not told there was nothing left.
        assert audit(sku="phone-x", told_sold_out=0).undersold == 0
        assert audit(sku="phone-x", told_sold_out=0).ok


class TestStrategyLoading:
    def test_unknown_alias(self, settings):
        with pytest.raises(ImproperlyConfigured, match="not a strategy"):
            load_strategy("memcached")

    def test_unimportable_path_chains_the_cause(self, settings):
        with pytest.raises(ImproperlyConfigured) as info:
            load_strategy("inventory.strategies.nowhere.Backend")
        assert isinstance(info.value.__cause__, ImportError)

    def test_not_a_backend_class(self, settings):
        with pytest.raises(ImproperlyConfigured, match="not a Strategy subclass"):
            load_strategy("inventory.models.Product")

    @pytest.mark.parametrize("control", ["unsafe", "local"])
    def test_controls_are_refused_unless_allowed(self, settings, control):
        with pytest.raises(ImproperlyConfigured, match="ALLOW_UNSAFE_STRATEGY=1"):
            load_strategy(control, config={**settings.INVENTORY, "ALLOW_UNSAFE": False})
        assert load_strategy(control, config={**settings.INVENTORY, "ALLOW_UNSAFE": True}).name == control

    def test_dotted_path(self, settings):
        assert load_strategy("inventory.strategies.db.RowLockStrategy").name == "db"

    def test_options_come_from_the_strategy_module_with_settings_over_them(self, settings):
        config = {**settings.INVENTORY, "OPTIONS": {"FENCED": False}}
        assert load_strategy("redis", config=config).fenced is False
        assert load_strategy("redis", config={**settings.INVENTORY, "OPTIONS": {}}).fenced is True
        assert load_strategy("optimistic", config={**settings.INVENTORY, "OPTIONS": {}}).max_attempts == 9

    def test_after_a_conflict_a_purchase_recovers_once_retries_after_its_backoff_then_is_busy(self, settings):
        # The one retry policy that a purchase alone (services.run_section) and a batch
        # (batched.run_batch) follow after a conflict.
        shelf = Shelf(
            1, stock=5, version=3, fence=7, per_customer_limit=2, sale_starts_at=None, sale_ends_at=None, price=1
        )
        grant = Grant(token=8)
        atomic = load_strategy("atomic")  # recovers: reads the row again under the same grant
        assert atomic.after_conflict(shelf, grant, recovered=False, attempt=0) == (grant, True)
        assert atomic.after_conflict(shelf, grant, recovered=True, attempt=0) is None, "recovers once, one attempt"
        options = {**settings.INVENTORY["OPTIONS"], "MAX_RETRIES": 2, "BACKOFF_MS": 5}
        optimistic = load_strategy("optimistic", config={**settings.INVENTORY, "OPTIONS": options})
        waits = []
        optimistic.backoff_s = lambda attempt: waits.append(attempt) or 0.0
        assert optimistic.after_conflict(shelf, grant, recovered=False, attempt=0) == (grant, False)
        assert optimistic.after_conflict(shelf, grant, recovered=False, attempt=1) == (grant, False)
        assert optimistic.after_conflict(shelf, grant, recovered=False, attempt=2) is None, "three attempts in all"
        assert waits == [0, 1], "a plain retry waits its backoff first; giving up does not"


@pytest.mark.django_db(transaction=True)
class TestRedlockNodeFailures:
    def test_two_dead_nodes_of_five_still_sell(self, use_strategy, fresh_redlock_nodes, make_product):
        use_strategy("redlock")
        make_product(stock=3)
        fresh_redlock_nodes[0].kill()
        fresh_redlock_nodes[3].kill()
        assert purchase(sku="phone-x", customer="alice", quantity=1).confirmed
        assert Product.objects.get(sku="phone-x").stock == 2

    def test_three_dead_nodes_answer_busy_at_once_and_change_nothing(
        self, use_strategy, fresh_redlock_nodes, make_product
    ):
        use_strategy("redlock", ACQUIRE_TIMEOUT_MS=60_000)  # a wait no loaded machine comes near
        make_product(stock=3)
        for index in (0, 2, 4):
            fresh_redlock_nodes[index].kill()
        assert not any(fresh_redlock_nodes[index].ping() for index in (0, 2, 4)), "a killed node still answers"
        before = snapshot("phone-x")
        started = timezone.now()
        result = purchase(sku="phone-x", customer="alice", quantity=1)
        elapsed = (timezone.now() - started).total_seconds()
        assert result.outcome is Outcome.BUSY
        assert elapsed < 30, "no quorum is known at once; waiting the acquire timeout would not help"
        assert snapshot("phone-x") == before

    def test_redis_down_answers_busy(self, use_strategy, make_product):
        use_strategy("redis", REDIS_URL="redis://127.0.0.1:6/0")  # nothing listens on port 6
        make_product(stock=3)
        before = snapshot("phone-x")
        assert purchase(sku="phone-x", customer="alice", quantity=1).outcome is Outcome.BUSY
        assert snapshot("phone-x") == before


@pytest.mark.django_db
class TestFence:
    def test_a_stale_token_writes_nothing(self, make_product):
        product = make_product(stock=3)
        assert checked_write(read_shelf(product.pk), quantity=1, token=10, fenced=True)
        shelf = read_shelf(product.pk)
        assert not checked_write(shelf, quantity=1, token=9, fenced=True)
        assert not checked_write(shelf, quantity=1, token=10, fenced=True)
        product.refresh_from_db()
        assert (product.stock, product.fence) == (2, 10)

    def test_unfenced_write_lands_whatever_the_token(self, make_product):
        product = make_product(stock=3)
        assert checked_write(read_shelf(product.pk), quantity=1, token=10, fenced=True)
        assert checked_write(read_shelf(product.pk), quantity=1, token=9, fenced=False)
        product.refresh_from_db()
        assert (product.stock, product.fence, product.version) == (1, 10, 2)

    def test_the_stock_check_constraint_is_the_last_guard(self, make_product):
        from django.db import IntegrityError, transaction

        product = make_product(stock=1)
        with pytest.raises(IntegrityError), transaction.atomic():
            Product.objects.filter(pk=product.pk).update(stock=-1)
