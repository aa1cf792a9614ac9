"""The plain spike client (loadtests/yardstick.py) against the live server: the figure that the
Locust path's overhead is read against."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from django.conf import settings

pytestmark = pytest.mark.django_db(transaction=True)


def yardstick(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "loadtests.yardstick", *args],
        cwd=settings.BASE_DIR,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_every_prepared_request_is_released_at_once_and_answered(live_server, make_product):
    make_product()
    done = yardstick("--host", live_server.url, "--requests", "20", "--path", "/api/products/phone-x/floor", "--json")
    figures = json.loads(done.stdout)
    assert done.returncode == 0, done.stderr
    assert figures["status_counts"] == {"200": 20} and figures["failed_preparations"] == 0
    assert 0 <= figures["arrival_window_s"] <= figures["drain_s"] and figures["rps"] > 0


def test_no_shop_there_is_a_one_line_error():
    done = yardstick("--host", "http://127.0.0.1:9", "--requests", "3")
    assert done.returncode == 1
    assert done.stderr.strip() == "no shopper could be prepared at http://127.0.0.1:9: is the shop running there?"


@pytest.mark.parametrize(
    "args, message", [(["--requests", "0"], "--requests must be 1 or more"), (["--host", "ftp://x"], "give a base URL")]
)
def test_bad_arguments_are_refused(args, message):
    done = yardstick(*args)
    assert done.returncode == 2 and message in done.stderr


def test_shoppers_it_could_not_prepare_fail_the_run_in_one_line(live_server, make_product):
    # Half the shoppers go to a port where nothing listens: the figures would be of half the spike.
    make_product()
    done = yardstick(
        "--host", f"{live_server.url},http://127.0.0.1:9", "--requests", "6", "--path", "/api/products/phone-x/floor"
    )
    assert done.returncode == 1, done.stdout
    assert done.stderr.strip() == (
        "3 of 6 shoppers could not be prepared at "
        f"{live_server.url},http://127.0.0.1:9: the figures are not of a {6}-request spike"
    )


@pytest.mark.parametrize("host", ["http://127.0.0.1:99999", "http://127.0.0.1:port"])
def test_a_host_with_a_bad_port_is_refused_in_one_line(host):
    done = yardstick("--host", host, "--requests", "1")
    assert done.returncode == 2 and "give a base URL" in done.stderr and "Traceback" not in done.stderr
