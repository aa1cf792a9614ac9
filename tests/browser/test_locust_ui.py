"""Locust's own web UI, master and one worker, driven by a person's clicks through one small sale."""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request

import pytest
from django.conf import settings
from playwright.sync_api import expect

from inventory.models import Order
from loadtests.burst import prepare_product
from loadtests.pods import LOCUSTFILE
from processes.children import Child, stop_all
from tests.slots import LOCUST_MASTER_PORT, LOCUST_WEB_PORT

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SKU = "ui-sale"


def wait_for_worker(url: str, master: Child) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert master.running(), master.log_tail()
        try:
            with urllib.request.urlopen(f"{url}/stats/requests", timeout=2) as response:
                if json.load(response).get("worker_count") == 1:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    pytest.fail(f"the worker never reached the master: {master.log_tail()}")


def runner_state(url: str) -> str:
    """What the master's web UI reads: its runner's state, user count and workers."""
    try:
        with urllib.request.urlopen(f"{url}/stats/requests", timeout=5) as response:
            report = json.load(response)
    except OSError as exc:
        return f"no stats ({exc})"
    return f"state {report.get('state')}, users {report.get('user_count')}, workers {report.get('workers')}"


def ui_stats(url: str, *, purchases: int, within_s: float = 10.0) -> dict[str, dict]:
    """The web UI's request stats by name, once they count ``purchases`` purchases or ``within_s``
    has passed. A worker told to stop sends no final report (Locust's ``WorkerRunner`` does so
    only on quit): its last samples reach the master with its next periodic one, up to 3 s after
    the UI reads STOPPED (seen once: 22 of 30 purchases in a full ``make test``)."""
    deadline = time.monotonic() + within_s
    while True:
        with urllib.request.urlopen(f"{url}/stats/requests", timeout=5) as response:
            stats = {row["name"]: row for row in json.load(response)["stats"]}
        counted = stats.get("purchase", {}).get("num_requests", 0)
        if counted >= purchases or time.monotonic() >= deadline:
            return stats
        time.sleep(0.25)


# Seen in four fresh clones' full runs (2026-12-07, load 8-11): the sale ended and the worker reported
# that it had stopped, the master's own state was "stopped" (the fourth printed it), yet the page
# read "stopping" for 20 s. Cause: Locust's page stops polling once it reads "stopping", and a poll
# had come while the runner stopped; loadtests/webui.py now holds such a poll until the stop is over
# (tests/test_locust_webui.py). Rerun up to twice until fresh clones have shown it gone.
@pytest.mark.flaky(reruns=2)
def test_the_numbers_typed_into_the_form_are_the_sale(live_server, page, tmp_path):
    prepare_product(sku=SKU, stock=10)
    summary = tmp_path / "summary.json"
    # DEBUG: the master's "Stopping..." and the stop messages it sends, for the flaky marker's cause.
    locust = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--loglevel", "DEBUG"]
    env = {**os.environ, "PYTHONPATH": str(settings.BASE_DIR)}
    master = Child(
        "locust master",
        [
            *locust,
            *("--master", "--master-bind-host", "127.0.0.1", "--master-bind-port", str(LOCUST_MASTER_PORT)),
            *("--web-host", "127.0.0.1", "--web-port", str(LOCUST_WEB_PORT)),
            *("--host", live_server.url, "--sku", SKU, "--summary-json", str(summary)),
        ],
        cwd=settings.BASE_DIR,
        env=env,
        log_path=tmp_path / "master.log",
    )
    worker = Child(
        "locust worker",
        [*locust, "--worker", "--master-host", "127.0.0.1", "--master-port", str(LOCUST_MASTER_PORT)],
        cwd=settings.BASE_DIR,
        env=env,
        log_path=tmp_path / "worker.log",
    )
    url = f"http://127.0.0.1:{LOCUST_WEB_PORT}"
    try:
        master.start()
        worker.start()
        wait_for_worker(url, master)
        page.goto(url)
        page.locator("input[name=userCount]").fill("30")
        page.locator("input[name=spawnRate]").fill("10")  # the rate paces preparation only
        page.get_by_role("button", name="Start").click()
        deadline = time.monotonic() + 90
        while not summary.exists() and time.monotonic() < deadline:
            time.sleep(0.25)
        assert summary.exists(), f"no summary: {master.log_tail()} | {worker.log_tail()}"
        try:
            expect(page.get_by_text("STOPPED")).to_be_visible(timeout=20_000)
        except AssertionError as missed:  # keep what the flaky marker's cause needs (docs/testing.md)
            raise AssertionError(f"{missed}\nmaster: {runner_state(url)} | {master.log_tail(30)}") from None
        sale = json.loads(summary.read_text())
        stats = ui_stats(url, purchases=30)
    finally:
        stop_all([worker, master])
    assert (sale["sent"], sale["answered"], sale["planned_workers"]) == (30, 30, 1)
    assert sale["status_counts"] == {"201": 10, "409": 20} and sale["arrival_window_s"] < 1.0
    assert Order.objects.filter(product__sku=SKU).count() == 10
    assert stats["purchase"]["num_requests"] == 30 and stats["session"]["num_requests"] >= 30
