"""The locustfile as one headless Locust process (no master, no workers) against the live server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler

import pytest
from django.conf import settings

from inventory.models import Order
from loadtests.burst import prepare_product
from loadtests.pods import LOCUSTFILE
from tests.helpers import stand_in

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

SKU = "alone-sale"


def locust(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "--only-summary", *args],
        cwd=settings.BASE_DIR,
        env={**os.environ, "PYTHONPATH": str(settings.BASE_DIR)},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.parametrize("scenario, users, purchases", [("spike", 12, 0), ("closed", 4, 15)])
def test_one_process_sells_exactly_its_purchases(live_server, tmp_path, scenario, users, purchases):
    prepare_product(sku=SKU, stock=5)
    summary = tmp_path / "summary.json"
    done = locust(
        *("-u", str(users), "-r", str(users), "-t", "90s", "--host", live_server.url, "--sku", SKU),
        *("--scenario", scenario, "--purchases", str(purchases), "--summary-json", str(summary)),
    )
    sale = json.loads(summary.read_text())
    expected = purchases or users
    assert (sale["sent"], sale["answered"], sale["limit"]) == (expected, expected, expected), done.stderr[-2000:]
    assert sale["status_counts"] == {"201": 5, "409": expected - 5} and sale["phase"] == "done"
    assert Order.objects.filter(product__sku=SKU).count() == 5


class OneSlowConnection(BaseHTTPRequestHandler):
    """A stand-in pod whose first keep-alive connection answers each purchase 50 ms late (the
    gunicorn worker holding the most connections), the others at once; it counts the POSTs of each."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # else each answer's body waits for the client's delayed ACK
    lock = threading.Lock()
    connections: list[int] = []
    posts: Counter[int] = Counter()

    def setup(self) -> None:
        super().setup()
        with self.lock:
            self.number = len(self.connections)
            self.connections.append(self.number)

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.answer(200, b"{}", cookies=("csrftoken=t", "sessionid=s"))

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers["Content-Length"]))
        with self.lock:
            self.posts[self.number] += 1
        if self.number == 0:
            time.sleep(0.05)
        self.answer(409, b'{"outcome": "sold_out"}')

    def answer(self, status: int, body: bytes, cookies: tuple[str, ...] = ()) -> None:
        self.send_response(status)
        for cookie in cookies:
            self.send_header("Set-Cookie", f"{cookie}; Path=/")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


def test_users_send_the_round_s_purchases_until_none_is_left_whoever_prepared_them(tmp_path):
    """A closed loop's users share their worker's purchases: the user on the fast connection sends
    most of them. Before, each sent its own shoppers' only, 20 of 40: the fast one was done at once
    and the rest of the round ran on the slow connection alone (as the deep rounds' last part ran on
    the one gunicorn worker holding 53 of 100 connections while the machine's cores idled)."""
    OneSlowConnection.connections.clear()
    OneSlowConnection.posts.clear()
    summary = tmp_path / "summary.json"
    with stand_in(OneSlowConnection) as server:
        done = locust(
            *("-u", "2", "-r", "2", "-t", "60s", "--host", f"http://127.0.0.1:{server.server_address[1]}"),
            *("--scenario", "closed", "--purchases", "40", "--countdown", "0", "--summary-json", str(summary)),
        )
    sale = json.loads(summary.read_text())
    assert (sale["sent"], sale["answered"]) == (40, 40), done.stderr[-2000:]
    assert sum(OneSlowConnection.posts.values()) == 40
    assert OneSlowConnection.posts[0] <= 5, f"the slow connection sent {OneSlowConnection.posts[0]} of 40"


def test_a_negative_purchase_count_is_refused_in_one_line(tmp_path):
    done = locust("-u", "1", "--host", "http://127.0.0.1:9", "--purchases", "-1")
    assert done.returncode != 0 and "--purchases must be 0 or more, not -1" in done.stderr


@pytest.mark.parametrize(
    "flag, value, said",
    [
        # nan passed `value < 0` and reached gevent.spawn_later: the gate never opened, and neither -t nor
        # SIGTERM ended the process.
        ("--countdown", "nan", "--countdown must be a finite number, 0 or more, not nan"),
        ("--countdown", "inf", "--countdown must be a finite number, 0 or more, not inf"),
        ("--countdown", "-1", "--countdown must be 0 or more, not -1"),
        # range(0) in Shopper.purchase: every user raised UnboundLocalError ('retry_after') until -t.
        ("--max-retries", "-1", "--max-retries must be 0 or more, not -1"),
        ("--quantity", "0", "--quantity must be 1 or more, not 0"),
        ("--quantity", "-2", "--quantity must be 1 or more, not -2"),
        # Past the shop's MAX_QUANTITY (100): every purchase of the run was answered 400, nothing sold.
        ("--quantity", "101", "--quantity must be at most 100 (the shop's MAX_QUANTITY), not 101"),
    ],
)
def test_a_bad_number_is_refused_at_start_in_one_line(tmp_path, flag, value, said):
    summary = tmp_path / "summary.json"
    done = locust(
        *("-u", "1", "-t", "5s", "--host", "http://127.0.0.1:9", flag, value, "--summary-json", str(summary)),
        timeout=30,
    )
    assert done.returncode != 0 and said in done.stderr, done.stderr[-2000:]
    assert not summary.exists()


def test_a_path_list_naming_no_endpoint_is_refused_in_one_line(tmp_path):
    summary = tmp_path / "summary.json"
    done = locust("-u", "1", "--host", "http://127.0.0.1:9", "--path", " , ", "--summary-json", str(summary))
    assert done.returncode != 0 and "--path must name at least one endpoint" in done.stderr
    assert not summary.exists()


def listening_hosts(port: int) -> set[str]:
    """The addresses a socket listens on at ``port`` (from /proc/net/tcp and tcp6; state 0A is LISTEN)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as lines:
            next(lines)
            for fields in (line.split() for line in lines):
                address, local_port = fields[1].rsplit(":", 1)
                if int(local_port, 16) == port and fields[3] == "0A":
                    found.add({"0100007F": "127.0.0.1", "00000000": "0.0.0.0", "0" * 32: "::"}.get(address, address))
    return found


@pytest.mark.parametrize("role", ["web UI", "master"])
def test_by_hand_it_listens_on_127_0_0_1_unless_told_otherwise(role):
    """Seen by a helper: docs/distributed.md's by-hand command (`locust -f loadtests/locustfile.py --host ...`)
    put Locust's web UI, which starts a sale against the shop, and its master's port on every interface."""
    from tests.slots import LOCUST_MASTER_PORT, LOCUST_WEB_PORT

    port = LOCUST_WEB_PORT if role == "web UI" else LOCUST_MASTER_PORT
    args = ["--web-port", str(LOCUST_WEB_PORT)]
    if role == "master":
        args += ["--master", "--master-bind-port", str(LOCUST_MASTER_PORT)]
    process = subprocess.Popen(
        [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--host", "http://127.0.0.1:9", *args],
        cwd=settings.BASE_DIR,
        env={**os.environ, "PYTHONPATH": str(settings.BASE_DIR)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while not listening_hosts(port) and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.1)
        assert listening_hosts(port) == {"127.0.0.1"}
    finally:
        process.terminate()
        process.wait(10)


AWAIT_WORKERS = """
import time, gevent
from types import SimpleNamespace
import loadtests.locustfile as locustfile

runner = SimpleNamespace(clients=SimpleNamespace(ready=[]))
gevent.get_hub().loop.update_now()  # the loop's clock stood still since the imports
gevent.spawn_later(0.2, runner.clients.ready.append, "worker-0")  # its greeting, taken by another greenlet
started = time.monotonic()
locustfile.await_workers(runner, 1)
greeted = time.monotonic() - started
locustfile.WORKERS_WAIT_S = 0.3
started = time.monotonic()
locustfile.await_workers(runner, 2)  # a second worker never comes
print(f"{greeted:.2f} {time.monotonic() - started:.2f}")
"""


def test_a_master_waits_for_its_workers_only_until_they_are_ready():
    """Locust's own wait for ``--expect-workers`` checks once, before any greeting can have come in,
    then sleeps a whole second: each burst row's sale started about a second after its Locust worker
    was ready (`prepare` 1.5 s for 500 shoppers, 0.5-0.8 s since). The master now waits at ``init``,
    letting the greetings in, until they are all there, and at most ``WORKERS_WAIT_S``."""
    done = subprocess.run(
        [sys.executable, "-c", AWAIT_WORKERS],
        cwd=settings.BASE_DIR,
        env={**os.environ, "PYTHONPATH": str(settings.BASE_DIR)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    greeted, abandoned = (float(figure) for figure in done.stdout.split())
    assert 0.2 <= greeted < 0.9  # once the greeting is in: not a whole second later, not at the deadline
    assert 0.3 <= abandoned < 5.0  # no more workers: Locust's own wait takes over after WORKERS_WAIT_S
