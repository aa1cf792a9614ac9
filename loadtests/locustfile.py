"""The flash-sale burst: every iteration of a Locust user is a new shopper.

A shopper starts with no cookies, loads the product page (which sets the ``csrftoken`` cookie
and the session that identifies the shopper), then posts one purchase with the CSRF header.

Locust has no "stop after N requests" switch, so this file counts purchase POSTs itself and
never sends more than ``--purchases``: a shopper claims a purchase slot *before* loading the
page (no gevent switch between the check and the increment, so the claim is atomic within
this process), gives the slot back if the page fails, and the runner quits once every
claimed purchase has been answered. That only holds in one Locust process: distributed mode
(``--processes``, master/workers) is refused.

Run it alone::

    locust -f loadtests/locustfile.py --headless -u 200 -r 200 --host http://127.0.0.1:8000 \\
        --purchases 5000 --sku flash-burst --summary-json /tmp/summary.json

``manage.py flashsale`` drives it that way and reads the summary (purchase requests sent,
HTTP status counts, latency percentiles and rate of the purchase POSTs only) and the progress
file it rewrites every 0.2 s while the burst runs.
"""
from __future__ import annotations

import json
import math
import os
import time
from collections import Counter
from pathlib import Path

import gevent
from locust import FastHttpUser, constant, events, task
from locust.exception import StopUser
from locust.runners import LocalRunner

PAGE_NAME = "product page"
PURCHASE_NAME = "purchase"
PROGRESS_INTERVAL_S = 0.2


def percentile(sorted_values: list[float], fraction: float) -> float:
    """Nearest-rank percentile of an ascending list (0.0 when empty)."""
    if not sorted_values:
        return 0.0
    rank = max(1, math.ceil(fraction * len(sorted_values)))
    return sorted_values[rank - 1]


class Burst:
    """The purchase budget and what came back, for this Locust process."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.claimed = 0  # shoppers holding a purchase slot (page loading, or POST sent)
        self.sent = 0  # purchase POSTs sent
        self.answered = 0  # purchase POSTs finished (answer or transport error)
        self.status_counts: Counter[str] = Counter()  # "201", "409", "503", ... "0" = no HTTP answer
        self.busy = 0  # 503s that are the shop's deliberate "busy, retry" answer
        self.page_failures = 0
        self.latencies_ms: list[float] = []
        self.first_sent_at: float | None = None
        self.last_answered_at: float | None = None
        self.quitting = False

    def claim(self) -> bool:
        # No gevent switch in here, so two users cannot both take the last slot.
        if self.claimed >= self.limit:
            return False
        self.claimed += 1
        return True

    def give_back(self) -> None:
        self.claimed -= 1

    @property
    def finished(self) -> bool:
        return self.answered >= self.limit

    def progress(self) -> dict:
        return {"sent": self.sent, "answered": self.answered, "limit": self.limit}

    def summary(self) -> dict:
        latencies = sorted(self.latencies_ms)
        window = (
            self.last_answered_at - self.first_sent_at
            if self.first_sent_at is not None and self.last_answered_at is not None
            else 0.0
        )
        return {
            **self.progress(),
            "status_counts": dict(sorted(self.status_counts.items())),
            "busy": self.busy,
            "page_failures": self.page_failures,
            "duration_s": round(window, 3),
            "rps": round(self.answered / window, 1) if window > 0 else 0.0,
            "p50_ms": round(percentile(latencies, 0.50), 1),
            "p95_ms": round(percentile(latencies, 0.95), 1),
            "p99_ms": round(percentile(latencies, 0.99), 1),
        }


burst: Burst | None = None


@events.init_command_line_parser.add_listener
def add_arguments(parser) -> None:
    group = parser.add_argument_group("flash-sale burst")
    group.add_argument("--purchases", type=int, default=5000, help="purchase requests to send, then quit")
    group.add_argument("--sku", default="flash-burst", help="the product on sale")
    group.add_argument("--quantity", type=int, default=1, help="units per purchase")
    group.add_argument("--summary-json", default="", help="write the purchase figures here at the end")
    group.add_argument("--progress-file", default="", help="rewrite {sent, answered, limit} here while running")
    group.add_argument(
        "--max-page-failures", type=int, default=100, help="give up after this many failed product pages (the shop is down)"
    )


def write_json(path: str, data: dict) -> None:
    """Replace ``path`` atomically, so a reader never sees half a file."""
    tmp = Path(f"{path}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


@events.init.add_listener
def on_init(environment, **kwargs) -> None:
    global burst
    runner = environment.runner
    if runner is not None and not isinstance(runner, LocalRunner):
        raise SystemExit("loadtests/locustfile.py counts purchases in one process: run without --processes/--master/--worker")
    options = environment.parsed_options
    if options.purchases < 0:
        raise SystemExit("--purchases must be 0 or more")
    burst = Burst(options.purchases)


def report_progress(environment) -> None:
    path = environment.parsed_options.progress_file
    while True:
        write_json(path, burst.progress())
        gevent.sleep(PROGRESS_INTERVAL_S)


@events.test_start.add_listener
def on_test_start(environment, **kwargs) -> None:
    if environment.parsed_options.progress_file:
        gevent.spawn(report_progress, environment)
    if burst.limit == 0:
        gevent.spawn(environment.runner.quit)


@events.test_stop.add_listener
def on_test_stop(environment, **kwargs) -> None:
    options = environment.parsed_options
    if options.progress_file:
        write_json(options.progress_file, burst.progress())
    if options.summary_json:
        write_json(options.summary_json, burst.summary())


class Shopper(FastHttpUser):
    wait_time = constant(0)
    # One connection per user, kept alive across shoppers; fresh cookies make each a new shopper.
    concurrency = 1
    network_timeout = 30.0
    connection_timeout = 10.0

    @task
    def buy_once(self) -> None:
        if not burst.claim():
            raise StopUser()
        self.client.cookiejar.clear()
        sku = self.environment.parsed_options.sku
        token = self.load_page(sku)
        if token is None:
            burst.give_back()
            burst.page_failures += 1
            if burst.page_failures >= self.environment.parsed_options.max_page_failures and not burst.quitting:
                burst.quitting = True  # the shop is not serving its pages: stop rather than spin
                gevent.spawn(self.environment.runner.quit)
            gevent.sleep(0.05)
            return
        self.purchase(sku, token)

    def load_page(self, sku: str) -> str | None:
        """GET the product page; the CSRF token from the cookie it set, or None."""
        with self.client.get(f"/products/{sku}/", name=PAGE_NAME, catch_response=True) as response:
            if response.status_code != 200:
                response.failure(f"product page answered {response.status_code}")
                return None
            token = next((c.value for c in self.client.cookiejar if c.name == "csrftoken"), None)
            if token is None:
                response.failure("product page set no csrftoken cookie")
            return token

    def purchase(self, sku: str, token: str) -> None:
        options = self.environment.parsed_options
        burst.sent += 1
        started = time.perf_counter()
        if burst.first_sent_at is None:
            burst.first_sent_at = started
        with self.client.post(
            f"/api/products/{sku}/purchase",
            name=PURCHASE_NAME,
            data=json.dumps({"quantity": options.quantity}),
            headers={"Content-Type": "application/json", "X-CSRFToken": token},
            catch_response=True,
        ) as response:
            finished = time.perf_counter()
            status = response.status_code or 0
            burst.answered += 1
            burst.last_answered_at = finished
            burst.latencies_ms.append((finished - started) * 1000)
            burst.status_counts[str(status)] += 1
            # 201 confirmed and 409 sold out / limit are the expected answers of a sale;
            # a 503 with Retry-After is the shop saying "busy", which is allowed, though rare.
            if status == 503 and response.headers.get("Retry-After"):
                burst.busy += 1
                response.success()
            elif status in (201, 409):
                response.success()
            else:
                response.failure(f"purchase answered {status}")
        if burst.finished and not burst.quitting:
            burst.quitting = True
            gevent.spawn(self.environment.runner.quit)
