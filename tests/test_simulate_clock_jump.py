"""``simulate_clock_jump``: K of five Redlock nodes drop the lock's key early; the quorum and the fence decide."""

from __future__ import annotations

import contextlib
import threading
import time
from io import StringIO
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError

from inventory.audit import audit
from inventory.models import Order, Product
from processes.nodes import NodeError, RedisNodes
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


@contextlib.contextmanager
def stuttering_nodes(frozen_s: float, running_s: float):
    """The demo's five nodes frozen (SIGSTOP) ``frozen_s`` of every ``frozen_s + running_s``: every
    answer late by up to ``frozen_s``, as on a machine whose cores are busy elsewhere."""
    nodes = RedisNodes(base_port=BASE_PORT, count=5, run_dir=Path(settings.RUN_DIR) / "simulate-clock-jump")
    done = threading.Event()

    def stutter():
        while not done.is_set():
            for node in nodes:
                with contextlib.suppress(NodeError):  # not started yet, or killed by the demo
                    node.pause()
            time.sleep(frozen_s)
            for node in nodes:
                node.resume()
            time.sleep(running_s)

    thread = threading.Thread(target=stutter, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


@pytest.mark.slow  # about 5 s: every answer waits out a freeze
@pytest.mark.django_db(transaction=True)
def test_nodes_answering_late_change_no_step():
    # Seen once in make test at load 6: "only 0 of 5 nodes answered, 3 needed (... did not answer
    # within 50 ms)" on A's first acquire. The demo narrates a quorum, not a node timeout: late
    # answers are still answers. Nodes frozen 80 ms of every 100 failed it in 8 of 9 runs with the 50 ms
    # default, and passed 4 of 4 with the demos' 1 s.
    with stuttering_nodes(frozen_s=0.08, running_s=0.02):
        text = run(1)
    assert "FAIL" not in text
    assert "full grant: second holder no" in text and "bare-majority grant: second holder YES" in text


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("nodes", [-1, 6])
def test_a_node_count_outside_0_to_5_is_refused_and_changes_nothing(nodes):
    with pytest.raises(CommandError, match=f"--nodes {nodes}: .* 0 to 5"):
        run(nodes)
    assert not Product.objects.filter(sku__startswith="simulate-clock-jump").exists()
