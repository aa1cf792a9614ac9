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
        parser.add_argument("--child", choices=KINDS, help=argparse.SUPPRESS)

    def handle(self, *args, strategies: str, requests: int, counter: str, child: str | None, **options):
        if child is not None:  # the warm-up alone is a child of 0 requests
            return self._child(child, requests, counter)
        if requests < 1:
            raise CommandError("--requests must be at least 1")
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
        self.stdout.write(f"per request, {unit} of this process ({requests} requests a case, {counter})")
        self.stdout.write(f"{'strategy':<14}{'floor':>12}{'purchase':>12}{'floor/purchase':>16}")
        floor = self._measure(names[0], "floor", requests, counter)  # the same view whatever the strategy
        for name in names:
            purchase = self._measure(name, "purchase", requests, counter)
            cells = f"{_shown(floor, counter):>12}{_shown(purchase, counter):>12}{floor / purchase:>16.2f}"
            self.stdout.write(f"{name:<14}{cells}")

    def _measure(self, strategy: str, kind: str, requests: int, counter: str) -> float:
        self.stderr.write(f"\r\033[K{strategy}: {kind} ({counter})", ending="")
        self.stderr.flush()
        try:
            if counter == "cpu":
                return json.loads(_run_child(strategy, kind, requests, valgrind=None))["cpu_ms"]
            with tempfile.TemporaryDirectory() as out:
                base = _instructions(strategy, kind, 0, out)
                return (_instructions(strategy, kind, requests, out) - base) / requests
        finally:
            self.stderr.write("\r\033[K", ending="")

    def _child(self, kind: str, requests: int, counter: str) -> None:
        from loadtests.cost import Probe

        with Probe() as probe:
            for _ in range(WARM_UP):
                probe.send(kind)
            # What the process holds by now is never collected again: the collector's passes over it
            # (this process imports the load tests too, a worker does not) would count per request.
            gc.collect()
            gc.freeze()
            if counter == "callgrind":
                for _ in range(requests):
                    probe.send(kind)
            else:
                self.stdout.write(json.dumps({"cpu_ms": probe.best_cpu_ms(kind, requests)}))
        connection.close()


def _shown(value: float, counter: str) -> str:
    return f"{value / 1e6:.3f}M" if counter == "callgrind" else f"{value:.3f}"


def _run_child(strategy: str, kind: str, requests: int, *, valgrind: list[str] | None) -> str:
    command = [sys.executable, "manage.py", "purchasecost", "--child", kind, "--requests", str(requests)]
    command += ["--counter", "cpu" if valgrind is None else "callgrind"]
    # The parent's database (a test's, under pytest), the strategy asked for, DEBUG off as under gunicorn,
    # and what the strategy's own server needs (a control: ALLOW_UNSAFE_STRATEGY=1, as flashsale's pods get).
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "INVENTORY_STRATEGY": strategy,
        "DJANGO_DEBUG": "0",
        **strategy_class(strategy).server_env(settings.INVENTORY),
    }
    done = subprocess.run((valgrind or []) + command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise CommandError(f"{strategy} {kind}: the child failed ({last})")
    return done.stdout if valgrind is None else done.stderr


def _instructions(strategy: str, kind: str, requests: int, out: str) -> int:
    """Instructions of a child that sent the warm-up and ``requests`` more (0: the warm-up only)."""
    valgrind = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}/callgrind.%p"]
    started = time.monotonic()
    log = _run_child(strategy, kind, requests, valgrind=valgrind)
    found = re.search(r"Collected : (\d+)", log)
    if found is None:
        raise CommandError(f"{strategy} {kind}: valgrind printed no count after {time.monotonic() - started:.0f} s")
    return int(found.group(1))
