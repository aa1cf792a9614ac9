"""The flash sale's shoppers: prepared before the sale opens, released together at the opening.

Each Locust process sends its own share of the sale: exactly ``--purchases`` purchases. Before
the timed part every shopper is prepared: a product page load over the user's connection sets
the ``csrftoken`` cookie and the signed session cookie that identifies the shopper. Prepared
users then wait at a gate. The gate opens at the wall-clock time the runner writes to
``--start-file`` (so several processes open together), or at once without one. Then each
user posts the purchases of its shoppers, one after the other:

- ``--scenario spike``: one user per shopper (``-u`` = ``--purchases``); at the opening one loop
  writes every prepared purchase, each to its own connection that stayed open through the
  countdown, and each user then reads its answer;
- ``--scenario closed``: ``-u`` users share the shoppers and post back to back (fixed concurrency).

Users are spread over ``--hosts`` (one base URL per gunicorn "pod") round robin, starting at
``--user-offset`` so that several processes spread evenly too. Every purchase carries a random
``Idempotency-Key``; a 503 with ``Retry-After`` is retried with the same key up to
``--max-retries`` times after waiting as told. A retried purchase is still *one* purchase: it is
counted once in ``sent``/``answered``/``status_counts`` (with its final answer) and its resends in
``client_retries``. A purchase that gets no HTTP answer (refused, reset, timed out: a killed
worker resets its connections) is resent over a new connection with the same key, sharing the
same ``--max-retries`` bound; its resends are ``transport_resends`` and the wall-clock time of each
reset is kept with the purchase. gunicorn logs ``sent + client_retries + transport_resends`` POSTs,
less those a killed worker never answered. A purchase whose last try got no answer is a
``transport_error``.

Run alone (one process, one pod)::

    locust -f loadtests/locustfile.py --headless -u 500 -r 500 --host http://127.0.0.1:8000 \\
        --purchases 500 --sku flash-burst --summary-json /tmp/summary.json

``manage.py flashsale`` drives it and merges the processes' summaries (``loadtests/figures.py``).
The progress file is rewritten every 0.1 s: ``{phase, prepared, sent, answered, limit}``.
What a process counts is kept by :class:`~loadtests.sale.Sale` (``loadtests/sale.py``).
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import gevent
import gevent.socket
from geventhttpclient.header import Headers
from geventhttpclient.response import HTTPParseError, HTTPSocketResponse
from locust import User, constant, events, task
from locust.exception import StopUser

sys.path.insert(
    0, str(Path(__file__).resolve().parent.parent)
)  # for `loadtests.figures` and `loadtests.sale` when run alone
from loadtests.figures import parse_server_timing  # noqa: E402
from loadtests.sale import BODY_COUNTS, Sale  # noqa: E402

PAGE_NAME = "product page"
PURCHASE_NAME = "purchase"
PROGRESS_INTERVAL_S = 0.1
START_POLL_S = 0.01
PAGE_ATTEMPTS = 3
CONNECT_TIMEOUT_S = 10.0
#: How long one answer may take: a spike queues thousands of requests behind a few threads.
NETWORK_TIMEOUT_S = 60.0
#: The longest Retry-After this client honours; a larger one is waited for this long.
MAX_RETRY_WAIT_S = 5.0


sale: Sale | None = None


@events.init_command_line_parser.add_listener
def add_arguments(parser) -> None:
    group = parser.add_argument_group("flash-sale burst")
    group.add_argument("--purchases", type=int, default=500, help="this process's purchases: exactly this many")
    group.add_argument("--scenario", choices=["spike", "closed"], default="spike")
    group.add_argument("--hosts", default="", help="comma-separated base URLs (pods); default --host")
    group.add_argument("--user-offset", type=int, default=0, help="global index of this process's first user")
    group.add_argument("--sku", default="flash-burst", help="the product on sale")
    group.add_argument("--path", default="/api/products/{sku}/purchase", help="where purchases are posted")
    group.add_argument("--quantity", type=int, default=1, help="units per purchase")
    group.add_argument("--max-retries", type=int, default=3, help="resends of a purchase answered 503 + Retry-After")
    group.add_argument("--start-file", default="", help="open the gate at the wall-clock time written here")
    group.add_argument("--summary-json", default="", help="write the purchase figures here at the end")
    group.add_argument("--progress-file", default="", help="rewrite the progress here while running")


def write_json(path: str, data: dict) -> None:
    """Replace ``path`` atomically, so a reader never sees half a file."""
    tmp = Path(f"{path}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def read_open_at(path: str) -> float | None:
    try:
        return float(json.loads(Path(path).read_text())["open_at"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


@events.init.add_listener
def on_init(environment, **kwargs) -> None:
    global sale
    options = environment.parsed_options
    if options is None:
        return
    if options.purchases < 1:
        raise SystemExit("--purchases must be 1 or more")
    users = options.num_users or 1
    if options.scenario == "spike" and users != options.purchases:
        raise SystemExit(f"--scenario spike sends every purchase at once: use -u {options.purchases}")
    sale = Sale(options.purchases, min(users, options.purchases))


def open_gate(environment) -> None:
    """Wait until every shopper of this process is prepared, then open at the agreed time."""
    options = environment.parsed_options
    while sale.prepared + sale.page_failures < sale.limit:
        gevent.sleep(START_POLL_S)
    sale.phase = "ready"
    open_at = None
    while options.start_file and open_at is None:
        open_at = read_open_at(options.start_file)
        gevent.sleep(START_POLL_S)
    if open_at is not None:
        gevent.sleep(max(0.0, open_at - time.time()))
    sale.phase = "open"
    # The spike's purchases are written here, one after the other without yielding to gevent's
    # hub (a small write to an idle connection does not block), so no answer that comes back
    # meanwhile is parsed between two sends. Each shopper then reads its own answer.
    for shopper, request in sale.opening:
        shopper.first_send = shopper.send_now(request)
    sale.gate.set()


def report_progress(environment) -> None:
    path = environment.parsed_options.progress_file
    while True:
        write_json(path, sale.progress())
        gevent.sleep(PROGRESS_INTERVAL_S)


@events.test_start.add_listener
def on_test_start(environment, **kwargs) -> None:
    if environment.parsed_options.progress_file:
        gevent.spawn(report_progress, environment)
    gevent.spawn(open_gate, environment)


@events.user_error.add_listener
def on_user_error(user_instance, exception, tb, **kwargs) -> None:
    """A bug in a shopper's code (not an answer of the shop): stop, so the runner says so at once
    instead of Locust re-running the task and preparing shoppers anew."""
    sale.errors.append(f"{type(exception).__name__}: {exception}")
    if not sale.quitting:
        sale.quitting = True
        gevent.spawn(user_instance.environment.runner.quit)


@events.test_stop.add_listener
def on_test_stop(environment, **kwargs) -> None:
    options = environment.parsed_options
    sale.phase = "done"
    if options.progress_file:
        write_json(options.progress_file, sale.progress())
    if options.summary_json:
        write_json(options.summary_json, sale.summary())


class Connection:
    """One keep-alive HTTP/1.1 connection to a pod that writes prebuilt requests.

    Locust's FastHttpSession spends about 0.3 ms of client CPU building each request; at the
    opening that is 0.8–2.4 s for 5,000 shoppers on two shared cores (measured), longer than the
    spike itself. A prepared shopper's purchase is built during preparation instead, so the
    opening only writes bytes. Answers are parsed by geventhttpclient's HTTP parser.
    """

    def __init__(self, base_url: str) -> None:
        url = urlsplit(base_url)
        self.address = (url.hostname, url.port or 80)
        self.host_header = url.netloc
        self.sock = None

    def request(self, method: str, path: str, headers: dict[str, str], body: bytes = b"") -> bytes:
        lines = [f"{method} {path} HTTP/1.1", f"Host: {self.host_header}"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        if method == "POST":
            lines.append(f"Content-Length: {len(body)}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body

    def send(self, request: bytes) -> None:
        """Write ``request`` (connecting first if needed); returns once the kernel has all of it."""
        if self.sock is None:
            self.sock = gevent.socket.create_connection(self.address, timeout=CONNECT_TIMEOUT_S)
            self.sock.settimeout(NETWORK_TIMEOUT_S)
        self.sock.sendall(request)

    def receive(self, method: str) -> tuple[int, Headers, bytes]:
        """The answer to the request just sent: (status, headers, body)."""
        response = HTTPSocketResponse(self.sock, method=method)
        body = response.read()
        if response.should_close():
            self.close()
        return response.status_code, response.info(), body

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


class Shopper(User):
    """Prepares its share of the shoppers over its own connection, waits at the gate, buys for each."""

    wait_time = constant(0)

    def __init__(self, environment) -> None:
        super().__init__(environment)
        options = environment.parsed_options
        self.index = sale.next_user
        sale.next_user += 1
        hosts = [host for host in options.hosts.split(",") if host] or [environment.host]
        self.connection = Connection(hosts[(options.user_offset + self.index) % len(hosts)])
        self.first_send: float | BaseException | None = None  # set by open_gate in the spike

    def on_stop(self) -> None:
        self.connection.close()

    @task
    def shop(self) -> None:
        options = self.environment.parsed_options
        shoppers = [self.prepare(options) for _ in range(sale.shoppers_of(self.index))]
        if options.scenario == "spike" and shoppers[0] is not None:
            sale.opening.append((self, shoppers[0]))
        sale.gate.wait()
        for purchase in shoppers:
            if purchase is not None:
                self.purchase(options, purchase, sent=self.first_send)
                self.first_send = None
        sale.quit_when_finished(self.environment)
        raise StopUser()

    def send_now(self, request: bytes) -> float | OSError:
        """Write ``request``: the wall-clock time it was fully handed to the kernel, or the error."""
        try:
            self.connection.send(request)
        except OSError as exc:
            self.connection.close()
            return exc
        return time.time()

    def exchange(
        self, name: str, method: str, request: bytes, sent: float | BaseException | None = None
    ) -> tuple[int, Headers | None, bytes, float]:
        """Send (unless ``sent`` says it was sent, or failed to be), read the answer, report it to
        Locust: (status or 0, headers, body, seconds sent at)."""
        started = time.perf_counter()
        sent_at = None
        try:
            if sent is None:
                sent = self.send_now(request)
            if isinstance(sent, BaseException):
                raise sent
            sent_at = sent
            status, headers, body = self.connection.receive(method)
            error = None if status in (200, 201, 409, 503) else f"answered {status}"
        except (OSError, HTTPParseError) as exc:
            self.connection.close()
            status, headers, body, error = 0, None, b"", exc
        self.environment.events.request.fire(
            request_type=method,
            name=name,
            response_time=(time.perf_counter() - started) * 1000,
            response_length=len(body),
            exception=error,
            context={},
        )
        return status, headers, body, sent_at if sent_at is not None else time.time()

    def prepare(self, options) -> bytes | None:
        """A new shopper: its purchase request, cookies and CSRF token included, or None if its page kept failing."""
        page = self.connection.request("GET", f"/products/{options.sku}/", {"Accept": "text/html"})
        for attempt in range(PAGE_ATTEMPTS):
            status, headers, _, _ = self.exchange(PAGE_NAME, "GET", page)
            pairs = (cookie.split(";", 1)[0].strip() for cookie in (headers.getlist("set-cookie") if headers else []))
            cookies = dict(pair.split("=", 1) for pair in pairs if "=" in pair)
            if status == 200 and "csrftoken" in cookies:
                sale.prepared += 1
                return self.connection.request(
                    "POST",
                    options.path.format(sku=options.sku),
                    {
                        "Content-Type": "application/json",
                        "X-CSRFToken": cookies["csrftoken"],
                        "Cookie": "; ".join(f"{name}={value}" for name, value in cookies.items()),
                        "Idempotency-Key": secrets.token_urlsafe(16),
                    },
                    json.dumps({"quantity": options.quantity}).encode(),
                )
            gevent.sleep(0.1 * (attempt + 1))
        sale.page_failures += 1
        return None

    def purchase(self, options, request: bytes, *, sent: float | BaseException | None = None) -> None:
        """Send one purchase (or read the answer to one ``sent`` at the opening); resend it (same
        Idempotency-Key) after a 503 + Retry-After or no answer, at most --max-retries times."""
        sale.sent += 1
        started = None
        busy_at, reset_at = [], []
        for attempt in range(options.max_retries + 1):
            already = sent if attempt == 0 else None
            status, headers, body, sent_at = self.exchange(PURCHASE_NAME, "POST", request, already)
            if started is None:
                started = sent_at
                sale.first_sent_at = sale.first_sent_at or sent_at
                sale.last_sent_at = max(sale.last_sent_at or sent_at, sent_at)
            if status == 0 and attempt < options.max_retries:
                reset_at.append(round(time.time(), 4))
                sale.transport_resends += 1
                continue  # exchange() closed the connection: the resend opens a new one
            retry_after = retry_after_s(headers.get("Retry-After")) if status == 503 and headers else None
            if retry_after is not None:
                busy_at.append(round(time.time(), 4))
            if retry_after is None or attempt == options.max_retries:
                break
            sale.client_retries += 1
            gevent.sleep(min(retry_after, MAX_RETRY_WAIT_S))
        busy = retry_after is not None
        self.record(status, headers, body, busy=busy, started=started, busy_at=busy_at, reset_at=reset_at)

    def record(
        self,
        status: int,
        headers: Headers | None,
        body: bytes,
        *,
        busy: bool,
        started: float,
        busy_at: list[float],
        reset_at: list[float],
    ) -> None:
        finished = time.time()
        sale.answered += 1
        sale.last_answered_at = finished
        sale.latencies_ms.append((finished - started) * 1000)
        sale.sent_times.append(started)
        sale.answer_times.append(finished)
        sale.status_counts[str(status)] += 1
        if status == 0:
            sale.transport_errors += 1
        if busy:
            sale.busy += 1
        if status == 201:
            sale.last_confirmed_at = finished
        timing = parse_server_timing(headers.get("Server-Timing") if headers else None)
        for name, value in timing.items():
            if name in sale.timing:
                sale.timing[name].append(value)
        sale.purchases.append([round(started, 4), round(finished, 4), status, timing.get("lock"), busy_at, reset_at])
        try:
            payload = json.loads(body or b"{}")
        except ValueError:
            payload = {}
        if not isinstance(payload, dict):
            payload = {}
        if isinstance(payload.get("outcome"), str):
            sale.outcomes[payload["outcome"]] += 1
        for name in BODY_COUNTS:
            value = payload.get(name)
            if isinstance(value, int) and not isinstance(value, bool):
                sale.counts[name] += value
        sale.quit_when_finished(self.environment)


def retry_after_s(header: str | None) -> float | None:
    """Seconds from a ``Retry-After: <seconds>`` header, or None when absent or not a number."""
    try:
        return max(0.0, float(header)) if header else None
    except ValueError:
        return None
