"""The bursts' part of the admin dashboard: charts of the newest run of each strategy, from the
stored ``BurstRun`` rows (:func:`burst_charts`), registered with the dashboard in ``loadtests.apps``."""

from __future__ import annotations

from django.utils.safestring import mark_safe

from inventory.models import BurstRun

from .svg import Series, colour_for, fmt, hbar_chart, line_chart


def latest_run_per_strategy(runs: list[BurstRun]) -> list[BurstRun]:
    latest: dict[str, BurstRun] = {}
    for run in runs:  # newest first
        latest.setdefault(run.strategy, run)
    return sorted(latest.values(), key=lambda r: r.strategy)


def per_strategy(latest: list[BurstRun], field: str, *, title: str, unit: str) -> str:
    """One horizontal bar per strategy: ``field`` of its newest run."""
    return hbar_chart(
        [(run.strategy, [("", getattr(run, field))]) for run in latest],
        colours=[colour_for(run.strategy, i) for i, run in enumerate(latest)],
        unit=unit,
        title=title,
        desc="; ".join(f"{run.strategy}: {fmt(getattr(run, field))} {unit}" for run in latest),
    )


def burst_charts(runs: list[BurstRun]) -> dict:
    """The dashboard's SVG charts from the newest run of each strategy."""
    latest = latest_run_per_strategy(runs)
    if not latest:
        return {}
    series = [
        Series(
            f"{run.strategy} ({run.started_at:%b %d %H:%M})",
            [(float(point[0]), float(point[1])) for point in run.timeline if len(point) >= 2],
            colour_for(run.strategy, i),
        )
        for i, run in enumerate(latest)
    ]
    return {
        "stock": mark_safe(
            line_chart(series, title="Stock left during the latest burst of each strategy", y_label="units left")
        ),
        "throughput": mark_safe(
            per_strategy(latest, "rps", title="Throughput per strategy (latest burst)", unit="requests/s")
        ),
        "p99": mark_safe(
            per_strategy(latest, "p99_ms", title="99th percentile latency per strategy (latest burst)", unit="ms")
        ),
        "legend": [(s.label, s.colour) for s in series],
    }
