"""The ASGI pod (``SHOP_SERVER=asgi``): gunicorn with uvicorn workers, Django's ASGI handler, and no
sync middleware in the chain, so the purchase view runs on the event loop."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from email.message import Message
from pathlib import Path

import pytest
from django.conf import settings
from redis import Redis

from inventory.audit import audit
from inventory.models import Order, Product
from inventory.strategies import get_strategy, strategy_class
from inventory.strategies.fenced import FencedLockStrategy
from tests.helpers import CSRF, WORKING_STRATEGIES, asgi_pod

ROOT = Path(__file__).resolve().parent.parent

# Builds Django's ASGI handler in a fresh process (as a uvicorn worker does) and prints what Django
# logged while it loaded the middleware: with DEBUG on it logs every handler it had to adapt.
LOAD_CHAIN = """
import json, logging, django
django.setup()
messages = []
class Keep(logging.Handler):
    def emit(self, record):
        messages.append(record.getMessage())
logger = logging.getLogger("django.request")
logger.addHandler(Keep())
logger.setLevel(logging.DEBUG)
from django.conf import settings
from django.core.handlers.asgi import ASGIHandler
ASGIHandler()
print(json.dumps({"middleware": settings.MIDDLEWARE, "logged": messages}))
"""


def fresh_process(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "shop.settings", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.slow  # starts Django in a process of its own per case: make test runs it, make check does not
def test_the_asgi_chain_adapts_no_middleware():
    """Every middleware of the ASGI pod is async-capable: Django adapts none to a thread, so an
    ``async def`` view is awaited on the worker's event loop (a sync one would put the chain, and
    the view, in a thread per request)."""
    result = fresh_process(LOAD_CHAIN, SHOP_SERVER="asgi", DJANGO_DEBUG="1")
    assert result.returncode == 0, result.stderr
    loaded = json.loads(result.stdout)
    assert "servestatic.middleware.ServeStaticMiddleware" in loaded["middleware"]
    assert "shop.middleware.PoolExhaustedMiddleware" in loaded["middleware"]
    # Django's own, with their hooks inline on the loop: no thread per request (shop/loop_middleware.py)
    assert "shop.loop_middleware.SessionOnLoop" in loaded["middleware"]
    assert "shop.loop_middleware.CsrfOnLoop" in loaded["middleware"]
    assert not [path for path in loaded["middleware"] if path.startswith("django.")]
    assert not [message for message in loaded["logged"] if "adapted" in message], loaded["logged"]


@pytest.mark.slow  # starts Django in a process of its own per case: make test runs it, make check does not
def test_the_wsgi_chain_is_left_as_it_was():
    result = fresh_process(LOAD_CHAIN.replace("ASGIHandler", "WSGIHandler").replace(".asgi", ".wsgi"))
    assert result.returncode == 0, result.stderr
    assert "whitenoise.middleware.WhiteNoiseMiddleware" in json.loads(result.stdout)["middleware"]


@pytest.mark.slow  # starts Django in a process of its own per case: make test runs it, make check does not
@pytest.mark.parametrize("where", ["settings", "gunicorn.conf.py"])
def test_an_unknown_server_is_refused_in_one_line(where):
    read_config = "import runpy; runpy.run_path('gunicorn.conf.py')"
    code = "import django; django.setup()" if where == "settings" else read_config
    result = fresh_process(code, SHOP_SERVER="tornado")
    assert result.returncode != 0
    assert "SHOP_SERVER='tornado': use wsgi or asgi" in result.stderr


def test_gunicorn_runs_uvicorn_workers_for_asgi():
    code = "import runpy, json; c = runpy.run_path('gunicorn.conf.py'); print(json.dumps([c[k] for k in KEYS]))"
    code = code.replace("KEYS", "('wsgi_app', 'worker_class')")
    asgi = json.loads(fresh_process(code, SHOP_SERVER="asgi").stdout)
    wsgi = json.loads(fresh_process(code, SHOP_SERVER="wsgi").stdout)
    assert asgi == ["shop.asgi:application", "uvicorn_worker.UvicornWorker"]
    assert wsgi == ["shop.wsgi:application", "gthread"]


# --- A real ASGI pod: gunicorn + uvicorn workers on the test database ------------------------------

SKU = "asgi-phone"
#: Every strategy that serves on the event loop (etcd and ZooKeeper are refused: blocking clients).
ON_LOOP = [name for name in WORKING_STRATEGIES if not strategy_class(name).loop_refusal]


def post(base: str, *, shopper: str, body: bytes = b'{"quantity": 1}', key: str = "") -> tuple[int, Message, dict]:
    """One purchase as shopper ``shopper`` (its own session cookie): status, headers, JSON body."""
    headers = {"Content-Type": "application/json", "X-CSRFToken": CSRF, "Cookie": f"csrftoken={CSRF}; {shopper}"}
    if key:
        headers["Idempotency-Key"] = key
    request = urllib.request.Request(f"{base}/api/products/{SKU}/purchase", data=body, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.headers, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, json.loads(exc.read() or b"{}")


def session_cookie(base: str) -> str:
    """A new shopper: the session cookie ``/api/session`` sets."""
    with urllib.request.urlopen(f"{base}/api/session", timeout=10) as response:
        cookies = [c.split(";", 1)[0] for c in response.headers.get_all("Set-Cookie")]
    return next(c for c in cookies if c.startswith("sessionid="))


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("name", ON_LOOP)
def test_the_purchase_view_runs_on_the_event_loop(name, use_strategy, make_product, tmp_path):
    """Under a real uvicorn worker the purchase is answered by the ``async def`` view on the worker's
    own loop (its main thread, no thread per request), with the same answers as under WSGI: 201 and
    an order, the same order again for the same Idempotency-Key, Server-Timing, a 4xx that changes
    nothing, and 409 once sold out."""
    use_strategy(name)
    make_product(SKU, stock=1, limit=1)
    with asgi_pod(tmp_path, name, sku=SKU) as base:
        first, again = session_cookie(base), session_cookie(base)
        bad = post(base, shopper=first, body=b'{"quantity": 0}')
        status, headers, body = post(base, shopper=first, key="order-1")
        replayed = post(base, shopper=first, key="order-1")
        late = post(base, shopper=again)
    assert bad[0] == 400 and "quantity" in bad[2]["error"]
    log = (tmp_path / "gunicorn.log").read_text(errors="replace")[-3000:]
    assert (status, body["outcome"], body["backend"]) == (201, "confirmed", name), f"the pod's log ends:\n{log}"
    assert headers["X-Served-On"] == "event loop in MainThread"
    assert "total;dur=" in headers["Server-Timing"]
    assert ("lock;dur=" in headers["Server-Timing"]) == strategy_class(name).guarded
    assert (replayed[0], replayed[2]["order_id"]) == (201, body["order_id"])
    assert (late[0], late[2]["outcome"]) == (409, "sold_out")
    assert late[1]["X-Served-On"] == "event loop in MainThread"
    product = Product.objects.get(sku=SKU)
    assert product.stock == 0
    assert list(Order.objects.filter(product=product).values_list("id", "strategy")) == [(body["order_id"], name)]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("name", ON_LOOP)
def test_an_asgi_pod_never_oversells(name, use_strategy, make_product, tmp_path):
    """Two uvicorn workers, 40 shoppers at once for 10 units: exactly 10 orders, one per shopper."""
    use_strategy(name)
    make_product(SKU, stock=10, limit=1)
    with asgi_pod(tmp_path, name, sku=SKU) as base:
        shoppers = [session_cookie(base) for _ in range(40)]
        with ThreadPoolExecutor(40) as pool:
            answers = list(pool.map(lambda shopper: post(base, shopper=shopper), shoppers))
    statuses = Counter(status for status, _, _ in answers)
    assert set(statuses) <= {201, 409, 503}, statuses
    product = Product.objects.get(sku=SKU)
    orders = Order.objects.filter(product=product)
    assert statuses[201] == orders.count() == 10 - product.stock
    assert product.stock == 0 or statuses[503], statuses  # all sold, unless some were told busy
    assert orders.values("customer").distinct().count() == orders.count()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["etcd", "zookeeper"])
def test_a_strategy_with_a_blocking_client_is_refused_on_asgi(name):
    result = fresh_process("import shop.asgi", SHOP_SERVER="asgi", INVENTORY_STRATEGY=name)
    assert result.returncode != 0
    assert f"INVENTORY_STRATEGY={name} cannot serve under SHOP_SERVER=asgi: " in result.stderr
    assert "is a blocking client" in result.stderr


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("fenced", [True, False])
def test_a_blocked_event_loop_writes_late_and_the_fence_refuses_it(fenced, use_strategy, make_product, tmp_path):
    """A's ASGI worker holds the asyncio lock (lease 300 ms), reads stock 1, then its event loop is
    blocked by sync work for 2 s; B, on another pod, waits out the lease, buys the unit and commits;
    A's loop wakes and writes from its stale read. Fenced: refused, A is told busy, one order.
    Unfenced: A's write lands, two orders for one unit (so the test does reach the race)."""
    use_strategy("redis", LOCK_TTL_MS=300, OPTIONS={"FENCED": fenced})
    make_product(SKU, stock=1, limit=1)
    lock_key = FencedLockStrategy.lock_name(SKU)
    redis = Redis.from_url(settings.INVENTORY["REDIS_URL"])
    env = {"LOCK_TTL_MS": "300", "ACQUIRE_TIMEOUT_MS": "10000", "INVENTORY_FENCED": "1" if fenced else "0"}
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    a_dir.mkdir(), b_dir.mkdir()
    with (
        asgi_pod(a_dir, "tests.loop_pause.LoopBlockingRedis", sku=SKU, workers=1, LOOP_BLOCK_S="2", **env) as a_pod,
        asgi_pod(b_dir, "redis", sku=SKU, workers=1, **env) as b_pod,
        ThreadPoolExecutor(1) as pool,
    ):
        a = pool.submit(post, a_pod, shopper=session_cookie(a_pod))
        deadline = time.monotonic() + 10
        while not redis.exists(lock_key) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert redis.exists(lock_key), "A never took the lock"
        b = post(b_pod, shopper=session_cookie(b_pod))
        a = a.result()
    assert (b[0], b[2]["outcome"]) == (201, "confirmed")
    orders = Order.objects.filter(product__sku=SKU)
    if fenced:
        assert (a[0], a[2]["outcome"], a[2]["conflicts"]) == (503, "busy", 1)
        assert a[1]["Retry-After"] == "1"
        assert orders.count() == 1 and Product.objects.get(sku=SKU).stock == 0
    else:
        assert (a[0], a[2]["outcome"]) == (201, "confirmed")
        assert orders.count() == 2  # one unit, two orders: the lost update the fence prevents


def hang_up_mid_purchase(base: str, *, shopper: str, key: str) -> socket.socket:
    """A keyed purchase sent whole from a raw socket, its answer not read yet: close it to hang up."""
    body = b'{"quantity": 1}'
    head = (
        f"POST /api/products/{SKU}/purchase HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nX-CSRFToken: {CSRF}\r\nCookie: csrftoken={CSRF}; {shopper}\r\n"
        f"Idempotency-Key: {key}\r\n\r\n"
    )
    port = int(base.rsplit(":", 1)[1])
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(head.encode() + body)
    return sock


def lock_nodes(lock) -> list[Redis]:
    return list(getattr(lock, "clients", None) or [lock.client])


def wait_until(predicate, bound_s: float = 10.0) -> float:
    """Poll ``predicate`` until true (within ``bound_s``); how long that took."""
    started = time.monotonic()
    while not predicate():
        assert time.monotonic() - started < bound_s, "not within the bound"
        time.sleep(0.01)
    return time.monotonic() - started


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("name", "batch"), [("redis", 1), ("redlock", 1), ("redis", 4)])
def test_a_shopper_who_hangs_up_while_waiting_for_the_guard_gets_one_order(
    name, batch, use_strategy, make_product, tmp_path
):
    """Sound (kept): on a real uvicorn worker, a keyed purchase waits for the lock (held by the test),
    and its client hangs up (Django cancels the view). The shopper's retry, sent while the first is
    still waiting, and again after, gets the one order the hung-up purchase wrote; the lock is free
    at once after, a new shopper buys, and the audit holds."""
    use_strategy(name)
    make_product(SKU, stock=5, limit=1)
    lock_key = FencedLockStrategy.lock_name(SKU)
    holder = get_strategy().make_lock(lock_key)
    nodes = lock_nodes(holder)
    env = {"ACQUIRE_TIMEOUT_MS": "10000", "INVENTORY_BATCH": str(batch)}
    with asgi_pod(tmp_path, name, sku=SKU, workers=1, **env) as base, ThreadPoolExecutor(1) as pool:
        shopper, other = session_cookie(base), session_cookie(base)
        holder.acquire()
        sock = hang_up_mid_purchase(base, shopper=shopper, key="hung-up-1")
        wait_until(lambda: sum(node.scard(f"{lock_key}:waiters") for node in nodes) >= 1)
        sock.close()  # the client hangs up while its purchase waits for the guard
        time.sleep(0.3)
        retry = pool.submit(post, base, shopper=shopper, key="hung-up-1")  # sent while the first still waits
        time.sleep(0.3)
        assert not Order.objects.filter(product__sku=SKU).exists()
        holder.release()
        retried = retry.result()
        freed_in = wait_until(lambda: not any(node.exists(lock_key) for node in nodes), 5)
        again = post(base, shopper=shopper, key="hung-up-1")
        bought = post(base, shopper=other)
    orders = Order.objects.filter(product__sku=SKU, idempotency_key="hung-up-1")
    assert orders.count() == 1
    order = orders.get()
    assert (retried[0], retried[2]["order_id"]) == (201, order.id)
    assert (again[0], again[2]["order_id"]) == (201, order.id)
    assert (bought[0], bought[2]["outcome"]) == (201, "confirmed")
    assert freed_in < 2.0  # at once, not the 10 s TTL
    report = audit(sku=SKU)
    assert report.ok, report.problems
    assert Product.objects.get(sku=SKU).stock == 3
    posts = [line for line in (tmp_path / "access.log").read_text().splitlines() if "POST" in line]
    assert len(posts) == 3, posts  # the hung-up purchase was never answered: Django cancelled its view


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_worker_closes_its_loop_s_connections_at_shutdown(use_strategy, make_product, tmp_path):
    """Seen by a helper (2026-12-05): Django's ASGI handler refuses the lifespan scope, so uvicorn ran
    every worker without one ("ASGI 'lifespan' protocol appears unsupported") and nothing closed the
    asyncio connections its loop's purchases had opened (the lock's, the shared queue's) before the
    loop ended. The application answers the lifespan itself: at shutdown, after the last answer and
    on the worker's loop, it awaits ``aclose_loop`` (tests/test_async_purchase.py shows what that
    closes), and uvicorn logs the shutdown complete."""
    use_strategy("redis")
    make_product(SKU, stock=1, limit=1)
    env = {"INVENTORY_BATCH": "4", "INVENTORY_QUEUE": "shared", "GUNICORN_LOGLEVEL": "info"}
    with asgi_pod(tmp_path, "redis", sku=SKU, workers=1, **env) as base:
        status, _, body = post(base, shopper=session_cookie(base))
    log = (tmp_path / "gunicorn.log").read_text(errors="replace")
    assert (status, body["outcome"]) == (201, "confirmed"), log[-3000:]
    assert "protocol appears unsupported" not in log, log[-3000:]
    assert "Application shutdown complete." in log, log[-3000:]
