"""``manage.py purchasecost``: what one request costs this process, floor against purchase, per strategy.

A burst's rates move 10-30 % from run to run on a shared machine (docs/batching.md, "Figures"); a
change to the request path that saves a tenth of its CPU is invisible in one. This command counts
instead: each case runs in a child process of its own under ``valgrind --tool=callgrind``, which
counts the instructions the process executes (the same count for the same work, whatever else
the machine is doing). A child sends requests through Django's test client (the shop's
middleware, session, CSRF and view; no gunicorn, no socket before the view) to a product of its
own (``cost-probe-<pid>``, deleted at the end with its orders), after a warm-up, with what the
process holds by then frozen out of the garbage collector (``gc.freeze``). Every case runs
twice, with the warm-up only and with ``--requests`` more: the difference per request is what a
request costs. Only this process is counted: PostgreSQL's and Redis's share is not, nor
gunicorn's. The floor is counted once (its view is the same whatever the strategy). About
90 s a case at the default 100 requests, most of it Django starting under valgrind.

``--counter cpu`` reads the child's CPU time instead (``time.process_time``, the best of eight
blocks): quick, without valgrind, and as noisy as the machine.

``--batch N`` counts a purchase served in shared sections: the strategy runs with ``BATCH=N`` and
the child's requests come from N shoppers, each a thread with a session of its own sending one
request after another (the floor's too), so that purchases queue behind a leader as a pod's threads'
do. The table then gives the mean section size a purchase was served in (from its ``Server-Timing``,
kept as it came and read after the counted requests: under callgrind that reading counts, about a
thousandth of a request); under valgrind, which runs one thread at a time, sections are smaller than
on a pod.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError
from django.db import connection

from inventory.strategies import strategy_class
from loadtests.pods import database_url

WARM_UP = 20
KINDS = ("floor", "purchase")


class Command(BaseCommand):
    help = "Instructions (callgrind) or CPU per request of the floor and the purchase view, per strategy."

    def add_arguments(self, parser):
        parser.add_argument("--strategies", default="db,atomic,redis", help="comma-separated (default db,atomic,redis)")
        parser.add_argument("--requests", type=int, default=100, help="requests counted per case (default 100)")
        parser.add_argument("--counter", choices=("callgrind", "cpu"), default="callgrind")
        parser.add_argument(
            "--batch", type=int, default=1, help="BATCH for the strategies, and as many shopper threads (default 1)"
        )
        parser.add_argument("--child", choices=KINDS, help=argparse.SUPPRESS)

    def handle(self, *args, strategies: str, requests: int, counter: str, batch: int, child: str | None, **options):
        if child is not None:  # the warm-up alone is a child of 0 requests
            return self._child(child, requests, counter, batch)
        if requests < 1:
            raise CommandError("--requests must be at least 1")
        if batch < 1:
            raise CommandError("--batch must be at least 1")
        if requests % batch:
            raise CommandError(f"--requests must be a multiple of --batch (each of the {batch} shoppers sends as many)")
        names = [name.strip() for name in strategies.split(",") if name.strip()]
        if not names:
            raise CommandError("--strategies names no strategy")
        for name in names:
            try:
                strategy_class(name)
            except ImproperlyConfigured as exc:
                raise CommandError(str(exc).replace("INVENTORY_STRATEGY=", "--strategies ")) from exc
        if counter == "callgrind" and shutil.which("valgrind") is None:
            raise CommandError("valgrind is not installed: install it (apt-get install valgrind) or use --counter cpu")
        unit = "instructions" if counter == "callgrind" else "CPU ms"
        shoppers = f", {batch} shoppers, BATCH={batch}" if batch > 1 else ""
        self.stdout.write(f"per request, {unit} of this process ({requests} requests a case{shoppers}, {counter})")
        sections = f"{'section':>9}" if batch > 1 else ""
        self.stdout.write(f"{'strategy':<14}{'floor':>12}{'purchase':>12}{'floor/purchase':>16}{sections}")
        floor, _ = self._measure(names[0], "floor", requests, counter, batch)  # the same view whatever the strategy
        for name in names:
            purchase, section = self._measure(name, "purchase", requests, counter, batch)
            cells = f"{_shown(floor, counter):>12}{_shown(purchase, counter):>12}{floor / purchase:>16.2f}"
            self.stdout.write(f"{name:<14}{cells}" + (f"{section:>9.1f}" if batch > 1 else ""))

    def _measure(self, strategy: str, kind: str, requests: int, counter: str, batch: int) -> tuple[float, float]:
        """Per request, the cost and the mean section size a request was served in."""
        self.stderr.write(f"\r\033[K{strategy}: {kind} ({counter})", ending="")
        self.stderr.flush()
        try:
            if counter == "cpu":
                said = json.loads(_run_child(strategy, kind, requests, batch, valgrind=None)[0])
                return said["cpu_ms"], said["section"]
            with tempfile.TemporaryDirectory() as out:
                base, _ = _instructions(strategy, kind, 0, batch, out)
                counted, section = _instructions(strategy, kind, requests, batch, out)
                return (counted - base) / requests, section
        finally:
            self.stderr.write("\r\033[K", ending="")

    def _child(self, kind: str, requests: int, counter: str, batch: int) -> None:
        from loadtests.cost import Probe

        with Probe(shoppers=batch) as probe:
            if batch > 1:
                said = _shoppers(probe, kind, requests // batch)
            else:
                said = _one_shopper(probe, kind, requests, counter)
        self.stdout.write(json.dumps(said if counter == "cpu" else {"section": said["section"]}))
        connection.close()


def _freeze() -> None:
    """What the process holds by now is never collected again: the collector's passes over it (this
    process imports the load tests too, a worker does not) would count per request."""
    gc.collect()
    gc.freeze()


def _one_shopper(probe, kind: str, requests: int, counter: str) -> dict:
    """One shopper sends the warm-up, then ``requests`` more: under callgrind one after another, with
    ``--counter cpu`` the best of the probe's blocks (:meth:`~loadtests.cost.Probe.best_cpu_ms`)."""
    for _ in range(WARM_UP):
        probe.send(kind)
    _freeze()
    if counter == "cpu":
        return {"cpu_ms": probe.best_cpu_ms(kind, requests), "section": 1.0}
    for _ in range(requests):
        probe.send(kind)
    return {"section": 1.0}


def _shoppers(probe, kind: str, each: int) -> dict:
    """The probe's shoppers send ``each`` requests apiece after their warm-up: this process's CPU per
    request over all its threads, and the mean section size a request was served in."""
    started = [0.0]

    def warmed() -> None:
        _freeze()
        probe.sections()  # the warm-up's are not counted
        started[0] = time.process_time()

    probe.each_shopper(kind, each, warmed=warmed)
    requests = each * len(probe.clients)
    cpu_ms = (time.process_time() - started[0]) / requests * 1000 if requests else 0.0
    return {"cpu_ms": cpu_ms, "section": probe.sections()}


def _shown(value: float, counter: str) -> str:
    return f"{value / 1e6:.3f}M" if counter == "callgrind" else f"{value:.3f}"


def _run_child(strategy: str, kind: str, requests: int, batch: int, *, valgrind: list[str] | None) -> tuple[str, str]:
    """The child's standard output and error."""
    command = [sys.executable, "manage.py", "purchasecost", "--child", kind, "--requests", str(requests)]
    command += ["--batch", str(batch)]
    command += ["--counter", "cpu" if valgrind is None else "callgrind"]
    # The parent's database (a test's, under pytest), the strategy asked for, DEBUG off as under gunicorn,
    # and what the strategy's own server needs (a control: ALLOW_UNSAFE_STRATEGY=1, as flashsale's pods get).
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "INVENTORY_STRATEGY": strategy,
        "DJANGO_DEBUG": "0",
        **strategy_class(strategy).server_env(settings.INVENTORY),
        "INVENTORY_BATCH": str(batch),
        # One hash seed for every child, as scripts/lock_instructions.py: dict layouts, and so the
        # counts, otherwise moved by up to 5 % between two runs of the same code.
        "PYTHONHASHSEED": "0",
    }
    done = subprocess.run((valgrind or []) + command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise CommandError(f"{strategy} {kind}: the child failed ({last})")
    return done.stdout, done.stderr


def _instructions(strategy: str, kind: str, requests: int, batch: int, out: str) -> tuple[int, float]:
    """Instructions of a child that sent the warm-up and ``requests`` more (0: the warm-up only), and
    the mean section size its counted requests were served in."""
    valgrind = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}/callgrind.%p"]
    started = time.monotonic()
    said, log = _run_child(strategy, kind, requests, batch, valgrind=valgrind)
    found = re.search(r"Collected : (\d+)", log)
    if found is None:
        raise CommandError(f"{strategy} {kind}: valgrind printed no count after {time.monotonic() - started:.0f} s")
    return int(found.group(1)), json.loads(said)["section"]
