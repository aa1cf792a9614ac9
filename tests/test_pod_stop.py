"""How a pod's gunicorn leaves (``gunicorn.conf.py``'s ``worker_exit`` and ``on_exit``): stopped,
it has logged every request it answered and exits 0, on either server; a worker that cannot load
the shop still makes gunicorn exit with an error, not 0.

A cleanly stopping worker, and then its arbiter, skip the interpreter's own teardown
(``os._exit`` after flushing the logs): it took 0.25-0.4 s of each, once per pod and burst row,
with nothing left to do. These tests hold what that must not cost: a request's access-log line
(the burst compares those lines with what Locust sent) and a failure's exit status.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from inventory.models import Order, Product
from processes.children import ChildError
from tests.helpers import post_status, started_pod

pytestmark = pytest.mark.slow

SKU = "stop-phone"
PURCHASES = 40


def purchase(base: str) -> int:
    """One purchase of one unit on a connection of its own; its status."""
    return post_status(base, f"/api/products/{SKU}/purchase", b'{"quantity": 1}')


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("server", ["wsgi", "asgi"])
def test_a_stopped_pod_has_logged_every_request_and_exits_0(server, make_product, tmp_path):
    make_product(SKU, stock=PURCHASES, limit=PURCHASES)
    with started_pod(tmp_path, "db", sku=SKU, server=server) as (gunicorn, base):
        with ThreadPoolExecutor(8) as pool:
            statuses = list(pool.map(purchase, [base] * PURCHASES))
        gunicorn.stop()  # at once: the last answers' log lines are written after them
        assert gunicorn.process.returncode == 0, gunicorn.log_tail()
    assert statuses == [201] * PURCHASES
    assert Order.objects.count() == PURCHASES and Product.objects.get(sku=SKU).stock == 0
    logged = (tmp_path / "access.log").read_text().count(f'"POST /api/products/{SKU}/purchase ')
    assert logged == PURCHASES


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("server", ["wsgi", "asgi"])
def test_a_worker_that_cannot_load_the_shop_fails_gunicorn(server, make_product, tmp_path):
    # Loaded in each worker (no preload), the shop's settings refuse the database URL there: the
    # worker exits with gunicorn's app-load error and the arbiter halts with it, not with 0.
    make_product(SKU, stock=1, limit=1)
    refused = pytest.raises(ChildError, match=r"exited with code [1-9]")
    with refused, started_pod(tmp_path, "db", sku=SKU, server=server, GUNICORN_PRELOAD="0", DATABASE_URL="garbage"):
        pass
