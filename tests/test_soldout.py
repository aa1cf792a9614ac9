"""The sold-out mark (``inventory/soldout.py``): a sold-out answer without SQL, cleared by a
restock or reset, bad input still refused, a keyed retry still answered, a restock refused when
Redis does not answer."""

from __future__ import annotations

import time

import pytest
from django.conf import settings
from django.db.models import F

from inventory import soldout, soldout_local
from inventory.errors import InvalidQuantity, InventoryError
from inventory.models import Order, Product
from inventory.services import purchase, reset_sale, restock
from inventory.soldout_local import MARK_TTL_S, MARKS
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

    def test_a_keyed_retry_gets_its_order_where_marks_are_not_kept(self, use_strategy, make_product, monkeypatch):
        """Without a listener this process keeps no mark: the retry reads the mark from Redis and
        its order by one query for its key."""
        use_strategy("db")
        make_product(stock=1)
        monkeypatch.setattr(MARKS, "epoch", lambda sku, *, url: None)
        first = purchase(sku="phone-x", customer="a", quantity=1, idempotency_key="k")
        assert purchase(sku="phone-x", customer="b", quantity=1).outcome is Outcome.SOLD_OUT
        assert MARKS.get("phone-x", url=settings.INVENTORY["REDIS_URL"]) is None
        again = purchase(sku="phone-x", customer="a", quantity=1, idempotency_key="k")
        assert again.confirmed and again.order_id == first.order_id and Order.objects.count() == 1
        other = purchase(sku="phone-x", customer="a", quantity=1, idempotency_key="k-2")
        assert other.outcome is Outcome.SOLD_OUT

    def test_restock_is_refused_when_redis_is_down(self, settings, make_product):
        make_product(stock=1)
        settings.INVENTORY = {**settings.INVENTORY, "REDIS_URL": "redis://127.0.0.1:6/0"}
        before = snapshot()
        with pytest.raises(InventoryError, match="does not answer"):
            restock(sku="phone-x", quantity=3)
        assert snapshot() == before


#: Long enough for a loaded machine; the marks' own lifetimes are checked where they are kept.
WITHIN_S = 30.0


def marks_live_s(redis_client) -> list[float]:
    """How long each mark of phone-x still lives: the one in Redis (its PTTL; the restored one keeps
    its expiry) and the one this process keeps (on the clock it runs out by)."""
    lives = []
    pttl = redis_client.pttl("flashsale:soldout:{phone-x}")
    if pttl != -2:  # -2: no mark; -1 would be a mark that never runs out
        lives.append(pttl / 1000 if pttl >= 0 else float("inf"))
    kept = MARKS.get("phone-x", url=settings.INVENTORY["REDIS_URL"])
    if kept is not None:
        lives.append(kept.kept_until - soldout_local.clock())
    return lives


def buy_until_confirmed(redis_client, *, customer: str) -> Outcome:
    """Buy until confirmed (or ``WITHIN_S`` has passed): the last outcome. While a purchase is told
    sold out, every mark that may have said so lives ``MARK_TTL_S`` at most: one in Redis, then one
    in this process, about 4 s in all, however slowly this loop runs."""
    deadline = time.monotonic() + WITHIN_S
    while True:
        outcome = purchase(sku="phone-x", customer=customer, quantity=1).outcome
        if outcome is Outcome.CONFIRMED or time.monotonic() > deadline:
            return outcome
        lives = marks_live_s(redis_client)
        assert all(life <= MARK_TTL_S for life in lives), f"a mark lives {max(lives):.1f} s more"
        time.sleep(0.1)


class TestMarksDoNotOutliveARestock:
    """A mark lives about 2 s (``soldout.MARK_TTL_S``), in Redis and in each process, so a restock
    whose invalidation never arrived still ends "sold out" within a few seconds."""

    @pytest.mark.slow  # waits out a mark's 2 s lifetime
    def test_a_mark_restored_from_an_older_rdb_runs_out(self, use_strategy, make_product, redis_client):
        use_strategy("db")
        make_product(stock=1)
        assert purchase(sku="phone-x", customer="a", quantity=1).confirmed
        assert purchase(sku="phone-x", customer="b", quantity=1).outcome is Outcome.SOLD_OUT  # marks it
        keys = [soldout.generation_key("phone-x"), "flashsale:soldout:{phone-x}"]
        saved = {key: (redis_client.dump(key), redis_client.pttl(key)) for key in keys}  # an RDB taken now
        restock(sku="phone-x", quantity=1)
        for key, (value, pttl) in saved.items():  # Redis restarts from that RDB: keys and their expiry
            redis_client.restore(key, max(pttl, 0), value, replace=True)
        outcome = buy_until_confirmed(redis_client, customer="b")
        assert outcome is Outcome.CONFIRMED, f"still {outcome.value} {WITHIN_S:.0f} s after the restock"
        assert Product.objects.get(sku="phone-x").stock == 0 and Order.objects.count() == 2

    @pytest.mark.slow  # waits out a mark's 2 s lifetime
    def test_a_restock_whose_invalidation_failed_ends_sold_out_soon(self, use_strategy, make_product, redis_client):
        use_strategy("db")
        make_product(stock=1)
        assert purchase(sku="phone-x", customer="a", quantity=1).confirmed
        assert purchase(sku="phone-x", customer="b", quantity=1).outcome is Outcome.SOLD_OUT
        # Units back on the shelf with no message (what a restock whose after-commit raise failed leaves).
        Product.objects.filter(sku="phone-x").update(stock=F("stock") + 1, initial_stock=F("initial_stock") + 1)
        outcome = buy_until_confirmed(redis_client, customer="b")
        assert outcome is Outcome.CONFIRMED, f"still {outcome.value} {WITHIN_S:.0f} s after the restock"
        assert Product.objects.get(sku="phone-x").stock == 0 and Order.objects.count() == 2
