"""``simulate_pause`` runs the Kleppmann scenario for real and succeeds only when every step held."""

from __future__ import annotations

import socket
import time
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from inventory.audit import audit
from inventory.models import Order, Product
from tests import slots

# The lock tests' node ports (tests/locks/conftest.py); the command starts them if they are down
# and stops only the ones it started.
REDLOCK_TEST_PORT = slots.LOCK_TEST_BASE_PORT


@pytest.mark.slow  # waits out a paused holder's lease: make test runs it, make check does not
# Seen: redlock's case, once in a fresh clone's make test at load 8 on a slow 2-core VM: four of five
# nodes did not answer within 25 ms (the node timeout of the demo's 500 ms TTL), twice in a row.
@pytest.mark.flaky(reruns=2)
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("backend", ["redis", "redlock"])
def test_every_step_of_the_pause_scenario_holds(backend):
    out = StringIO()
    call_command("simulate_pause", backend=backend, base_port=REDLOCK_TEST_PORT, stdout=out)
    text = out.getvalue()
    assert "FAIL" not in text
    assert f"every step held ({backend})" in text
    for step in (
        "A takes the lock",
        "A's lease ran out",
        "B takes the lock",
        "B writes with fence",
        "A's release is ignored",
        "A writes with stale fence",
        "B releases",
    ):
        assert step in text, step
    assert "REFUSED by the storage check" in text
    product = Product.objects.get(sku="simulate-pause")
    assert product.stock == product.initial_stock - 1 and product.fence > 0
    assert list(Order.objects.filter(product=product).values_list("customer", flat=True)) == ["B"]
    assert audit(sku="simulate-pause").oversold == 0


@pytest.mark.django_db(transaction=True)
# redis shows it in make check; redlock's five nodes take a second more: make test runs it.
@pytest.mark.parametrize("backend", ["redis", pytest.param("redlock", marks=pytest.mark.slow)])
def test_unfenced_the_late_write_lands_and_the_audit_shows_the_oversell(backend):
    out = StringIO()
    call_command("simulate_pause", backend=backend, base_port=REDLOCK_TEST_PORT, unfenced=True, stdout=out)
    text = out.getvalue()
    assert "FAIL" not in text
    assert "A writes with stale fence 1 (stock 10 -> 9): LANDS" in text
    assert f"every step held ({backend}, unfenced)" in text and "the damage was shown" in text
    product = Product.objects.get(sku="simulate-pause")
    assert product.stock == product.initial_stock - 1
    assert sorted(Order.objects.filter(product=product).values_list("customer", flat=True)) == ["A", "B"]
    assert audit(sku="simulate-pause").oversold == 1


# Seen by trying them: with --strategy redlock, a port past 65535 ended in the socket's ValueError;
# with the default strategy the option was ignored and the story ran.
@pytest.mark.parametrize("strategy", ["redlock", "redis"])
@pytest.mark.parametrize("base_port", [70000, 65535, 80, -5])
def test_a_base_port_out_of_range_is_one_line(strategy, base_port):
    with pytest.raises(CommandError) as excinfo:
        call_command("simulate_pause", strategy=strategy, base_port=base_port, stdout=StringIO())
    assert str(excinfo.value) == f"--base-port {base_port}: use a port from 1024 to 65531"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("taken", [0, 2])
def test_a_base_port_in_use_is_one_line_naming_it_before_any_node_starts(taken):
    """Seen by trying it over ports in use: about 5 s, then "redis-server on port … did not answer
    within 5.0s", which named neither the busy port nor what to do."""
    base = slots.SIMULATE_PAUSE_BASE_PORT
    with socket.socket() as holder:  # another program listening on one of the five ports
        holder.bind(("127.0.0.1", base + taken))
        holder.listen()
        started = time.monotonic()
        with pytest.raises(CommandError) as excinfo:
            call_command("simulate_pause", strategy="redlock", base_port=base, stdout=StringIO())
        took = time.monotonic() - started
    assert str(excinfo.value) == (
        f"--base-port {base}: port {base + taken} is in use by another program; "
        f"run with another --base-port (it takes {base} to {base + 4})"
    )
    assert took < 1.0 and "\n" not in str(excinfo.value)
    assert not Product.objects.filter(sku="simulate-pause").exists(), "nothing was changed"
    for port in range(base, base + 5):  # no node was started (nor left running)
        with socket.socket() as probe:
            assert probe.connect_ex(("127.0.0.1", port)) != 0, port


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("command", "options"),
    [
        ("simulate_pause", {}),
        ("simulate_pause", {"backend": "redlock", "base_port": REDLOCK_TEST_PORT}),
        ("simulate_clock_jump", {"base_port": slots.SIMULATE_CLOCK_JUMP_BASE_PORT}),
        ("simulate_failover", {"base_port": slots.SIMULATE_FAILOVER_BASE_PORT}),
    ],
)
def test_the_shops_redis_down_is_one_line_and_changes_nothing(command, options, settings):
    """Seen: each demo resets its product first, which raises the sold-out mark's generation in the
    shop's Redis; with that Redis down the command ended in a 68 to 174 line traceback (exit 1)
    rather than the one line saying what to start."""
    settings.INVENTORY = {**settings.INVENTORY, "REDIS_URL": "redis://127.0.0.1:1/0"}
    with pytest.raises(CommandError, match=r"^Redis at redis://127\.0\.0\.1:1/0 does not answer .*nothing changed$"):
        call_command(command, stdout=StringIO(), **options)
    assert not Order.objects.exists()
