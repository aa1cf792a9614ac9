"""The report's figures: the floor chart, timelines, rates, histograms and the time split.

Each function returns a :class:`Figure` (or None when the run has nothing to draw and nothing to
say): its caption, the inline SVG drawn by :mod:`.svg` (which escapes every text it draws), or
the sentence shown instead of a chart. ``templates/report/figure.html`` lays it out.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from django.utils.safestring import SafeString, mark_safe

from . import svg
from .base import BREAKDOWN_PARTS, breakdown_of, count, figure, ms, number, ratio, timing
from .sentences import phases, time_sentence
from .views import View, cell


@dataclass(frozen=True)
class Figure:
    """One figure of the page: a chart, or the sentence that says why there is none."""

    caption: str
    chart: SafeString | None = None
    note: str = ""
    instead: str = ""
    #: (upper bound ms, count) rows shown in a table under a histogram.
    buckets: tuple[tuple[str, str], ...] = ()
    #: A sentence under the chart that says what it shows.
    said: str = ""


def floor_chart(shown: list[View]) -> Figure | None:
    bars = [
        (v.label, figure(v.run, "floor_ratio"), v.colour)
        for v in shown
        if v.name != "floor" and figure(v.run, "floor_ratio") is not None
    ]
    if not bars:
        return None
    desc = "; ".join(f"{label}: {ratio(value)} the floor's throughput" for label, value, _ in bars)
    chart = svg.hbar_chart(
        [(label, [("", value)]) for label, value, _ in bars],
        colours=[c for _, _, c in bars],
        unit="× the floor's requests/s",
        title="Throughput as a share of the floor",
        desc=desc,
        reference=("floor", 1.0),
        value_format=ratio,
    )
    return Figure("Throughput as a share of the floor", mark_safe(chart))


def _timeline_rows(run: dict) -> list[list]:
    rows = run.get("timeline")
    if not isinstance(rows, list):
        return []
    return [r for r in rows if isinstance(r, list) and r and number(r[0]) is not None]


def _timeline_points(run: dict) -> tuple[list[tuple[float, float]], str]:
    """(seconds, stock left) from the timeline, or (seconds, purchases answered) for the floor row
    (which touches no stock) and when no stock was sampled; with the label of what is plotted."""
    rows = _timeline_rows(run)
    columns = ((1, "units left"), (3, "purchases answered"), (2, "purchases sent"))
    for column, label in columns[1:] if run.get("row") == "floor" else columns:
        points = [(r[0], r[column]) for r in rows if len(r) > column and number(r[column]) is not None]
        if points:
            return points, label
    return [], "units left"


def timeline_figure(v: View) -> Figure:
    run = v.run
    points, label = _timeline_points(run)
    found = phases(run)
    what = "Stock over time" if label == "units left" else f"{label.capitalize()} over time"
    if points:
        desc = (
            f"{label} from {count(points[0][1])} at {points[0][0]:.1f} s to {count(points[-1][1])} "
            f"at {points[-1][0]:.1f} s"
        )
        sold_out = figure(run, "sold_out_after_s")
        if sold_out is not None:
            desc += f"; sold out after {sold_out:.1f} s"
    else:
        return Figure(what, instead="This run has no timeline.")
    if found:
        desc += "; phases: " + ", ".join(f"{p['name']} {p['start_s']:.1f}–{p['end_s']:.1f} s" for p in found)
    chart = svg.timeline_chart(
        points, phases=found, colour=v.colour, title=f"{v.label}: {what.lower()}", y_label=label, desc=desc
    )
    return Figure(what, mark_safe(chart))


def rate_figure(v: View) -> Figure | None:
    """Purchases answered per second between samples, for fault runs (where the dip is the story)."""
    found = phases(v.run)
    rows = [r for r in _timeline_rows(v.run) if len(r) > 3 and number(r[3]) is not None]
    if not found or len(rows) < 2:
        return None
    points = [(b[0], max(0.0, (b[3] - a[3]) / (b[0] - a[0]))) for a, b in itertools.pairwise(rows) if b[0] > a[0]]
    if not points:
        return None
    by_phase = []
    for p in found:
        inside = [rate for t, rate in points if p["start_s"] < t <= p["end_s"]]
        if inside:
            by_phase.append(f"{p['name']}: {count(sum(inside) / len(inside))} answers/s on average")
    chart = svg.timeline_chart(
        points,
        phases=found,
        colour=v.colour,
        title=f"{v.label}: purchases answered per second",
        y_label="answers/s",
        desc="; ".join(by_phase) or "no samples inside the phases",
    )
    return Figure("Purchases answered per second", mark_safe(chart))


def histogram_figure(v: View) -> Figure:
    run = v.run
    raw = run.get("latency_histogram_ms")
    buckets = sorted(
        (b[0], b[1])
        for b in (raw if isinstance(raw, list) else [])
        if isinstance(b, list) and len(b) == 2 and number(b[0]) is not None and isinstance(b[1], int)
    )
    known = {q: figure(run, f"{q}_ms") for q in ("p50", "p95", "p99") if figure(run, f"{q}_ms") is not None}
    said = ", ".join(f"{q} {ms(value)} ms" for q, value in known.items())
    if not buckets:
        return Figure("Latency", instead=f"This run has no latency histogram{'; ' + said if said else ''}.")
    busiest = max(buckets, key=lambda b: b[1])
    desc = (
        f"{count(sum(c for _, c in buckets))} purchase requests in {len(buckets)} buckets; most "
        f"({count(busiest[1])}) took up to {ms(busiest[0])} ms; {said or 'no percentiles'}"
    )
    chart = svg.histogram_chart(
        buckets, colour=v.colour, percentiles=known, title=f"{v.label}: latency of purchase requests", desc=desc
    )
    table = tuple((f"≤ {ms(u)}", count(c)) for u, c in buckets if c)
    return Figure("Latency distribution", mark_safe(chart), note="purchase POSTs", buckets=table)


def floor_share(v: View) -> Figure:
    rps = figure(v.run, "rps")
    if v.name == "floor":
        return Figure("Throughput against the floor", instead=f"Throughput: {cell(rps)} requests/s, the floor (1×).")
    value = figure(v.run, "floor_ratio")
    if value is None:
        return Figure(
            "Throughput against the floor",
            instead=f"Throughput: {cell(rps)} requests/s; no floor row to compare with.",
        )
    desc = f"{ratio(value)} the floor's throughput" + (f" ({count(rps)} requests/s)" if rps is not None else "")
    chart = svg.hbar_chart(
        [("throughput", [("", value)])],
        colours=[v.colour],
        unit="× the floor's requests/s",
        title=f"{v.label}: throughput as a share of the floor",
        desc=desc,
        reference=("floor", 1.0),
        value_format=ratio,
    )
    return Figure("Throughput against the floor", mark_safe(chart))


def split_figure(v: View) -> Figure:
    run = v.run
    # Without a lock, the hold is the section's transaction, BEGIN to COMMIT (issue 28).
    waited = timing(run, "lock_wait_ms", "p50") or timing(run, "lock_wait_ms", "p99")
    hold = "lock hold" if waited else "transaction"
    parts = [("lock wait", "lock_wait_ms"), (hold, "lock_hold_ms"), ("database", "db_ms"), ("total", "total_ms")]
    rows = []
    for label, key in parts:
        p50, p99 = timing(run, key, "p50"), timing(run, key, "p99")
        if key.startswith("lock") and not (p50 or p99):
            continue  # no lock was taken: a zero bar would only crowd the others
        if p50 is not None or p99 is not None:
            rows.append((label, [("p50", p50 or 0.0), ("p99", p99 or 0.0)]))
    if not rows:
        return Figure("Server-side split", instead="This run has no Server-Timing figures.")
    desc = "; ".join(f"{label}: p50 {ms(bars[0][1])} ms, p99 {ms(bars[1][1])} ms" for label, bars in rows)
    locked = any(label.startswith("lock") for label, _ in rows)
    note = "lock hold includes the database work done under the lock" if locked else "no lock taken"
    if any(label == "transaction" for label, _ in rows):
        note += ": transaction is the section's, BEGIN to COMMIT"
    chart = svg.hbar_chart(
        rows,
        colours=["#94a3b8", "#334155"],
        unit="ms on the server",
        title=f"{v.label}: where a request's server time went",
        desc=desc,
        value_format=ms,
    )
    return Figure("Server-side split", mark_safe(chart), note=note)


#: The breakdown chart's parts (name, colour), in the order they follow one another in a purchase,
#: and the commit drawn inside the hold.
BREAKDOWN_COLOURS = [("queue", "#cbd5e1"), ("acquire", "#f59e0b"), ("hold", "#2563eb"), ("outside", "#64748b")]
COMMIT_INSET = (2, "commit (in hold)", "#0f172a")


def breakdown_chart(labelled: list[tuple[str, dict]], *, title: str) -> str:
    """One stacked bar per (label, run): queue, acquire, hold (with its commit) and outside, the
    means of the run's ``breakdown``; the runs without one are left out (the caller checks one has)."""
    stacks, said = [], []
    for label, run in labelled:
        parts = breakdown_of(run)
        if parts is None:
            continue
        values = [parts[key] for key in BREAKDOWN_PARTS]
        stacks.append(svg.Stack(label, values, inset=parts["commit_ms"]))
        named = ", ".join(f"{name} {ms(value)}" for (name, _), value in zip(BREAKDOWN_COLOURS, values, strict=True))
        said.append(f"{label}: {named}, of which commit {ms(parts['commit_ms'])} (ms, means)")
    return svg.stacked_bar_chart(
        stacks,
        parts=BREAKDOWN_COLOURS,
        inset=COMMIT_INSET,
        unit="ms per purchase (mean)",
        title=title,
        desc="; ".join(said),
        value_format=ms,
    )


def breakdown_figure(v: View) -> Figure | None:
    """Where the row's purchases spent their server time; None for a row without a breakdown (the
    floor, which runs no section, and documents written before it was measured)."""
    parts = breakdown_of(v.run)
    if parts is None:
        return None
    chart = breakdown_chart([(v.label, v.run)], title=f"{v.label}: where a purchase's server time went")
    note = f"means over the {count(parts['answers'])} purchases whose section ran; the commit lies inside the hold"
    return Figure(
        "Where a purchase's time went", mark_safe(chart), note=note, said=f"{time_sentence(v.run, name=v.label)}."
    )
