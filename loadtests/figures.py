"""The burst's figures from the Locust workers' raw reports: no Django, no I/O.

Every Locust worker reports its own share of the purchases, with raw latencies and
``Server-Timing`` durations (``loadtests/conductor.py`` keeps them); :func:`merge` adds them up
into one set of counts and computes the percentiles over the union, so the figures of a run do
not depend on how many workers sent it.

Times in a report are wall-clock seconds (``time.time()``): the workers run on one machine
(or on machines with synchronised clocks), so the first send of one and the last answer of
another are comparable.
"""

from __future__ import annotations

import bisect
import math
import re
import statistics
from collections import Counter

from .messages import BODY_COUNTS, TOTALS
from .plan import FLOOR

#: ``Server-Timing`` metric name → the key under ``server_timing`` in the burst JSON.
TIMING_KEYS = {
    "queue": "queue_wait_ms",
    "lock": "lock_wait_ms",
    "hold": "lock_hold_ms",
    "commit": "commit_ms",  # inside the hold
    "rtt": "sql_ms",  # inside the hold: the section's SQL messages, send to reply
    "sql": "sql_statements",  # not a duration: statements the section's transactions sent
    "batch": "batch_size",  # not a duration: purchases in the section that served the answer
    "outside": "outside_ms",  # the total less queue, lock and hold: only answers whose section ran
    "db": "db_ms",
    "total": "total_ms",
}
#: The parts of a purchase whose section ran, added up per answer (:func:`add_breakdown`): queue,
#: lock, hold and outside follow one another and add up to total; commit and rtt lie inside the hold.
BREAKDOWN = ("queue", "lock", "hold", "commit", "rtt", "outside", "sql", "total")

#: Counters that merge by addition: a worker's totals and the counts from the response bodies.
COUNTS = (*TOTALS, *BODY_COUNTS)


def percentile(sorted_values: list[float], fraction: float) -> float:
    """Nearest-rank percentile of an ascending list (0.0 when empty)."""
    if not sorted_values:
        return 0.0
    rank = max(1, math.ceil(fraction * len(sorted_values)))
    return sorted_values[rank - 1]


#: One metric's name and its ``dur`` (quoted or not), wherever the parameter stands among the
#: metric's others (``desc`` before it, say); a metric without one does not match.
_METRIC_DUR = re.compile(r'(?:^|,)\s*([^\s;,]+)[^,]*?;\s*dur\s*=\s*"?([^\s;,"]*)"?\s*(?=;|,|$)', re.IGNORECASE)


def parse_server_timing(header: str | None) -> dict[str, float]:
    """``"lock;dur=1.5, db;dur=3"`` → ``{"lock": 1.5, "db": 3.0}``; metrics without a number are left out.

    One regular expression over the header: Locust reads every answer's header during the round,
    on the cores the shop runs on, and a purchase's carries nine metrics with their descriptions
    (a split per metric and parameter cost 19 us an answer, three times this)."""
    durations = {}
    for name, value in _METRIC_DUR.findall(header or ""):
        try:  # noqa: SIM105 (a suppress() context per value costs as much as the parse)
            durations[name] = float(value)
        except ValueError:
            pass
    return durations


def add_breakdown(sums: Counter, timing: dict[str, float]) -> None:
    """Add one answer's parts to a worker's running sums, if its section ran (its ``outside`` says
    so); a part it lacks (no queue at BATCH=1, no lock for a strategy without one) adds 0, so every
    part's sum is over the same answers and the means add up."""
    if "outside" not in timing:
        return
    sums["answers"] += 1
    for name in BREAKDOWN:
        sums[name] += timing.get(name, 0.0)


def breakdown(sums: Counter) -> dict | None:
    """Where the time of a purchase whose section ran went, as means over those answers (ms, 0.01;
    statements to 0.1), keyed as under ``server_timing``, with ``answers``: how many. Means, not
    medians, so that queue + lock + hold + outside = total. None when no section ran."""
    answers = sums.get("answers", 0)
    if not answers:
        return None
    means = {TIMING_KEYS[name]: round(sums.get(name, 0.0) / answers, 1 if name == "sql" else 2) for name in BREAKDOWN}
    return {"answers": answers, **means}


def log_buckets(largest: float) -> list[float]:
    """Upper bounds 1, 2, 5, 10, 20, 50, ... ms, up to the first bound ≥ ``largest``."""
    bounds, decade = [], 1.0
    while True:
        for step in (1, 2, 5):
            bounds.append(step * decade)
            if bounds[-1] >= largest:
                return bounds
        decade *= 10


def latency_histogram(values_ms: list[float]) -> list[list[float]]:
    """``[[upper bound ms, count], ...]`` over log-spaced buckets (a value equal to a bound falls in it)."""
    if not values_ms:
        return []
    bounds = log_buckets(max(values_ms))
    counts = Counter()
    for value in values_ms:
        counts[next(bound for bound in bounds if value <= bound)] += 1
    return [[bound, counts[bound]] for bound in bounds]


def spread(values: list[float]) -> dict | None:
    """``{"p50": x, "p99": x}`` in ms with 0.01 resolution, or None when no response carried the metric."""
    if not values:
        return None
    ordered = sorted(values)
    return {"p50": round(percentile(ordered, 0.50), 2), "p99": round(percentile(ordered, 0.99), 2)}


def _elapsed(start: float | None, end: float | None) -> float | None:
    return None if start is None or end is None else round(max(0.0, end - start), 3)


def timeline(
    samples: list[tuple[float, float, int | None]],
    *,
    opened_at: float,
    sent_times: list[float],
    answer_times: list[float],
) -> list[list]:
    """``[[seconds since the opening, stock left, purchases sent, purchases answered], ...]``.

    ``samples`` are the runner's (wall clock, seconds since the opening, stock) readings; the two
    counts at each reading come from the clients' own send and answer times (ascending), so they
    are exact however late the Locust master wrote its progress file.
    """
    return [
        [round(since, 2), stock, bisect.bisect_right(sent_times, at), bisect.bisect_right(answer_times, at)]
        for at, since, stock in samples
        if at >= opened_at
    ]


def merge(summaries: list[dict]) -> dict:
    """One run's client figures from the reports of all its Locust workers.

    - ``arrival_window_s``: first to last purchase POST handed to its socket, across processes.
    - ``drain_s``: first POST sent to last final answer received (the time the shop took to answer all).
    - ``sold_out_after_s``: first POST sent to the last confirmed (201) answer; None when nothing was confirmed.
    - ``rps``: purchases answered per second of ``drain_s``.
    """
    merged = {key: sum(s.get(key, 0) for s in summaries) for key in COUNTS}
    status_counts, outcomes = Counter(), Counter()
    latencies: list[float] = []
    timings = {name: [] for name in TIMING_KEYS}
    parts = Counter()
    for summary in summaries:
        parts.update(summary.get("breakdown") or {})
        status_counts.update(summary.get("status_counts", {}))
        outcomes.update(summary.get("outcomes", {}))
        latencies.extend(summary.get("latencies_ms", []))
        for name in TIMING_KEYS:
            timings[name].extend(summary.get("server_timing", {}).get(name, []))
    merged["errors"] = [error for summary in summaries for error in summary.get("errors", [])]
    merged["sent_times"] = sorted(t for summary in summaries for t in summary.get("sent_times", []))
    merged["answer_times"] = sorted(t for summary in summaries for t in summary.get("answer_times", []))
    # In send order, then answer order: two purchases sent and answered within the same 0.1 ms may
    # differ in a later field that is None for one of them (the lock wait), which does not compare.
    merged["purchases"] = sorted(
        (p for summary in summaries for p in summary.get("purchases", [])), key=lambda purchase: purchase[:2]
    )

    def times(key: str) -> list[float]:
        return [s[key] for s in summaries if s.get(key) is not None]

    first_sent = min(times("first_sent_at"), default=None)
    last_sent = max(times("last_sent_at"), default=None)
    last_answered = max(times("last_answered_at"), default=None)
    last_confirmed = max(times("last_confirmed_at"), default=None)
    drain = _elapsed(first_sent, last_answered)
    ordered = sorted(latencies)
    merged.update(
        status_counts=dict(sorted(status_counts.items())),
        outcomes=dict(sorted(outcomes.items())),
        first_sent_at=first_sent,
        arrival_window_s=_elapsed(first_sent, last_sent),
        drain_s=drain,
        sold_out_after_s=_elapsed(first_sent, last_confirmed),
        duration_s=drain or 0.0,
        rps=round(merged["answered"] / drain, 1) if drain else 0.0,
        p50_ms=round(percentile(ordered, 0.50), 1),
        p95_ms=round(percentile(ordered, 0.95), 1),
        p99_ms=round(percentile(ordered, 0.99), 1),
        server_timing={TIMING_KEYS[name]: spread(values) for name, values in timings.items()},
        max_lock_wait_ms=round(max(timings["lock"]), 1) if timings["lock"] else None,
        breakdown=breakdown(parts),
        latency_histogram_ms=latency_histogram(latencies),
        **sections(timings["batch"]),
        **holds(timings["hold"]),
    )
    return merged


def holds(values_ms: list[float]) -> dict:
    """``hold_p50`` and ``hold_p99`` (ms) over the answers whose ``Server-Timing`` carried ``hold``:
    a lock's grant to release, or, for a strategy without a lock, its section's transaction from
    BEGIN to COMMIT. None when no answer carried it (the floor, answers refused before any section)."""
    figures = spread(values_ms) or {}
    return {"hold_p50": figures.get("p50"), "hold_p99": figures.get("p99")}


def sections(sizes: list[float]) -> dict:
    """From each answer's section size: the sections run (a section of b answers b purchases, so
    Σ 1/b), and the size's median and p99 over purchases. Answers that ran no section (refused
    from the plain read, or the floor) carry no size."""
    ordered = sorted(sizes)
    return {
        "sections": round(sum(1 / size for size in sizes if size > 0)) if sizes else None,
        "batch_p50": percentile(ordered, 0.50) if sizes else None,
        "batch_p99": percentile(ordered, 0.99) if sizes else None,
    }


def fault_phases(
    purchases: list[list], *, opened_at: float, injected_at: float | None, recovered_at: float | None
) -> list[dict]:
    """The purchases split by send time into ``before`` / ``during`` / ``after`` a fault's window.

    ``purchases`` are ``[sent, answered, status, lock ms, [503 answered at, ...]]`` (wall clock, as
    the Locust workers record them); ``injected_at`` / ``recovered_at`` are wall clock too (None:
    not reached). Each phase has ``start_s`` / ``end_s`` in seconds since ``opened_at`` (the
    timeline's clock), and the final ``status_counts`` and ``p99_ms`` latency of the purchases
    *sent* in it; ``busy_answers`` counts the 503 + Retry-After answers *received* in it (resent
    ones included, which the final status hides). A phase the fault never reached is left out; the
    last one ends at the last answer (or its own start).
    """
    if not purchases:
        return []
    last = max(p[1] for p in purchases)
    bounds = [("before", min(opened_at, purchases[0][0]), injected_at)]
    if injected_at is not None:
        bounds.append(("during", injected_at, recovered_at))
        if recovered_at is not None:
            bounds.append(("after", recovered_at, None))
    found = []
    for name, start, end in bounds:
        stop = end if end is not None else max(last, start)
        inside = [p for p in purchases if start <= p[0] < stop or (end is None and p[0] >= start)]
        found.append(
            {
                "name": name,
                "start_s": round(max(0.0, start - opened_at), 3),
                "end_s": round(max(0.0, stop - opened_at), 3),
                "status_counts": dict(sorted(Counter(str(p[2]) for p in inside).items())),
                "p99_ms": round(percentile(sorted((p[1] - p[0]) * 1000 for p in inside), 0.99), 1),
                "busy_answers": sum(
                    start <= at and (end is None or at < stop) for p in purchases for at in (p[4] if len(p) > 4 else ())
                ),
            }
        )
    return found


def resumed_after(purchases: list[list], *, recovered_at: float | None) -> float | None:
    """Seconds from ``recovered_at`` to the first confirmed (201) answer at or after it; None
    without a recovery or without such an answer."""
    if recovered_at is None:
        return None
    confirmed = [p[1] for p in purchases if p[2] == 201 and p[1] >= recovered_at]
    return round(min(confirmed) - recovered_at, 3) if confirmed else None


def first_after(instants: list[float], *, since: float | None) -> float | None:
    """Seconds from ``since`` to the first of ``instants`` (wall clock) at or after it; None without
    ``since`` or without such an instant. kill-holder's stall: ``instants`` are the orders' creation
    times, so a resend answered 201 from its order (no lock taken) does not end it."""
    if since is None:
        return None
    later = [at for at in instants if at >= since]
    return round(min(later) - since, 3) if later else None


def longest_gap(purchases: list[list], *, since: float | None) -> float | None:
    """The longest stretch without a confirmed (201) answer from ``since`` (wall clock) to the
    run's last answer: between ``since`` and the first confirmation, two consecutive ones, or the
    last one and the end. None without ``since``, or when the run ended before it."""
    if since is None or not purchases:
        return None
    end = max(p[1] for p in purchases)
    if end < since:
        return None
    points = [since, *sorted(p[1] for p in purchases if p[2] == 201 and p[1] >= since), end]
    return round(max(b - a for a, b in zip(points, points[1:], strict=False)), 3)


def median_run(runs: list[dict]) -> dict:
    """The run with the median ``rps`` (the lower middle one for an even count), carrying
    ``rps`` = the median, ``rps_range`` = [min, max], ``repeats`` and ``rounds``: each run's
    ``rps`` and ``floor_ratio`` in the order they ran (a verdict reads its spread off them)."""
    ordered = sorted(runs, key=lambda run: run["rps"])
    chosen = dict(ordered[(len(ordered) - 1) // 2])
    chosen.update(
        rps=round(statistics.median(run["rps"] for run in runs), 1),
        rps_range=[ordered[0]["rps"], ordered[-1]["rps"]],
        repeats=len(runs),
        rounds=[
            {"rps": run["rps"], "floor_ratio": run.get("floor_ratio")}
            for run in sorted(runs, key=lambda run: run.get("round", 0))
        ],
    )
    return chosen


def with_floor_ratio(run: dict, floor: dict | None) -> dict:
    """``run`` with ``floor_ratio`` = its ``rps`` over the floor row's (left as it is for the floor itself)."""
    if run["row"] != FLOOR and floor and floor["rps"]:
        run["floor_ratio"] = round(run["rps"] / floor["rps"], 3)
    return run


def with_hot_row_ratio(run: dict, hot_rows: list[dict]) -> dict:
    """``run`` with ``hot_row_ratio`` = its ``rps`` over the hot-row limit of its shape
    (:mod:`loadtests.hotrow`): one purchase per commit for a BATCH=1 row, many per commit for a
    batched one. The floor sells nothing and is left as it is."""
    if run["row"] == FLOOR or not hot_rows:
        return run
    batched = (run.get("batch") or 1) > 1
    shape = next((hot for hot in hot_rows if (hot["batch"] > 1) == batched), None)
    run["hot_row_ratio"] = round(run["rps"] / shape["rps"], 3) if shape and shape["rps"] else None
    return run
