"""Small helpers shared by the test modules."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from io import StringIO
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis
from django.core.management import CommandError, call_command
from django.db import connection, transaction

from inventory.async_purchase import aclose_loop, apurchase
from inventory.batched import combiners_of, shared_key
from inventory.models import BurstRun, Order, Product
from inventory.strategies import STRATEGIES, get_strategy, strategy_class
from inventory.strategies.fenced import FencedLockStrategy
from loadtests.plan import BurstPlan
from loadtests.pods import pod_backlog, server_environment, start_gunicorn
from processes.children import listening_socket, wait_until_answers

#: Every strategy that must work; the controls (``local``, ``unsafe``) are tested for failing.
WORKING_STRATEGIES = [name for name in STRATEGIES if not strategy_class(name).control]
#: The working strategies whose lock hands out a fencing token that the row's storage check compares.
FENCED_STRATEGIES = [name for name in WORKING_STRATEGIES if issubclass(strategy_class(name), FencedLockStrategy)]


def run_on_a_loop(coroutine):
    """``asyncio.run(coroutine)``, then what a uvicorn worker's lifespan shutdown does as its loop
    ends: ``aclose_loop`` closes the connections the loop's purchases opened (left to the collector
    once the loop is closed, each was a ResourceWarning)."""

    async def then_close():
        try:
            return await coroutine
        finally:
            await aclose_loop()

    return asyncio.run(then_close())


def bought_on_a_loop(**kwargs):
    """``apurchase(**kwargs)`` on a fresh event loop, as a uvicorn worker awaits it."""
    return run_on_a_loop(apurchase(**kwargs))


def refusing_trigger(
    name: str, *, table: str, customer: str = "bob", constraint: str = "allocation_within_limit"
) -> tuple[str, str]:
    """SQL that has PostgreSQL refuse every row of ``customer`` written to ``table`` as the named
    ``constraint`` would (a check violation), and the SQL that removes it again."""
    create = f"""
CREATE FUNCTION {name}() RETURNS trigger AS $$
BEGIN
  IF NEW.customer = '{customer}' THEN
    RAISE EXCEPTION '{customer} refused' USING ERRCODE = 'check_violation', CONSTRAINT = '{constraint}';
  END IF;
  RETURN NEW;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER {name} BEFORE INSERT OR UPDATE ON {table} FOR EACH ROW EXECUTE FUNCTION {name}();
"""
    return create, f"DROP TRIGGER {name} ON {table}; DROP FUNCTION {name}();"


def run_threads(count: int, target, *, timeout_s: float | None = None) -> None:
    """Run ``target(i)`` for i in range(count), each on its own thread, and wait for them all; with
    ``timeout_s``, fail if any is still running after waiting that long for each."""
    threads = [threading.Thread(target=target, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout_s)
    assert not any(thread.is_alive() for thread in threads), f"a thread of {target.__name__} hangs"


def snapshot(sku: str = "phone-x") -> tuple[int, int, int]:
    """(stock, fence, all orders) for one product: what a refusal must leave unchanged."""
    product = Product.objects.get(sku=sku)
    return product.stock, product.fence, Order.objects.count()


def asgi_pod(tmp_path: Path, strategy: str, *, sku: str, **sizing):
    """An ASGI pod (gunicorn + uvicorn workers): :func:`pod` with ``server="asgi"``."""
    return pod(tmp_path, strategy, sku=sku, server="asgi", **sizing)


#: Any 32 letters are a valid CSRF secret: the same in the cookie and the header passes the check.
CSRF = "a" * 32
#: The CSRF cookie and header a POST to a real pod sends (no page was loaded first).
CSRF_HEADERS = {"X-CSRFToken": CSRF, "Cookie": f"csrftoken={CSRF}"}


def post_status(base: str, path: str, body: bytes, *, timeout: float = 30) -> int:
    """One JSON POST to a real pod on a connection of its own, with :data:`CSRF_HEADERS`; its status."""
    url = urlsplit(base)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=timeout)
    try:
        connection.request("POST", path, body=body, headers={"Content-Type": "application/json", **CSRF_HEADERS})
        return connection.getresponse().status
    finally:
        connection.close()


@contextlib.contextmanager
def pod(tmp_path: Path, strategy: str, *, sku: str, server: str, **sizing):
    """A pod (gunicorn: gthread workers for ``server="wsgi"``, uvicorn workers for ``"asgi"``) serving
    ``strategy`` on a port of its own (a socket listening from its choice on, which gunicorn inherits,
    as a burst's pod does: :func:`loadtests.pods.start_gunicorn`), answering for ``sku`` once up,
    every purchase answer saying where its view ran; yields its base URL. ``sizing``: as
    :func:`started_pod`."""
    with started_pod(tmp_path, strategy, sku=sku, server=server, **sizing) as (_, base):
        yield base


@contextlib.contextmanager
def started_pod(
    tmp_path: Path,
    strategy: str,
    *,
    sku: str,
    server: str,
    workers: int = 2,
    threads: int = 4,
    pool: int = 4,
    **env: str,
):
    """:func:`pod`, yielding its gunicorn (a :class:`processes.children.Child`, stopped at the end
    if still running) beside its base URL; its access log is ``tmp_path / "access.log"``."""
    plan = BurstPlan(
        requests=8, stock=1, workers=workers, threads=threads, pool_max_size=pool, pool_timeout_s=0.5, server=server
    )
    environment = server_environment(
        backend=strategy, plan=plan, access_log=tmp_path / "access.log", overrides={"SHOP_SERVED_ON_HEADER": "1", **env}
    )
    sock = listening_socket(backlog=pod_backlog(plan))
    port = sock.getsockname()[1]
    child = start_gunicorn(f"gunicorn ({server})", sock, env=environment, log_path=tmp_path / "gunicorn.log")
    try:
        wait_until_answers(child, f"http://127.0.0.1:{port}/api/products/{sku}")
        yield child, f"http://127.0.0.1:{port}"
    finally:
        child.stop()


@contextlib.contextmanager
def row_locked_elsewhere(product_id: int):
    """The product's row locked ``FOR UPDATE`` by another thread's open transaction, as an admin's
    would hold it: yields the function that ends that transaction (the block's end does too)."""
    locked, done = threading.Event(), threading.Event()

    def holder() -> None:
        try:
            with transaction.atomic():
                Product.objects.select_for_update().get(pk=product_id)
                locked.set()
                done.wait(10)
        finally:
            connection.close()

    thread = threading.Thread(target=holder)
    thread.start()
    try:
        assert locked.wait(10), "the row was not locked"
        yield done.set
    finally:
        done.set()
        thread.join(10)


def waiting_for_a_row_lock_is(count: int) -> bool:
    """Whether ``count`` backends of this test's database wait for a lock (the purchase's read behind
    a test's row lock); the other xdist worker's tests use a database of their own."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
        )
        return cursor.fetchone()[0] == count


def purchases_queued(sku: str) -> int:
    """How many purchases of ``sku`` wait, not yet taken by a leader, in the configured strategy's queue
    (``BATCH`` > 1): the SKU's Redis list under ``QUEUE=shared``, else this process's combiner (its
    threads' or its event loop's; 0 before its first purchase made it)."""
    strategy = get_strategy()
    if strategy.queue == "shared":
        with redis.Redis.from_url(strategy.config["REDIS_URL"]) as client:
            return client.llen(shared_key(strategy, sku))
    combiner = combiners_of(strategy).get(sku)
    return 0 if combiner is None else len(combiner._queue)


def flashsale_refused(options: dict, *, output: Path, sku: str = "flash-burst") -> str:
    """``manage.py flashsale`` with ``options`` that must be refused before the run: its one-line
    message, once checked that nothing ran (no ``output`` written, no burst product, no run kept)."""
    with pytest.raises(CommandError) as excinfo:
        call_command("flashsale", stdout=StringIO(), stderr=StringIO(), **options)
    message = str(excinfo.value)
    assert "\n" not in message, message
    assert not output.exists()
    assert not Product.objects.filter(sku=sku).exists()
    assert not BurstRun.objects.exists()
    return message


def bought_while_the_service_dies(strategy, members, product_id: int):
    """One purchase of ``phone-x`` whose write waits for the row (locked elsewhere) while every
    member of its lock service (``members``: an etcd cluster, a ZooKeeper ensemble) is killed, then
    the row is freed. Returns its answer (or the exception a shopper would have met as a 500), the
    seconds from the row's release to the answer, and whether the purchase was still running."""
    import time

    from inventory.services import purchase

    answers = {}

    def buy() -> None:
        try:
            answers["ann"] = purchase(sku="phone-x", customer="ann", quantity=1, strategy=strategy)
        except Exception as exc:  # noqa: BLE001 - a shopper's 500, shown
            answers["ann"] = exc
        finally:
            connection.close()

    with row_locked_elsewhere(product_id) as unlock:
        buying = threading.Thread(target=buy)
        buying.start()
        deadline = time.monotonic() + 10
        while not waiting_for_a_row_lock_is(1):
            assert time.monotonic() < deadline, "the purchase never waited for the row"
            time.sleep(0.02)
        for member in members:
            member.kill()
        unlock()
        started = time.monotonic()
        buying.join(30)
    return answers.get("ann"), time.monotonic() - started, buying.is_alive()


def bought_with_the_service_down(strategy, members, *, warm: bool):
    """Every member of ``strategy``'s lock service (``members``) killed, its session made before
    (``warm``: one confirmed purchase first) or not yet; then one purchase of ``phone-x``. Returns
    its answer, its seconds, and (stock, orders) before the kill and after the purchase."""
    import time

    from inventory.services import purchase

    if warm:
        assert purchase(sku="phone-x", customer="warm", quantity=1, strategy=strategy).confirmed
    before = (Product.objects.get(sku="phone-x").stock, Order.objects.count())
    for member in members:
        member.kill()
    started = time.monotonic()
    try:
        result = purchase(sku="phone-x", customer="late", quantity=1, strategy=strategy)
    finally:
        took = time.monotonic() - started
        strategy.close()
    return result, took, before, (Product.objects.get(sku="phone-x").stock, Order.objects.count())


class StandInServer(ThreadingHTTPServer):
    """A stand-in pod's server, whose request threads are joined when it closes: none outlives its
    test. A `BusyPod` thread still asleep when its test ended once wrote into the socket HAProxy had
    closed, 1.5 s into a later test, and printed the broken pipe's traceback there; Python 3.11
    places that traceback's carets with `ast.parse`, whose state its threads share, and the later
    test's own `ast.parse` (tests/test_layout.py, in a fresh clone's run) failed with "AST
    constructor recursion depth mismatch"."""

    daemon_threads = False
    block_on_close = True

    def handle_error(self, request, client_address) -> None:
        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):  # the client hung up
            super().handle_error(request, client_address)


@contextlib.contextmanager
def stand_in(handler: type[BaseHTTPRequestHandler]):
    """A :class:`StandInServer` for ``handler`` on a free port, serving until the block ends."""
    server = StandInServer(("127.0.0.1", 0), handler)
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()  # joins the request threads
        serving.join()


def pytest_of_its_own(folder: Path, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    """A pytest run in ``folder`` (a small suite a test wrote there), quiet and without a cache."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--rootdir", str(folder), *args],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
