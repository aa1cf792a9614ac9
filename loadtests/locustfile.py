"""The flash sale's shoppers: prepared before the sale opens, released together at the opening.

Each Locust process sends its own share of the sale: exactly ``--purchases`` purchases. Before
the timed part every shopper is prepared: a product page load over the user's connection sets
the ``csrftoken`` cookie and the signed session cookie that identifies the shopper. Prepared
users then wait at a gate. The gate opens at the wall-clock time the runner writes to
``--start-file`` (so several processes open together), or at once without one. Then each
user posts the purchases of its shoppers, one after the other:

- ``--scenario spike``: one user per shopper (``-u`` = ``--purchases``), so every purchase is
  sent at the opening, each over a connection that stayed open through the countdown;
- ``--scenario closed``: ``-u`` users share the shoppers and post back to back (fixed concurrency).

Users are spread over ``--hosts`` (one base URL per gunicorn "pod") round robin, starting at
``--user-offset`` so that several processes spread evenly too. Every purchase carries a random
``Idempotency-Key``; a 503 with ``Retry-After`` is retried with the same key up to
``--max-retries`` times after waiting as told. A retried purchase is still *one* purchase: it is
counted once in ``sent``/``answered``/``status_counts`` (with its final answer) and its resends in
``client_retries``, so gunicorn logs ``sent + client_retries`` POSTs. A purchase that gets no
HTTP answer (refused, reset, timed out) is a ``transport_error`` and is not retried.

Run alone (one process, one pod)::

    locust -f loadtests/locustfile.py --headless -u 500 -r 500 --host http://127.0.0.1:8000 \\
        --purchases 500 --sku flash-burst --summary-json /tmp/summary.json

``manage.py flashsale`` drives it and merges the processes' summaries (``loadtests/figures.py``).
The progress file is rewritten every 0.1 s: ``{phase, prepared, sent, answered, limit}``.
"""
from __future__ import annotations

import json
import os
import secrets
import sys
import time
from collections import Counter
from pathlib import Path

import gevent
from gevent.event import Event
from locust import FastHttpUser, constant, events, task
from locust.exception import StopUser

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # for `loadtests.figures` when run alone
from loadtests.figures import TIMING_KEYS, parse_server_timing  # noqa: E402

PAGE_NAME = "product page"
PURCHASE_NAME = "purchase"
PROGRESS_INTERVAL_S = 0.1
START_POLL_S = 0.01
PAGE_ATTEMPTS = 3
#: The longest Retry-After this client honours; a larger one is waited for this long.
MAX_RETRY_WAIT_S = 5.0
#: The last counter fields of a response body that the burst adds up.
BODY_COUNTS = ("conflicts", "retries", "constraint_hits")


class Sale:
    """This process's share of the sale: its shoppers, the gate, and what came back."""

    def __init__(self, limit: int, users: int) -> None:
        self.limit = limit
        self.users = users
        self.next_user = 0  # Shopper instances take their index from here
        self.prepared = 0
        self.page_failures = 0  # shoppers whose product page failed every attempt
        self.gate = Event()
        self.phase = "preparing"
        self.sent = 0  # purchases sent (a retried purchase counts once)
        self.answered = 0  # purchases with a final answer (or a transport error)
        self.status_counts: Counter[str] = Counter()  # final answers; "0" = no HTTP answer
        self.busy = 0  # final 503 + Retry-After answers (retries exhausted)
        self.client_retries = 0
        self.transport_errors = 0
        self.counts = Counter()  # conflicts, retries, constraint_hits from the response bodies
        self.outcomes: Counter[str] = Counter()  # the body's "outcome" of each final answer
        self.latencies_ms: list[float] = []
        self.timing: dict[str, list[float]] = {name: [] for name in TIMING_KEYS}
        self.first_sent_at: float | None = None
        self.last_sent_at: float | None = None
        self.last_answered_at: float | None = None
        self.last_confirmed_at: float | None = None
        self.quitting = False

    def shoppers_of(self, user_index: int) -> int:
        """How many of the share's shoppers user ``user_index`` (0-based) prepares and buys for."""
        return len(range(user_index, self.limit, self.users))

    @property
    def finished(self) -> bool:
        return self.answered + self.page_failures >= self.limit

    def quit_when_finished(self, environment) -> None:
        if self.finished and not self.quitting:
            self.quitting = True
            gevent.spawn(environment.runner.quit)

    def progress(self) -> dict:
        return {
            "phase": self.phase, "prepared": self.prepared, "page_failures": self.page_failures,
            "sent": self.sent, "answered": self.answered, "limit": self.limit,
        }

    def summary(self) -> dict:
        return {
            **self.progress(),
            **{name: self.counts[name] for name in BODY_COUNTS},
            "status_counts": dict(sorted(self.status_counts.items())),
            "outcomes": dict(sorted(self.outcomes.items())),
            "busy": self.busy,
            "client_retries": self.client_retries,
            "transport_errors": self.transport_errors,
            "first_sent_at": self.first_sent_at,
            "last_sent_at": self.last_sent_at,
            "last_answered_at": self.last_answered_at,
            "last_confirmed_at": self.last_confirmed_at,
            "latencies_ms": [round(value, 2) for value in self.latencies_ms],
            "server_timing": self.timing,
        }


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


@events.test_stop.add_listener
def on_test_stop(environment, **kwargs) -> None:
    options = environment.parsed_options
    sale.phase = "done"
    if options.progress_file:
        write_json(options.progress_file, sale.progress())
    if options.summary_json:
        write_json(options.summary_json, sale.summary())


class Shopper(FastHttpUser):
    wait_time = constant(0)
    # One connection per user, opened by the page load and kept open until the purchases.
    concurrency = 1
    network_timeout = 60.0
    connection_timeout = 10.0

    def __init__(self, environment) -> None:
        options = environment.parsed_options
        self.index = sale.next_user
        sale.next_user += 1
        hosts = [host for host in options.hosts.split(",") if host] or [environment.host]
        self.host = hosts[(options.user_offset + self.index) % len(hosts)]
        super().__init__(environment)

    @task
    def shop(self) -> None:
        options = self.environment.parsed_options
        shoppers = [self.prepare(options.sku) for _ in range(sale.shoppers_of(self.index))]
        sale.gate.wait()
        for shopper in shoppers:
            if shopper is not None:
                self.purchase(options, *shopper)
        sale.quit_when_finished(self.environment)
        raise StopUser()

    def prepare(self, sku: str) -> tuple[str, str] | None:
        """A new shopper: (CSRF token, Cookie header) from a product page load, or None if it kept failing."""
        for attempt in range(PAGE_ATTEMPTS):
            self.client.cookiejar.clear()
            with self.client.get(f"/products/{sku}/", name=PAGE_NAME, catch_response=True) as response:
                cookies = {cookie.name: cookie.value for cookie in self.client.cookiejar}
                if response.status_code == 200 and "csrftoken" in cookies:
                    sale.prepared += 1
                    return cookies["csrftoken"], "; ".join(f"{name}={value}" for name, value in cookies.items())
                response.failure(f"product page answered {response.status_code} (cookies: {', '.join(cookies)})")
            gevent.sleep(0.1 * (attempt + 1))
        sale.page_failures += 1
        return None

    def purchase(self, options, token: str, cookies: str) -> None:
        headers = {
            "Content-Type": "application/json",
            "X-CSRFToken": token,
            "Cookie": cookies,
            "Idempotency-Key": secrets.token_urlsafe(16),
        }
        body = json.dumps({"quantity": options.quantity})
        path = options.path.format(sku=options.sku)
        sale.sent += 1
        started = time.time()
        if sale.first_sent_at is None:
            sale.first_sent_at = started
        sale.last_sent_at = started
        for attempt in range(options.max_retries + 1):
            self.client.cookiejar.clear()
            with self.client.post(path, name=PURCHASE_NAME, data=body, headers=headers, catch_response=True) as response:
                status = response.status_code or 0
                retry_after = retry_after_s(response.headers.get("Retry-After")) if status == 503 else None
                if status in (200, 201, 409) or retry_after is not None:
                    response.success()
                else:
                    response.failure(f"purchase answered {status}")
            if retry_after is None or attempt == options.max_retries:
                break
            sale.client_retries += 1
            gevent.sleep(min(retry_after, MAX_RETRY_WAIT_S))
        self.record(response, status, busy=retry_after is not None, started=started)

    def record(self, response, status: int, *, busy: bool, started: float) -> None:
        finished = time.time()
        sale.answered += 1
        sale.last_answered_at = finished
        sale.latencies_ms.append((finished - started) * 1000)
        sale.status_counts[str(status)] += 1
        if status == 0:
            sale.transport_errors += 1
        if busy:
            sale.busy += 1
        if status == 201:
            sale.last_confirmed_at = finished
        for name, value in parse_server_timing(response.headers.get("Server-Timing") if status else None).items():
            if name in sale.timing:
                sale.timing[name].append(value)
        try:
            payload = json.loads(response.content or b"{}") if status else {}
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

