"""``simulate_clock_jump``: K of five Redlock nodes drop the lock's key early; the quorum and the fence decide."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from inventory.audit import audit
from inventory.models import Order, Product
from tests import slots

BASE_PORT = slots.SIMULATE_CLOCK_JUMP_BASE_PORT  # five private nodes of the demo's own


def run(nodes: int) -> str:
    out = StringIO()
    call_command("simulate_clock_jump", nodes=nodes, base_port=BASE_PORT, stdout=out)
    return out.getvalue()


def customers(sku: str) -> list[str]:
    return sorted(Order.objects.filter(product__sku=sku).values_list("customer", flat=True))


@pytest.mark.django_db(transaction=True)
def test_three_jumped_nodes_let_a_second_holder_in_and_the_fence_refuses_the_late_write():
    text = run(3)
    assert "FAIL" not in text
    assert "EMULATED by PEXPIRE <lock key> 0" in text
    assert text.count("TWO HOLDERS") == 2
    assert text.count("A's late write (stock 10 -> 9, token 1): REFUSED by the storage check") == 2
    assert "full grant: second holder YES" in text and "bare-majority grant: second holder YES" in text
    for sku in ("simulate-clock-jump-full", "simulate-clock-jump-bare"):
        product = Product.objects.get(sku=sku)
        assert (product.stock, product.fence) == (product.initial_stock - 1, 2)
        assert customers(sku) == ["B"]
        assert audit(sku=sku).oversold == 0


@pytest.mark.django_db(transaction=True)
def test_one_jumped_node_breaks_only_the_bare_majority_grant():
    text = run(1)
    assert "FAIL" not in text
    assert "full grant: second holder no" in text and "bare-majority grant: second holder YES" in text
    assert customers("simulate-clock-jump-full") == ["A"]
    assert customers("simulate-clock-jump-bare") == ["B"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("nodes", [-1, 6])
def test_a_node_count_outside_0_to_5_is_refused_and_changes_nothing(nodes):
    with pytest.raises(CommandError, match=f"--nodes {nodes}: .* 0 to 5"):
        run(nodes)
    assert not Product.objects.filter(sku__startswith="simulate-clock-jump").exists()
