"""``Idempotency-Key``: a retried purchase gets its order back, twins order once, a bad key is
refused and changes nothing (each failed before: a retried request could order twice)."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, transaction

from inventory.errors import InventoryError, KeyReused
from inventory.models import Order, Product
from inventory.services import purchase, reset_sale, restock
from inventory.soldout_local import MARKS
from inventory.strategies import section
from inventory.strategies.contract import Outcome
from tests.helpers import snapshot


@pytest.mark.django_db(transaction=True)
class TestIdempotencyKey:
    def test_a_retry_gets_the_same_order(self, strategy, make_product):
        make_product(stock=1, limit=1)
        first = purchase(sku="phone-x", customer="a", quantity=1, idempotency_key="k-1")
        again = purchase(sku="phone-x", customer="a", quantity=1, idempotency_key="k-1")
        assert first.confirmed and again.confirmed and again.order_id == first.order_id
        assert Order.objects.count() == 1
        # A new key is a new purchase: refused by the limit (and stock is gone anyway).
        assert not purchase(sku="phone-x", customer="a", quantity=1, idempotency_key="k-2").confirmed

    def test_a_key_sent_again_for_another_quantity_is_refused(self, strategy, make_product):
        """Seen on the API: a key first used for 1 unit, sent again with ``{"quantity": 2}``, was
        answered 201 "Your order is confirmed." with the order of 1 unit."""
        make_product(stock=5, limit=3)
        first = purchase(sku="phone-x", customer="a", quantity=1, idempotency_key="k-1")
        before = snapshot()
        message = (
            f"Idempotency-Key 'k-1' was used for an order of 1 unit (order {first.order_id}): send a new key to buy 2"
        )
        with pytest.raises(KeyReused) as refused:
            purchase(sku="phone-x", customer="a", quantity=2, idempotency_key="k-1")
        assert str(refused.value) == message
        assert snapshot() == before
        assert purchase(sku="phone-x", customer="a", quantity=1, idempotency_key="k-1").order_id == first.order_id

    def test_a_key_sent_again_for_another_quantity_after_the_sell_out(self, make_product):
        """The same from the sold-out mark, which answers a keyed retry without a read."""
        make_product(stock=1, limit=2)
        first = purchase(sku="phone-x", customer="a", quantity=1, idempotency_key="k-1")
        assert not purchase(sku="phone-x", customer="b", quantity=1).confirmed  # sold out: marked
        before = snapshot()
        with pytest.raises(KeyReused, match="was used for an order of 1 unit"):
            purchase(sku="phone-x", customer="a", quantity=2, idempotency_key="k-1")
        assert snapshot() == before
        assert purchase(sku="phone-x", customer="a", quantity=1, idempotency_key="k-1").order_id == first.order_id

    def test_concurrent_twins_without_a_guard_order_once(self, use_strategy, make_product):
        use_strategy("optimistic")
        make_product(stock=10, limit=5)
        barrier, results = threading.Barrier(4), []

        def twin():
            try:
                barrier.wait()
                results.append(purchase(sku="phone-x", customer="a", quantity=1, idempotency_key="same"))
            finally:
                connection.close()

        threads = [threading.Thread(target=twin) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
        assert len({r.order_id for r in results}) == 1 and all(r.confirmed for r in results)
        assert Order.objects.count() == 1 and Product.objects.get(sku="phone-x").stock == 9

    @pytest.mark.parametrize(("stock", "limit"), [(10, 1), (1, 5)])
    def test_concurrent_twins_are_never_refused_by_their_own_order(self, strategy, make_product, stock, limit):
        """Seen under ``atomic`` and ``redis-stock``: of six twins (one key, sent again while the
        first was in flight), three to five were answered 409 "limit reached" (limit 1) or "sold out"
        (the last unit) although their key's order was confirmed: the twin's own units refused
        them. Each twin gets that order, or busy while its write may be in flight (``redis-stock``:
        503, retry), and the retry gets the order."""
        make_product(stock=stock, limit=limit)
        barrier, results = threading.Barrier(6), []

        def twin():
            try:
                barrier.wait()
                results.append(purchase(sku="phone-x", customer="a", quantity=1, idempotency_key="same"))
            except Exception as exc:  # said by the assertion below
                results.append(exc)
            finally:
                connection.close()

        threads = [threading.Thread(target=twin) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(20)
        order = Order.objects.get()
        answers = [(getattr(r, "outcome", r), getattr(r, "order_id", None)) for r in results]
        assert len(answers) == 6 and all(
            (outcome.value, order_id) in {("confirmed", order.pk), ("busy", None)} for outcome, order_id in answers
        ), answers
        if strategy != "redis-stock":
            assert all(outcome.value == "confirmed" for outcome, _ in answers), answers
        retry = purchase(sku="phone-x", customer="a", quantity=1, idempotency_key="same")
        assert retry.confirmed and retry.order_id == order.pk
        assert Product.objects.get(sku="phone-x").stock == stock - 1

    def test_redis_stock_marks_no_sale_sold_out_while_its_last_order_is_in_flight(self, use_strategy, make_product):
        """Found by a helper reading the code: ``redis-stock`` decides in Redis, before the database.
        While shopper a's write of the last unit waited (here: the row locked by another
        transaction), b was told sold out from Redis and marked the SKU sold out; a's keyed retry
        then met the mark, found no order under its key (not committed yet) and was told "sold out"
        although its order was confirmed a moment later. The mark now waits for the database to
        hold no units: a's retry is answered from the section (busy while its write is in flight)."""
        from inventory import soldout

        use_strategy("redis-stock")
        product = make_product(stock=1, limit=5)
        locked, release, first = threading.Event(), threading.Event(), []

        def hold_row():
            try:
                with transaction.atomic():
                    Product.objects.select_for_update().get(pk=product.pk)
                    locked.set()
                    release.wait(10)
            finally:
                connection.close()

        def buy_first():
            try:
                first.append(purchase(sku="phone-x", customer="a", quantity=1, idempotency_key="k-a"))
            finally:
                connection.close()

        holder = threading.Thread(target=hold_row)
        holder.start()
        assert locked.wait(5)
        buyer = threading.Thread(target=buy_first)
        buyer.start()
        try:
            deadline = time.monotonic() + 5  # a's units leave Redis's counter, its write then waits for the row
            while soldout.client().hget("flashsale:stock:{phone-x}:sale", "stock") != b"0":
                assert time.monotonic() < deadline, "a's purchase never took the unit in Redis"
                time.sleep(0.01)
            refused = purchase(sku="phone-x", customer="b", quantity=1)
            assert refused.outcome.value == "sold_out"
            retry = purchase(sku="phone-x", customer="a", quantity=1, idempotency_key="k-a")
            assert retry.outcome.value != "sold_out", "a's retry was told sold out while its order was in flight"
        finally:
            release.set()
            holder.join(10)
            buyer.join(10)
        assert first[0].confirmed
        again = purchase(sku="phone-x", customer="a", quantity=1, idempotency_key="k-a")
        assert again.confirmed and again.order_id == first[0].order_id
        assert not purchase(sku="phone-x", customer="c", quantity=1).confirmed

    @pytest.mark.parametrize("key", ["", "a" * 65, "has space", "ключ", "a/b"])
    def test_a_bad_key_is_refused_and_changes_nothing(self, make_product, key):
        make_product(stock=3)
        before = snapshot()
        if key:
            with pytest.raises(InventoryError, match="Idempotency-Key"):
                purchase(sku="phone-x", customer="a", quantity=1, idempotency_key=key)
            assert snapshot() == before

    def test_the_api_passes_the_header_and_refuses_a_bad_one(self, make_product, client, private_static_root):
        make_product(stock=3, limit=3)
        client.get("/products/phone-x/")
        csrf = client.cookies["csrftoken"].value

        def post(key):
            return client.post(
                "/api/products/phone-x/purchase",
                data="{}",
                content_type="application/json",
                HTTP_X_CSRFTOKEN=csrf,
                HTTP_IDEMPOTENCY_KEY=key,
            )

        first, second = post("abc"), post("abc")
        assert first.status_code == second.status_code == 201
        assert first.json()["order_id"] == second.json()["order_id"]
        before = snapshot()
        other = client.post(
            "/api/products/phone-x/purchase",
            data='{"quantity": 2}',
            content_type="application/json",
            HTTP_X_CSRFTOKEN=csrf,
            HTTP_IDEMPOTENCY_KEY="abc",
        )
        assert other.status_code == 422 and "send a new key to buy 2" in other.json()["error"]
        assert snapshot() == before
        before = snapshot()
        bad = post("no spaces allowed")
        assert bad.status_code == 400 and "Idempotency-Key" in bad.json()["error"]
        assert snapshot() == before


@pytest.mark.django_db(transaction=True)
class TestRetriesFollowTheSale:
    """A keyed retry is answered from the orders as they are: a reset deletes them, a restock keeps
    them (these once guarded a Redis note of each keyed order; the note is gone, the rule stays)."""

    def test_a_reset_forgets_the_notes_with_the_orders(self, use_strategy, make_product):
        use_strategy("db")
        make_product(stock=1, limit=1)
        first = purchase(sku="phone-x", customer="a", quantity=1, idempotency_key="k-1")
        assert first.confirmed
        reset_sale(sku="phone-x", stock=1)
        again = purchase(sku="phone-x", customer="a", quantity=1, idempotency_key="k-1")
        assert again.confirmed
        assert Order.objects.filter(pk=again.order_id).exists(), (
            f"the retry after the reset was told CONFIRMED with order {again.order_id}, which the reset deleted"
        )
        assert Order.objects.count() == 1 and Product.objects.get(sku="phone-x").stock == 0

    def test_a_restock_keeps_the_notes_with_the_orders(self, use_strategy, make_product):
        use_strategy("db")
        make_product(stock=1, limit=1)
        first = purchase(sku="phone-x", customer="a", quantity=1, idempotency_key="k-1")
        restock(sku="phone-x", quantity=1)
        again = purchase(sku="phone-x", customer="a", quantity=1, idempotency_key="k-1")
        assert again.confirmed and again.order_id == first.order_id
        assert Order.objects.count() == 1 and Product.objects.get(sku="phone-x").stock == 1


@pytest.mark.django_db(transaction=True)
def test_a_keyed_purchase_leaves_nothing_in_redis(use_strategy, make_product, redis_client):
    """A confirmed purchase writes no Redis key of its own (it used to note each keyed order, one
    round trip per purchase): a retry after sold out is answered from the orders."""
    use_strategy("db")
    make_product(stock=2, limit=1)
    before = set(redis_client.keys("flashsale:*"))
    assert purchase(sku="phone-x", customer="a", quantity=1, idempotency_key="k-1").confirmed
    assert set(redis_client.keys("flashsale:*")) == before


def reset_between_the_reads(monkeypatch, reset_and_twin, *, inside_the_section: bool = False) -> list[int]:
    """Make each read of a key's order by this thread (``section.order_read_as``), up to twenty, run
    ``reset_and_twin`` on a staff thread first; the order ids it was asked for, as they come.
    ``inside_the_section``: the reset must not wait on the purchase (which holds its guard)."""
    reads, main, real = [], threading.current_thread(), section.order_read_as

    def staff() -> None:
        try:
            reset_and_twin()
        finally:
            connection.close()

    def read(order_id: int):
        if threading.current_thread() is main and len(reads) < 20:
            reads.append(order_id)
            thread = threading.Thread(target=staff)
            thread.start()
            thread.join(10)
            assert not (inside_the_section and thread.is_alive()), "the reset waited on the section"
        return real(order_id)

    monkeypatch.setattr(section, "order_read_as", read)
    return reads


@pytest.mark.django_db(transaction=True)
def test_the_plain_read_stops_chasing_a_keyed_order_that_resets_keep_deleting(use_strategy, make_product, monkeypatch):
    """The plain read found the key's order by id, read it, found it deleted by a reset, and read
    again, with no bound: a shopper's twin (the same key) ordering again after each reset, and staff
    resetting again before each second read, kept it reading. Here a real reset and a real twin's
    purchase commit between the two reads each time, twenty times at most: the purchase answers busy
    after a few reads, and writes nothing (the one order left is the twin's last)."""
    use_strategy("db")
    make_product(stock=5, limit=1)
    assert purchase(sku="phone-x", customer="a", quantity=1, idempotency_key="k-1").confirmed

    def reset_and_twin() -> None:
        reset_sale(sku="phone-x", stock=5)
        assert purchase(sku="phone-x", customer="a", quantity=1, idempotency_key="k-1").confirmed

    reads = reset_between_the_reads(monkeypatch, reset_and_twin)
    MARKS.drop_all(subscribed=True)  # no row remembered: the purchase reads the shelf
    result = purchase(sku="phone-x", customer="a", quantity=1, idempotency_key="k-1")
    assert len(reads) == section.REPLAY_READ_TRIES, reads
    assert result.outcome is Outcome.BUSY and result.order_id is None
    order = Order.objects.get()
    assert (order.customer, order.idempotency_key) == ("a", "k-1") and order.pk not in reads
    assert Product.objects.get(sku="phone-x").stock == 4


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("strategy", ["redis", "atomic"])
def test_the_section_stops_chasing_a_keyed_order_that_resets_keep_deleting(
    use_strategy, make_product, monkeypatch, strategy
):
    """The section's own read of the key's order (the purchase reached it from the row this process
    remembered, without a plain read) had the plain read's unbounded loop: a reset that takes no
    guard (a lock strategy's, ``atomic``'s) deleting the order between its two reads, each time,
    kept it reading inside the guard. It reads :data:`~inventory.strategies.section.REPLAY_READ_TRIES`
    times, then answers busy and writes nothing."""
    use_strategy(strategy)
    make_product(stock=5, limit=1)
    assert purchase(sku="phone-x", customer="a", quantity=1, idempotency_key="k-1").confirmed
    assert purchase(sku="phone-x", customer="b", quantity=1).confirmed  # the row remembered here

    def reset_and_twin() -> None:
        reset_sale(sku="phone-x", stock=5)
        # The twin's order, written as the section would (its read must find an order again).
        product = Product.objects.get(sku="phone-x")
        Order.objects.create(product=product, customer="a", quantity=1, strategy=strategy, idempotency_key="k-1")

    reads = reset_between_the_reads(monkeypatch, reset_and_twin, inside_the_section=True)
    result = purchase(sku="phone-x", customer="a", quantity=1, idempotency_key="k-1")
    assert len(reads) == section.REPLAY_READ_TRIES, reads
    assert result.outcome is Outcome.BUSY and result.order_id is None
    order = Order.objects.get()
    assert (order.customer, order.idempotency_key) == ("a", "k-1") and order.pk not in reads
