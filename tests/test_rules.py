"""The sale's rules, decided inside the critical section, and the defects found by trying them.

Each class reproduces one defect of the issue "Show what each mechanism does" (it failed before
the rules moved into the section): a late confirmation after the sale ended, a limit that
counted orders instead of units, an unhelpful sold-out message, an admin save that undid a
purchase, and a retried request that could order twice.
"""

from __future__ import annotations

import json
import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.db.models.signals import pre_save
from django.utils import timezone

from inventory.audit import audit
from inventory.backends import STRATEGIES, load_backend, strategy_class
from inventory.backends.contract import Outcome
from inventory.errors import InventoryError
from inventory.models import Allocation, Order, Product
from inventory.services import purchase
from locks import RedisLock
from tests.helpers import snapshot

WORKING = [name for name in STRATEGIES if not strategy_class(name).control]


@pytest.fixture(params=WORKING)
def backend(request, use_backend):
    use_backend(request.param)
    return request.param


@pytest.mark.django_db(transaction=True)
def test_the_sale_window_is_checked_inside_the_section(use_backend, redis_client, make_product, settings):
    """A shopper waiting for the lock when the sale ends is not sold anything (before: confirmed
    0.7 s after ``sale_ends_at``)."""
    use_backend("redis")
    make_product(stock=5, sale_ends_at=timezone.now() + timedelta(milliseconds=300))
    holder = RedisLock(redis_client, "flashsale:lock:phone-x", ttl_ms=5000, timeout_ms=0)
    holder.acquire()  # someone holds the lock across the end of the sale
    results = {}

    def shopper():
        try:
            results["late"] = purchase(sku="phone-x", customer="late", quantity=1)
        finally:
            connection.close()

    thread = threading.Thread(target=shopper)
    thread.start()
    thread.join(0.6)  # the sale ends while the shopper waits
    holder.release()
    thread.join(10)
    assert results["late"].outcome is Outcome.NOT_ON_SALE
    assert Order.objects.count() == 0 and Product.objects.get(sku="phone-x").stock == 5


@pytest.mark.django_db(transaction=True)
class TestUnitsPerCustomer:
    def test_the_limit_counts_units_across_orders(self, backend, make_product):
        make_product(stock=10, limit=3)
        assert purchase(sku="phone-x", customer="alice", quantity=1).confirmed
        assert purchase(sku="phone-x", customer="alice", quantity=2).confirmed  # before: limit reached
        before = snapshot()
        assert purchase(sku="phone-x", customer="alice", quantity=1).outcome is Outcome.LIMIT_REACHED
        assert snapshot() == before
        assert Allocation.objects.get(customer="alice").units == 3
        assert audit(sku="phone-x").ok

    def test_the_database_refuses_units_past_the_limit(self, make_product):
        from django.db import IntegrityError, transaction

        product = make_product(stock=10, limit=2)
        with pytest.raises(IntegrityError), transaction.atomic():
            Allocation.objects.create(product=product, customer="x", units=3, cap=2)


@pytest.mark.django_db(transaction=True)
class TestSoldOutSaysWhatIsLeft:
    def test_one_left_and_two_asked(self, backend, make_product, client, private_static_root):
        make_product(stock=1, limit=2)
        client.get("/products/phone-x/")
        response = client.post(
            "/api/products/phone-x/purchase",
            data=json.dumps({"quantity": 2}),
            content_type="application/json",
            HTTP_X_CSRFTOKEN=client.cookies["csrftoken"].value,
        )
        assert response.status_code == 409
        body = response.json()
        assert (body["outcome"], body["units_left"]) == ("sold_out", 1)
        assert "Only 1 unit is left" in body["message"] and "every unit has been bought" not in body["message"]

    def test_nothing_left(self, make_product):
        make_product(stock=0)
        result = purchase(sku="phone-x", customer="a", quantity=1)
        assert (result.outcome, result.units_left) == (Outcome.SOLD_OUT, 0)


@pytest.mark.django_db(transaction=True)
def test_the_admin_form_saves_only_what_it_edits(admin_client, make_product, private_static_root):
    """A purchase that commits while the change form is saved stays (before: stock moved back)."""
    product = make_product(stock=5, limit=1)
    url = f"/admin/inventory/product/{product.pk}/change/"
    assert admin_client.get(url).status_code == 200

    def purchase_meanwhile(sender, instance, **kwargs):
        def buy():
            try:
                assert purchase(sku="phone-x", customer="meanwhile", quantity=1).confirmed
            finally:
                connection.close()

        thread = threading.Thread(target=buy)
        thread.start()
        thread.join(10)

    pre_save.connect(purchase_meanwhile, sender=Product)
    try:
        response = admin_client.post(
            url,
            {
                "sku": "phone-x",
                "name": "Renamed",
                "price": "9.99",
                "per_customer_limit": "1",
                "sale_starts_at_0": "",
                "sale_starts_at_1": "",
                "sale_ends_at_0": "",
                "sale_ends_at_1": "",
            },
        )
    finally:
        pre_save.disconnect(purchase_meanwhile, sender=Product)
    assert response.status_code == 302, response.content.decode()[:2000]
    product.refresh_from_db()
    assert (product.name, product.stock, product.version) == ("Renamed", 4, 1)
    assert audit(sku="phone-x").ok


@pytest.mark.django_db(transaction=True)
class TestIdempotencyKey:
    def test_a_retry_gets_the_same_order(self, backend, make_product):
        make_product(stock=1, limit=1)
        first = purchase(sku="phone-x", customer="a", quantity=1, idempotency_key="k-1")
        again = purchase(sku="phone-x", customer="a", quantity=1, idempotency_key="k-1")
        assert first.confirmed and again.confirmed and again.order_id == first.order_id
        assert Order.objects.count() == 1
        # A new key is a new purchase: refused by the limit (and stock is gone anyway).
        assert not purchase(sku="phone-x", customer="a", quantity=1, idempotency_key="k-2").confirmed

    def test_concurrent_twins_without_a_guard_order_once(self, use_backend, make_product):
        use_backend("optimistic")
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
        bad = post("no spaces allowed")
        assert bad.status_code == 400 and "Idempotency-Key" in bad.json()["error"]
        assert snapshot() == before


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "backend, batch, metrics",
    [
        ("redis", 1, {"lock", "hold", "batch", "db", "total"}),
        ("atomic", 1, {"batch", "db", "total"}),
        ("redis", 8, {"queue", "lock", "hold", "batch", "db", "total"}),
    ],
)
def test_purchase_answers_carry_server_timing_and_counters(
    use_backend, make_product, client, private_static_root, backend, batch, metrics, settings
):
    """Lock wait and hold are reported only by strategies that take a lock; the queue wait only
    when purchases share sections (BATCH > 1); the section's size always."""
    use_backend(backend, OPTIONS={**settings.INVENTORY["OPTIONS"], "BATCH": batch})
    make_product(stock=3)
    client.get("/products/phone-x/")
    response = client.post(
        "/api/products/phone-x/purchase",
        data="{}",
        content_type="application/json",
        HTTP_X_CSRFTOKEN=client.cookies["csrftoken"].value,
    )
    assert response.status_code == 201
    timing = dict(part.split(";", 1) for part in response["Server-Timing"].split(", "))
    assert set(timing) == metrics
    assert timing["batch"].startswith("dur=1;")  # alone in its section
    assert response.json()["conflicts"] == response.json()["retries"] == response.json()["constraint_hits"] == 0


def test_every_strategy_describes_itself(settings):
    for name in STRATEGIES:
        cls = strategy_class(name)
        assert cls.name == name and cls.guard_label and cls.check_label
        assert isinstance(cls.services(settings.INVENTORY), list)
        assert isinstance(cls.server_env(settings.INVENTORY), dict)
        if not cls.control:
            assert load_backend(name).name == name
