"""The burst itself: ``manage.py flashsale`` against real gunicorn, Locust, PostgreSQL and Redis.

Each test starts gunicorn on the test database, so the rows must be committed:
``transaction=True``. The suite's Redlock nodes (ports 7579+) are the ones the command uses.
"""
from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from inventory.models import BurstRun, Order, Product
from inventory.services import audit

pytestmark = pytest.mark.slow

SKU = "flash-burst"


def burst(tmp_path, **options) -> tuple[dict, str, CommandError | None]:
    """Run the command; return its JSON run, what it printed and its error (if it failed)."""
    path = tmp_path / "burst.json"
    out = StringIO()
    error = None
    try:
        call_command("flashsale", sku=SKU, json_path=str(path), stdout=out, stderr=StringIO(), **options)
    except CommandError as exc:
        error = exc
    runs = json.loads(path.read_text())["runs"]
    assert len(runs) == 1
    return runs[0], out.getvalue(), error


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("backend", ["db", "redis", "redlock"])
def test_burst_of_5000_sells_exactly_the_stock(backend, request, tmp_path):
    if backend == "redlock":
        request.getfixturevalue("fresh_redlock_nodes")
    if backend == "redis":
        request.getfixturevalue("redis_client")

    run, printed, error = burst(tmp_path, backends=backend, requests=5000, stock=100)

    assert error is None, f"{error}\n{printed}"
    assert run["backend"] == backend
    assert run["requests"] == run["server_purchases"] == 5000  # Locust's count and gunicorn's access log
    assert sum(run["status_counts"].values()) == 5000
    assert run["status_counts"]["201"] == 100
    assert run["stock_initial"] == 100 and run["stock_final"] == 0
    assert run["orders"] == 100
    assert run["oversold"] == 0 and run["undersold"] == 0
    assert run["errors_5xx"] == 0
    assert run["invariants_ok"] is True
    assert run["rps"] > 0 and 0 < run["p50_ms"] <= run["p95_ms"] <= run["p99_ms"]

    product = Product.objects.get(sku=SKU)
    assert (product.initial_stock, product.stock) == (100, 0)
    orders = Order.objects.filter(product=product)
    assert orders.count() == 100
    assert set(orders.values_list("backend", flat=True)) == {backend}
    report = audit(sku=SKU, told_sold_out=run["status_counts"].get("409", 0))
    assert report.ok and report.oversold == 0 and report.lost == 0 and report.over_limit_customers == 0

    stored = BurstRun.objects.get()
    assert (stored.backend, stored.requests, stored.orders, stored.invariants_ok) == (backend, 5000, 100, True)
    assert stored.timeline and all(stock >= 0 for _, stock, _ in stored.timeline)
    assert stored.timeline[-1][1:] == [0, 5000]
    assert f"{backend}: 5000/5000 purchase requests sent" in printed


@pytest.mark.django_db(transaction=True)
def test_unsafe_burst_oversells_and_the_audit_catches_it(tmp_path):
    run, printed, error = burst(tmp_path, backends="unsafe", requests=2000, stock=100)

    assert error is not None and "invariants broken: unsafe" in str(error)
    assert run["invariants_ok"] is False
    assert run["requests"] == 2000
    assert run["oversold"] > 0
    report = audit(sku=SKU, told_sold_out=run["status_counts"].get("409", 0))
    assert not report.ok
    assert report.ordered > report.sold  # more units on orders than ever left the shelf
    assert Order.objects.filter(product__sku=SKU).count() == report.orders > 100 - report.stock
    assert BurstRun.objects.get().invariants_ok is False
    assert "NO" in printed.splitlines()[-1]


@pytest.mark.django_db
@pytest.mark.parametrize(
    "options, message",
    [
        ({"backends": "db,mutex"}, "unknown backend mutex"),
        ({"backends": ""}, "unknown backend (none given)"),
        ({"backends": "db,db"}, "names a backend twice"),
        ({"requests": 0}, "--requests must be 1 or more"),
        ({"stock": -1}, "--stock must be 0 or more"),
        ({"users": 0}, "--users must be 1 or more"),
        ({"sku": "not a slug!"}, "--sku"),
    ],
)
def test_bad_arguments_start_nothing(options, message, tmp_path):
    path = tmp_path / "burst.json"
    options = {"backends": "db", "requests": 10, "stock": 1, "json_path": str(path), **options}
    with pytest.raises(CommandError) as excinfo:
        call_command("flashsale", stdout=StringIO(), stderr=StringIO(), **options)
    assert message in str(excinfo.value)
    assert "\n" not in str(excinfo.value)
    assert not path.exists()
    assert not Product.objects.filter(sku=SKU).exists()
    assert not BurstRun.objects.exists()
