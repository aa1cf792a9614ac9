"""The section alone, sequentially, in one process: no HTTP, no guard, no load generator.

    PYTHONPATH=. .venv/bin/python scripts/section_bench.py [strategy] [purchases]

Runs ``attempt_section`` (read → decide → write → order, one transaction) ``purchases`` times
(default 1,500) for ``strategy`` (default ``optimistic``) on a product of its own in the test
database of slot 6 (``tests/settings.py``; kept between runs), and prints the p50 and mean per
section in milliseconds: what the short hold (``inventory/strategies/statements.py``) is about.
"""

import os
import statistics
import sys
import time

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
os.environ.setdefault("FLASHSALE_TEST_SLOT", "6")

import django  # noqa: E402

django.setup()

from django.core.exceptions import ImproperlyConfigured  # noqa: E402
from django.test.utils import setup_databases  # noqa: E402

from inventory.models import Allocation, Order, Product  # noqa: E402
from inventory.strategies import load_strategy  # noqa: E402
from inventory.strategies.contract import NO_GRANT  # noqa: E402
from inventory.strategies.section import attempt_section  # noqa: E402


def main(name: str = "optimistic", count: str = "1500") -> None:
    try:
        strategy = load_strategy(name)
    except ImproperlyConfigured as exc:
        sys.exit(f"section_bench.py: {exc}")
    setup_databases(verbosity=0, interactive=False, keepdb=True)
    Order.objects.filter(product__sku="section-bench").delete()
    Allocation.objects.filter(product__sku="section-bench").delete()
    Product.objects.filter(sku="section-bench").delete()
    product = Product.objects.create(
        sku="section-bench", name="bench", price=1, stock=10**9, initial_stock=10**9, per_customer_limit=5
    )
    times = []
    for i in range(int(count)):
        started = time.perf_counter()
        attempt_section(strategy, product_id=product.pk, customer=f"c{i}", quantity=1, key=f"k{i}", grant=NO_GRANT)
        times.append((time.perf_counter() - started) * 1000)
    times.sort()
    print(f"{name}: {len(times)} sections, p50 {times[len(times) // 2]:.3f} ms, mean {statistics.mean(times):.3f} ms")


if __name__ == "__main__":
    args = sys.argv[1:]
    if len(args) > 2 or (len(args) == 2 and not (args[1].isdigit() and int(args[1]) > 0)):
        sys.exit("usage: section_bench.py [strategy] [purchases]: purchases is a whole number, 1 or more")
    main(*args)
