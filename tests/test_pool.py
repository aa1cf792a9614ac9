"""Connection exhaustion fails fast: more concurrent buyers than pooled connections get 503 + Retry-After.

A real gunicorn (one worker, 8 threads, a pool of 2 connections, 0.5 s pool timeout) runs the
``db`` strategy against the test database. The test holds the product's row lock from its own
connection, so the two buyers that get a pooled connection block on it while holding that
connection (the ``db`` strategy's known cost); the other six wait for the pool, time out and must
be told "busy, retry", not a 500. Then the lock is released and the audit must balance.

The same on an ASGI pod (one uvicorn worker whose ORM runs on 8 threads, ``ASGI_DB_THREADS``):
the pool and its timeout mean what they mean under gunicorn's threads.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

from inventory.models import Order, Product
from loadtests.pods import database_url
from tests.helpers import pod

pytestmark = pytest.mark.slow

SKU = "pool-phone"
BUYERS = 8
POOL = 2
# Any 32 letters are a valid CSRF secret; sending the same in the header passes the check.
CSRF = "a" * 32


def buy(base: str) -> tuple[int, str | None, dict]:
    request = urllib.request.Request(
        f"{base}/api/products/{SKU}/purchase",
        data=b'{"quantity": 1}',
        method="POST",
        headers={"Content-Type": "application/json", "X-CSRFToken": CSRF, "Cookie": f"csrftoken={CSRF}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.headers.get("Retry-After"), json.loads(response.read())
    except urllib.error.HTTPError as exc:
        body = exc.read()
        return exc.code, exc.headers.get("Retry-After"), json.loads(body) if body.startswith(b"{") else {}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("server", ["wsgi", "asgi"])
def test_more_buyers_than_connections_get_503_not_500(server, make_product, tmp_path):
    make_product(SKU, stock=10)
    # The pool's timeout is the pod's 0.5 s; its port a socket it inherits (tests/helpers.py).
    with (
        pod(tmp_path, "db", sku=SKU, server=server, workers=1, threads=BUYERS, pool=POOL) as base,
        psycopg.connect(database_url()) as holder,
    ):
        holder.execute("SELECT id FROM inventory_product WHERE sku = %s FOR UPDATE", [SKU])
        with ThreadPoolExecutor(BUYERS) as threads:
            answers = [threads.submit(buy, base) for _ in range(BUYERS)]
            time.sleep(2.0)  # four pool timeouts: every buyer without a connection has been answered
            assert Order.objects.filter(product__sku=SKU).count() == 0  # the row lock held everyone off
            holder.commit()
            answers = [answer.result() for answer in answers]

    statuses = sorted(status for status, _, _ in answers)
    assert set(statuses) <= {201, 503}, statuses
    busy = [(retry_after, body) for status, retry_after, body in answers if status == 503]
    assert len(busy) >= BUYERS - POOL - 1, statuses  # one late starter may still find a free connection
    assert all(retry_after == "1" and body["outcome"] == "busy" for retry_after, body in busy)
    assert "no database connection" in (tmp_path / "gunicorn.log").read_text()
    confirmed = statuses.count(201)
    assert confirmed >= POOL
    product = Product.objects.get(sku=SKU)
    assert product.stock == 10 - confirmed
    assert Order.objects.filter(product=product).count() == confirmed
