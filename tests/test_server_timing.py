"""Purchase answers carry ``Server-Timing`` (the lock wait only for strategies that take a lock; the
hold for every section: the lock's, or without one the section's transaction) and the section's
counters."""

from __future__ import annotations

import pytest

from loadtests.figures import parse_server_timing


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "backend, batch, metrics",
    [
        ("redis", 1, {"lock", "hold", "batch", "db", "total"}),
        ("atomic", 1, {"hold", "batch", "db", "total"}),
        ("redis", 8, {"queue", "lock", "hold", "batch", "db", "total"}),
    ],
)
def test_purchase_answers_carry_server_timing_and_counters(
    use_strategy, make_product, client, private_static_root, backend, batch, metrics, settings
):
    """Lock wait is reported only by strategies that take a lock; the queue wait only
    when purchases share sections (BATCH > 1); the section's size always."""
    use_strategy(backend, OPTIONS={**settings.INVENTORY["OPTIONS"], "BATCH": batch})
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


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("backend, batch", [("atomic", 1), ("db", 1), ("atomic", 8), ("db", 8)])
def test_strategies_without_a_lock_report_their_transaction_as_hold(
    use_strategy, make_product, client, private_static_root, backend, batch, settings
):
    """No lock is taken, so ``hold`` is the section's transaction from BEGIN to COMMIT (described so),
    with no lock wait beside it; it lies inside the purchase's total."""
    use_strategy(backend, OPTIONS={**settings.INVENTORY["OPTIONS"], "BATCH": batch})
    make_product(stock=3)
    client.get("/products/phone-x/")
    response = client.post(
        "/api/products/phone-x/purchase",
        data="{}",
        content_type="application/json",
        HTTP_X_CSRFTOKEN=client.cookies["csrftoken"].value,
    )
    assert response.status_code == 201
    header = response["Server-Timing"]
    durations = parse_server_timing(header)
    assert "lock" not in durations
    assert 0 < durations["hold"] <= durations["total"]
    assert "hold;dur=" in header and 'desc="section transaction"' in header
