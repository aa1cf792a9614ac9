"""``simulate_failover`` fails a real Redis master over and succeeds only when every step held."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from inventory.audit import audit
from inventory.models import Order, Product
from tests import slots

BASE_PORT = slots.SIMULATE_FAILOVER_BASE_PORT  # 8 private ports of the demo's own


def run(**options) -> str:
    out = StringIO()
    call_command("simulate_failover", base_port=BASE_PORT, stdout=out, **options)
    return out.getvalue()


@pytest.mark.django_db(transaction=True)
def test_the_fence_lets_one_of_two_holders_write_and_redlock_refuses_the_second():
    text = run()
    assert "FAIL" not in text
    assert "TWO HOLDERS" in text
    assert "B's fence 2 is not newer than A's 2" in text
    assert "REFUSED by the storage check" in text and "not newer than the row's fence 2" in text
    assert "B tries the same name: refused" in text
    assert "every step held: the single Redis granted the lock twice" in text
    single = Product.objects.get(sku="simulate-failover")
    assert (single.stock, single.fence) == (single.initial_stock - 1, 2)
    assert list(Order.objects.filter(product=single).values_list("customer", flat=True)) == ["A"]
    assert audit(sku="simulate-failover").oversold == 0
    redlock = Product.objects.get(sku="simulate-failover-redlock")
    assert redlock.stock == redlock.initial_stock - 1
    assert list(Order.objects.filter(product=redlock).values_list("customer", flat=True)) == ["A"]


@pytest.mark.slow  # a replicated pair started and failed over
@pytest.mark.django_db(transaction=True)
def test_unfenced_both_holders_write_and_the_audit_shows_the_oversell():
    text = run(unfenced=True)
    assert "FAIL" not in text
    assert "LANDS, nothing checks it" in text
    assert "the damage was shown" in text
    single = Product.objects.get(sku="simulate-failover")
    assert single.stock == single.initial_stock - 1
    assert sorted(Order.objects.filter(product=single).values_list("customer", flat=True)) == ["A", "B"]
    assert audit(sku="simulate-failover").oversold == 1
    assert audit(sku="simulate-failover-redlock").oversold == 0


@pytest.mark.django_db(transaction=True)
def test_a_port_out_of_range_is_refused_before_anything_starts():
    with pytest.raises(CommandError, match="--base-port 70000"):
        call_command("simulate_failover", base_port=70000, stdout=StringIO())
    assert not Product.objects.filter(sku__startswith="simulate-failover").exists()
