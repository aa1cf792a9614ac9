"""Purchase answers carry ``Server-Timing`` (the lock wait only for strategies that take a lock; the
hold for every section: the lock's, or without one the section's transaction; the commit inside it,
the SQL statements the section sent and their round trips, the time outside it) and the section's counters."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from inventory.strategies.prepared import expanded
from loadtests.figures import parse_server_timing

SECTION = {"hold", "commit", "rtt", "sql", "batch", "outside", "db", "total"}


def buy(client, **headers):
    client.get("/products/phone-x/")
    return client.post(
        "/api/products/phone-x/purchase",
        data="{}",
        content_type="application/json",
        HTTP_X_CSRFTOKEN=client.cookies["csrftoken"].value,
        **headers,
    )


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "backend, batch, metrics",
    [
        ("redis", 1, {"lock", *SECTION}),
        ("atomic", 1, SECTION),
        ("redis", 8, {"queue", "lock", *SECTION}),
    ],
)
def test_purchase_answers_carry_server_timing_and_counters(
    use_strategy, make_product, client, private_static_root, backend, batch, metrics, settings
):
    """Lock wait is reported only by strategies that take a lock; the queue wait only
    when purchases share sections (BATCH > 1); the section's size always."""
    use_strategy(backend, OPTIONS={**settings.INVENTORY["OPTIONS"], "BATCH": batch})
    make_product(stock=3)
    response = buy(client)
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
    response = buy(client)
    assert response.status_code == 201
    header = response["Server-Timing"]
    durations = parse_server_timing(header)
    assert "lock" not in durations
    assert 0 < durations["hold"] <= durations["total"]
    assert "hold;dur=" in header and 'desc="section transaction"' in header


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "backend, batch", [("db", 1), ("redis", 1), ("atomic", 1), ("optimistic", 1), ("redis", 8), ("db", 8)]
)
def test_the_breakdown_adds_up_and_counts_the_sections_statements(
    use_strategy, make_product, client, private_static_root, backend, batch, settings
):
    """queue, lock, hold and outside follow one another: they add up to total (each rounded to
    0.01 ms); the commit lies inside the hold; sql is every statement the section sent, counted
    against Django's own record of the purchase's queries (from the section's BEGIN: before it
    comes the shelf's plain read)."""
    use_strategy(backend, OPTIONS={**settings.INVENTORY["OPTIONS"], "BATCH": batch})
    make_product(stock=3)
    client.get("/products/phone-x/")
    with CaptureQueriesContext(connection) as queries:
        response = buy(client, HTTP_IDEMPOTENCY_KEY="k-1")
    assert response.status_code == 201
    timing = parse_server_timing(response["Server-Timing"])
    parts = [timing.get(name, 0.0) for name in ("queue", "lock", "hold", "outside")]
    assert sum(parts) == pytest.approx(timing["total"], abs=0.05)
    assert timing["outside"] > 0 and timing["hold"] > 0
    assert 0 < timing["commit"] < timing["hold"]
    assert 0 < timing["rtt"] < timing["hold"]  # the section's SQL round trips, inside its hold
    sent = [expanded(query["sql"]) for query in queries.captured_queries]
    # Django's record names the transaction's BEGIN too, and a COMMIT sent alone (not one that rode
    # the write's message); after it nothing but Redis.
    first = sent.index("BEGIN") + 1
    assert "lock_timeout" in sent[first]  # the first statement bounds lock waits
    statements = sent[first:-1] if sent[-1] == "COMMIT" else sent[first:]
    assert timing["sql"] == len(statements) >= 2, [sql[:60] for sql in sent]
    assert "sql;dur=" + str(int(timing["sql"])) + ";" in response["Server-Timing"]  # a count, not "7.00"


@pytest.mark.django_db(transaction=True)
def test_an_answer_without_a_section_carries_no_breakdown(use_strategy, make_product, client, private_static_root):
    """Sold out from the shelf's plain read: no section ran, so no hold, commit, sql or outside."""
    use_strategy("db")
    make_product(stock=0)
    response = buy(client)
    assert response.status_code == 409
    assert set(parse_server_timing(response["Server-Timing"])) == {"db", "total"}
