"""The section alone, sequentially, in one process: no HTTP, no load generator.

    PYTHONPATH=. .venv/bin/python scripts/section_bench.py [strategy] [purchases] [--guard] [--batch N]

Runs the strategy's section (read → decide → write → order, one transaction; ``atomic``'s one
statement) ``purchases`` times (default 1,500) for ``strategy`` (default ``optimistic``) on a
product of its own in the test database of slot 6 (``tests/settings.py``; kept between runs), and
prints the p50 and mean per section in milliseconds: what the short hold
(``inventory/strategies/statements.py``) is about.

``--guard`` takes the strategy's guard around each section and releases it after the commit, as a
purchase served alone does: the time from one grant to the next with nobody waiting, so
``1000 / mean`` is the most purchases a second that strategy's row can serve one after another at
BATCH 1 on this machine, before any contention, hand-over or request around it. The guard's
services must be up in slot 6 (the machine's Redis serves ``redis``; ``redlock``'s nodes start with
``DJANGO_SETTINGS_MODULE=tests.settings FLASHSALE_TEST_SLOT=6 .venv/bin/python manage.py
redlock_nodes start``).

``--batch N`` runs each section for N purchases (``attempt_batch``, as a combining leader does:
one read, one write, N orders), ``purchases`` in all: what a batched section costs, and a purchase's
share of it.

Beside the times: this process's CPU per section and, when PostgreSQL runs on this machine, its
backend's (from ``/proc``): how much of a section is work on either side and how much is waiting.
"""

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
os.environ.setdefault("FLASHSALE_TEST_SLOT", "6")

import django  # noqa: E402

django.setup()

from django.core.exceptions import ImproperlyConfigured  # noqa: E402
from django.db import connection  # noqa: E402
from django.test.utils import setup_databases  # noqa: E402

from inventory.models import Allocation, Order, Product  # noqa: E402
from inventory.strategies import load_strategy  # noqa: E402
from inventory.strategies.batch import Ask  # noqa: E402
from inventory.strategies.contract import NO_GRANT, LockUnavailable  # noqa: E402

SKU = "section-bench"
WARM_UP = 100


def backend_cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system) of PostgreSQL backend ``pid``, or None when it is not a local process."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main(name: str, count: int, *, guard: bool, batch: int = 1) -> None:
    try:
        strategy = load_strategy(name)
    except ImproperlyConfigured as exc:
        sys.exit(f"section_bench.py: {exc}")
    setup_databases(verbosity=0, interactive=False, keepdb=True)
    Order.objects.filter(product__sku=SKU).delete()
    Allocation.objects.filter(product__sku=SKU).delete()
    Product.objects.filter(sku=SKU).delete()
    product = Product.objects.create(
        sku=SKU, name="bench", price=1, stock=10**9, initial_stock=10**9, per_customer_limit=5
    )

    def section(grant, customer: str, key: str) -> None:
        if batch == 1:
            strategy.attempt(product_id=product.pk, customer=customer, quantity=1, key=key, grant=grant)
            return
        asks = [Ask(f"{customer}-{n}", 1, f"{key}-{n}") for n in range(batch)]
        done = strategy.attempt_batch(product_id=product.pk, asks=asks, grant=grant)
        if done.attempts is None or any(getattr(a, "order", None) is None for a in done.attempts):
            sys.exit(f"section_bench.py: a batched section of {name} did not sell its {batch} purchases")

    def one(customer: str, key: str) -> None:
        if not guard:
            section(NO_GRANT, customer, key)
            return
        with strategy.guard(SKU) as grant:
            section(grant, customer, key)

    try:
        for i in range(WARM_UP):
            one(f"w{i}", f"w{i}")
        connection.ensure_connection()
        backend = connection.connection.info.backend_pid
        cpu, server = time.process_time(), backend_cpu_s(backend)
        times = []
        sections = max(1, count // batch)
        for i in range(sections):
            started = time.perf_counter()
            one(f"c{i}", f"k{i}")
            times.append((time.perf_counter() - started) * 1000)
    except LockUnavailable as exc:
        sys.exit(f"section_bench.py: {name}'s guard was not granted, start its services in slot 6 (see --help): {exc}")
    cpu_ms = (time.process_time() - cpu) / sections * 1000
    ended = backend_cpu_s(backend)
    server_ms = None if server is None or ended is None else (ended - server) / sections * 1000
    print(summary(name, times, guard=guard, batch=batch, cpu_ms=cpu_ms, server_ms=server_ms))
    strategy.close()


def summary(name: str, times: list[float], *, guard: bool, batch: int, cpu_ms: float, server_ms: float | None) -> str:
    """The line ``main`` prints: the sections' times (ms each), and the CPU a section on both sides."""
    times = sorted(times)
    mean = statistics.mean(times)
    what = "guard + section + release" if guard else "sections"
    said = f"{name}: {len(times)} {what}" + (f" of {batch} purchases" if batch > 1 else "")
    said += f", p50 {times[len(times) // 2]:.3f} ms, mean {mean:.3f} ms"
    if guard:
        said += f": at most {1000 * batch / mean:,.0f} purchases/s one after another"
    said += f"; CPU a section: this process {cpu_ms:.3f} ms"
    if server_ms is not None:
        said += f", its PostgreSQL backend {server_ms:.3f} ms"
    if batch > 1:
        backend_share = "" if server_ms is None else f" + {server_ms / batch:.3f}"
        said += f" (a purchase's share: {cpu_ms / batch:.3f}{backend_share} ms)"
    return said


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="section_bench.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("strategy", nargs="?", default="optimistic")
    parser.add_argument("purchases", nargs="?", default="1500")
    parser.add_argument("--guard", action="store_true", help="take the strategy's guard around each section")
    parser.add_argument("--batch", default="1", help="purchases a section serves (default 1)")
    args = parser.parse_args(argv)
    if not (args.purchases.isdigit() and int(args.purchases) > 0):
        parser.exit(2, f"section_bench.py: purchases must be a whole number, 1 or more, not {args.purchases!r}\n")
    if not (args.batch.isdigit() and 1 <= int(args.batch) <= 1000):
        parser.exit(2, f"section_bench.py: --batch must be a whole number from 1 to 1000, not {args.batch!r}\n")
    return args


if __name__ == "__main__":
    options = parse(sys.argv[1:])
    main(options.strategy, int(options.purchases), guard=options.guard, batch=int(options.batch))
