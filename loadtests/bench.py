"""What every ``lockbench`` row is measured with: cases that take turns, slice by slice.

Machine noise (another process, a GC pass, a frequency step) then hits every case alike, and a
ratio between two rows of one run means something even on a busy machine.
"""

from __future__ import annotations

import gc
import time
from typing import Callable

#: How long one case runs before the next takes its turn, unless the caller sets the rounds.
SLICE_S = 0.2


def alternate(
    cases: dict[str, Callable[[], None]],
    seconds: float,
    *,
    rounds: int | None = None,
    warmup: int = 10,
    calls_per_check: int = 1,
    progress: Callable[[int, int, str, float], None] | None = None,
) -> list[dict]:
    """Run each case for ``seconds`` in all, in ``rounds`` slices (by default of ``SLICE_S``), the
    cases taking turns; a row ``{"name", "ops_per_s", "us_per_op"}`` per case.

    ``warmup`` calls each first, off the clock (connections, script caches, sessions). A case that
    does several operations per call says so in its ``batch`` attribute. ``calls_per_check``: calls
    between two reads of the clock, for cases so fast that reading it would count. ``progress``
    hears ``(round, rounds, name, ops/s so far)`` after each slice.
    """
    for op in cases.values():
        for _ in range(warmup):
            op()
    # The import graph would otherwise be re-scanned by every full GC pass, taxing the cases that
    # allocate more per op; freezing it measures the locks, not the host process.
    gc.collect()
    gc.freeze()
    rounds = rounds or max(1, round(seconds / SLICE_S))
    slice_s = seconds / rounds
    totals = {name: [0, 0.0] for name in cases}
    try:
        for round_no in range(1, rounds + 1):
            for name, op in cases.items():
                per_check = getattr(op, "batch", 1) * calls_per_check
                count, started = 0, time.perf_counter()
                deadline = started + slice_s
                while True:
                    for _ in range(calls_per_check):
                        op()
                    count += per_check
                    now = time.perf_counter()
                    if now >= deadline:
                        break
                totals[name][0] += count
                totals[name][1] += now - started
                if progress is not None:
                    progress(round_no, rounds, name, totals[name][0] / totals[name][1])
    finally:
        gc.unfreeze()
    return [
        {"name": name, "ops_per_s": round(ops / spent, 1), "us_per_op": round(spent / ops * 1e6, 1)}
        for name, (ops, spent) in totals.items()
    ]
